//! Real `tessera node` processes on 127.0.0.1: formation through a seed node, SIGKILL
//! detection and downing, SIGTERM graceful leave, and hostile bytes on the cluster port.
//!
//! Deadlines here only bound how long a test may hang; the times the acceptance criteria
//! name are printed (and measured by `tessera demo` / `tessera bench cluster`), not asserted.

mod common;

use bytes::Bytes;
use common::*;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tessera_cluster::Address;
use tessera_cluster::transport::{Lane, TcpTransport, Transport, TransportConfig, services};
use tessera_harness::demo::{self, NodeProcess};
use tessera_harness::http_client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_form_detect_a_kill_and_leave_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ports = [free_port(), free_port(), free_port()];
    let mut nodes = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let args = node_args(
            *port,
            ports[0],
            &dir.path().join(format!("n{i}")),
            &["--stable-after", "2s"],
        );
        let node = demo::spawn_node(exe(), i + 1, &args, dir.path().join(format!("n{i}.log")))
            .await
            .expect("node starts");
        nodes.push(node);
    }
    let addresses: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();

    // Every node lists three members Up, with the same leader.
    let all: Vec<&NodeProcess> = nodes.iter().collect();
    let formed = wait_views(&all, "three members up on every node", |views| {
        let leaders: std::collections::BTreeSet<_> = views
            .iter()
            .map(|v| v.as_ref().and_then(|v| v.1.clone()))
            .collect();
        leaders.len() == 1
            && leaders.iter().all(Option::is_some)
            && views.iter().all(|v| {
                v.as_ref()
                    .is_some_and(|(m, _)| m.len() == 3 && m.iter().all(|(_, s, r)| s == "up" && *r))
            })
    })
    .await;
    println!("formation took {formed:?} (acceptance: within 5 s)");
    // Ready once Up and its shard regions are registered with their coordinator, a moment
    // after formation.
    for node in &nodes {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let ready = http_client::get(node.http, "/health/ready", Duration::from_secs(5))
                .await
                .expect("ready");
            if ready.status == 200 {
                break;
            }
            assert_eq!(ready.status, 503, "{}", ready.body);
            assert!(std::time::Instant::now() < deadline, "{}", ready.body);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // SIGKILL node 3: the others see it unreachable, then downed and gone.
    let mut killed = nodes.pop().expect("three nodes");
    killed.child.start_kill().expect("SIGKILL");
    let _ = killed.child.wait().await;
    let survivors: Vec<&NodeProcess> = nodes.iter().collect();
    let victim = addresses[2].clone();
    let unreachable = wait_views(
        &survivors,
        "killed node unreachable on both survivors",
        |views| {
            views.iter().all(|v| {
                v.as_ref()
                    .is_some_and(|(m, _)| m.iter().any(|(a, _, r)| *a == victim && !*r))
            })
        },
    )
    .await;
    println!("unreachable after {unreachable:?} (acceptance: within 8 s)");
    let removed = wait_views(&survivors, "killed node downed and removed", |views| {
        views.iter().all(|v| {
            v.as_ref().is_some_and(|(m, _)| {
                m.len() == 2 && m.iter().all(|(a, s, _)| *a != victim && s == "up")
            })
        })
    })
    .await;
    println!(
        "removed {:?} after the kill (acceptance: within 15 s)",
        unreachable + removed
    );

    // SIGTERM node 2: it leaves, exits 0, and is gone from node 1's list.
    let mut leaver = nodes.pop().expect("two nodes");
    demo::terminate(&leaver.child);
    let status = tokio::time::timeout(DEADLINE, leaver.child.wait())
        .await
        .expect("node exits after SIGTERM")
        .expect("wait");
    assert!(
        status.success(),
        "a node leaving on SIGTERM exits 0, got {status}"
    );
    let leaver_address = addresses[1].clone();
    let first: Vec<&NodeProcess> = nodes.iter().collect();
    let gone = wait_views(&first, "left node gone from the survivor", |views| {
        views[0]
            .as_ref()
            .is_some_and(|(m, _)| m.len() == 1 && m.iter().all(|(a, _, _)| *a != leaver_address))
    })
    .await;
    println!("left node gone {gone:?} after its exit (acceptance: within 10 s of SIGTERM)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bytes_on_the_cluster_port_are_refused_counted_and_survived() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let args = node_args(
        port,
        port,
        &dir.path().join("n"),
        &["--max-frame-size", "1048576"],
    );
    let node = demo::spawn_node(exe(), 1, &args, dir.path().join("n.log"))
        .await
        .expect("node starts");
    let cluster: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    wait_views(&[&node], "single node up", |v| {
        v[0].as_ref()
            .is_some_and(|(m, _)| m.len() == 1 && m[0].1 == "up")
    })
    .await;

    // 1. Random bytes instead of a handshake.
    let mut stream = tokio::net::TcpStream::connect(cluster)
        .await
        .expect("connect");
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let _ = stream.write_all(&garbage).await;
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(DEADLINE, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the node must close a connection that sends garbage"
    );

    // 2. A peer with the wrong cluster secret.
    let wrong = TcpTransport::bind(
        TransportConfig {
            bind_address: Address::new("127.0.0.1", 0),
            cluster_secret: Some("not-the-secret".into()),
            ..TransportConfig::default()
        },
        42,
    )
    .await
    .expect("bind");
    let target = Address::new("127.0.0.1", port);
    let _ = wrong.send(
        &target,
        services::MEMBERSHIP,
        Lane::Control,
        Bytes::from_static(b"\x01hello"),
    );

    // 3. A peer with the right secret sending a frame over the node's 1 MiB limit.
    let big = TcpTransport::bind(
        TransportConfig {
            bind_address: Address::new("127.0.0.1", 0),
            cluster_secret: Some(SECRET.into()),
            max_frame_size_bytes: 8 * 1024 * 1024,
            ..TransportConfig::default()
        },
        43,
    )
    .await
    .expect("bind");
    let _ = big.send(
        &target,
        services::MEMBERSHIP,
        Lane::Bulk,
        Bytes::from(vec![7u8; 2 * 1024 * 1024]),
    );

    let refused = |reason: &'static str| {
        format!("tessera_transport_connections_refused_total{{reason=\"{reason}\"}}")
    };
    let start = Instant::now();
    loop {
        let malformed = metric(node.http, &refused("malformed")).await;
        let auth = metric(node.http, &refused("auth")).await;
        let oversize = metric(node.http, &refused("oversize")).await;
        if malformed >= 1 && auth >= 1 && oversize >= 1 {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "refusals not all counted: malformed={malformed} auth={auth} oversize={oversize}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wrong.shutdown();
    big.shutdown();

    // The node still serves, and its membership is unchanged.
    let alive = http_client::get(node.http, "/health/alive", Duration::from_secs(5))
        .await
        .expect("alive");
    assert_eq!(alive.status, 200);
    let view = demo::view(node.http).await.expect("members");
    assert_eq!(view.0.len(), 1);
    assert_eq!(view.0[0].1, "up");
}
