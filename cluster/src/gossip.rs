//! The gossiped membership state: members, seen set, reachability, version and tombstones.
//!
//! It is a CRDT in the sense of the cluster specification: `merge` is commutative, associative
//! and idempotent on members, reachability and tombstones, so concurrent changes made on
//! different nodes converge to the same result.

use crate::address::{Address, UniqueAddress};
use crate::member::{Member, MemberStatus};
use crate::reachability::Reachability;
use crate::vclock::VectorClock;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Membership state exchanged by gossip.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gossip {
    /// Members sorted by unique address: the order that decides the leader.
    pub members: BTreeMap<UniqueAddress, Member>,
    /// Nodes known to have seen exactly this `version`.
    pub seen: BTreeSet<UniqueAddress>,
    pub reachability: Reachability,
    pub version: VectorClock,
    /// Removed incarnations with the wall-clock time (ms since the Unix epoch) of their
    /// removal, so that stale gossip cannot bring them back. Pruned after a retention period.
    pub tombstones: BTreeMap<UniqueAddress, u64>,
}

impl Gossip {
    pub fn member(&self, node: &UniqueAddress) -> Option<&Member> {
        self.members.get(node)
    }

    /// The current member at `address`, whatever its uid.
    pub fn member_by_address(&self, address: &Address) -> Option<&Member> {
        self.members
            .values()
            .find(|m| m.address() == address && m.status != MemberStatus::Removed)
    }

    pub fn has_member(&self, node: &UniqueAddress) -> bool {
        self.members.contains_key(node)
    }

    pub fn seen_by(&self, node: &UniqueAddress) -> bool {
        self.seen.contains(node)
    }

    /// Merges two concurrent versions. The seen set starts empty: nobody has seen the result.
    pub fn merge(&self, other: &Gossip) -> Gossip {
        let mut tombstones = self.tombstones.clone();
        for (node, &removed_at_ms) in &other.tombstones {
            let entry = tombstones.entry(node.clone()).or_insert(removed_at_ms);
            *entry = (*entry).max(removed_at_ms);
        }

        let mut members = self.members.clone();
        for (node, theirs) in &other.members {
            let merged = match members.get(node) {
                Some(mine) => mine.merged_with(theirs),
                None => theirs.clone(),
            };
            members.insert(node.clone(), merged);
        }
        members.retain(|node, _| !tombstones.contains_key(node));

        let removed: BTreeSet<UniqueAddress> = tombstones.keys().cloned().collect();
        let mut reachability = self.reachability.merge(&other.reachability);
        reachability.remove_nodes(&removed);

        let mut version = self.version.merge(&other.version);
        for node in &removed {
            version.prune(node);
        }

        Gossip {
            members,
            seen: BTreeSet::new(),
            reachability,
            version,
            tombstones,
        }
    }

    /// Removes members: tombstones them, forgets their reachability rows, prunes them from the
    /// vector clock and the seen set.
    pub fn remove_members(&mut self, nodes: &BTreeSet<UniqueAddress>, now_wall_ms: u64) {
        for node in nodes {
            self.members.remove(node);
            self.seen.remove(node);
            self.version.prune(node);
            self.tombstones.insert(node.clone(), now_wall_ms);
        }
        self.reachability.remove_nodes(nodes);
    }

    /// Forgets tombstones older than the retention period.
    pub fn prune_tombstones(&mut self, now_wall_ms: u64, retention_ms: u64) {
        self.tombstones
            .retain(|_, removed_at| now_wall_ms.saturating_sub(*removed_at) < retention_ms);
    }

    /// Whether `observer`'s verdicts count: it is a member that is not Down or Exiting. Those
    /// are on their way out and may never update their rows again; a node downed while it
    /// was paused, for one, finds every other node unreachable when it resumes and gossips
    /// so before it hears that it was downed.
    fn counts_as_observer(&self, observer: &UniqueAddress) -> bool {
        self.members
            .get(observer)
            .is_some_and(|m| !matches!(m.status, MemberStatus::Down | MemberStatus::Exiting))
    }

    /// Subjects reported unreachable, ignoring verdicts of observers that do not count.
    pub fn unreachable_excluding_downed_observers(&self) -> BTreeSet<UniqueAddress> {
        self.reachability
            .all_unreachable()
            .into_iter()
            .filter(|subject| {
                self.reachability
                    .observers_of(subject)
                    .iter()
                    .any(|o| self.counts_as_observer(o))
            })
            .collect()
    }

    /// Members both reported unreachable and reporting others unreachable (the ends of a
    /// one-way or partial partition, which the split-brain resolver downs), ignoring
    /// verdicts of observers that do not count: otherwise the rows of one downed node that
    /// resumed would make every node that sees it unreachable "indirectly connected".
    pub fn indirectly_connected_excluding_downed_observers(&self) -> BTreeSet<UniqueAddress> {
        let unreachable = self.unreachable_excluding_downed_observers();
        self.reachability
            .observers_with_unreachable()
            .into_iter()
            .filter(|observer| self.counts_as_observer(observer) && unreachable.contains(observer))
            .collect()
    }

    /// Gossip convergence (docs/src/design.md §3): every member that is not Down or Exiting
    /// has seen this version, and no such member is unreachable.
    pub fn is_converged(&self) -> bool {
        let skip = |m: &Member| matches!(m.status, MemberStatus::Down | MemberStatus::Exiting);
        let all_seen = self
            .members
            .values()
            .all(|m| skip(m) || self.seen.contains(&m.unique_address));
        let unreachable_ok = self
            .unreachable_excluding_downed_observers()
            .iter()
            .all(|node| self.members.get(node).is_none_or(skip));
        all_seen && unreachable_ok
    }

    /// The leader as seen from `self_node`: the first reachable Up or Leaving member in address
    /// order; without one, the first reachable member that is not Down (Exiting last).
    pub fn leader(&self, self_node: &UniqueAddress) -> Option<UniqueAddress> {
        let unreachable = self.unreachable_excluding_downed_observers();
        let candidates: Vec<&Member> = self
            .members
            .values()
            .filter(|m| m.status != MemberStatus::Down)
            .filter(|m| &m.unique_address == self_node || !unreachable.contains(&m.unique_address))
            .collect();
        if let Some(m) = candidates
            .iter()
            .find(|m| matches!(m.status, MemberStatus::Up | MemberStatus::Leaving))
        {
            return Some(m.unique_address.clone());
        }
        candidates
            .iter()
            .min_by_key(|m| (m.status == MemberStatus::Exiting, &m.unique_address))
            .map(|m| m.unique_address.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reachability::ReachabilityStatus;
    use proptest::prelude::*;

    fn node(i: u16) -> UniqueAddress {
        UniqueAddress::new(Address::new("127.0.0.1", 1000 + i), u64::from(i))
    }

    fn with_members(entries: &[(u16, MemberStatus)]) -> Gossip {
        let mut g = Gossip::default();
        for &(i, status) in entries {
            let mut m = Member::joining(node(i), BTreeSet::new(), "1".into());
            m.status = status;
            if status != MemberStatus::Joining {
                m.up_number = i32::from(i);
            }
            g.members.insert(node(i), m);
        }
        g
    }

    #[test]
    fn leader_is_first_reachable_up_member() {
        let mut g = with_members(&[
            (1, MemberStatus::Joining),
            (2, MemberStatus::Up),
            (3, MemberStatus::Up),
        ]);
        assert_eq!(g.leader(&node(3)), Some(node(2)));
        g.reachability
            .set(&node(3), &node(2), ReachabilityStatus::Unreachable);
        assert_eq!(g.leader(&node(3)), Some(node(3)));
        // The unreachable node still sees itself as reachable.
        assert_eq!(g.leader(&node(2)), Some(node(2)));
    }

    /// A node downed while paused resumes, finds every other node unreachable and gossips
    /// so before it hears it was downed (found by `tessera soak`: every node then led itself
    /// and downed all the others as indirectly connected, splitting the cluster in five).
    #[test]
    fn a_downed_observer_neither_moves_the_leader_nor_makes_others_indirectly_connected() {
        let mut g = with_members(&[
            (1, MemberStatus::Up),
            (2, MemberStatus::Down),
            (3, MemberStatus::Up),
            (4, MemberStatus::Up),
            (5, MemberStatus::Up),
        ]);
        for i in [1, 3, 4, 5] {
            g.reachability
                .set(&node(i), &node(2), ReachabilityStatus::Unreachable);
            g.reachability
                .set(&node(2), &node(i), ReachabilityStatus::Unreachable);
        }
        for i in [1, 3, 4, 5] {
            assert_eq!(g.leader(&node(i)), Some(node(1)), "as node {i} sees it");
        }
        assert_eq!(
            g.unreachable_excluding_downed_observers(),
            BTreeSet::from([node(2)])
        );
        assert!(
            g.indirectly_connected_excluding_downed_observers()
                .is_empty()
        );
        // Once it counts again (it did not, as Down), the same rows make a partial partition.
        g.members.get_mut(&node(2)).unwrap().status = MemberStatus::Up;
        assert_eq!(g.leader(&node(3)), Some(node(3)));
        assert_eq!(
            g.indirectly_connected_excluding_downed_observers(),
            BTreeSet::from([node(1), node(2), node(3), node(4), node(5)])
        );
    }

    #[test]
    fn lone_joining_node_leads_itself() {
        let g = with_members(&[(1, MemberStatus::Joining)]);
        assert_eq!(g.leader(&node(1)), Some(node(1)));
    }

    #[test]
    fn convergence_needs_everyone_seen_and_reachable() {
        let mut g = with_members(&[
            (1, MemberStatus::Up),
            (2, MemberStatus::Up),
            (3, MemberStatus::Down),
        ]);
        g.seen.insert(node(1));
        assert!(!g.is_converged());
        g.seen.insert(node(2));
        assert!(g.is_converged(), "a Down member need not have seen");
        g.reachability
            .set(&node(1), &node(3), ReachabilityStatus::Unreachable);
        assert!(
            g.is_converged(),
            "an unreachable Down member does not block"
        );
        g.reachability
            .set(&node(1), &node(2), ReachabilityStatus::Unreachable);
        assert!(!g.is_converged());
    }

    #[test]
    fn tombstoned_members_do_not_come_back() {
        let full = with_members(&[(1, MemberStatus::Up), (2, MemberStatus::Up)]);
        let mut removed = full.clone();
        removed.remove_members(&BTreeSet::from([node(2)]), 10);
        let merged = full.merge(&removed);
        assert!(!merged.has_member(&node(2)));
        assert!(merged.version.nodes().all(|n| n != &node(2)));
    }

    fn arb_status() -> impl Strategy<Value = MemberStatus> {
        prop::sample::select(MemberStatus::ALL[..6].to_vec())
    }

    fn arb_gossip() -> impl Strategy<Value = Gossip> {
        (
            prop::collection::vec((0u16..6, arb_status()), 0..6),
            prop::collection::vec(0u16..6, 0..2),
            prop::collection::vec((0u16..6, 0u16..6), 0..4),
        )
            .prop_map(|(entries, tomb, unreachable)| {
                let mut g = with_members(&entries);
                for (o, s) in unreachable {
                    g.reachability
                        .set(&node(o), &node(s), ReachabilityStatus::Unreachable);
                }
                g.version.increment(&node(0));
                let tombs: BTreeSet<_> = tomb.into_iter().map(node).collect();
                g.remove_members(&tombs, 5);
                g
            })
    }

    proptest! {
        #[test]
        fn merge_is_commutative_associative_idempotent(a in arb_gossip(), b in arb_gossip(), c in arb_gossip()) {
            prop_assert_eq!(a.merge(&b), b.merge(&a));
            prop_assert_eq!(a.merge(&b).merge(&c), a.merge(&b.merge(&c)));
            let aa = a.merge(&a);
            prop_assert_eq!(aa.merge(&a), aa);
        }
    }
}
