//! A projection over three real nodes while deposits go on through every node: every
//! acknowledged event is handled, in order per log, through the kill of the node running most
//! of its instances; afterwards the handled events are exactly the journal's.

use crate::cluster::{self, wait_until};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera::{AskError, Envelope, HandlerError, Node, NodeBuilder, Projection};
use tessera_example_account::{Account, AccountCommand};
use tessera_journal::slice::SliceRange;
use tessera_journal::{QueryMode, SliceItem, SliceOffset};

const ACCOUNTS: usize = 100;
const CALLERS: usize = 16;

/// Every (persistence id, sequence number) a handler saw, in the order it saw them.
type Handled = Arc<Mutex<Vec<(String, u64)>>>;

fn builder(handled: &Handled) -> NodeBuilder {
    let handled = handled.clone();
    NodeBuilder::new()
        .entity(Account)
        .projection(Projection::at_least_once(
            "seen",
            Account,
            4,
            move |envelope: Envelope<Account>| {
                let handled = handled.clone();
                async move {
                    let mut all = handled.lock().unwrap();
                    all.push((envelope.persistence_id, envelope.sequence_nr));
                    Ok::<(), HandlerError>(())
                }
            },
        ))
}

/// Deposits 1 to random accounts through `node` until `stop`; the balances acknowledged
/// name the events that must be handled (balance `b` is the account's event `b`).
pub async fn deposits(node: tessera::NodeHandle, stop: Arc<AtomicBool>) -> Vec<(String, u64)> {
    let mut acknowledged = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let account = format!("acct-{}", rand::random::<u32>() as usize % ACCOUNTS);
        match node
            .entity_ref::<Account>(account.as_str())
            .ask(AccountCommand::Deposit(1))
            .await
        {
            Ok(balance) => acknowledged.push((format!("account|{account}"), balance.balance)),
            Err(AskError::Rejected(why)) => panic!("a deposit was rejected: {why:?}"),
            Err(AskError::Failed(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    acknowledged
}

/// The acknowledged events of every account, read by slice from `node`.
pub async fn journal_events(node: &Node) -> BTreeSet<(String, u64)> {
    let mut items = node.persistence.journal.events_by_slices(
        "account",
        SliceRange::ALL,
        SliceOffset::start(),
        QueryMode::Current,
    );
    let mut events = BTreeSet::new();
    while let Some(item) = items.next().await {
        match item.expect("the query reads") {
            SliceItem::Event(envelope) => {
                events.insert((
                    envelope.event.persistence_id.to_string(),
                    envelope.event.sequence_nr,
                ));
            }
            SliceItem::Deleted { .. } => panic!("nothing is deleted here"),
        }
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projection_handles_every_acknowledged_event_through_a_node_kill() {
    let dir = tempfile::tempdir().unwrap();
    let handled = Handled::default();
    let (mut nodes, _) = cluster::start(dir.path(), 3, || builder(&handled)).await;
    let instances = |node: &Node| node.daemon_instances("projection.seen").len();
    wait_until("4 projection instances running", || {
        nodes.iter().map(instances).sum::<usize>() == 4
    })
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..CALLERS)
        .map(|i| tokio::spawn(deposits(nodes[i % nodes.len()].handle(), stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The node running most instances is killed; callers through it stop getting answers.
    let busiest = (0..nodes.len())
        .max_by_key(|i| instances(&nodes[*i]))
        .unwrap();
    let killed = nodes.remove(busiest);
    killed.kill().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    let mut acknowledged = BTreeSet::new();
    for caller in callers {
        acknowledged.extend(caller.await.unwrap());
    }
    assert!(
        acknowledged.len() > 500,
        "only {} deposits acknowledged",
        acknowledged.len()
    );

    // Every acknowledged deposit is handled, and what was handled is the journal's.
    let seen = || {
        handled
            .lock()
            .unwrap()
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>()
    };
    for _ in 0..600 {
        if acknowledged.is_subset(&seen()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !acknowledged.is_subset(&seen()) {
        let missing: Vec<_> = acknowledged.difference(&seen()).take(10).cloned().collect();
        for node in &nodes {
            eprintln!(
                "{}: {:#?}",
                node.cluster_address(),
                node.handle().projection_statuses().all()
            );
        }
        panic!(
            "{} acknowledged deposits not handled, e.g. {missing:?}",
            acknowledged.difference(&seen()).count()
        );
    }
    let journal = journal_events(&nodes[0]).await;
    wait_until("every acknowledged event of the journal handled", || {
        journal.is_subset(&seen())
    })
    .await;
    assert!(acknowledged.is_subset(&journal));
    let all = seen();
    assert_eq!(all, journal, "handled events the journal does not hold");

    // Per log, a handler saw each event after the one before it: a run resumes at its
    // saved offset, never past an event not handled.
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    let order = handled.lock().unwrap().clone();
    for (pid, seq) in &order {
        let before = last.entry(pid).or_insert(0);
        assert!(*seq <= *before + 1, "{pid} {seq} handled after {before}");
        *before = *seq;
    }
    let repeats = order.len() - all.len();
    // Repeats come only from what the killed node's instances handled after their last
    // save (at most 100 envelopes or 500 ms each).
    assert!(repeats <= 4 * 2_000, "{repeats} repeats");
    eprintln!(
        "{} handled, {} repeats, {} acknowledged",
        order.len(),
        repeats,
        acknowledged.len()
    );
    for node in nodes {
        node.shutdown().await;
    }
}
