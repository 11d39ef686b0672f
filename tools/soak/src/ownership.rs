//! Who hosts which account, sampled in stable views: the check that no entity is live on two
//! nodes needs samples in which a legitimate move cannot look like a duplicate.
//!
//! Reading `GET /sharding/account` on every node takes time, and a shard handed off between
//! two reads (stopped on A after A was read, started on B before B was read) would show on
//! both. So a sample counts only when, around the reads:
//!
//! - every node that answers sees the same members (by address and incarnation uid), all Up
//!   and reachable, and every member answers — before the reads and again after them, unchanged
//!   (no node joined, left, died or was downed meanwhile, and none is cut off or paused);
//! - no handoff completed and no region began one: the sum over the nodes of the coordinator's
//!   completed handoffs and the regions' handoffs is the same before and after the reads. A
//!   shard's new owner starts it only after the coordinator recorded the old owner's handoff as
//!   complete, so a move between the reads changes the sum.
//!
//! In such a sample an account listed by two nodes was live on both at once.

use super::metrics::{metrics_text, series_value};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tessera_harness::http_client;
use tokio::sync::watch;

/// Time between samples.
const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);

/// A member as one node sees it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Member {
    pub address: String,
    pub uid: u64,
    pub status: String,
    pub reachable: bool,
}

/// One node's view of the membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembersView {
    pub self_address: String,
    pub members: BTreeSet<Member>,
}

/// `GET /cluster/members` of the node at `http`; None when it does not answer in time.
pub async fn members(http: SocketAddr) -> Option<MembersView> {
    let response = http_client::get(http, "/cluster/members", HTTP_TIMEOUT)
        .await
        .ok()?;
    if response.status != 200 {
        return None;
    }
    let json = response.json()?;
    let members = json["members"]
        .as_array()?
        .iter()
        .map(|m| {
            Some(Member {
                address: m["address"].as_str()?.to_string(),
                uid: m["uid"].as_u64()?,
                status: m["status"].as_str()?.to_string(),
                reachable: m["reachable"].as_bool()?,
            })
        })
        .collect::<Option<BTreeSet<Member>>>()?;
    Some(MembersView {
        self_address: json["self"].as_str()?.to_string(),
        members,
    })
}

/// Every node's view (None: it did not answer), in node order.
pub async fn views(https: &[SocketAddr]) -> Vec<Option<MembersView>> {
    futures::future::join_all(https.iter().map(|&h| members(h))).await
}

/// The members, when `views` show one converged cluster: every node that answered sees the
/// same members, all Up and reachable, and every member is a node that answered.
pub fn converged(views: &[Option<MembersView>]) -> Option<BTreeSet<Member>> {
    let answered: Vec<&MembersView> = views.iter().flatten().collect();
    let first = answered.first()?;
    if answered.iter().any(|v| v.members != first.members) {
        return None;
    }
    if first
        .members
        .iter()
        .any(|m| m.status != "up" || !m.reachable)
    {
        return None;
    }
    let selves: BTreeSet<&str> = answered.iter().map(|v| v.self_address.as_str()).collect();
    let addresses: BTreeSet<&str> = first.members.iter().map(|m| m.address.as_str()).collect();
    (selves == addresses).then(|| first.members.clone())
}

/// One stable sample: the accounts each node listed (nodes 1-based).
#[derive(Clone, Debug, Serialize)]
pub struct OwnershipSample {
    /// From the start of the workload.
    pub at_ms: u64,
    pub hosts: BTreeMap<usize, BTreeSet<String>>,
}

/// The stable samples taken, and how many attempts were not stable.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OwnershipRecord {
    pub stable: Vec<OwnershipSample>,
    pub unstable: u64,
}

/// The accounts live on the node at `http`, from `GET /sharding/account`.
async fn hosted(http: SocketAddr) -> Option<BTreeSet<String>> {
    let response = http_client::get(http, "/sharding/account", HTTP_TIMEOUT)
        .await
        .ok()?;
    if response.status != 200 {
        return None;
    }
    let json = response.json()?;
    let mut accounts = BTreeSet::new();
    for shard in json["shards"].as_array()? {
        for entity in shard["entities"].as_array()? {
            accounts.insert(entity.as_str()?.to_string());
        }
    }
    Some(accounts)
}

/// The sum of the handoff counters of the nodes `nodes`; None when one does not answer.
async fn handoffs(https: &[SocketAddr], nodes: &[usize]) -> Option<u64> {
    let texts =
        futures::future::join_all(nodes.iter().map(|&i| metrics_text(https[i], HTTP_TIMEOUT)))
            .await;
    let mut sum = 0;
    for text in texts {
        let text = text?;
        for series in [
            "tessera_sharding_region_handoffs_total{type=\"account\"}",
            "tessera_sharding_coordinator_handoffs_total{type=\"account\"}",
        ] {
            sum += series_value(&text, series).unwrap_or(0);
        }
    }
    Some(sum)
}

/// One attempt at a stable sample; None when the views were not stable.
pub async fn sample(https: &[SocketAddr], start: Instant) -> Option<OwnershipSample> {
    let before = views(https).await;
    let members = converged(&before)?;
    let nodes: Vec<usize> = (0..https.len()).filter(|&i| before[i].is_some()).collect();
    let handoffs_before = handoffs(https, &nodes).await?;
    let at_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    let lists = futures::future::join_all(nodes.iter().map(|&i| hosted(https[i]))).await;
    let handoffs_after = handoffs(https, &nodes).await?;
    let after = views(https).await;
    if handoffs_after != handoffs_before || converged(&after)? != members {
        return None;
    }
    let mut hosts = BTreeMap::new();
    for (&i, list) in nodes.iter().zip(lists) {
        hosts.insert(i + 1, list?);
    }
    Some(OwnershipSample { at_ms, hosts })
}

/// Samples every `SAMPLE_INTERVAL` until `stop` turns true.
pub async fn run(
    https: Vec<SocketAddr>,
    start: Instant,
    mut stop: watch::Receiver<bool>,
) -> OwnershipRecord {
    let mut record = OwnershipRecord::default();
    while !*stop.borrow() {
        match sample(&https, start).await {
            Some(sample) => record.stable.push(sample),
            None => record.unstable += 1,
        }
        tokio::select! {
            _ = tokio::time::sleep(SAMPLE_INTERVAL) => {}
            changed = stop.changed() => if changed.is_err() { break },
        }
    }
    record
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(me: &str, members: &[(&str, u64, &str, bool)]) -> Option<MembersView> {
        Some(MembersView {
            self_address: me.to_string(),
            members: members
                .iter()
                .map(|(a, uid, s, r)| Member {
                    address: a.to_string(),
                    uid: *uid,
                    status: s.to_string(),
                    reachable: *r,
                })
                .collect(),
        })
    }

    #[test]
    fn a_view_is_converged_only_when_every_member_answers_alike_up_and_reachable() {
        let both = [("a", 1, "up", true), ("b", 2, "up", true)];
        assert!(converged(&[view("a", &both), view("b", &both)]).is_some());
        // A member that does not answer (paused, or killed and not yet removed).
        assert!(converged(&[view("a", &both), None]).is_none());
        // A killed node that was removed: the others are a converged cluster.
        let one = [("a", 1, "up", true)];
        assert!(converged(&[view("a", &one), None]).is_some());
        // Unreachable, not up, or seen differently (another incarnation of b).
        let unreachable = [("a", 1, "up", true), ("b", 2, "up", false)];
        assert!(converged(&[view("a", &unreachable), view("b", &unreachable)]).is_none());
        let joining = [("a", 1, "up", true), ("b", 2, "joining", true)];
        assert!(converged(&[view("a", &joining), view("b", &joining)]).is_none());
        let other = [("a", 1, "up", true), ("b", 3, "up", true)];
        assert!(converged(&[view("a", &both), view("b", &other)]).is_none());
        // A node that answers but is not a member (a downed node that has not exited).
        assert!(converged(&[view("a", &one), view("b", &both)]).is_none());
    }
}
