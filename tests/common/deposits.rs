//! The deposit workload of the replicated-journal process tests: callers deposit into
//! accounts through the nodes' HTTP API and count how each deposit was answered; balances are
//! then checked against the answers (at least those answered 200, at most those plus the ones
//! whose outcome is unknown).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_harness::http_client::{self, HttpResponse};
use tokio::sync::Mutex;

/// How long one HTTP request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

pub async fn command(http: SocketAddr, id: &str, body: &str) -> HttpResponse {
    match http_client::request(
        http,
        "POST",
        &format!("/entities/account/{id}"),
        Some(body),
        REQUEST_TIMEOUT,
    )
    .await
    {
        Ok(response) => response,
        Err(e) => HttpResponse {
            status: 0,
            body: e.to_string(),
        },
    }
}

/// The balance read through `http` (a confirmed read), retried while the node answers 503.
pub async fn balance(http: SocketAddr, id: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let response = command(http, id, r#"{"get": null}"#).await;
        if response.status == 200 {
            return response.json().expect("JSON")["balance"]
                .as_u64()
                .expect("balance");
        }
        assert!(
            Instant::now() < deadline,
            "no balance of {id} from {http}: {} {}",
            response.status,
            response.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the deposits to one account were answered.
#[derive(Default, Debug, Clone, Copy)]
pub struct Tally {
    pub ok: u64,
    pub unknown: u64,
    pub not_applied: u64,
}

/// Checks an answer is 200 or an error that says whether it took effect, and counts it.
pub fn count(tally: &mut Tally, response: &HttpResponse) {
    match response.status {
        200 => tally.ok += 1,
        504 => {
            assert_outcome(response, "unknown");
            tally.unknown += 1;
        }
        503 => {
            assert_outcome(response, "not_applied");
            tally.not_applied += 1;
        }
        // No connection: nothing reached an entity. Any other failure to get an answer (a
        // timeout, a connection cut mid-request) may follow a delivered request.
        0 if response.body.contains("onnection refused") => tally.not_applied += 1,
        0 => tally.unknown += 1,
        other => panic!("unexpected answer {other}: {}", response.body),
    }
}

pub fn assert_outcome(response: &HttpResponse, outcome: &str) {
    let json = response
        .json()
        .unwrap_or_else(|| panic!("error without a JSON body: {}", response.body));
    assert_eq!(json["outcome"], outcome, "{}", response.body);
    assert!(
        json["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{}",
        response.body
    );
}

pub fn check_bounds(tallies: &BTreeMap<String, Tally>, balances: &BTreeMap<String, u64>) {
    for (id, tally) in tallies {
        let balance = balances[id];
        println!("{id}: balance {balance}, {tally:?}");
        assert!(
            balance >= tally.ok && balance <= tally.ok + tally.unknown,
            "{id}: balance {balance} outside [{}, {}] ({tally:?})",
            tally.ok,
            tally.ok + tally.unknown
        );
    }
}

/// One answer: the node asked, when the deposit was sent and answered (from the workload's
/// start), its status (0: no answer) and error.
#[derive(Debug, Clone)]
pub struct Answer {
    pub node: usize,
    pub sent: Duration,
    pub answered: Duration,
    pub status: u16,
    pub error: Option<String>,
}

/// 64 callers deposit into 10 accounts through random nodes from `start` for `duration`;
/// returns the answers per account, and every answer.
pub async fn workload(
    nodes: Vec<SocketAddr>,
    start: Instant,
    duration: Duration,
) -> (BTreeMap<String, Tally>, Vec<Answer>) {
    workload_over(nodes, 10, start, duration).await
}

/// 64 callers deposit into `accounts` accounts (`acct-0`...) through random nodes from
/// `start` for `duration`; returns the answers per account, and every answer.
pub async fn workload_over(
    nodes: Vec<SocketAddr>,
    accounts: u64,
    start: Instant,
    duration: Duration,
) -> (BTreeMap<String, Tally>, Vec<Answer>) {
    let tallies: Arc<Mutex<BTreeMap<String, Tally>>> = Arc::default();
    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let end = start + duration;
    let mut callers = Vec::new();
    for caller in 0..64u64 {
        let nodes = nodes.clone();
        let tallies = tallies.clone();
        let answers = answers.clone();
        callers.push(tokio::spawn(async move {
            let mut next = caller_random(caller);
            while Instant::now() < end {
                let id = format!("acct-{}", next() % accounts);
                let node = (next() % nodes.len() as u64) as usize;
                let sent = start.elapsed();
                let response = command(nodes[node], &id, r#"{"deposit": 1}"#).await;
                let mut tallies = tallies.lock().await;
                count(tallies.entry(id).or_default(), &response);
                drop(tallies);
                let error = match response.status {
                    200 => None,
                    0 => Some(response.body.clone()),
                    _ => response
                        .json()
                        .and_then(|j| j["error"].as_str().map(str::to_string)),
                };
                answers.lock().await.push(Answer {
                    node,
                    sent,
                    answered: start.elapsed(),
                    status: response.status,
                    error,
                });
                if response.status == 0 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }));
    }
    for caller in callers {
        caller.await.expect("caller");
    }
    let tallies = tallies.lock().await.clone();
    let total: u64 = tallies.values().map(|t| t.ok).sum();
    println!("{total} deposits acknowledged in {duration:?}");
    let answers = answers.lock().await.clone();
    (tallies, answers)
}

/// Caller `caller`'s own random numbers (xorshift), the same in every run.
pub fn caller_random(caller: u64) -> impl FnMut() -> u64 {
    let mut seed = caller.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

pub async fn balances(
    http: SocketAddr,
    tallies: &BTreeMap<String, Tally>,
) -> BTreeMap<String, u64> {
    let mut balances = BTreeMap::new();
    for id in tallies.keys() {
        balances.insert(id.clone(), balance(http, id).await);
    }
    balances
}

/// Asserts that every answer was 200, showing a few of the others.
pub fn assert_all_ok(answers: &[Answer]) {
    let failed: Vec<&Answer> = answers.iter().filter(|a| a.status != 200).collect();
    assert!(
        failed.is_empty(),
        "{} deposits failed, e.g. {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
}
