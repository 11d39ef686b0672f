//! The coordinator's durable state: which region hosts which shard, and which regions and
//! proxies are registered. It changes only by [`StateEvent`]s, each written to the state store
//! before the coordinator acts on it, so a coordinator that takes over after a failure knows
//! every shard home that was ever told to anyone.

use crate::shard_id::ShardId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use tessera_cluster::UniqueAddress;

/// A shard region, named by the incarnation of the node it runs on (one region per entity
/// type per node; the coordinator is per entity type). A restarted node is a new region.
pub type RegionId = UniqueAddress;

/// One change of the coordinator's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StateEvent {
    RegionRegistered {
        region: RegionId,
    },
    ProxyRegistered {
        proxy: RegionId,
    },
    /// The region is gone (its node left the cluster or stopped its region); its shards are
    /// deallocated.
    RegionTerminated {
        region: RegionId,
    },
    ProxyTerminated {
        proxy: RegionId,
    },
    ShardHomeAllocated {
        shard: ShardId,
        region: RegionId,
    },
    ShardHomeDeallocated {
        shard: ShardId,
    },
}

/// An event that does not fit the state it is applied to; the state is unchanged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("shard {shard} is already allocated to {region}")]
    AlreadyAllocated { shard: ShardId, region: RegionId },
    #[error("region {region} is not registered")]
    UnknownRegion { region: RegionId },
    #[error("shard {shard} is not allocated")]
    NotAllocated { shard: ShardId },
}

/// Shard homes and registered regions. Invariant: `shards` and `regions` describe the same
/// allocation (each allocated shard is in exactly one registered region's set).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorState {
    shards: BTreeMap<ShardId, RegionId>,
    regions: BTreeMap<RegionId, BTreeSet<ShardId>>,
    proxies: BTreeSet<RegionId>,
    /// Shards whose region terminated while remember-entities is on: the coordinator
    /// allocates them again without waiting for a message, so their entities restart.
    unallocated: BTreeSet<ShardId>,
    remember_entities: bool,
}

impl CoordinatorState {
    pub fn new(remember_entities: bool) -> Self {
        CoordinatorState {
            remember_entities,
            ..CoordinatorState::default()
        }
    }

    /// The home of `shard`, if allocated.
    pub fn home(&self, shard: ShardId) -> Option<&RegionId> {
        self.shards.get(&shard)
    }

    pub fn shards(&self) -> &BTreeMap<ShardId, RegionId> {
        &self.shards
    }

    /// Registered regions and the shards each hosts.
    pub fn regions(&self) -> &BTreeMap<RegionId, BTreeSet<ShardId>> {
        &self.regions
    }

    pub fn proxies(&self) -> &BTreeSet<RegionId> {
        &self.proxies
    }

    pub fn unallocated(&self) -> &BTreeSet<ShardId> {
        &self.unallocated
    }

    pub fn remember_entities(&self) -> bool {
        self.remember_entities
    }

    /// Restores the shards to allocate again (from a stored state).
    pub fn set_unallocated(&mut self, shards: impl IntoIterator<Item = ShardId>) {
        self.unallocated = shards
            .into_iter()
            .filter(|s| !self.shards.contains_key(s))
            .collect();
    }

    /// Whether remember-entities is on: it follows the configuration, not the stored state.
    pub fn set_remember_entities(&mut self, remember_entities: bool) {
        self.remember_entities = remember_entities;
    }

    pub fn is_registered(&self, region: &RegionId) -> bool {
        self.regions.contains_key(region) || self.proxies.contains(region)
    }

    /// Whether `event` can be applied (what [`CoordinatorState::apply`] would refuse).
    pub fn check(&self, event: &StateEvent) -> Result<(), StateError> {
        match event {
            StateEvent::ShardHomeAllocated { shard, region } => {
                if let Some(home) = self.shards.get(shard) {
                    return Err(StateError::AlreadyAllocated {
                        shard: *shard,
                        region: home.clone(),
                    });
                }
                if !self.regions.contains_key(region) {
                    return Err(StateError::UnknownRegion {
                        region: region.clone(),
                    });
                }
                Ok(())
            }
            StateEvent::ShardHomeDeallocated { shard } => {
                if self.shards.contains_key(shard) {
                    Ok(())
                } else {
                    Err(StateError::NotAllocated { shard: *shard })
                }
            }
            StateEvent::RegionTerminated { region } => {
                if self.regions.contains_key(region) {
                    Ok(())
                } else {
                    Err(StateError::UnknownRegion {
                        region: region.clone(),
                    })
                }
            }
            StateEvent::ProxyTerminated { proxy } => {
                if self.proxies.contains(proxy) {
                    Ok(())
                } else {
                    Err(StateError::UnknownRegion {
                        region: proxy.clone(),
                    })
                }
            }
            StateEvent::RegionRegistered { .. } | StateEvent::ProxyRegistered { .. } => Ok(()),
        }
    }

    /// Applies `event`, or refuses it and changes nothing.
    pub fn apply(&mut self, event: &StateEvent) -> Result<(), StateError> {
        self.check(event)?;
        match event {
            StateEvent::RegionRegistered { region } => {
                self.regions.entry(region.clone()).or_default();
            }
            StateEvent::ProxyRegistered { proxy } => {
                self.proxies.insert(proxy.clone());
            }
            StateEvent::RegionTerminated { region } => {
                let hosted = self.regions.remove(region).unwrap_or_default();
                for shard in hosted {
                    self.shards.remove(&shard);
                    if self.remember_entities {
                        self.unallocated.insert(shard);
                    }
                }
            }
            StateEvent::ProxyTerminated { proxy } => {
                self.proxies.remove(proxy);
            }
            StateEvent::ShardHomeAllocated { shard, region } => {
                self.shards.insert(*shard, region.clone());
                if let Some(hosted) = self.regions.get_mut(region) {
                    hosted.insert(*shard);
                }
                self.unallocated.remove(shard);
            }
            StateEvent::ShardHomeDeallocated { shard } => {
                if let Some(region) = self.shards.remove(shard)
                    && let Some(hosted) = self.regions.get_mut(&region)
                {
                    hosted.remove(shard);
                }
                if self.remember_entities {
                    self.unallocated.insert(*shard);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_cluster::Address;

    fn region(port: u16) -> RegionId {
        UniqueAddress {
            address: Address::new("127.0.0.1", port),
            uid: u64::from(port),
        }
    }

    #[test]
    fn a_shard_is_allocated_once_and_terminating_its_region_frees_it() {
        let mut state = CoordinatorState::new(true);
        state
            .apply(&StateEvent::RegionRegistered { region: region(1) })
            .unwrap();
        state
            .apply(&StateEvent::RegionRegistered { region: region(2) })
            .unwrap();
        let allocate = |r| StateEvent::ShardHomeAllocated {
            shard: ShardId(7),
            region: region(r),
        };
        state.apply(&allocate(1)).unwrap();
        let before = state.clone();
        assert_eq!(
            state.apply(&allocate(2)),
            Err(StateError::AlreadyAllocated {
                shard: ShardId(7),
                region: region(1)
            })
        );
        assert_eq!(state, before, "a refused event changes nothing");
        state
            .apply(&StateEvent::RegionTerminated { region: region(1) })
            .unwrap();
        assert_eq!(state.home(ShardId(7)), None);
        assert!(state.unallocated().contains(&ShardId(7)));
        state.apply(&allocate(2)).unwrap();
        assert!(state.unallocated().is_empty());
        assert_eq!(state.regions()[&region(2)].len(), 1);
    }

    #[test]
    fn allocating_to_an_unregistered_region_is_refused() {
        let mut state = CoordinatorState::new(false);
        assert!(matches!(
            state.apply(&StateEvent::ShardHomeAllocated {
                shard: ShardId(1),
                region: region(9)
            }),
            Err(StateError::UnknownRegion { .. })
        ));
    }
}
