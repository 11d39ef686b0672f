//! The demo's read side: the accounts' two projections write into a PostgreSQL server of the
//! demo's own; the demo watches them through `GET /projections` and checks the tables against
//! the accounts themselves — each balance equal, each event in `account_event` exactly once
//! and without a gap, each in `account_ledger` at least once.

use super::{DemoError, DemoNode, HTTP_TIMEOUT, PHASE_TIMEOUT, POLL_INTERVAL};
use crate::http_client;
use crate::postgres::PostgresServer;
use std::collections::BTreeMap;
use std::time::Instant;
use tessera_example_account::projections::{BALANCES, LEDGER, POSTGRES_ENV};
use tokio_postgres::NoTls;

/// The read models' database, and a connection the demo reads them through.
pub(super) struct ReadModel {
    server: PostgresServer,
    client: tokio_postgres::Client,
}

/// What the tables hold.
#[derive(Debug, PartialEq)]
struct Tables {
    balances: BTreeMap<String, u64>,
    /// `account_event`: rows, distinct (persistence id, sequence number), accounts whose
    /// sequence numbers are not 1..=n.
    event_rows: u64,
    event_distinct: u64,
    event_gaps: u64,
    /// `account_ledger`: rows and distinct events.
    ledger_rows: u64,
    ledger_distinct: u64,
}

fn database(e: impl std::fmt::Display) -> DemoError {
    DemoError::ReadModel(format!("PostgreSQL: {e}"))
}

impl ReadModel {
    pub(super) async fn start() -> Result<ReadModel, DemoError> {
        let server = PostgresServer::start()
            .await
            .map_err(|e| DemoError::ReadModel(format!("cannot start PostgreSQL: {e}")))?;
        let (client, connection) = tokio_postgres::connect(&server.connection_string(), NoTls)
            .await
            .map_err(database)?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(ReadModel { server, client })
    }

    pub(super) fn port(&self) -> u16 {
        self.server.port()
    }

    /// The environment variable that makes a node run the projections into it.
    pub(super) fn node_env(&self) -> (&'static str, String) {
        (POSTGRES_ENV, self.server.connection_string())
    }

    async fn tables(&self) -> Result<Option<Tables>, DemoError> {
        let made = self
            .client
            .query_one("SELECT to_regclass('account_ledger') IS NOT NULL", &[])
            .await
            .map_err(database)?;
        if !made.get::<_, bool>(0) {
            return Ok(None);
        }
        let balances = self
            .client
            .query("SELECT account_id, balance FROM account_balance", &[])
            .await
            .map_err(database)?
            .iter()
            .map(|row| (row.get(0), row.get::<_, i64>(1) as u64))
            .collect();
        let count = |sql: &'static str| async move {
            let row = self.client.query_one(sql, &[]).await.map_err(database)?;
            Ok::<_, DemoError>((row.get::<_, i64>(0) as u64, row.get::<_, i64>(1) as u64))
        };
        let (event_rows, event_distinct) = count(
            "SELECT count(*), count(DISTINCT (persistence_id, sequence_nr)) FROM account_event",
        )
        .await?;
        let (ledger_rows, ledger_distinct) = count(
            "SELECT count(*), count(DISTINCT (persistence_id, sequence_nr)) FROM account_ledger",
        )
        .await?;
        let (event_gaps, _) = count(
            "SELECT count(*), 0::bigint FROM (SELECT max(sequence_nr) AS last, \
             count(DISTINCT sequence_nr) AS seen FROM account_event GROUP BY persistence_id) \
             AS logs WHERE last <> seen",
        )
        .await?;
        Ok(Some(Tables {
            balances,
            event_rows,
            event_distinct,
            event_gaps,
            ledger_rows,
            ledger_distinct,
        }))
    }

    /// Waits until the read models hold `balances` (the accounts' own, read just before) and
    /// every event, then prints where the instances run and what the tables hold. A table
    /// that holds an event twice, or more than the accounts, fails the demo.
    pub(super) async fn check(
        &self,
        nodes: &[&DemoNode],
        balances: &BTreeMap<String, u64>,
    ) -> Result<(), DemoError> {
        // An account whose deposits all failed has no row.
        let balances: BTreeMap<String, u64> = balances
            .iter()
            .filter(|(_, balance)| **balance > 0)
            .map(|(id, balance)| (id.clone(), *balance))
            .collect();
        let start = Instant::now();
        let tables = loop {
            let tables = self.tables().await?;
            if let Some(tables) = tables {
                let inexact = tables.event_rows != tables.event_distinct || tables.event_gaps > 0;
                if inexact {
                    return Err(DemoError::ReadModel(format!(
                        "account_event holds an event twice or has a gap: {tables:?}"
                    )));
                }
                if tables.balances == balances && tables.ledger_distinct == tables.event_rows {
                    break tables;
                }
            }
            if start.elapsed() > PHASE_TIMEOUT {
                return Err(DemoError::ReadModel(format!(
                    "the read models did not catch up with the accounts within {PHASE_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        };
        let caught_up = start.elapsed();
        self.print_instances(nodes).await?;
        println!(
            "=> caught up {:.1}s after the balances were read: account-balances (exactly \
             once) holds the {} balances the accounts answer and their {} events, each once \
             and none missing; account-ledger (at least once) {} rows for those {} events{}",
            caught_up.as_secs_f64(),
            tables.balances.len(),
            tables.event_rows,
            tables.ledger_rows,
            tables.ledger_distinct,
            match tables.ledger_rows - tables.ledger_distinct {
                0 => String::new(),
                twice => format!(
                    " ({twice} handled again: those after the last offset a stopped \
                     instance saved)"
                ),
            }
        );
        Ok(())
    }

    /// Prints each projection's instances by node, from `GET /projections`.
    async fn print_instances(&self, nodes: &[&DemoNode]) -> Result<(), DemoError> {
        let Some(node) = nodes.first() else {
            return Ok(());
        };
        let response = http_client::get(node.http(), "/projections", HTTP_TIMEOUT).await?;
        let json = response.json().ok_or_else(|| DemoError::Answer {
            node: node.number,
            what: format!("GET /projections: {} {}", response.status, response.body),
        })?;
        let number_of = |address: &str| {
            nodes
                .iter()
                .find(|n| n.process.cluster == address)
                .map(|n| format!("node {}", n.number))
                .unwrap_or_else(|| address.to_string())
        };
        for projection in json["projections"].as_array().into_iter().flatten() {
            let name = projection["name"].as_str().unwrap_or("?");
            if name != BALANCES && name != LEDGER {
                continue;
            }
            let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for instance in projection["instance_status"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let node = instance["node"]
                    .as_str()
                    .map_or("nowhere".into(), number_of);
                by_node
                    .entry(node)
                    .or_default()
                    .push(instance["index"].to_string());
            }
            let placement: Vec<String> = by_node
                .iter()
                .map(|(node, indexes)| format!("{} on {node}", indexes.join(",")))
                .collect();
            println!(
                "   {name}: instances {}; lag {} events",
                placement.join("; "),
                projection["lag_events"]
            );
        }
        Ok(())
    }
}
