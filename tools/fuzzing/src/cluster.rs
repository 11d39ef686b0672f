//! Targets of what peers send the cluster layer: transport frames, the handshake, membership,
//! heartbeat and singleton messages, and the cluster core that acts on them.

use super::{assert_round_trip, chunked, chunks};
use bytes::{Bytes, BytesMut};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::{Duration, Instant};
use tessera_cluster::codec;
use tessera_cluster::core::{ClusterCore, ClusterCoreConfig, CoreMessage, HeartbeatMessage};
use tessera_cluster::heartbeat::{HeartbeatRequest, HeartbeatResponse};
use tessera_cluster::membership::MembershipMessage;
use tessera_cluster::singleton::message::{HandOver, HandOverKind, ProxyReply, SingletonFrame};
use tessera_cluster::transport::frame::{
    self, Frame, FrameCodec, HANDSHAKE_MAX_FRAME_BYTES, Nonce,
};
use tessera_cluster::transport::handshake::{self, Acceptor, Connector, SecretKey};
use tessera_cluster::transport::{Lane, RemoteError};
use tessera_cluster::{Address, UniqueAddress};
use tokio_util::codec::Decoder;

/// Decodes `data` as a [`codec`] message `T` and checks its round trip; the message, if any.
fn decode_message<T>(what: &'static str, data: &[u8]) -> Option<T>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let message = codec::decode::<T>(what, data).ok()?;
    assert_round_trip(
        what,
        &message,
        |m| Ok::<_, ()>(codec::encode(m).to_vec()),
        |b| codec::decode::<T>(what, b),
    );
    Some(message)
}

/// The frame limit once a connection is authenticated, small enough for fuzz inputs to cross.
const FUZZ_MAX_FRAME_BYTES: usize = 4096;

/// What the stream decoder made of a byte stream arriving in reads of `read_size` bytes: the
/// frames' payloads, then the error that ended it (if any). Decodes as a framed reader does:
/// what is buffered until the codec needs more, then the next read, and at the end of the
/// stream `decode_eof`.
fn frames_of(stream: &[u8], read_size: usize) -> (Vec<BytesMut>, Option<String>) {
    let mut codec = FrameCodec::new(HANDSHAKE_MAX_FRAME_BYTES);
    let mut buffer = BytesMut::new();
    let mut frames = Vec::new();
    let mut reads = stream.chunks(read_size.max(1));
    loop {
        let result = match codec.decode(&mut buffer) {
            Ok(None) => match reads.next() {
                Some(read) => {
                    buffer.extend_from_slice(read);
                    continue;
                }
                None => codec.decode_eof(&mut buffer),
            },
            other => other,
        };
        match result {
            Ok(Some(frame)) => {
                frames.push(frame);
                // After the three handshake frames the connection takes larger ones.
                if frames.len() == 3 {
                    codec.set_max_frame_size_bytes(FUZZ_MAX_FRAME_BYTES);
                }
            }
            Ok(None) => return (frames, None),
            Err(e) => return (frames, Some(e.to_string())),
        }
    }
}

/// Target `transport_frames`: a TCP byte stream through the length-delimited frame codec (the
/// handshake's small limit, then the connection's), and every frame through
/// [`frame::decode`].
pub fn transport_frames(data: &[u8]) {
    let whole = frames_of(data, data.len());
    for read_size in [1, 7] {
        let split = frames_of(data, read_size);
        assert_eq!(
            whole, split,
            "the frames of a stream differ when it arrives in reads of {read_size} bytes"
        );
    }
    let (frames, _) = whole;
    for payload in &frames {
        assert!(
            payload.len() <= FUZZ_MAX_FRAME_BYTES,
            "a frame above the limit passed"
        );
        if let Ok(frame) = frame::decode(payload) {
            assert_round_trip(
                "frame",
                &frame,
                |f| frame::encode(f).map(|b| b.to_vec()),
                frame::decode,
            );
        }
    }
}

/// The secret, nonces and identities of the handshake target: fixed, so that seeds can carry
/// valid proofs and the fuzzer can explore past the MAC check.
fn handshake_parties() -> (Acceptor, Connector, UniqueAddress, UniqueAddress) {
    let key = SecretKey::derive(Some("fuzz"));
    let acceptor_node = node(1);
    let connector_node = node(2);
    (
        Acceptor::new(key.clone(), acceptor_node.clone(), ACCEPTOR_NONCE),
        Connector::new(key, connector_node.clone(), CONNECTOR_NONCE),
        acceptor_node,
        connector_node,
    )
}

const ACCEPTOR_NONCE: Nonce = [0xa5; 32];
const CONNECTOR_NONCE: Nonce = [0x5a; 32];

/// Target `transport_handshake`: a frame payload as each step of the handshake receives it
/// (the connector's `Hello`, the acceptor's `HandshakeInit`, the connector's
/// `HandshakeAccept`). A peer is accepted only with a valid proof for the identity it claims.
pub fn transport_handshake(data: &[u8]) {
    let Ok(frame) = frame::decode(data) else {
        return;
    };
    let (acceptor, connector, acceptor_node, _) = handshake_parties();
    let key = SecretKey::derive(Some("fuzz"));
    if let Ok(init) = connector.on_hello(frame.clone()) {
        assert!(matches!(init, Frame::HandshakeInit { .. }));
    }
    if let Frame::HandshakeInit {
        from, mac, nonce, ..
    } = &frame
    {
        let proven = handshake::verify_mac(&key, &ACCEPTOR_NONCE, from, mac).is_ok();
        match acceptor.on_init(frame.clone()) {
            Ok((peer, accept)) => {
                assert!(proven, "a HandshakeInit without a valid proof was accepted");
                assert_eq!(&peer, from, "the acceptor took the peer for another");
                // The answer proves the secret over the connector's challenge.
                let connector = Connector::new(key.clone(), from.clone(), *nonce);
                assert_eq!(connector.on_accept(accept), Ok(acceptor_node));
            }
            Err(e) => assert!(
                !proven || matches!(e, handshake::HandshakeError::UnsupportedVersion { .. }),
                "a valid HandshakeInit was refused: {e}"
            ),
        }
    } else {
        assert!(acceptor.on_init(frame.clone()).is_err());
    }
    if let Ok(peer) = connector.on_accept(frame.clone()) {
        let Frame::HandshakeAccept { from, mac } = &frame else {
            panic!("the connector accepted a {} frame", frame.kind());
        };
        assert_eq!(&peer, from);
        assert!(handshake::verify_mac(&key, &CONNECTOR_NONCE, from, mac).is_ok());
    }
}

/// Target `cluster_membership`: a message of the membership service (joins, gossip, status).
pub fn cluster_membership(data: &[u8]) {
    decode_message::<MembershipMessage>("membership", data);
}

/// Target `cluster_heartbeat`: a message of the heartbeat service.
pub fn cluster_heartbeat(data: &[u8]) {
    decode_message::<HeartbeatMessage>("heartbeat", data);
}

/// Target `cluster_singleton`: a frame between singleton managers and proxies, and a proxy's
/// reply.
pub fn cluster_singleton(data: &[u8]) {
    if let Ok(frame) = SingletonFrame::decode(data) {
        assert_round_trip(
            "singleton frame",
            &frame,
            |f| Ok::<_, ()>(f.encode().to_vec()),
            SingletonFrame::decode,
        );
    }
    if let Ok(reply) = ProxyReply::decode(data) {
        assert_round_trip(
            "proxy reply",
            &reply,
            |r| Ok::<_, ()>(r.encode().to_vec()),
            ProxyReply::decode,
        );
    }
}

/// The node the cluster-core target runs, and the peers its messages come from.
fn node(n: u16) -> UniqueAddress {
    UniqueAddress::new(Address::new("10.0.0.1", 25520 + n), u64::from(n) * 1000 + 7)
}

/// Peers a message of the cluster-core target can come from: the node itself, two peers, and
/// another incarnation of the first peer.
fn sender(selector: u8) -> UniqueAddress {
    match selector % 4 {
        0 => node(1),
        1 => node(2),
        2 => node(3),
        _ => UniqueAddress::new(node(2).address, 99),
    }
}

/// One step of the cluster-core target: `op`'s low two bits say what (a membership message,
/// a heartbeat message, a tick, an operator command), the next two who sent it, and the rest
/// how many 100 ms pass first.
fn core_step(core: &mut ClusterCore, now: &mut Instant, op: u8, payload: &[u8]) {
    *now += Duration::from_millis(100 * u64::from(op >> 4));
    let from = sender(op >> 2);
    match op & 3 {
        0 => {
            if let Some(message) = decode_message::<MembershipMessage>("membership", payload) {
                core.handle_membership(*now, &from, message);
            }
        }
        1 => {
            if let Some(message) = decode_message::<HeartbeatMessage>("heartbeat", payload) {
                core.handle_heartbeat(*now, &from, message);
            }
        }
        2 => core.tick(*now),
        _ => {
            let address = &from.address;
            let _ = match payload.first().map(|b| b % 3) {
                Some(0) => core.leave(*now, address),
                Some(1) => core.down(*now, address),
                _ => core.join(*now, address.clone()),
            };
        }
    }
    let _ = core.stop_reason(*now);
    core.take_outbox();
    core.take_events();
}

/// Target `cluster_core`: a node's cluster protocols (membership, heartbeats, failure
/// detection, downing) fed a sequence of messages from peers, ticks and operator commands
/// ([`chunks`]: each piece an op byte, see `core_step`, and a message).
pub fn cluster_core(data: &[u8]) {
    let start = Instant::now();
    let mut now = start;
    let Ok(mut core) = ClusterCore::new(
        node(1),
        ClusterCoreConfig::default(),
        7,
        now,
        1_700_000_000_000,
    ) else {
        panic!("the default cluster settings are refused");
    };
    core.start(now);
    for piece in chunks(data) {
        let Some((&op, payload)) = piece.split_first() else {
            continue;
        };
        core_step(&mut core, &mut now, op, payload);
    }
}

/// Valid encodings the targets' corpora start from.
pub mod seeds {
    use super::*;

    /// Seeds of `transport_frames`: the frames of a connection's life, length-prefixed.
    pub fn transport_frames() -> Vec<Vec<u8>> {
        let (acceptor, connector, _, _) = handshake_parties();
        let hello = acceptor.hello();
        let init = connector.on_hello(hello.clone()).ok();
        let accept = init
            .clone()
            .and_then(|i| acceptor.on_init(i).ok())
            .map(|(_, a)| a);
        let mut frames: Vec<Frame> = [Some(hello), init, accept].into_iter().flatten().collect();
        frames.extend(sample_frames());
        let stream = |frames: &[Frame]| {
            let mut out = Vec::new();
            for f in frames {
                let payload = frame::encode(f).map(|b| b.to_vec()).unwrap_or_default();
                out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
                out.extend_from_slice(&payload);
            }
            out
        };
        let mut seeds = vec![stream(&frames)];
        for f in &frames {
            seeds.push(stream(std::slice::from_ref(f)));
        }
        seeds
    }

    fn sample_frames() -> Vec<Frame> {
        let payload = codec::encode(&MembershipMessage::InitJoin);
        vec![
            Frame::OneWay {
                service: 1,
                payload: payload.clone(),
            },
            Frame::Request {
                service: 4,
                lane: Lane::Quorum,
                correlation_id: 300,
                payload,
            },
            Frame::Response {
                correlation_id: 300,
                payload: Bytes::from_static(b"answer"),
            },
            Frame::ErrorResponse {
                correlation_id: 301,
                error: RemoteError::Overloaded {
                    service: 3,
                    capacity: 1024,
                },
            },
            Frame::ErrorResponse {
                correlation_id: 302,
                error: RemoteError::Rejected {
                    reason: "no".into(),
                },
            },
        ]
    }

    /// Seeds of `transport_handshake`: the three handshake frames with valid proofs, and others.
    pub fn transport_handshake() -> Vec<Vec<u8>> {
        let (acceptor, connector, _, _) = handshake_parties();
        let hello = acceptor.hello();
        let mut frames = vec![hello.clone()];
        if let Ok(init) = connector.on_hello(hello) {
            frames.push(init.clone());
            if let Ok((_, accept)) = acceptor.on_init(init) {
                // The answer to the target's connector: proven over its nonce.
                frames.push(accept);
            }
        }
        frames.extend(sample_frames());
        frames
            .iter()
            .filter_map(|f| frame::encode(f).ok().map(|b| b.to_vec()))
            .collect()
    }

    /// A membership conversation between three cores (node 1 forms the cluster, 2 and 3 join),
    /// as `(to, from, message)`, for seeds.
    fn conversation() -> Vec<(UniqueAddress, UniqueAddress, CoreMessage)> {
        let start = Instant::now();
        let nodes = [node(1), node(2), node(3)];
        let mut cores: Vec<ClusterCore> = nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                ClusterCore::new(n.clone(), ClusterCoreConfig::default(), i as u64, start, 0).ok()
            })
            .collect();
        let by_address: BTreeMap<&Address, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (&n.address, i))
            .collect();
        let mut said = Vec::new();
        for core in &mut cores {
            core.start(start);
        }
        let _ = cores[0].join(start, nodes[0].address.clone());
        let _ = cores[1].join(start, nodes[0].address.clone());
        let _ = cores[2].join(start, nodes[0].address.clone());
        for step in 1..40u64 {
            let now = start + Duration::from_millis(250 * step);
            let mut mail = Vec::new();
            for (i, core) in cores.iter_mut().enumerate() {
                core.tick(now);
                for out in core.take_outbox() {
                    if let Some(&to) = by_address.get(&out.to) {
                        mail.push((to, i, out.message));
                    }
                }
                core.take_events();
            }
            for (to, from, message) in mail {
                match message.clone() {
                    CoreMessage::Membership(m) => cores[to].handle_membership(now, &nodes[from], m),
                    CoreMessage::Heartbeat(h) => cores[to].handle_heartbeat(now, &nodes[from], h),
                }
                said.push((nodes[to].clone(), nodes[from].clone(), message));
            }
        }
        said
    }

    /// Seeds of `cluster_membership`: every membership message of a three-node formation.
    pub fn cluster_membership() -> Vec<Vec<u8>> {
        let mut seeds: Vec<Vec<u8>> = conversation()
            .into_iter()
            .filter_map(|(_, _, m)| match m {
                CoreMessage::Membership(m) => Some(codec::encode(&m).to_vec()),
                CoreMessage::Heartbeat(_) => None,
            })
            .collect();
        seeds.dedup();
        seeds
    }

    /// Seeds of `cluster_heartbeat`: a request and a response.
    pub fn cluster_heartbeat() -> Vec<Vec<u8>> {
        let request = HeartbeatMessage::Request(HeartbeatRequest {
            from: node(2),
            sequence_nr: 5,
        });
        let response = HeartbeatMessage::Response(HeartbeatResponse {
            from: node(1),
            sequence_nr: 5,
        });
        vec![
            codec::encode(&request).to_vec(),
            codec::encode(&response).to_vec(),
        ]
    }

    /// Seeds of `cluster_singleton`: every kind of hand-over frame, a request and the replies.
    pub fn cluster_singleton() -> Vec<Vec<u8>> {
        let mut seeds: Vec<Vec<u8>> = [
            HandOverKind::HandOverToMe,
            HandOverKind::HandOverInProgress,
            HandOverKind::HandOverDone,
            HandOverKind::TakeOverFromMe,
        ]
        .into_iter()
        .map(|kind| {
            SingletonFrame::HandOver {
                name: "sharding-coordinator-account".into(),
                hand_over: HandOver {
                    from: node(1),
                    to: node(2),
                    kind,
                },
            }
            .encode()
            .to_vec()
        })
        .collect();
        seeds.push(
            SingletonFrame::Request {
                name: "sharding-coordinator-account".into(),
                payload: Bytes::from_static(b"\x01\x00request"),
            }
            .encode()
            .to_vec(),
        );
        for reply in [
            ProxyReply::Answer(Bytes::from_static(b"answer")),
            ProxyReply::NotRunningHere,
            ProxyReply::Overloaded { capacity: 64 },
        ] {
            seeds.push(reply.encode().to_vec());
        }
        seeds
    }

    /// Seeds of `cluster_core`: what node 1 heard while forming a three-node cluster, with the
    /// time passing between, as one sequence, and its first messages alone.
    pub fn cluster_core() -> Vec<Vec<u8>> {
        let self_node = node(1);
        let steps: Vec<Vec<u8>> = conversation()
            .into_iter()
            .filter(|(to, _, _)| *to == self_node)
            .map(|(_, from, message)| {
                let who = (0..4u8).find(|&s| sender(s) == from).unwrap_or(1);
                let (kind, payload) = match message {
                    CoreMessage::Membership(m) => (0u8, codec::encode(&m)),
                    CoreMessage::Heartbeat(h) => (1u8, codec::encode(&h)),
                };
                // Two and a half 100 ms units pass between the conversation's rounds.
                let op = (2 << 4) | (who << 2) | kind;
                [&[op][..], &payload].concat()
            })
            .collect();
        let tick = [2u8 | (5 << 4)];
        let with_ticks: Vec<&[u8]> = steps
            .iter()
            .flat_map(|s| [s.as_slice(), &tick[..]])
            .collect();
        vec![
            chunked(with_ticks.iter().copied()),
            chunked(steps.iter().take(8).map(Vec::as_slice)),
        ]
    }
}
