//! Cluster Bootstrap over HTTP (docs/src/design.md §3): discovering contact points (a static
//! list or DNS), probing their `GET /bootstrap/seed-nodes`, and acting on the decision of
//! [`tessera_cluster::bootstrap`] until this node is a member.
//!
//! The decision is a pure function in the cluster crate; this module only feeds it (the
//! discovery results and probe answers, with the time) and carries out what it decides:
//! joining the seed nodes a contact point offered, or this node itself when it is the lowest
//! of a stable, fully answered set of contact points.

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tessera_cluster::bootstrap::{
    BootstrapSettings, BootstrapState, ContactPoint, Decision, ProbeAnswer,
};
use tessera_cluster::node::{ClusterHandle, ClusterSnapshot};
use tessera_cluster::{Address, MemberStatus};
use tokio::sync::watch;

/// Where contact points come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Discovery {
    /// A fixed list.
    Static(Vec<ContactPoint>),
    /// A DNS name: SRV records (names starting with `_`) give hosts and ports; otherwise its
    /// A/AAAA records give the hosts and `port` the port.
    Dns {
        name: String,
        /// The DNS server to ask (`None`: the system's resolver configuration).
        server: Option<SocketAddr>,
        /// The contact points' HTTP port for A/AAAA records.
        port: u16,
    },
}

/// Everything the bootstrap process needs.
#[derive(Clone, Debug)]
pub struct BootstrapConfig {
    pub discovery: Discovery,
    pub settings: BootstrapSettings,
    /// How often discovery runs and every contact point is probed.
    pub probe_interval: Duration,
    /// Give up (and stop the node) when not a member this long after starting; None: never.
    pub shutdown_after_unsuccessful_join: Option<Duration>,
}

/// Why bootstrapping ended without this node becoming a member.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(
        "not a cluster member {after:?} after starting to bootstrap \
         (shutdown_after_unsuccessful_join); last state: {last}"
    )]
    Unsuccessful { after: Duration, last: String },
    #[error("DNS discovery cannot start: {0}")]
    Resolver(String),
    #[error("the cluster node stopped while bootstrapping")]
    ClusterStopped,
    #[error("the bootstrap task failed: {0}")]
    Crashed(String),
}

/// The answer of `GET /bootstrap/seed-nodes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedNodesAnswer {
    /// This node's cluster address.
    pub self_node: String,
    /// Members to join through: the Up and WeaklyUp members, when this node is one of them
    /// (empty while it is not a member, so that no one joins a node that is still joining).
    pub seed_nodes: Vec<SeedNode>,
    /// While this node is not a member: the seed nodes it is joining through, as members
    /// offered them to it (so that no one forms a second cluster meanwhile).
    #[serde(default)]
    pub joining_via: Vec<String>,
}

/// The seed nodes this node's bootstrap is joining through, shared with the
/// `/bootstrap/seed-nodes` answer. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct JoiningVia(Arc<Mutex<Vec<Address>>>);

impl JoiningVia {
    fn set(&self, seeds: Vec<Address>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = seeds;
    }

    fn get(&self) -> Vec<Address> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// One seed node in [`SeedNodesAnswer`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedNode {
    pub node: String,
    pub status: String,
    pub roles: Vec<String>,
}

/// The seed nodes this node offers, from its view of the cluster, or those it is joining
/// through while it is not a member.
pub fn seed_nodes_answer(
    snapshot: &ClusterSnapshot,
    self_address: &Address,
    joining_via: &JoiningVia,
) -> SeedNodesAnswer {
    let offering = matches!(
        snapshot.self_status,
        Some(MemberStatus::Up | MemberStatus::WeaklyUp)
    );
    let seed_nodes = if offering {
        snapshot
            .members
            .iter()
            .filter(|m| matches!(m.status, MemberStatus::Up | MemberStatus::WeaklyUp))
            .map(|m| SeedNode {
                node: m.unique_address.address.to_string(),
                status: m.status.as_str().to_string(),
                roles: m.roles.iter().cloned().collect(),
            })
            .collect()
    } else {
        Vec::new()
    };
    let joining_via = match snapshot.self_status {
        Some(MemberStatus::Up | MemberStatus::WeaklyUp) => Vec::new(),
        // Let in but not Up yet (or on its way out): it is in a cluster all the same, and
        // must not look like a node that knows of none, or a restarted lowest node could
        // form a second cluster meanwhile.
        Some(_) => snapshot
            .members
            .iter()
            .filter(|m| !matches!(m.status, MemberStatus::Down | MemberStatus::Removed))
            .filter(|m| &m.unique_address.address != self_address)
            .map(|m| m.unique_address.address.to_string())
            .collect(),
        None => joining_via.get().iter().map(Address::to_string).collect(),
    };
    SeedNodesAnswer {
        self_node: self_address.to_string(),
        seed_nodes,
        joining_via,
    }
}

#[derive(Clone)]
struct SeedNodesState {
    watch: watch::Receiver<ClusterSnapshot>,
    self_address: Address,
    joining_via: JoiningVia,
}

/// `GET /bootstrap/seed-nodes`, open to anyone who reaches the port (probing nodes are not
/// members yet and hold no token); it reveals only member addresses, statuses and roles.
pub fn router(
    watch: watch::Receiver<ClusterSnapshot>,
    self_address: Address,
    joining_via: JoiningVia,
) -> Router {
    Router::new()
        .route("/bootstrap/seed-nodes", get(seed_nodes))
        .with_state(SeedNodesState {
            watch,
            self_address,
            joining_via,
        })
}

async fn seed_nodes(State(state): State<SeedNodesState>) -> axum::Json<SeedNodesAnswer> {
    let answer = seed_nodes_answer(
        &state.watch.borrow(),
        &state.self_address,
        &state.joining_via,
    );
    axum::Json(answer)
}

/// Largest probe answer read (a thousand members fit easily).
const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// Most contact points probed (a DNS answer can list any number).
const MAX_CONTACT_POINTS: usize = 256;

/// Finds contact points.
enum Discoverer {
    Static(BTreeSet<ContactPoint>),
    Dns {
        resolver: Box<hickory_resolver::TokioResolver>,
        name: String,
        port: u16,
    },
}

impl Discoverer {
    fn new(discovery: &Discovery) -> Result<Self, BootstrapError> {
        use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig};
        use hickory_resolver::name_server::TokioConnectionProvider;
        match discovery {
            Discovery::Static(points) => Ok(Discoverer::Static(points.iter().cloned().collect())),
            Discovery::Dns { name, server, port } => {
                let mut builder = match server {
                    Some(server) => hickory_resolver::Resolver::builder_with_config(
                        ResolverConfig::from_parts(
                            None,
                            vec![],
                            NameServerConfigGroup::from_ips_clear(
                                &[server.ip()],
                                server.port(),
                                true,
                            ),
                        ),
                        TokioConnectionProvider::default(),
                    ),
                    None => hickory_resolver::Resolver::builder_tokio()
                        .map_err(|e| BootstrapError::Resolver(e.to_string()))?,
                };
                // Every round asks again: discovery must see nodes come and go, and the
                // stable margin is what smooths a changing answer, not a cache.
                builder.options_mut().cache_size = 0;
                builder.options_mut().timeout = Duration::from_secs(2);
                builder.options_mut().attempts = 1;
                Ok(Discoverer::Dns {
                    resolver: Box::new(builder.build()),
                    name: name.clone(),
                    port: *port,
                })
            }
        }
    }

    /// The contact points found now, or why none could be looked up (then the last result
    /// stands: a failed lookup says nothing about the nodes).
    async fn discover(&self) -> Result<BTreeSet<ContactPoint>, String> {
        match self {
            Discoverer::Static(points) => Ok(points.clone()),
            Discoverer::Dns {
                resolver,
                name,
                port,
            } => {
                let mut found = BTreeSet::new();
                if name.starts_with('_') {
                    let records = resolver
                        .srv_lookup(name.as_str())
                        .await
                        .map_err(|e| format!("SRV lookup of {name}: {e}"))?;
                    // Targets are looked up together, and one that does not resolve (a pod
                    // going away) is skipped, not allowed to hide the others.
                    let targets: Vec<(String, u16)> = records
                        .iter()
                        .take(MAX_CONTACT_POINTS)
                        .map(|srv| (srv.target().to_utf8(), srv.port()))
                        .collect();
                    let lookups = futures::future::join_all(
                        targets
                            .iter()
                            .map(|(target, _)| resolver.lookup_ip(target.as_str())),
                    )
                    .await;
                    for ((target, port), ips) in targets.iter().zip(lookups) {
                        match ips {
                            Ok(ips) => {
                                for ip in ips.iter() {
                                    found.insert(contact_point(ip, *port));
                                }
                            }
                            Err(e) => tracing::debug!(%target, error = %e,
                                "bootstrap: SRV target does not resolve; skipped"),
                        }
                    }
                } else {
                    let ips = resolver
                        .lookup_ip(name.as_str())
                        .await
                        .map_err(|e| format!("address lookup of {name}: {e}"))?;
                    for ip in ips.iter().take(MAX_CONTACT_POINTS) {
                        found.insert(contact_point(ip, *port));
                    }
                }
                Ok(found)
            }
        }
    }
}

fn contact_point(ip: IpAddr, port: u16) -> ContactPoint {
    match ip {
        IpAddr::V4(v4) => ContactPoint::new(v4.to_string(), port),
        IpAddr::V6(v6) => ContactPoint::new(format!("[{v6}]"), port),
    }
}

/// Asks one contact point for its seed nodes.
async fn probe(
    client: &reqwest::Client,
    point: &ContactPoint,
    timeout: Duration,
) -> Result<ProbeAnswer, String> {
    let url = format!("http://{point}/bootstrap/seed-nodes");
    let response = client
        .get(&url)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if !response.status().is_success() {
        return Err(format!("{url}: status {}", response.status()));
    }
    if response
        .content_length()
        .is_some_and(|n| n > MAX_ANSWER_BYTES as u64)
    {
        return Err(format!(
            "{url}: answer larger than {MAX_ANSWER_BYTES} bytes"
        ));
    }
    // Read in chunks: a chunked answer has no length to check up front.
    let mut response = response;
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| format!("{url}: {e}"))? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(format!(
                "{url}: answer larger than {MAX_ANSWER_BYTES} bytes"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    parse_seed_nodes_answer(&body).map_err(|e| format!("{url}: {e}"))
}

/// What a contact point's `/bootstrap/seed-nodes` answered, from the body's bytes.
pub fn parse_seed_nodes_answer(body: &[u8]) -> Result<ProbeAnswer, String> {
    let answer: SeedNodesAnswer =
        serde_json::from_slice(body).map_err(|e| format!("not a seed-nodes answer: {e}"))?;
    let self_node = answer
        .self_node
        .parse::<Address>()
        .map_err(|e| format!("self_node: {e}"))?;
    let seed_nodes = answer
        .seed_nodes
        .iter()
        .map(|s| s.node.parse::<Address>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("seed node: {e}"))?;
    let joining_via = answer
        .joining_via
        .iter()
        .map(|s| s.parse::<Address>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("joining via: {e}"))?;
    Ok(ProbeAnswer {
        self_node,
        seed_nodes,
        joining_via,
    })
}

/// Runs the bootstrap process until this node is a member of a cluster (Ok), gives up after
/// `shutdown_after_unsuccessful_join`, or the node stops.
pub async fn run(
    config: BootstrapConfig,
    cluster: ClusterHandle,
    joining_via: JoiningVia,
) -> Result<(), BootstrapError> {
    let discoverer = Discoverer::new(&config.discovery)?;
    // Probes go straight to the contact points: a proxy from the environment would answer
    // for them (or not at all) and no cluster would form.
    let client = reqwest::Client::builder()
        .connect_timeout(config.probe_interval)
        .no_proxy()
        .build()
        .map_err(|e| BootstrapError::Resolver(format!("HTTP client: {e}")))?;
    let self_address = cluster.self_node().address.clone();
    let mut watch = cluster.watch();
    let started = Instant::now();
    let mut state = BootstrapState::new();
    let mut last_said = String::new();
    let mut join_attempt = 0usize;
    let mut ticker = tokio::time::interval(config.probe_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if watch.borrow().self_status.is_some() {
            joining_via.set(Vec::new());
            tracing::info!("bootstrap: this node is a cluster member");
            return Ok(());
        }
        if cluster.stop_reason().is_some() {
            return Err(BootstrapError::ClusterStopped);
        }
        if let Some(limit) = config.shutdown_after_unsuccessful_join
            && started.elapsed() >= limit
        {
            return Err(BootstrapError::Unsuccessful {
                after: limit,
                last: last_said,
            });
        }
        match discoverer.discover().await {
            Ok(found) => state.on_discovery(started.elapsed(), found),
            Err(e) => tracing::warn!(error = %e, "bootstrap: contact point discovery failed"),
        }
        let points: Vec<ContactPoint> = state.contact_points().cloned().collect();
        let sent_at = started.elapsed();
        let answers = futures::future::join_all(
            points
                .iter()
                .map(|point| probe(&client, point, config.probe_interval)),
        )
        .await;
        let now = started.elapsed();
        for (point, answer) in points.iter().zip(answers) {
            match answer {
                Ok(answer) => state.on_probe_answer(sent_at, point, answer),
                Err(e) => {
                    tracing::debug!(%point, error = %e, "bootstrap: probe failed");
                    state.on_probe_failed(point);
                }
            }
        }
        let decision = state.decide(&config.settings, now, &self_address);
        joining_via.set(state.first_hand_seeds(&config.settings, now, &self_address));
        let said = match &decision {
            Decision::JoinSelf => format!("forming a new cluster: joining itself ({self_address})"),
            Decision::JoinSeeds(seeds) => format!(
                "joining the cluster of {}",
                seeds
                    .iter()
                    .map(Address::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Decision::Wait(reason) => format!("waiting: {reason}"),
        };
        if said != last_said {
            tracing::info!("bootstrap: {said}");
            last_said = said;
        }
        let target = match decision {
            Decision::JoinSelf => Some(self_address.clone()),
            Decision::JoinSeeds(seeds) => {
                // A different seed each round, in case one does not answer.
                let seed = seeds.get(join_attempt % seeds.len()).cloned();
                join_attempt += 1;
                seed
            }
            Decision::Wait(_) => None,
        };
        if let Some(target) = target {
            match cluster.join(target.clone()).await {
                Ok(()) => {}
                Err(e) => tracing::debug!(%target, error = %e, "bootstrap: join not sent"),
            }
        }
        tokio::select! {
            _ = ticker.tick() => {}
            _ = watch.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet as Set;
    use tessera_cluster::{Member, UniqueAddress};

    fn member(port: u16, status: MemberStatus) -> Member {
        Member {
            unique_address: UniqueAddress::new(Address::new("127.0.0.1", port), port as u64),
            status,
            roles: Set::from(["a".to_string()]),
            up_number: port as i32,
            app_version: "1".into(),
        }
    }

    #[test]
    fn a_member_offers_its_up_and_weakly_up_members_and_a_joining_node_offers_none() {
        let self_address = Address::new("127.0.0.1", 1);
        let mut snapshot = ClusterSnapshot {
            self_status: Some(MemberStatus::Up),
            members: vec![
                member(1, MemberStatus::Up),
                member(2, MemberStatus::WeaklyUp),
                member(3, MemberStatus::Joining),
                member(4, MemberStatus::Leaving),
            ],
            ..ClusterSnapshot::default()
        };
        let joining = JoiningVia::default();
        joining.set(vec![Address::new("127.0.0.1", 9)]);
        let answer = seed_nodes_answer(&snapshot, &self_address, &joining);
        assert_eq!(answer.self_node, "127.0.0.1:1");
        let offered: Vec<&str> = answer.seed_nodes.iter().map(|s| s.node.as_str()).collect();
        assert_eq!(offered, ["127.0.0.1:1", "127.0.0.1:2"]);
        assert_eq!(answer.seed_nodes[1].status, "weakly_up");
        assert!(
            answer.joining_via.is_empty(),
            "a member offers its members only"
        );
        // Let in but not Up: no seeds offered, but its cluster's members passed on, so that
        // nobody takes it for a node that knows of no cluster.
        snapshot.self_status = Some(MemberStatus::Joining);
        let answer = seed_nodes_answer(&snapshot, &self_address, &joining);
        assert!(answer.seed_nodes.is_empty());
        assert_eq!(
            answer.joining_via,
            ["127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"]
        );
        snapshot.self_status = None;
        let answer = seed_nodes_answer(&snapshot, &self_address, &joining);
        assert!(answer.seed_nodes.is_empty());
        assert_eq!(answer.joining_via, ["127.0.0.1:9"]);
    }
}
