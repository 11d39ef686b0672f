//! A deterministic simulation of Cluster Bootstrap's decision ([`BootstrapState::decide`]) on
//! many nodes at once, each scenario run for many seeds.
//!
//! Model: node `i` has cluster address `127.0.0.1:(25000+i)` and contact point
//! `127.0.0.1:(8000+i)`. A started node runs a probe round every second (±200 ms): it looks
//! discovery up, then probes every discovered contact point. A probe reaches its target after
//! 0–50 ms, or is lost; the target answers with the members of its cluster *as of then* (empty
//! while it is not in one), or the probe fails if the target is not running; the answer then
//! travels back for a random delay, so it may be stale when it arrives. After every event the
//! node concerned decides and acts: `JoinSelf` forms a new cluster; `JoinSeeds` joins the
//! cluster of the first seed that is running and in one, which takes 0–500 ms (the node keeps
//! deciding meanwhile but does not act again). A node in a cluster stops bootstrapping.
//! Crashes drop a node's state; its cluster keeps listing it as a member until it is downed
//! (0–3 s later); a cluster none of whose listed members is running is dead.
//!
//! Replay one seed with `TESSERA_SIM_SEED=<seed>`; `TESSERA_SIM_TRACE=1` prints its events.
//! `TESSERA_SIM_SEEDS` sets the number of seeds per scenario (default 1,000).

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::time::{Duration, Instant};
use tessera_cluster::Address;
use tessera_cluster::bootstrap::{
    BootstrapSettings, BootstrapState, ContactPoint, Decision, ProbeAnswer, WaitReason,
};

const STABLE_MARGIN: Duration = Duration::from_secs(5);
const PROBE_INTERVAL_MS: u64 = 1000;
const PROBE_JITTER_MS: u64 = 200;
const JOIN_MS: u64 = 500;
const ANSWER_DELAY_MS: u64 = 800;
const START_SPREAD_MS: u64 = 3000;

/// Records a trace line, only when tracing (formatting every event would be slow).
macro_rules! log {
    ($sim:expr, $($arg:tt)*) => {
        if $sim.trace {
            let line = format!("{:>6} ms {}", $sim.now, format_args!($($arg)*));
            $sim.lines.push(line);
        }
    };
}

fn seeds() -> Vec<u64> {
    let var = |name| std::env::var(name).ok().and_then(|s| s.parse::<u64>().ok());
    match var("TESSERA_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (0..var("TESSERA_SIM_SEEDS").unwrap_or(1000)).collect(),
    }
}

fn address(i: usize) -> Address {
    Address::new("127.0.0.1", 25000 + i as u16)
}

fn contact_point(i: usize) -> ContactPoint {
    ContactPoint::new("127.0.0.1", 8000 + i as u16)
}

fn ports(addresses: &[Address]) -> Vec<usize> {
    addresses.iter().map(node_of).collect()
}

fn node_of(address: &Address) -> usize {
    usize::from(address.port - 25000)
}

#[derive(Clone, Copy, Debug)]
enum Discovery {
    /// Every lookup returns all N contact points, started or not (a static list).
    Static,
    /// Every lookup returns the contact points of the nodes running now (consistent DNS).
    Running,
    /// Until `until_ms`, a random non-empty subset of the running nodes, drawn anew on every
    /// lookup, or (`sticky`) one random non-empty subset of all nodes per node incarnation (a
    /// stale cache); afterwards as `Running`.
    Inconsistent { until_ms: u64, sticky: bool },
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Late {
    No,
    /// One node (at a random address, possibly the lowest) starts 0–5 s after the first
    /// cluster formed.
    AfterFormation,
    /// One node starts at 40–45 s.
    At40s,
}

#[derive(Clone, Debug)]
struct Scenario {
    /// Inclusive range of the number of nodes, the late one included.
    nodes: (usize, usize),
    /// `required_contact_points`; `None`: the number of nodes.
    required: Option<usize>,
    discovery: Discovery,
    loss: f64,
    /// A lost probe fails after a timeout of one probe interval (as the HTTP driver's do)
    /// rather than vanish.
    lost_probe_fails: bool,
    late: Late,
    /// `form_new_cluster` only on the lowest node.
    only_lowest_forms: bool,
    /// Random crashes (and restarts 0.2–4 s later) until then.
    chaos_until_ms: u64,
    /// The broken rule: `Wait(LowerNodeForms)` is taken as `JoinSelf`.
    sabotage: bool,
    end_ms: u64,
}

fn base() -> Scenario {
    Scenario {
        nodes: (3, 7),
        required: Some(2),
        discovery: Discovery::Static,
        loss: 0.0,
        lost_probe_fails: false,
        late: Late::No,
        only_lowest_forms: false,
        chaos_until_ms: 0,
        sabotage: false,
        end_ms: 60_000,
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Start(usize),
    Round(usize, u32),
    /// A probe of (node, incarnation), sent at the last field's time, reaches a contact point.
    ProbeArrives(usize, u32, usize, u64),
    /// Its answer (seed nodes and the seeds it is joining through; `None`: the probe failed)
    /// reaches the node.
    /// The last field is when the probe was sent: the driver stamps answers with it.
    ProbeResult(usize, u32, usize, Option<(Vec<Address>, Vec<Address>)>, u64),
    JoinDone(usize, u32, usize),
    Chaos,
    Crash(usize),
    Restart(usize),
    /// A crashed member (node, incarnation) is removed from its cluster.
    Downed(usize, (usize, u32)),
}

#[derive(Default)]
struct Node {
    running: bool,
    /// Incarnation: events of an earlier one are dropped.
    inc: u32,
    state: BootstrapState,
    settings: BootstrapSettings,
    cluster: Option<usize>,
    joining: bool,
    sticky: Option<BTreeSet<ContactPoint>>,
    /// `JoinSelf` decisions acted on, over all incarnations.
    formed: u32,
    joined_via_seeds: u32,
    started_at: Option<u64>,
}

struct Cluster {
    /// (node, incarnation) of every member not yet downed.
    members: BTreeSet<(usize, u32)>,
    formed_by: usize,
    formed_at: u64,
}

struct Sim {
    sc: Scenario,
    rng: SmallRng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64, Event)>>,
    nodes: Vec<Node>,
    clusters: Vec<Cluster>,
    late: Option<usize>,
    /// The most clusters ever live at once, and when that first happened.
    max_live: (usize, u64),
    trace: bool,
    lines: Vec<String>,
}

impl Sim {
    fn run(seed: u64, sc: Scenario, trace: bool) -> Sim {
        let mut rng = SmallRng::seed_from_u64(seed);
        let n = rng.random_range(sc.nodes.0..=sc.nodes.1);
        let late = (sc.late != Late::No).then(|| rng.random_range(0..n));
        let required = sc.required.unwrap_or(n);
        let nodes = (0..n)
            .map(|i| Node {
                settings: BootstrapSettings {
                    required_contact_points: required,
                    stable_margin: STABLE_MARGIN,
                    form_new_cluster: !sc.only_lowest_forms || i == 0,
                    // Two probe rounds, as the node's driver sets it.
                    answer_max_age: Duration::from_millis(2 * PROBE_INTERVAL_MS),
                },
                ..Node::default()
            })
            .collect();
        let mut sim = Sim {
            sc,
            rng,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            nodes,
            clusters: Vec::new(),
            late,
            max_live: (0, 0),
            trace,
            lines: Vec::new(),
        };
        log!(sim, "{n} nodes, required {required}, late node {late:?}");
        for i in 0..n {
            if Some(i) == late {
                if sim.sc.late == Late::At40s {
                    let at = 40_000 + sim.rng.random_range(0..=5000);
                    sim.schedule(at, Event::Start(i));
                }
            } else {
                let at = sim.rng.random_range(0..=START_SPREAD_MS);
                sim.schedule(at, Event::Start(i));
            }
        }
        if sim.sc.chaos_until_ms > 0 {
            let at = sim.rng.random_range(0..=4000);
            sim.schedule(at, Event::Chaos);
        }
        while let Some(Reverse((at, _, event))) = sim.queue.pop() {
            if at > sim.sc.end_ms {
                break;
            }
            sim.now = at;
            if let Some(i) = sim.handle(event) {
                sim.act(i);
            }
            let live = (0..sim.clusters.len()).filter(|&c| sim.is_live(c)).count();
            if live > sim.max_live.0 {
                sim.max_live = (live, sim.now);
            }
        }
        sim
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, event)));
    }

    fn is_live(&self, cluster: usize) -> bool {
        self.clusters[cluster]
            .members
            .iter()
            .any(|&(i, inc)| self.nodes[i].running && self.nodes[i].inc == inc)
    }

    /// The node's own events are dropped once it crashed, restarted or joined a cluster.
    fn bootstrapping(&self, i: usize, inc: u32) -> bool {
        let node = &self.nodes[i];
        node.running && node.inc == inc && node.cluster.is_none()
    }

    fn running(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&j| self.nodes[j].running)
            .collect()
    }

    fn discover(&mut self, i: usize) -> BTreeSet<ContactPoint> {
        let running = self.running();
        match self.sc.discovery {
            Discovery::Static => (0..self.nodes.len()).map(contact_point).collect(),
            Discovery::Inconsistent { until_ms, sticky } if self.now < until_ms => {
                if !sticky {
                    return self.subset(&running);
                }
                if self.nodes[i].sticky.is_none() {
                    let all: Vec<usize> = (0..self.nodes.len()).collect();
                    self.nodes[i].sticky = Some(self.subset(&all));
                }
                self.nodes[i].sticky.clone().unwrap()
            }
            _ => running.into_iter().map(contact_point).collect(),
        }
    }

    fn subset(&mut self, of: &[usize]) -> BTreeSet<ContactPoint> {
        loop {
            let set: BTreeSet<ContactPoint> = of
                .iter()
                .filter(|_| self.rng.random_bool(0.5))
                .map(|&j| contact_point(j))
                .collect();
            if !set.is_empty() {
                return set;
            }
        }
    }

    /// Handles one event; returns the node that must decide now.
    fn handle(&mut self, event: Event) -> Option<usize> {
        match event {
            Event::Start(i) => {
                log!(self, "node {i} starts");
                let node = &mut self.nodes[i];
                node.running = true;
                node.started_at = Some(self.now);
                self.schedule(self.now, Event::Round(i, 0));
                None
            }
            Event::Round(i, inc) => {
                if !self.bootstrapping(i, inc) {
                    return None;
                }
                let found = self.discover(i);
                let now = self.ms();
                self.nodes[i].state.on_discovery(now, found);
                let targets: Vec<usize> = self.nodes[i]
                    .state
                    .contact_points()
                    .map(|p| usize::from(p.0.port - 8000))
                    .collect();
                for to in targets {
                    if self.rng.random_bool(self.sc.loss) {
                        log!(self, "node {i} -> {to}: probe lost");
                        if self.sc.lost_probe_fails {
                            let at = self.now + PROBE_INTERVAL_MS;
                            let sent = self.now;
                            self.schedule(at, Event::ProbeResult(i, inc, to, None, sent));
                        }
                    } else {
                        let at = self.now + self.rng.random_range(0..=50);
                        let sent = self.now;
                        self.schedule(at, Event::ProbeArrives(i, inc, to, sent));
                    }
                }
                let next = self.now + PROBE_INTERVAL_MS - PROBE_JITTER_MS;
                let next = next + self.rng.random_range(0..=2 * PROBE_JITTER_MS);
                self.schedule(next, Event::Round(i, inc));
                Some(i)
            }
            Event::ProbeArrives(from, inc, to, sent) => {
                let target = &self.nodes[to];
                // Its cluster's members, crashed ones not yet downed included.
                let members = target.cluster.map(|c| &self.clusters[c].members);
                let mut seeds: Vec<Address> = members
                    .into_iter()
                    .flatten()
                    .map(|m| address(m.0))
                    .collect();
                seeds.dedup();
                // Not a member yet: the seeds members offered it first-hand, as the node's
                // driver publishes them.
                let joining_via = match target.cluster {
                    Some(_) => Vec::new(),
                    None => {
                        target
                            .state
                            .first_hand_seeds(&target.settings, self.ms(), &address(to))
                    }
                };
                let seeds = target.running.then_some((seeds, joining_via));
                let at = self.now + self.rng.random_range(0..=ANSWER_DELAY_MS);
                self.schedule(at, Event::ProbeResult(from, inc, to, seeds, sent));
                None
            }
            Event::ProbeResult(node, inc, to, seeds, sent) => {
                if !self.bootstrapping(node, inc) {
                    return None;
                }
                log!(
                    self,
                    "node {node} <- {to}: seeds {:?}",
                    seeds.as_ref().map(|(s, j)| (ports(s), ports(j)))
                );
                let point = contact_point(to);
                let state = &mut self.nodes[node].state;
                match seeds.map(|(seed_nodes, joining_via)| ProbeAnswer {
                    self_node: address(to),
                    seed_nodes,
                    joining_via,
                }) {
                    Some(answer) => {
                        state.on_probe_answer(Duration::from_millis(sent), &point, answer)
                    }
                    None => state.on_probe_failed(&point),
                }
                Some(node)
            }
            Event::JoinDone(node, inc, cluster) => {
                if !self.bootstrapping(node, inc) {
                    return None;
                }
                self.nodes[node].joining = false;
                if !self.is_live(cluster) {
                    log!(self, "node {node}: join of dead cluster {cluster} fails");
                    return Some(node);
                }
                log!(self, "node {node} joined cluster {cluster}");
                self.clusters[cluster].members.insert((node, inc));
                self.nodes[node].cluster = Some(cluster);
                self.nodes[node].joined_via_seeds += 1;
                None
            }
            Event::Chaos => {
                let running = self.running();
                if !running.is_empty() {
                    let victim = running[self.rng.random_range(0..running.len())];
                    self.schedule(self.now, Event::Crash(victim));
                }
                let next = self.now + self.rng.random_range(1000..=6000);
                if next < self.sc.chaos_until_ms {
                    self.schedule(next, Event::Chaos);
                }
                None
            }
            Event::Crash(i) => {
                let (inc, cluster) = (self.nodes[i].inc, self.nodes[i].cluster);
                log!(self, "node {i} crashes (in cluster {cluster:?})");
                self.nodes[i].running = false;
                if let Some(cluster) = cluster {
                    let at = self.now + self.rng.random_range(0..=3000);
                    self.schedule(at, Event::Downed(cluster, (i, inc)));
                }
                let at = self.now + self.rng.random_range(200..=4000);
                self.schedule(at, Event::Restart(i));
                None
            }
            Event::Restart(i) => {
                log!(self, "node {i} restarts");
                let n = &mut self.nodes[i];
                (n.inc, n.running, n.cluster, n.joining, n.sticky) =
                    (n.inc + 1, true, None, false, None);
                n.state = BootstrapState::new();
                let inc = n.inc;
                self.schedule(self.now, Event::Round(i, inc));
                None
            }
            Event::Downed(cluster, member) => {
                self.clusters[cluster].members.remove(&member);
                None
            }
        }
    }

    fn ms(&self) -> Duration {
        Duration::from_millis(self.now)
    }

    fn act(&mut self, i: usize) {
        let node = &self.nodes[i];
        let (inc, joining) = (node.inc, node.joining);
        let mut decision = node.state.decide(&node.settings, self.ms(), &address(i));
        if self.sc.sabotage && matches!(decision, Decision::Wait(WaitReason::LowerNodeForms { .. }))
        {
            decision = Decision::JoinSelf;
        }
        if joining {
            return;
        }
        match decision {
            Decision::Wait(_) => {}
            Decision::JoinSelf => {
                let cluster = self.clusters.len();
                log!(self, "node {i} JoinSelf: forms cluster {cluster}");
                self.clusters.push(Cluster {
                    members: BTreeSet::from([(i, inc)]),
                    formed_by: i,
                    formed_at: self.now,
                });
                self.nodes[i].cluster = Some(cluster);
                self.nodes[i].formed += 1;
                if self.sc.late == Late::AfterFormation && cluster == 0 {
                    let late = self.late.expect("a late node");
                    let at = self.now + self.rng.random_range(0..=5000);
                    self.schedule(at, Event::Start(late));
                }
            }
            Decision::JoinSeeds(seeds) => {
                let target = seeds.iter().map(node_of).find_map(|j| {
                    let seed = &self.nodes[j];
                    seed.running.then_some(seed.cluster).flatten()
                });
                let seeds = ports(&seeds);
                let Some(cluster) = target else {
                    log!(
                        self,
                        "node {i} JoinSeeds {seeds:?}: none of them in a cluster"
                    );
                    return;
                };
                log!(
                    self,
                    "node {i} JoinSeeds {seeds:?}: joins cluster {cluster}"
                );
                self.nodes[i].joining = true;
                let at = self.now + self.rng.random_range(0..=JOIN_MS);
                self.schedule(at, Event::JoinDone(i, inc, cluster));
            }
        }
    }

    /// Every running node is in the same live cluster; returns it.
    fn all_in_one_cluster(&self) -> Result<usize, String> {
        let of: Vec<Option<usize>> = self.nodes.iter().map(|n| n.cluster).collect();
        match of[0] {
            Some(c) if of.iter().all(|&o| o == Some(c)) && self.is_live(c) => Ok(c),
            _ => Err(format!("not all nodes in one cluster at the end: {of:?}")),
        }
    }

    fn exactly_one_formed(&self) -> Result<(), String> {
        let formed = self.clusters.iter().map(|c| (c.formed_by, c.formed_at));
        let formed: Vec<(usize, u64)> = formed.collect();
        match formed.len() {
            1 => Ok(()),
            n => Err(format!("{n} clusters formed (by node, at ms): {formed:?}")),
        }
    }

    fn formed_by_lowest(&self) -> Result<(), String> {
        let lowest = usize::from(self.late == Some(0));
        match self.clusters.first() {
            Some(c) if c.formed_by == lowest => Ok(()),
            Some(c) => Err(format!("formed by node {}, not {lowest}", c.formed_by)),
            None => Err("no cluster formed".to_string()),
        }
    }
}

type Check = fn(&Sim) -> Result<(), String>;

/// Runs `scenario` for every seed and applies `checks` to each run; the first failing seed is
/// replayed with its trace.
fn check(name: &str, scenario: impl Fn(u64) -> Scenario, checks: &[Check]) {
    let (started, seeds) = (Instant::now(), seeds());
    let trace = std::env::var("TESSERA_SIM_TRACE").is_ok();
    let mut failures = Vec::new();
    for &seed in &seeds {
        let sim = Sim::run(seed, scenario(seed), trace);
        if trace {
            eprintln!("seed {seed}:\n{}", sim.lines.join("\n"));
        }
        for error in checks.iter().filter_map(|check| check(&sim).err()) {
            failures.push((seed, error));
        }
    }
    eprintln!("{name}: {} seeds in {:.2?}", seeds.len(), started.elapsed());
    if let Some(&(seed, _)) = failures.first() {
        let first = failures.iter().take(10);
        let first: String = first.map(|(s, e)| format!("seed {s}: {e}\n")).collect();
        let lines = Sim::run(seed, scenario(seed), true).lines;
        panic!(
            "{name}: {} failures over {} seeds, first:\n{}last events of seed {seed} \
             (replay: TESSERA_SIM_SEED={seed} TESSERA_SIM_TRACE=1):\n{}",
            failures.len(),
            seeds.len(),
            first,
            lines[lines.len().saturating_sub(150)..].join("\n")
        );
    }
}

/// `base()` changed by `f`.
fn with(f: impl FnOnce(&mut Scenario)) -> Scenario {
    let mut scenario = base();
    f(&mut scenario);
    scenario
}

fn all_in_one(sim: &Sim) -> Result<(), String> {
    sim.all_in_one_cluster().map(|_| ())
}

const ONE_BY_LOWEST: &[Check] = &[Sim::exactly_one_formed, Sim::formed_by_lowest, all_in_one];

const AT_MOST_ONE_LIVE: Check = |sim| match sim.max_live {
    (0 | 1, _) => Ok(()),
    (n, at) => Err(format!("{n} live clusters at {at} ms")),
};

const CRASH_CHECKS: &[Check] = &[AT_MOST_ONE_LIVE, all_in_one];

/// Scenario 1: static discovery of every node, random start times.
#[test]
fn consistent_discovery_forms_exactly_one_cluster_on_the_lowest_node() {
    check("static discovery", |_| base(), ONE_BY_LOWEST);
}

/// Scenario 2: 30 % of the probes lost, answers delayed up to 800 ms.
#[test]
fn lost_and_delayed_probes_still_form_exactly_one_cluster() {
    check("30% probe loss", |_| with(|s| s.loss = 0.3), ONE_BY_LOWEST);
}

/// Scenario 3: a node starting after the cluster formed joins it, even at the lowest address.
#[test]
fn a_late_node_joins_the_formed_cluster_and_never_forms_one() {
    let scenario = |_| {
        with(|s| {
            s.nodes = (4, 7);
            s.discovery = Discovery::Running;
            s.late = Late::AfterFormation;
        })
    };
    let late_joined: Check = |sim| {
        let late = &sim.nodes[sim.late.unwrap()];
        match (late.started_at, late.formed, late.joined_via_seeds) {
            (Some(at), 0, 1) if at >= sim.clusters[0].formed_at => Ok(()),
            other => Err(format!("late node (started at, formed, joined): {other:?}")),
        }
    };
    let checks = [ONE_BY_LOWEST, &[late_joined]].concat();
    check("late node", scenario, &checks);
}

/// Scenario 4: required_contact_points = 3 while only 2 of the 3 nodes run for 40 s; static
/// discovery (the third fails its probes) on even seeds, the running nodes on odd ones.
#[test]
fn nothing_forms_until_the_required_contact_points_run() {
    let scenario = |seed: u64| {
        with(|s| {
            (s.nodes, s.required, s.late, s.end_ms) = ((3, 3), Some(3), Late::At40s, 100_000);
            if seed % 2 == 1 {
                s.discovery = Discovery::Running;
            }
        })
    };
    let not_before_third: Check = |sim| {
        let third = sim.nodes[sim.late.unwrap()].started_at.unwrap();
        match sim.clusters.first() {
            Some(c) if c.formed_at >= third => Ok(()),
            _ => Err(format!("formed before the third started ({third} ms)")),
        }
    };
    let checks: &[Check] = &[not_before_third, Sim::exactly_one_formed, all_in_one];
    check("required 3 of 3", scenario, checks);
}

/// Scenario 5: inconsistent discovery for 15 s, with required_contact_points = N.
#[test]
fn inconsistent_discovery_with_all_contact_points_required_forms_one_cluster() {
    let scenario = |seed: u64| {
        with(|s| {
            s.required = None;
            let sticky = seed % 2 == 1;
            s.discovery = Discovery::Inconsistent {
                until_ms: 15_000,
                sticky,
            };
        })
    };
    let checks: &[Check] = &[Sim::exactly_one_formed, all_in_one];
    check("inconsistent discovery, required N", scenario, checks);
}

/// The documented limitation, which shows the checker is not vacuous: with fewer contact
/// points required, partial discovery views can form two clusters.
#[test]
fn inconsistent_discovery_with_two_required_can_form_two_clusters() {
    let sticky = Discovery::Inconsistent {
        until_ms: 30_000,
        sticky: true,
    };
    let scenario = with(|s| s.discovery = sticky);
    let doubles: Vec<u64> = (0..200)
        .filter(|&seed| AT_MOST_ONE_LIVE(&Sim::run(seed, scenario.clone(), false)).is_err())
        .collect();
    eprintln!(
        "two live clusters on {} of 200 seeds: {doubles:?}",
        doubles.len()
    );
    assert!(
        !doubles.is_empty(),
        "the checker never saw a double formation"
    );
}

/// Scenario 6: form_new_cluster only on the lowest node.
#[test]
fn only_the_lowest_node_may_form() {
    let scenario = |_| with(|s| (s.only_lowest_forms, s.loss) = (true, 0.1));
    check("form_new_cluster on the lowest", scenario, ONE_BY_LOWEST);
}

/// Scenario 7: random crashes and restarts during the first 30 s, before and after forming.
#[test]
fn crashes_and_restarts_never_leave_two_live_clusters() {
    let scenario = |_| with(|s| (s.loss, s.chaos_until_ms, s.end_ms) = (0.1, 30_000, 90_000));
    check("crashes and restarts", scenario, CRASH_CHECKS);
}

/// Scenario 7 with half the probes lost silently (never reported as failed) and a minute of
/// crashes: an answer that predates its node joining a cluster must not count for forming.
/// Before answers expired after `answer_max_age` (they counted for the whole stable margin),
/// about 6 seeds in 100,000 formed a second cluster here (seed 13273, with 3 nodes).
#[test]
fn crashes_and_restarts_with_silently_lost_probes_never_leave_two_live_clusters() {
    let scenario = |_| {
        with(|s| {
            s.loss = 0.5;
            (s.chaos_until_ms, s.end_ms) = (60_000, 150_000);
        })
    };
    check("crashes, 50% silent loss", scenario, CRASH_CHECKS);
}

/// Scenario 7 with half the probes lost, a lost probe failing after its timeout as the HTTP
/// driver's do (`src/bootstrap.rs` calls `on_probe_failed` on every probe that times out).
#[test]
fn crashes_and_restarts_with_heavy_loss_never_leave_two_live_clusters() {
    let scenario = |_| {
        with(|s| {
            (s.loss, s.lost_probe_fails) = (0.5, true);
            (s.chaos_until_ms, s.end_ms) = (30_000, 120_000);
        })
    };
    check("crashes, 50% loss", scenario, CRASH_CHECKS);
}

/// The sabotaged rule (every node forms instead of waiting for the lowest) must be caught.
#[test]
fn forming_without_waiting_for_the_lowest_node_is_caught() {
    let scenario = with(|s| s.sabotage = true);
    let caught = (0..50)
        .map(|seed| Sim::run(seed, scenario.clone(), false))
        .filter(|sim| sim.exactly_one_formed().is_err())
        .count();
    eprintln!("sabotage caught on {caught} of 50 seeds");
    assert!(caught >= 1, "the broken rule was never caught");
}
