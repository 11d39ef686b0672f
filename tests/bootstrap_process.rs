//! Cluster Bootstrap in real `tessera node` processes: nodes given the
//! same contact points and no seed nodes form exactly one cluster, time after time; a node
//! started later joins it; with `required_contact_points = 3` two nodes form nothing until the
//! third arrives. Then the same with contact points from DNS (A records, and SRV records),
//! served by a DNS server this test runs on a loopback port.
//!
//! "Exactly one cluster" is checked as: every node sees every node Up. Two clusters cannot
//! pass it, since a node is a member of one cluster only.

mod common;

use common::{exe, free_port, test_dir, wait_up};
use futures::future::join_all;
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera_harness::demo::{self, NodeProcess};
use tessera_harness::http_client;

/// Rounds of five simultaneous starts (twenty in a row).
const ROUNDS: usize = 20;

/// A short stable margin and probe interval keep each round to a few seconds.
const QUICK: [&str; 4] = [
    "--stable-margin",
    "1s",
    "--bootstrap-probe-interval",
    "200ms",
];

/// One node to start: its hosts and ports, and how it discovers contact points.
struct Spec {
    host: String,
    port: u16,
    http_port: u16,
    discovery: Vec<String>,
}

fn args(spec: &Spec, data: &Path) -> Vec<String> {
    let mut extra: Vec<&str> = QUICK.to_vec();
    extra.extend(spec.discovery.iter().map(String::as_str));
    common::base_args(&spec.host, spec.port, spec.http_port, data, &extra)
}

/// Starts the nodes at the same moment.
async fn start_all(specs: &[Spec], dir: &Path, first_index: usize) -> Vec<NodeProcess> {
    try_start_all(specs, dir, first_index)
        .await
        .unwrap_or_else(|e| panic!("node starts: {e}"))
}

/// Starts the nodes at the same moment; if one does not start (a port picked as free was
/// taken meanwhile, e.g. as another connection's ephemeral port), stops the others and says
/// why, with the end of that node's log.
async fn try_start_all(
    specs: &[Spec],
    dir: &Path,
    first_index: usize,
) -> Result<Vec<NodeProcess>, String> {
    let starts = specs.iter().enumerate().map(|(i, spec)| {
        let index = first_index + i;
        let args = args(spec, &dir.join(format!("n{index}")));
        let log = dir.join(format!("n{index}.log"));
        async move {
            demo::spawn_node(exe(), index, &args, log.clone())
                .await
                .map_err(|e| {
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(5).collect();
                    format!("{e}; log ends: {tail:?}")
                })
        }
    });
    let mut started = Vec::new();
    let mut failed = None;
    for result in join_all(starts).await {
        match result {
            Ok(node) => started.push(node),
            Err(e) => failed = Some(e),
        }
    }
    match failed {
        None => Ok(started),
        Some(e) => {
            stop_all(started).await;
            Err(e)
        }
    }
}

fn static_discovery(http_ports: &[u16], extra: &[&str]) -> Vec<String> {
    let mut args = Vec::new();
    for port in http_ports {
        args.push("--contact-point".to_string());
        args.push(format!("127.0.0.1:{port}"));
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn loopback_specs(count: usize, discovery: impl Fn(&[u16]) -> Vec<String>) -> Vec<Spec> {
    let http_ports: Vec<u16> = (0..count).map(|_| free_port()).collect();
    (0..count)
        .map(|i| Spec {
            host: "127.0.0.1".into(),
            port: free_port(),
            http_port: http_ports[i],
            discovery: discovery(&http_ports),
        })
        .collect()
}

/// Whether the node is a member of any cluster (it lists itself among the members).
async fn is_member(node: &NodeProcess) -> bool {
    match demo::view(node.http).await {
        Some((members, _)) => members
            .iter()
            .any(|(address, _, _)| *address == node.cluster),
        None => false,
    }
}

async fn assert_no_cluster(nodes: &[NodeProcess], for_how_long: Duration, why: &str) {
    let until = tokio::time::Instant::now() + for_how_long;
    while tokio::time::Instant::now() < until {
        for node in nodes {
            assert!(
                !is_member(node).await,
                "{why}: {} became a member",
                node.cluster
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn stop_all(nodes: Vec<NodeProcess>) {
    for mut node in nodes {
        common::kill(&mut node).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_nodes_with_the_same_contact_points_form_one_cluster_every_time() {
    let _serial = common::one_at_a_time().await;
    for round in 1..=ROUNDS {
        let dir = test_dir();
        // A start that fails for want of a port says nothing about bootstrap: that round
        // starts again on other ports (at most twice).
        let mut attempt = 0;
        let (specs, nodes) = loop {
            let specs = loopback_specs(5, |ports| static_discovery(ports, &[]));
            match try_start_all(&specs, dir.path(), 1).await {
                Ok(nodes) => break (specs, nodes),
                Err(e) if attempt < 2 => {
                    attempt += 1;
                    println!("round {round}: a node did not start ({e}); again on other ports");
                }
                Err(e) => panic!("round {round}: node starts: {e}"),
            }
        };
        let refs: Vec<&NodeProcess> = nodes.iter().collect();
        wait_up(&refs, 5).await;
        println!("round {round}: one cluster of 5");
        if round == 1 {
            // A sixth node, started later with the same contact points (its own not among
            // them), joins the cluster they formed.
            let late_ports: Vec<u16> = specs.iter().map(|s| s.http_port).collect();
            let late = Spec {
                host: "127.0.0.1".into(),
                port: free_port(),
                http_port: free_port(),
                discovery: static_discovery(&late_ports, &[]),
            };
            let mut sixth = start_all(&[late], dir.path(), 6).await;
            let mut all: Vec<&NodeProcess> = nodes.iter().collect();
            all.push(&sixth[0]);
            wait_up(&all, 6).await;
            println!("round {round}: a sixth node joined");
            common::kill(&mut sixth[0]).await;
        }
        stop_all(nodes).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_three_required_contact_points_two_nodes_wait_for_the_third() {
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    let mut specs = loopback_specs(3, |ports| {
        static_discovery(ports, &["--required-contact-points", "3"])
    });
    let third = specs.pop().expect("three specs");
    let mut nodes = start_all(&specs, dir.path(), 1).await;
    // Several stable margins: nothing forms while a contact point does not answer.
    assert_no_cluster(&nodes, Duration::from_secs(4), "two of three started").await;
    nodes.extend(start_all(&[third], dir.path(), 3).await);
    let refs: Vec<&NodeProcess> = nodes.iter().collect();
    wait_up(&refs, 3).await;
    stop_all(nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_without_contact_points_or_seeds_says_how_to_form_a_cluster() {
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    let spec = Spec {
        host: "127.0.0.1".into(),
        port: free_port(),
        http_port: free_port(),
        discovery: Vec::new(),
    };
    let nodes = start_all(&[spec], dir.path(), 1).await;
    let log = nodes[0].log.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("--contact-point") && text.contains("--seed") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no hint on forming a cluster in the log:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_all(nodes).await;
}

/// The records a test DNS server answers with, changeable while it runs.
#[derive(Default)]
struct Zone {
    a: BTreeMap<String, Vec<Ipv4Addr>>,
    srv: BTreeMap<String, Vec<(u16, String)>>,
}

/// A DNS server on a loopback UDP port answering A and SRV questions from `zone` (TTL 0),
/// NXDOMAIN for names it does not know.
async fn dns_server(zone: Arc<Mutex<Zone>>) -> SocketAddr {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind DNS");
    let address = socket.local_addr().expect("DNS address");
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                return;
            };
            let Ok(request) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut response = Message::new();
            response
                .set_id(request.id())
                .set_message_type(MessageType::Response)
                .set_op_code(OpCode::Query)
                .set_authoritative(true)
                .set_recursion_desired(request.recursion_desired());
            let mut found = false;
            for query in request.queries() {
                response.add_query(query.clone());
                let name = query.name().to_ascii().to_ascii_lowercase();
                let zone = zone.lock().expect("zone");
                match query.query_type() {
                    RecordType::A => {
                        for ip in zone.a.get(&name).into_iter().flatten() {
                            found = true;
                            response.add_answer(Record::from_rdata(
                                query.name().clone(),
                                0,
                                RData::A(A(*ip)),
                            ));
                        }
                    }
                    RecordType::SRV => {
                        for (port, target) in zone.srv.get(&name).into_iter().flatten() {
                            found = true;
                            response.add_answer(Record::from_rdata(
                                query.name().clone(),
                                0,
                                RData::SRV(SRV::new(
                                    0,
                                    0,
                                    *port,
                                    Name::from_str(target).expect("target name"),
                                )),
                            ));
                        }
                    }
                    _ => {}
                }
                if !found && (zone.a.contains_key(&name) || zone.srv.contains_key(&name)) {
                    // A known name without records of this type: an empty answer.
                    found = true;
                }
            }
            response.set_response_code(if found {
                ResponseCode::NoError
            } else {
                ResponseCode::NXDomain
            });
            if let Ok(bytes) = response.to_vec() {
                let _ = socket.send_to(&bytes, from).await;
            }
        }
    });
    address
}

/// Nodes on 127.0.0.(2+i), all with the same HTTP port, found through the A records of
/// `tessera.test.`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contact_points_from_dns_a_records_form_one_cluster_and_wait_for_the_required_count() {
    let _serial = common::one_at_a_time().await;
    let zone = Arc::new(Mutex::new(Zone::default()));
    let dns = dns_server(zone.clone()).await;
    // One HTTP port for all (A records carry no port): free on every 127.0.0.x, since a
    // port the OS handed out on 127.0.0.1 is bound by nothing else here.
    let http_port = free_port();
    let host = |i: usize| Ipv4Addr::new(127, 0, 0, 2 + i as u8);
    let discovery = |required: &str| {
        [
            "--discovery-dns",
            "tessera.test",
            "--discovery-dns-server",
            &dns.to_string(),
            "--required-contact-points",
            required,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
    };
    let spec = |i: usize, required: &str| Spec {
        host: host(i).to_string(),
        port: free_port(),
        http_port,
        discovery: discovery(required),
    };
    let publish = |count: usize| {
        zone.lock()
            .expect("zone")
            .a
            .insert("tessera.test.".into(), (0..count).map(host).collect());
    };

    // Three required; two published and started: nothing forms until the third is.
    let dir = test_dir();
    publish(2);
    let mut nodes = start_all(&[spec(0, "3"), spec(1, "3")], dir.path(), 1).await;
    assert_no_cluster(&nodes, Duration::from_secs(4), "two of three in DNS").await;
    publish(3);
    nodes.extend(start_all(&[spec(2, "3")], dir.path(), 3).await);
    let refs: Vec<&NodeProcess> = nodes.iter().collect();
    wait_up(&refs, 3).await;
    stop_all(nodes).await;

    // Five at once, twice; then a sixth joins.
    for round in 1..=2 {
        let dir = test_dir();
        publish(5);
        let specs: Vec<Spec> = (0..5).map(|i| spec(i, "2")).collect();
        let mut nodes = start_all(&specs, dir.path(), 1).await;
        let refs: Vec<&NodeProcess> = nodes.iter().collect();
        wait_up(&refs, 5).await;
        println!("DNS round {round}: one cluster of 5");
        if round == 2 {
            publish(6);
            nodes.extend(start_all(&[spec(5, "2")], dir.path(), 6).await);
            let refs: Vec<&NodeProcess> = nodes.iter().collect();
            wait_up(&refs, 6).await;
        }
        stop_all(nodes).await;
    }
}

/// Nodes on 127.0.0.1 with their own HTTP ports, found through the SRV records of
/// `_tessera._tcp.tessera.test.` (targets resolved through their A records).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contact_points_from_dns_srv_records_form_one_cluster() {
    let _serial = common::one_at_a_time().await;
    let zone = Arc::new(Mutex::new(Zone::default()));
    let dns = dns_server(zone.clone()).await;
    let http_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    {
        let mut zone = zone.lock().expect("zone");
        let mut srv = Vec::new();
        for (i, port) in http_ports.iter().enumerate() {
            let target = format!("n{i}.tessera.test.");
            zone.a.insert(target.clone(), vec![Ipv4Addr::LOCALHOST]);
            srv.push((*port, target));
        }
        zone.srv.insert("_tessera._tcp.tessera.test.".into(), srv);
    }
    let dir = test_dir();
    let specs: Vec<Spec> = http_ports
        .iter()
        .map(|http_port| Spec {
            host: "127.0.0.1".into(),
            port: free_port(),
            http_port: *http_port,
            discovery: [
                "--discovery-dns",
                "_tessera._tcp.tessera.test",
                "--discovery-dns-server",
                &dns.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        })
        .collect();
    let nodes = start_all(&specs, dir.path(), 1).await;
    let refs: Vec<&NodeProcess> = nodes.iter().collect();
    wait_up(&refs, 3).await;
    // Each node answers the probe with the seed nodes it offers.
    let answer = http_client::get(
        nodes[0].http,
        "/bootstrap/seed-nodes",
        Duration::from_secs(5),
    )
    .await
    .expect("GET /bootstrap/seed-nodes");
    assert_eq!(answer.status, 200, "{}", answer.body);
    let json = answer.json().expect("JSON");
    assert_eq!(json["self_node"], nodes[0].cluster.as_str());
    assert_eq!(
        json["seed_nodes"].as_array().map(Vec::len),
        Some(3),
        "{json}"
    );
    stop_all(nodes).await;
}
