//! `GET /cluster/members`, `PUT /cluster/members/{address}` (leave/down), `POST /cluster/join`.

use super::{ApiError, ClusterControl, Control, outcome_unknown, parse_address};
use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize, Serializer};
use std::time::Duration;
use tessera_cluster::{Address, MemberStatus};
use tokio::time::Instant;

/// How long `POST /cluster/join` waits for the join to be confirmed when the body names no
/// `timeout`.
pub const JOIN_WAIT_DEFAULT: Duration = Duration::from_secs(10);
/// Longest `timeout` a join accepts (the request timeout may cut it shorter).
pub const JOIN_WAIT_MAX: Duration = Duration::from_secs(60);
/// How often a join looks at the membership while it waits.
const JOIN_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The membership as one node sees it, handed to the API by [`super::ClusterControl`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MembersView {
    /// This node's address.
    #[serde(rename = "self", serialize_with = "as_string")]
    pub self_address: Address,
    /// This node's own status; `None` before it is a member. Drives `/health/ready`.
    #[serde(skip)]
    pub self_status: Option<MemberStatus>,
    /// The current leader, if any.
    #[serde(serialize_with = "as_optional_string")]
    pub leader: Option<Address>,
    /// Every known member.
    pub members: Vec<MemberView>,
}

/// One member in [`MembersView`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemberView {
    /// The member's cluster address.
    #[serde(serialize_with = "as_string")]
    pub address: Address,
    /// The incarnation uid.
    pub uid: u64,
    /// Lifecycle status (`up`, `weakly_up`, ...).
    #[serde(serialize_with = "status_name")]
    pub status: MemberStatus,
    /// The member's roles.
    pub roles: Vec<String>,
    /// Whether every observer currently reaches it.
    pub reachable: bool,
    /// Age order: lower became Up earlier.
    pub up_number: i32,
}

fn as_string<S: Serializer>(address: &Address, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(address)
}

fn as_optional_string<S: Serializer>(address: &Option<Address>, s: S) -> Result<S::Ok, S::Error> {
    match address {
        Some(address) => s.collect_str(address),
        None => s.serialize_none(),
    }
}

fn status_name<S: Serializer>(status: &MemberStatus, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(status.as_str())
}

/// A confirmation: `{"message": "..."}`.
#[derive(Debug, Serialize)]
pub(super) struct Message {
    message: String,
}

/// `GET /cluster/members`.
pub(super) async fn list(State(control): State<Control>) -> Json<MembersView> {
    Json(control.members())
}

/// Body of `PUT /cluster/members/{address}`.
#[derive(Debug, Deserialize)]
pub(super) struct OperationRequest {
    operation: String,
}

/// `PUT /cluster/members/{address}` with `{"operation": "leave"|"down"}`.
pub(super) async fn update(
    State(control): State<Control>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<OperationRequest>, JsonRejection>,
) -> Result<Json<Message>, ApiError> {
    let Path(address) = path?;
    let address = parse_address(&address)?;
    let Json(request) = body?;
    let message = match request.operation.as_str() {
        "leave" => {
            control.leave(address.clone())?;
            format!("leave requested for {address}")
        }
        "down" => {
            control.down(address.clone())?;
            format!("down requested for {address}")
        }
        other => {
            return Err(ApiError::bad_request(format!(
                "unknown operation {other:?}: expected \"leave\" or \"down\""
            )));
        }
    };
    Ok(Json(Message { message }))
}

/// Body of `POST /cluster/join`.
#[derive(Debug, Deserialize)]
pub(super) struct JoinRequest {
    address: String,
    /// How long to wait for the outcome, like `5s`; [`JOIN_WAIT_DEFAULT`] when absent.
    #[serde(default)]
    timeout: Option<String>,
}

/// Answer of a confirmed join: `{"message": "...", "status": "up"}`.
#[derive(Debug, Serialize)]
pub(super) struct Joined {
    message: String,
    /// This node's member status when the join was confirmed.
    status: &'static str,
}

/// `POST /cluster/join` with `{"address": "host:port"}` and optionally `"timeout": "5s"`.
///
/// Sends the join, then waits until this node is a member (joining, weakly up or up) of a
/// cluster that `address` belongs to: 200 with the status reached. 504 when that is not seen in
/// time: the join was sent and may still succeed, so the outcome is unknown.
pub(super) async fn join(
    State(control): State<Control>,
    body: Result<Json<JoinRequest>, JsonRejection>,
) -> Result<Json<Joined>, Response> {
    let (address, wait) = join_request(body).map_err(IntoResponse::into_response)?;
    control
        .join(address.clone())
        .map_err(|e| ApiError::from(e).into_response())?;
    match confirm_join(control.as_ref(), &address, wait).await {
        Ok(status) => Ok(Json(Joined {
            message: format!("joined the cluster of {address}; this node is {status}"),
            status: status.as_str(),
        })),
        Err(seen) => Err(outcome_unknown(format!(
            "join of {address} sent but not confirmed within {}: {seen}; the outcome is \
             unknown, see GET /cluster/members",
            humantime::format_duration(wait)
        ))),
    }
}

fn join_request(
    body: Result<Json<JoinRequest>, JsonRejection>,
) -> Result<(Address, Duration), ApiError> {
    let Json(request) = body?;
    let address = parse_address(&request.address)?;
    let wait = match request.timeout.as_deref() {
        None => JOIN_WAIT_DEFAULT,
        Some(text) => match humantime::parse_duration(text) {
            Ok(wait) if !wait.is_zero() && wait <= JOIN_WAIT_MAX => wait,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "invalid timeout {text:?}: expected a duration like 5s or 500ms, at most {}s",
                    JOIN_WAIT_MAX.as_secs()
                )));
            }
        },
    };
    Ok((address, wait))
}

/// Polls the membership until this node is a member of the cluster of `address` (its status,
/// Ok) or `wait` has passed (what was seen last, Err).
async fn confirm_join(
    control: &dyn ClusterControl,
    address: &Address,
    wait: Duration,
) -> Result<MemberStatus, String> {
    let deadline = Instant::now() + wait;
    loop {
        let view = control.members();
        if let Some(status) = joined_status(&view, address) {
            return Ok(status);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(match view.self_status {
                None => "this node is not a member yet".to_string(),
                Some(status) if is_member(status) => {
                    format!("this node is {status}, but {address} is not among its members")
                }
                Some(status) => format!("this node is {status}"),
            });
        }
        tokio::time::sleep(JOIN_POLL_INTERVAL.min(deadline - now)).await;
    }
}

/// This node's status when it is a member of a cluster that lists `address`.
fn joined_status(view: &MembersView, address: &Address) -> Option<MemberStatus> {
    let status = view.self_status.filter(|s| is_member(*s))?;
    view.members
        .iter()
        .any(|m| &m.address == address)
        .then_some(status)
}

/// Whether a node in `status` has joined (and not started leaving).
fn is_member(status: MemberStatus) -> bool {
    matches!(
        status,
        MemberStatus::Joining | MemberStatus::WeaklyUp | MemberStatus::Up
    )
}
