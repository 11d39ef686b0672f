//! [`SingletonManager`]: where one cluster singleton may run, as a plain state machine.
//!
//! One manager per node and singleton name. It reads no clock and touches no socket: the
//! driver feeds it membership views, hand-over messages from the managers on other nodes,
//! the termination of its instance and ticks, each with `now`, and carries out the
//! [`SingletonEffect`]s it returns.
//!
//! # Rules
//!
//! - The singleton belongs on the **oldest** member (lowest `up_number`, ties by address, as
//!   [`Member::is_older_than`]) whose status is Up or Leaving and that has the role, if one is
//!   configured. A manager runs its instance only while its own node is that member.
//! - Before it starts, the oldest **clears every predecessor**: each member it has ever seen
//!   that is older than itself (and has the role). A predecessor is cleared when it answered
//!   [`HandOverKind::HandOverDone`] — it has no instance and has promised never to start one
//!   again — or when it is gone from membership and cannot still run one:
//!   - seen Down, then removed: `removal_margin` after the removal was seen (a crashed node,
//!     downed; never while it is merely unreachable). Seen Up and unreachable, then removed,
//!     counts as seen Down: an unreachable Up member cannot leave without being downed;
//!   - replaced: once removed, at once when a later incarnation at its address is a member (a
//!     restarted node: the old process no longer holds the address);
//!   - never seen Down (it left, or the view skipped its Down): additionally
//!     `hand_over_retry_interval × min_hand_over_retries` after the removal and after its last
//!     `HandOverInProgress`, because tessera's membership removes an Exiting member once it has
//!     seen itself Exiting, which can be before its instance has stopped.
//!
//!   Until then it sends `HandOverToMe` to every uncleared predecessor every
//!   `hand_over_retry_interval`. Tracking every older member, rather than "the previous
//!   oldest", keeps this right when the driver's view skips intermediate states (a `watch`
//!   keeps only the latest), which is how a singleton hand-over can order itself wrongly
//!   (Akka.NET #6973, two coordinators).
//! - A node asked `HandOverToMe` **retires**: it stops its instance if it runs one, answers
//!   `HandOverInProgress` until the instance has terminated, then `HandOverDone`, and never
//!   starts again. (Only a younger node that no longer sees us as Up or Leaving asks, so we
//!   can never be the oldest again.)
//! - A running instance whose node stops being the oldest is stopped at once; its node tells
//!   the new oldest `TakeOverFromMe` so that it asks without waiting for its next retry.
//! - Messages name the incarnations of sender and receiver; one for another incarnation of
//!   this node is ignored (and counted).
//!
//! # Invariant
//!
//! As long as membership views are histories of one cluster (each node's view lags but never
//! invents) and a node is downed only when it has crashed or has stopped its instance within
//! `removal_margin`, no two nodes run an instance at the same time: a node starts only after
//! every older member either promised not to run or is gone. The simulation in
//! `cluster/tests/singleton_simulation.rs` checks this over many schedules.

use super::message::{HandOver, HandOverKind};
use super::settings::{SingletonSettings, SingletonSettingsError, validate_name};
use crate::address::UniqueAddress;
use crate::member::{Member, MemberStatus};
use crate::node::ClusterSnapshot;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// Most nodes remembered as having asked `HandOverToMe`, to be told `HandOverDone` the moment
/// the instance has terminated; any others learn it from their next retry.
pub const REQUESTERS_MAX: usize = 64;

/// What the manager is given of membership: this node, the members and who is unreachable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipView {
    pub self_node: UniqueAddress,
    pub members: Vec<Member>,
    pub unreachable: BTreeSet<UniqueAddress>,
}

impl MembershipView {
    /// The view in a cluster node's snapshot; None before the node knows its incarnation.
    pub fn from_snapshot(snapshot: &ClusterSnapshot) -> Option<Self> {
        Some(Self {
            self_node: snapshot.self_node.clone()?,
            members: snapshot.members.clone(),
            unreachable: snapshot.unreachable.clone(),
        })
    }
}

/// What the driver must do for the manager.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SingletonEffect {
    /// Start the instance on this node. Never emitted while one is running or stopping.
    StartInstance,
    /// Stop the instance; report [`SingletonManager::on_instance_terminated`] once it has.
    StopInstance,
    /// Send this hand-over message to the manager of the same singleton on `message.to`.
    Send(HandOver),
}

/// The instance on this node, as the manager knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstancePhase {
    /// None runs here.
    Idle,
    Running,
    /// Asked to stop; still counts as running until it has terminated.
    Stopping,
}

/// Deliberate protocol violations, to show that the simulation catches them. Never set
/// outside tests.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sabotage {
    /// Start as soon as this node is the oldest, without waiting for predecessors.
    pub start_without_hand_over: bool,
    /// Count a predecessor as gone as soon as it is removed, without the wait for a member
    /// that may have left with its instance still stopping.
    pub clear_on_removal: bool,
}

/// What is known of one member older than this node.
#[derive(Clone, Debug, Default)]
struct Predecessor {
    seen_down: bool,
    /// In the last view that listed it, it was Up (or joining) and unreachable. Such a member
    /// can only leave membership by being downed: its leaving would need the convergence its
    /// unreachability prevents. So a removal right after counts as seen Down even when the
    /// view skipped the Down.
    unreachable_while_up: bool,
    /// A later incarnation at its address is a member: its process is gone (the new one holds
    /// the address), so nothing of it can still run.
    replaced: bool,
    /// When this manager first saw it Removed or absent.
    removed_at: Option<Instant>,
    last_in_progress_at: Option<Instant>,
    /// It answered `HandOverDone`.
    done: bool,
}

/// The state machine of one singleton on one node; see the module docs for its rules.
#[derive(Debug)]
pub struct SingletonManager {
    name: String,
    self_node: UniqueAddress,
    settings: SingletonSettings,
    /// Our own status in the latest view; Removed once we were seen and then left the view.
    self_status: Option<MemberStatus>,
    self_has_role: bool,
    oldest: Option<UniqueAddress>,
    predecessors: BTreeMap<UniqueAddress, Predecessor>,
    instance: InstancePhase,
    /// Asked `HandOverToMe`: never start again.
    handed_over: bool,
    requesters: BTreeSet<UniqueAddress>,
    next_retry_at: Option<Instant>,
    /// After the instance terminated by itself: not before this.
    restart_at: Option<Instant>,
    stale_messages: u64,
    sabotage: Sabotage,
}

impl SingletonManager {
    /// The manager of singleton `name` on the node incarnation `self_node`.
    pub fn new(
        name: impl Into<String>,
        self_node: UniqueAddress,
        settings: SingletonSettings,
    ) -> Result<Self, SingletonSettingsError> {
        let name = name.into();
        validate_name(&name)?;
        settings.validate()?;
        Ok(Self {
            name,
            self_node,
            settings,
            self_status: None,
            self_has_role: false,
            oldest: None,
            predecessors: BTreeMap::new(),
            instance: InstancePhase::Idle,
            handed_over: false,
            requesters: BTreeSet::new(),
            next_retry_at: None,
            restart_at: None,
            stale_messages: 0,
            sabotage: Sabotage::default(),
        })
    }

    #[doc(hidden)]
    pub fn set_sabotage(&mut self, sabotage: Sabotage) {
        self.sabotage = sabotage;
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn self_node(&self) -> &UniqueAddress {
        &self.self_node
    }

    pub fn settings(&self) -> &SingletonSettings {
        &self.settings
    }

    pub fn instance_phase(&self) -> InstancePhase {
        self.instance
    }

    /// The member the singleton belongs on, in the latest view.
    pub fn oldest(&self) -> Option<&UniqueAddress> {
        self.oldest.as_ref()
    }

    /// Whether this node has handed over or left, and so will never start an instance again.
    pub fn is_retired(&self) -> bool {
        self.handed_over
            || matches!(
                self.self_status,
                Some(MemberStatus::Exiting | MemberStatus::Down | MemberStatus::Removed)
            )
    }

    /// The older members this node still waits for before it may start.
    pub fn waiting_for(&self, now: Instant) -> Vec<UniqueAddress> {
        self.predecessors
            .iter()
            .filter(|(_, p)| !self.is_cleared(p, now))
            .map(|(node, _)| node.clone())
            .collect()
    }

    /// Hand-over messages ignored because they were meant for another incarnation.
    pub fn stale_messages(&self) -> u64 {
        self.stale_messages
    }

    /// A new membership view. A view of another incarnation is ignored.
    pub fn on_membership(&mut self, now: Instant, view: &MembershipView) -> Vec<SingletonEffect> {
        let mut effects = Vec::new();
        if view.self_node != self.self_node {
            return effects;
        }
        let me = view
            .members
            .iter()
            .find(|m| m.unique_address == self.self_node);
        self.self_status = match me {
            Some(m) => Some(m.status),
            None if self.self_status.is_some() => Some(MemberStatus::Removed),
            None => None,
        };
        if let Some(m) = me {
            self.self_has_role = self.has_role(m);
        }
        self.oldest = oldest_eligible(&view.members, self.settings.role.as_deref())
            .map(|m| m.unique_address.clone());

        for member in &view.members {
            if member.unique_address == self.self_node
                || member.up_number == i32::MAX
                || !self.has_role(member)
                || me.is_some_and(|me| !member.is_older_than(me))
            {
                continue;
            }
            let predecessor = self
                .predecessors
                .entry(member.unique_address.clone())
                .or_default();
            predecessor.unreachable_while_up = view.unreachable.contains(&member.unique_address)
                && matches!(
                    member.status,
                    MemberStatus::Up | MemberStatus::WeaklyUp | MemberStatus::Joining
                );
            match member.status {
                MemberStatus::Down => predecessor.seen_down = true,
                MemberStatus::Removed => {
                    predecessor.removed_at.get_or_insert(now);
                }
                _ => {}
            }
        }
        let present: BTreeSet<&UniqueAddress> = view
            .members
            .iter()
            .filter(|m| m.status != MemberStatus::Removed)
            .map(|m| &m.unique_address)
            .collect();
        for (node, predecessor) in &mut self.predecessors {
            if !present.contains(node) {
                predecessor.removed_at.get_or_insert(now);
            }
            if view.members.iter().any(|m| {
                m.unique_address.address == node.address && m.unique_address.uid != node.uid
            }) {
                predecessor.replaced = true;
            }
        }
        // A predecessor that is gone and cleared can never block us again.
        let settings = &self.settings;
        self.predecessors
            .retain(|_, p| p.removed_at.is_none() || !cleared(settings, p, now));
        self.step(now, &mut effects);
        effects
    }

    /// A hand-over message from the manager on `message.from` (authenticated by the driver).
    pub fn on_message(&mut self, now: Instant, message: HandOver) -> Vec<SingletonEffect> {
        let mut effects = Vec::new();
        if message.to != self.self_node || message.from == self.self_node {
            self.stale_messages = self.stale_messages.saturating_add(1);
            return effects;
        }
        let from = message.from;
        match message.kind {
            HandOverKind::HandOverToMe => {
                self.handed_over = true;
                match self.instance {
                    InstancePhase::Running => {
                        self.instance = InstancePhase::Stopping;
                        effects.push(SingletonEffect::StopInstance);
                        self.remember_requester(from.clone());
                        effects.push(self.send(from, HandOverKind::HandOverInProgress));
                    }
                    InstancePhase::Stopping => {
                        self.remember_requester(from.clone());
                        effects.push(self.send(from, HandOverKind::HandOverInProgress));
                    }
                    InstancePhase::Idle => {
                        effects.push(self.send(from, HandOverKind::HandOverDone));
                    }
                }
            }
            HandOverKind::HandOverInProgress => {
                if let Some(p) = self.predecessors.get_mut(&from) {
                    p.last_in_progress_at = Some(now);
                }
            }
            HandOverKind::HandOverDone => {
                if let Some(p) = self.predecessors.get_mut(&from) {
                    p.done = true;
                }
            }
            HandOverKind::TakeOverFromMe => {
                let waiting = self
                    .predecessors
                    .get(&from)
                    .is_some_and(|p| !self.is_cleared(p, now));
                if waiting && self.should_run() && self.instance == InstancePhase::Idle {
                    effects.push(self.send(from, HandOverKind::HandOverToMe));
                }
            }
        }
        self.step(now, &mut effects);
        effects
    }

    /// The instance has terminated (asked to, or by itself). Spurious reports are ignored.
    pub fn on_instance_terminated(&mut self, now: Instant) -> Vec<SingletonEffect> {
        let mut effects = Vec::new();
        if self.instance == InstancePhase::Idle {
            return effects;
        }
        self.instance = InstancePhase::Idle;
        if self.should_run() {
            // It stopped by itself while it belongs here: start it again, at most once per
            // retry interval so that a crashing instance does not spin.
            self.restart_at = Some(now + self.settings.hand_over_retry_interval);
        } else if self.is_retired() {
            let mut told = BTreeSet::new();
            for requester in std::mem::take(&mut self.requesters) {
                told.insert(requester.clone());
                effects.push(self.send(requester, HandOverKind::HandOverDone));
            }
            if let Some(oldest) = self.oldest.clone()
                && oldest != self.self_node
                && !told.contains(&oldest)
            {
                effects.push(self.send(oldest, HandOverKind::HandOverDone));
            }
        }
        self.step(now, &mut effects);
        effects
    }

    /// Time passes: retries, removal margins and restarts fall due.
    pub fn tick(&mut self, now: Instant) -> Vec<SingletonEffect> {
        let mut effects = Vec::new();
        self.step(now, &mut effects);
        effects
    }

    fn should_run(&self) -> bool {
        !self.handed_over
            && self.self_has_role
            && matches!(
                self.self_status,
                Some(MemberStatus::Up | MemberStatus::Leaving)
            )
            && self.oldest.as_ref() == Some(&self.self_node)
    }

    fn step(&mut self, now: Instant, effects: &mut Vec<SingletonEffect>) {
        let should_run = self.should_run();
        match self.instance {
            InstancePhase::Running if !should_run => {
                self.instance = InstancePhase::Stopping;
                effects.push(SingletonEffect::StopInstance);
                if let Some(oldest) = self.oldest.clone()
                    && oldest != self.self_node
                {
                    effects.push(self.send(oldest, HandOverKind::TakeOverFromMe));
                }
            }
            InstancePhase::Idle if should_run => {
                if self.restart_at.is_some_and(|at| now < at) {
                    return;
                }
                self.restart_at = None;
                let waiting = if self.sabotage.start_without_hand_over {
                    Vec::new()
                } else {
                    self.waiting_for(now)
                };
                if waiting.is_empty() {
                    self.instance = InstancePhase::Running;
                    self.next_retry_at = None;
                    effects.push(SingletonEffect::StartInstance);
                } else if self.next_retry_at.is_none_or(|at| now >= at) {
                    for predecessor in waiting {
                        effects.push(self.send(predecessor, HandOverKind::HandOverToMe));
                    }
                    self.next_retry_at = Some(now + self.settings.hand_over_retry_interval);
                }
            }
            InstancePhase::Idle => self.next_retry_at = None,
            _ => {}
        }
    }

    fn is_cleared(&self, predecessor: &Predecessor, now: Instant) -> bool {
        if self.sabotage.clear_on_removal && predecessor.removed_at.is_some() {
            return true;
        }
        cleared(&self.settings, predecessor, now)
    }

    fn has_role(&self, member: &Member) -> bool {
        self.settings
            .role
            .as_deref()
            .is_none_or(|role| member.has_role(role))
    }

    fn remember_requester(&mut self, node: UniqueAddress) {
        if self.requesters.len() < REQUESTERS_MAX {
            self.requesters.insert(node);
        }
    }

    fn send(&self, to: UniqueAddress, kind: HandOverKind) -> SingletonEffect {
        SingletonEffect::Send(HandOver {
            from: self.self_node.clone(),
            to,
            kind,
        })
    }
}

/// The member a singleton belongs on: the oldest Up or Leaving one with `role` (any member
/// when None). Managers and proxies must agree on it.
pub fn oldest_eligible<'a>(members: &'a [Member], role: Option<&str>) -> Option<&'a Member> {
    members
        .iter()
        .filter(|m| matches!(m.status, MemberStatus::Up | MemberStatus::Leaving))
        .filter(|m| role.is_none_or(|r| m.has_role(r)))
        .min_by(|a, b| (a.up_number, &a.unique_address).cmp(&(b.up_number, &b.unique_address)))
}

/// Whether `predecessor` can no longer run an instance (see the module docs).
fn cleared(settings: &SingletonSettings, predecessor: &Predecessor, now: Instant) -> bool {
    if predecessor.done {
        return true;
    }
    if predecessor.replaced && predecessor.removed_at.is_some() {
        return true;
    }
    let Some(removed_at) = predecessor.removed_at else {
        return false;
    };
    let silence = settings.hand_over_silence();
    let mut wait = settings.removal_margin;
    if !(predecessor.seen_down || predecessor.unreachable_while_up) {
        wait = wait.saturating_add(silence);
    }
    let quiet = predecessor
        .last_in_progress_at
        .is_none_or(|at| now >= at + silence);
    now >= removed_at + wait && quiet
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::Address;
    use std::time::Duration;

    fn node(i: u16) -> UniqueAddress {
        UniqueAddress::new(Address::new("10.0.0.1", 2550 + i), 100 + u64::from(i))
    }

    fn member(i: u16, status: MemberStatus, up_number: i32) -> Member {
        Member {
            unique_address: node(i),
            status,
            roles: BTreeSet::new(),
            up_number,
            app_version: "1".into(),
        }
    }

    fn view(self_i: u16, members: Vec<Member>) -> MembershipView {
        MembershipView {
            self_node: node(self_i),
            members,
            unreachable: BTreeSet::new(),
        }
    }

    fn manager(i: u16) -> SingletonManager {
        SingletonManager::new("s", node(i), SingletonSettings::default()).expect("valid")
    }

    fn sends(effects: &[SingletonEffect]) -> Vec<(UniqueAddress, HandOverKind)> {
        effects
            .iter()
            .filter_map(|e| match e {
                SingletonEffect::Send(m) => Some((m.to.clone(), m.kind)),
                _ => None,
            })
            .collect()
    }

    fn message(from: u16, to: u16, kind: HandOverKind) -> HandOver {
        HandOver {
            from: node(from),
            to: node(to),
            kind,
        }
    }

    #[test]
    fn the_first_oldest_starts_at_once_and_younger_nodes_never() {
        let now = Instant::now();
        let members = vec![
            member(0, MemberStatus::Up, 1),
            member(1, MemberStatus::Up, 2),
            member(2, MemberStatus::Joining, i32::MAX),
        ];
        let mut oldest = manager(0);
        assert_eq!(
            oldest.on_membership(now, &view(0, members.clone())),
            vec![SingletonEffect::StartInstance]
        );
        for i in [1, 2] {
            let mut younger = manager(i);
            assert!(
                younger
                    .on_membership(now, &view(i, members.clone()))
                    .is_empty()
            );
            assert_eq!(younger.oldest(), Some(&node(0)));
        }
    }

    #[test]
    fn a_leaving_oldest_hands_over_only_after_its_instance_terminated() {
        let t0 = Instant::now();
        let mut old = manager(0);
        let mut new = manager(1);
        let up = vec![
            member(0, MemberStatus::Up, 1),
            member(1, MemberStatus::Up, 2),
        ];
        old.on_membership(t0, &view(0, up.clone()));
        new.on_membership(t0, &view(1, up));
        let exiting = vec![
            member(0, MemberStatus::Exiting, 1),
            member(1, MemberStatus::Up, 2),
        ];
        // The new oldest sees the old one Exiting first: it asks, and does not start.
        let effects = new.on_membership(t0, &view(1, exiting.clone()));
        assert_eq!(sends(&effects), vec![(node(0), HandOverKind::HandOverToMe)]);
        assert!(!effects.contains(&SingletonEffect::StartInstance));
        // The old one stops and says so; its node being removed meanwhile changes nothing.
        let effects = old.on_message(t0, message(1, 0, HandOverKind::HandOverToMe));
        assert!(effects.contains(&SingletonEffect::StopInstance));
        assert_eq!(
            sends(&effects),
            vec![(node(1), HandOverKind::HandOverInProgress)]
        );
        let t1 = t0 + Duration::from_millis(10);
        new.on_message(t1, message(0, 1, HandOverKind::HandOverInProgress));
        let removed = vec![member(1, MemberStatus::Up, 2)];
        assert!(
            !new.on_membership(t1, &view(1, removed))
                .contains(&SingletonEffect::StartInstance)
        );
        // Retries continue while the instance is stopping.
        let t2 = t0 + Duration::from_secs(1);
        assert_eq!(
            sends(&new.tick(t2)),
            vec![(node(0), HandOverKind::HandOverToMe)]
        );
        let effects = old.on_instance_terminated(t2);
        assert_eq!(sends(&effects), vec![(node(1), HandOverKind::HandOverDone)]);
        assert_eq!(
            new.on_message(t2, message(0, 1, HandOverKind::HandOverDone)),
            vec![SingletonEffect::StartInstance]
        );
        // The old node never starts again, even if its own view still says it is the oldest.
        assert!(old.is_retired());
        let stale = vec![
            member(0, MemberStatus::Leaving, 1),
            member(1, MemberStatus::Up, 2),
        ];
        assert!(old.on_membership(t2, &view(0, stale)).is_empty());
    }

    #[test]
    fn a_crashed_oldest_is_replaced_only_after_removal_and_margin() {
        let settings = SingletonSettings {
            removal_margin: Duration::from_secs(3),
            ..SingletonSettings::default()
        };
        let t0 = Instant::now();
        let mut new = SingletonManager::new("s", node(1), settings).expect("valid");
        new.on_membership(
            t0,
            &view(
                1,
                vec![
                    member(0, MemberStatus::Up, 1),
                    member(1, MemberStatus::Up, 2),
                ],
            ),
        );
        let mut unreachable = view(
            1,
            vec![
                member(0, MemberStatus::Up, 1),
                member(1, MemberStatus::Up, 2),
            ],
        );
        unreachable.unreachable.insert(node(0));
        assert!(
            new.on_membership(t0, &unreachable).is_empty(),
            "unreachable is not gone"
        );
        let down = view(
            1,
            vec![
                member(0, MemberStatus::Down, 1),
                member(1, MemberStatus::Up, 2),
            ],
        );
        let effects = new.on_membership(t0, &down);
        assert!(!effects.contains(&SingletonEffect::StartInstance));
        let t1 = t0 + Duration::from_secs(30);
        assert!(
            !new.tick(t1).contains(&SingletonEffect::StartInstance),
            "down is not removed"
        );
        new.on_membership(t1, &view(1, vec![member(1, MemberStatus::Up, 2)]));
        assert!(
            !new.tick(t1 + Duration::from_millis(2900))
                .contains(&SingletonEffect::StartInstance)
        );
        assert_eq!(
            new.tick(t1 + Duration::from_secs(3)),
            vec![SingletonEffect::StartInstance]
        );
    }

    #[test]
    fn a_restarted_oldest_is_replaced_at_once_without_the_margin() {
        let settings = SingletonSettings {
            removal_margin: Duration::from_secs(120),
            ..SingletonSettings::default()
        };
        let t0 = Instant::now();
        let mut new = SingletonManager::new("s", node(1), settings).expect("valid");
        new.on_membership(
            t0,
            &view(
                1,
                vec![
                    member(0, MemberStatus::Up, 1),
                    member(1, MemberStatus::Up, 2),
                ],
            ),
        );
        // Node 0 restarts: its new incarnation joins at the same address, the old one is
        // removed. The old process no longer holds the address: no margin to wait.
        let restarted = Member::joining(
            UniqueAddress::new(node(0).address.clone(), 999),
            BTreeSet::new(),
            "1".to_string(),
        );
        let effects = new.on_membership(
            t0,
            &view(1, vec![member(1, MemberStatus::Up, 2), restarted]),
        );
        assert_eq!(effects, vec![SingletonEffect::StartInstance]);
    }

    #[test]
    fn a_predecessor_never_seen_down_is_waited_for_after_its_removal() {
        let settings = SingletonSettings::default();
        let silence = settings.hand_over_silence();
        let t0 = Instant::now();
        let mut new = manager(1);
        new.on_membership(
            t0,
            &view(
                1,
                vec![
                    member(0, MemberStatus::Up, 1),
                    member(1, MemberStatus::Up, 2),
                ],
            ),
        );
        // The view skips from Up to gone: it may have left and still be stopping.
        new.on_membership(t0, &view(1, vec![member(1, MemberStatus::Up, 2)]));
        assert!(
            !new.tick(t0 + silence / 2)
                .contains(&SingletonEffect::StartInstance)
        );
        new.on_message(
            t0 + silence / 2,
            message(0, 1, HandOverKind::HandOverInProgress),
        );
        assert!(
            !new.tick(t0 + silence)
                .contains(&SingletonEffect::StartInstance)
        );
        assert!(
            new.tick(t0 + silence + silence / 2)
                .contains(&SingletonEffect::StartInstance)
        );
    }

    #[test]
    fn messages_for_another_incarnation_are_ignored() {
        let t0 = Instant::now();
        let mut old = manager(0);
        old.on_membership(t0, &view(0, vec![member(0, MemberStatus::Up, 1)]));
        assert_eq!(old.instance_phase(), InstancePhase::Running);
        let mut stale = message(1, 0, HandOverKind::HandOverToMe);
        stale.to.uid += 1;
        assert!(old.on_message(t0, stale).is_empty());
        assert_eq!(old.stale_messages(), 1);
        assert_eq!(old.instance_phase(), InstancePhase::Running);
        assert!(!old.is_retired());
    }

    #[test]
    fn nodes_not_up_or_without_the_role_never_start() {
        let t0 = Instant::now();
        for status in [
            MemberStatus::Joining,
            MemberStatus::WeaklyUp,
            MemberStatus::Exiting,
            MemberStatus::Down,
        ] {
            let mut m = manager(0);
            assert!(
                m.on_membership(t0, &view(0, vec![member(0, status, 1)]))
                    .is_empty()
            );
        }
        let settings = SingletonSettings {
            role: Some("coordinator".into()),
            ..SingletonSettings::default()
        };
        let mut without = SingletonManager::new("s", node(0), settings.clone()).expect("valid");
        let mut with = SingletonManager::new("s", node(1), settings).expect("valid");
        let mut younger = member(1, MemberStatus::Up, 2);
        younger.roles.insert("coordinator".into());
        let members = vec![member(0, MemberStatus::Up, 1), younger];
        assert!(
            without
                .on_membership(t0, &view(0, members.clone()))
                .is_empty()
        );
        assert_eq!(
            with.on_membership(t0, &view(1, members)),
            vec![SingletonEffect::StartInstance]
        );
    }

    #[test]
    fn an_instance_that_stops_by_itself_is_restarted_after_the_retry_interval() {
        let t0 = Instant::now();
        let mut m = manager(0);
        m.on_membership(t0, &view(0, vec![member(0, MemberStatus::Up, 1)]));
        assert!(m.on_instance_terminated(t0).is_empty());
        assert!(m.tick(t0 + Duration::from_millis(500)).is_empty());
        assert_eq!(
            m.tick(t0 + Duration::from_secs(1)),
            vec![SingletonEffect::StartInstance]
        );
    }
}
