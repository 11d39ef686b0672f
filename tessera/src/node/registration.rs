//! An entity type as the node builder holds it until the node starts: its Rust type erased,
//! so that a builder can hold types of every kind, with what the start needs of it.

use crate::entities::{JsonEntity, JsonFace};
use crate::entity_settings::EntitySettings;
use futures::FutureExt;
use futures::future::BoxFuture;
use std::any::Any;
use std::sync::Arc;
use tessera_coordinator::host::ShardHost;
use tessera_coordinator::runtime::RegionRef;
use tessera_entities::{
    EntityConfig, EntityHost, EntityLifecycle, EntityType, HostStats, InvalidConfig,
};
use tessera_journal::Journal;
use tessera_snapshot::SnapshotStore;

/// A running entity host, whatever its type.
pub trait LocalHost: ShardHost + Any + Send + Sync {
    /// The host's lifecycle counters.
    fn stats(&self) -> HostStats;
    /// Stops the host's entities after what they accepted (their writes included).
    fn shutdown(&self) -> BoxFuture<'_, ()>;
}

impl<E: EntityType> LocalHost for EntityHost<E> {
    fn stats(&self) -> HostStats {
        EntityHost::stats(self)
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        EntityHost::shutdown(self).boxed()
    }
}

/// What a host's listener hears, for remember-entities.
pub type Listener = Box<dyn Fn(EntityLifecycle) + Send + Sync + 'static>;

/// One registered entity type.
pub trait Registration: Send {
    /// `E::TYPE_NAME`.
    fn type_name(&self) -> &'static str;
    /// `E::MESSAGE_VERSION`.
    fn message_version(&self) -> u32;
    /// What the code registering the type set.
    fn settings(&self) -> &EntitySettings;
    /// Starts this node's host of the type (once: the entity value moves into it).
    fn start_host(
        &mut self,
        journal: Arc<dyn Journal>,
        snapshots: Arc<dyn SnapshotStore>,
        config: EntityConfig,
        listener: Option<Listener>,
    ) -> Result<Arc<dyn LocalHost>, InvalidConfig>;
    /// The type's JSON face for the HTTP API, asking through `region`.
    fn json_face(&self, region: RegionRef) -> Arc<dyn JsonEntity>;
}

/// The registration of type `E`.
pub struct TypedRegistration<E: EntityType> {
    /// Taken by the host's start.
    pub entity: Option<E>,
    pub settings: EntitySettings,
}

impl<E: EntityType> Registration for TypedRegistration<E> {
    fn type_name(&self) -> &'static str {
        E::TYPE_NAME
    }

    fn message_version(&self) -> u32 {
        E::MESSAGE_VERSION
    }

    fn settings(&self) -> &EntitySettings {
        &self.settings
    }

    fn start_host(
        &mut self,
        journal: Arc<dyn Journal>,
        snapshots: Arc<dyn SnapshotStore>,
        config: EntityConfig,
        listener: Option<Listener>,
    ) -> Result<Arc<dyn LocalHost>, InvalidConfig> {
        let entity = self.entity.take().ok_or_else(|| {
            InvalidConfig(format!("entity type {} is started twice", E::TYPE_NAME))
        })?;
        let host = match listener {
            Some(listener) => {
                EntityHost::start_with_listener(entity, journal, snapshots, config, listener)?
            }
            None => EntityHost::start(entity, journal, snapshots, config)?,
        };
        Ok(Arc::new(host))
    }

    fn json_face(&self, region: RegionRef) -> Arc<dyn JsonEntity> {
        Arc::new(JsonFace::<E>::over_region(region))
    }
}
