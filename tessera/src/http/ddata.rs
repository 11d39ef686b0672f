//! Distributed Data over HTTP: `GET`, `POST` and `DELETE /ddata/{type}/{key}` and
//! `GET /ddata/keys?after=&limit=` (a page of keys in order), on the node's Replicator.
//!
//! Types: `counter` (PNCounter; `{"increment": n}`, `{"decrement": n}`), `set` (ORSet of
//! strings; `{"add": "x"}`, `{"remove": "x"}`), `register` (LWWRegister of JSON;
//! `{"set": <json>}`), `map` (LWWMap of string to JSON; `{"put": {"k": <json>, ...}}`,
//! `{"remove": "k"}`), `flag` (`{"switch_on": true}`). Every answer is
//! `{"type": ..., "key": ..., "value": ...}`; `?consistency=local|majority|all|N` (default
//! local) and `?timeout=2s` (default 3 s) choose how many replicas take part.
//!
//! Statuses: 404 for a key never written, 410 for a deleted key, 409 when the key holds
//! another type, 504 when the consistency level cannot be met in time (a write stays applied
//! on this node and spreads later), 503 when the Replicator is overloaded, 507 when the node's
//! replica is at one of its limits (naming it and its configuration key; nothing changed),
//! 400 naming the problem for a bad type, operation, consistency or timeout.

use super::ApiError;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json_;
use std::collections::BTreeMap;
use std::time::Duration;
use tessera_ddata::node::{ReplicatorError, ReplicatorHandle};
use tessera_ddata::replicator::{
    DeleteResult, GetResult, Limit, LimitExceeded, UpdateContext, UpdateResult,
};
use tessera_ddata::{LWWRegister, ReadConsistency, ReplicatedValue, ValueKind, WriteConsistency};

/// Timeout of non-local requests without `?timeout=`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest `?timeout=` accepted.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 256;

/// The routes, on `replicator`.
pub fn router(replicator: ReplicatorHandle) -> Router {
    Router::new()
        .route("/ddata/keys", get(keys))
        .route("/ddata/{type}/{key}", get(read).post(write).delete(remove))
        .with_state(replicator)
}

/// The data types of the HTTP API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataType {
    Counter,
    Set,
    Register,
    Map,
    Flag,
}

impl DataType {
    const NAMES: &'static str = "counter, set, register, map, flag";

    fn parse(name: &str) -> Result<Self, ApiError> {
        Ok(match name {
            "counter" => DataType::Counter,
            "set" => DataType::Set,
            "register" => DataType::Register,
            "map" => DataType::Map,
            "flag" => DataType::Flag,
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown data type {other:?}: expected one of {}",
                    Self::NAMES
                )));
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            DataType::Counter => "counter",
            DataType::Set => "set",
            DataType::Register => "register",
            DataType::Map => "map",
            DataType::Flag => "flag",
        }
    }

    fn kind(self) -> ValueKind {
        match self {
            DataType::Counter => ValueKind::PNCounter,
            DataType::Set => ValueKind::ORSet,
            DataType::Register => ValueKind::LWWRegister,
            DataType::Map => ValueKind::LWWMap,
            DataType::Flag => ValueKind::Flag,
        }
    }

    fn of_kind(kind: ValueKind) -> Option<Self> {
        [
            DataType::Counter,
            DataType::Set,
            DataType::Register,
            DataType::Map,
            DataType::Flag,
        ]
        .into_iter()
        .find(|t| t.kind() == kind)
    }
}

#[derive(Debug, Default, Deserialize)]
struct Params {
    consistency: Option<String>,
    timeout: Option<String>,
}

/// The consistency level of `?consistency=`: `local`, `majority`, `all` or a number of
/// replicas.
enum Level {
    Local,
    Majority,
    All,
    N(usize),
}

fn parse_level(text: Option<&str>) -> Result<Level, ApiError> {
    match text.unwrap_or("local") {
        "local" => Ok(Level::Local),
        "majority" => Ok(Level::Majority),
        "all" => Ok(Level::All),
        other => match other.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(Level::N(n)),
            _ => Err(ApiError::bad_request(format!(
                "invalid consistency {other:?}: expected local, majority, all or a number of replicas (1 or more)"
            ))),
        },
    }
}

fn read_consistency(level: &Level) -> ReadConsistency {
    match level {
        Level::Local => ReadConsistency::Local,
        Level::Majority => ReadConsistency::Majority { min_cap: 0 },
        Level::All => ReadConsistency::All,
        Level::N(n) => ReadConsistency::From(*n),
    }
}

fn write_consistency(level: &Level) -> WriteConsistency {
    match level {
        Level::Local => WriteConsistency::Local,
        Level::Majority => WriteConsistency::Majority { min_cap: 0 },
        Level::All => WriteConsistency::All,
        Level::N(n) => WriteConsistency::To(*n),
    }
}

fn parse_timeout(text: Option<&str>) -> Result<Duration, ApiError> {
    let Some(text) = text else {
        return Ok(DEFAULT_TIMEOUT);
    };
    match humantime::parse_duration(text) {
        Ok(d) if !d.is_zero() && d <= MAX_TIMEOUT => Ok(d),
        _ => Err(ApiError::bad_request(format!(
            "invalid timeout {text:?}: expected a duration like 2s or 500ms, at most {}s",
            MAX_TIMEOUT.as_secs()
        ))),
    }
}

fn parse_key(key: &str) -> Result<(), ApiError> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES || key.chars().any(char::is_control) {
        return Err(ApiError::bad_request(format!(
            "invalid key {:?}: expected 1 to {MAX_KEY_BYTES} bytes without control characters",
            key.chars().take(64).collect::<String>()
        )));
    }
    Ok(())
}

/// The answer of every successful request.
#[derive(Debug, Serialize)]
struct DataView {
    r#type: &'static str,
    key: String,
    value: Json_,
}

#[derive(Debug, Serialize)]
struct KeysView {
    keys: Vec<String>,
    /// Pass as `after` for the next page; `null` on the last one.
    next: Option<String>,
}

/// Keys per page of `GET /ddata/keys` unless `limit` says otherwise, and the most it may say.
const DEFAULT_KEYS_PER_PAGE: usize = 1_000;
const MAX_KEYS_PER_PAGE: usize = 10_000;

#[derive(Debug, Deserialize)]
struct KeysParams {
    after: Option<String>,
    limit: Option<String>,
}

/// The page size asked for, checked.
fn parse_limit(text: Option<&str>) -> Result<usize, ApiError> {
    let Some(text) = text else {
        return Ok(DEFAULT_KEYS_PER_PAGE);
    };
    match text.parse::<usize>() {
        Ok(limit) if (1..=MAX_KEYS_PER_PAGE).contains(&limit) => Ok(limit),
        _ => Err(ApiError::bad_request(format!(
            "limit {text:?} must be a whole number from 1 to {MAX_KEYS_PER_PAGE}"
        ))),
    }
}

fn unavailable(e: ReplicatorError) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
}

fn wrong_type(key: &str, held: ValueKind, asked: DataType) -> ApiError {
    let held = DataType::of_kind(held).map_or(held.name(), DataType::name);
    ApiError::new(
        StatusCode::CONFLICT,
        format!("key {key:?} holds a {held}, not a {}", asked.name()),
    )
}

/// Stored JSON text back to JSON (text that is not JSON is returned as a string).
fn json_of(text: &str) -> Json_ {
    serde_json::from_str(text).unwrap_or_else(|_| Json_::String(text.to_string()))
}

/// The JSON rendering of a value of the API's types.
fn render(value: &ReplicatedValue) -> Json_ {
    match value {
        ReplicatedValue::PNCounter(c) => {
            let n = c.value();
            match i64::try_from(n) {
                Ok(n) => Json_::from(n),
                // Beyond JSON's safe integers: the exact value as text.
                Err(_) => Json_::String(n.to_string()),
            }
        }
        ReplicatedValue::ORSet(s) => {
            Json_::Array(s.elements().cloned().map(Json_::String).collect())
        }
        ReplicatedValue::LWWRegister(r) => json_of(r.value()),
        ReplicatedValue::LWWMap(m) => Json_::Object(
            m.entries()
                .into_iter()
                .map(|(k, v)| (k, json_of(&v)))
                .collect(),
        ),
        ReplicatedValue::Flag(f) => Json_::Bool(f.is_enabled()),
        other => Json_::String(format!("<{}>", other.kind())),
    }
}

fn view(
    data_type: DataType,
    key: String,
    value: &ReplicatedValue,
) -> Result<Json<DataView>, ApiError> {
    if value.kind() != data_type.kind() {
        return Err(wrong_type(&key, value.kind(), data_type));
    }
    Ok(Json(DataView {
        r#type: data_type.name(),
        key,
        value: render(value),
    }))
}

/// The parts every `/ddata/{type}/{key}` request shares, checked: the type, the consistency
/// level and the timeout.
fn request_parts(
    type_name: &str,
    key: &str,
    params: Result<Query<Params>, QueryRejection>,
) -> Result<(DataType, Level, Duration), ApiError> {
    let data_type = DataType::parse(type_name)?;
    parse_key(key)?;
    let Query(params) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let level = parse_level(params.consistency.as_deref())?;
    let timeout = parse_timeout(params.timeout.as_deref())?;
    Ok((data_type, level, timeout))
}

async fn keys(
    State(replicator): State<ReplicatorHandle>,
    params: Result<Query<KeysParams>, QueryRejection>,
) -> Result<Json<KeysView>, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let limit = parse_limit(params.limit.as_deref())?;
    let page = replicator
        .keys(params.after.as_deref(), limit)
        .await
        .map_err(unavailable)?;
    let next = if page.more {
        page.keys.last().cloned()
    } else {
        None
    };
    Ok(Json(KeysView {
        keys: page.keys,
        next,
    }))
}

async fn read(
    State(replicator): State<ReplicatorHandle>,
    Path((type_name, key)): Path<(String, String)>,
    params: Result<Query<Params>, QueryRejection>,
) -> Result<Json<DataView>, ApiError> {
    let (data_type, level, timeout) = request_parts(&type_name, &key, params)?;
    let result = replicator
        .get(&key, read_consistency(&level), timeout)
        .await
        .map_err(unavailable)?;
    match result {
        GetResult::Found(value) => view(data_type, key, &value),
        GetResult::NotFound => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no key {key:?}"),
        )),
        GetResult::Deleted => Err(ApiError::new(
            StatusCode::GONE,
            format!("key {key:?} was deleted"),
        )),
        GetResult::Timeout => Err(ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "reading {key:?}: not enough replicas answered within {}",
                humantime::format_duration(timeout)
            ),
        )),
        GetResult::Failed(reason) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, reason)),
    }
}

/// An operation of a POST body.
enum Operation {
    Increment(u64),
    Decrement(u64),
    Add(String),
    RemoveElement(String),
    Set(String),
    Put(BTreeMap<String, String>),
    RemoveEntry(String),
    SwitchOn,
}

/// The one operation of a body like `{"increment": 1}`, checked against the type.
fn parse_operation(data_type: DataType, body: &Json_) -> Result<Operation, ApiError> {
    let expected = match data_type {
        DataType::Counter => r#"{"increment": n} or {"decrement": n}"#,
        DataType::Set => r#"{"add": "x"} or {"remove": "x"}"#,
        DataType::Register => r#"{"set": <json>}"#,
        DataType::Map => r#"{"put": {"k": <json>}} or {"remove": "k"}"#,
        DataType::Flag => r#"{"switch_on": true}"#,
    };
    let bad = |what: &str| {
        ApiError::bad_request(format!(
            "invalid {} operation: {what}; expected {expected}",
            data_type.name()
        ))
    };
    let Some(object) = body.as_object() else {
        return Err(bad("the body is not a JSON object"));
    };
    let mut fields = object.iter();
    let (Some((name, argument)), None) = (fields.next(), fields.next()) else {
        return Err(bad("the object must have exactly one field"));
    };
    let count = |argument: &Json_| {
        argument.as_u64().ok_or_else(|| {
            bad(&format!(
                "{name} takes a non-negative integer, got {argument}"
            ))
        })
    };
    let text = |argument: &Json_| {
        argument
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| bad(&format!("{name} takes a string, got {argument}")))
    };
    Ok(match (data_type, name.as_str()) {
        (DataType::Counter, "increment") => Operation::Increment(count(argument)?),
        (DataType::Counter, "decrement") => Operation::Decrement(count(argument)?),
        (DataType::Set, "add") => Operation::Add(text(argument)?),
        (DataType::Set, "remove") => Operation::RemoveElement(text(argument)?),
        (DataType::Register, "set") => Operation::Set(argument.to_string()),
        (DataType::Map, "put") => {
            let entries = argument
                .as_object()
                .ok_or_else(|| bad(&format!("put takes an object, got {argument}")))?;
            Operation::Put(
                entries
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_string()))
                    .collect(),
            )
        }
        (DataType::Map, "remove") => Operation::RemoveEntry(text(argument)?),
        (DataType::Flag, "switch_on") => match argument {
            Json_::Bool(true) => Operation::SwitchOn,
            other => return Err(bad(&format!("switch_on takes true, got {other}"))),
        },
        (_, other) => return Err(bad(&format!("unknown operation {other:?}"))),
    })
}

/// Applies the operation to the current value (or the type's empty value).
fn apply(
    data_type: DataType,
    operation: Operation,
    current: Option<ReplicatedValue>,
    context: &UpdateContext<'_>,
) -> Result<ReplicatedValue, String> {
    let node = context.self_node;
    let mismatch = |value: &ReplicatedValue| {
        format!(
            "the key holds a {}, not a {}",
            DataType::of_kind(value.kind()).map_or(value.kind().name(), DataType::name),
            data_type.name()
        )
    };
    Ok(match (current, operation) {
        (None, op) => {
            let empty = data_type.kind().empty();
            return match (empty, op) {
                (None, Operation::Set(json)) => {
                    Ok(LWWRegister::new(node.clone(), json, context.now_wall_ms).into())
                }
                (Some(empty), op) => apply(data_type, op, Some(empty), context),
                (None, _) => Err("a register is created by a set".to_string()),
            };
        }
        (Some(ReplicatedValue::PNCounter(mut c)), Operation::Increment(n)) => {
            c.increment(node, n);
            c.into()
        }
        (Some(ReplicatedValue::PNCounter(mut c)), Operation::Decrement(n)) => {
            c.decrement(node, n);
            c.into()
        }
        (Some(ReplicatedValue::ORSet(mut s)), Operation::Add(x)) => {
            s.add(node, x);
            s.into()
        }
        (Some(ReplicatedValue::ORSet(mut s)), Operation::RemoveElement(x)) => {
            s.remove(&x);
            s.into()
        }
        (Some(ReplicatedValue::LWWRegister(mut r)), Operation::Set(json)) => {
            let timestamp = tessera_ddata::next_timestamp(r.timestamp_ms(), context.now_wall_ms);
            r.set(node, json, timestamp);
            r.into()
        }
        (Some(ReplicatedValue::LWWMap(mut m)), Operation::Put(entries)) => {
            for (k, v) in entries {
                m.put(node, k, v, context.now_wall_ms);
            }
            m.into()
        }
        (Some(ReplicatedValue::LWWMap(mut m)), Operation::RemoveEntry(k)) => {
            m.remove(&k);
            m.into()
        }
        (Some(ReplicatedValue::Flag(mut f)), Operation::SwitchOn) => {
            f.switch_on();
            f.into()
        }
        (Some(other), _) => return Err(mismatch(&other)),
    })
}

async fn write(
    State(replicator): State<ReplicatorHandle>,
    Path((type_name, key)): Path<(String, String)>,
    params: Result<Query<Params>, QueryRejection>,
    body: Result<Json<Json_>, JsonRejection>,
) -> Result<Json<DataView>, ApiError> {
    let (data_type, level, timeout) = request_parts(&type_name, &key, params)?;
    let Json(body) = body?;
    let operation = parse_operation(data_type, &body)?;
    let result = replicator
        .update(
            &key,
            write_consistency(&level),
            timeout,
            move |current, context| apply(data_type, operation, current, context),
        )
        .await
        .map_err(unavailable)?;
    match result {
        UpdateResult::Success => {}
        UpdateResult::Timeout => {
            return Err(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "writing {key:?}: not enough replicas acknowledged within {}; the write is applied on this node and will spread",
                    humantime::format_duration(timeout)
                ),
            ));
        }
        UpdateResult::Deleted => {
            return Err(ApiError::new(
                StatusCode::GONE,
                format!("key {key:?} was deleted"),
            ));
        }
        UpdateResult::Invalid(reason) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("key {key:?}: {reason}"),
            ));
        }
        UpdateResult::LimitReached(refused) => return Err(limit_reached(&refused)),
        UpdateResult::Failed(reason) => {
            return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, reason));
        }
    }
    match replicator
        .get(&key, ReadConsistency::Local, timeout)
        .await
        .map_err(unavailable)?
    {
        GetResult::Found(value) => view(data_type, key, &value),
        other => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("key {key:?} was written but reads {other:?}"),
        )),
    }
}

async fn remove(
    State(replicator): State<ReplicatorHandle>,
    Path((type_name, key)): Path<(String, String)>,
    params: Result<Query<Params>, QueryRejection>,
) -> Result<Json<Json_>, ApiError> {
    let (data_type, level, timeout) = request_parts(&type_name, &key, params)?;
    if let GetResult::Found(value) = replicator
        .get(&key, ReadConsistency::Local, timeout)
        .await
        .map_err(unavailable)?
        && value.kind() != data_type.kind()
    {
        return Err(wrong_type(&key, value.kind(), data_type));
    }
    match replicator
        .delete(&key, write_consistency(&level), timeout)
        .await
        .map_err(unavailable)?
    {
        DeleteResult::Success => Ok(Json(serde_json::json!({
            "type": data_type.name(), "key": key, "deleted": true
        }))),
        DeleteResult::Timeout => Err(ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "deleting {key:?}: not enough replicas acknowledged within {}; the key is deleted on this node and the deletion will spread",
                humantime::format_duration(timeout)
            ),
        )),
        DeleteResult::LimitReached(refused) => Err(limit_reached(&refused)),
        DeleteResult::Failed(reason) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, reason)),
    }
}

/// The node configuration key of each Replicator limit, named in the refusals.
fn config_key(limit: Limit) -> &'static str {
    match limit {
        Limit::Keys => "ddata_max_keys",
        Limit::ValueBytes => "ddata_max_value_bytes",
        Limit::TotalBytes => "ddata_max_total_bytes",
    }
}

/// 507 Insufficient Storage naming the limit, its numbers and its configuration key: the
/// node cannot hold the new state (nothing changed). Retrying does not help until an
/// operator raises the limit (a deleted key stays, as its tombstone).
fn limit_reached(refused: &LimitExceeded) -> ApiError {
    let setting = config_key(refused.limit());
    let message = match refused {
        LimitExceeded::Keys {
            key,
            held,
            max_keys,
        } => format!(
            "key {key:?} not created: this node holds {held} Distributed Data keys (deleted \
             ones included), {setting} = {max_keys}"
        ),
        LimitExceeded::ValueBytes {
            key,
            size_bytes,
            max_value_bytes,
        } => format!(
            "key {key:?} not written: its value would be {size_bytes} bytes encoded, more \
             than {setting} = {max_value_bytes}"
        ),
        LimitExceeded::TotalBytes {
            key,
            held_bytes,
            would_hold_bytes,
            max_total_bytes,
        } => format!(
            "key {key:?} not written: this node holds {held_bytes} bytes of Distributed Data \
             and would hold {would_hold_bytes}, more than {setting} = {max_total_bytes}"
        ),
    };
    ApiError::new(StatusCode::INSUFFICIENT_STORAGE, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_cluster::{Address, UniqueAddress};
    use tessera_ddata::PNCounter;

    fn context(node: &UniqueAddress) -> UpdateContext<'_> {
        UpdateContext {
            self_node: node,
            now_wall_ms: 1_000,
        }
    }

    #[test]
    fn operations_are_checked_against_the_type() {
        let ok = |t, body: Json_| parse_operation(t, &body).is_ok();
        assert!(ok(DataType::Counter, serde_json::json!({"increment": 3})));
        assert!(!ok(DataType::Counter, serde_json::json!({"increment": -3})));
        assert!(!ok(DataType::Counter, serde_json::json!({"add": "x"})));
        assert!(!ok(
            DataType::Counter,
            serde_json::json!({"increment": 1, "decrement": 1})
        ));
        assert!(ok(DataType::Set, serde_json::json!({"remove": "x"})));
        assert!(!ok(DataType::Set, serde_json::json!({"add": 1})));
        assert!(ok(
            DataType::Register,
            serde_json::json!({"set": {"any": [1, "json"]}})
        ));
        assert!(ok(
            DataType::Map,
            serde_json::json!({"put": {"a": 1, "b": null}})
        ));
        assert!(!ok(DataType::Map, serde_json::json!({"put": 1})));
        assert!(ok(DataType::Flag, serde_json::json!({"switch_on": true})));
        assert!(!ok(DataType::Flag, serde_json::json!({"switch_on": false})));
        let error = parse_operation(DataType::Set, &serde_json::json!([1]))
            .err()
            .unwrap();
        assert!(
            error.message.contains("not a JSON object"),
            "{}",
            error.message
        );
    }

    #[test]
    fn every_type_renders_its_json() {
        let node = UniqueAddress::new(Address::new("h", 1), 1);
        let run = |t, body: Json_| {
            let op = parse_operation(t, &body).unwrap();
            render(&apply(t, op, None, &context(&node)).unwrap())
        };
        assert_eq!(
            run(DataType::Counter, serde_json::json!({"decrement": 2})),
            serde_json::json!(-2)
        );
        assert_eq!(
            run(DataType::Set, serde_json::json!({"add": "x"})),
            serde_json::json!(["x"])
        );
        assert_eq!(
            run(DataType::Register, serde_json::json!({"set": {"a": [1]}})),
            serde_json::json!({"a": [1]})
        );
        assert_eq!(
            run(DataType::Map, serde_json::json!({"put": {"k": "v"}})),
            serde_json::json!({"k": "v"})
        );
        assert_eq!(
            run(DataType::Flag, serde_json::json!({"switch_on": true})),
            serde_json::json!(true)
        );
    }

    #[test]
    fn an_operation_on_another_type_is_refused() {
        let node = UniqueAddress::new(Address::new("h", 1), 1);
        let counter: ReplicatedValue = PNCounter::new().into();
        let error = apply(
            DataType::Set,
            Operation::Add("x".into()),
            Some(counter),
            &context(&node),
        )
        .unwrap_err();
        assert!(error.contains("counter"), "{error}");
    }

    #[test]
    fn a_keys_page_size_is_checked() {
        assert_eq!(parse_limit(None).unwrap(), DEFAULT_KEYS_PER_PAGE);
        assert_eq!(parse_limit(Some("1")).unwrap(), 1);
        assert_eq!(parse_limit(Some("10000")).unwrap(), MAX_KEYS_PER_PAGE);
        for bad in ["0", "10001", "-3", "many", ""] {
            let error = parse_limit(Some(bad)).err().unwrap();
            assert!(error.message.contains("limit"), "{}", error.message);
        }
    }

    #[test]
    fn consistency_and_timeout_are_parsed_with_clear_errors() {
        assert!(matches!(parse_level(None), Ok(Level::Local)));
        assert!(matches!(parse_level(Some("2")), Ok(Level::N(2))));
        let error = parse_level(Some("most")).err().unwrap();
        assert!(error.message.contains("\"most\""), "{}", error.message);
        assert!(parse_level(Some("0")).is_err());
        assert_eq!(
            parse_timeout(Some("500ms")).unwrap(),
            Duration::from_millis(500)
        );
        assert!(parse_timeout(Some("0s")).is_err());
        assert!(parse_timeout(Some("2h")).is_err());
        assert!(parse_key("").is_err());
        assert!(parse_key("a\nb").is_err());
        assert!(parse_key(&"k".repeat(MAX_KEY_BYTES + 1)).is_err());
    }
}
