//! Fenced appends: a write made with the epoch `open_fenced` returned is taken only while
//! that very writer holds the log as it opened it — not after another node opened the log,
//! and not after a new writer on the same node recovered it again; but across the writer's
//! own moves of the log off a member that left.

use super::{cluster, payloads, start_moving_off_a_member, write};
use std::time::Duration;
use tessera_cluster::transport::Transport;
use tessera_journal::Journal;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_append_is_refused_once_its_writer_was_replaced_anywhere() {
    let (_network, nodes) = cluster(3).await;
    let pid = "#fenced|1";
    let first = &nodes[0].persistence.journal;
    let second = &nodes[1].persistence.journal;

    let opened = first.open_fenced(pid).await.unwrap();
    assert_eq!(opened.highest, 0);
    first
        .append_fenced(write(pid, 1, "first-1"), opened.epoch)
        .await
        .expect("its own writer takes it");

    // Another node opens the log: its writer recovers it and fences the first.
    let successor = second.open_fenced(pid).await.unwrap();
    assert_eq!(successor.highest, 1);
    assert!(successor.epoch > opened.epoch);
    let late = first
        .append_fenced(write(pid, 2, "first-late"), opened.epoch)
        .await;
    assert!(
        late.is_err(),
        "a fenced writer's append was taken: {late:?}"
    );
    second
        .append_fenced(write(pid, 2, "second-2"), successor.epoch)
        .await
        .expect("the successor writes");

    // A plain read on the first node makes a new writer there, which takes the log over
    // again: the epoch opened before on this node must not come back to life with it.
    assert_eq!(first.highest_sequence_nr(pid).await.unwrap(), 2);
    let stale = first
        .append_fenced(write(pid, 3, "first-stale"), opened.epoch)
        .await;
    assert!(
        stale.is_err(),
        "an append with the epoch of a replaced writer was taken by a new one: {stale:?}"
    );
    let displaced = second
        .append_fenced(write(pid, 3, "second-displaced"), successor.epoch)
        .await;
    assert!(displaced.is_err(), "{displaced:?}");

    assert_eq!(
        payloads(nodes[2].persistence.journal.as_ref(), pid).await,
        vec!["first-1", "second-2"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_append_is_taken_across_its_writers_move_of_the_log() {
    let (network, nodes) = cluster(4).await;
    let pid = "#fenced|moves";
    let journal = nodes[0].persistence.journal.clone();
    let here = nodes[0].transport.local().address.clone();
    let opened = journal.open_fenced(pid).await.unwrap();
    journal
        .append_fenced(write(pid, 1, "before"), opened.epoch)
        .await
        .unwrap();
    // Slow messages make the move long enough for a save to arrive during it.
    let gone = start_moving_off_a_member(&network, &nodes, pid, Duration::from_millis(100)).await;
    // Asked while the writer recovers the log under a new epoch of its own: it waits, and
    // is taken once the writer serves again, as is the next.
    journal
        .append_fenced(write(pid, 2, "during"), opened.epoch)
        .await
        .expect("a save during the writer's own move is taken");
    journal
        .append_fenced(write(pid, 3, "after"), opened.epoch)
        .await
        .expect("a save after the writer's own move is taken");
    let status = journal.writer_status(pid).await.unwrap();
    assert!(status.epoch > Some(opened.epoch), "{status:?}");
    assert!(
        !status
            .config
            .unwrap()
            .members
            .iter()
            .any(|m| m.address == gone),
        "the log did not move off {gone}"
    );
    let other = nodes
        .iter()
        .find(|n| n.transport.local().address != here && n.transport.local().address != gone)
        .unwrap();
    assert_eq!(
        payloads(other.persistence.journal.as_ref(), pid).await,
        vec!["before", "during", "after"]
    );
}
