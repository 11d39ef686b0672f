//! The soak's checker: decides from the history, the final reads and the samples whether
//! anything went wrong. Pure: no clock, no I/O, so that it can be tested on made-up histories.
//!
//! The checks, each reporting its anomalies:
//!
//! - **deposits**: every deposit answered 200 is in its account's balance exactly once. With
//!   distinct random amounts, the balance minus the acknowledged deposits must be the sum of
//!   some subset of the deposits whose outcome is unknown; a doubled or lost deposit, or a
//!   failed one applied, leaves a difference no subset explains (decided exactly up to
//!   [`MAX_EXACT_UNKNOWNS`] unknown deposits per account, by bounds beyond).
//! - **account reads**: every balance an account answered (a read, or a deposit's reply) lies
//!   between the deposits acknowledged before the request was sent and those (acknowledged
//!   or unknown) sent before it was answered: no stale and no invented state.
//! - **counters**: every majority read of a counter, during the soak and at its end, lies
//!   between the increments acknowledged before it was sent and those (acknowledged or
//!   unknown) sent before it was answered.
//! - **sets**: every majority read of a set holds every add acknowledged before it was sent,
//!   and nothing that was not added (or whose add failed, or was sent after it was answered).
//!
//!   Both hold for durable keys (`d-...`) whatever happened. A key kept only in memory
//!   promises less, in Distributed Data as in Akka: once no running process holds it, it
//!   starts again from nothing, so for such keys only what was acknowledged after the last
//!   such loss before a read must be in it (see [`memory_losses`]).
//! - **single home**: in no stable sample of who hosts what does an account live on two nodes.
//! - **memory**: every node's resident set stayed below the bound, and its gauges below their
//!   caps.
//! - **nodes**: no node crashed (exited other than by a downing, a removal or SIGTERM).
//! - **liveness**: the cluster converged after the faults ended, and every final read was
//!   answered.
//! - **answers**: no answer broke the API's contract (a 200 without a value, elements the
//!   soak never writes).

use super::history::{Observed, OpKind, Operation, Outcome, Request};
use super::memory::{CAPS, MemoryRecord};
use super::nemesis::{Crash, Event, EventKind};
use super::ownership::OwnershipRecord;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// The most unknown deposits of one account for which the exact check runs (it enumerates
/// 2^(n/2) sums on each side).
pub const MAX_EXACT_UNKNOWNS: usize = 40;
/// At most this many anomalies are described per check (the count says how many there were).
const MAX_DESCRIBED: usize = 20;
/// At most this many candidates are tried when explaining a deposit anomaly.
const MAX_EXPLAIN: usize = 200;

/// Everything the checker looks at.
pub struct Evidence<'a> {
    /// The workload's operations.
    pub operations: &'a [Operation],
    /// The reads after the cluster converged at the end: every account, counter and set read
    /// through every node.
    pub final_reads: &'a [Operation],
    /// Whether one cluster of all nodes converged after the faults ended.
    pub converged: bool,
    pub ownership: &'a OwnershipRecord,
    pub memory: &'a MemoryRecord,
    pub rss_bound_bytes: u64,
    pub crashes: &'a [Crash],
    /// When the memory-only keys were lost (µs from the start), ascending: see
    /// [`memory_losses`].
    pub memory_losses_us: &'a [u64],
}

/// Whether a Distributed Data key of the soak is durable on its nodes (`--durable-keys d-*`).
pub fn is_durable_key(key: &str) -> bool {
    key.starts_with("d-")
}

/// How long a restarted node must run, unpaused and on the same side of any partition as a
/// node that holds the memory-only keys, before it counts as holding them too: time to join
/// and take a few of Distributed Data's full-state gossip rounds (1 s apart).
pub const HOLDER_AFTER_MS: u64 = 5_000;

/// The moments (µs from the start, ascending) at which the keys kept only in memory were
/// lost: the last process that held them ended (killed, left, downed, removed or crashed).
///
/// Every process holds them at the start. A restarted process starts empty and holds them
/// once it has run for [`HOLDER_AFTER_MS`], unpaused, while a holder ran unpaused on its side
/// of any partition (so that gossip could reach it); if no holder is left when it starts, it
/// holds them at once (there is nothing to learn). When the last holder ends, the processes
/// still running become the holders of what comes after. A paused process keeps its memory
/// and stays a holder.
///
/// Distributed Data, as Akka's, promises no more for keys not kept durable: once no running
/// process has a key, it starts again from nothing. A write acknowledged before such a moment
/// may be gone; one acknowledged after it must be in every later read.
pub fn memory_losses(events: &[Event], nodes: usize) -> Vec<u64> {
    let mut holders = Holders::new(nodes);
    let mut losses = Vec::new();
    for event in events {
        holders.promote_until(event.at_ms);
        let nodes_of_event = event.nodes.iter().filter_map(|n| n.checked_sub(1));
        match event.kind {
            EventKind::Kill
            | EventKind::Left
            | EventKind::Downed
            | EventKind::Removed
            | EventKind::Crash => {
                for i in nodes_of_event {
                    holders.set(i, Process::Ended);
                }
                if !holders.any_holder() {
                    losses.push(event.at_ms.saturating_mul(1000));
                    holders.running_hold_all();
                }
            }
            EventKind::Restart => {
                let fresh = !holders.any_holder();
                for i in nodes_of_event {
                    holders.set(i, Process::Running { holder: fresh });
                }
            }
            EventKind::Pause => nodes_of_event.for_each(|i| holders.pause(i, true)),
            EventKind::Resume => nodes_of_event.for_each(|i| holders.pause(i, false)),
            EventKind::Partition => holders.cut = nodes_of_event.collect(),
            EventKind::Heal => holders.cut.clear(),
            EventKind::Terminate | EventKind::StartFailed => {}
        }
        holders.reconnect(event.at_ms);
    }
    losses
}

/// A node's process, as [`memory_losses`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Process {
    Ended,
    Running { holder: bool },
}

/// Who holds the memory-only keys, for [`memory_losses`].
struct Holders {
    processes: Vec<Process>,
    paused: Vec<bool>,
    /// Since when (ms) each running non-holder could be reached by an unpaused holder.
    reachable_since_ms: Vec<Option<u64>>,
    /// The minority side of the partition in force (0-based), if any.
    cut: BTreeSet<usize>,
}

impl Holders {
    fn new(nodes: usize) -> Holders {
        Holders {
            processes: vec![Process::Running { holder: true }; nodes],
            paused: vec![false; nodes],
            reachable_since_ms: vec![None; nodes],
            cut: BTreeSet::new(),
        }
    }

    fn set(&mut self, i: usize, process: Process) {
        if let Some(p) = self.processes.get_mut(i) {
            *p = process;
        }
        if let Some(paused) = self.paused.get_mut(i) {
            *paused = false;
        }
    }

    fn pause(&mut self, i: usize, paused: bool) {
        if let Some(p) = self.paused.get_mut(i) {
            *p = paused;
        }
    }

    fn is_holder(&self, i: usize) -> bool {
        self.processes[i] == Process::Running { holder: true }
    }

    fn any_holder(&self) -> bool {
        (0..self.processes.len()).any(|i| self.is_holder(i))
    }

    fn running_hold_all(&mut self) {
        for p in &mut self.processes {
            if let Process::Running { holder } = p {
                *holder = true;
            }
        }
    }

    /// Whether gossip can flow between `i` and some other holder now.
    fn reaches_a_holder(&self, i: usize) -> bool {
        !self.paused[i]
            && (0..self.processes.len()).any(|j| {
                j != i
                    && self.is_holder(j)
                    && !self.paused[j]
                    && self.cut.contains(&j) == self.cut.contains(&i)
            })
    }

    /// Starts or stops the clock of every running non-holder after a change at `now_ms`.
    fn reconnect(&mut self, now_ms: u64) {
        for i in 0..self.processes.len() {
            let waiting = self.processes[i] == Process::Running { holder: false };
            self.reachable_since_ms[i] = if waiting && self.reaches_a_holder(i) {
                Some(self.reachable_since_ms[i].unwrap_or(now_ms))
            } else {
                None
            };
        }
    }

    /// Makes holders of the processes whose clock ran out by `now_ms`, in time order (a new
    /// holder can start another's clock).
    fn promote_until(&mut self, now_ms: u64) {
        loop {
            let next = (0..self.processes.len())
                .filter_map(|i| Some((self.reachable_since_ms[i]? + HOLDER_AFTER_MS, i)))
                .filter(|(at, _)| *at <= now_ms)
                .min();
            let Some((at_ms, i)) = next else { return };
            self.processes[i] = Process::Running { holder: true };
            self.reconnect(at_ms);
        }
    }
}

/// From when a read sent at `invoked_us` must see `key`'s acknowledged writes: the start for
/// a durable key, else the last loss of the memory-only keys before the read.
fn memory_since(key: &str, invoked_us: u64, memory_losses_us: &[u64]) -> u64 {
    if is_durable_key(key) {
        return 0;
    }
    let n = memory_losses_us.partition_point(|at| *at < invoked_us);
    if n == 0 { 0 } else { memory_losses_us[n - 1] }
}

/// How the losses of the memory-only keys are reported in a check's summary.
fn memory_losses_note(memory_losses_us: &[u64]) -> String {
    if memory_losses_us.is_empty() {
        return String::new();
    }
    let at: Vec<String> = memory_losses_us.iter().map(|t| secs(*t)).collect();
    format!(
        "; the last process holding the memory-only keys ended at {} (they count only what \
         was acknowledged after that)",
        at.join(", ")
    )
}

/// One check's result.
#[derive(Clone, Debug, Serialize)]
pub struct CheckResult {
    pub name: &'static str,
    /// What was checked, in figures.
    pub summary: String,
    /// How many anomalies it found.
    pub anomaly_count: usize,
    /// The first `MAX_DESCRIBED` of them.
    pub anomalies: Vec<String>,
}

impl CheckResult {
    fn new(name: &'static str, summary: String, anomalies: Vec<String>) -> CheckResult {
        let anomaly_count = anomalies.len();
        CheckResult {
            name,
            summary,
            anomaly_count,
            anomalies: anomalies.into_iter().take(MAX_DESCRIBED).collect(),
        }
    }
}

/// Runs every check.
pub fn check(evidence: &Evidence) -> Vec<CheckResult> {
    vec![
        deposits(evidence),
        account_reads(evidence.operations),
        counters(evidence),
        sets(evidence),
        single_home(evidence.ownership),
        memory(evidence.memory, evidence.rss_bound_bytes),
        nodes(evidence.crashes),
        liveness(evidence),
        answers(evidence),
    ]
}

fn secs(us: u64) -> String {
    format!("{:.3}s", us as f64 / 1e6)
}

// ---------------------------------------------------------------------------------------------
// Subset sums

/// Every sum of subsets of up to [`MAX_EXACT_UNKNOWNS`] amounts, split in two halves
/// (meet in the middle), to ask whether some subset sums to a target.
pub struct SubsetSums {
    left: Vec<u64>,
    right: Vec<u64>,
}

impl SubsetSums {
    /// None when there are more than [`MAX_EXACT_UNKNOWNS`] amounts.
    pub fn new(amounts: &[u64]) -> Option<SubsetSums> {
        if amounts.len() > MAX_EXACT_UNKNOWNS {
            return None;
        }
        let (a, b) = amounts.split_at(amounts.len() / 2);
        let sums = |half: &[u64]| {
            let mut sums = vec![0u64];
            for &x in half {
                let more: Vec<u64> = sums.iter().map(|s| s.saturating_add(x)).collect();
                sums.extend(more);
            }
            sums.sort_unstable();
            sums.dedup();
            sums
        };
        Some(SubsetSums {
            left: sums(a),
            right: sums(b),
        })
    }

    pub fn contains(&self, target: u64) -> bool {
        self.left
            .iter()
            .take_while(|&&l| l <= target)
            .any(|&l| self.right.binary_search(&(target - l)).is_ok())
    }
}

// ---------------------------------------------------------------------------------------------
// Deposits

/// One account's deposits by outcome: (invoked, completed, amount).
#[derive(Default)]
struct AccountDeposits {
    ok: Vec<(u64, u64, u64)>,
    unknown: Vec<(u64, u64, u64)>,
    failed: Vec<(u64, u64, u64)>,
}

fn deposits_by_account(operations: &[Operation]) -> BTreeMap<&str, AccountDeposits> {
    let mut accounts: BTreeMap<&str, AccountDeposits> = BTreeMap::new();
    for op in operations {
        if let Request::Deposit { account, amount } = &op.request {
            let entry = accounts.entry(account.as_str()).or_default();
            let record = (op.invoked_us, op.completed_us, *amount);
            match op.outcome {
                Outcome::Ok => entry.ok.push(record),
                Outcome::Unknown => entry.unknown.push(record),
                Outcome::Failed => entry.failed.push(record),
            }
        }
    }
    accounts
}

/// The final reads of `kind`, by key, as (node, observed) — None where the node never
/// answered.
fn final_values(
    final_reads: &[Operation],
    kind: OpKind,
) -> BTreeMap<&str, Vec<(usize, Option<&Observed>)>> {
    let mut values: BTreeMap<&str, Vec<(usize, Option<&Observed>)>> = BTreeMap::new();
    for op in final_reads.iter().filter(|op| op.kind() == kind) {
        let key = match &op.request {
            Request::AccountGet { account } => account.as_str(),
            Request::CounterRead { key } | Request::SetRead { key } => key.as_str(),
            _ => continue,
        };
        let observed = (op.outcome == Outcome::Ok)
            .then_some(op.observed.as_ref())
            .flatten();
        values.entry(key).or_default().push((op.node + 1, observed));
    }
    values
}

fn deposits(evidence: &Evidence) -> CheckResult {
    let accounts = deposits_by_account(evidence.operations);
    let finals = final_values(evidence.final_reads, OpKind::AccountGet);
    let mut anomalies = Vec::new();
    let (mut exact, mut by_bounds) = (0, 0);
    let names: BTreeSet<&str> = accounts.keys().chain(finals.keys()).copied().collect();
    for account in names {
        let empty = AccountDeposits::default();
        let deposits = accounts.get(account).unwrap_or(&empty);
        let balances: BTreeSet<u64> = finals
            .get(account)
            .into_iter()
            .flatten()
            .filter_map(|(_, v)| match v {
                Some(Observed::Balance(b)) => Some(*b),
                _ => None,
            })
            .collect();
        if balances.len() > 1 {
            anomalies.push(format!(
                "{account}: the nodes read different balances at the end: {balances:?}"
            ));
        }
        for &balance in &balances {
            match explain_balance(account, balance, deposits) {
                Explained::Exactly => exact += 1,
                Explained::WithinBounds => by_bounds += 1,
                Explained::Not(why) => anomalies.push(why),
            }
        }
    }
    let ok: usize = accounts.values().map(|a| a.ok.len()).sum();
    let unknown: usize = accounts.values().map(|a| a.unknown.len()).sum();
    let failed: usize = accounts.values().map(|a| a.failed.len()).sum();
    CheckResult::new(
        "deposits",
        format!(
            "{} accounts: {ok} deposits acknowledged, {unknown} unknown, {failed} failed; final \
             balances explained exactly for {exact}, by bounds for {by_bounds} (more than \
             {MAX_EXACT_UNKNOWNS} unknown deposits)",
            accounts.len()
        ),
        anomalies,
    )
}

enum Explained {
    Exactly,
    WithinBounds,
    Not(String),
}

/// Whether `balance` is the acknowledged deposits plus some of the unknown ones; if not, why
/// (a lost, doubled or failed-but-applied deposit, when one explains it).
fn explain_balance(account: &str, balance: u64, deposits: &AccountDeposits) -> Explained {
    let acknowledged: u64 = deposits.ok.iter().map(|d| d.2).sum();
    let unknown: Vec<u64> = deposits.unknown.iter().map(|d| d.2).collect();
    let unknown_sum: u64 = unknown.iter().sum();
    let sums = SubsetSums::new(&unknown);
    let explains = |target: i128| -> bool {
        target >= 0
            && u64::try_from(target).is_ok_and(|t| match &sums {
                Some(sums) => sums.contains(t),
                None => t <= unknown_sum,
            })
    };
    let difference = i128::from(balance) - i128::from(acknowledged);
    if explains(difference) {
        return if sums.is_some() {
            Explained::Exactly
        } else {
            Explained::WithinBounds
        };
    }
    let mut why = format!(
        "{account}: balance {balance} is not the {} acknowledged deposits (sum {acknowledged}) \
         plus some of the {} unknown ones (sum {unknown_sum}); difference {difference}",
        deposits.ok.len(),
        unknown.len()
    );
    if sums.is_none() {
        why.push_str(" (beyond the bounds)");
    }
    let describe = |d: &(u64, u64, u64)| format!("{} sent at {}", d.2, secs(d.0));
    let lost: Vec<String> = deposits
        .ok
        .iter()
        .take(MAX_EXPLAIN)
        .filter(|d| explains(difference + i128::from(d.2)))
        .map(describe)
        .collect();
    let doubled: Vec<String> = deposits
        .ok
        .iter()
        .take(MAX_EXPLAIN)
        .filter(|d| explains(difference - i128::from(d.2)))
        .map(describe)
        .collect();
    let applied: Vec<String> = deposits
        .failed
        .iter()
        .take(MAX_EXPLAIN)
        .filter(|d| explains(difference - i128::from(d.2)))
        .map(describe)
        .collect();
    for (list, what) in [
        (lost, "lost: acknowledged deposit"),
        (doubled, "applied twice: acknowledged deposit"),
        (applied, "applied although it failed: deposit"),
    ] {
        if !list.is_empty() {
            why.push_str(&format!("; explained if {what} {}", list.join(" or ")));
        }
    }
    Explained::Not(why)
}

/// (time, amount) pairs.
type TimedAmounts = Vec<(u64, u64)>;

/// Sums of amounts by time: for "acknowledged before t" and "sent before t".
struct Timeline {
    /// (time, running sum), ascending.
    points: Vec<(u64, u64)>,
}

impl Timeline {
    fn new(mut items: TimedAmounts) -> Timeline {
        items.sort_unstable();
        let mut sum = 0u64;
        let points = items
            .into_iter()
            .map(|(t, amount)| {
                sum = sum.saturating_add(amount);
                (t, sum)
            })
            .collect();
        Timeline { points }
    }

    /// The sum of the amounts at times strictly before `t`.
    fn before(&self, t: u64) -> u64 {
        let n = self.points.partition_point(|(at, _)| *at < t);
        if n == 0 { 0 } else { self.points[n - 1].1 }
    }
}

fn account_reads(operations: &[Operation]) -> CheckResult {
    let accounts = deposits_by_account(operations);
    let timelines: BTreeMap<&str, (Timeline, Timeline)> = accounts
        .iter()
        .map(|(account, d)| {
            let acknowledged = Timeline::new(d.ok.iter().map(|x| (x.1, x.2)).collect());
            let sent = Timeline::new(d.ok.iter().chain(&d.unknown).map(|x| (x.0, x.2)).collect());
            (*account, (acknowledged, sent))
        })
        .collect();
    let mut anomalies = Vec::new();
    let mut checked = 0;
    for op in operations {
        let (Outcome::Ok, Some(Observed::Balance(balance))) = (op.outcome, &op.observed) else {
            continue;
        };
        let (account, own) = match &op.request {
            Request::AccountGet { account } => (account.as_str(), 0),
            Request::Deposit { account, amount } => (account.as_str(), *amount),
            _ => continue,
        };
        checked += 1;
        let (low, high) = timelines.get(account).map_or((own, own), |(ack, sent)| {
            (
                ack.before(op.invoked_us).saturating_add(own),
                sent.before(op.completed_us),
            )
        });
        if *balance < low || *balance > high {
            anomalies.push(format!(
                "{account}: {} sent at {} to node {} answered balance {balance}, outside \
                 [{low}, {high}] (deposits acknowledged before it was sent{}, and all sent \
                 before it was answered)",
                op.kind().name(),
                secs(op.invoked_us),
                op.node + 1,
                if own > 0 { ", plus its own" } else { "" }
            ));
        }
    }
    CheckResult::new(
        "account reads",
        format!("{checked} balances answered during the soak (reads and deposit replies)"),
        anomalies,
    )
}

// ---------------------------------------------------------------------------------------------
// Counters and sets

fn counters(evidence: &Evidence) -> CheckResult {
    // Per key: (completed, by) of the acknowledged increments, (invoked, by) of those sent.
    let mut increments: BTreeMap<&str, (TimedAmounts, TimedAmounts)> = BTreeMap::new();
    for op in evidence.operations {
        if let Request::CounterIncrement { key, by } = &op.request {
            let (acknowledged, sent) = increments.entry(key.as_str()).or_default();
            match op.outcome {
                Outcome::Ok => {
                    acknowledged.push((op.completed_us, *by));
                    sent.push((op.invoked_us, *by));
                }
                Outcome::Unknown => sent.push((op.invoked_us, *by)),
                Outcome::Failed => {}
            }
        }
    }
    let timelines: BTreeMap<&str, (Timeline, Timeline)> = increments
        .into_iter()
        .map(|(k, (a, s))| (k, (Timeline::new(a), Timeline::new(s))))
        .collect();
    let mut anomalies = Vec::new();
    let mut tally = ReadTally::default();
    for (op, is_final) in answered_reads(evidence) {
        let (Request::CounterRead { key }, Some(Observed::Count(value))) =
            (&op.request, &op.observed)
        else {
            continue;
        };
        tally.add(is_final);
        let (low, high) = count_bounds(
            &timelines,
            key,
            op.invoked_us,
            op.completed_us,
            evidence.memory_losses_us,
        );
        if *value < 0 || (*value as u64) < low || (*value as u64) > high {
            anomalies.push(format!(
                "{} answered {value}, outside [{low}, {high}] (increments acknowledged before \
                 it was sent, and all sent before it was answered)",
                read_label(key, op, is_final)
            ));
        }
    }
    let finals = final_values(evidence.final_reads, OpKind::CounterRead);
    let final_values: Vec<String> = finals
        .iter()
        .map(|(key, values)| {
            let read: BTreeSet<i64> = values
                .iter()
                .filter_map(|(_, v)| match v {
                    Some(Observed::Count(c)) => Some(*c),
                    _ => None,
                })
                .collect();
            // The bounds the final reads are held to.
            let (ack, sent) = count_bounds(
                &timelines,
                key,
                u64::MAX,
                u64::MAX,
                evidence.memory_losses_us,
            );
            format!("{key} {read:?} in [{ack}, {sent}]")
        })
        .collect();
    CheckResult::new(
        "counters",
        format!(
            "{tally}; final values {}{}",
            final_values.join(", "),
            memory_losses_note(evidence.memory_losses_us)
        ),
        anomalies,
    )
}

/// The bounds of a counter read invoked at `invoked_us` and answered at `completed_us`: the
/// increments acknowledged before it was sent (for a memory-only key, only those after its
/// last loss), and all those sent before it was answered.
fn count_bounds(
    timelines: &BTreeMap<&str, (Timeline, Timeline)>,
    key: &str,
    invoked_us: u64,
    completed_us: u64,
    memory_losses_us: &[u64],
) -> (u64, u64) {
    let since = memory_since(key, invoked_us, memory_losses_us);
    timelines.get(key).map_or((0, 0), |(ack, sent)| {
        (
            ack.before(invoked_us).saturating_sub(ack.before(since)),
            sent.before(completed_us),
        )
    })
}

/// One set add: (invoked, completed, outcome).
type Add = (u64, u64, Outcome);

fn sets(evidence: &Evidence) -> CheckResult {
    let mut adds: BTreeMap<&str, BTreeMap<u64, Add>> = BTreeMap::new();
    let mut key_of: BTreeMap<u64, &str> = BTreeMap::new();
    for op in evidence.operations {
        if let Request::SetAdd { key, element } = &op.request {
            adds.entry(key.as_str())
                .or_default()
                .insert(*element, (op.invoked_us, op.completed_us, op.outcome));
            key_of.insert(*element, key.as_str());
        }
    }
    // Per key, the acknowledged adds by completion time.
    let acknowledged: BTreeMap<&str, Vec<(u64, u64)>> = adds
        .iter()
        .map(|(key, elements)| {
            let mut list: Vec<(u64, u64)> = elements
                .iter()
                .filter(|(_, add)| add.2 == Outcome::Ok)
                .map(|(element, add)| (add.1, *element))
                .collect();
            list.sort_unstable();
            (*key, list)
        })
        .collect();
    let mut anomalies = Vec::new();
    let mut tally = ReadTally::default();
    for (op, is_final) in answered_reads(evidence) {
        let (Request::SetRead { key }, Some(Observed::Elements(elements))) =
            (&op.request, &op.observed)
        else {
            continue;
        };
        tally.add(is_final);
        let what = read_label(key, op, is_final);
        let since = memory_since(key, op.invoked_us, evidence.memory_losses_us);
        let missing: Vec<u64> = acknowledged
            .get(key.as_str())
            .into_iter()
            .flatten()
            .take_while(|(completed, _)| *completed < op.invoked_us)
            .filter(|(completed, _)| *completed >= since)
            .filter(|(_, element)| elements.binary_search(element).is_err())
            .map(|(_, element)| *element)
            .collect();
        if !missing.is_empty() {
            anomalies.push(format!(
                "{what} lacks {} adds acknowledged before it was sent: {}",
                missing.len(),
                list(&missing)
            ));
        }
        let mut unexpected = Vec::new();
        for element in elements {
            let add = adds.get(key.as_str()).and_then(|a| a.get(element));
            let why = match add {
                None => match key_of.get(element) {
                    Some(other) => Some(format!("e{element} (added to {other})")),
                    None => Some(format!("e{element} (never added)")),
                },
                Some((_, _, Outcome::Failed)) => Some(format!("e{element} (its add failed)")),
                Some((invoked, _, _)) if *invoked >= op.completed_us => {
                    Some(format!("e{element} (added after the read)"))
                }
                Some(_) => None,
            };
            unexpected.extend(why);
        }
        if !unexpected.is_empty() {
            anomalies.push(format!("{what} holds {}", unexpected.join(", ")));
        }
    }
    let ok: usize = acknowledged.values().map(Vec::len).sum();
    CheckResult::new(
        "sets",
        format!(
            "{} keys, {ok} adds acknowledged; {tally}{}",
            adds.len(),
            memory_losses_note(evidence.memory_losses_us)
        ),
        anomalies,
    )
}

/// The answered reads, those of the soak then the final ones, with whether each is final.
fn answered_reads<'a>(evidence: &Evidence<'a>) -> impl Iterator<Item = (&'a Operation, bool)> {
    let during = evidence.operations.iter().map(|op| (op, false));
    let at_end = evidence.final_reads.iter().map(|op| (op, true));
    during
        .chain(at_end)
        .filter(|(op, _)| op.outcome == Outcome::Ok)
}

/// How a read is named in an anomaly.
fn read_label(key: &str, op: &Operation, is_final: bool) -> String {
    format!(
        "{key}: {}majority read sent at {} to node {}",
        if is_final { "final " } else { "" },
        secs(op.invoked_us),
        op.node + 1
    )
}

/// How many reads a check looked at, during the soak and at its end.
#[derive(Default)]
struct ReadTally {
    during: usize,
    at_end: usize,
}

impl ReadTally {
    fn add(&mut self, is_final: bool) {
        if is_final {
            self.at_end += 1;
        } else {
            self.during += 1;
        }
    }
}

impl std::fmt::Display for ReadTally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} majority reads during the soak and {} at the end",
            self.during, self.at_end
        )
    }
}

fn list(elements: &[u64]) -> String {
    let shown: Vec<String> = elements.iter().take(10).map(|e| format!("e{e}")).collect();
    if elements.len() > shown.len() {
        format!("{} ...", shown.join(" "))
    } else {
        shown.join(" ")
    }
}

// ---------------------------------------------------------------------------------------------
// The cluster

fn single_home(ownership: &OwnershipRecord) -> CheckResult {
    let mut anomalies = Vec::new();
    for sample in &ownership.stable {
        let mut homes: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (node, accounts) in &sample.hosts {
            for account in accounts {
                homes.entry(account.as_str()).or_default().push(*node);
            }
        }
        for (account, nodes) in homes.into_iter().filter(|(_, n)| n.len() > 1) {
            anomalies.push(format!(
                "{account} live on nodes {nodes:?} at once (stable view at {:.1}s)",
                sample.at_ms as f64 / 1000.0
            ));
        }
    }
    CheckResult::new(
        "single home",
        format!(
            "{} stable views sampled ({} attempts skipped as not stable)",
            ownership.stable.len(),
            ownership.unstable
        ),
        anomalies,
    )
}

fn memory(record: &MemoryRecord, rss_bound_bytes: u64) -> CheckResult {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let mut anomalies = Vec::new();
    for node in &record.nodes {
        if node.max_rss_bytes > rss_bound_bytes {
            anomalies.push(format!(
                "node {}: resident set {:.0} MiB above the bound {:.0} MiB",
                node.node,
                mib(node.max_rss_bytes),
                mib(rss_bound_bytes)
            ));
        }
        for (cap, &max) in CAPS.iter().zip(&node.max_gauges) {
            if let Some(limit) = cap.limit
                && max > limit
            {
                anomalies.push(format!(
                    "node {}: {} reached {max}, above {} = {limit}",
                    node.node, cap.name, cap.setting
                ));
            }
        }
    }
    let highest = record.nodes.iter().max_by_key(|n| n.max_rss_bytes);
    let gauges: Vec<String> = CAPS
        .iter()
        .enumerate()
        .map(|(i, cap)| {
            let max = record
                .nodes
                .iter()
                .filter_map(|n| n.max_gauges.get(i))
                .max()
                .copied()
                .unwrap_or(0);
            match cap.limit {
                Some(limit) => format!("{} {max} (cap {limit})", cap.name),
                None => format!("{} {max} ({})", cap.name, cap.setting),
            }
        })
        .collect();
    CheckResult::new(
        "memory",
        format!(
            "largest resident set {:.0} MiB (node {}) against a bound of {:.0} MiB; largest \
             gauges: {}",
            highest.map_or(0.0, |n| mib(n.max_rss_bytes)),
            highest.map_or(0, |n| n.node),
            mib(rss_bound_bytes),
            gauges.join(", ")
        ),
        anomalies,
    )
}

fn nodes(crashes: &[Crash]) -> CheckResult {
    let anomalies = crashes
        .iter()
        .map(|c| {
            format!(
                "node {} (incarnation {}) crashed at {:.1}s: {}",
                c.node,
                c.incarnation,
                c.at_ms as f64 / 1000.0,
                c.status
            )
        })
        .collect();
    CheckResult::new(
        "nodes",
        "every exit was a kill, a SIGTERM, a downing or a removal".into(),
        anomalies,
    )
}

fn liveness(evidence: &Evidence) -> CheckResult {
    let mut anomalies = Vec::new();
    if !evidence.converged {
        anomalies.push(
            "the nodes did not converge into one cluster of all of them, Up and ready, after the \
             faults ended"
                .to_string(),
        );
    }
    let unanswered: Vec<String> = evidence
        .final_reads
        .iter()
        .filter(|op| op.outcome != Outcome::Ok)
        .map(|op| {
            format!(
                "final {} of {} through node {} unanswered: {}",
                op.kind().name(),
                key_of(&op.request),
                op.node + 1,
                op.error.as_deref().unwrap_or("-")
            )
        })
        .collect();
    anomalies.extend(unanswered);
    CheckResult::new(
        "liveness",
        format!(
            "converged after the faults: {}; {} final reads",
            if evidence.converged { "yes" } else { "no" },
            evidence.final_reads.len()
        ),
        anomalies,
    )
}

fn key_of(request: &Request) -> &str {
    match request {
        Request::Deposit { account, .. } | Request::AccountGet { account } => account,
        Request::CounterIncrement { key, .. }
        | Request::CounterRead { key }
        | Request::SetAdd { key, .. }
        | Request::SetRead { key } => key,
    }
}

fn answers(evidence: &Evidence) -> CheckResult {
    let all = evidence.operations.iter().chain(evidence.final_reads);
    let anomalies: Vec<String> = all
        .clone()
        .filter_map(|op| {
            op.malformed.as_ref().map(|m| {
                format!(
                    "{} of {} through node {} at {}: {m}",
                    op.kind().name(),
                    key_of(&op.request),
                    op.node + 1,
                    secs(op.invoked_us)
                )
            })
        })
        .collect();
    CheckResult::new(
        "answers",
        format!(
            "{} answers kept the API's contract",
            all.count() - anomalies.len()
        ),
        anomalies,
    )
}

#[cfg(test)]
mod tests;
