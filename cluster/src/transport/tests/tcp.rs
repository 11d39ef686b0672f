//! The suite over TCP on 127.0.0.1 (port 0 only), plus what only a socket can get wrong:
//! garbage, oversize frames, wrong secrets, silent connections.

use super::{Harness, WAIT, eventually, recv, test_config, text, transport_suite};
use crate::address::{Address, UniqueAddress};
use crate::transport::frame::{self, FrameCodec, HANDSHAKE_MAX_FRAME_BYTES};
use crate::transport::handshake::{Connector, SecretKey};
use crate::transport::{Lane, SendError, TcpTransport, Transport, TransportConfig};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

const SERVICE: u16 = 100;

struct TcpHarness;

impl Harness for TcpHarness {
    type T = TcpTransport;

    async fn node(&self, uid: u64, config: TransportConfig) -> Arc<TcpTransport> {
        let config = TransportConfig {
            bind_address: Address::new("127.0.0.1", 0),
            ..config
        };
        TcpTransport::bind(config, uid).await.unwrap()
    }

    async fn restart(&self, old: Arc<TcpTransport>, uid: u64) -> Arc<TcpTransport> {
        let address = old.local().address.clone();
        old.shutdown();
        drop(old);
        // The listener closes when its task observes the shutdown; retry until the port is free.
        let rebind = async {
            loop {
                let config = TransportConfig {
                    bind_address: address.clone(),
                    ..test_config()
                };
                match TcpTransport::bind(config, uid).await {
                    Ok(transport) => return transport,
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        };
        tokio::time::timeout(WAIT, rebind)
            .await
            .expect("port freed")
    }
}

transport_suite!(TcpHarness);

fn config_with_secret(secret: &str) -> TransportConfig {
    TransportConfig {
        cluster_secret: Some(secret.to_string()),
        ..test_config()
    }
}

async fn connect_raw(to: &TcpTransport) -> TcpStream {
    let address = &to.local().address;
    TcpStream::connect((address.host.as_str(), address.port))
        .await
        .unwrap()
}

/// Reads until the server closes the connection (EOF or reset), bounded by WAIT.
async fn until_closed(stream: &mut TcpStream) {
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(WAIT, stream.read_to_end(&mut sink))
        .await
        .expect("server closed the connection");
}

/// A normal node can still deliver to `server` on SERVICE.
async fn assert_still_serving(
    server: &TcpTransport,
    rx: &mut tokio::sync::mpsc::Receiver<crate::transport::Inbound>,
    secret: Option<&str>,
) {
    let config = TransportConfig {
        cluster_secret: secret.map(str::to_string),
        ..test_config()
    };
    let client = TcpHarness.node(77, config).await;
    client
        .send(
            &server.local().address,
            SERVICE,
            Lane::Control,
            Bytes::from_static(b"still here"),
        )
        .unwrap();
    let inbound = recv(rx).await;
    assert_eq!(&inbound.payload[..], b"still here");
    assert_eq!(inbound.from, *client.local());
    client.shutdown();
}

#[tokio::test]
async fn random_bytes_close_the_connection_as_malformed_and_node_keeps_serving() {
    let server = TcpHarness.node(1, test_config()).await;
    let mut rx = server.register(SERVICE, 16).unwrap();
    for seed in 0..3u64 {
        let mut garbage = [0u8; 256];
        SmallRng::seed_from_u64(seed).fill_bytes(&mut garbage);
        let mut stream = connect_raw(&server).await;
        stream.write_all(&garbage).await.unwrap();
        stream.shutdown().await.unwrap();
        until_closed(&mut stream).await;
        let expected = seed + 1;
        eventually("malformed connection counted", || {
            server.metrics().snapshot().connections_refused_malformed == expected
        })
        .await;
    }
    assert_eq!(server.metrics().snapshot().connections_accepted, 0);
    assert_still_serving(&server, &mut rx, None).await;
}

#[tokio::test]
async fn frame_over_the_size_limit_closes_the_connection_as_oversize() {
    let config = TransportConfig {
        max_frame_size_bytes: 64 * 1024,
        ..test_config()
    };
    let server = TcpHarness.node(1, config).await;
    let mut rx = server.register(SERVICE, 16).unwrap();

    // Authenticate properly, then announce a frame one byte over the limit.
    let mut connection = Framed::new(
        connect_raw(&server).await,
        FrameCodec::new(HANDSHAKE_MAX_FRAME_BYTES),
    );
    let me = UniqueAddress::new(Address::new("127.0.0.1", 1), 99);
    let connector = Connector::new(SecretKey::derive(None), me, [7; 32]);
    let hello = frame::decode(&connection.next().await.unwrap().unwrap()).unwrap();
    let init = connector.on_hello(hello).unwrap();
    connection
        .send(frame::encode(&init).unwrap())
        .await
        .unwrap();
    let accept = frame::decode(&connection.next().await.unwrap().unwrap()).unwrap();
    assert_eq!(connector.on_accept(accept).unwrap(), *server.local());

    let mut stream = connection.into_inner();
    let oversize = u32::try_from(64 * 1024 + 1).unwrap();
    stream.write_all(&oversize.to_be_bytes()).await.unwrap();
    stream.write_all(&[0u8; 1024]).await.unwrap();
    until_closed(&mut stream).await;
    eventually("oversize frame counted", || {
        server.metrics().snapshot().connections_refused_oversize == 1
    })
    .await;
    assert_eq!(server.metrics().snapshot().connections_accepted, 1);
    assert_still_serving(&server, &mut rx, None).await;
}

#[tokio::test]
async fn wrong_secret_is_refused_and_counted_on_both_sides() {
    let server = TcpHarness.node(1, config_with_secret("right")).await;
    let mut rx = server.register(SERVICE, 16).unwrap();
    let intruder = TcpHarness.node(2, config_with_secret("wrong")).await;
    intruder
        .send(
            &server.local().address,
            SERVICE,
            Lane::Control,
            Bytes::from_static(b"let me in"),
        )
        .unwrap();
    eventually("refusal counted", || {
        server.metrics().snapshot().connections_refused_auth >= 1
            && intruder.metrics().snapshot().connect_failures >= 1
    })
    .await;
    assert_eq!(server.metrics().snapshot().connections_accepted, 0);
    intruder.shutdown();
    assert_still_serving(&server, &mut rx, Some("right")).await;
    assert!(rx.try_recv().is_err(), "nothing from the intruder");
}

#[tokio::test]
async fn silent_connection_times_out_in_the_handshake() {
    let config = TransportConfig {
        handshake_timeout: Duration::from_millis(100),
        ..test_config()
    };
    let server = TcpHarness.node(1, config).await;
    let mut rx = server.register(SERVICE, 16).unwrap();
    let mut stream = connect_raw(&server).await;
    until_closed(&mut stream).await;
    eventually("handshake timeout counted", || {
        server.metrics().snapshot().handshake_timeouts == 1
    })
    .await;
    assert_still_serving(&server, &mut rx, None).await;
}

/// Connections in their handshake are bounded: beyond `max_inbound_handshakes` a new one is
/// closed at once and counted, the gauges show the ones held, and once those end (here: the
/// client gives up) an authenticated peer gets through.
#[tokio::test]
async fn connections_beyond_max_inbound_handshakes_are_closed_and_counted() {
    let config = TransportConfig {
        max_inbound_handshakes: 2,
        // Longer than the test: the two silent connections end only when dropped.
        handshake_timeout: Duration::from_secs(60),
        ..test_config()
    };
    let server = TcpHarness.node(1, config).await;
    let mut rx = server.register(SERVICE, 16).unwrap();
    let silent = [connect_raw(&server).await, connect_raw(&server).await];
    eventually("two handshakes held", || {
        server.metrics().snapshot().inbound_handshakes == 2
    })
    .await;
    for _ in 0..3 {
        let mut extra = connect_raw(&server).await;
        until_closed(&mut extra).await;
    }
    let metrics = server.metrics().snapshot();
    assert_eq!(metrics.connections_refused_too_many_handshakes, 3);
    assert_eq!(metrics.inbound_handshakes, 2);
    assert_eq!(metrics.inbound_connections, 2);
    drop(silent);
    eventually("handshake slots given back", || {
        let metrics = server.metrics().snapshot();
        metrics.inbound_handshakes == 0 && metrics.inbound_connections == 0
    })
    .await;
    assert_still_serving(&server, &mut rx, None).await;
    assert_eq!(server.metrics().snapshot().inbound_handshakes, 0);
}

#[tokio::test]
async fn binding_port_zero_reports_the_real_port() {
    let node = TcpHarness.node(5, test_config()).await;
    assert_ne!(node.local().address.port, 0);
    assert_eq!(node.local().uid, 5);
    TcpStream::connect(("127.0.0.1", node.local().address.port))
        .await
        .expect("listening on the reported port");
}

#[tokio::test]
async fn invalid_config_names_the_field() {
    let config = TransportConfig {
        bulk_queue_capacity: 0,
        ..test_config()
    };
    let err = TcpTransport::bind(config, 1).await.err().unwrap();
    assert_eq!(
        err.to_string(),
        "invalid transport config: bulk_queue_capacity=0 (expected at least 1)"
    );
    let config = TransportConfig {
        quorum_queue_capacity: 0,
        ..test_config()
    };
    let err = TcpTransport::bind(config, 1).await.err().unwrap();
    assert_eq!(
        err.to_string(),
        "invalid transport config: quorum_queue_capacity=0 (expected at least 1)"
    );
}

/// Addresses nothing is sent to any more (members that left, addresses that never were
/// members) lose their queues and writer task after `idle_peer_timeout`; the next send to
/// one brings them back. Beyond `max_peers` peers a send to a new address is refused, typed
/// and counted, and the others keep working.
#[tokio::test]
async fn idle_peers_are_forgotten_and_the_number_of_peers_is_bounded() {
    let config = TransportConfig {
        idle_peer_timeout: Duration::from_millis(300),
        max_peers: 2,
        ..test_config()
    };
    let a = TcpHarness.node(1, config).await;
    let b = TcpHarness.node(2, test_config()).await;
    let mut inbox = b.register(SERVICE, 16).unwrap();
    // One live peer and one address where nothing listens.
    let nowhere = Address::new("127.0.0.1", free_port());
    a.send(&b.local().address, SERVICE, Lane::Bulk, text("hello"))
        .unwrap();
    recv(&mut inbox).await;
    a.send(&nowhere, SERVICE, Lane::Bulk, text("lost")).unwrap();
    assert_eq!(a.metrics().snapshot().peers, 2);
    let third = Address::new("127.0.0.1", 1);
    let refused = a.send(&third, SERVICE, Lane::Bulk, text("too many"));
    assert!(
        matches!(&refused, Err(SendError::TooManyPeers { max_peers: 2, .. })),
        "{refused:?}"
    );
    assert_eq!(a.metrics().snapshot().send_dropped_too_many_peers, 1);
    // Both go quiet: both are forgotten, the unreachable one with its queued message.
    eventually("idle peers forgotten", || a.metrics().snapshot().peers == 0).await;
    // And come back on the next send.
    a.send(&b.local().address, SERVICE, Lane::Bulk, text("again"))
        .unwrap();
    assert_eq!(&recv(&mut inbox).await.payload[..], b"again");
    assert_eq!(a.metrics().snapshot().peers, 1);
}

/// A peer that does not take its frames cannot make the sender hold more than a lane's byte
/// budget: beyond it messages are dropped with a typed error, as on a full queue.
#[tokio::test]
async fn an_unreachable_peer_holds_at_most_the_byte_budget() {
    let config = TransportConfig {
        bulk_queue_bytes: 10_000,
        ..test_config()
    };
    let a = TcpHarness.node(1, config).await;
    let nowhere = Address::new("127.0.0.1", free_port());
    let chunk = Bytes::from(vec![7u8; 3_000]);
    let mut sent = 0;
    let mut refused = None;
    for _ in 0..10 {
        match a.send(&nowhere, SERVICE, Lane::Bulk, chunk.clone()) {
            Ok(()) => sent += 1,
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    assert!(
        sent <= 4,
        "{sent} chunks of 3,000 bytes queued under a 10,000-byte budget"
    );
    assert!(
        matches!(
            refused,
            Some(SendError::QueueBytesFull {
                max_bytes: 10_000,
                ..
            })
        ),
        "{refused:?}"
    );
    // The control lane has its own budget: heartbeats still get through to a live peer.
    assert!(
        a.send(&nowhere, SERVICE, Lane::Control, text("ping"))
            .is_ok()
    );
}

/// A port nothing listens on a moment after.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}
