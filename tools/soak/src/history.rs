//! The soak's history: every operation the workload invoked, with when it was invoked and
//! completed and how it ended — ok (applied, or read), failed (definitely not applied) or
//! unknown (it may or may not have been applied) — the way Jepsen records one. The checker
//! works on this record alone.

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;
use tessera_harness::http_client::{HttpClientError, HttpResponse};

/// The kinds of operation, in the order the summary lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpKind {
    /// A sharded account's `{"deposit": n}`.
    Deposit,
    /// A sharded account's `{"get": null}` (a read the journal confirms current).
    AccountGet,
    /// `{"increment": n}` on a Distributed Data counter (PNCounter) with WriteMajority.
    CounterIncrement,
    /// A counter read with ReadMajority.
    CounterRead,
    /// `{"add": element}` on a Distributed Data set (ORSet) with WriteMajority.
    SetAdd,
    /// A set read with ReadMajority.
    SetRead,
}

impl OpKind {
    pub const ALL: [OpKind; 6] = [
        OpKind::Deposit,
        OpKind::AccountGet,
        OpKind::CounterIncrement,
        OpKind::CounterRead,
        OpKind::SetAdd,
        OpKind::SetRead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Deposit => "deposit",
            OpKind::AccountGet => "account-get",
            OpKind::CounterIncrement => "counter-increment",
            OpKind::CounterRead => "counter-read",
            OpKind::SetAdd => "set-add",
            OpKind::SetRead => "set-read",
        }
    }
}

/// What an operation asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Request {
    Deposit { account: String, amount: u64 },
    AccountGet { account: String },
    CounterIncrement { key: String, by: u64 },
    CounterRead { key: String },
    SetAdd { key: String, element: u64 },
    SetRead { key: String },
}

impl Request {
    pub fn kind(&self) -> OpKind {
        match self {
            Request::Deposit { .. } => OpKind::Deposit,
            Request::AccountGet { .. } => OpKind::AccountGet,
            Request::CounterIncrement { .. } => OpKind::CounterIncrement,
            Request::CounterRead { .. } => OpKind::CounterRead,
            Request::SetAdd { .. } => OpKind::SetAdd,
            Request::SetRead { .. } => OpKind::SetRead,
        }
    }

    /// Whether the operation changes state (a read changes nothing, whatever its outcome).
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Request::Deposit { .. } | Request::CounterIncrement { .. } | Request::SetAdd { .. }
        )
    }
}

/// How an operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Applied (a write), or answered (a read).
    Ok,
    /// Definitely not applied: refused before anything was written, or never sent.
    Failed,
    /// It may or may not have been applied (or, for a read, no answer).
    Unknown,
}

/// What a read returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Observed {
    Balance(u64),
    Count(i64),
    /// A set's elements written by the soak (`e<n>`), sorted.
    Elements(Vec<u64>),
}

/// An element of a soak set as stored: `e<n>`.
pub fn element_name(element: u64) -> String {
    format!("e{element}")
}

/// The number in an element name, if it is one the soak writes.
pub fn parse_element(name: &str) -> Option<u64> {
    name.strip_prefix('e')?.parse().ok()
}

/// One operation: who sent it where, when (from the start of the soak), what it asked and how
/// it ended.
#[derive(Clone, Debug, Serialize)]
pub struct Operation {
    pub client: usize,
    /// The node asked (0-based).
    pub node: usize,
    #[serde(flatten)]
    pub request: Request,
    pub invoked_us: u64,
    pub completed_us: u64,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed: Option<Observed>,
    /// Why it failed or is unknown: the status and error, or the client's error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Something in the answer that breaks the API's contract (a set element the soak never
    /// wrote, a read answered 200 without a value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub malformed: Option<String>,
}

impl Operation {
    pub fn kind(&self) -> OpKind {
        self.request.kind()
    }
}

pub fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// The operations recorded so far. Clients append as their operations complete; the record
/// is bounded by the soak's duration (one entry per completed request).
#[derive(Default)]
pub struct History {
    operations: Mutex<Vec<Operation>>,
}

impl History {
    pub fn record(&self, operation: Operation) {
        self.operations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(operation);
    }

    /// Every operation, in completion order.
    pub fn operations(&self) -> Vec<Operation> {
        self.operations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Per kind of operation: how many ended ok, failed and unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    pub ok: u64,
    pub failed: u64,
    pub unknown: u64,
}

pub fn tally(operations: &[Operation]) -> BTreeMap<OpKind, Tally> {
    let mut tallies: BTreeMap<OpKind, Tally> =
        OpKind::ALL.iter().map(|k| (*k, Tally::default())).collect();
    for operation in operations {
        let tally = tallies.entry(operation.kind()).or_default();
        match operation.outcome {
            Outcome::Ok => tally.ok += 1,
            Outcome::Failed => tally.failed += 1,
            Outcome::Unknown => tally.unknown += 1,
        }
    }
    tallies
}

/// How an answer (or the lack of one) classifies: the outcome and, unless ok, why.
pub struct Classified {
    pub outcome: Outcome,
    pub error: Option<String>,
}

/// Classifies the answer to an entity command by the API's contract: 200 applied; an error
/// says `"outcome": "not_applied" | "unknown" | "applied"`; without that field, 4xx and 503
/// are not applied and anything else is unknown. A request that could not connect was never
/// sent; one that got no answer may have been applied.
pub fn classify_entity(answer: &Result<HttpResponse, HttpClientError>) -> Classified {
    match answer {
        Ok(response) if response.status == 200 => ok(),
        Ok(response) => {
            let stated = response
                .json()
                .and_then(|j| j["outcome"].as_str().map(str::to_string));
            let outcome = match stated.as_deref() {
                Some("applied") => Outcome::Ok,
                Some("not_applied") => Outcome::Failed,
                Some(_) => Outcome::Unknown,
                None => by_status(response.status),
            };
            Classified {
                outcome,
                error: Some(describe(response)),
            }
        }
        Err(e) => no_answer(e),
    }
}

/// Classifies the answer to a Distributed Data request: 200 done; 4xx and 503 (overloaded, not
/// a member) not applied; 504 (the consistency level not met in time: applied on the node
/// asked, spreading later) and anything else unknown.
pub fn classify_ddata(answer: &Result<HttpResponse, HttpClientError>) -> Classified {
    match answer {
        Ok(response) if response.status == 200 => ok(),
        Ok(response) => Classified {
            outcome: by_status(response.status),
            error: Some(describe(response)),
        },
        Err(e) => no_answer(e),
    }
}

fn ok() -> Classified {
    Classified {
        outcome: Outcome::Ok,
        error: None,
    }
}

fn by_status(status: u16) -> Outcome {
    match status {
        400..=499 | 503 => Outcome::Failed,
        _ => Outcome::Unknown,
    }
}

fn no_answer(error: &HttpClientError) -> Classified {
    let outcome = match error {
        HttpClientError::Connect { .. } => Outcome::Failed,
        _ => Outcome::Unknown,
    };
    Classified {
        outcome,
        error: Some(error.to_string()),
    }
}

/// `<status>: <error>` of an error answer, short.
fn describe(response: &HttpResponse) -> String {
    let error = response
        .json()
        .and_then(|j| j["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| response.body.chars().take(200).collect());
    format!("{}: {error}", response.status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: &str) -> Result<HttpResponse, HttpClientError> {
        Ok(HttpResponse {
            status,
            body: body.to_string(),
        })
    }

    #[test]
    fn entity_errors_classify_by_their_stated_outcome_first() {
        let outcome = |status, body| classify_entity(&answer(status, body)).outcome;
        assert_eq!(outcome(200, r#"{"balance": 3}"#), Outcome::Ok);
        assert_eq!(
            outcome(503, r#"{"error": "x", "outcome": "not_applied"}"#),
            Outcome::Failed
        );
        assert_eq!(
            outcome(504, r#"{"error": "x", "outcome": "unknown"}"#),
            Outcome::Unknown
        );
        // A stated outcome wins over the status.
        assert_eq!(
            outcome(503, r#"{"error": "x", "outcome": "unknown"}"#),
            Outcome::Unknown
        );
        assert_eq!(
            outcome(500, r#"{"error": "x", "outcome": "applied"}"#),
            Outcome::Ok
        );
        // Without one: 4xx and 503 not applied, anything else unknown.
        assert_eq!(outcome(409, r#"{"error": "x"}"#), Outcome::Failed);
        assert_eq!(outcome(503, "overloaded"), Outcome::Failed);
        assert_eq!(outcome(502, "bad gateway"), Outcome::Unknown);
    }

    #[test]
    fn a_request_that_never_connected_failed_and_one_without_an_answer_is_unknown() {
        let address = "127.0.0.1:1".parse().expect("address");
        let refused = Err(HttpClientError::Connect {
            address,
            reason: "Connection refused".into(),
        });
        assert_eq!(classify_ddata(&refused).outcome, Outcome::Failed);
        let timed_out = Err(HttpClientError::Timeout {
            address,
            timeout: Duration::from_secs(1),
        });
        assert_eq!(classify_entity(&timed_out).outcome, Outcome::Unknown);
        assert_eq!(
            classify_ddata(&answer(504, r#"{"error": "timeout"}"#)).outcome,
            Outcome::Unknown
        );
    }
}
