//! Faults on directed links between addresses: partitions, random drops, delays. A plain data
//! structure with a seeded RNG, shared by the in-memory transport and the simulator.

use crate::address::Address;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::time::Duration;

/// What happens to one message on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkDecision {
    /// Deliver after `delay` (zero for a healthy link).
    Deliver { delay: Duration },
    /// Lose the message.
    Drop,
}

/// A drop probability outside 0.0..=1.0 (or NaN).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("drop probability {probability} is not in 0.0..=1.0")]
pub struct InvalidProbability {
    pub probability: f64,
}

#[derive(Clone, Debug, Default)]
struct LinkFault {
    blocked: bool,
    drop_probability: f64,
    delay: Duration,
}

/// The fault table of a network: per directed link (from → to), whether it is cut, how likely a
/// message is lost, and how long delivery takes.
///
/// Each link draws from its own RNG, seeded from the network seed and the link's endpoints, so
/// a link's drop pattern depends only on the seed and the messages sent on that link — not on
/// how traffic on other links interleaves with it.
#[derive(Debug)]
pub struct LinkFaults {
    seed: u64,
    faults: HashMap<(Address, Address), LinkFault>,
    rngs: HashMap<(Address, Address), SmallRng>,
}

impl LinkFaults {
    /// An all-healthy table whose random drops are reproducible from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            faults: HashMap::new(),
            rngs: HashMap::new(),
        }
    }

    fn link(&mut self, from: &Address, to: &Address) -> &mut LinkFault {
        self.faults.entry((from.clone(), to.clone())).or_default()
    }

    /// Cuts both directions between `a` and `b`.
    pub fn partition(&mut self, a: &Address, b: &Address) {
        self.partition_one_way(a, b);
        self.partition_one_way(b, a);
    }

    /// Cuts only `from` → `to`; the other direction keeps working.
    pub fn partition_one_way(&mut self, from: &Address, to: &Address) {
        self.link(from, to).blocked = true;
    }

    /// Restores both directions between `a` and `b` to healthy: no cut, no drops, no delay.
    pub fn heal(&mut self, a: &Address, b: &Address) {
        self.faults.remove(&(a.clone(), b.clone()));
        self.faults.remove(&(b.clone(), a.clone()));
    }

    /// Restores every link.
    pub fn heal_all(&mut self) {
        self.faults.clear();
    }

    /// Loses each message on `from` → `to` with probability `probability`.
    pub fn set_drop_probability(
        &mut self,
        from: &Address,
        to: &Address,
        probability: f64,
    ) -> Result<(), InvalidProbability> {
        if !(0.0..=1.0).contains(&probability) {
            return Err(InvalidProbability { probability });
        }
        self.link(from, to).drop_probability = probability;
        Ok(())
    }

    /// Delays every message on `from` → `to` by `delay` (order on the link is kept).
    pub fn set_delay(&mut self, from: &Address, to: &Address, delay: Duration) {
        self.link(from, to).delay = delay;
    }

    /// Decides the fate of one message sent now on `from` → `to`.
    pub fn decide(&mut self, from: &Address, to: &Address) -> LinkDecision {
        let key = (from.clone(), to.clone());
        let Some(fault) = self.faults.get(&key) else {
            return LinkDecision::Deliver {
                delay: Duration::ZERO,
            };
        };
        if fault.blocked {
            return LinkDecision::Drop;
        }
        if fault.drop_probability > 0.0 {
            let seed = link_seed(self.seed, from, to);
            let rng = self
                .rngs
                .entry(key)
                .or_insert_with(|| SmallRng::seed_from_u64(seed));
            if rng.random_bool(fault.drop_probability) {
                return LinkDecision::Drop;
            }
        }
        LinkDecision::Deliver { delay: fault.delay }
    }
}

/// A stable per-link seed (blake3, never Rust's randomized hasher).
fn link_seed(seed: u64, from: &Address, to: &Address) -> u64 {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&seed.to_le_bytes());
    for address in [from, to] {
        hasher.update(address.host.as_bytes());
        hasher.update(&[0]);
        hasher.update(&address.port.to_le_bytes());
    }
    let mut first = [0u8; 8];
    first.copy_from_slice(&hasher.finalize().as_bytes()[..8]);
    u64::from_le_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> Address {
        Address::new("n", port)
    }

    fn drops(faults: &mut LinkFaults, from: &Address, to: &Address, n: usize) -> Vec<bool> {
        (0..n)
            .map(|_| faults.decide(from, to) == LinkDecision::Drop)
            .collect()
    }

    #[test]
    fn one_way_partition_cuts_only_one_direction_and_heal_restores() {
        let mut faults = LinkFaults::new(1);
        faults.partition_one_way(&addr(1), &addr(2));
        assert_eq!(faults.decide(&addr(1), &addr(2)), LinkDecision::Drop);
        assert_eq!(
            faults.decide(&addr(2), &addr(1)),
            LinkDecision::Deliver {
                delay: Duration::ZERO
            }
        );
        faults.heal(&addr(2), &addr(1));
        assert_eq!(
            faults.decide(&addr(1), &addr(2)),
            LinkDecision::Deliver {
                delay: Duration::ZERO
            }
        );
    }

    #[test]
    fn random_drops_are_reproducible_per_link_regardless_of_other_traffic() {
        let mut a = LinkFaults::new(7);
        let mut b = LinkFaults::new(7);
        for faults in [&mut a, &mut b] {
            faults
                .set_drop_probability(&addr(1), &addr(2), 0.5)
                .unwrap();
            faults
                .set_drop_probability(&addr(3), &addr(2), 0.5)
                .unwrap();
        }
        drops(&mut b, &addr(3), &addr(2), 17);
        let pattern = drops(&mut a, &addr(1), &addr(2), 100);
        assert_eq!(pattern, drops(&mut b, &addr(1), &addr(2), 100));
        let dropped = pattern.iter().filter(|d| **d).count();
        assert!((1..100).contains(&dropped), "{dropped}");
    }

    #[test]
    fn rejects_probability_outside_unit_interval() {
        let mut faults = LinkFaults::new(0);
        for p in [-0.1, 1.5, f64::NAN] {
            assert!(faults.set_drop_probability(&addr(1), &addr(2), p).is_err());
        }
    }
}
