//! Sharding settings, with Akka's names and defaults unless noted.

use crate::shard_id::{ShardIds, ShardMap};
use std::time::Duration;

/// A setting out of its range; the message names it, its value and what is allowed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid sharding setting {name}={value}: {expected}")]
pub struct InvalidSetting {
    pub name: &'static str,
    pub value: String,
    pub expected: &'static str,
}

/// Settings of the coordinator and the regions of one entity type.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardingSettings {
    /// Shards of the type, fixed for the cluster's life (entity → shard depends on it).
    pub number_of_shards: u32,
    /// How entity ids map to shards (by hash unless the ids are instance numbers).
    pub shard_ids: ShardIds,
    /// How often the coordinator considers a rebalance round.
    pub rebalance_interval: Duration,
    /// At most this many shards move per rebalance round.
    pub rebalance_absolute_limit: usize,
    /// At most this fraction of all shards moves per round.
    pub rebalance_relative_limit: f64,
    /// A handoff not finished within this long is given up; the shard stays where it was.
    pub handoff_timeout: Duration,
    /// Regions repeat registration and shard-home questions, and the coordinator repeats
    /// handoff messages, this often until answered.
    pub retry_interval: Duration,
    /// The coordinator repeats `HostShard` to an owner that did not confirm within this long.
    pub shard_start_timeout: Duration,
    /// Messages a region holds for shards whose home it does not know yet (all shards
    /// together); one more is refused with a clear error.
    pub buffer_size: usize,
    /// Messages the coordinator holds while a state write is in flight; more are dropped (the
    /// regions repeat theirs).
    pub coordinator_stash_capacity: usize,
    /// A failed state write is tried again after this long.
    pub update_retry_interval: Duration,
}

impl Default for ShardingSettings {
    /// 1,000 shards; rebalance every 10 s, at most min(20, 10 %) per round; handoff timeout
    /// 60 s; retries every 2 s; shard start timeout 10 s; 100,000 buffered messages per region.
    fn default() -> Self {
        ShardingSettings {
            number_of_shards: 1000,
            shard_ids: ShardIds::Hashed,
            rebalance_interval: Duration::from_secs(10),
            rebalance_absolute_limit: 20,
            rebalance_relative_limit: 0.1,
            handoff_timeout: Duration::from_secs(60),
            retry_interval: Duration::from_secs(2),
            shard_start_timeout: Duration::from_secs(10),
            buffer_size: 100_000,
            coordinator_stash_capacity: 100_000,
            update_retry_interval: Duration::from_millis(500),
        }
    }
}

impl ShardingSettings {
    /// The type's mapping from entity ids to shards.
    pub fn shard_map(&self) -> ShardMap {
        ShardMap {
            number_of_shards: self.number_of_shards,
            ids: self.shard_ids,
        }
    }

    pub fn validate(&self) -> Result<(), InvalidSetting> {
        let bad = |name, value: String, expected| {
            Err(InvalidSetting {
                name,
                value,
                expected,
            })
        };
        if self.number_of_shards == 0 {
            return bad("number_of_shards", "0".into(), "at least 1");
        }
        if self.rebalance_absolute_limit == 0 {
            return bad("rebalance_absolute_limit", "0".into(), "at least 1");
        }
        if !(self.rebalance_relative_limit > 0.0 && self.rebalance_relative_limit <= 1.0) {
            return bad(
                "rebalance_relative_limit",
                self.rebalance_relative_limit.to_string(),
                "a fraction in (0, 1]",
            );
        }
        for (name, value) in [
            ("rebalance_interval", self.rebalance_interval),
            ("handoff_timeout", self.handoff_timeout),
            ("retry_interval", self.retry_interval),
            ("shard_start_timeout", self.shard_start_timeout),
            ("update_retry_interval", self.update_retry_interval),
        ] {
            if value.is_zero() {
                return bad(name, "0s".into(), "a positive duration");
            }
        }
        if self.buffer_size == 0 {
            return bad("buffer_size", "0".into(), "at least 1");
        }
        if self.coordinator_stash_capacity == 0 {
            return bad("coordinator_stash_capacity", "0".into(), "at least 1");
        }
        Ok(())
    }
}
