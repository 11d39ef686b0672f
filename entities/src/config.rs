//! Settings of an entity host: snapshots and retention, passivation, timeouts and the bounds
//! of every queue.

use crate::budget::ActiveEntityBudget;
use std::time::Duration;

/// An [`EntityConfig`] or entity type name that an [`EntityHost`](crate::EntityHost) refuses;
/// the message names the setting, its value and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid entity host configuration: {0}")]
pub struct InvalidConfig(pub String);

/// Configuration of an [`EntityHost`](crate::EntityHost).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityConfig {
    /// Take a snapshot each time an entity's sequence number crosses a multiple of this many
    /// events (0: never). Recovery then replays at most about this many events.
    pub snapshot_every: u64,
    /// Snapshots kept per entity (at least 1): those in the last `keep_snapshots` multiples of
    /// `snapshot_every`; older ones are deleted after a new one is saved.
    pub keep_snapshots: u64,
    /// After a snapshot, delete the events that the oldest kept snapshot covers. Saves space;
    /// loses the full history (for queries and for recovery past a corrupt snapshot).
    pub delete_events_on_snapshot: bool,
    /// Stop an entity that received no command for this long (None: never). Its next command
    /// starts a new incarnation that recovers from the store.
    pub passivate_after: Option<Duration>,
    /// Most entities taking commands at once on this host (None: no limit). Starting one more
    /// first passivates the least recently used (by last command). The limit is split evenly
    /// over the host partitions (the remainder to the first ones) so that no lock spans them:
    /// each partition evicts within its share, and since ids spread over the partitions by
    /// hash, a host may evict a little before it holds `active_entity_limit` entities. An
    /// evicted entity finishing its write in flight no longer counts. At least
    /// `host_partitions`. Cluster sharding sets it per region (Akka's default: 100,000).
    pub active_entity_limit: Option<usize>,
    /// A limit on active entities shared with other hosts (a node's entity types); None: only
    /// `active_entity_limit` bounds this host. At the budget's limit, starting one more
    /// entity passivates the least recently used of its partition first; see
    /// [`ActiveEntityBudget`] for the bound that holds.
    pub node_budget: Option<ActiveEntityBudget>,
    /// How long [`EntityRef::ask`](crate::EntityRef::ask) waits for a reply.
    pub ask_timeout: Duration,
    /// Commands queued per live entity; a command arriving at a full mailbox fails with
    /// [`EntityError::MailboxFull`](crate::EntityError::MailboxFull). Also bounds the commands
    /// held for an entity while it stops (for its next incarnation).
    pub mailbox_capacity: usize,
    /// Commands an entity holds while it recovers or persists; one more fails with
    /// [`EntityError::StashFull`](crate::EntityError::StashFull).
    pub stash_capacity: usize,
    /// Tasks the host routes through, by a stable hash of the entity id: more partitions spread
    /// routing over more cores.
    pub host_partitions: usize,
    /// Commands queued per host partition; one more fails with
    /// [`EntityError::HostBusy`](crate::EntityError::HostBusy).
    pub host_queue_capacity: usize,
    /// Names this node in the writer id stored with every event (with the partition and the
    /// incarnation), so an event can be traced to the incarnation that wrote it.
    pub node_id: String,
}

impl Default for EntityConfig {
    /// Snapshots every 100 events (keep 2, events kept), passivation after 2 minutes idle,
    /// 5 s ask timeout, no active-entity limit, mailboxes of 1,024, stashes of 4,096, 16 host
    /// partitions of 4,096.
    fn default() -> Self {
        EntityConfig {
            snapshot_every: 100,
            keep_snapshots: 2,
            delete_events_on_snapshot: false,
            passivate_after: Some(Duration::from_secs(120)),
            active_entity_limit: None,
            node_budget: None,
            ask_timeout: Duration::from_secs(5),
            mailbox_capacity: 1_024,
            stash_capacity: 4_096,
            host_partitions: 16,
            host_queue_capacity: 4_096,
            node_id: "local".to_string(),
        }
    }
}

impl EntityConfig {
    /// Checks the bounds; the message names the setting, its value and what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        let at_least_one = [
            ("keep_snapshots", self.keep_snapshots as usize),
            ("mailbox_capacity", self.mailbox_capacity),
            ("stash_capacity", self.stash_capacity),
            ("host_partitions", self.host_partitions),
            ("host_queue_capacity", self.host_queue_capacity),
        ];
        for (key, value) in at_least_one {
            if value == 0 {
                return Err(format!("entity {key} = 0: must be at least 1"));
            }
        }
        if self.host_partitions > 4_096 {
            return Err(format!(
                "entity host_partitions = {}: must be at most 4096",
                self.host_partitions
            ));
        }
        if let Some(limit) = self.active_entity_limit
            && limit < self.host_partitions
        {
            return Err(format!(
                "entity active_entity_limit = {limit}: must be at least host_partitions = {} \
                 (each partition keeps its share of the limit)",
                self.host_partitions
            ));
        }
        if self.ask_timeout.is_zero() {
            return Err("entity ask_timeout = 0s: must be greater than zero".to_string());
        }
        if self.passivate_after.is_some_and(|d| d.is_zero()) {
            return Err(
                "entity passivate_after = 0s: must be greater than zero (None disables it)"
                    .to_string(),
            );
        }
        if self.node_id.is_empty() || self.node_id.len() > 256 {
            return Err(format!(
                "entity node_id {:?}: must be 1 to 256 bytes",
                self.node_id
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_zero_bounds_are_refused() {
        assert_eq!(EntityConfig::default().validate(), Ok(()));
        let bad = EntityConfig {
            stash_capacity: 0,
            ..EntityConfig::default()
        };
        assert_eq!(
            bad.validate().unwrap_err(),
            "entity stash_capacity = 0: must be at least 1"
        );
        let bad = EntityConfig {
            passivate_after: Some(Duration::ZERO),
            ..EntityConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("passivate_after"));
        let bad = EntityConfig {
            active_entity_limit: Some(3),
            host_partitions: 4,
            ..EntityConfig::default()
        };
        assert_eq!(
            bad.validate().unwrap_err(),
            "entity active_entity_limit = 3: must be at least host_partitions = 4 (each \
             partition keeps its share of the limit)"
        );
    }
}
