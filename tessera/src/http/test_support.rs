//! A fake [`ClusterControl`] for the router tests: a fixed membership, recorded commands, a
//! settable failure and a scripted join outcome.

use super::{ClusterControl, ControlError, MemberView, MembersView, NodeMetrics};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tessera_cluster::{Address, MemberStatus};

/// A command the fake received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Join(Address),
    Leave(Address),
    Down(Address),
}

pub struct FakeControl {
    pub view: Mutex<MembersView>,
    pub metrics: NodeMetrics,
    pub calls: Mutex<Vec<Call>>,
    /// Returned by every command when set.
    pub fail_with: Mutex<Option<ControlError>>,
    /// How long after a join this node shows itself Up in the joined cluster; None: never.
    pub join_confirmed_after: Mutex<Option<Duration>>,
    /// A join that will show in the membership: the address joined, and from when.
    pending_join: Mutex<Option<(Address, Instant)>>,
    /// Why the node is not ready beyond its member status (unregistered shard regions).
    pub not_ready: Mutex<Option<String>>,
}

fn member(address: &str, uid: u64, up_number: i32, roles: &[&str]) -> MemberView {
    MemberView {
        address: addr(address),
        uid,
        status: MemberStatus::Up,
        roles: roles.iter().map(|r| r.to_string()).collect(),
        reachable: true,
        up_number,
    }
}

pub fn addr(s: &str) -> Address {
    s.parse().unwrap()
}

impl FakeControl {
    /// Two Up members, 127.0.0.1:25520 (self, leader) and 127.0.0.1:25521.
    pub fn two_up() -> Self {
        Self::with_view(MembersView {
            self_address: addr("127.0.0.1:25520"),
            self_status: Some(MemberStatus::Up),
            leader: Some(addr("127.0.0.1:25520")),
            members: vec![
                member("127.0.0.1:25520", 7, 1, &[]),
                member("127.0.0.1:25521", 8, 2, &["backend"]),
            ],
        })
    }

    /// 127.0.0.1:25520, not a member of any cluster yet; a join shows as Up in the joined
    /// cluster after `join_confirmed_after` (never when None).
    pub fn not_a_member(join_confirmed_after: Option<Duration>) -> Self {
        let fake = Self::with_view(MembersView {
            self_address: addr("127.0.0.1:25520"),
            self_status: None,
            leader: None,
            members: Vec::new(),
        });
        *fake.join_confirmed_after.lock().unwrap() = join_confirmed_after;
        fake
    }

    fn with_view(view: MembersView) -> Self {
        Self {
            view: Mutex::new(view),
            metrics: NodeMetrics::default(),
            calls: Mutex::new(Vec::new()),
            fail_with: Mutex::new(None),
            join_confirmed_after: Mutex::new(None),
            pending_join: Mutex::new(None),
            not_ready: Mutex::new(None),
        }
    }

    pub fn set_self_status(&self, status: Option<MemberStatus>) {
        self.view.lock().unwrap().self_status = status;
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn command(&self, call: Call) -> Result<(), ControlError> {
        if let Some(err) = self.fail_with.lock().unwrap().clone() {
            return Err(err);
        }
        let known = |a: &Address| {
            self.view
                .lock()
                .unwrap()
                .members
                .iter()
                .any(|m| &m.address == a)
        };
        match &call {
            Call::Leave(a) | Call::Down(a) if !known(a) => {
                return Err(ControlError::UnknownMember(a.clone()));
            }
            _ => {}
        }
        self.calls.lock().unwrap().push(call);
        Ok(())
    }

    /// Applies a pending join whose time has come: self Up, with the joined address (and
    /// self) among the members.
    fn apply_pending_join(&self, view: &mut MembersView) {
        let mut pending = self.pending_join.lock().unwrap();
        let Some((joined, _)) = pending.take_if(|(_, at)| *at <= Instant::now()) else {
            return;
        };
        view.self_status = Some(MemberStatus::Up);
        for address in [view.self_address.clone(), joined] {
            if !view.members.iter().any(|m| m.address == address) {
                let up_number = view.members.len() as i32 + 1;
                view.members.push(MemberView {
                    address,
                    ..member("127.0.0.1:1", 1, up_number, &[])
                });
            }
        }
    }
}

impl ClusterControl for FakeControl {
    fn members(&self) -> MembersView {
        let mut view = self.view.lock().unwrap();
        self.apply_pending_join(&mut view);
        view.clone()
    }

    fn join(&self, address: Address) -> Result<(), ControlError> {
        self.command(Call::Join(address.clone()))?;
        if let Some(after) = *self.join_confirmed_after.lock().unwrap() {
            *self.pending_join.lock().unwrap() = Some((address, Instant::now() + after));
        }
        Ok(())
    }

    fn leave(&self, address: Address) -> Result<(), ControlError> {
        self.command(Call::Leave(address))
    }

    fn down(&self, address: Address) -> Result<(), ControlError> {
        self.command(Call::Down(address))
    }

    fn metrics(&self) -> NodeMetrics {
        self.metrics.clone()
    }

    fn not_ready_reason(&self) -> Option<String> {
        self.not_ready.lock().unwrap().clone()
    }
}

/// A small entity type for the entity routes' tests: a tally that `add` raises and `take`
/// lowers, never below zero; every reply is the tally.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tally;

/// What a tally is asked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TallyCommand {
    Add(u64),
    Take(u64),
    Get,
}

/// Why a tally refused.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TallyRejection {
    TooLittle { tally: u64, asked: u64 },
}

impl std::fmt::Display for TallyRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TallyRejection::TooLittle { tally, asked } => {
                write!(f, "cannot take {asked} from a tally of {tally}")
            }
        }
    }
}

impl tessera_entities::EntityType for Tally {
    type Command = TallyCommand;
    type Event = i64;
    type State = u64;
    type Reply = u64;
    type Rejection = TallyRejection;

    const TYPE_NAME: &'static str = "tally";
    const EVENT_MANIFEST: &'static str = "tally.Event";
    const STATE_MANIFEST: &'static str = "tally.State";

    fn initial_state(&self, _entity_id: &str) -> u64 {
        0
    }

    fn handle_command(&self, tally: &u64, command: TallyCommand) -> tessera_entities::Effect<Self> {
        use tessera_entities::Effect;
        match command {
            TallyCommand::Add(n) => Effect::persist(n as i64).then_reply(|tally| *tally),
            TallyCommand::Take(n) if n > *tally => Effect::reject(TallyRejection::TooLittle {
                tally: *tally,
                asked: n,
            }),
            TallyCommand::Take(n) => Effect::persist(-(n as i64)).then_reply(|tally| *tally),
            TallyCommand::Get => Effect::reply(*tally),
        }
    }

    fn apply_event(&self, tally: &mut u64, event: &i64) {
        *tally = tally.saturating_add_signed(*event);
    }
}

/// A response to [`request`]: status and body.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub body: String,
}

impl HttpResponse {
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_str(&self.body).ok()
    }
}

/// `GET path` of a server on `address`.
pub async fn get(
    address: std::net::SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<HttpResponse, String> {
    request(address, "GET", path, None, timeout).await
}

/// A request with an optional JSON body, on a connection of its own (the servers' connection
/// counters and idle timeouts in the tests expect one per request).
pub async fn request(
    address: std::net::SocketAddr,
    method: &str,
    path: &str,
    json_body: Option<&str>,
    timeout: Duration,
) -> Result<HttpResponse, String> {
    let method = reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| e.to_string())?;
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| e.to_string())?;
    let mut request = client
        .request(method, format!("http://{address}{path}"))
        .timeout(timeout);
    if let Some(body) = json_body {
        request = request
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response.text().await.map_err(|e| e.to_string())?;
    Ok(HttpResponse { status, body })
}
