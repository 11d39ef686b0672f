//! The runtime on the real RocksDB journal and snapshot store: restart on the same directories,
//! snapshot retention through `delete_matching`, and event deletion through `delete_to`.

mod support;

use std::sync::Arc;
use support::{Tally, TallyCommand};
use tessera_entities::{EntityConfig, EntityHost};
use tessera_journal::{FsyncPolicy, Journal, JournalConfig, RocksJournal};
use tessera_snapshot::{
    RocksSnapshotStore, SnapshotConfig, SnapshotSelectionCriteria, SnapshotStore,
};

struct Stores {
    journal: Arc<RocksJournal>,
    snapshots: Arc<RocksSnapshotStore>,
}

async fn open(dir: &std::path::Path) -> Stores {
    let mut journal = JournalConfig::new(dir.join("journal"));
    journal.fsync = FsyncPolicy::Never;
    let mut snapshots = SnapshotConfig::new(dir.join("snapshots"));
    snapshots.fsync = FsyncPolicy::Never;
    Stores {
        journal: Arc::new(RocksJournal::open(journal).await.unwrap()),
        snapshots: Arc::new(RocksSnapshotStore::open(snapshots).await.unwrap()),
    }
}

fn start_host(stores: &Stores, config: EntityConfig) -> EntityHost<Tally> {
    EntityHost::start(
        Tally,
        stores.journal.clone(),
        stores.snapshots.clone(),
        config,
    )
    .unwrap()
}

async fn close(stores: Stores) {
    drop(stores.snapshots);
    if let Ok(journal) = Arc::try_unwrap(stores.journal) {
        journal.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_a_restart_on_rocksdb_with_retention_applied() {
    let dir = tempfile::tempdir().unwrap();
    let config = EntityConfig {
        snapshot_every: 10,
        keep_snapshots: 2,
        delete_events_on_snapshot: true,
        ..support::config()
    };
    let stores = open(dir.path()).await;
    let host = start_host(&stores, config.clone());
    let asks: Vec<_> = (0..47)
        .map(|_| host.ask("r", TallyCommand::Add(2)))
        .collect();
    for ask in asks {
        ask.await.unwrap();
    }
    host.shutdown().await;
    drop(host);

    // Concurrent commands: a snapshot that comes due while the previous one is still being
    // saved is taken right after it, of the state then, so sequence numbers need not be
    // multiples; retention still keeps only the last two multiples' worth.
    let latest = stores
        .snapshots
        .load("tally|r", SnapshotSelectionCriteria::latest())
        .await
        .unwrap()
        .unwrap();
    assert!(
        (40..=47).contains(&latest.metadata.sequence_nr),
        "{latest:?}"
    );
    assert!(
        stores
            .snapshots
            .load("tally|r", SnapshotSelectionCriteria::up_to(29))
            .await
            .unwrap()
            .is_none(),
        "snapshots below the second-to-last multiple are deleted"
    );
    use futures::StreamExt;
    let first = stores
        .journal
        .replay("tally|r", 1, u64::MAX, 1)
        .next()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.sequence_nr, 30, "events up to 29 deleted");
    close(stores).await;

    let stores = open(dir.path()).await;
    let host = start_host(&stores, config);
    assert_eq!(host.ask("r", TallyCommand::Get).await, Ok(94));
    assert_eq!(host.ask("r", TallyCommand::Add(1)).await, Ok(95));
    host.shutdown().await;
    drop(host);
    close(stores).await;
}
