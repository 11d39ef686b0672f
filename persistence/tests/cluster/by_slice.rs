//! Events by slice across three nodes: every acknowledged event of the type, each log in
//! order, from any node; the slice ranges of four instances divide them exactly; a resume
//! from an offset goes on after it; a live query sees later writes.

use super::{cluster, cluster_on, settings, write};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tessera_journal::slice::SliceRange;
use tessera_journal::{Journal, QueryMode, SliceItem, SliceOffset};
use tessera_persistence::ReplicatedJournal;

async fn collect_current(
    journal: &ReplicatedJournal,
    slices: SliceRange,
    offset: SliceOffset,
) -> Vec<(String, u64, String)> {
    let stream = journal.events_by_slices("acct", slices, offset, QueryMode::Current);
    tokio::time::timeout(Duration::from_secs(20), stream.collect::<Vec<_>>())
        .await
        .expect("a current query ends")
        .into_iter()
        .map(|item| match item.expect("no error") {
            SliceItem::Event(e) => (
                e.event.persistence_id.to_string(),
                e.event.sequence_nr,
                String::from_utf8(e.event.payload.to_vec()).unwrap(),
            ),
            other => panic!("nothing was deleted: {other:?}"),
        })
        .collect()
}

fn per_log(items: &[(String, u64, String)]) -> BTreeMap<String, Vec<u64>> {
    let mut logs: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (pid, seq, _) in items {
        logs.entry(pid.clone()).or_default().push(*seq);
    }
    logs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_by_slice_come_from_every_node_in_order_and_resume_after_an_offset() {
    from_every_node(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_by_slice_on_rocksdb_stores() {
    from_every_node(true).await;
}

async fn from_every_node(rocks: bool) {
    let (_network, nodes) = cluster_on(3, settings(), rocks).await;
    // 24 logs of the type, written from all three nodes, and one of another type.
    for i in 0..24u64 {
        let journal = &nodes[(i % 3) as usize].persistence.journal;
        let pid = format!("acct|{i}");
        for seq in 1..=3 {
            journal
                .append(write(&pid, seq, &format!("{pid}#{seq}")))
                .await
                .unwrap();
        }
    }
    nodes[0]
        .persistence
        .journal
        .append(write("other|1", 1, "other"))
        .await
        .unwrap();
    let everything = collect_current(
        &nodes[2].persistence.journal,
        SliceRange::ALL,
        SliceOffset::start(),
    )
    .await;
    let logs = per_log(&everything);
    assert_eq!(logs.len(), 24, "every log of the type, none of another");
    for (pid, seqs) in &logs {
        assert_eq!(seqs, &vec![1, 2, 3], "{pid} in order, each once");
    }
    for (pid, seq, payload) in &everything {
        assert_eq!(payload, &format!("{pid}#{seq}"));
    }

    // Four instances' ranges divide them exactly.
    let mut union = BTreeSet::new();
    for range in SliceRange::split(4).unwrap() {
        for (pid, seq, _) in
            collect_current(&nodes[1].persistence.journal, range, SliceOffset::start()).await
        {
            assert!(range.holds(&pid));
            assert!(union.insert((pid, seq)), "each event in one range only");
        }
    }
    assert_eq!(union.len(), 72);

    // Resumed after an offset: only what follows it.
    let mut offset = SliceOffset::start();
    offset.advance("acct|0", 2);
    offset.advance("acct|1", 3);
    let resumed = collect_current(&nodes[0].persistence.journal, SliceRange::ALL, offset).await;
    let logs = per_log(&resumed);
    assert_eq!(logs.get("acct|0"), Some(&vec![3]));
    assert_eq!(logs.get("acct|1"), None);
    assert_eq!(resumed.len(), 72 - 2 - 3);
}

async fn next(live: &mut tessera_journal::JournalStream<SliceItem>) -> (String, u64) {
    match tokio::time::timeout(Duration::from_secs(10), live.next()).await {
        Ok(Some(Ok(SliceItem::Event(e)))) => {
            (e.event.persistence_id.to_string(), e.event.sequence_nr)
        }
        other => panic!("expected an event, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_query_by_slice_sees_later_writes_soon() {
    let (_network, nodes) = cluster(3).await;
    nodes[0]
        .persistence
        .journal
        .append(write("acct|a", 1, "first"))
        .await
        .unwrap();
    let mut live = nodes[1].persistence.journal.events_by_slices(
        "acct",
        SliceRange::ALL,
        SliceOffset::start(),
        QueryMode::Live,
    );
    assert_eq!(next(&mut live).await, ("acct|a".to_string(), 1));
    // A write after the query started, on another node, to a new log and to the old one.
    nodes[2]
        .persistence
        .journal
        .append(write("acct|b", 1, "second"))
        .await
        .unwrap();
    nodes[0]
        .persistence
        .journal
        .append(write("acct|a", 2, "third"))
        .await
        .unwrap();
    let mut later = BTreeSet::new();
    later.insert(next(&mut live).await);
    later.insert(next(&mut live).await);
    assert_eq!(
        later,
        BTreeSet::from([("acct|a".to_string(), 2), ("acct|b".to_string(), 1)])
    );
}

/// A writer that stored an event on its replicas and died before telling them it was
/// acknowledged: no entity writes the log again, yet the maintenance scan recovers it once
/// the tail stayed as it was for its grace, and the query by slice then delivers the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_left_above_the_mark_is_settled_and_then_delivered() {
    use bytes::Bytes;
    use tessera_journal::StoredEvent;
    use tessera_replication::{Entry, Request, Response};

    let mut settings = settings();
    settings.writers.writer_idle_timeout = Duration::from_millis(300);
    settings.maintenance.stuck_tail_grace = Duration::from_millis(500);
    let (_network, nodes) = cluster_on(3, settings, false).await;
    let pid = "acct|left";
    nodes[0]
        .persistence
        .journal
        .append(write(pid, 1, "told"))
        .await
        .unwrap();
    let holders: Vec<_> = nodes
        .iter()
        .filter(|n| n.store.meta(pid).is_some())
        .collect();
    assert!(holders.len() >= 2, "the log has its replicas");
    // The writer tells its replicas the mark soon after the acknowledgement.
    for _ in 0..100 {
        if holders.iter().all(|n| n.store.meta(pid).unwrap().lac == 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Entry 2 as its writer sent it, on every replica, without the mark that would follow.
    for node in &holders {
        let meta = node.store.meta(pid).unwrap();
        let event = StoredEvent {
            timestamp_ms: 1,
            writer_id: "w".into(),
            manifest: "test".into(),
            manifest_version: 1,
            payload: Bytes::from_static(b"untold"),
            tags: Vec::new(),
        };
        let answer = tessera_persistence::ReplicaStore::apply(
            node.store.as_ref(),
            pid,
            Request::Append {
                epoch: meta.promise,
                prev: meta.last,
                entries: vec![Entry {
                    seq: 2,
                    epoch: meta.promise,
                    payload: event,
                }],
                lac: meta.lac,
                config: None,
            },
        )
        .await
        .unwrap();
        assert!(matches!(answer, Response::Appended { .. }), "{answer:?}");
        assert_eq!(node.store.meta(pid).unwrap().lac, 1);
    }
    let mut live = nodes[1].persistence.journal.events_by_slices(
        "acct",
        SliceRange::ALL,
        SliceOffset::start(),
        QueryMode::Live,
    );
    assert_eq!(next(&mut live).await, (pid.to_string(), 1));
    // The writer goes idle and is dropped; the scan finds the tail unchanged, recovers the
    // log, and its replicas learn entry 2 is acknowledged (W of them held it).
    assert_eq!(next(&mut live).await, (pid.to_string(), 2));
    assert!(holders.iter().any(|n| n.store.meta(pid).unwrap().lac == 2));
}
