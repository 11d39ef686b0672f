//! Who holds a log: replica identities, a log's configuration, and the quorum sizes.

use serde::{Deserialize, Serialize};
use std::fmt;
use tessera_cluster::Address;

/// One replica store: the random id its store was given when it was created, and the
/// cluster address its node was last seen at.
///
/// The store is the identity (equality, order and hashing look at `storage_id` only): a node
/// that comes back with an empty disk has a new storage id, so it is a different replica and
/// can never answer for data it lost; a node that comes back at another address with its
/// disk is the same replica, found by its id and moved in the configuration. Two nodes must
/// never run copies of one store directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReplicaId {
    pub address: Address,
    pub storage_id: u64,
}

impl PartialEq for ReplicaId {
    fn eq(&self, other: &Self) -> bool {
        self.storage_id == other.storage_id
    }
}

impl Eq for ReplicaId {}

impl std::hash::Hash for ReplicaId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.storage_id.hash(state);
    }
}

impl PartialOrd for ReplicaId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ReplicaId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.storage_id.cmp(&other.storage_id)
    }
}

impl ReplicaId {
    pub fn new(address: Address, storage_id: u64) -> Self {
        ReplicaId {
            address,
            storage_id,
        }
    }
}

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:016x}", self.address, self.storage_id)
    }
}

/// The replicas of a log at one version. Stored with the log and changed only by its fenced
/// writer; the placement ring is only where it should be, this is where it is.
///
/// A change goes through a joint configuration (Raft's joint consensus): the new members,
/// with the previous ones kept in `previous`, and every quorum taken in both. Only once the
/// joint configuration is sealed on a quorum of both does the writer move to the new members
/// alone, so that no later recovery can use the old members alone nor the new ones before
/// they hold the log.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Configuration {
    /// Increases by one with every change (joint configurations count).
    pub version: u64,
    /// Distinct replicas, in placement order.
    pub members: Vec<ReplicaId>,
    /// During a change, the members being left; quorums are needed in both sets.
    pub previous: Option<Vec<ReplicaId>>,
}

impl Configuration {
    pub fn new(version: u64, members: Vec<ReplicaId>) -> Self {
        Configuration {
            version,
            members,
            previous: None,
        }
    }

    /// The joint configuration of a change from `self` to `members`.
    pub fn joint(&self, members: Vec<ReplicaId>) -> Self {
        Configuration {
            version: self.version + 1,
            members,
            previous: Some(self.members.clone()),
        }
    }

    /// This configuration with each member at the address its store was last seen at, where
    /// `seen_at` knows it. The members are the same replicas.
    pub fn relocated(&self, seen_at: &std::collections::BTreeMap<u64, Address>) -> Self {
        let relocate = |members: &[ReplicaId]| -> Vec<ReplicaId> {
            members
                .iter()
                .map(|m| ReplicaId {
                    address: seen_at
                        .get(&m.storage_id)
                        .cloned()
                        .unwrap_or_else(|| m.address.clone()),
                    storage_id: m.storage_id,
                })
                .collect()
        };
        Configuration {
            version: self.version,
            members: relocate(&self.members),
            previous: self.previous.as_deref().map(relocate),
        }
    }

    /// Whether a member's store was seen at another address than the one named here.
    pub fn has_moved_member(&self, seen_at: &std::collections::BTreeMap<u64, Address>) -> bool {
        self.all_members().iter().any(|m| {
            seen_at
                .get(&m.storage_id)
                .is_some_and(|address| *address != m.address)
        })
    }

    /// The configuration a joint one ends in: its new members alone.
    pub fn settled(&self) -> Self {
        Configuration::new(self.version + 1, self.members.clone())
    }

    pub fn is_joint(&self) -> bool {
        self.previous.is_some()
    }

    /// The member sets a quorum must be taken in: one, or two during a change.
    pub fn parts(&self) -> impl Iterator<Item = &[ReplicaId]> {
        std::iter::once(self.members.as_slice()).chain(self.previous.as_deref())
    }

    /// Every replica of every part, each once, in order.
    pub fn all_members(&self) -> Vec<ReplicaId> {
        let mut all = self.members.clone();
        for m in self.previous.iter().flatten() {
            if !all.contains(m) {
                all.push(m.clone());
            }
        }
        all
    }

    /// Whether `replica` belongs to any part.
    pub fn contains(&self, replica: &ReplicaId) -> bool {
        self.members.contains(replica) || self.previous.iter().flatten().any(|m| m == replica)
    }

    /// Whether each part has at least `needed(part size)` of `replicas`.
    pub fn has_quorum<'a>(
        &self,
        replicas: impl IntoIterator<Item = &'a ReplicaId> + Clone,
        needed: impl Fn(usize) -> usize,
    ) -> bool {
        self.parts().all(|part| {
            let count = replicas
                .clone()
                .into_iter()
                .filter(|r| part.contains(r))
                .count();
            count >= needed(part.len())
        })
    }

    /// The member at `address`, whatever its storage id.
    pub fn member_at(&self, address: &Address) -> Option<&ReplicaId> {
        self.members.iter().find(|m| &m.address == address)
    }
}

fn write_members(f: &mut fmt::Formatter<'_>, members: &[ReplicaId]) -> fmt::Result {
    write!(f, "[")?;
    for (i, m) in members.iter().enumerate() {
        if i > 0 {
            write!(f, ", ")?;
        }
        write!(f, "{}", m.address)?;
    }
    write!(f, "]")
}

impl fmt::Display for Configuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{} ", self.version)?;
        write_members(f, &self.members)?;
        if let Some(previous) = &self.previous {
            write!(f, " (joint with ")?;
            write_members(f, previous)?;
            write!(f, ")")?;
        }
        Ok(())
    }
}

/// Why replication settings are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuorumError {
    #[error("journal_replication_factor must be at least 1, got {0}")]
    NoReplicas(usize),
    #[error(
        "journal_write_quorum must be more than half of journal_replication_factor and at most \
         it (W > N/2, W <= N): got W={write_quorum} with N={replication_factor}"
    )]
    BadWriteQuorum {
        replication_factor: usize,
        write_quorum: usize,
    },
}

/// The replication factor N and write quorum W, validated (W > N/2, W ≤ N).
///
/// A configuration of N members needs W acknowledgements for a write and N − W + 1 promises
/// for a recovery: the two sets always share a member, so a writer that was fenced can never
/// again collect W acknowledgements. A smaller configuration (a cluster with fewer than N
/// members) uses a majority of its members for both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quorums {
    replication_factor: usize,
    write_quorum: usize,
}

impl Quorums {
    pub fn new(replication_factor: usize, write_quorum: usize) -> Result<Self, QuorumError> {
        if replication_factor == 0 {
            return Err(QuorumError::NoReplicas(replication_factor));
        }
        if write_quorum * 2 <= replication_factor || write_quorum > replication_factor {
            return Err(QuorumError::BadWriteQuorum {
                replication_factor,
                write_quorum,
            });
        }
        Ok(Quorums {
            replication_factor,
            write_quorum,
        })
    }

    /// N.
    pub fn replication_factor(&self) -> usize {
        self.replication_factor
    }

    /// W.
    pub fn write_quorum(&self) -> usize {
        self.write_quorum
    }

    /// Acknowledgements a write needs in a configuration of `members` replicas.
    pub fn acks(&self, members: usize) -> usize {
        if members >= self.replication_factor {
            self.write_quorum
        } else {
            members / 2 + 1
        }
    }

    /// Promises a recovery needs in a configuration of `members` replicas.
    pub fn promises(&self, members: usize) -> usize {
        (members + 1).saturating_sub(self.acks(members)).max(1)
    }
}

impl Default for Quorums {
    /// N = 3, W = 2.
    fn default() -> Self {
        Quorums {
            replication_factor: 3,
            write_quorum: 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_quorum_must_be_a_majority() {
        assert!(Quorums::new(3, 2).is_ok());
        assert!(Quorums::new(1, 1).is_ok());
        assert!(Quorums::new(5, 3).is_ok());
        assert!(Quorums::new(3, 3).is_ok());
        assert_eq!(
            Quorums::new(3, 1),
            Err(QuorumError::BadWriteQuorum {
                replication_factor: 3,
                write_quorum: 1
            })
        );
        assert!(Quorums::new(4, 2).is_err());
        assert!(Quorums::new(3, 4).is_err());
        assert_eq!(Quorums::new(0, 0), Err(QuorumError::NoReplicas(0)));
    }

    #[test]
    fn promises_and_acks_always_overlap() {
        for n in 1..=7 {
            for w in (n / 2 + 1)..=n {
                let q = Quorums::new(n, w).unwrap();
                for members in 1..=n {
                    let (acks, promises) = (q.acks(members), q.promises(members));
                    assert!(
                        acks >= 1 && acks <= members,
                        "n={n} w={w} members={members}"
                    );
                    assert!(promises >= 1 && promises <= members);
                    assert!(acks + promises > members, "n={n} w={w} members={members}");
                }
            }
        }
        let q = Quorums::default();
        assert_eq!((q.acks(3), q.promises(3)), (2, 2));
        assert_eq!((q.acks(2), q.promises(2)), (2, 1));
        assert_eq!((q.acks(1), q.promises(1)), (1, 1));
    }
}
