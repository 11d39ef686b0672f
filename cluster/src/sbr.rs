//! Split brain resolver: which side of a network partition downs which (decision logic only).
//!
//! When members are unreachable for a while, the leader on each side of a partition decides
//! from its own view which members to down, such that at most one side survives without the
//! two sides talking to each other (Akka's Split Brain Resolver). The caller owns membership:
//! it passes a plain view each tick and applies the decision (marks the members Down).

use crate::address::UniqueAddress;
use crate::member::{Member, MemberStatus};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

/// How the surviving side of a partition is chosen.
///
/// Only members that are Up or Leaving (and have `role`, when set) are counted; members that
/// are Joining or WeaklyUp go down with the side they are on, and members already Down or
/// Exiting are ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DowningStrategy {
    /// The side with more counted members survives; on a tie, the side with the lowest
    /// address among the counted members. Adapts to cluster size; the default. Indirectly
    /// connected members count on the other side, also when nothing else is unreachable.
    KeepMajority { role: Option<String> },
    /// The side with at least `quorum_size` counted members survives; a side below it downs
    /// itself; when both sides reach it (misconfiguration) everyone is downed. For a cluster
    /// of fixed size: `quorum_size` should be more than half of it. Indirectly connected
    /// members count on the other side, as for keep-majority.
    StaticQuorum {
        quorum_size: usize,
        role: Option<String>,
    },
    /// The side with the oldest counted member survives (where the cluster singleton runs).
    /// With `down_if_alone`, an oldest member cut off alone from more than one other counted
    /// member downs itself instead, and the others survive.
    KeepOldest {
        down_if_alone: bool,
        role: Option<String>,
    },
    /// Every member is downed: for when no partition is safe to survive.
    DownAll,
}

impl Default for DowningStrategy {
    fn default() -> Self {
        DowningStrategy::KeepMajority { role: None }
    }
}

impl DowningStrategy {
    /// The role filter of the counted members, if any.
    pub fn role(&self) -> Option<&str> {
        match self {
            DowningStrategy::KeepMajority { role }
            | DowningStrategy::StaticQuorum { role, .. }
            | DowningStrategy::KeepOldest { role, .. } => role.as_deref(),
            DowningStrategy::DownAll => None,
        }
    }

    /// Whether `member` is counted when sizing the sides: Up or Leaving, with the role if set.
    pub fn counts(&self, member: &Member) -> bool {
        matches!(member.status, MemberStatus::Up | MemberStatus::Leaving)
            && self.role().is_none_or(|role| member.has_role(role))
    }

    /// The decision for `view` as it is now, ignoring stability and leadership: `None` when
    /// nothing is unreachable (or this node is not a current member). When both sides of a
    /// partition agree on the members and their statuses, at most one of them survives
    /// (checked by a property test).
    pub fn decide(&self, view: &SbrView<'_>) -> Option<DowningDecision> {
        let sides = Sides::of(self, view)?;
        let reason = if !sides.unreachable.is_empty() {
            self.outcome(&sides)
        } else if self.survives_by_count() && self.outcome(&sides) != DowningReason::DownUnreachable
        {
            // Only indirectly connected members are unreachable, but they are so many that
            // our side would lose a clean partition against them: down everyone, ourselves
            // included. Views differ while gossip cannot converge, and stale rows (say, of a
            // node killed just after a partition healed) can make a lone node see every
            // other member as indirectly connected while another node, seeing it the other
            // way round, leads its own side; both keeping themselves would split the
            // cluster (found by `tessera soak`, seed 10).
            DowningReason::DownReachable
        } else {
            DowningReason::DownIndirectlyConnected
        };
        let mut down: BTreeSet<UniqueAddress> = match reason {
            DowningReason::DownUnreachable => sides.unreachable.clone(),
            DowningReason::DownReachable => sides.ours.clone(),
            DowningReason::DownAll => sides.considered.keys().map(|&n| n.clone()).collect(),
            DowningReason::DownIndirectlyConnected => BTreeSet::new(),
        };
        down.extend(sides.indirect.iter().cloned());
        Some(DowningDecision { down, reason })
    }

    /// Whether a side survives by its number of counted members (a majority or a quorum),
    /// rather than by holding a particular member.
    fn survives_by_count(&self) -> bool {
        matches!(
            self,
            DowningStrategy::KeepMajority { .. } | DowningStrategy::StaticQuorum { .. }
        )
    }

    /// Which side goes down, given that something not indirectly connected is unreachable.
    fn outcome(&self, sides: &Sides<'_>) -> DowningReason {
        let ours = sides.counted_ours.len();
        let other = sides.counted_other.len();
        let ours_or_unreachable = |ours_survives: bool| {
            if ours_survives {
                DowningReason::DownUnreachable
            } else {
                DowningReason::DownReachable
            }
        };
        match self {
            DowningStrategy::KeepMajority { .. } => {
                if ours != other {
                    return ours_or_unreachable(ours > other);
                }
                let lowest = sides.counted_ours.iter().chain(&sides.counted_other).min();
                match lowest {
                    Some(lowest) => ours_or_unreachable(sides.counted_ours.contains(lowest)),
                    // Nobody is counted anywhere: no side can prove it should survive.
                    None => DowningReason::DownAll,
                }
            }
            DowningStrategy::StaticQuorum { quorum_size, .. } => {
                if ours >= *quorum_size && other >= *quorum_size {
                    DowningReason::DownAll
                } else {
                    ours_or_unreachable(ours >= *quorum_size)
                }
            }
            DowningStrategy::KeepOldest { down_if_alone, .. } => {
                let oldest = sides
                    .counted_ours
                    .iter()
                    .chain(&sides.counted_other)
                    .filter_map(|n| sides.considered.get(n))
                    .min_by(|a, b| {
                        (a.up_number, &a.unique_address).cmp(&(b.up_number, &b.unique_address))
                    });
                let Some(oldest) = oldest else {
                    // Nobody is counted anywhere: no side can prove it holds the oldest.
                    return DowningReason::DownAll;
                };
                let oldest_is_ours = sides.counted_ours.contains(&oldest.unique_address);
                let (oldest_side, other_side) = if oldest_is_ours {
                    (ours, other)
                } else {
                    (other, ours)
                };
                let oldest_alone = *down_if_alone && oldest_side == 1 && other_side > 1;
                ours_or_unreachable(oldest_is_ours != oldest_alone)
            }
            DowningStrategy::DownAll => DowningReason::DownAll,
        }
    }
}

/// What the resolver needs to know each tick, as plain data owned by the caller.
#[derive(Clone, Copy, Debug)]
pub struct SbrView<'a> {
    /// This node.
    pub self_node: &'a UniqueAddress,
    /// Current members (not Removed).
    pub members: &'a [Member],
    /// Subjects that any observer marks unreachable, in the local view. This node is always
    /// on its own side, even if others mark it unreachable.
    pub unreachable: &'a BTreeSet<UniqueAddress>,
    /// Nodes that are both observers and subjects of unreachability records (e.g. the two
    /// ends of a one-way partition): always downed, and never counted on our side.
    pub indirectly_connected: &'a BTreeSet<UniqueAddress>,
    /// Whether this node is the leader; only the leader acts.
    pub is_leader: bool,
}

/// Why a [`DowningDecision`] downs what it downs (Akka's decision names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DowningReason {
    /// Our side survives: the unreachable members (and the indirectly connected) are downed.
    DownUnreachable,
    /// Our side lost: every reachable member, this node included (and the indirectly
    /// connected), is downed.
    DownReachable,
    /// Every member is downed.
    DownAll,
    /// Only indirectly connected members were unreachable; they alone are downed.
    DownIndirectlyConnected,
}

impl fmt::Display for DowningReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DowningReason::DownUnreachable => "down unreachable",
            DowningReason::DownReachable => "down reachable (including self)",
            DowningReason::DownAll => "down all",
            DowningReason::DownIndirectlyConnected => "down indirectly connected",
        })
    }
}

/// The members the leader should mark Down, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DowningDecision {
    /// Members to down; may include this node.
    pub down: BTreeSet<UniqueAddress>,
    /// Which side lost.
    pub reason: DowningReason,
}

/// A split brain resolver setting outside its allowed range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid split brain resolver setting {field} = {value}: {allowed}")]
pub struct SbrConfigError {
    /// Name of the offending field.
    pub field: &'static str,
    /// The value that was given, as text.
    pub value: String,
    /// What the field accepts.
    pub allowed: &'static str,
}

/// Whether a member takes part in a decision at all: Down, Exiting and Removed members are
/// already on their way out.
fn is_considered(member: &Member) -> bool {
    !matches!(
        member.status,
        MemberStatus::Down | MemberStatus::Exiting | MemberStatus::Removed
    )
}

/// The part of the view whose change restarts the stability timer.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ViewKey {
    unreachable: BTreeSet<UniqueAddress>,
    indirect: BTreeSet<UniqueAddress>,
    counted: BTreeSet<UniqueAddress>,
}

/// The view split into our side and the other side.
struct Sides<'a> {
    /// Members neither Down nor Exiting (nor Removed), by address.
    considered: BTreeMap<&'a UniqueAddress, &'a Member>,
    /// Considered members that are indirectly connected.
    indirect: BTreeSet<UniqueAddress>,
    /// Considered members unreachable and not indirectly connected (never this node).
    unreachable: BTreeSet<UniqueAddress>,
    /// Considered members on this node's side.
    ours: BTreeSet<UniqueAddress>,
    /// Counted members on our side.
    counted_ours: BTreeSet<UniqueAddress>,
    /// Counted members on the other side: unreachable or indirectly connected.
    counted_other: BTreeSet<UniqueAddress>,
}

impl<'a> Sides<'a> {
    /// `None` when this node is not a considered member.
    fn of(strategy: &DowningStrategy, view: &SbrView<'a>) -> Option<Self> {
        let considered: BTreeMap<&UniqueAddress, &Member> = view
            .members
            .iter()
            .filter(|m| is_considered(m))
            .map(|m| (&m.unique_address, m))
            .collect();
        if !considered.contains_key(view.self_node) {
            return None;
        }
        let mut sides = Sides {
            considered,
            indirect: BTreeSet::new(),
            unreachable: BTreeSet::new(),
            ours: BTreeSet::new(),
            counted_ours: BTreeSet::new(),
            counted_other: BTreeSet::new(),
        };
        for (&node, &member) in &sides.considered {
            let counted = strategy.counts(member);
            let ours = if view.indirectly_connected.contains(node) {
                sides.indirect.insert(node.clone());
                false
            } else if node != view.self_node && view.unreachable.contains(node) {
                sides.unreachable.insert(node.clone());
                false
            } else {
                sides.ours.insert(node.clone());
                true
            };
            if counted && ours {
                sides.counted_ours.insert(node.clone());
            } else if counted {
                sides.counted_other.insert(node.clone());
            }
        }
        if sides.unreachable.is_empty() && sides.indirect.is_empty() {
            return None;
        }
        Some(sides)
    }
}

impl ViewKey {
    fn of(strategy: &DowningStrategy, view: &SbrView<'_>) -> Self {
        let mut key = ViewKey {
            unreachable: BTreeSet::new(),
            indirect: BTreeSet::new(),
            counted: BTreeSet::new(),
        };
        for m in view.members {
            let node = &m.unique_address;
            if !is_considered(m) {
                continue;
            }
            if view.indirectly_connected.contains(node) {
                key.indirect.insert(node.clone());
            } else if view.unreachable.contains(node) {
                key.unreachable.insert(node.clone());
            }
            if strategy.counts(m) {
                key.counted.insert(node.clone());
            }
        }
        key
    }
}

/// The split brain resolver of one node: a [`DowningStrategy`] applied once the view has been
/// stable for `stable_after`, by the leader only, once per view.
///
/// Waiting for stability lets the failure detector and gossip settle, so that both sides of a
/// partition decide from the same picture; acting once per view keeps the leader from issuing
/// the same downing every tick while it spreads.
#[derive(Clone, Debug)]
pub struct SplitBrainResolver {
    strategy: DowningStrategy,
    stable_after: Duration,
    /// The current view and since when it has been unchanged.
    stable_since: Option<(ViewKey, Instant)>,
    /// Whether a decision was already returned for the current view.
    decided: bool,
}

impl SplitBrainResolver {
    /// A resolver with the given strategy, acting after `stable_after` without changes.
    pub fn new(strategy: DowningStrategy, stable_after: Duration) -> Result<Self, SbrConfigError> {
        Self::validate(&strategy, stable_after)?;
        Ok(Self {
            strategy,
            stable_after,
            stable_since: None,
            decided: false,
        })
    }

    /// Checks the settings; the first offending one is named in the error.
    pub fn validate(
        strategy: &DowningStrategy,
        stable_after: Duration,
    ) -> Result<(), SbrConfigError> {
        if stable_after.is_zero() {
            return Err(SbrConfigError {
                field: "stable_after",
                value: format!("{stable_after:?}"),
                allowed: "a duration > 0 (Akka's default is 20s)",
            });
        }
        if let DowningStrategy::StaticQuorum { quorum_size, .. } = strategy
            && *quorum_size == 0
        {
            return Err(SbrConfigError {
                field: "quorum_size",
                value: quorum_size.to_string(),
                allowed: "an integer >= 1, more than half of the intended cluster size",
            });
        }
        if let Some(role) = strategy.role()
            && role.trim().is_empty()
        {
            return Err(SbrConfigError {
                field: "role",
                value: format!("{role:?}"),
                allowed: "a non-empty role name, or no role to count every member",
            });
        }
        Ok(())
    }

    /// The strategy this resolver applies.
    pub fn strategy(&self) -> &DowningStrategy {
        &self.strategy
    }

    /// Feeds the view at `now`; returns a decision when this node is the leader, something
    /// is unreachable, the unreachable set and the counted members have not changed for
    /// `stable_after`, and no decision was returned for this view yet.
    pub fn tick(&mut self, now: Instant, view: SbrView<'_>) -> Option<DowningDecision> {
        let key = ViewKey::of(&self.strategy, &view);
        let since = match &self.stable_since {
            Some((current, since)) if *current == key => *since,
            _ => {
                self.stable_since = Some((key, now));
                self.decided = false;
                now
            }
        };
        if !view.is_leader
            || self.decided
            || now.saturating_duration_since(since) < self.stable_after
        {
            return None;
        }
        let decision = self.strategy.decide(&view)?;
        self.decided = true;
        Some(decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::Address;
    use proptest::prelude::*;

    const STABLE: Duration = Duration::from_secs(20);

    fn addr(i: u8) -> UniqueAddress {
        UniqueAddress::new(Address::new(format!("10.0.0.{i}"), 25520), u64::from(i) * 7)
    }

    /// Member `i` (1-based), Up, with up number `i`: lower `i` is older and has the lower
    /// address.
    fn up(i: u8) -> Member {
        Member {
            unique_address: addr(i),
            status: MemberStatus::Up,
            roles: BTreeSet::new(),
            up_number: i32::from(i),
            app_version: "1.0.0".into(),
        }
    }

    fn with_status(mut m: Member, status: MemberStatus) -> Member {
        m.status = status;
        if matches!(status, MemberStatus::Joining | MemberStatus::WeaklyUp) {
            m.up_number = i32::MAX;
        }
        m
    }

    fn with_role(mut m: Member, role: &str) -> Member {
        m.roles.insert(role.to_string());
        m
    }

    fn set(ids: &[u8]) -> BTreeSet<UniqueAddress> {
        ids.iter().map(|&i| addr(i)).collect()
    }

    /// Decision of `strategy` on node `me` seeing `unreachable` (and `indirect`), after the
    /// view has been stable long enough and `me` is leader.
    fn decide(
        strategy: DowningStrategy,
        members: &[Member],
        me: u8,
        unreachable: &[u8],
        indirect: &[u8],
    ) -> Option<DowningDecision> {
        let mut sbr = SplitBrainResolver::new(strategy, STABLE).unwrap();
        let me = addr(me);
        let unreachable = set(unreachable);
        let indirect = set(indirect);
        let view = SbrView {
            self_node: &me,
            members,
            unreachable: &unreachable,
            indirectly_connected: &indirect,
            is_leader: true,
        };
        let t0 = Instant::now();
        assert_eq!(sbr.tick(t0, view), None);
        sbr.tick(t0 + STABLE, view)
    }

    fn five() -> Vec<Member> {
        (1..=5).map(up).collect()
    }

    fn downs(decision: Option<DowningDecision>) -> BTreeSet<UniqueAddress> {
        decision.expect("a decision").down
    }

    #[test]
    fn keep_majority_three_side_downs_the_two_side() {
        let d = decide(DowningStrategy::default(), &five(), 1, &[4, 5], &[]).unwrap();
        assert_eq!(d.down, set(&[4, 5]));
        assert_eq!(d.reason, DowningReason::DownUnreachable);
    }

    #[test]
    fn keep_majority_two_side_downs_itself() {
        let d = decide(DowningStrategy::default(), &five(), 4, &[1, 2, 3], &[]).unwrap();
        assert_eq!(d.down, set(&[4, 5]));
        assert_eq!(d.reason, DowningReason::DownReachable);
    }

    #[test]
    fn keep_majority_tie_keeps_side_with_lowest_address() {
        let four: Vec<Member> = (1..=4).map(up).collect();
        let strategy = DowningStrategy::default();
        assert_eq!(
            downs(decide(strategy.clone(), &four, 1, &[3, 4], &[])),
            set(&[3, 4])
        );
        assert_eq!(
            downs(decide(strategy, &four, 3, &[1, 2], &[])),
            set(&[3, 4])
        );
    }

    #[test]
    fn keep_majority_counts_only_members_with_the_role() {
        // Side {1,2,3} has one "db" member, side {4,5} has two: the smaller side survives.
        let members = vec![
            with_role(up(1), "db"),
            up(2),
            up(3),
            with_role(up(4), "db"),
            with_role(up(5), "db"),
        ];
        let strategy = DowningStrategy::KeepMajority {
            role: Some("db".into()),
        };
        assert_eq!(
            downs(decide(strategy.clone(), &members, 1, &[4, 5], &[])),
            set(&[1, 2, 3])
        );
        assert_eq!(
            downs(decide(strategy, &members, 4, &[1, 2, 3], &[])),
            set(&[1, 2, 3])
        );
    }

    #[test]
    fn joining_members_are_not_counted_and_go_down_with_their_side() {
        // Side {1,2,6,7}: two Up, a Joining and a WeaklyUp; side {3,4,5}: three Up.
        let mut members = five();
        members.push(with_status(up(6), MemberStatus::Joining));
        members.push(with_status(up(7), MemberStatus::WeaklyUp));
        let strategy = DowningStrategy::default();
        let expected = set(&[1, 2, 6, 7]);
        assert_eq!(
            downs(decide(strategy.clone(), &members, 1, &[3, 4, 5], &[])),
            expected
        );
        assert_eq!(
            downs(decide(strategy, &members, 3, &[1, 2, 6, 7], &[])),
            expected
        );
    }

    #[test]
    fn down_and_exiting_members_are_ignored() {
        let mut members = five();
        members[3].status = MemberStatus::Down;
        members[4].status = MemberStatus::Exiting;
        assert_eq!(
            decide(DowningStrategy::default(), &members, 1, &[4, 5], &[]),
            None
        );
        // Only members 3 counts against {1,2} now: 2 vs 1.
        assert_eq!(
            downs(decide(
                DowningStrategy::default(),
                &members,
                1,
                &[3, 4, 5],
                &[]
            )),
            set(&[3])
        );
    }

    #[test]
    fn self_marked_unreachable_by_others_stays_on_own_side() {
        let d = decide(DowningStrategy::default(), &five(), 1, &[1, 4, 5], &[]).unwrap();
        assert_eq!(d.down, set(&[4, 5]));
    }

    #[test]
    fn static_quorum_side_with_quorum_downs_unreachable() {
        let strategy = DowningStrategy::StaticQuorum {
            quorum_size: 3,
            role: None,
        };
        let d = decide(strategy, &five(), 1, &[4, 5], &[]).unwrap();
        assert_eq!(d.down, set(&[4, 5]));
        assert_eq!(d.reason, DowningReason::DownUnreachable);
    }

    #[test]
    fn static_quorum_side_without_quorum_downs_itself() {
        let strategy = DowningStrategy::StaticQuorum {
            quorum_size: 3,
            role: None,
        };
        let d = decide(strategy.clone(), &five(), 4, &[1, 2, 3], &[]).unwrap();
        assert_eq!(d.down, set(&[4, 5]));
        assert_eq!(d.reason, DowningReason::DownReachable);
        // Three-way split of 5 with quorum 3: nobody has quorum, every side downs itself.
        let d = decide(strategy, &five(), 1, &[3, 4, 5], &[]).unwrap();
        assert_eq!(d.down, set(&[1, 2]));
    }

    #[test]
    fn static_quorum_both_sides_with_quorum_downs_all() {
        let six: Vec<Member> = (1..=6).map(up).collect();
        let strategy = DowningStrategy::StaticQuorum {
            quorum_size: 3,
            role: None,
        };
        let d = decide(strategy, &six, 1, &[4, 5, 6], &[]).unwrap();
        assert_eq!(d.down, set(&[1, 2, 3, 4, 5, 6]));
        assert_eq!(d.reason, DowningReason::DownAll);
    }

    #[test]
    fn keep_oldest_side_with_oldest_survives_even_as_minority() {
        let strategy = DowningStrategy::KeepOldest {
            down_if_alone: false,
            role: None,
        };
        // Oldest (1) is on the two-node side.
        assert_eq!(
            downs(decide(strategy.clone(), &five(), 1, &[3, 4, 5], &[])),
            set(&[3, 4, 5])
        );
        assert_eq!(
            downs(decide(strategy, &five(), 3, &[1, 2], &[])),
            set(&[3, 4, 5])
        );
    }

    #[test]
    fn keep_oldest_uses_up_number_not_address() {
        let mut members = five();
        members[4].up_number = 0; // member 5 is the oldest
        let strategy = DowningStrategy::KeepOldest {
            down_if_alone: false,
            role: None,
        };
        assert_eq!(
            downs(decide(strategy, &members, 1, &[4, 5], &[])),
            set(&[1, 2, 3])
        );
    }

    #[test]
    fn keep_oldest_alone_survives_without_down_if_alone() {
        let strategy = DowningStrategy::KeepOldest {
            down_if_alone: false,
            role: None,
        };
        assert_eq!(
            downs(decide(strategy.clone(), &five(), 1, &[2, 3, 4, 5], &[])),
            set(&[2, 3, 4, 5])
        );
        assert_eq!(
            downs(decide(strategy, &five(), 2, &[1], &[])),
            set(&[2, 3, 4, 5])
        );
    }

    #[test]
    fn keep_oldest_alone_downs_itself_with_down_if_alone() {
        let strategy = DowningStrategy::KeepOldest {
            down_if_alone: true,
            role: None,
        };
        let d = decide(strategy.clone(), &five(), 1, &[2, 3, 4, 5], &[]).unwrap();
        assert_eq!(d.down, set(&[1]));
        assert_eq!(d.reason, DowningReason::DownReachable);
        let d = decide(strategy.clone(), &five(), 2, &[1], &[]).unwrap();
        assert_eq!(d.down, set(&[1]));
        assert_eq!(d.reason, DowningReason::DownUnreachable);
        // With only one member on the other side, the oldest is kept.
        let two: Vec<Member> = (1..=2).map(up).collect();
        assert_eq!(
            downs(decide(strategy.clone(), &two, 1, &[2], &[])),
            set(&[2])
        );
        assert_eq!(downs(decide(strategy, &two, 2, &[1], &[])), set(&[2]));
    }

    #[test]
    fn down_all_downs_every_member() {
        let d = decide(DowningStrategy::DownAll, &five(), 1, &[5], &[]).unwrap();
        assert_eq!(d.down, set(&[1, 2, 3, 4, 5]));
        assert_eq!(d.reason, DowningReason::DownAll);
    }

    #[test]
    fn only_indirectly_connected_nodes_are_downed_when_nothing_else_is_unreachable() {
        // One-way partition between 2 and 3: both are observers and subjects.
        let d = decide(DowningStrategy::default(), &five(), 1, &[2, 3], &[2, 3]).unwrap();
        assert_eq!(d.down, set(&[2, 3]));
        assert_eq!(d.reason, DowningReason::DownIndirectlyConnected);
    }

    /// Seen by `tessera soak`: a partition {1,2}|{3,4,5} heals, 2 and 5 are killed at once,
    /// and node 1, whose own rows and those about it are already cleared, still holds 2's
    /// stale rows (3, 4, 5 unreachable) and 3's, 4's and 5's (2 unreachable): all four are
    /// indirectly connected. Node 4, not yet seeing 1 reachable again, saw the mirror image.
    /// Each kept itself and downed the rest: two single-node clusters. A count-based strategy
    /// now downs its own side too when the indirectly connected would outnumber it.
    #[test]
    fn a_side_outnumbered_by_the_indirectly_connected_downs_itself_too() {
        let d = decide(
            DowningStrategy::default(),
            &five(),
            1,
            &[2, 3, 4, 5],
            &[2, 3, 4, 5],
        )
        .unwrap();
        assert_eq!(d.down, set(&[1, 2, 3, 4, 5]));
        assert_eq!(d.reason, DowningReason::DownReachable);
        let quorum = DowningStrategy::StaticQuorum {
            quorum_size: 3,
            role: None,
        };
        let d = decide(quorum.clone(), &five(), 4, &[1, 2, 3, 5], &[1, 2, 3, 5]).unwrap();
        assert_eq!(d.down, set(&[1, 2, 3, 4, 5]));
        // Outnumbering them, our side survives and downs only them.
        let d = decide(quorum, &five(), 1, &[4, 5], &[4, 5]).unwrap();
        assert_eq!(d.down, set(&[4, 5]));
        assert_eq!(d.reason, DowningReason::DownIndirectlyConnected);
        // Keep-oldest keeps Akka's rule: the side that is left survives.
        let oldest = DowningStrategy::KeepOldest {
            down_if_alone: false,
            role: None,
        };
        let d = decide(oldest, &five(), 1, &[2, 3, 4, 5], &[2, 3, 4, 5]).unwrap();
        assert_eq!(d.down, set(&[2, 3, 4, 5]));
    }

    #[test]
    fn indirectly_connected_are_downed_and_count_against_our_side() {
        let seven: Vec<Member> = (1..=7).map(up).collect();
        // {1,3,4,5} vs unreachable {6,7} plus indirectly connected {2}: 4 vs 3, we survive.
        let d = decide(DowningStrategy::default(), &seven, 1, &[2, 6, 7], &[2]).unwrap();
        assert_eq!(d.down, set(&[2, 6, 7]));
        assert_eq!(d.reason, DowningReason::DownUnreachable);
        // {1,3,4} vs {5,6,7} plus {2}: 3 vs 4, we lose and down ourselves and 2.
        let d = decide(DowningStrategy::default(), &seven, 1, &[2, 5, 6, 7], &[2]).unwrap();
        assert_eq!(d.down, set(&[1, 2, 3, 4]));
        assert_eq!(d.reason, DowningReason::DownReachable);
    }

    #[test]
    fn no_decision_when_nothing_is_unreachable() {
        assert_eq!(
            decide(DowningStrategy::default(), &five(), 1, &[], &[]),
            None
        );
        assert_eq!(decide(DowningStrategy::DownAll, &five(), 1, &[], &[]), None);
    }

    struct Driver {
        sbr: SplitBrainResolver,
        members: Vec<Member>,
        t0: Instant,
    }

    impl Driver {
        fn new() -> Self {
            Self {
                sbr: SplitBrainResolver::new(DowningStrategy::default(), STABLE).unwrap(),
                members: five(),
                t0: Instant::now(),
            }
        }

        fn tick(
            &mut self,
            secs: u64,
            unreachable: &[u8],
            is_leader: bool,
        ) -> Option<DowningDecision> {
            let me = addr(1);
            let unreachable = set(unreachable);
            let none = BTreeSet::new();
            let view = SbrView {
                self_node: &me,
                members: &self.members,
                unreachable: &unreachable,
                indirectly_connected: &none,
                is_leader,
            };
            self.sbr.tick(self.t0 + Duration::from_secs(secs), view)
        }
    }

    #[test]
    fn nothing_happens_before_stable_after() {
        let mut d = Driver::new();
        for s in 0..20 {
            assert_eq!(d.tick(s, &[5], true), None, "at {s} s");
        }
        assert_eq!(downs(d.tick(20, &[5], true)), set(&[5]));
    }

    #[test]
    fn non_leader_never_decides_but_acts_at_once_when_it_becomes_leader_on_a_stable_view() {
        let mut d = Driver::new();
        for s in 0..60 {
            assert_eq!(d.tick(s, &[5], false), None);
        }
        assert_eq!(downs(d.tick(60, &[5], true)), set(&[5]));
    }

    #[test]
    fn change_in_unreachable_set_resets_the_timer() {
        let mut d = Driver::new();
        assert_eq!(d.tick(0, &[5], true), None);
        assert_eq!(d.tick(15, &[4, 5], true), None);
        assert_eq!(d.tick(25, &[4, 5], true), None);
        assert_eq!(downs(d.tick(35, &[4, 5], true)), set(&[4, 5]));
    }

    #[test]
    fn change_in_counted_members_resets_the_timer() {
        let mut d = Driver::new();
        assert_eq!(d.tick(0, &[5], true), None);
        d.members.push(up(6));
        assert_eq!(d.tick(15, &[5], true), None);
        assert_eq!(d.tick(25, &[5], true), None);
        assert_eq!(downs(d.tick(35, &[5], true)), set(&[5]));
    }

    #[test]
    fn decision_is_not_repeated_until_the_view_changes() {
        let mut d = Driver::new();
        assert_eq!(d.tick(0, &[5], true), None);
        assert!(d.tick(20, &[5], true).is_some());
        for s in 21..100 {
            assert_eq!(d.tick(s, &[5], true), None);
        }
        // Member 5 is downed by the caller: nothing left to decide.
        d.members[4].status = MemberStatus::Down;
        for s in 100..200 {
            assert_eq!(d.tick(s, &[5], true), None);
        }
        // A new partition is a new view: decided again after it is stable.
        assert_eq!(d.tick(200, &[4, 5], true), None);
        assert_eq!(downs(d.tick(220, &[4, 5], true)), set(&[4]));
    }

    #[test]
    fn invalid_settings_are_named_in_the_error() {
        let err = SplitBrainResolver::new(DowningStrategy::default(), Duration::ZERO).unwrap_err();
        assert_eq!(err.field, "stable_after");
        let quorum_zero = DowningStrategy::StaticQuorum {
            quorum_size: 0,
            role: None,
        };
        let err = SplitBrainResolver::new(quorum_zero, STABLE).unwrap_err();
        assert_eq!(err.field, "quorum_size");
        assert!(err.to_string().contains("quorum_size = 0"), "{err}");
        let empty_role = DowningStrategy::KeepMajority {
            role: Some(String::new()),
        };
        assert_eq!(
            SplitBrainResolver::new(empty_role, STABLE)
                .unwrap_err()
                .field,
            "role"
        );
    }

    fn arb_strategy() -> impl Strategy<Value = DowningStrategy> {
        let role = proptest::option::of(Just("r".to_string()));
        prop_oneof![
            role.clone()
                .prop_map(|role| DowningStrategy::KeepMajority { role }),
            (1usize..6, role.clone()).prop_map(|(quorum_size, role)| {
                DowningStrategy::StaticQuorum { quorum_size, role }
            }),
            (any::<bool>(), role).prop_map(|(down_if_alone, role)| DowningStrategy::KeepOldest {
                down_if_alone,
                role
            }),
            Just(DowningStrategy::DownAll),
        ]
    }

    fn arb_status() -> impl Strategy<Value = MemberStatus> {
        prop_oneof![
            Just(MemberStatus::Joining),
            Just(MemberStatus::WeaklyUp),
            Just(MemberStatus::Up),
            Just(MemberStatus::Up),
            Just(MemberStatus::Leaving),
            Just(MemberStatus::Exiting),
            Just(MemberStatus::Down),
        ]
    }

    proptest! {
        /// Each side decides from its own view: at most one side keeps any of its own members
        /// up, and every possible leader of a side comes to the same decision.
        #[test]
        fn two_sides_of_a_partition_never_both_survive(
            strategy in arb_strategy(),
            spec in proptest::collection::vec(
                (arb_status(), any::<bool>(), 0i32..10, any::<bool>()),
                1..10,
            ),
        ) {
            let members: Vec<Member> = spec
                .iter()
                .enumerate()
                .map(|(i, (status, has_role, up_number, _))| {
                    let mut m = up(i as u8 + 1);
                    m.status = *status;
                    m.up_number = *up_number;
                    if *has_role {
                        m.roles.insert("r".into());
                    }
                    m
                })
                .collect();
            let side = |in_a: bool| -> BTreeSet<UniqueAddress> {
                spec.iter()
                    .enumerate()
                    .filter(|(_, s)| s.3 == in_a)
                    .map(|(i, _)| addr(i as u8 + 1))
                    .collect()
            };
            let (side_a, side_b) = (side(true), side(false));
            let none = BTreeSet::new();
            let mut surviving_sides = 0;
            for (ours, theirs) in [(&side_a, &side_b), (&side_b, &side_a)] {
                let own: Vec<&Member> = members
                    .iter()
                    .filter(|m| !matches!(m.status, MemberStatus::Down | MemberStatus::Exiting))
                    .filter(|m| ours.contains(&m.unique_address))
                    .collect();
                let decisions: BTreeSet<Option<BTreeSet<UniqueAddress>>> = own
                    .iter()
                    .map(|me| {
                        let view = SbrView {
                            self_node: &me.unique_address,
                            members: &members,
                            unreachable: theirs,
                            indirectly_connected: &none,
                            is_leader: true,
                        };
                        strategy.decide(&view).map(|d| d.down)
                    })
                    .collect();
                prop_assert!(decisions.len() <= 1, "leaders of one side disagree: {:?}", decisions);
                let down = decisions.into_iter().flatten().next().unwrap_or_default();
                if own.iter().any(|m| !down.contains(&m.unique_address)) {
                    surviving_sides += 1;
                }
            }
            prop_assert!(surviving_sides <= 1, "both sides keep members up");
        }
    }
}
