//! The soak's workload: concurrent clients, each sending one request at a time to a random
//! node — sharded account deposits (distinct random amounts) and reads, Distributed Data
//! counter increments and set adds with WriteMajority, and reads with ReadMajority — and
//! recording every operation in the [`History`].

use super::history::{
    Classified, History, Observed, Operation, Outcome, Request, classify_ddata, classify_entity,
    element_name, micros, parse_element,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tessera_harness::http_client::{self, HttpClientError, HttpResponse};

/// How long a client waits for an answer (an entity command's own timeout is 5 s; a paused
/// node answers nothing).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The timeout of Distributed Data's majority writes and reads.
const DDATA_TIMEOUT: &str = "3s";
/// After a refused connection (a node down) a client waits this long before its next request.
const REFUSED_BACKOFF: Duration = Duration::from_millis(100);
/// Deposit amounts are distinct and drawn from 1 to this: large, so that no sum of the
/// amounts whose outcome is unknown is likely to equal a doubled or lost one by chance.
const MAX_AMOUNT: u64 = 1 << 32;

/// What the clients work on.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    pub clients: usize,
    pub accounts: Vec<String>,
    /// Counter keys (`d-...` are durable on the nodes).
    pub counters: Vec<String>,
    pub sets: Vec<String>,
}

impl WorkloadConfig {
    pub fn standard() -> WorkloadConfig {
        WorkloadConfig {
            clients: 10,
            accounts: (0..40).map(|i| format!("acct-{i:02}")).collect(),
            counters: vec![
                "d-counter-0".into(),
                "d-counter-1".into(),
                "counter-2".into(),
                "counter-3".into(),
            ],
            sets: vec![
                "d-set-0".into(),
                "d-set-1".into(),
                "set-2".into(),
                "set-3".into(),
            ],
        }
    }
}

/// Values that must be unique over the whole soak: deposit amounts and set elements.
#[derive(Default)]
struct Uniques {
    amounts: Mutex<HashSet<u64>>,
    next_element: AtomicU64,
}

impl Uniques {
    fn amount(&self, rng: &mut SmallRng) -> u64 {
        let mut used = self.amounts.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let amount = rng.random_range(1..=MAX_AMOUNT);
            if used.insert(amount) {
                return amount;
            }
        }
    }

    fn element(&self) -> u64 {
        self.next_element.fetch_add(1, Ordering::Relaxed)
    }
}

/// Runs the clients from now until `end` (times recorded from `start`); each client's choices
/// come from `seed` and its number.
pub async fn run(
    config: WorkloadConfig,
    nodes: Vec<SocketAddr>,
    seed: u64,
    start: Instant,
    end: Instant,
    history: Arc<History>,
) {
    let uniques = Arc::new(Uniques::default());
    let config = Arc::new(config);
    let nodes = Arc::new(nodes);
    let mut clients = Vec::new();
    for client in 0..config.clients {
        let client_seed = seed ^ (client as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let (config, nodes, uniques, history) = (
            config.clone(),
            nodes.clone(),
            uniques.clone(),
            history.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(client_seed);
            while Instant::now() < end {
                let request = next_request(&config, &uniques, &mut rng);
                let node = rng.random_range(0..nodes.len());
                let operation = perform(client, node, nodes[node], request, start).await;
                let refused = operation.outcome == Outcome::Failed
                    && operation
                        .error
                        .as_deref()
                        .is_some_and(|e| e.contains("cannot connect"));
                history.record(operation);
                if refused {
                    tokio::time::sleep(REFUSED_BACKOFF).await;
                }
            }
        }));
    }
    for client in clients {
        let _ = client.await;
    }
}

/// The next request, by weight: deposits 30, account reads 15, counter increments 20, counter
/// reads 8, set adds 19, set reads 8.
fn next_request(config: &WorkloadConfig, uniques: &Uniques, rng: &mut SmallRng) -> Request {
    let pick = |rng: &mut SmallRng, keys: &[String]| keys[rng.random_range(0..keys.len())].clone();
    match rng.random_range(0..100) {
        0..30 => Request::Deposit {
            account: pick(rng, &config.accounts),
            amount: uniques.amount(rng),
        },
        30..45 => Request::AccountGet {
            account: pick(rng, &config.accounts),
        },
        45..65 => Request::CounterIncrement {
            key: pick(rng, &config.counters),
            by: rng.random_range(1..=5),
        },
        65..73 => Request::CounterRead {
            key: pick(rng, &config.counters),
        },
        73..92 => Request::SetAdd {
            key: pick(rng, &config.sets),
            element: uniques.element(),
        },
        _ => Request::SetRead {
            key: pick(rng, &config.sets),
        },
    }
}

/// Sends `request` to the node at `http` and records how it went.
pub async fn perform(
    client: usize,
    node: usize,
    http: SocketAddr,
    request: Request,
    start: Instant,
) -> Operation {
    let invoked_us = micros(start.elapsed());
    let (classified, observed, malformed) = match &request {
        Request::Deposit { account, amount } => {
            let body = format!("{{\"deposit\": {amount}}}");
            let answer = entity(http, account, &body).await;
            let (observed, malformed) = balance(&answer);
            (classify_entity(&answer), observed, malformed)
        }
        Request::AccountGet { account } => {
            let answer = entity(http, account, r#"{"get": null}"#).await;
            let (observed, malformed) = balance(&answer);
            (classify_entity(&answer), observed, malformed)
        }
        Request::CounterIncrement { key, by } => {
            let body = format!("{{\"increment\": {by}}}");
            let answer = ddata(http, "POST", "counter", key, Some(&body)).await;
            (classify_ddata(&answer), None, None)
        }
        Request::SetAdd { key, element } => {
            let body = format!("{{\"add\": \"{}\"}}", element_name(*element));
            let answer = ddata(http, "POST", "set", key, Some(&body)).await;
            (classify_ddata(&answer), None, None)
        }
        Request::CounterRead { key } => read_ddata(http, "counter", key).await,
        Request::SetRead { key } => read_ddata(http, "set", key).await,
    };
    Operation {
        client,
        node,
        request,
        invoked_us,
        completed_us: micros(start.elapsed()),
        outcome: classified.outcome,
        observed,
        error: classified.error,
        malformed,
    }
}

async fn entity(
    http: SocketAddr,
    account: &str,
    body: &str,
) -> Result<HttpResponse, HttpClientError> {
    let path = format!("/entities/account/{account}");
    http_client::request(http, "POST", &path, Some(body), REQUEST_TIMEOUT).await
}

async fn ddata(
    http: SocketAddr,
    method: &str,
    data_type: &str,
    key: &str,
    body: Option<&str>,
) -> Result<HttpResponse, HttpClientError> {
    let path = format!("/ddata/{data_type}/{key}?consistency=majority&timeout={DDATA_TIMEOUT}");
    http_client::request(http, method, &path, body, REQUEST_TIMEOUT).await
}

/// The balance in an entity's 200 answer (None otherwise); a 200 without one is malformed.
fn balance(answer: &Result<HttpResponse, HttpClientError>) -> (Option<Observed>, Option<String>) {
    match answer {
        Ok(response) if response.status == 200 => {
            match response.json().and_then(|j| j["balance"].as_u64()) {
                Some(balance) => (Some(Observed::Balance(balance)), None),
                None => (
                    None,
                    Some(format!("200 without a balance: {}", response.body)),
                ),
            }
        }
        _ => (None, None),
    }
}

/// A majority read of a counter or set: its value, 0 or empty for a key never written (404).
async fn read_ddata(
    http: SocketAddr,
    data_type: &str,
    key: &str,
) -> (Classified, Option<Observed>, Option<String>) {
    let answer = ddata(http, "GET", data_type, key, None).await;
    let empty = || match data_type {
        "counter" => Observed::Count(0),
        _ => Observed::Elements(Vec::new()),
    };
    match &answer {
        Ok(response) if response.status == 404 => (
            Classified {
                outcome: Outcome::Ok,
                error: None,
            },
            Some(empty()),
            None,
        ),
        Ok(response) if response.status == 200 => {
            let (observed, malformed) = ddata_value(data_type, response);
            (classify_ddata(&answer), observed, malformed)
        }
        _ => (classify_ddata(&answer), None, None),
    }
}

/// The value of a 200 answer to a counter or set read; what is wrong with it, if anything.
fn ddata_value(data_type: &str, response: &HttpResponse) -> (Option<Observed>, Option<String>) {
    let Some(json) = response.json() else {
        return (None, Some(format!("200 not JSON: {}", response.body)));
    };
    let value = &json["value"];
    if data_type == "counter" {
        return match value.as_i64() {
            Some(count) => (Some(Observed::Count(count)), None),
            None => (None, Some(format!("counter without a value: {json}"))),
        };
    }
    let Some(items) = value.as_array() else {
        return (None, Some(format!("set without a value: {json}")));
    };
    let mut elements = Vec::with_capacity(items.len());
    let mut foreign = Vec::new();
    for item in items {
        match item.as_str().and_then(parse_element) {
            Some(element) => elements.push(element),
            None => foreign.push(item.to_string()),
        }
    }
    elements.sort_unstable();
    let malformed = (!foreign.is_empty())
        .then(|| format!("elements the soak never writes: {}", foreign.join(", ")));
    (Some(Observed::Elements(elements)), malformed)
}

/// Reads `request` (an account get or a majority read) through `http` until it is answered
/// (at most `deadline`); the final reads of the check.
pub async fn read_until_answered(
    node: usize,
    http: SocketAddr,
    request: Request,
    start: Instant,
    deadline: Instant,
) -> Operation {
    loop {
        let operation = perform(usize::MAX, node, http, request.clone(), start).await;
        if operation.outcome == Outcome::Ok || Instant::now() >= deadline {
            return operation;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
