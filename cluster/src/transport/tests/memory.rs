//! The suite over the in-memory network, plus link faults only it can inject.

use super::{Harness, recv, spawn_echo, test_config, transport_suite};
use crate::address::Address;
use crate::transport::{
    Lane, MemoryNetwork, MemoryTransport, RequestError, SendError, Transport, TransportConfig,
    TransportError,
};
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

const SERVICE: u16 = 100;

struct MemoryHarness {
    network: Arc<MemoryNetwork>,
    next_port: AtomicU16,
}

impl MemoryHarness {
    fn new() -> Self {
        Self {
            network: MemoryNetwork::new(42),
            next_port: AtomicU16::new(1),
        }
    }
}

impl Harness for MemoryHarness {
    type T = MemoryTransport;

    async fn node(&self, uid: u64, config: TransportConfig) -> Arc<MemoryTransport> {
        let port = self.next_port.fetch_add(1, Ordering::Relaxed);
        self.network
            .bind_with_config(uid, Address::new("10.0.0.1", port), config)
            .unwrap()
    }

    async fn restart(&self, old: Arc<MemoryTransport>, uid: u64) -> Arc<MemoryTransport> {
        let address = old.local().address.clone();
        self.network.crash(&address);
        self.network
            .bind_with_config(uid, address, test_config())
            .unwrap()
    }
}

transport_suite!(MemoryHarness::new());

fn text(s: &'static str) -> Bytes {
    Bytes::from_static(s.as_bytes())
}

async fn two_nodes() -> (MemoryHarness, Arc<MemoryTransport>, Arc<MemoryTransport>) {
    let h = MemoryHarness::new();
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    (h, a, b)
}

#[tokio::test]
async fn partition_drops_both_directions_and_heal_restores() {
    let (h, a, b) = two_nodes().await;
    let (mut at_a, mut at_b) = (
        a.register(SERVICE, 16).unwrap(),
        b.register(SERVICE, 16).unwrap(),
    );
    let (addr_a, addr_b) = (a.local().address.clone(), b.local().address.clone());
    h.network.partition(&addr_a, &addr_b);
    a.send(&addr_b, SERVICE, Lane::Control, text("lost"))
        .unwrap();
    b.send(&addr_a, SERVICE, Lane::Control, text("lost"))
        .unwrap();
    h.network.heal(&addr_a, &addr_b);
    a.send(&addr_b, SERVICE, Lane::Control, text("after"))
        .unwrap();
    b.send(&addr_a, SERVICE, Lane::Control, text("after"))
        .unwrap();
    assert_eq!(recv(&mut at_b).await.payload, text("after"));
    assert_eq!(recv(&mut at_a).await.payload, text("after"));
}

#[tokio::test]
async fn one_way_partition_drops_only_that_direction() {
    let (h, a, b) = two_nodes().await;
    let (mut at_a, mut at_b) = (
        a.register(SERVICE, 16).unwrap(),
        b.register(SERVICE, 16).unwrap(),
    );
    let (addr_a, addr_b) = (a.local().address.clone(), b.local().address.clone());
    h.network.partition_one_way(&addr_a, &addr_b);
    a.send(&addr_b, SERVICE, Lane::Control, text("lost"))
        .unwrap();
    b.send(&addr_a, SERVICE, Lane::Control, text("kept"))
        .unwrap();
    assert_eq!(recv(&mut at_a).await.payload, text("kept"));
    h.network.heal_all();
    a.send(&addr_b, SERVICE, Lane::Control, text("after"))
        .unwrap();
    assert_eq!(recv(&mut at_b).await.payload, text("after"));
}

#[tokio::test]
async fn partitioned_request_times_out() {
    let (h, a, b) = two_nodes().await;
    spawn_echo(b.register(SERVICE, 16).unwrap());
    h.network.partition(&a.local().address, &b.local().address);
    let result = a
        .request(
            &b.local().address,
            SERVICE,
            Lane::Control,
            text("x"),
            Duration::from_millis(50),
        )
        .await;
    assert!(
        matches!(result, Err(RequestError::Timeout { .. })),
        "{result:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn delay_holds_back_one_link_and_keeps_its_order() {
    let h = MemoryHarness::new();
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    let c = h.node(3, test_config()).await;
    let mut at_c = c.register(SERVICE, 16).unwrap();
    let to = c.local().address.clone();
    h.network
        .set_delay(&a.local().address, &to, Duration::from_millis(100));
    a.send(&to, SERVICE, Lane::Control, text("slow 1")).unwrap();
    a.send(&to, SERVICE, Lane::Control, text("slow 2")).unwrap();
    b.send(&to, SERVICE, Lane::Control, text("fast")).unwrap();
    // Paused clock: the delayed link delivers only once time auto-advances past the delay.
    assert_eq!(recv(&mut at_c).await.payload, text("fast"));
    assert_eq!(recv(&mut at_c).await.payload, text("slow 1"));
    assert_eq!(recv(&mut at_c).await.payload, text("slow 2"));
}

/// Sends 200 numbered messages over a lossy link, then a marker over a healed one, and returns
/// which numbers arrived.
async fn survivors_of_lossy_link(seed: u64) -> Vec<u32> {
    let network = MemoryNetwork::new(seed);
    let a = network.bind(1, Address::new("n", 1)).unwrap();
    let b = network.bind(2, Address::new("n", 2)).unwrap();
    let mut at_b = b.register(SERVICE, 512).unwrap();
    let to = b.local().address.clone();
    network
        .set_drop_probability(&a.local().address, &to, 0.5)
        .unwrap();
    for i in 0..200u32 {
        a.send(
            &to,
            SERVICE,
            Lane::Bulk,
            Bytes::copy_from_slice(&i.to_be_bytes()),
        )
        .unwrap();
    }
    network.heal_all();
    a.send(&to, SERVICE, Lane::Bulk, text("end")).unwrap();
    let mut survivors = Vec::new();
    loop {
        let payload = recv(&mut at_b).await.payload;
        if payload == text("end") {
            return survivors;
        }
        survivors.push(u32::from_be_bytes(payload[..].try_into().unwrap()));
    }
}

#[tokio::test]
async fn random_drops_are_partial_and_reproducible_from_the_seed() {
    let first = survivors_of_lossy_link(9).await;
    assert!((1..200).contains(&first.len()), "{} survived", first.len());
    assert!(first.is_sorted(), "survivors keep their order");
    assert_eq!(first, survivors_of_lossy_link(9).await);
}

#[tokio::test]
async fn crashed_node_neither_sends_nor_receives_and_its_address_can_be_rebound() {
    let (h, a, b) = two_nodes().await;
    let mut at_b = b.register(SERVICE, 16).unwrap();
    let addr_a = a.local().address.clone();
    h.network.crash(&addr_a);
    assert_eq!(
        a.send(&b.local().address, SERVICE, Lane::Control, text("ghost")),
        Err(SendError::Closed)
    );
    assert!(matches!(
        h.network.bind(3, b.local().address.clone()),
        Err(TransportError::AddressInUse { .. })
    ));
    let a2 = h.network.bind(4, addr_a).unwrap();
    a2.send(&b.local().address, SERVICE, Lane::Control, text("reborn"))
        .unwrap();
    let inbound = recv(&mut at_b).await;
    assert_eq!(inbound.payload, text("reborn"));
    assert_eq!(inbound.from.uid, 4);
}
