//! A first event-sourced entity type, written from scratch, and the host that runs it: the
//! book's snippets, included from between the `ANCHOR:` markers (so they compile).
//!
//! A shopping cart on a RocksDB journal and snapshot store in a temporary directory: takes
//! items, checks out, refuses a late item, and recovers its state from the journal in a second
//! host: `cargo run --release --example entity`.

// ANCHOR: entity_type
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tessera_entities::{Effect, EntityType};

/// A shopping cart: items go in until it is checked out.
struct ShoppingCart;

#[derive(Serialize, Deserialize)]
enum CartCommand {
    AddItem(String),
    Checkout,
    Get,
}

#[derive(Serialize, Deserialize)]
enum CartEvent {
    ItemAdded(String),
    CheckedOut,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Cart {
    items: BTreeMap<String, u32>, // item -> quantity
    checked_out: bool,
}

#[derive(Debug, Serialize, Deserialize)]
enum CartRejection {
    CheckedOut,
    Empty,
}

impl std::fmt::Display for CartRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CartRejection::CheckedOut => write!(f, "the cart is checked out"),
            CartRejection::Empty => write!(f, "an empty cart cannot be checked out"),
        }
    }
}

impl EntityType for ShoppingCart {
    type Command = CartCommand;
    type Event = CartEvent;
    type State = Cart;
    type Reply = Cart;
    type Rejection = CartRejection;
    // Stored with every event and snapshot: never change them (bump the versions instead).
    const TYPE_NAME: &'static str = "cart";
    const EVENT_MANIFEST: &'static str = "cart.Event";
    const STATE_MANIFEST: &'static str = "cart.State";

    fn initial_state(&self, _id: &str) -> Cart {
        Cart::default()
    }

    // Decides from the state; only events change it (so a recovery rebuilds it exactly).
    fn handle_command(&self, cart: &Cart, command: CartCommand) -> Effect<Self> {
        match command {
            CartCommand::Get => Effect::reply(cart.clone()),
            _ if cart.checked_out => Effect::reject(CartRejection::CheckedOut),
            CartCommand::AddItem(item) => {
                Effect::persist(CartEvent::ItemAdded(item)).then_reply(Cart::clone)
            }
            CartCommand::Checkout if cart.items.is_empty() => Effect::reject(CartRejection::Empty),
            CartCommand::Checkout => Effect::persist(CartEvent::CheckedOut).then_reply(Cart::clone),
        }
    }

    fn apply_event(&self, cart: &mut Cart, event: &CartEvent) {
        match event {
            CartEvent::ItemAdded(item) => {
                let quantity = cart.items.entry(item.clone()).or_default();
                *quantity = quantity.saturating_add(1);
            }
            CartEvent::CheckedOut => cart.checked_out = true,
        }
    }
}
// ANCHOR_END: entity_type

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("tessera-example-entity-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    // ANCHOR: entity_host
    use std::sync::Arc;
    use tessera_entities::{AskError, EntityConfig, EntityHost};
    use tessera_journal::{Journal, JournalConfig, RocksJournal};
    use tessera_snapshot::{RocksSnapshotStore, SnapshotConfig, SnapshotStore};

    // The host takes its stores as trait objects: here this process's RocksDB journal and
    // snapshot store; on a cluster member, `persistence.journal` and `persistence.snapshots`.
    let journal: Arc<dyn Journal> =
        Arc::new(RocksJournal::open(JournalConfig::new(dir.join("journal"))).await?);
    let snapshots: Arc<dyn SnapshotStore> =
        Arc::new(RocksSnapshotStore::open(SnapshotConfig::new(dir.join("snapshots"))).await?);
    let config = EntityConfig::default(); // snapshot every 100 events, passivate after 2 min idle
    let host = EntityHost::start(ShoppingCart, journal.clone(), snapshots.clone(), config)?;
    let cart = host.entity_ref("alice")?; // persistence id "cart|alice"
    cart.ask(CartCommand::AddItem("socks".into())).await?; // Ok(Cart) | Err(AskError)
    let checked_out = cart.ask(CartCommand::Checkout).await?;
    match cart.ask(CartCommand::AddItem("hat".into())).await {
        Err(AskError::Rejected(why)) => println!("refused: {why}"), // nothing was persisted
        other => return Err(format!("a checked-out cart answered {other:?}").into()),
    }
    // ANCHOR_END: entity_host

    println!("checked out: {:?}", checked_out.items);
    // A new host recovers the cart from its events.
    host.shutdown().await;
    drop(host);
    let host = EntityHost::start(ShoppingCart, journal, snapshots, EntityConfig::default())?;
    let recovered = host.ask("alice", CartCommand::Get).await?;
    println!("recovered: {recovered:?}");
    assert!(recovered.checked_out && recovered.items == checked_out.items);
    host.shutdown().await;
    drop(host);
    // The journal closes on its writer thread once its last handle is gone (the host's): wait
    // for that, a bounded while, before removing its directory.
    for attempt in 1.. {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => break,
            Err(e) if attempt == 50 => return Err(e.into()),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
    Ok(())
}
