//! Members of the cluster and their lifecycle statuses.

use crate::address::{Address, UniqueAddress};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;

/// A member's place in the lifecycle (cluster specification, "Membership Lifecycle").
///
/// Joining → (WeaklyUp) → Up → Leaving → Exiting → Removed; any status → Down → Removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum MemberStatus {
    Joining,
    WeaklyUp,
    Up,
    Leaving,
    Exiting,
    Down,
    Removed,
}

impl MemberStatus {
    /// Precedence when two gossip versions disagree about a member: the status later in the
    /// lifecycle wins, so that a merge never moves a member backwards.
    pub fn precedence(self) -> u8 {
        match self {
            MemberStatus::Joining => 0,
            MemberStatus::WeaklyUp => 1,
            MemberStatus::Up => 2,
            MemberStatus::Leaving => 3,
            MemberStatus::Exiting => 4,
            MemberStatus::Down => 5,
            MemberStatus::Removed => 6,
        }
    }

    /// The lower-case name used in the HTTP API and metrics (`weakly_up`).
    pub fn as_str(self) -> &'static str {
        match self {
            MemberStatus::Joining => "joining",
            MemberStatus::WeaklyUp => "weakly_up",
            MemberStatus::Up => "up",
            MemberStatus::Leaving => "leaving",
            MemberStatus::Exiting => "exiting",
            MemberStatus::Down => "down",
            MemberStatus::Removed => "removed",
        }
    }

    pub const ALL: [MemberStatus; 7] = [
        MemberStatus::Joining,
        MemberStatus::WeaklyUp,
        MemberStatus::Up,
        MemberStatus::Leaving,
        MemberStatus::Exiting,
        MemberStatus::Down,
        MemberStatus::Removed,
    ];
}

impl fmt::Display for MemberStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A node as the cluster sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Member {
    pub unique_address: UniqueAddress,
    pub status: MemberStatus,
    pub roles: BTreeSet<String>,
    /// Order in which members became Up (the age): lower is older. `i32::MAX` until Up.
    pub up_number: i32,
    pub app_version: String,
}

impl Member {
    /// A member that has just asked to join.
    pub fn joining(
        unique_address: UniqueAddress,
        roles: BTreeSet<String>,
        app_version: String,
    ) -> Self {
        Self {
            unique_address,
            status: MemberStatus::Joining,
            roles,
            up_number: i32::MAX,
            app_version,
        }
    }

    pub fn address(&self) -> &Address {
        &self.unique_address.address
    }

    pub fn has_role(&self, role: &str) -> bool {
        self.roles.contains(role)
    }

    /// True when `self` became Up before `other` (ties broken by address, as Akka does).
    pub fn is_older_than(&self, other: &Member) -> bool {
        (self.up_number, &self.unique_address) < (other.up_number, &other.unique_address)
    }

    /// Merges two views of the same incarnation: the later lifecycle status wins, and the
    /// up number is kept from whichever view has it.
    pub fn merged_with(&self, other: &Member) -> Member {
        let mut winner = if other.status.precedence() > self.status.precedence() {
            other.clone()
        } else {
            self.clone()
        };
        winner.up_number = self.up_number.min(other.up_number);
        winner
    }
}
