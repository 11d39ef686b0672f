//! Cluster Bootstrap's decision (docs/src/design.md §3 "Bootstrap"): forming or joining a
//! cluster from service discovery alone, without hand-picked seed nodes.
//!
//! A starting node discovers *contact points* (the HTTP addresses of its would-be peers, from a
//! static list or DNS) and probes each one's `GET /bootstrap/seed-nodes`. [`BootstrapState`]
//! keeps what it learned; [`BootstrapState::decide`] turns it into a [`Decision`]:
//!
//! 1. A contact point that answered with seed nodes belongs to a running cluster: join it
//!    (epidemic joining: once in, this node answers with seed nodes itself).
//! 2. Otherwise a new cluster is formed only when discovery has been stable for
//!    `stable_margin`, at least `required_contact_points` distinct nodes are known, every
//!    discovered contact point answered since discovery last changed (recently enough to count),
//!    this node's own contact point is among them, and `form_new_cluster` is set. Then the node
//!    with the lowest cluster address joins itself; every other node waits for it to answer
//!    with seed nodes.
//!
//! Safety rests on every node deciding on the same set: with consistent discovery, only one
//! node is lowest, so only one cluster forms. Inconsistent discovery delays forming (the stable
//! margin restarts on every change) but cannot be ruled out by the protocol; setting
//! `required_contact_points` to the initial cluster size is what makes the first formation
//! safe even then (Akka's advice, kept here).
//!
//! Time is passed in as a [`Duration`] since any fixed origin; nothing here reads a clock.

use crate::Address;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The HTTP address (`host:port`) of a node's management API, where it answers probes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContactPoint(pub Address);

impl ContactPoint {
    pub fn new(host: impl Into<smol_str::SmolStr>, port: u16) -> Self {
        ContactPoint(Address::new(host, port))
    }
}

impl fmt::Display for ContactPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for ContactPoint {
    type Err = crate::AddressParseError;

    /// `host:port` with the rules of a cluster [`Address`] (IPv6 hosts in brackets, kept as
    /// written), and a port that is not 0.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let address = Address::from_str(input)?;
        if address.port == 0 {
            return Err(crate::AddressParseError {
                input: input.to_string(),
                reason: "port 0 is no HTTP port",
            });
        }
        Ok(ContactPoint(address))
    }
}

/// The settings the decision depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootstrapSettings {
    /// Distinct nodes that must be known (and have answered) before a new cluster is formed.
    pub required_contact_points: usize,
    /// How long discovery must be unchanged before a new cluster is formed.
    pub stable_margin: Duration,
    /// Whether this node may form a new cluster at all (false: only join existing ones).
    pub form_new_cluster: bool,
    /// How old (since its probe was sent) an answer may be and still count: about one probe
    /// round. An older "no seed nodes" may predate that node joining a cluster, and forming
    /// on it would start a second one.
    pub answer_max_age: Duration,
}

impl Default for BootstrapSettings {
    /// Akka Management's defaults: two contact points, five seconds, forming allowed.
    fn default() -> Self {
        BootstrapSettings {
            required_contact_points: 2,
            stable_margin: Duration::from_secs(5),
            form_new_cluster: true,
            answer_max_age: Duration::from_secs(2),
        }
    }
}

/// What a contact point answered to a probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeAnswer {
    /// The cluster address of the node behind the contact point.
    pub self_node: Address,
    /// The members it offers to join through (its Up and WeaklyUp members), empty while it is
    /// not a member of a cluster itself.
    pub seed_nodes: Vec<Address>,
    /// While it is not a member yet: the seed nodes it is joining through, as members offered
    /// them to it first-hand within `answer_max_age` ([`BootstrapState::first_hand_seeds`]).
    /// Between deciding to join and being let in, a node would otherwise answer "no cluster"
    /// and let another node form a second one. Only first-hand seeds are passed on, and they
    /// expire, so a dead cluster's seeds cannot circulate among joining nodes for ever.
    pub joining_via: Vec<Address>,
}

/// Why a node is not joining anything yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitReason {
    /// Fewer distinct nodes are known than `required_contact_points`.
    NotEnoughContactPoints { known: usize, required: usize },
    /// Discovery changed less than `stable_margin` ago.
    DiscoveryNotStable { stable_in: Duration },
    /// These contact points have not answered since discovery last changed (or their answer
    /// is too old to count).
    NotAllAnswered { missing: Vec<ContactPoint> },
    /// No discovered contact point is this node itself, so this node cannot know that the
    /// others count it; it must not form a cluster (it joins once one exists).
    SelfNotDiscovered,
    /// `form_new_cluster` is off and no contact point offers seed nodes.
    FormingDisabled,
    /// The only seed node offered is this node's own address: an earlier incarnation of it is
    /// still a member somewhere. A cluster exists, so this node must not form one; it waits
    /// for a contact point to offer another member.
    OnlySelfOffered,
    /// Another node has the lowest address; it forms the cluster and this node joins it.
    LowerNodeForms { lowest: Address },
}

impl fmt::Display for WaitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitReason::NotEnoughContactPoints { known, required } => write!(
                f,
                "{known} of the {required} required contact points known (required_contact_points)"
            ),
            WaitReason::DiscoveryNotStable { stable_in } => write!(
                f,
                "discovery changed recently; stable in {} ms (stable_margin)",
                stable_in.as_millis()
            ),
            WaitReason::NotAllAnswered { missing } => {
                write!(f, "contact points not answering yet:")?;
                for point in missing {
                    write!(f, " {point}")?;
                }
                Ok(())
            }
            WaitReason::SelfNotDiscovered => f.write_str(
                "this node's own contact point is not among the discovered ones, so it may \
                 only join an existing cluster",
            ),
            WaitReason::FormingDisabled => f.write_str(
                "no contact point offers seed nodes and form_new_cluster is off: waiting for a \
                 cluster to join",
            ),
            WaitReason::OnlySelfOffered => f.write_str(
                "a cluster lists this node's own address (an earlier incarnation) as its only \
                 seed node; waiting for another member to be offered",
            ),
            WaitReason::LowerNodeForms { lowest } => {
                write!(
                    f,
                    "waiting for {lowest}, the lowest address, to form the cluster"
                )
            }
        }
    }
}

/// What the node should do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Join the cluster these seed nodes belong to (sorted, without this node).
    JoinSeeds(Vec<Address>),
    /// Form a new cluster: join this node itself.
    JoinSelf,
    /// Keep probing.
    Wait(WaitReason),
}

/// A probe's latest successful answer.
#[derive(Clone, Debug)]
struct Answered {
    at: Duration,
    answer: ProbeAnswer,
}

/// What a bootstrapping node knows: the discovered contact points and their latest answers.
#[derive(Clone, Debug, Default)]
pub struct BootstrapState {
    discovered: BTreeSet<ContactPoint>,
    /// When the discovered set last changed (`None`: nothing discovered yet).
    changed_at: Option<Duration>,
    answers: BTreeMap<ContactPoint, Answered>,
}

impl BootstrapState {
    pub fn new() -> Self {
        Self::default()
    }

    /// The contact points to probe.
    pub fn contact_points(&self) -> impl Iterator<Item = &ContactPoint> {
        self.discovered.iter()
    }

    /// Records a discovery result. A different set restarts the stable margin, and answers of
    /// contact points no longer discovered are forgotten.
    pub fn on_discovery(&mut self, now: Duration, found: BTreeSet<ContactPoint>) {
        if self.changed_at.is_some() && found == self.discovered {
            return;
        }
        self.answers.retain(|point, _| found.contains(point));
        self.discovered = found;
        self.changed_at = Some(now);
    }

    /// Records the answer to a probe sent at `sent_at` (the send time, not the arrival: an
    /// answer says what the node saw when it was asked, at the latest). Only discovered
    /// contact points count.
    pub fn on_probe_answer(
        &mut self,
        sent_at: Duration,
        point: &ContactPoint,
        answer: ProbeAnswer,
    ) {
        if self.discovered.contains(point) {
            self.answers.insert(
                point.clone(),
                Answered {
                    at: sent_at,
                    answer,
                },
            );
        }
    }

    /// Records a failed probe (no answer, an error, or nonsense): the contact point must
    /// answer again before a new cluster may be formed.
    pub fn on_probe_failed(&mut self, point: &ContactPoint) {
        self.answers.remove(point);
    }

    /// The seed nodes members offered in answers still fresh at `now` (not the ones other
    /// joining nodes passed on), without this node: what it tells its own probers it is
    /// joining through ([`ProbeAnswer::joining_via`]).
    pub fn first_hand_seeds(
        &self,
        settings: &BootstrapSettings,
        now: Duration,
        self_address: &Address,
    ) -> Vec<Address> {
        let seeds: BTreeSet<&Address> = self
            .answers
            .values()
            .filter(|a| now.saturating_sub(a.at) <= settings.answer_max_age)
            .flat_map(|a| a.answer.seed_nodes.iter())
            .filter(|seed| *seed != self_address)
            .collect();
        seeds.into_iter().cloned().collect()
    }

    /// The decision for the node at `self_address` at `now`.
    pub fn decide(
        &self,
        settings: &BootstrapSettings,
        now: Duration,
        self_address: &Address,
    ) -> Decision {
        let fresh = |a: &Answered| now.saturating_sub(a.at) <= settings.answer_max_age;
        // Any seed node offered means a cluster exists: join it, never form another.
        let offered: BTreeSet<&Address> = self
            .answers
            .values()
            .filter(|a| fresh(a))
            .flat_map(|a| a.answer.seed_nodes.iter().chain(&a.answer.joining_via))
            .collect();
        if !offered.is_empty() {
            let seeds: Vec<Address> = offered
                .into_iter()
                .filter(|seed| *seed != self_address)
                .cloned()
                .collect();
            if seeds.is_empty() {
                return Decision::Wait(WaitReason::OnlySelfOffered);
            }
            return Decision::JoinSeeds(seeds);
        }
        let Some(changed_at) = self.changed_at else {
            return Decision::Wait(WaitReason::NotEnoughContactPoints {
                known: 0,
                required: settings.required_contact_points,
            });
        };
        let answered: Vec<&Answered> = self
            .answers
            .values()
            .filter(|a| fresh(a) && a.at >= changed_at)
            .collect();
        // Distinct nodes, not contact points: two names for one node count once.
        let nodes: BTreeSet<&Address> = answered.iter().map(|a| &a.answer.self_node).collect();
        if self.discovered.len() < settings.required_contact_points {
            return Decision::Wait(WaitReason::NotEnoughContactPoints {
                known: self.discovered.len(),
                required: settings.required_contact_points,
            });
        }
        let stable_at = changed_at.saturating_add(settings.stable_margin);
        if now < stable_at {
            return Decision::Wait(WaitReason::DiscoveryNotStable {
                stable_in: stable_at.saturating_sub(now),
            });
        }
        let missing: Vec<ContactPoint> = self
            .discovered
            .iter()
            .filter(|point| {
                self.answers
                    .get(*point)
                    .is_none_or(|a| !fresh(a) || a.at < changed_at)
            })
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Decision::Wait(WaitReason::NotAllAnswered { missing });
        }
        if nodes.len() < settings.required_contact_points {
            return Decision::Wait(WaitReason::NotEnoughContactPoints {
                known: nodes.len(),
                required: settings.required_contact_points,
            });
        }
        if !nodes.contains(self_address) {
            return Decision::Wait(WaitReason::SelfNotDiscovered);
        }
        if !settings.form_new_cluster {
            return Decision::Wait(WaitReason::FormingDisabled);
        }
        // `nodes` holds this node (checked above), so it has a first element.
        match nodes.first() {
            Some(&lowest) if lowest != self_address => Decision::Wait(WaitReason::LowerNodeForms {
                lowest: lowest.clone(),
            }),
            _ => Decision::JoinSelf,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(port: u16) -> ContactPoint {
        ContactPoint::new("127.0.0.1", 8000 + port)
    }

    fn node(port: u16) -> Address {
        Address::new("127.0.0.1", 25000 + port)
    }

    fn answer(port: u16, seeds: &[u16]) -> ProbeAnswer {
        ProbeAnswer {
            self_node: node(port),
            seed_nodes: seeds.iter().map(|p| node(*p)).collect(),
            joining_via: Vec::new(),
        }
    }

    fn settings(required: usize) -> BootstrapSettings {
        BootstrapSettings {
            required_contact_points: required,
            stable_margin: Duration::from_secs(5),
            form_new_cluster: true,
            answer_max_age: Duration::from_secs(2),
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// Three contact points discovered at 0 s, all answering without seeds at `at`.
    fn three_answered(at: Duration) -> BootstrapState {
        let mut state = BootstrapState::new();
        state.on_discovery(secs(0), (1..=3).map(point).collect());
        for p in 1..=3 {
            state.on_probe_answer(at, &point(p), answer(p, &[]));
        }
        state
    }

    #[test]
    fn the_lowest_node_forms_the_cluster_once_stable_and_the_others_wait_for_it() {
        let state = three_answered(secs(4));
        assert_eq!(
            state.decide(&settings(2), secs(5), &node(1)),
            Decision::JoinSelf
        );
        assert_eq!(
            state.decide(&settings(2), secs(5), &node(2)),
            Decision::Wait(WaitReason::LowerNodeForms { lowest: node(1) })
        );
    }

    #[test]
    fn nothing_forms_before_the_stable_margin() {
        let state = three_answered(secs(1));
        assert_eq!(
            state.decide(&settings(2), secs(3), &node(1)),
            Decision::Wait(WaitReason::DiscoveryNotStable { stable_in: secs(2) })
        );
    }

    #[test]
    fn a_discovery_change_restarts_the_margin_and_needs_new_answers() {
        let mut state = three_answered(secs(4));
        state.on_discovery(secs(6), (1..=4).map(point).collect());
        assert!(matches!(
            state.decide(&settings(2), secs(8), &node(1)),
            Decision::Wait(WaitReason::DiscoveryNotStable { .. })
        ));
        // The old answers predate the change: every contact point must answer again.
        let at = secs(11);
        assert_eq!(
            state.decide(&settings(2), at, &node(1)),
            Decision::Wait(WaitReason::NotAllAnswered {
                missing: (1..=4).map(point).collect()
            })
        );
        for p in 1..=4 {
            state.on_probe_answer(at, &point(p), answer(p, &[]));
        }
        assert_eq!(state.decide(&settings(2), at, &node(1)), Decision::JoinSelf);
    }

    #[test]
    fn too_few_contact_points_wait_however_long() {
        let mut state = BootstrapState::new();
        state.on_discovery(secs(0), (1..=2).map(point).collect());
        for p in 1..=2 {
            state.on_probe_answer(secs(9), &point(p), answer(p, &[]));
        }
        assert_eq!(
            state.decide(&settings(3), secs(10), &node(1)),
            Decision::Wait(WaitReason::NotEnoughContactPoints {
                known: 2,
                required: 3
            })
        );
    }

    #[test]
    fn two_names_for_one_node_count_once() {
        let mut state = BootstrapState::new();
        let aliases = [point(1), ContactPoint::new("localhost", 8001)];
        state.on_discovery(secs(0), aliases.iter().cloned().collect());
        for alias in &aliases {
            state.on_probe_answer(secs(9), alias, answer(1, &[]));
        }
        assert_eq!(
            state.decide(&settings(2), secs(10), &node(1)),
            Decision::Wait(WaitReason::NotEnoughContactPoints {
                known: 1,
                required: 2
            })
        );
    }

    #[test]
    fn a_silent_contact_point_blocks_forming() {
        let mut state = three_answered(secs(9));
        state.on_probe_failed(&point(3));
        assert_eq!(
            state.decide(&settings(2), secs(10), &node(1)),
            Decision::Wait(WaitReason::NotAllAnswered {
                missing: vec![point(3)]
            })
        );
        // An answer older than answer_max_age no longer counts either.
        let state = three_answered(secs(5));
        assert!(matches!(
            state.decide(&settings(2), secs(11), &node(1)),
            Decision::Wait(WaitReason::NotAllAnswered { .. })
        ));
    }

    #[test]
    fn seed_nodes_from_any_contact_point_are_joined_at_once() {
        let mut state = BootstrapState::new();
        state.on_discovery(secs(0), (1..=3).map(point).collect());
        state.on_probe_answer(secs(0), &point(3), answer(3, &[3, 2]));
        assert_eq!(
            state.decide(&settings(5), secs(0), &node(1)),
            Decision::JoinSeeds(vec![node(2), node(3)])
        );
        // Not even form_new_cluster = false or the node's own absence holds this back.
        let no_forming = BootstrapSettings {
            form_new_cluster: false,
            ..settings(5)
        };
        assert_eq!(
            state.decide(&no_forming, secs(0), &node(9)),
            Decision::JoinSeeds(vec![node(2), node(3)])
        );
    }

    #[test]
    fn a_node_never_joins_itself_as_a_seed() {
        // A restarted node at a known address is offered its own address among the seeds.
        let mut state = BootstrapState::new();
        state.on_discovery(secs(0), (1..=2).map(point).collect());
        state.on_probe_answer(secs(0), &point(2), answer(2, &[1]));
        assert_eq!(
            state.decide(&settings(2), secs(0), &node(1)),
            Decision::Wait(WaitReason::OnlySelfOffered)
        );
    }

    #[test]
    fn a_node_that_did_not_discover_itself_never_forms() {
        let state = three_answered(secs(9));
        assert_eq!(
            state.decide(&settings(2), secs(10), &Address::new("127.0.0.1", 1)),
            Decision::Wait(WaitReason::SelfNotDiscovered)
        );
    }

    #[test]
    fn form_new_cluster_off_only_joins() {
        let state = three_answered(secs(9));
        let no_forming = BootstrapSettings {
            form_new_cluster: false,
            ..settings(2)
        };
        assert_eq!(
            state.decide(&no_forming, secs(10), &node(1)),
            Decision::Wait(WaitReason::FormingDisabled)
        );
    }

    #[test]
    fn answers_of_undiscovered_contact_points_are_ignored() {
        let mut state = BootstrapState::new();
        state.on_discovery(secs(0), (1..=2).map(point).collect());
        state.on_probe_answer(secs(0), &point(7), answer(7, &[7]));
        assert!(matches!(
            state.decide(&settings(2), secs(0), &node(1)),
            Decision::Wait(_)
        ));
    }

    #[test]
    fn a_node_joining_a_cluster_passes_on_its_seeds_and_nobody_forms_meanwhile() {
        // Node 2 heard seed 3 first-hand; until it is let in, its answers carry it.
        let mut joiner = BootstrapState::new();
        joiner.on_discovery(secs(0), (1..=3).map(point).collect());
        joiner.on_probe_answer(secs(9), &point(3), answer(3, &[3]));
        let via = joiner.first_hand_seeds(&settings(2), secs(10), &node(2));
        assert_eq!(via, vec![node(3)]);
        // Node 1, the lowest, hears "no cluster" from 3's contact point (a stale view) but
        // "joining via 3" from 2: it joins instead of forming.
        let mut lowest = three_answered(secs(9));
        lowest.on_probe_answer(
            secs(9),
            &point(2),
            ProbeAnswer {
                self_node: node(2),
                seed_nodes: Vec::new(),
                joining_via: via,
            },
        );
        assert_eq!(
            lowest.decide(&settings(2), secs(10), &node(1)),
            Decision::JoinSeeds(vec![node(3)])
        );
        // What was passed on is not passed on again, and it expires.
        assert!(
            lowest
                .first_hand_seeds(&settings(2), secs(10), &node(1))
                .is_empty()
        );
        assert!(
            joiner
                .first_hand_seeds(&settings(2), secs(12), &node(2))
                .is_empty()
        );
    }
}
