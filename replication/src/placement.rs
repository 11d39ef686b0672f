//! Where a log should live: a consistent-hash ring of the Up members.
//!
//! The ring is only the *target*. A log's configuration, stored with the log, says where it
//! is; recovery starts at the ring's members because logs are created there, and a log whose
//! configuration lost a member gains the ring's next member. Adding or removing one node
//! moves about 1/n of the preference lists, not all of them.

use std::collections::BTreeSet;
use tessera_cluster::Address;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Points each member takes on the ring: enough that the share of logs per member is even to
/// within a few percent for clusters of tens of nodes.
pub const POINTS_PER_MEMBER: u32 = 128;

/// A hash ring over a set of member addresses.
#[derive(Clone, Debug, Default)]
pub struct Ring {
    /// (point, member index), sorted by point.
    points: Vec<(u64, usize)>,
    members: Vec<Address>,
}

fn hash_address(address: &Address, replica_point: u32) -> u64 {
    let text = format!("{address}");
    xxh3_64_with_seed(text.as_bytes(), u64::from(replica_point))
}

/// The ring position of a log. Stable across processes, platforms and releases.
pub fn log_point(persistence_id: &str) -> u64 {
    // A different seed from the members' points, so that a persistence id spelled like an
    // address does not land on that member's first point.
    xxh3_64_with_seed(persistence_id.as_bytes(), 0x7e55_e2a0_0000_0001)
}

impl Ring {
    /// The ring of `members` (duplicates are ignored).
    pub fn new(members: impl IntoIterator<Item = Address>) -> Self {
        let members: Vec<Address> = members
            .into_iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut points = Vec::with_capacity(members.len() * POINTS_PER_MEMBER as usize);
        for (index, member) in members.iter().enumerate() {
            for point in 0..POINTS_PER_MEMBER {
                points.push((hash_address(member, point), index));
            }
        }
        points.sort_unstable();
        Ring { points, members }
    }

    pub fn members(&self) -> &[Address] {
        &self.members
    }

    /// Every member in the order a log prefers them: walking the ring clockwise from the
    /// log's point, each member at its first point. The first N are the log's target.
    pub fn preference(&self, persistence_id: &str) -> Vec<Address> {
        if self.members.is_empty() {
            return Vec::new();
        }
        let start = self
            .points
            .partition_point(|&(point, _)| point < log_point(persistence_id));
        let mut taken = vec![false; self.members.len()];
        let mut order = Vec::with_capacity(self.members.len());
        for i in 0..self.points.len() {
            let (_, member) = self.points[(start + i) % self.points.len()];
            if !taken[member] {
                taken[member] = true;
                order.push(self.members[member].clone());
                if order.len() == self.members.len() {
                    break;
                }
            }
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn addresses(n: u16) -> Vec<Address> {
        (0..n)
            .map(|i| Address::new("127.0.0.1", 25520 + i))
            .collect()
    }

    #[test]
    fn preference_lists_every_member_once_and_is_stable() {
        let ring = Ring::new(addresses(5));
        let order = ring.preference("account|alice");
        assert_eq!(order.len(), 5);
        assert_eq!(order.iter().collect::<BTreeSet<_>>().len(), 5);
        // The same members in another order make the same ring.
        let mut reversed = addresses(5);
        reversed.reverse();
        assert_eq!(Ring::new(reversed).preference("account|alice"), order);
        assert!(Ring::new(Vec::new()).preference("x").is_empty());
    }

    #[test]
    fn logs_spread_evenly_over_the_first_replica() {
        let ring = Ring::new(addresses(5));
        let mut first: HashMap<Address, usize> = HashMap::new();
        for i in 0..10_000 {
            *first
                .entry(ring.preference(&format!("log-{i}"))[0].clone())
                .or_default() += 1;
        }
        for (member, count) in first {
            assert!((1_400..=2_600).contains(&count), "{member}: {count}");
        }
    }

    #[test]
    fn a_new_member_moves_few_targets() {
        let before = Ring::new(addresses(5));
        let after = Ring::new(addresses(6));
        let moved = (0..5_000)
            .filter(|i| {
                let id = format!("log-{i}");
                before.preference(&id)[..3] != after.preference(&id)[..3]
            })
            .count();
        // Every target that gains the new member changes: about 3/6 of them. Far from all.
        assert!(moved < 3_300, "{moved} of 5000 targets changed");
    }
}
