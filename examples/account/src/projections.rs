//! The accounts' read side: two projections of their events into PostgreSQL, which the
//! `tessera` binary registers when [`POSTGRES_ENV`] names a database.
//!
//! - `account-balances`, exactly once: each account's balance (`account_balance`) and every
//!   event it was built from (`account_event`), written in the transaction that commits the
//!   offset, so each event is in the tables exactly once whatever fails.
//! - `account-ledger`, at least once: a row per event each time it is handled
//!   (`account_ledger`), with no key, so that an event handled twice shows twice.
//!
//! Every row records the process that wrote it (`handled_by`) and when (`written_at`, the
//! database's clock), which is what the process tests check fencing with.

use crate::{Account, AccountEvent};
use futures::FutureExt;
use futures::future::BoxFuture;
use std::sync::Arc;
use tessera::{
    Envelope, ExactlyOnceStore, Fence, HandlerError, InstanceKey, NodeBuilder, OffsetCommit,
    Projection, SliceOffset,
};
use tessera_projection_postgres::tokio_postgres::types::ToSql;
use tessera_projection_postgres::{Pool, PostgresOffsets, commit_offsets};
use tokio::sync::OnceCell;

/// The environment variable naming the read models' database (a libpq connection string or
/// URL). Unset, the binary runs no projection.
pub const POSTGRES_ENV: &str = "ACCOUNT_PROJECTIONS_POSTGRES";
/// The exactly-once projection's name.
pub const BALANCES: &str = "account-balances";
/// The at-least-once projection's name.
pub const LEDGER: &str = "account-ledger";
/// Instances of each projection: each owns a quarter of the slices.
pub const INSTANCES: u32 = 4;
/// Envelopes per handler call (and per transaction).
const MAX_GROUP: usize = 64;
/// Connections per node: one per instance and projection, and one for the offset reads.
const MAX_CONNECTIONS: usize = 2 * INSTANCES as usize + 1;

const CREATE_READ_MODELS: &str = "
CREATE TABLE IF NOT EXISTS account_balance (
    account_id text PRIMARY KEY,
    balance bigint NOT NULL,
    sequence_nr bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS account_event (
    persistence_id text NOT NULL,
    sequence_nr bigint NOT NULL,
    slice integer NOT NULL,
    amount bigint NOT NULL,
    handled_by integer NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS account_ledger (
    persistence_id text NOT NULL,
    sequence_nr bigint NOT NULL,
    slice integer NOT NULL,
    amount bigint NOT NULL,
    handled_by integer NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
";

/// The events of a group, one array per column.
const INSERT_EVENTS: &str = "
INSERT INTO account_event (persistence_id, sequence_nr, slice, amount, handled_by)
SELECT *, $5 FROM unnest($1::text[], $2::bigint[], $3::integer[], $4::bigint[])
";

const INSERT_LEDGER: &str = "
INSERT INTO account_ledger (persistence_id, sequence_nr, slice, amount, handled_by)
SELECT *, $5 FROM unnest($1::text[], $2::bigint[], $3::integer[], $4::bigint[])
";

/// Each account of a group: the sum of its changes added, its last sequence number kept.
const ADD_TO_BALANCES: &str = "
INSERT INTO account_balance AS held (account_id, balance, sequence_nr)
SELECT id, sum(change), max(seq) FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS g(id, seq, change)
GROUP BY id
ON CONFLICT (account_id) DO UPDATE
    SET balance = held.balance + EXCLUDED.balance, sequence_nr = EXCLUDED.sequence_nr
";

/// Registers the two projections on `builder` when [`POSTGRES_ENV`] is set; an invalid
/// connection string is an error that names the variable.
pub fn register(builder: NodeBuilder) -> Result<NodeBuilder, String> {
    let config = std::env::var(POSTGRES_ENV).unwrap_or_default();
    if config.is_empty() {
        return Ok(builder);
    }
    let pool = tessera_projection_postgres::pool(&config, MAX_CONNECTIONS)
        .map_err(|e| format!("{POSTGRES_ENV}: {e}"))?;
    let schema = Arc::new(Schema {
        offsets: PostgresOffsets::new(pool.clone()),
        made: OnceCell::new(),
    });
    let store = BalancesStore {
        schema: schema.clone(),
    };
    // ANCHOR: register
    let balances = Projection::exactly_once(
        BALANCES,
        Account,
        INSTANCES,
        MAX_GROUP,
        store,
        move |envelopes, commit| write_balances(pool.clone(), envelopes, commit),
    );
    let ledger = Projection::grouped_at_least_once(LEDGER, Account, INSTANCES, MAX_GROUP, {
        move |envelopes| write_ledger(schema.clone(), envelopes)
    });
    Ok(builder.projection(balances).projection(ledger))
    // ANCHOR_END: register
}

/// The tables, made once per process (by whichever instance needs them first).
struct Schema {
    offsets: PostgresOffsets,
    made: OnceCell<()>,
}

impl Schema {
    async fn make(&self) -> Result<(), HandlerError> {
        self.made
            .get_or_try_init(|| async {
                // Two nodes making the tables at once can collide in the catalog: the loser's
                // error is a handler error, retried.
                self.offsets.create_tables().await?;
                self.offsets
                    .pool()
                    .get()
                    .await?
                    .batch_execute(CREATE_READ_MODELS)
                    .await?;
                Ok::<(), HandlerError>(())
            })
            .await?;
        Ok(())
    }
}

/// The offsets of `account-balances`, with the tables made before the first slot is taken.
struct BalancesStore {
    schema: Arc<Schema>,
}

impl ExactlyOnceStore for BalancesStore {
    fn open(
        &self,
        instance: &InstanceKey,
        fence: Fence,
    ) -> BoxFuture<'static, Result<SliceOffset, HandlerError>> {
        let schema = self.schema.clone();
        let instance = instance.clone();
        async move {
            schema.make().await?;
            schema.offsets.open(&instance, fence).await
        }
        .boxed()
    }

    fn reset(
        &self,
        instance: &InstanceKey,
        fence: Fence,
    ) -> BoxFuture<'static, Result<(), HandlerError>> {
        self.schema.offsets.reset(instance, fence)
    }
}

/// A group's columns: persistence ids, sequence numbers, slices and each event's change of
/// the balance.
struct Columns {
    persistence_ids: Vec<String>,
    account_ids: Vec<String>,
    sequence_nrs: Vec<i64>,
    slices: Vec<i32>,
    changes: Vec<i64>,
}

impl Columns {
    /// The parameters of [`INSERT_EVENTS`] and [`INSERT_LEDGER`]: a row per event, written by
    /// `handled_by`.
    fn event_rows<'a>(&'a self, handled_by: &'a i32) -> [&'a (dyn ToSql + Sync); 5] {
        [
            &self.persistence_ids,
            &self.sequence_nrs,
            &self.slices,
            &self.changes,
            handled_by,
        ]
    }
}

fn columns(envelopes: &[Envelope<Account>]) -> Result<Columns, HandlerError> {
    let mut columns = Columns {
        persistence_ids: Vec::with_capacity(envelopes.len()),
        account_ids: Vec::with_capacity(envelopes.len()),
        sequence_nrs: Vec::with_capacity(envelopes.len()),
        slices: Vec::with_capacity(envelopes.len()),
        changes: Vec::with_capacity(envelopes.len()),
    };
    for envelope in envelopes {
        let (amount, sign) = match envelope.event {
            AccountEvent::Deposited { amount } => (amount, 1),
            AccountEvent::Withdrawn { amount } => (amount, -1),
        };
        let too_large = || {
            HandlerError::new(format!(
                "{} event {}: amount {amount} is past what a bigint holds",
                envelope.persistence_id, envelope.sequence_nr
            ))
        };
        let amount = i64::try_from(amount).map_err(|_| too_large())?;
        columns
            .persistence_ids
            .push(envelope.persistence_id.clone());
        columns.account_ids.push(envelope.entity_id.clone());
        columns
            .sequence_nrs
            .push(i64::try_from(envelope.sequence_nr).map_err(|_| too_large())?);
        columns.slices.push(i32::from(envelope.slice));
        columns.changes.push(sign * amount);
    }
    Ok(columns)
}

/// The process that writes, in every row.
fn handled_by() -> i32 {
    i32::try_from(std::process::id()).unwrap_or(i32::MAX)
}

// ANCHOR: write_balances
async fn write_balances(
    pool: Pool,
    envelopes: Vec<Envelope<Account>>,
    commit: OffsetCommit,
) -> Result<(), HandlerError> {
    let columns = columns(&envelopes)?;
    let handled_by = handled_by();
    let mut client = pool.get().await?;
    let transaction = client.transaction().await?;
    transaction
        .execute(INSERT_EVENTS, &columns.event_rows(&handled_by))
        .await?;
    transaction
        .execute(
            ADD_TO_BALANCES,
            &[
                &columns.account_ids,
                &columns.sequence_nrs,
                &columns.changes,
            ],
        )
        .await?;
    commit_offsets(&transaction, &commit).await?;
    transaction.commit().await?;
    Ok(())
}
// ANCHOR_END: write_balances

async fn write_ledger(
    schema: Arc<Schema>,
    envelopes: Vec<Envelope<Account>>,
) -> Result<(), HandlerError> {
    schema.make().await?;
    let columns = columns(&envelopes)?;
    let handled_by = handled_by();
    let client = schema.offsets.pool().get().await?;
    // Prepared once per connection: each call is then one statement on the server.
    let insert = client.prepare_cached(INSERT_LEDGER).await?;
    client
        .execute(&insert, &columns.event_rows(&handled_by))
        .await?;
    Ok(())
}
