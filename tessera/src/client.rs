//! `tessera` as a client of a running node's management API (in the spirit of Petabridge.Cmd
//! and Akka Management's CLI): members, join/leave/down, shards, Distributed Data and entity
//! commands, printed as tables for people or as the node's JSON for scripts.
//!
//! Every failure maps to an exit code that says what failed (see [`ClientError::exit_code`]),
//! so that a script can tell "the node is not there" from "the token is wrong" from "the
//! command was refused" from "the outcome is unknown".

use reqwest::{Method, StatusCode};
use serde_json::Value;
use std::fmt::Write as _;
use std::time::Duration;

/// The node's default management API address (a node's default `http_port` on loopback).
pub const DEFAULT_NODE: &str = "http://127.0.0.1:8558";

/// Where and how to reach the node.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// The node's management API, e.g. `http://127.0.0.1:8558` (`http://` may be left out).
    pub node: String,
    /// The bearer token (`http_token` of the node), if it needs one.
    pub token: Option<String>,
    /// Print the node's JSON instead of a table.
    pub json: bool,
    /// How long to wait for the node's answer.
    pub timeout: Duration,
}

/// One client command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientCommand {
    /// `GET /cluster/members`.
    Members,
    /// The node joins the cluster at this cluster address (its own address forms one).
    Join(String),
    /// The member at this address leaves gracefully.
    Leave(String),
    /// The member at this address is marked down.
    Down(String),
    /// Every region's shards of an entity type.
    Shards(String),
    /// Reads a Distributed Data key.
    DdataGet {
        data_type: String,
        key: String,
        consistency: Option<String>,
    },
    /// Applies an operation (JSON, e.g. `{"increment": 1}`) to a Distributed Data key.
    DdataUpdate {
        data_type: String,
        key: String,
        operation: String,
        consistency: Option<String>,
    },
    /// Deletes a Distributed Data key (for good).
    DdataDelete {
        data_type: String,
        key: String,
        consistency: Option<String>,
    },
    /// Every projection's instances, nodes, offsets and lag.
    Projections,
    /// Pauses, resumes or resets (`operation`) a projection.
    ProjectionControl {
        operation: String,
        name: Option<String>,
    },
    /// Sends a JSON command to an entity.
    Entity {
        entity_type: String,
        id: String,
        command: String,
    },
}

/// Why a client command failed; each kind has its own exit code.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Bad input on the command line (not sent).
    #[error("{0}")]
    Usage(String),
    /// The node did not answer: not running, wrong address, or too slow.
    #[error("cannot reach the node at {node}: {reason}")]
    Unreachable { node: String, reason: String },
    /// 401: no token, or the wrong one.
    #[error(
        "the node at {node} refused the token: {message} (pass --token or set TESSERA_TOKEN to \
         the node's http_token)"
    )]
    Unauthorized { node: String, message: String },
    /// Another 4xx: the command was refused and had no effect.
    #[error("refused ({status}): {message}")]
    Refused { status: u16, message: String },
    /// 5xx other than 504: the node could not do it; nothing took effect.
    #[error("the node could not do it ({status}): {message}")]
    Unavailable { status: u16, message: String },
    /// 504: the command may or may not have taken effect.
    #[error("outcome unknown (504): {message}")]
    OutcomeUnknown { message: String },
    /// The node answered something that is not what its API promises.
    #[error("unexpected answer from the node: {0}")]
    BadAnswer(String),
}

impl ClientError {
    /// The process exit code: 2 usage, 3 unreachable, 4 unauthorized, 5 refused (not
    /// applied), 6 unavailable (not applied), 7 outcome unknown, 8 unexpected answer.
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Usage(_) => 2,
            ClientError::Unreachable { .. } => 3,
            ClientError::Unauthorized { .. } => 4,
            ClientError::Refused { .. } => 5,
            ClientError::Unavailable { .. } => 6,
            ClientError::OutcomeUnknown { .. } => 7,
            ClientError::BadAnswer(_) => 8,
        }
    }
}

/// Runs `command` against the node and returns what to print.
pub async fn run(command: &ClientCommand, options: &ClientOptions) -> Result<String, ClientError> {
    let base = base_url(&options.node)?;
    // Straight to the node: a proxy from the environment would see the token.
    let http = reqwest::Client::builder()
        .timeout(options.timeout)
        .no_proxy()
        .build()
        .map_err(|e| ClientError::Usage(format!("HTTP client: {e}")))?;
    let call = |method: Method, path: String, body: Option<Value>| {
        request(&http, &base, options, method, path, body)
    };
    let answer = match command {
        ClientCommand::Members => call(Method::GET, "/cluster/members".into(), None).await?,
        ClientCommand::Join(address) => {
            call(
                Method::POST,
                "/cluster/join".into(),
                Some(serde_json::json!({ "address": address })),
            )
            .await?
        }
        ClientCommand::Leave(address) | ClientCommand::Down(address) => {
            let operation = if matches!(command, ClientCommand::Leave(_)) {
                "leave"
            } else {
                "down"
            };
            call(
                Method::PUT,
                format!("/cluster/members/{}", encode(address)),
                Some(serde_json::json!({ "operation": operation })),
            )
            .await?
        }
        ClientCommand::Shards(entity_type) => {
            call(
                Method::GET,
                format!("/sharding/{}/cluster", encode(entity_type)),
                None,
            )
            .await?
        }
        ClientCommand::DdataGet {
            data_type,
            key,
            consistency,
        } => {
            call(
                Method::GET,
                ddata_path(data_type, key, consistency.as_deref()),
                None,
            )
            .await?
        }
        ClientCommand::DdataUpdate {
            data_type,
            key,
            operation,
            consistency,
        } => {
            let body = parse_json("the operation", operation)?;
            call(
                Method::POST,
                ddata_path(data_type, key, consistency.as_deref()),
                Some(body),
            )
            .await?
        }
        ClientCommand::DdataDelete {
            data_type,
            key,
            consistency,
        } => {
            call(
                Method::DELETE,
                ddata_path(data_type, key, consistency.as_deref()),
                None,
            )
            .await?
        }
        ClientCommand::Projections => call(Method::GET, "/projections".into(), None).await?,
        ClientCommand::ProjectionControl { operation, name } => {
            let Some(name) = name else {
                return Err(ClientError::Usage(format!(
                    "tessera projections {operation} needs the projection's NAME"
                )));
            };
            call(
                Method::POST,
                format!("/projections/{}/{}", encode(name), encode(operation)),
                None,
            )
            .await?
        }
        ClientCommand::Entity {
            entity_type,
            id,
            command: text,
        } => {
            let body = parse_json("the command", text)?;
            call(
                Method::POST,
                format!("/entities/{}/{}", encode(entity_type), encode(id)),
                Some(body),
            )
            .await?
        }
    };
    if options.json {
        return serde_json::to_string_pretty(&answer)
            .map_err(|e| ClientError::BadAnswer(e.to_string()));
    }
    Ok(match command {
        ClientCommand::Members => members_table(&answer)?,
        ClientCommand::Shards(_) => shards_table(&answer)?,
        ClientCommand::Projections => projections_table(&answer)?,
        ClientCommand::Join(_)
        | ClientCommand::Leave(_)
        | ClientCommand::Down(_)
        | ClientCommand::ProjectionControl { .. } => answer
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| answer.to_string()),
        ClientCommand::DdataGet { .. }
        | ClientCommand::DdataUpdate { .. }
        | ClientCommand::DdataDelete { .. }
        | ClientCommand::Entity { .. } => serde_json::to_string_pretty(&answer)
            .map_err(|e| ClientError::BadAnswer(e.to_string()))?,
    })
}

fn base_url(node: &str) -> Result<reqwest::Url, ClientError> {
    let text = if node.contains("://") {
        node.to_string()
    } else {
        format!("http://{node}")
    };
    let url = reqwest::Url::parse(&text)
        .map_err(|e| ClientError::Usage(format!("--node {node:?} is not a URL: {e}")))?;
    if url.scheme() != "http" {
        return Err(ClientError::Usage(format!(
            "--node {node:?}: only http:// is served by a node"
        )));
    }
    Ok(url)
}

/// Percent-encodes one path segment.
fn encode(segment: &str) -> String {
    // `.` and `..` would be taken as path steps and vanish from the URL.
    if segment.bytes().all(|b| b == b'.') {
        return segment.bytes().map(|_| "%2E").collect();
    }
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~:".contains(&byte) {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

fn ddata_path(data_type: &str, key: &str, consistency: Option<&str>) -> String {
    let mut path = format!("/ddata/{}/{}", encode(data_type), encode(key));
    if let Some(consistency) = consistency {
        path.push_str("?consistency=");
        path.push_str(&encode(consistency));
    }
    path
}

fn parse_json(what: &str, text: &str) -> Result<Value, ClientError> {
    serde_json::from_str(text)
        .map_err(|e| ClientError::Usage(format!("{what} is not JSON ({e}): {text}")))
}

async fn request(
    http: &reqwest::Client,
    base: &reqwest::Url,
    options: &ClientOptions,
    method: Method,
    path: String,
    body: Option<Value>,
) -> Result<Value, ClientError> {
    let url = base
        .join(&path)
        .map_err(|e| ClientError::Usage(format!("{path}: {e}")))?;
    // A change that timed out after it was sent may still take effect on the node.
    let changes = method != Method::GET;
    let mut request = http.request(method, url);
    if let Some(token) = &options.token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let node = options.node.clone();
    let failed = |e: reqwest::Error| {
        if changes && e.is_timeout() && !e.is_connect() {
            ClientError::OutcomeUnknown {
                message: format!(
                    "no answer from {node} within {:?}; the command was sent and may still \
                     take effect",
                    options.timeout
                ),
            }
        } else {
            ClientError::Unreachable {
                node: node.clone(),
                reason: describe(&e),
            }
        }
    };
    let response = request.send().await.map_err(failed)?;
    let status = response.status();
    let bytes = response.bytes().await.map_err(failed)?;
    let parsed = serde_json::from_slice::<Value>(&bytes);
    if status.is_success() {
        return parsed.map_err(|_| {
            ClientError::BadAnswer(format!(
                "{status}: {}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
            ))
        });
    }
    // The status says what happened even when the body is not the node's JSON (a proxy's
    // page, say).
    let message = match &parsed {
        Ok(value) => value
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("no message")
            .to_string(),
        Err(_) => String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).to_string(),
    };
    Err(match status {
        StatusCode::UNAUTHORIZED => ClientError::Unauthorized { node, message },
        StatusCode::GATEWAY_TIMEOUT => ClientError::OutcomeUnknown { message },
        s if s.is_client_error() => ClientError::Refused {
            status: s.as_u16(),
            message,
        },
        s => ClientError::Unavailable {
            status: s.as_u16(),
            message,
        },
    })
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "no answer in time".into()
    } else if e.is_connect() {
        "connection refused or no route (is the node running, and is --node right?)".into()
    } else {
        let mut text = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(cause) = source {
            let _ = write!(text, ": {cause}");
            source = cause.source();
        }
        text
    }
}

/// Columns padded to their widest cell.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out.trim_end().to_string()
}

fn field<'a>(value: &'a Value, name: &str) -> Result<&'a Value, ClientError> {
    value
        .get(name)
        .ok_or_else(|| ClientError::BadAnswer(format!("no {name:?} in {value}")))
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn members_table(answer: &Value) -> Result<String, ClientError> {
    let leader = answer.get("leader").map(text).unwrap_or_default();
    let self_address = answer.get("self").map(text).unwrap_or_default();
    let members = field(answer, "members")?
        .as_array()
        .ok_or_else(|| ClientError::BadAnswer("members is not a list".into()))?;
    let rows: Vec<Vec<String>> = members
        .iter()
        .map(|m| {
            let address = m.get("address").map(text).unwrap_or_default();
            let mut notes = Vec::new();
            if address == leader {
                notes.push("leader");
            }
            if address == self_address {
                notes.push("self");
            }
            let roles: Vec<String> = m
                .get("roles")
                .and_then(Value::as_array)
                .map(|r| r.iter().map(text).collect())
                .unwrap_or_default();
            vec![
                address,
                m.get("status").map(text).unwrap_or_default(),
                match m.get("reachable").and_then(Value::as_bool) {
                    Some(true) => "yes".into(),
                    Some(false) => "NO".into(),
                    None => "-".into(),
                },
                m.get("up_number").map(text).unwrap_or_default(),
                if roles.is_empty() {
                    "-".into()
                } else {
                    roles.join(",")
                },
                notes.join(","),
            ]
        })
        .collect();
    Ok(table(
        &["ADDRESS", "STATUS", "REACHABLE", "UP#", "ROLES", ""],
        &rows,
    ))
}

fn shards_table(answer: &Value) -> Result<String, ClientError> {
    let regions = field(answer, "regions")?
        .as_array()
        .ok_or_else(|| ClientError::BadAnswer("regions is not a list".into()))?;
    let mut rows = Vec::new();
    for region in regions {
        let shards = region
            .get("shards")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let entities: u64 = shards
            .iter()
            .filter_map(|s| s.get("entities").and_then(Value::as_u64))
            .sum();
        rows.push(vec![
            region.get("address").map(text).unwrap_or_default(),
            shards.len().to_string(),
            entities.to_string(),
            String::new(),
        ]);
    }
    for failed in answer
        .get("failed")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        rows.push(vec![
            failed.get("address").map(text).unwrap_or_default(),
            "-".into(),
            "-".into(),
            format!(
                "did not answer: {}",
                failed.get("error").map(text).unwrap_or_default()
            ),
        ]);
    }
    Ok(table(&["REGION", "SHARDS", "ENTITIES", ""], &rows))
}

/// One row per projection instance: where it runs, its state, offset and lag.
fn projections_table(answer: &Value) -> Result<String, ClientError> {
    let projections = field(answer, "projections")?
        .as_array()
        .ok_or_else(|| ClientError::BadAnswer("projections is not a list".into()))?;
    let number = |value: Option<&Value>| match value {
        Some(Value::Null) | None => "-".to_string(),
        Some(value) => text(value),
    };
    let mut rows = Vec::new();
    for projection in projections {
        let name = projection.get("name").map(text).unwrap_or_default();
        let paused = projection.get("paused").and_then(Value::as_bool) == Some(true);
        for instance in projection
            .get("instance_status")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let state = instance.get("state").map(text).unwrap_or_default();
            rows.push(vec![
                name.clone(),
                format!(
                    "{}/{}",
                    number(instance.get("index")),
                    number(projection.get("instances"))
                ),
                number(instance.get("node")),
                if paused && state != "paused" {
                    format!("{state} (pausing)")
                } else {
                    state
                },
                number(instance.get("offset_events")),
                number(instance.get("handled")),
                number(instance.get("lag_events")),
                number(instance.get("lag_seconds")),
                number(instance.get("handler_errors")),
            ]);
        }
    }
    for failed in answer
        .get("failed")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        rows.push(vec![
            format!(
                "{} did not answer: {}",
                failed.get("address").map(text).unwrap_or_default(),
                failed.get("error").map(text).unwrap_or_default()
            ),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }
    Ok(table(
        &[
            "PROJECTION",
            "INSTANCE",
            "NODE",
            "STATE",
            "OFFSET",
            "HANDLED",
            "LAG",
            "LAG_S",
            "ERRORS",
        ],
        &rows,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projections_render_one_row_per_instance_and_members_that_did_not_answer() {
        let answer = serde_json::json!({
            "projections": [{
                "name": "balances", "instances": 2, "paused": true,
                "instance_status": [
                    {"index": 0, "node": "127.0.0.1:1", "state": "paused", "offset_events": 10,
                     "handled": 12, "lag_events": 0, "lag_seconds": 0.0, "handler_errors": 0},
                    {"index": 1, "node": null, "state": "unknown"}
                ]
            }],
            "failed": [{"address": "127.0.0.1:3", "error": "timed out"}]
        });
        let table = projections_table(&answer).expect("table");
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        assert!(lines[0].starts_with("PROJECTION"), "{table}");
        assert!(
            lines[1].contains("0/2") && lines[1].contains("paused"),
            "{table}"
        );
        assert!(
            lines[2].contains("1/2") && lines[2].contains("unknown (pausing)"),
            "{table}"
        );
        assert!(
            lines[3].contains("127.0.0.1:3 did not answer: timed out"),
            "{table}"
        );
        assert!(projections_table(&serde_json::json!({})).is_err());
    }

    #[test]
    fn members_render_as_a_table_with_the_leader_and_self_marked() {
        let answer = serde_json::json!({
            "self": "127.0.0.1:2",
            "leader": "127.0.0.1:1",
            "members": [
                {"address": "127.0.0.1:1", "uid": 1, "status": "up", "roles": ["a", "b"], "reachable": true, "up_number": 1},
                {"address": "127.0.0.1:2", "uid": 2, "status": "weakly_up", "roles": [], "reachable": false, "up_number": 2}
            ]
        });
        let table = members_table(&answer).expect("table");
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(lines[0].starts_with("ADDRESS"));
        assert!(
            lines[1].contains("up") && lines[1].ends_with("leader"),
            "{table}"
        );
        assert!(lines[1].contains("a,b"));
        assert!(
            lines[2].contains("NO") && lines[2].ends_with("self"),
            "{table}"
        );
    }

    #[test]
    fn shards_list_regions_and_the_ones_that_failed() {
        let answer = serde_json::json!({
            "type": "account",
            "regions": [{"address": "127.0.0.1:1", "shards": [{"id": "1", "entities": 2}, {"id": "7", "entities": 3}]}],
            "failed": [{"address": "127.0.0.1:2", "error": "timed out"}]
        });
        let table = shards_table(&answer).expect("table");
        assert!(table.contains("127.0.0.1:1  2       5"), "{table}");
        assert!(table.contains("did not answer: timed out"), "{table}");
    }

    #[test]
    fn paths_are_encoded_and_urls_need_no_scheme() {
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
        assert_eq!(encode(".."), "%2E%2E");
        assert_eq!(
            ddata_path("counter", "hits/x", Some("majority")),
            "/ddata/counter/hits%2Fx?consistency=majority"
        );
        assert_eq!(
            base_url("127.0.0.1:8558").expect("url").as_str(),
            "http://127.0.0.1:8558/"
        );
        assert!(matches!(base_url("https://x"), Err(ClientError::Usage(_))));
    }

    #[tokio::test]
    async fn an_unreachable_node_is_exit_code_3_and_bad_json_is_2() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let options = ClientOptions {
            node: format!("127.0.0.1:{port}"),
            token: None,
            json: false,
            timeout: Duration::from_secs(2),
        };
        let error = run(&ClientCommand::Members, &options)
            .await
            .expect_err("nothing listens");
        assert_eq!(error.exit_code(), 3, "{error}");
        let error = run(
            &ClientCommand::Entity {
                entity_type: "account".into(),
                id: "a".into(),
                command: "{deposit".into(),
            },
            &options,
        )
        .await
        .expect_err("not JSON");
        assert_eq!(error.exit_code(), 2, "{error}");
    }
}
