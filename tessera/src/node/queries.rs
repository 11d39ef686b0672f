//! The sharding routes' view of the node: its regions' state, and every member's.

use super::CLUSTER_STATE_TIMEOUT;
use crate::http::sharding::ShardingQueries;
use futures::FutureExt;
use futures::future::BoxFuture;
use std::sync::Arc;
use tessera_cluster::node::ClusterHandle;
use tessera_cluster::transport::TcpTransport;
use tessera_cluster::{Address, MemberStatus};
use tessera_coordinator::runtime::Sharding;
use tessera_coordinator::wire::RegionSnapshot;

/// [`ShardingQueries`] over the node's sharding.
pub(super) struct ShardedQueries {
    pub sharding: Arc<Sharding<TcpTransport>>,
    pub cluster: ClusterHandle,
}

impl ShardingQueries for ShardedQueries {
    fn type_names(&self) -> Vec<String> {
        self.sharding
            .type_names()
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    fn region_state(&self, entity_type: &str) -> BoxFuture<'static, Option<RegionSnapshot>> {
        let sharding = self.sharding.clone();
        let entity_type = entity_type.to_string();
        async move { sharding.region_state(&entity_type).await }.boxed()
    }

    fn cluster_state(
        &self,
        entity_type: &str,
    ) -> BoxFuture<'static, Vec<(Address, Result<RegionSnapshot, String>)>> {
        let sharding = self.sharding.clone();
        let entity_type = entity_type.to_string();
        let members: Vec<Address> = self
            .cluster
            .snapshot()
            .members
            .iter()
            .filter(|m| m.status != MemberStatus::Removed)
            .map(|m| m.address().clone())
            .collect();
        async move {
            sharding
                .cluster_state(&entity_type, members, CLUSTER_STATE_TIMEOUT)
                .await
        }
        .boxed()
    }
}
