//! Exactly-once projections into a real PostgreSQL server: over three nodes with deposits
//! going on and the node running most instances killed, the read model holds exactly the
//! journal's events, none missing, none twice; and a commit with the fence of an instance
//! whose slot was taken is refused, its effect rolled back, as is a group committed again.

use crate::cluster::{self, wait_until};
use crate::projection::{deposits, journal_events};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tessera::{Envelope, Node, NodeBuilder, Projection};
use tessera_example_account::Account;
use tessera_harness::postgres::PostgresServer;
use tessera_projection_postgres::{
    CommitError, Fence, InstanceKey, OffsetCommit, Pool, PostgresOffsets, PostgresOffsetsError,
    commit_offsets,
};

const CALLERS: usize = 16;

/// The read model: one row per event handled, with no key that would hide a second one.
const CREATE_READ_MODEL: &str =
    "CREATE TABLE deposits_seen (persistence_id text NOT NULL, sequence_nr bigint NOT NULL)";

fn builder(offsets: &PostgresOffsets, pool: &Pool) -> NodeBuilder {
    let pool = pool.clone();
    NodeBuilder::new()
        .entity(Account)
        .projection(Projection::exactly_once(
            "model",
            Account,
            4,
            64,
            offsets.clone(),
            move |envelopes: Vec<Envelope<Account>>, commit: OffsetCommit| {
                let pool = pool.clone();
                async move {
                    let mut client = pool.get().await?;
                    let transaction = client.transaction().await?;
                    for envelope in &envelopes {
                        transaction
                            .execute(
                                "INSERT INTO deposits_seen VALUES ($1, $2)",
                                &[&envelope.persistence_id, &(envelope.sequence_nr as i64)],
                            )
                            .await?;
                    }
                    commit_offsets(&transaction, &commit).await?;
                    transaction.commit().await?;
                    Ok(())
                }
            },
        ))
}

async fn read_model(pool: &Pool) -> Vec<(String, u64)> {
    let client = pool.get().await.unwrap();
    client
        .query("SELECT persistence_id, sequence_nr FROM deposits_seen", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get::<_, i64>(1) as u64))
        .collect()
}

/// A server of the test's own with the offset tables and the read model made, the store
/// of offsets over it, and a pool for the handlers.
async fn database() -> (PostgresServer, PostgresOffsets, Pool) {
    let server = PostgresServer::start().await.expect("PostgreSQL starts");
    let pool = tessera_projection_postgres::pool(&server.connection_string(), 16).unwrap();
    let offsets = PostgresOffsets::new(pool.clone());
    offsets.create_tables().await.unwrap();
    pool.get()
        .await
        .unwrap()
        .batch_execute(CREATE_READ_MODEL)
        .await
        .unwrap();
    (server, offsets, pool)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_read_model_holds_each_event_once_through_a_node_kill() {
    let (_server, offsets, pool) = database().await;

    let dir = tempfile::tempdir().unwrap();
    let (mut nodes, _) = cluster::start(dir.path(), 3, || builder(&offsets, &pool)).await;
    let instances = |node: &Node| node.daemon_instances("projection.model").len();
    wait_until("4 projection instances running", || {
        nodes.iter().map(instances).sum::<usize>() == 4
    })
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..CALLERS)
        .map(|i| tokio::spawn(deposits(nodes[i % nodes.len()].handle(), stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let busiest = (0..nodes.len())
        .max_by_key(|i| instances(&nodes[*i]))
        .unwrap();
    nodes.remove(busiest).kill().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    let mut acknowledged = BTreeSet::new();
    for caller in callers {
        acknowledged.extend(caller.await.unwrap());
    }
    assert!(
        acknowledged.len() > 300,
        "{} acknowledged",
        acknowledged.len()
    );

    // The events of a log whose writer was killed are visible once it is recovered (the
    // live query sees them then): first every acknowledged deposit in the read model.
    let in_model = |rows: &[(String, u64)]| rows.iter().cloned().collect::<BTreeSet<_>>();
    let mut rows = Vec::new();
    for _ in 0..600 {
        rows = read_model(&pool).await;
        if acknowledged.is_subset(&in_model(&rows)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let model = in_model(&rows);
    let missing: Vec<_> = acknowledged.difference(&model).take(10).collect();
    assert!(
        missing.is_empty(),
        "acknowledged, not in the read model: {missing:?}"
    );
    let journal = journal_events(&nodes[0]).await;
    assert!(acknowledged.is_subset(&journal));
    for _ in 0..600 {
        rows = read_model(&pool).await;
        if rows.len() >= journal.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let distinct: BTreeSet<_> = rows.iter().cloned().collect();
    assert_eq!(
        rows.len(),
        distinct.len(),
        "{} events are in the read model twice",
        rows.len() - distinct.len()
    );
    let missing: Vec<_> = journal.difference(&distinct).take(10).collect();
    assert!(missing.is_empty(), "not in the read model: {missing:?}");
    let extra: Vec<_> = distinct.difference(&journal).take(10).collect();
    assert!(extra.is_empty(), "not in the journal: {extra:?}");
    eprintln!(
        "read model: {} rows, {} acknowledged deposits",
        rows.len(),
        acknowledged.len()
    );
    for node in nodes {
        node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_with_the_fence_of_a_replaced_instance_is_refused() {
    let (_server, offsets, pool) = database().await;
    let key = InstanceKey {
        projection: "model".into(),
        index: 0,
        instances: 4,
    };
    let first = Fence {
        counter: 3,
        writer: u64::MAX - 1,
    };
    let second = Fence {
        counter: 4,
        writer: 7,
    };
    let commit_as = |fence: Fence, seq: u64| {
        let pool = pool.clone();
        let key = key.clone();
        async move {
            let mut client = pool.get().await.unwrap();
            let transaction = client.transaction().await.unwrap();
            transaction
                .execute(
                    "INSERT INTO deposits_seen VALUES ('account|a', $1)",
                    &[&(seq as i64)],
                )
                .await
                .unwrap();
            let commit = OffsetCommit {
                instance: key,
                fence,
                seqs: vec![("account|a".into(), seq)],
            };
            commit_offsets(&transaction, &commit).await?;
            transaction.commit().await.unwrap();
            Ok::<(), CommitError>(())
        }
    };

    assert_eq!(
        offsets
            .take_slot(&key, first)
            .await
            .unwrap()
            .get("account|a"),
        0
    );
    commit_as(first, 1).await.expect("the holder commits");
    // The successor takes the slot and reads the first one's offset.
    assert_eq!(
        offsets
            .take_slot(&key, second)
            .await
            .unwrap()
            .get("account|a"),
        1
    );
    let stale = commit_as(first, 2).await;
    assert!(
        matches!(stale, Err(CommitError::Fenced { .. })),
        "a replaced instance committed: {stale:?}"
    );
    let back = offsets.take_slot(&key, first).await;
    assert!(
        matches!(back, Err(PostgresOffsetsError::Fenced { .. })),
        "a lower fence took the slot back: {back:?}"
    );
    commit_as(second, 2).await.expect("the successor commits");
    // Its retry, as after a commit whose answer was lost, applies nothing a second time.
    let again = commit_as(second, 2).await;
    assert!(
        matches!(again, Err(CommitError::AlreadyCommitted { .. })),
        "a group committed twice: {again:?}"
    );
    let mut rows = read_model(&pool).await;
    rows.sort();
    assert_eq!(
        rows,
        vec![("account|a".to_string(), 1), ("account|a".to_string(), 2)],
        "the refused commit's row was rolled back"
    );
    assert_eq!(
        offsets
            .take_slot(&key, second)
            .await
            .unwrap()
            .get("account|a"),
        2
    );
}
