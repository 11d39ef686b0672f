//! The event journal and the snapshot store on their own, without a cluster: the book's
//! snippet, included from between the `ANCHOR:` markers (so it compiles).
//!
//! In a temporary directory: appends an event, replays it, finds it by tag, saves and loads a
//! snapshot, and deletes the event the snapshot covers: `cargo run --release --example journal`.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("tessera-example-journal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    // ANCHOR: journal
    use bytes::Bytes;
    use futures::StreamExt;
    use std::time::{SystemTime, UNIX_EPOCH};
    use tessera_journal::{
        AtomicWrite, Journal, JournalConfig, Manifest, NewEvent, QueryMode, RocksJournal,
    };
    use tessera_snapshot::{
        RocksSnapshotStore, SnapshotConfig, SnapshotMetadata, SnapshotSelectionCriteria,
        SnapshotStore,
    };

    let journal = RocksJournal::open(JournalConfig::new(dir.join("journal"))).await?; // fsync = always
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
    let events = vec![NewEvent {
        sequence_nr: 1, // the log's highest + 1, then consecutive: all are stored or none
        timestamp_ms: now_ms,
        manifest: Manifest::new("order.Placed", 1), // the payload's type and encoding version
        payload: Bytes::from_static(br#"{"total": 42}"#),
        tags: vec!["orders".to_string()],
    }];
    let write = AtomicWrite {
        persistence_id: "order-1".into(),
        writer_id: "w1".into(),
        events,
    };
    journal.append(write).await?;
    let mut replay = journal.replay("order-1", 1, u64::MAX, u64::MAX); // stream of PersistentRepr
    while let Some(event) = replay.next().await {
        println!("order-1 #{}", event?.sequence_nr); // also manifest, payload, writer_id...
    }
    let highest = journal.highest_sequence_nr("order-1").await?;
    let mut by_tag = journal.events_by_tag("orders", 0, QueryMode::Current); // Live: never ends
    let tagged = by_tag.next().await.transpose()?; // Option<EventEnvelope { offset, event, tags }>
    let snapshots = RocksSnapshotStore::open(SnapshotConfig::new(dir.join("snapshots"))).await?;
    let metadata = SnapshotMetadata {
        persistence_id: "order-1".into(),
        sequence_nr: highest,
        timestamp_ms: now_ms,
    };
    let state = Bytes::from_static(b"placed");
    snapshots
        .save(metadata, Manifest::new("order.State", 1), state)
        .await?;
    let criteria = SnapshotSelectionCriteria::latest();
    let latest = snapshots.load("order-1", criteria).await?; // Option<Snapshot>
    journal.delete_to("order-1", highest).await?; // highest_sequence_nr never decreases
    // ANCHOR_END: journal

    let envelope = tagged.ok_or("no event tagged orders")?;
    println!(
        "tagged {:?} at offset {}: {}",
        envelope.tags, envelope.offset, envelope.event.persistence_id
    );
    let snapshot = latest.ok_or("no snapshot of order-1")?;
    println!(
        "latest snapshot of order-1: #{}",
        snapshot.metadata.sequence_nr
    );
    let after_delete = journal
        .replay("order-1", 1, u64::MAX, u64::MAX)
        .count()
        .await;
    let highest_after_delete = journal.highest_sequence_nr("order-1").await?;
    println!("after delete_to: {after_delete} events, highest {highest_after_delete}");
    assert_eq!((after_delete, highest_after_delete), (0, highest));

    drop((by_tag, replay));
    journal.close().await;
    drop(snapshots);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
