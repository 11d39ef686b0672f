//! The checker on made-up histories: each check passes a history that is right and reports
//! the corruption it exists to catch (the sabotage of the soak's hidden `--sabotage` switch
//! among them).

use super::*;
use crate::memory::NodeMemory;
use crate::ownership::OwnershipSample;

fn op(request: Request, invoked_us: u64, completed_us: u64, outcome: Outcome) -> Operation {
    Operation {
        client: 0,
        node: 0,
        request,
        invoked_us,
        completed_us,
        outcome,
        observed: None,
        error: None,
        malformed: None,
    }
}

fn deposit(account: &str, amount: u64, at: u64, outcome: Outcome) -> Operation {
    op(
        Request::Deposit {
            account: account.into(),
            amount,
        },
        at,
        at + 10,
        outcome,
    )
}

fn read(request: Request, at: u64, observed: Observed) -> Operation {
    Operation {
        observed: Some(observed),
        ..op(request, at, at + 10, Outcome::Ok)
    }
}

fn balance(account: &str, at: u64, balance: u64) -> Operation {
    read(
        Request::AccountGet {
            account: account.into(),
        },
        at,
        Observed::Balance(balance),
    )
}

struct Case {
    operations: Vec<Operation>,
    final_reads: Vec<Operation>,
    ownership: OwnershipRecord,
    memory: MemoryRecord,
    crashes: Vec<Crash>,
    memory_losses_us: Vec<u64>,
    converged: bool,
}

impl Case {
    fn new(operations: Vec<Operation>, final_reads: Vec<Operation>) -> Case {
        Case {
            operations,
            final_reads,
            ownership: OwnershipRecord::default(),
            memory: MemoryRecord::default(),
            crashes: Vec::new(),
            memory_losses_us: Vec::new(),
            converged: true,
        }
    }

    /// The anomalies of the check named `name`.
    fn anomalies(&self, name: &str) -> Vec<String> {
        let results = check(&Evidence {
            operations: &self.operations,
            final_reads: &self.final_reads,
            converged: self.converged,
            ownership: &self.ownership,
            memory: &self.memory,
            rss_bound_bytes: 1 << 30,
            crashes: &self.crashes,
            memory_losses_us: &self.memory_losses_us,
        });
        let result = results
            .into_iter()
            .find(|r| r.name == name)
            .expect("a check of that name");
        assert_eq!(result.anomaly_count, result.anomalies.len());
        result.anomalies
    }
}

#[test]
fn subset_sums_agree_with_brute_force() {
    let amounts = [3u64, 5, 11, 17, 40, 41, 97];
    let sums = SubsetSums::new(&amounts).expect("few amounts");
    for target in 0..=220u64 {
        let brute = (0..1u32 << amounts.len()).any(|mask| {
            let sum: u64 = (0..amounts.len())
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| amounts[i])
                .sum();
            sum == target
        });
        assert_eq!(sums.contains(target), brute, "target {target}");
    }
    assert!(SubsetSums::new(&[1; MAX_EXACT_UNKNOWNS + 1]).is_none());
}

#[test]
fn a_balance_of_acknowledged_plus_some_unknown_deposits_passes() {
    let operations = vec![
        deposit("a", 1_000, 0, Outcome::Ok),
        deposit("a", 20_000, 100, Outcome::Unknown),
        deposit("a", 300_000, 200, Outcome::Unknown),
        deposit("a", 4_000_000, 300, Outcome::Failed),
    ];
    // The second unknown deposit applied, the first not.
    let finals = vec![balance("a", 1_000, 301_000)];
    assert!(
        Case::new(operations, finals)
            .anomalies("deposits")
            .is_empty()
    );
}

#[test]
fn a_doubled_deposit_is_found_and_named() {
    let operations = vec![
        deposit("a", 1_000, 0, Outcome::Ok),
        deposit("a", 20_000, 100, Outcome::Ok),
        deposit("a", 300_000, 200, Outcome::Unknown),
    ];
    let finals = vec![balance("a", 1_000, 41_000)];
    let anomalies = Case::new(operations, finals).anomalies("deposits");
    assert_eq!(anomalies.len(), 1, "{anomalies:?}");
    assert!(
        anomalies[0].contains("applied twice: acknowledged deposit 20000"),
        "{anomalies:?}"
    );
}

#[test]
fn the_sabotaged_double_count_of_an_acknowledged_deposit_is_found() {
    // What `--sabotage double-deposit` does: the history lists an acknowledged deposit twice,
    // so the balance lacks one of them.
    let once = deposit("a", 1_000, 0, Outcome::Ok);
    let operations = vec![once.clone(), once, deposit("a", 7, 50, Outcome::Unknown)];
    let finals = vec![balance("a", 1_000, 1_007)];
    let anomalies = Case::new(operations, finals).anomalies("deposits");
    assert_eq!(anomalies.len(), 1, "{anomalies:?}");
    assert!(anomalies[0].contains("lost"), "{anomalies:?}");
}

#[test]
fn a_lost_deposit_and_an_applied_failed_one_are_found() {
    let operations = vec![
        deposit("a", 1_000, 0, Outcome::Ok),
        deposit("a", 20_000, 100, Outcome::Ok),
        deposit("b", 5, 0, Outcome::Ok),
        deposit("b", 600, 100, Outcome::Failed),
    ];
    let finals = vec![balance("a", 1_000, 20_000), balance("b", 1_000, 605)];
    let anomalies = Case::new(operations, finals).anomalies("deposits");
    assert_eq!(anomalies.len(), 2, "{anomalies:?}");
    assert!(anomalies[0].contains("lost: acknowledged deposit 1000"));
    assert!(anomalies[1].contains("applied although it failed: deposit 600"));
}

#[test]
fn nodes_that_disagree_on_a_final_balance_are_found() {
    let operations = vec![deposit("a", 10, 0, Outcome::Unknown)];
    let mut other = balance("a", 1_000, 10);
    other.node = 1;
    let finals = vec![balance("a", 1_000, 0), other];
    let anomalies = Case::new(operations, finals).anomalies("deposits");
    assert_eq!(anomalies.len(), 1, "{anomalies:?}");
    assert!(anomalies[0].contains("different balances"));
}

#[test]
fn more_unknown_deposits_than_the_exact_check_takes_are_checked_by_bounds() {
    let mut operations: Vec<Operation> = (1..=MAX_EXACT_UNKNOWNS as u64 + 5)
        .map(|i| deposit("a", i * 1_000, i, Outcome::Unknown))
        .collect();
    operations.push(deposit("a", 1, 0, Outcome::Ok));
    let within = vec![balance("a", 1_000_000, 3_001)];
    assert!(
        Case::new(operations.clone(), within)
            .anomalies("deposits")
            .is_empty()
    );
    let beyond = vec![balance("a", 1_000_000, 0)];
    assert_eq!(Case::new(operations, beyond).anomalies("deposits").len(), 1);
}

#[test]
fn a_stale_or_invented_balance_read_is_found() {
    let operations = vec![
        deposit("a", 100, 0, Outcome::Ok),         // acknowledged at 10
        deposit("a", 5_000, 50, Outcome::Unknown), // sent at 50
        balance("a", 20, 100),                     // sees the first: fine
        balance("a", 30, 0),                       // sent after the first was acknowledged: stale
        balance("a", 35, 5_100),                   // the unknown one, before it was sent: invented
        balance("a", 60, 5_100),                   // the unknown one, concurrent: fine
    ];
    let anomalies = Case::new(operations, Vec::new()).anomalies("account reads");
    assert_eq!(anomalies.len(), 2, "{anomalies:?}");
    assert!(anomalies[0].contains("answered balance 0"));
    assert!(anomalies[1].contains("answered balance 5100"));
}

#[test]
fn a_deposit_reply_must_include_the_deposit_itself() {
    let mut reply = deposit("a", 100, 0, Outcome::Ok);
    reply.observed = Some(Observed::Balance(0));
    let anomalies = Case::new(vec![reply], Vec::new()).anomalies("account reads");
    assert_eq!(anomalies.len(), 1, "{anomalies:?}");
}

fn increment(key: &str, by: u64, at: u64, outcome: Outcome) -> Operation {
    op(
        Request::CounterIncrement {
            key: key.into(),
            by,
        },
        at,
        at + 10,
        outcome,
    )
}

fn count(key: &str, at: u64, value: i64) -> Operation {
    read(
        Request::CounterRead { key: key.into() },
        at,
        Observed::Count(value),
    )
}

#[test]
fn counters_must_hold_every_acknowledged_increment_and_nothing_failed() {
    let operations = vec![
        increment("c", 2, 0, Outcome::Ok),
        increment("c", 3, 100, Outcome::Unknown),
        increment("c", 50, 200, Outcome::Failed),
        count("c", 5, 0),  // concurrent with the first: fine
        count("c", 50, 0), // after the first was acknowledged: stale
    ];
    let fine = vec![count("c", 1_000, 2), count("c", 1_000, 5)];
    let case = Case::new(operations.clone(), fine);
    let anomalies = case.anomalies("counters");
    assert_eq!(anomalies.len(), 1, "{anomalies:?}");
    assert!(
        anomalies[0].contains("answered 0, outside [2, 2]"),
        "{anomalies:?}"
    );
    let wrong = vec![count("c", 1_000, 1), count("c", 1_000, 55)];
    assert_eq!(Case::new(operations, wrong).anomalies("counters").len(), 3);
}

#[test]
fn the_sabotaged_extra_increment_is_found() {
    let mut operations = vec![increment("c", 2, 0, Outcome::Ok)];
    let mut extra = operations[0].clone();
    extra.request = Request::CounterIncrement {
        key: "c".into(),
        by: 1_000,
    };
    operations.push(extra);
    let anomalies = Case::new(operations, vec![count("c", 1_000, 2)]).anomalies("counters");
    assert_eq!(anomalies.len(), 1, "{anomalies:?}");
}

/// A nemesis event at `at_ms`.
fn event(kind: EventKind, nodes: &[usize], at_ms: u64) -> Event {
    Event {
        at_ms,
        kind,
        nodes: nodes.to_vec(),
        detail: String::new(),
    }
}

#[test]
fn memory_only_keys_are_lost_when_the_last_process_holding_them_ends() {
    let events = vec![
        event(EventKind::Kill, &[1], 1),
        event(EventKind::Pause, &[2], 2),
        event(EventKind::Restart, &[1], 3),
        event(EventKind::Kill, &[1, 3], 4),
        event(EventKind::Downed, &[2], 5),
        event(EventKind::Restart, &[3], 6),
        event(EventKind::Restart, &[1], 7),
        event(EventKind::Left, &[1], 8),
    ];
    // Node 2, paused, still held them until its downing; node 3 then starts from nothing and
    // holds what comes after, so node 1's leave loses nothing.
    assert_eq!(memory_losses(&events, 3), vec![5_000]);
    assert!(memory_losses(&events[..4], 3).is_empty());
}

#[test]
fn a_restarted_node_holds_the_memory_only_keys_once_gossip_could_reach_it() {
    let h = HOLDER_AFTER_MS;
    let restart_then_kill_the_rest = |extra: Vec<Event>| {
        let mut events = vec![
            event(EventKind::Kill, &[1], 0),
            event(EventKind::Restart, &[1], 1_000),
        ];
        events.extend(extra);
        events.push(event(EventKind::Kill, &[2, 3], 1_000 + h + 1));
        memory_losses(&events, 3)
    };
    // Connected to the holders for long enough: it holds them, nothing is lost.
    assert!(restart_then_kill_the_rest(vec![]).is_empty());
    // Cut off from them, or paused, from just after its start: it never learned them, so
    // the others' end is a loss although it still runs.
    let cut = vec![event(EventKind::Partition, &[1], 1_001)];
    assert_eq!(
        restart_then_kill_the_rest(cut),
        vec![(1_000 + h + 1) * 1000]
    );
    let paused = vec![event(EventKind::Pause, &[1], 1_001)];
    assert_eq!(
        restart_then_kill_the_rest(paused),
        vec![(1_000 + h + 1) * 1000]
    );
    // A heal starts its clock again: not yet long enough.
    let healed = vec![
        event(EventKind::Partition, &[1], 1_001),
        event(EventKind::Heal, &[1], 1_002),
    ];
    assert_eq!(
        restart_then_kill_the_rest(healed),
        vec![(1_000 + h + 1) * 1000]
    );
    // Holders paused all the while cannot teach it either.
    let holders_paused = vec![event(EventKind::Pause, &[2, 3], 1_001)];
    assert_eq!(
        restart_then_kill_the_rest(holders_paused),
        vec![(1_000 + h + 1) * 1000]
    );
}

/// Seen by `tessera soak`, seed 10: node 1 is cut off, the four others are downed and start
/// again empty, and node 1 is downed before the partition heals. Not every node was down at
/// once, but no process that held the keys was left.
#[test]
fn a_loss_without_every_node_down_at_once() {
    let events = vec![
        event(EventKind::Partition, &[1], 210_725),
        event(EventKind::Downed, &[2, 3, 4, 5], 213_054),
        event(EventKind::Restart, &[2, 3, 4, 5], 213_300),
        event(EventKind::Downed, &[1], 214_539),
        event(EventKind::Heal, &[1], 216_075),
        event(EventKind::Restart, &[1], 216_166),
        event(EventKind::Kill, &[2, 3], 230_000),
    ];
    assert_eq!(memory_losses(&events, 5), vec![214_539_000]);
}

#[test]
fn memory_only_keys_may_forget_what_a_loss_took_and_durable_keys_may_not() {
    let operations = vec![
        increment("c", 2, 0, Outcome::Ok),
        increment("d-c", 2, 0, Outcome::Ok),
        add("s", 1, 0, Outcome::Ok),
        add("d-s", 2, 0, Outcome::Ok),
        increment("c", 3, 2_000, Outcome::Ok),
        add("s", 3, 2_000, Outcome::Ok),
    ];
    let after = vec![
        count("c", 5_000, 3),
        count("d-c", 5_000, 0),
        elements("s", 5_000, &[3]),
        elements("d-s", 5_000, &[]),
    ];
    let mut case = Case::new(operations.clone(), after.clone());
    // Without a loss, all four lost what they held.
    assert_eq!(case.anomalies("counters").len(), 2);
    assert_eq!(case.anomalies("sets").len(), 2);
    // With one before the later writes, only the durable keys' losses are anomalies,
    case.memory_losses_us = vec![1_000];
    let counters = case.anomalies("counters");
    assert_eq!(counters.len(), 1, "{counters:?}");
    assert!(counters[0].starts_with("d-c:"), "{counters:?}");
    let sets = case.anomalies("sets");
    assert_eq!(sets.len(), 1, "{sets:?}");
    assert!(sets[0].starts_with("d-s:"), "{sets:?}");
    // and what was acknowledged after it must still be there.
    let lost_after = vec![count("c", 5_000, 0), elements("s", 5_000, &[])];
    let mut case = Case::new(operations, lost_after);
    case.memory_losses_us = vec![1_000];
    assert_eq!(case.anomalies("counters").len(), 1);
    assert_eq!(case.anomalies("sets").len(), 1);
}

fn add(key: &str, element: u64, at: u64, outcome: Outcome) -> Operation {
    op(
        Request::SetAdd {
            key: key.into(),
            element,
        },
        at,
        at + 10,
        outcome,
    )
}

fn elements(key: &str, at: u64, elements: &[u64]) -> Operation {
    read(
        Request::SetRead { key: key.into() },
        at,
        Observed::Elements(elements.to_vec()),
    )
}

#[test]
fn sets_must_hold_every_acknowledged_add_and_nothing_else() {
    let operations = vec![
        add("s", 1, 0, Outcome::Ok),
        add("s", 2, 100, Outcome::Unknown),
        add("s", 3, 200, Outcome::Failed),
        add("t", 4, 500, Outcome::Ok),
        elements("s", 5, &[]),    // concurrent with the first add: fine
        elements("s", 300, &[1]), // the unknown one did not apply: fine
    ];
    let fine = vec![elements("s", 1_000, &[1, 2]), elements("t", 1_000, &[4])];
    assert!(
        Case::new(operations.clone(), fine)
            .anomalies("sets")
            .is_empty()
    );
    // The sabotaged drop of an acknowledged add, a failed add, one of another set, one never
    // made, and one read before its add was sent.
    let wrong = vec![
        elements("s", 1_000, &[2]),
        elements("s", 1_000, &[1, 3, 4, 9]),
        elements("t", 50, &[4]),
    ];
    let anomalies = Case::new(operations, wrong).anomalies("sets");
    assert_eq!(anomalies.len(), 3, "{anomalies:?}");
    assert!(anomalies[0].contains("lacks 1 adds acknowledged before it was sent: e1"));
    assert!(anomalies[1].contains("e3 (its add failed)"));
    assert!(anomalies[1].contains("e4 (added to t)"));
    assert!(anomalies[1].contains("e9 (never added)"));
    assert!(anomalies[2].contains("e4 (added after the read)"));
}

#[test]
fn an_account_on_two_nodes_in_a_stable_view_is_found() {
    let mut case = Case::new(Vec::new(), Vec::new());
    let hosts = |lists: &[&[&str]]| {
        lists
            .iter()
            .enumerate()
            .map(|(i, l)| (i + 1, l.iter().map(|s| s.to_string()).collect()))
            .collect()
    };
    case.ownership.stable.push(OwnershipSample {
        at_ms: 1_000,
        hosts: hosts(&[&["a", "b"], &["c"]]),
    });
    assert!(case.anomalies("single home").is_empty());
    case.ownership.stable.push(OwnershipSample {
        at_ms: 3_000,
        hosts: hosts(&[&["a", "b"], &["b", "c"]]),
    });
    let anomalies = case.anomalies("single home");
    assert_eq!(
        anomalies,
        vec!["b live on nodes [1, 2] at once (stable view at 3.0s)"]
    );
}

#[test]
fn memory_above_its_bound_or_a_cap_is_found() {
    let mut case = Case::new(Vec::new(), Vec::new());
    case.memory.nodes.push(NodeMemory {
        node: 1,
        max_rss_bytes: 200 << 20,
        max_gauges: vec![10; CAPS.len()],
        samples: 3,
    });
    assert!(case.anomalies("memory").is_empty());
    case.memory.nodes[0].max_rss_bytes = 2 << 30;
    case.memory.nodes[0].max_gauges[0] = 100_001;
    let anomalies = case.anomalies("memory");
    assert_eq!(anomalies.len(), 2, "{anomalies:?}");
    assert!(anomalies[0].contains("resident set 2048 MiB above the bound 1024 MiB"));
    assert!(anomalies[1].contains("live entities reached 100001"));
}

#[test]
fn crashes_no_convergence_unanswered_final_reads_and_malformed_answers_are_found() {
    let mut unanswered = op(
        Request::AccountGet {
            account: "a".into(),
        },
        0,
        10,
        Outcome::Unknown,
    );
    unanswered.error = Some("timed out".into());
    let mut malformed = count("c", 0, 1);
    malformed.malformed = Some("counter without a value".into());
    let mut case = Case::new(vec![malformed], vec![unanswered]);
    case.converged = false;
    case.crashes.push(Crash {
        at_ms: 5_000,
        node: 2,
        incarnation: 3,
        status: "exit status 101".into(),
    });
    assert_eq!(case.anomalies("nodes").len(), 1);
    assert_eq!(case.anomalies("liveness").len(), 2);
    assert_eq!(case.anomalies("answers").len(), 1);
}
