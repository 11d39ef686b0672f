//! `tessera soak`: a nemesis soak. A cluster of real `tessera node` processes (five by
//! default) runs a mixed workload — sharded account deposits and reads, Distributed Data
//! counter increments and set adds with WriteMajority and reads with ReadMajority — while a
//! nemesis kills, pauses, gracefully restarts and (where nodes run in network namespaces)
//! partitions nodes, never more than a minority at a time. Then every fault is healed, the
//! cluster must converge, everything is read through every node, and a checker decides from
//! the history whether any acknowledged write was lost or doubled, any read was stale, any
//! entity lived on two nodes in a stable view, and any node's memory went past its bound.
//!
//! The pieces, one per file: [`cluster`] (the node processes), [`nemesis`] (faults and
//! supervision), [`workload`] (the clients), [`history`] (what they recorded),
//! [`ownership`] and [`memory`] (samples taken meanwhile), [`checker`] and [`report`].

pub mod args;
pub mod checker;
pub mod cluster;
pub mod diagnostics;
pub mod history;
pub mod memory;
pub mod metrics;
pub mod nemesis;
pub mod ownership;
pub mod report;
pub mod workload;

use checker::Evidence;
use cluster::{Cluster, Placement};
use history::{History, Observed, OpKind, Operation, Outcome, Request};
use nemesis::Nemesis;
use report::Summary;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_harness::http_client;
use tessera_harness::netns;
use tokio::sync::watch;
use workload::WorkloadConfig;

/// Names of this tool's namespaces and links start with this (the partition test uses `tsp`).
const NETNS_PREFIX: &str = "tsk";
/// The soak's nodes get addresses in 10.232.X.0/24.
const NETNS_NET: [u8; 2] = [10, 232];
/// How long the cluster has to form before the workload starts.
const FORMATION_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the cluster has to converge again after the faults ended.
const CONVERGENCE_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the final reads may take, all together.
const FINAL_READS_TIMEOUT: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(500);

/// Exit status of a run that found anomalies.
pub const EXIT_ANOMALIES: u8 = 1;
/// Exit status of a run the soak could not carry out (a node would not start, the cluster did
/// not form, the network could not be set up): nothing was decided about tessera.
pub const EXIT_HARNESS_FAILURE: u8 = 3;

/// A corruption of the evidence, to show that the checker catches what it should.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Sabotage {
    /// One acknowledged deposit is recorded twice.
    DoubleDeposit,
    /// One acknowledged set add is removed from every final read of its set.
    DropAdd,
    /// One acknowledged counter increment of 1,000 is added to the history.
    ExtraIncrement,
    /// One account of a stable sample is listed on a second node too.
    DuplicateEntity,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct SoakOptions {
    pub minutes: f64,
    pub nodes: usize,
    pub seed: u64,
    /// The nodes' `stable_after` (the split-brain resolver's wait).
    pub stable_after: Duration,
    /// Keep the directory with the nodes' data and logs and the history even when valid.
    pub keep_dir: bool,
    pub max_rss_bytes: u64,
    pub sabotage: Option<Sabotage>,
}

/// Why the soak could not run (as opposed to anomalies, which it found).
#[derive(Debug, thiserror::Error)]
pub enum SoakError {
    #[error("cannot find the tessera executable: {0}")]
    Executable(std::io::Error),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("node {node}: {reason}")]
    Node { node: usize, reason: String },
    #[error("network namespaces: {0}")]
    Network(String),
    #[error("the cluster did not form within {0:?}: {1}")]
    Formation(Duration, String),
    #[error("a soak task failed: {0}")]
    Task(String),
}

/// Prints a progress line on stderr.
fn progress(start: Option<Instant>, message: &str) {
    match start {
        Some(start) => eprintln!("  {:>7.1}s {message}", start.elapsed().as_secs_f64()),
        None => eprintln!("  {message}"),
    }
}

/// Runs the soak; the summary says whether it found anomalies.
pub async fn run(options: SoakOptions) -> Result<Summary, SoakError> {
    let exe = std::env::current_exe().map_err(SoakError::Executable)?;
    let dir = std::env::temp_dir().join(format!("tessera-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run_in(&exe, &dir, &options).await;
    match result {
        Ok(mut summary) => {
            if summary.valid && !options.keep_dir {
                let _ = std::fs::remove_dir_all(&dir);
            } else {
                summary.kept_dir = Some(dir.display().to_string());
            }
            Ok(summary)
        }
        Err(e) => {
            eprintln!("node logs and data kept in {}", dir.display());
            Err(e)
        }
    }
}

/// Namespaces where possible (root, `ip` and `tc`), else loopback; the reason partitions are
/// skipped, if they are.
fn placement(nodes: usize) -> Result<(Placement, Option<String>), SoakError> {
    if let Some(reason) = netns::unavailable_reason(NETNS_PREFIX) {
        return Ok((Placement::loopback(nodes)?, Some(reason)));
    }
    for name in netns::remove_stale(NETNS_PREFIX) {
        progress(None, &format!("removed {name}, left by an earlier soak"));
    }
    let network = netns::Network::create(NETNS_PREFIX, NETNS_NET, nodes)
        .map_err(|e| SoakError::Network(e.to_string()))?;
    let names = network.names().clone();
    Ok((
        Placement::Namespaces {
            network: Arc::new(Mutex::new(network)),
            names,
        },
        None,
    ))
}

async fn run_in(exe: &Path, dir: &Path, options: &SoakOptions) -> Result<Summary, SoakError> {
    let secret = format!("soak-{:016x}", rand::random::<u64>());
    let (placement, skipped) = placement(options.nodes)?;
    if matches!(placement, Placement::Namespaces { .. }) {
        // HTTP is not on loopback there: reads need the token too.
        http_client::use_token(&secret);
    }
    let placement_text = placement.describe();
    let partitions = match &skipped {
        None => "on (2|3 and 1|4 cuts between namespaces)".to_string(),
        Some(reason) => format!("skipped: {reason}"),
    };
    progress(
        None,
        &format!(
            "tessera soak: {} nodes for {} min, seed {}, stable-after {}; nodes on \
             {placement_text}; partitions {partitions}; logs in {}",
            options.nodes,
            options.minutes,
            options.seed,
            humantime::format_duration(options.stable_after),
            dir.display()
        ),
    );
    let setup = Instant::now();
    let cluster = Cluster::new(
        exe,
        dir,
        placement,
        options.nodes,
        &secret,
        options.stable_after,
        setup,
    );
    let https: Vec<SocketAddr> = cluster.specs().iter().map(|s| s.http).collect();
    let pids = cluster.pids();
    let (mut nemesis, health) = Nemesis::new(cluster, options.seed, options.stable_after, false);
    nemesis.start_all().await?;
    wait_formed(&https).await?;
    progress(
        None,
        &format!(
            "cluster of {} formed in {:.1}s; workload and nemesis start",
            options.nodes,
            setup.elapsed().as_secs_f64()
        ),
    );

    let start = Instant::now();
    let end = start + Duration::from_secs_f64(options.minutes * 60.0);
    let (stop, stopped) = watch::channel(false);
    let nemesis = tokio::spawn(nemesis.run(start, end, stopped.clone()));
    let ownership = tokio::spawn(ownership::run(https.clone(), start, stopped.clone()));
    let memory = tokio::spawn(memory::run(https.clone(), pids, stopped));
    let history = Arc::new(History::default());
    workload::run(
        WorkloadConfig::standard(),
        https.clone(),
        options.seed,
        start,
        end,
        history.clone(),
    )
    .await;
    progress(
        Some(start),
        "workload done; waiting for one converged cluster of all nodes",
    );
    let converged = wait_converged(&https, health, start).await;
    let config = WorkloadConfig::standard();
    let final_reads = final_reads(&https, &config, start).await;
    if let Some(path) = diagnostics::collect(&https, &final_reads, dir).await? {
        progress(
            Some(start),
            &format!(
                "some final reads went unanswered; what the nodes say is in {}",
                path.display()
            ),
        );
    }
    progress(Some(start), "final reads done; checking");
    let _ = stop.send(true);
    let (record, mut cluster) = nemesis
        .await
        .map_err(|e| SoakError::Task(e.to_string()))??;
    let ownership = ownership
        .await
        .map_err(|e| SoakError::Task(e.to_string()))?;
    let memory = memory.await.map_err(|e| SoakError::Task(e.to_string()))?;
    cluster.kill_all().await;
    // The namespaces go with the cluster, after its nodes.
    drop(cluster);

    let mut operations = history.operations();
    let mut final_reads = final_reads;
    let mut ownership = ownership;
    if let Some(sabotage) = options.sabotage {
        sabotage_evidence(sabotage, &mut operations, &mut final_reads, &mut ownership);
    }
    write_history(dir, &operations, &final_reads, &record)?;
    let checks = checker::check(&Evidence {
        operations: &operations,
        final_reads: &final_reads,
        converged,
        ownership: &ownership,
        memory: &memory,
        rss_bound_bytes: options.max_rss_bytes,
        crashes: &record.crashes,
        memory_losses_us: &checker::memory_losses(&record.events, options.nodes),
    });
    let anomalies = checks.iter().map(|c| c.anomaly_count).sum();
    Ok(Summary {
        nodes: options.nodes,
        minutes: options.minutes,
        seed: options.seed,
        placement: placement_text,
        partitions,
        operations: history::tally(&operations),
        nemesis: report::count_events(&record.events),
        events: record.events,
        checks,
        memory: memory.nodes,
        anomalies,
        valid: anomalies == 0,
        sabotage: options.sabotage.map(|s| format!("{s:?}")),
        kept_dir: None,
    })
}

/// Waits until all nodes are Up and ready in one converged cluster.
async fn wait_formed(https: &[SocketAddr]) -> Result<(), SoakError> {
    let deadline = Instant::now() + FORMATION_TIMEOUT;
    loop {
        if all_converged_and_ready(https).await {
            return Ok(());
        }
        if Instant::now() > deadline {
            let views = ownership::views(https).await;
            return Err(SoakError::Formation(
                FORMATION_TIMEOUT,
                format!("views {views:?}"),
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Whether every node answers, all see the same members — exactly the nodes — Up and
/// reachable, and every node is ready (its regions registered).
async fn all_converged_and_ready(https: &[SocketAddr]) -> bool {
    let views = ownership::views(https).await;
    if views.iter().any(Option::is_none)
        || ownership::converged(&views).is_none_or(|members| members.len() != https.len())
    {
        return false;
    }
    let ready = futures::future::join_all(
        https
            .iter()
            .map(|&h| http_client::get(h, "/health/ready", Duration::from_secs(2))),
    )
    .await;
    ready
        .iter()
        .all(|r| r.as_ref().is_ok_and(|r| r.status == 200))
}

/// After the faults: waits (bounded) until the nemesis sees every node healthy and all nodes
/// form one converged cluster; whether they did.
async fn wait_converged(https: &[SocketAddr], mut health: nemesis::Health, start: Instant) -> bool {
    let deadline = Instant::now() + CONVERGENCE_TIMEOUT;
    let began = Instant::now();
    loop {
        if *health.borrow_and_update() && all_converged_and_ready(https).await {
            progress(
                Some(start),
                &format!(
                    "converged {:.1}s after the workload ended",
                    began.elapsed().as_secs_f64()
                ),
            );
            return true;
        }
        if Instant::now() > deadline {
            progress(
                Some(start),
                &format!("NOT converged within {CONVERGENCE_TIMEOUT:?}"),
            );
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Every account, counter and set read through every node (accounts confirmed current,
/// counters and sets with ReadMajority), each retried until answered.
async fn final_reads(
    https: &[SocketAddr],
    config: &WorkloadConfig,
    start: Instant,
) -> Vec<Operation> {
    let deadline = Instant::now() + FINAL_READS_TIMEOUT;
    let mut requests = Vec::new();
    for account in &config.accounts {
        requests.push(Request::AccountGet {
            account: account.clone(),
        });
    }
    for key in &config.counters {
        requests.push(Request::CounterRead { key: key.clone() });
    }
    for key in &config.sets {
        requests.push(Request::SetRead { key: key.clone() });
    }
    let mut reads = Vec::new();
    for (node, &http) in https.iter().enumerate() {
        for request in &requests {
            reads.push(workload::read_until_answered(
                node,
                http,
                request.clone(),
                start,
                deadline,
            ));
        }
    }
    // Bounded: one read per account, counter and set per node (a few hundred).
    futures::future::join_all(reads).await
}

/// Corrupts the evidence as `sabotage` says (nothing when there is nothing to corrupt).
fn sabotage_evidence(
    sabotage: Sabotage,
    operations: &mut Vec<Operation>,
    final_reads: &mut [Operation],
    ownership: &mut ownership::OwnershipRecord,
) {
    match sabotage {
        Sabotage::DoubleDeposit => {
            if let Some(deposit) = operations
                .iter()
                .find(|op| op.kind() == OpKind::Deposit && op.outcome == Outcome::Ok)
                .cloned()
            {
                operations.push(deposit);
            }
        }
        Sabotage::DropAdd => {
            let added = operations.iter().find_map(|op| match &op.request {
                Request::SetAdd { key, element } if op.outcome == Outcome::Ok => {
                    Some((key.clone(), *element))
                }
                _ => None,
            });
            if let Some((key, element)) = added {
                for read in final_reads.iter_mut() {
                    if let (Request::SetRead { key: read_key }, Some(Observed::Elements(e))) =
                        (&read.request, &mut read.observed)
                        && *read_key == key
                    {
                        e.retain(|x| *x != element);
                    }
                }
            }
        }
        Sabotage::ExtraIncrement => {
            if let Some(mut increment) = operations
                .iter()
                .find(|op| op.kind() == OpKind::CounterIncrement)
                .cloned()
            {
                if let Request::CounterIncrement { by, .. } = &mut increment.request {
                    *by = 1_000;
                }
                increment.outcome = Outcome::Ok;
                operations.push(increment);
            }
        }
        Sabotage::DuplicateEntity => {
            for sample in &mut ownership.stable {
                let nodes: Vec<usize> = sample.hosts.keys().copied().collect();
                let hosted = nodes.iter().find_map(|n| {
                    sample.hosts[n]
                        .iter()
                        .next()
                        .map(|account| (*n, account.clone()))
                });
                if let Some((owner, account)) = hosted
                    && let Some(other) = nodes.iter().find(|&&n| n != owner)
                    && let Some(list) = sample.hosts.get_mut(other)
                {
                    list.insert(account);
                    return;
                }
            }
        }
    }
}

/// Writes `history.jsonl` (every operation, then the final reads, then the nemesis events,
/// one JSON object per line) into `dir`.
fn write_history(
    dir: &Path,
    operations: &[Operation],
    final_reads: &[Operation],
    record: &nemesis::NemesisRecord,
) -> Result<PathBuf, SoakError> {
    let path = dir.join("history.jsonl");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path)?);
    let line = |value: serde_json::Value, out: &mut std::io::BufWriter<std::fs::File>| {
        writeln!(out, "{value}")
    };
    for op in operations {
        line(serde_json::json!({"operation": op}), &mut out)?;
    }
    for op in final_reads {
        line(serde_json::json!({"final_read": op}), &mut out)?;
    }
    for event in &record.events {
        line(serde_json::json!({"nemesis": event}), &mut out)?;
    }
    out.flush()?;
    Ok(path)
}
