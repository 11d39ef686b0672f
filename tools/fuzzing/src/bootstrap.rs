//! Target of what Cluster Bootstrap reads from other nodes: their answers to
//! `GET /bootstrap/seed-nodes`, and the addresses in them.

use std::collections::BTreeSet;
use std::time::Duration;
use tessera::bootstrap::parse_seed_nodes_answer;
use tessera_cluster::Address;
use tessera_cluster::bootstrap::{BootstrapSettings, BootstrapState, ContactPoint, Decision};

/// Target `bootstrap_answer`: a contact point's answer body, parsed as a probe reads it, then
/// the bootstrap decision with it among the answers of three contact points. The decision
/// never makes this node join itself as one of a cluster's seeds, nor a node that offered no
/// seeds.
pub fn bootstrap_answer(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(address) = text.parse::<Address>() {
            assert_eq!(text_round_trip(&address), Ok(address.clone()));
        }
        let _ = text.parse::<ContactPoint>();
    }
    let Ok(answer) = parse_seed_nodes_answer(data) else {
        return;
    };
    let self_address = Address::new("10.0.0.1", 25521);
    let points: BTreeSet<ContactPoint> = (0..3u16)
        .map(|n| ContactPoint::new("10.0.0.1", 8558 + n))
        .collect();
    let settings = BootstrapSettings::default();
    let mut state = BootstrapState::new();
    state.on_discovery(Duration::ZERO, points.clone());
    let now = settings.stable_margin + Duration::from_secs(1);
    let offered: BTreeSet<&Address> = answer
        .seed_nodes
        .iter()
        .chain(&answer.joining_via)
        .collect();
    for point in &points {
        state.on_probe_answer(now, point, answer.clone());
    }
    let seeds = state.first_hand_seeds(&settings, now, &self_address);
    assert!(
        !seeds.contains(&self_address),
        "this node passes itself on as a seed"
    );
    match state.decide(&settings, now, &self_address) {
        Decision::JoinSeeds(seeds) => {
            assert!(!seeds.is_empty() && !seeds.contains(&self_address));
            assert!(
                seeds.iter().all(|s| offered.contains(s)),
                "joined a seed nobody offered"
            );
        }
        Decision::JoinSelf => assert!(offered.is_empty(), "formed a cluster beside one offered"),
        Decision::Wait(_) => {}
    }
}

/// An address written and read again.
fn text_round_trip(address: &Address) -> Result<Address, String> {
    address.to_string().parse().map_err(|e| format!("{e}"))
}

/// Valid encodings the targets' corpora start from.
pub mod seeds {
    /// Seeds of `bootstrap_answer`: answers of a member, of a joining node and of a node that
    /// knows no cluster, and addresses.
    pub fn bootstrap_answer() -> Vec<Vec<u8>> {
        [
            &br#"{"self_node":"10.0.0.1:25520","seed_nodes":[{"node":"10.0.0.1:25520","status":"up","roles":[]},{"node":"10.0.0.2:25520","status":"weakly_up","roles":["backend"]}],"joining_via":[]}"#[..],
            br#"{"self_node":"10.0.0.3:25520","seed_nodes":[],"joining_via":["10.0.0.1:25520"]}"#,
            br#"{"self_node":"[::1]:25520","seed_nodes":[]}"#,
            b"127.0.0.1:25520",
            b"[fe80::1]:8558",
        ]
        .iter()
        .map(|s| s.to_vec())
        .collect()
    }
}
