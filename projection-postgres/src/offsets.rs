//! The fence and offset tables, and the commit a handler makes in its transaction.

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod};
use futures::FutureExt;
use futures::future::BoxFuture;
use tessera_journal::SliceOffset;
use tessera_journal::slice::{SliceRange, slice_of};
use tessera_projection::{ExactlyOnceStore, Fence, HandlerError, InstanceKey, OffsetCommit};
use tokio_postgres::{NoTls, Transaction};

const CREATE_TABLES: &str = "
CREATE TABLE IF NOT EXISTS tessera_projection_fence (
    projection text NOT NULL,
    slot text NOT NULL,
    counter bigint NOT NULL,
    writer bigint NOT NULL,
    PRIMARY KEY (projection, slot)
);
CREATE TABLE IF NOT EXISTS tessera_projection_offset (
    projection text NOT NULL,
    persistence_id text NOT NULL,
    slice integer NOT NULL,
    sequence_nr bigint NOT NULL,
    PRIMARY KEY (projection, persistence_id)
);
CREATE INDEX IF NOT EXISTS tessera_projection_offset_by_slice
    ON tessera_projection_offset (projection, slice);
";

/// Takes a slot unless a higher fence holds it: 1 row when taken, 0 when refused.
const TAKE_SLOT: &str = "
INSERT INTO tessera_projection_fence AS held (projection, slot, counter, writer)
VALUES ($1, $2, $3, $4)
ON CONFLICT (projection, slot) DO UPDATE
    SET counter = EXCLUDED.counter, writer = EXCLUDED.writer
    WHERE (held.counter, held.writer) <= (EXCLUDED.counter, EXCLUDED.writer)
";

const HELD_FENCE: &str =
    "SELECT counter, writer FROM tessera_projection_fence WHERE projection = $1 AND slot = $2";

const LOCK_SLOT: &str = "SELECT counter, writer FROM tessera_projection_fence \
     WHERE projection = $1 AND slot = $2 FOR UPDATE";

/// In one statement, so one transaction: the slot's row locked with the fence checked, and
/// the offsets of its slices deleted only if it holds. Answers (slot held, offsets deleted).
const FORGET_OFFSETS: &str = "
WITH held AS (
    SELECT 1 FROM tessera_projection_fence
    WHERE projection = $1 AND slot = $4 AND counter = $5 AND writer = $6
    FOR UPDATE
), gone AS (
    DELETE FROM tessera_projection_offset
    WHERE projection = $1 AND slice BETWEEN $2 AND $3 AND EXISTS (SELECT 1 FROM held)
    RETURNING 1
)
SELECT (SELECT count(*) FROM held), (SELECT count(*) FROM gone)
";

const READ_OFFSETS: &str = "SELECT persistence_id, sequence_nr FROM tessera_projection_offset \
     WHERE projection = $1 AND slice BETWEEN $2 AND $3";

/// Moves each log's offset forward (never back).
const SAVE_OFFSETS: &str = "
INSERT INTO tessera_projection_offset AS saved (projection, persistence_id, slice, sequence_nr)
SELECT $1, * FROM unnest($2::text[], $3::integer[], $4::bigint[])
ON CONFLICT (projection, persistence_id) DO UPDATE
    SET sequence_nr = EXCLUDED.sequence_nr
    WHERE saved.sequence_nr < EXCLUDED.sequence_nr
";

/// Why a slot could not be taken or its offset read.
#[derive(Debug, thiserror::Error)]
pub enum PostgresOffsetsError {
    #[error(
        "projection {projection} instance {slot}: its slot is held by a later instance \
         (fence {held:?}, this one's {ours:?})"
    )]
    Fenced {
        projection: String,
        slot: String,
        held: Option<Fence>,
        ours: Fence,
    },
    #[error("projection {projection} instance {slot}: {reason}")]
    Instance {
        projection: String,
        slot: String,
        reason: String,
    },
    #[error(
        "projection {projection}: the database refused a sequence number {sequence_nr} of {persistence_id}"
    )]
    SequenceNr {
        projection: String,
        persistence_id: String,
        sequence_nr: i64,
    },
    #[error("invalid PostgreSQL connection string: {0}")]
    Config(String),
    #[error("PostgreSQL: {0}")]
    Database(#[from] tokio_postgres::Error),
    #[error("PostgreSQL connection: {0}")]
    Pool(#[from] PoolError),
}

/// Why a handler's commit was refused: its transaction must roll back.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error(
        "projection {projection} instance {slot} lost its slot: fence {held:?} holds it, the \
         commit's is {ours:?}; nothing of this transaction may be committed"
    )]
    Fenced {
        projection: String,
        slot: String,
        held: Option<Fence>,
        ours: Fence,
    },
    #[error(
        "projection {projection}: sequence number {sequence_nr} of {persistence_id} is past what PostgreSQL's bigint holds"
    )]
    SequenceNr {
        projection: String,
        persistence_id: String,
        sequence_nr: u64,
    },
    #[error(
        "projection {projection} instance {slot}: {committed} of the group's {logs} logs already \
         have this offset or a later one committed (a commit whose answer was lost, retried); \
         nothing of this transaction may be committed, the instance reads its offset again"
    )]
    AlreadyCommitted {
        projection: String,
        slot: String,
        logs: usize,
        committed: usize,
    },
    #[error("PostgreSQL: {0}")]
    Database(#[from] tokio_postgres::Error),
}

/// A fence's writer in a signed column, keeping its order: `u64` order is the order of the
/// stored `bigint`s.
fn writer_column(writer: u64) -> i64 {
    (writer ^ (1 << 63)) as i64
}

fn writer_of_column(column: i64) -> u64 {
    (column as u64) ^ (1 << 63)
}

/// A fence's counter in a `bigint`: counters start at 1 and grow by one per takeover, so
/// they stay far below `i64::MAX`; one above it is kept at the top, which still orders
/// every smaller counter below it.
fn counter_column(counter: u64) -> i64 {
    i64::try_from(counter).unwrap_or(i64::MAX)
}

fn fence_of(row: &tokio_postgres::Row) -> Fence {
    Fence {
        counter: row.get::<_, i64>(0) as u64,
        writer: writer_of_column(row.get(1)),
    }
}

/// A pool of up to `max_connections` connections to the database `config` names (a libpq
/// connection string or URL), without TLS. It connects on first use and replaces a broken
/// connection, so a node starts while its database is down and its projections' instances
/// go on once it is back.
///
/// Unless `config` sets `options`, its sessions end a transaction left idle for
/// [`IDLE_TRANSACTION_TIMEOUT`]: an instance paused (or cut off) inside a commit holds its
/// slot's row lock, and its successor can take the slot only once the server ended that
/// transaction (rolling it back).
pub fn pool(config: &str, max_connections: usize) -> Result<Pool, PostgresOffsetsError> {
    let mut config: tokio_postgres::Config = config
        .parse()
        .map_err(|e: tokio_postgres::Error| PostgresOffsetsError::Config(e.to_string()))?;
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        return Err(PostgresOffsetsError::Config(
            "it names no host (host=... or postgresql://host/...)".into(),
        ));
    }
    if config.get_options().is_none() {
        config.options(format!(
            "-c idle_in_transaction_session_timeout={}",
            IDLE_TRANSACTION_TIMEOUT.as_millis()
        ));
    }
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(max_connections.max(1))
        .build()
        .map_err(|e| PostgresOffsetsError::Config(e.to_string()))
}

/// How long a pooled session's transaction may stay idle before the server ends it.
pub const IDLE_TRANSACTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The exactly-once store of projections whose read models are in PostgreSQL.
#[derive(Clone)]
pub struct PostgresOffsets {
    pool: Pool,
}

impl PostgresOffsets {
    /// Over a pool of the handler's database (the handler's transactions commit the offsets).
    pub fn new(pool: Pool) -> Self {
        PostgresOffsets { pool }
    }

    /// The pool it takes its connections from.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Creates the fence and offset tables where they are missing.
    pub async fn create_tables(&self) -> Result<(), PostgresOffsetsError> {
        self.pool.get().await?.batch_execute(CREATE_TABLES).await?;
        Ok(())
    }

    /// Takes `instance`'s slot with `fence` and reads the offset committed for its slices.
    pub async fn take_slot(
        &self,
        instance: &InstanceKey,
        fence: Fence,
    ) -> Result<SliceOffset, PostgresOffsetsError> {
        let slot = instance.slot();
        let range = range_of(instance)?;
        let client = self.pool.get().await?;
        let taken = client
            .execute(
                TAKE_SLOT,
                &[
                    &instance.projection,
                    &slot,
                    &counter_column(fence.counter),
                    &writer_column(fence.writer),
                ],
            )
            .await?;
        if taken == 0 {
            let held = client
                .query_opt(HELD_FENCE, &[&instance.projection, &slot])
                .await?
                .map(|row| fence_of(&row));
            return Err(PostgresOffsetsError::Fenced {
                projection: instance.projection.clone(),
                slot,
                held,
                ours: fence,
            });
        }
        // Read after the fence is written: a commit of an instance before either committed
        // already (and is read here) or will find this fence and be refused.
        let rows = client
            .query(
                READ_OFFSETS,
                &[
                    &instance.projection,
                    &i32::from(range.first),
                    &i32::from(range.last),
                ],
            )
            .await?;
        let mut offset = SliceOffset::start();
        for row in rows {
            let persistence_id: String = row.get(0);
            let sequence_nr: i64 = row.get(1);
            let sequence_nr =
                u64::try_from(sequence_nr).map_err(|_| PostgresOffsetsError::SequenceNr {
                    projection: instance.projection.clone(),
                    persistence_id: persistence_id.clone(),
                    sequence_nr,
                })?;
            offset.advance(&persistence_id, sequence_nr);
        }
        Ok(offset)
    }
}

impl PostgresOffsets {
    /// Forgets the offsets of `instance`'s slices, if `fence` still holds its slot (an
    /// operator's reset, applied by the instance as it opens).
    pub async fn forget(
        &self,
        instance: &InstanceKey,
        fence: Fence,
    ) -> Result<(), PostgresOffsetsError> {
        let range = range_of(instance)?;
        let slot = instance.slot();
        let client = self.pool.get().await?;
        let row = client
            .query_one(
                FORGET_OFFSETS,
                &[
                    &instance.projection,
                    &i32::from(range.first),
                    &i32::from(range.last),
                    &slot,
                    &counter_column(fence.counter),
                    &writer_column(fence.writer),
                ],
            )
            .await?;
        if row.get::<_, i64>(0) == 0 {
            let held = client
                .query_opt(HELD_FENCE, &[&instance.projection, &slot])
                .await?
                .map(|row| fence_of(&row));
            return Err(PostgresOffsetsError::Fenced {
                projection: instance.projection.clone(),
                slot,
                held,
                ours: fence,
            });
        }
        tracing::info!(projection = %instance.projection, %slot, offsets = row.get::<_, i64>(1), "exactly-once offsets forgotten");
        Ok(())
    }
}

impl ExactlyOnceStore for PostgresOffsets {
    fn open(
        &self,
        instance: &InstanceKey,
        fence: Fence,
    ) -> BoxFuture<'static, Result<SliceOffset, HandlerError>> {
        let this = self.clone();
        let instance = instance.clone();
        async move { Ok(this.take_slot(&instance, fence).await?) }.boxed()
    }

    fn reset(
        &self,
        instance: &InstanceKey,
        fence: Fence,
    ) -> BoxFuture<'static, Result<(), HandlerError>> {
        let this = self.clone();
        let instance = instance.clone();
        async move { Ok(this.forget(&instance, fence).await?) }.boxed()
    }
}

/// The slice range instance `instance` owns.
fn range_of(instance: &InstanceKey) -> Result<SliceRange, PostgresOffsetsError> {
    let bad = |reason: String| PostgresOffsetsError::Instance {
        projection: instance.projection.clone(),
        slot: instance.slot(),
        reason,
    };
    let ranges = SliceRange::split(instance.instances).map_err(|e| bad(e.to_string()))?;
    ranges.get(instance.index as usize).copied().ok_or_else(|| {
        bad(format!(
            "index {} is not below the {} instances",
            instance.index, instance.instances
        ))
    })
}

/// Records `commit` in `transaction`, after checking there that its instance still holds its
/// slot with the commit's fence (the slot's row stays locked until the transaction ends).
/// On an error the caller must not commit the transaction: dropping it rolls it back.
pub async fn commit_offsets(
    transaction: &Transaction<'_>,
    commit: &OffsetCommit,
) -> Result<(), CommitError> {
    let projection = &commit.instance.projection;
    let slot = commit.instance.slot();
    let held = transaction
        .query_opt(LOCK_SLOT, &[projection, &slot])
        .await?
        .map(|row| fence_of(&row));
    if held != Some(commit.fence) {
        return Err(CommitError::Fenced {
            projection: projection.clone(),
            slot,
            held,
            ours: commit.fence,
        });
    }
    if commit.seqs.is_empty() {
        return Ok(());
    }
    let mut persistence_ids = Vec::with_capacity(commit.seqs.len());
    let mut slices = Vec::with_capacity(commit.seqs.len());
    let mut sequence_nrs = Vec::with_capacity(commit.seqs.len());
    for (persistence_id, sequence_nr) in &commit.seqs {
        let Ok(stored) = i64::try_from(*sequence_nr) else {
            return Err(CommitError::SequenceNr {
                projection: projection.clone(),
                persistence_id: persistence_id.clone(),
                sequence_nr: *sequence_nr,
            });
        };
        persistence_ids.push(persistence_id.as_str());
        slices.push(i32::from(slice_of(persistence_id)));
        sequence_nrs.push(stored);
    }
    let moved = transaction
        .execute(
            SAVE_OFFSETS,
            &[projection, &persistence_ids, &slices, &sequence_nrs],
        )
        .await?;
    // A log whose offset did not move was committed already: the group is a retry of a
    // commit that succeeded though its answer was lost, and applying its effect again would
    // apply it twice.
    let moved = usize::try_from(moved).unwrap_or(usize::MAX);
    if moved < commit.seqs.len() {
        return Err(CommitError::AlreadyCommitted {
            projection: projection.clone(),
            slot,
            logs: commit.seqs.len(),
            committed: commit.seqs.len() - moved,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_column_keeps_the_order_of_writers() {
        let writers = [
            0,
            1,
            1 << 62,
            (1 << 63) - 1,
            1 << 63,
            u64::MAX - 1,
            u64::MAX,
        ];
        for pair in writers.windows(2) {
            assert!(writer_column(pair[0]) < writer_column(pair[1]), "{pair:?}");
            assert_eq!(writer_of_column(writer_column(pair[0])), pair[0]);
        }
        assert_eq!(writer_of_column(writer_column(u64::MAX)), u64::MAX);
    }
}
