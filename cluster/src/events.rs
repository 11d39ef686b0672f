//! Cluster membership events, derived by comparing two gossip states.

use crate::address::UniqueAddress;
use crate::gossip::Gossip;
use crate::member::{Member, MemberStatus};
use serde::Serialize;
use std::collections::BTreeSet;

/// A change in the cluster as seen by one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum ClusterEvent {
    MemberJoined(Member),
    MemberWeaklyUp(Member),
    MemberUp(Member),
    /// The member started leaving (status Leaving).
    MemberLeft(Member),
    MemberExited(Member),
    MemberDowned(Member),
    MemberRemoved {
        member: Member,
        previous_status: MemberStatus,
    },
    UnreachableMember(Member),
    ReachableMember(Member),
    LeaderChanged(Option<UniqueAddress>),
}

/// The state a new subscriber receives before any event.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CurrentClusterState {
    pub members: Vec<Member>,
    pub unreachable: BTreeSet<UniqueAddress>,
    pub leader: Option<UniqueAddress>,
}

impl CurrentClusterState {
    pub fn from_gossip(gossip: &Gossip, leader: Option<UniqueAddress>) -> Self {
        Self {
            members: gossip.members.values().cloned().collect(),
            unreachable: gossip.reachability.all_unreachable(),
            leader,
        }
    }
}

/// The events that turn `old` into `new` from the point of view of one node.
pub fn diff(
    old: &Gossip,
    new: &Gossip,
    old_leader: &Option<UniqueAddress>,
    new_leader: &Option<UniqueAddress>,
) -> Vec<ClusterEvent> {
    let mut events = Vec::new();
    for (node, member) in &new.members {
        let previous = old.members.get(node).map(|m| m.status);
        if previous == Some(member.status) {
            continue;
        }
        let event = match member.status {
            MemberStatus::Joining => ClusterEvent::MemberJoined(member.clone()),
            MemberStatus::WeaklyUp => ClusterEvent::MemberWeaklyUp(member.clone()),
            MemberStatus::Up => ClusterEvent::MemberUp(member.clone()),
            MemberStatus::Leaving => ClusterEvent::MemberLeft(member.clone()),
            MemberStatus::Exiting => ClusterEvent::MemberExited(member.clone()),
            MemberStatus::Down => ClusterEvent::MemberDowned(member.clone()),
            MemberStatus::Removed => continue,
        };
        events.push(event);
    }
    for (node, member) in &old.members {
        if !new.members.contains_key(node) {
            let mut removed = member.clone();
            removed.status = MemberStatus::Removed;
            events.push(ClusterEvent::MemberRemoved {
                member: removed,
                previous_status: member.status,
            });
        }
    }
    let old_unreachable = old.reachability.all_unreachable();
    let new_unreachable = new.reachability.all_unreachable();
    for node in new_unreachable.difference(&old_unreachable) {
        if let Some(m) = new.members.get(node) {
            events.push(ClusterEvent::UnreachableMember(m.clone()));
        }
    }
    for node in old_unreachable.difference(&new_unreachable) {
        if let Some(m) = new.members.get(node) {
            events.push(ClusterEvent::ReachableMember(m.clone()));
        }
    }
    if old_leader != new_leader {
        events.push(ClusterEvent::LeaderChanged(new_leader.clone()));
    }
    events
}
