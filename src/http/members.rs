//! `GET /cluster/members`, `PUT /cluster/members/{address}` (leave/down), `POST /cluster/join`.

use super::{ApiError, Control, parse_address};
use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize, Serializer};
use tessera_cluster::{Address, MemberStatus};

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
}

/// `POST /cluster/join` with `{"address": "host:port"}`.
pub(super) async fn join(
    State(control): State<Control>,
    body: Result<Json<JoinRequest>, JsonRejection>,
) -> Result<Json<Message>, ApiError> {
    let Json(request) = body?;
    let address = parse_address(&request.address)?;
    control.join(address.clone())?;
    Ok(Json(Message {
        message: format!("joining {address}"),
    }))
}
