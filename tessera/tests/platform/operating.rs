//! Operating a projection over three real nodes through the management API: `GET
//! /projections` shows each instance's node and its lag falling to zero once the writes
//! stop; pause stops the handlers everywhere; a reset is refused while running and, once
//! paused, makes every instance start from the beginning when resumed.

use crate::cluster::{self, wait_until};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera::{Envelope, HandlerError, Node, NodeBuilder, Projection};
use tessera_example_account::{Account, AccountCommand};

type Handled = Arc<Mutex<Vec<(String, u64)>>>;

fn builder(handled: &Handled) -> NodeBuilder {
    let handled = handled.clone();
    NodeBuilder::new()
        .entity(Account)
        .projection(Projection::at_least_once(
            "ops",
            Account,
            2,
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

async fn deposit(node: &Node, accounts: usize, rounds: usize) -> BTreeSet<(String, u64)> {
    let mut acknowledged = BTreeSet::new();
    for round in 0..rounds {
        for account in 0..accounts {
            let id = format!("ops-{account}");
            let reply = node
                .handle()
                .entity_ref::<Account>(id.as_str())
                .ask(AccountCommand::Deposit(1))
                .await;
            match reply {
                Ok(balance) => {
                    acknowledged.insert((format!("account|{id}"), balance.balance));
                }
                Err(e) => panic!("deposit {round} to {id} failed: {e:?}"),
            }
        }
    }
    acknowledged
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn get(&self) -> Value {
        let answer = self
            .http
            .get(format!("{}/projections", self.base))
            .send()
            .await
            .expect("GET /projections answers");
        assert!(answer.status().is_success(), "{}", answer.status());
        answer.json().await.unwrap()
    }

    async fn post(&self, name: &str, operation: &str) -> (u16, Value) {
        let answer = self
            .http
            .post(format!("{}/projections/{name}/{operation}", self.base))
            .send()
            .await
            .expect("the node answers");
        let status = answer.status().as_u16();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    /// Waits until `holds` is true of the projection's entry in `GET /projections`.
    async fn wait_for(&self, what: &str, holds: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + cluster::SETTLE_TIMEOUT;
        loop {
            let all = self.get().await;
            let ops = all["projections"]
                .as_array()
                .and_then(|p| p.iter().find(|p| p["name"] == "ops"))
                .cloned()
                .unwrap_or(Value::Null);
            if holds(&ops) {
                return ops;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not within {:?}: {what}; last: {ops:#}",
                cluster::SETTLE_TIMEOUT
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn instances(ops: &Value) -> Vec<Value> {
    ops["instance_status"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projection_is_paused_reset_and_resumed_from_the_api_and_its_lag_falls_to_zero() {
    let dir = tempfile::tempdir().unwrap();
    let handled = Handled::default();
    let (nodes, _) = cluster::start(dir.path(), 3, || builder(&handled)).await;
    wait_until("2 projection instances running", || {
        nodes
            .iter()
            .map(|n| n.daemon_instances("projection.ops").len())
            .sum::<usize>()
            == 2
    })
    .await;
    let api = Api {
        http: reqwest::Client::builder().no_proxy().build().unwrap(),
        base: format!("http://{}", nodes[1].handle().http_address()),
    };
    let seen = || {
        handled
            .lock()
            .unwrap()
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>()
    };

    let first = deposit(&nodes[0], 20, 5).await;
    wait_until("every deposit handled", || first.is_subset(&seen())).await;
    let ops = api
        .wait_for(
            "every instance running, the lag at zero once the writes stopped",
            |ops| {
                // A run whose save was refused (its offset log's writer recovered the log again)
                // ends, and the next keep-alive starts another: wait for them running.
                ops["lag_events"] == 0
                    && ops["lag_seconds"] == 0.0
                    && instances(ops).iter().all(|i| i["state"] == "running")
            },
        )
        .await;
    let members: BTreeSet<String> = nodes
        .iter()
        .map(|n| n.cluster_address().to_string())
        .collect();
    for instance in instances(&ops) {
        assert_eq!(instance["state"], "running", "{instance}");
        let node = instance["node"].as_str().expect("the node it runs on");
        assert!(members.contains(node), "{node} is not a member");
        assert_eq!(instance["lag_events"], 0, "{instance}");
    }
    let offset: u64 = instances(&ops)
        .iter()
        .map(|i| i["offset_events"].as_u64().unwrap_or(0))
        .sum();
    assert!(offset <= first.len() as u64);

    let (status, refused) = api.post("ops", "reset").await;
    assert_eq!(status, 409, "a reset while running: {refused}");
    let (status, unknown) = api.post("nope", "pause").await;
    assert_eq!(status, 404, "{unknown}");

    let (status, answer) = api.post("ops", "pause").await;
    assert_eq!(status, 200, "{answer}");
    api.wait_for("every instance paused", |ops| {
        ops["paused"] == true && instances(ops).iter().all(|i| i["state"] == "paused")
    })
    .await;
    let before = handled.lock().unwrap().len();
    let second = deposit(&nodes[2], 20, 2).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        handled.lock().unwrap().len(),
        before,
        "a paused projection handled events"
    );

    let (status, answer) = api.post("ops", "reset").await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = api.post("ops", "resume").await;
    assert_eq!(status, 200, "{answer}");
    let everything: BTreeSet<_> = first.union(&second).cloned().collect();
    // From the beginning: every event is handled again after the reset.
    wait_until("every event handled again after the reset", || {
        let all = handled.lock().unwrap();
        let again: BTreeSet<_> = all[before..].iter().cloned().collect();
        everything.is_subset(&again)
    })
    .await;
    let ops = api
        .wait_for("running with the reset applied and no lag", |ops| {
            // The node's view of the control follows Distributed Data's change notices, so
            // it may show the reset after an instance applied it.
            ops["resets"] == 1
                && instances(ops).iter().all(|i| {
                    i["state"] == "running" && i["resets_applied"] == 1 && i["lag_events"] == 0
                })
        })
        .await;
    assert_eq!(ops["paused"], false);
    for node in nodes {
        node.shutdown().await;
    }
}
