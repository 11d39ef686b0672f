//! The Replicator's view of the cluster: who receives data, who counts for quorums, who is
//! unreachable, who leads, and which nodes were removed (for pruning).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;
use tessera_cluster::{MemberStatus, UniqueAddress};

/// A membership snapshot handed to the Replicator (from the cluster's events, or a test).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MembershipView {
    pub members: Vec<(UniqueAddress, MemberStatus)>,
    pub unreachable: BTreeSet<UniqueAddress>,
    pub leader: Option<UniqueAddress>,
}

/// What the Replicator derives from the views it was given.
#[derive(Debug, Default)]
pub struct Members {
    /// Other members that count for quorums: Up, Leaving, Exiting, and Down until removed
    /// (a downed node that still counts makes a majority harder, never easier).
    pub counted: BTreeSet<UniqueAddress>,
    /// Other members that receive data without counting: WeaklyUp (and Joining ones that
    /// already run a Replicator).
    pub weakly_up: BTreeSet<UniqueAddress>,
    pub unreachable: BTreeSet<UniqueAddress>,
    pub leader: Option<UniqueAddress>,
    /// Nodes removed from the cluster (or found in data without being members) and when
    /// this node learnt it.
    pub removed: BTreeMap<UniqueAddress, Instant>,
    /// Whether this node is itself a member that takes part in quorums (Joining, WeaklyUp,
    /// Up, Leaving or Exiting). A node outside any cluster, or downed, must not answer a
    /// majority on its own.
    pub self_member: bool,
}

impl Members {
    /// Takes a new view; returns the nodes that were removed since the previous one.
    pub fn update(
        &mut self,
        self_node: &UniqueAddress,
        view: &MembershipView,
        now: Instant,
    ) -> Vec<UniqueAddress> {
        let before: BTreeSet<UniqueAddress> =
            self.counted.union(&self.weakly_up).cloned().collect();
        self.counted.clear();
        self.weakly_up.clear();
        self.self_member = false;
        for (node, status) in &view.members {
            if node == self_node {
                self.self_member = matches!(
                    status,
                    MemberStatus::Joining
                        | MemberStatus::WeaklyUp
                        | MemberStatus::Up
                        | MemberStatus::Leaving
                        | MemberStatus::Exiting
                );
                continue;
            }
            match status {
                MemberStatus::Up
                | MemberStatus::Leaving
                | MemberStatus::Exiting
                | MemberStatus::Down => {
                    self.counted.insert(node.clone());
                }
                MemberStatus::WeaklyUp | MemberStatus::Joining => {
                    self.weakly_up.insert(node.clone());
                }
                MemberStatus::Removed => {}
            }
        }
        for (node, _) in &view.members {
            self.removed.remove(node);
        }
        self.unreachable = view.unreachable.clone();
        self.leader = view.leader.clone();
        let now_known: BTreeSet<&UniqueAddress> = self.counted.union(&self.weakly_up).collect();
        let mut removed = Vec::new();
        for node in before {
            if !now_known.contains(&node) {
                self.removed.entry(node.clone()).or_insert(now);
                removed.push(node);
            }
        }
        removed
    }

    /// Members this node counts for quorums, itself included.
    pub fn counted_with_self(&self) -> usize {
        self.counted.len() + 1
    }

    /// Every other member that receives data.
    pub fn receivers(&self) -> impl Iterator<Item = &UniqueAddress> {
        self.counted.iter().chain(self.weakly_up.iter())
    }

    /// Whether this node leads the cluster.
    pub fn is_leader(&self, self_node: &UniqueAddress) -> bool {
        self.leader.as_ref() == Some(self_node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_cluster::Address;

    fn node(port: u16) -> UniqueAddress {
        UniqueAddress::new(Address::new("127.0.0.1", port), u64::from(port))
    }

    #[test]
    fn weakly_up_members_receive_but_do_not_count() {
        let mut members = Members::default();
        let view = MembershipView {
            members: vec![
                (node(1), MemberStatus::Up),
                (node(2), MemberStatus::Up),
                (node(3), MemberStatus::WeaklyUp),
            ],
            ..MembershipView::default()
        };
        members.update(&node(1), &view, Instant::now());
        assert_eq!(members.counted_with_self(), 2);
        assert_eq!(members.receivers().count(), 2);
    }

    #[test]
    fn members_that_vanish_are_recorded_as_removed() {
        let mut members = Members::default();
        let now = Instant::now();
        let all = MembershipView {
            members: vec![(node(1), MemberStatus::Up), (node(2), MemberStatus::Up)],
            ..MembershipView::default()
        };
        members.update(&node(1), &all, now);
        let alone = MembershipView {
            members: vec![(node(1), MemberStatus::Up)],
            ..MembershipView::default()
        };
        assert_eq!(members.update(&node(1), &alone, now), vec![node(2)]);
        assert!(members.removed.contains_key(&node(2)));
        assert_eq!(members.counted_with_self(), 1);
    }
}
