//! A node started by the builder with one sharded entity type, asked through a typed
//! reference: the book's snippet, included from between the `ANCHOR:` markers (so it
//! compiles).
//!
//! A single node on free ports of 127.0.0.1 forms a cluster of its own and deposits to
//! `alice`: `cargo run --release --example sharding`.

use tessera::config::NodeConfig;
use tessera_example_account::{Account, AccountCommand};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("tessera-example-sharding-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = NodeConfig {
        port: 0,
        http_port: 0,
        data_dir: dir.clone(),
        ..NodeConfig::default()
    };

    // ANCHOR: sharding
    use tessera::NodeBuilder;

    let node = NodeBuilder::new()
        .entity(Account) // every node of the cluster registers the same types
        .start(&config)
        .await?;
    node.cluster.join(node.cluster_address().clone()).await?; // a cluster of its own
    let alice = node.entity_ref::<Account>("alice"); // wherever in the cluster alice runs
    let balance = alice.ask(AccountCommand::Deposit(5)).await?; // or a typed AskError
    // Hands its shards off, stops its entities after their writes, leaves, closes the stores.
    node.shutdown().await;
    // ANCHOR_END: sharding

    println!("alice: {balance:?}");
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
