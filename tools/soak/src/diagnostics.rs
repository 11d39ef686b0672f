//! What the soak collects from the nodes when a final read goes unanswered, while they still
//! run: for a bug report beside the node logs. Every node's view of each stuck account's log
//! (`GET /journal/account%7C<id>`: configuration, replicas, its writer), every node's shards
//! and live accounts, and the journal, entity and sharding series of every node's metrics.

use super::history::{Operation, Outcome, Request};
use std::collections::BTreeSet;
use std::fmt::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tessera_harness::http_client;

const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

async fn get(http: SocketAddr, path: &str) -> String {
    match http_client::get(http, path, HTTP_TIMEOUT).await {
        Ok(response) => format!("{} {}", response.status, response.body),
        Err(e) => format!("no answer: {e}"),
    }
}

/// Writes `diagnostics.txt` into `dir` when some of `final_reads` went unanswered; its path.
pub async fn collect(
    https: &[SocketAddr],
    final_reads: &[Operation],
    dir: &Path,
) -> std::io::Result<Option<PathBuf>> {
    if final_reads.iter().all(|op| op.outcome == Outcome::Ok) {
        return Ok(None);
    }
    let stuck: BTreeSet<&str> = final_reads
        .iter()
        .filter(|op| op.outcome != Outcome::Ok)
        .filter_map(|op| match &op.request {
            Request::AccountGet { account } => Some(account.as_str()),
            _ => None,
        })
        .collect();
    let mut out = String::new();
    let _ = writeln!(out, "unanswered final reads:");
    for op in final_reads.iter().filter(|op| op.outcome != Outcome::Ok) {
        let _ = writeln!(
            out,
            "  node {}: {:?}: {}",
            op.node + 1,
            op.request,
            op.error.as_deref().unwrap_or("-")
        );
    }
    for account in &stuck {
        for (i, &http) in https.iter().enumerate() {
            let path = format!("/journal/account%7C{account}");
            let _ = writeln!(
                out,
                "\nnode {} GET {path}: {}",
                i + 1,
                get(http, &path).await
            );
        }
    }
    for (i, &http) in https.iter().enumerate() {
        let _ = writeln!(
            out,
            "\nnode {} GET /sharding/account: {}",
            i + 1,
            get(http, "/sharding/account").await
        );
    }
    if let Some(&first) = https.first() {
        let _ = writeln!(
            out,
            "\nnode 1 GET /sharding/account/cluster: {}",
            get(first, "/sharding/account/cluster").await
        );
    }
    for (i, &http) in https.iter().enumerate() {
        let _ = writeln!(out, "\nnode {} metrics:", i + 1);
        let metrics = get(http, "/metrics").await;
        for line in metrics.lines().filter(|l| {
            !l.starts_with('#')
                && !l.contains("_bucket")
                && [
                    "tessera_journal",
                    "tessera_entit",
                    "tessera_sharding",
                    "tessera_cluster",
                ]
                .iter()
                .any(|p| l.starts_with(p))
        }) {
            let _ = writeln!(out, "  {line}");
        }
    }
    let path = dir.join("diagnostics.txt");
    std::fs::write(&path, out)?;
    Ok(Some(path))
}
