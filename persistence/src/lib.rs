//! tessera-persistence: the replicated journal of a cluster member (docs/src/design.md §5).
//!
//! Every node runs a replica service ([`service`]) over its [`ReplicaStore`], and writers
//! ([`writers`]) for the logs its entities write, each a
//! [`tessera_replication::LogWriter`] state machine. [`ReplicatedJournal`] implements the
//! journal's [`tessera_journal::Journal`] on top, so entities use it unchanged.
//!
//! [`Persistence::start`] wires it on a cluster node.

mod caller;
pub mod commit_feed;
mod handler;
pub mod journal;
pub mod known_stores;
pub mod maintenance;
pub mod metrics;
pub mod service;
mod slice_query;
pub mod snapshots;
pub mod store;
pub mod wire;
pub mod writers;

pub use journal::{FencedLog, ForgetStoreError, LogInspection, ReplicaView, ReplicatedJournal};
pub use known_stores::{KnownStores, KnownStoresError};
pub use metrics::{PersistenceMetrics, PersistenceMetricsSnapshot};
pub use service::ReplicaServiceSettings;
pub use slice_query::{QueryProgress, SliceQuerySettings};
pub use snapshots::ReplicatedSnapshotStore;
pub use store::{MemoryReplicaStore, ReplicaStore, RocksReplicaStore, StoreError};
pub use tessera_journal::StoredEvent;
pub use writers::WritersSettings;

use caller::TransportCaller;
use handler::ReplicaHandler;
use std::path::PathBuf;
use std::sync::Arc;
use tessera_cluster::node::ClusterSnapshot;
use tessera_cluster::transport::{Transport, TransportError};
use tessera_journal::Journal;
use tessera_snapshot::SnapshotStore;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Settings of a node's replicated persistence.
#[derive(Clone, Debug)]
pub struct PersistenceSettings {
    pub writers: WritersSettings,
    pub service: ReplicaServiceSettings,
    pub maintenance: maintenance::MaintenanceSettings,
    /// Largest write accepted (it must fit a transport frame with room to spare).
    pub max_write_bytes: usize,
    /// The file of the stores this node has seen in the cluster ([`known_stores`]), in the
    /// node's data directory; without one the list is kept in memory only (tests).
    pub known_stores_path: Option<PathBuf>,
}

impl Default for PersistenceSettings {
    fn default() -> Self {
        PersistenceSettings {
            writers: WritersSettings::default(),
            service: ReplicaServiceSettings::default(),
            maintenance: maintenance::MaintenanceSettings::default(),
            max_write_bytes: 2 * 1024 * 1024,
            known_stores_path: None,
        }
    }
}

/// Starting a node's replicated persistence failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error(transparent)]
    KnownStores(#[from] KnownStoresError),
}

/// A node's replicated persistence: its replica service, its journal and its snapshot store.
pub struct Persistence {
    pub journal: Arc<ReplicatedJournal>,
    pub snapshots: Arc<ReplicatedSnapshotStore>,
    pub metrics: Arc<PersistenceMetrics>,
    /// The replica service's and the maintenance's tasks, taken by [`Persistence::stop`].
    tasks: std::sync::Mutex<Vec<JoinHandle<()>>>,
}

impl Persistence {
    /// Serves this node's replicas (`store` for logs, `snapshots` for their snapshots) to the
    /// cluster on `transport`, and starts the journal and snapshot store of this node,
    /// following the membership published on `membership`. `queries` answers the queries by
    /// tag and persistence id over the logs `store` holds.
    pub fn start<T: Transport>(
        transport: Arc<T>,
        membership: watch::Receiver<ClusterSnapshot>,
        store: Arc<dyn ReplicaStore>,
        snapshots: Arc<dyn SnapshotStore>,
        queries: Arc<dyn Journal>,
        settings: PersistenceSettings,
    ) -> Result<Self, StartError> {
        // A node that has no list yet (a new one, or one upgraded from a release without
        // it) also learns the stores its logs' configurations name.
        let (known_stores, learn_from_configs) = match &settings.known_stores_path {
            Some(path) => (KnownStores::load(path)?, !path.exists()),
            None => (KnownStores::default(), false),
        };
        let handler = Arc::new(ReplicaHandler {
            store: store.clone(),
            snapshots,
            feed: Arc::new(commit_feed::CommitFeed::new(commit_feed::FEED_CAPACITY)),
        });
        let service = service::start(&transport, handler.clone(), settings.service.clone())?;
        let metrics = Arc::new(PersistenceMetrics::default());
        let caller: Arc<dyn caller::ReplicaCaller> = Arc::new(TransportCaller {
            transport,
            local: handler,
            timeout: settings.writers.writer.request_timeout,
        });
        let journal_membership = membership.clone();
        let writers = writers::start(
            caller.clone(),
            membership.clone(),
            settings.writers.clone(),
            metrics.clone(),
            known_stores,
            settings.known_stores_path.clone(),
        );
        let mut maintenance_settings = settings.maintenance.clone();
        // A writer serving the log elsewhere moves it itself; wait until none can be.
        maintenance_settings.takeover_grace = maintenance_settings
            .takeover_grace
            .max(settings.writers.writer_idle_timeout + maintenance_settings.scan_interval);
        let maintenance = maintenance::start(
            store.clone(),
            caller.clone(),
            writers.clone(),
            membership,
            maintenance_settings,
            learn_from_configs,
        );
        let snapshots = Arc::new(ReplicatedSnapshotStore::new(
            writers.clone(),
            caller.clone(),
            settings.writers.writer.quorums,
        ));
        let journal = Arc::new(ReplicatedJournal::new(
            writers,
            caller,
            store,
            queries,
            journal_membership,
            settings.max_write_bytes,
        ));
        Ok(Persistence {
            journal,
            snapshots,
            metrics,
            tasks: std::sync::Mutex::new(vec![service, maintenance]),
        })
    }

    /// Stops serving replica calls and scanning for logs to move, and waits for both tasks to
    /// end (so that they have let go of the stores). Later calls do nothing.
    pub async fn stop(&self) {
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
    }
}
