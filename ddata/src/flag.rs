//! Flags: booleans that can only be switched on.

use crate::crdt::{DeltaReplicatedData, ReplicatedData};
use serde::{Deserialize, Serialize};

/// A boolean that starts off and can only be switched on; merge is "or". Records no node, so it
/// needs no pruning.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Flag {
    enabled: bool,
    /// Whether `switch_on` turned the flag on since the last `reset_delta`.
    #[serde(skip)]
    changed: bool,
}

impl PartialEq for Flag {
    fn eq(&self, other: &Self) -> bool {
        self.enabled == other.enabled
    }
}

impl Eq for Flag {}

impl Flag {
    /// A flag that is off.
    pub fn new() -> Self {
        Self::default()
    }

    /// Turns the flag on, for good.
    pub fn switch_on(&mut self) {
        if !self.enabled {
            self.enabled = true;
            self.changed = true;
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }
}

impl ReplicatedData for Flag {
    fn merge(&self, other: &Self) -> Self {
        Self {
            enabled: self.enabled || other.enabled,
            changed: self.changed,
        }
    }
}

impl DeltaReplicatedData for Flag {
    /// A flag that is on, once this one was switched on.
    type Delta = Flag;

    fn delta(&self) -> Option<Flag> {
        self.changed.then_some(Flag {
            enabled: true,
            changed: false,
        })
    }

    fn reset_delta(&mut self) {
        self.changed = false;
    }

    fn merge_delta(&mut self, delta: &Flag) {
        self.enabled |= delta.enabled;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switched_on_wins_every_merge() {
        let off = Flag::new();
        let mut on = Flag::new();
        on.switch_on();
        assert!(!off.is_enabled());
        assert!(off.merge(&on).is_enabled());
        assert!(on.merge(&off).is_enabled());
        assert!(!off.merge(&off).is_enabled());
    }

    #[test]
    fn delta_only_after_switching_from_off() {
        let mut flag = Flag::new();
        assert_eq!(flag.delta(), None);
        flag.switch_on();
        let delta = flag.delta().unwrap();
        flag.reset_delta();
        flag.switch_on();
        assert_eq!(flag.delta(), None);
        let mut other = Flag::new();
        other.merge_delta(&delta);
        assert!(other.is_enabled());
    }
}
