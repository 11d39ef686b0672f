//! `tessera demo`: the main job. Starts a local cluster of real `tessera node` processes,
//! shows the members converge to Up, kills one with SIGKILL and shows the others detect it,
//! down it and remove it, then stops the rest gracefully.

use crate::http_client;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Split-brain resolver stability used by the demo, so that a dead node is removed quickly.
const DEMO_STABLE_AFTER: &str = "2s";
/// Upper bound for every phase; the demo fails rather than hang.
const PHASE_TIMEOUT: Duration = Duration::from_secs(60);
const POLL_INTERVAL: Duration = Duration::from_millis(200);
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);

/// What stopped the demo.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("the demo needs at least 2 nodes, got {0}")]
    TooFewNodes(u16),
    #[error("cannot find the tessera executable: {0}")]
    Executable(std::io::Error),
    #[error("cannot start node {index}: {reason}")]
    Spawn { index: usize, reason: String },
    #[error("{phase} did not happen within {timeout:?}")]
    Timeout { phase: String, timeout: Duration },
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// A `tessera node` child process.
pub struct NodeProcess {
    pub child: Child,
    pub cluster: String,
    pub http: SocketAddr,
    pub log: PathBuf,
}

/// Spawns `tessera node` with `args`, its logs to `log`, and waits for its "listening" line.
pub async fn spawn_node(
    exe: &Path,
    index: usize,
    args: &[String],
    log: PathBuf,
) -> Result<NodeProcess, DemoError> {
    let spawn_error = |reason: String| DemoError::Spawn { index, reason };
    let log_file = std::fs::File::create(&log)?;
    let mut child = Command::new(exe)
        .arg("node")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| spawn_error(e.to_string()))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| spawn_error("no stdout".into()))?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .map_err(|_| spawn_error("no 'listening' line within 30 s".into()))?
        .map_err(|e| spawn_error(e.to_string()))?
        .ok_or_else(|| spawn_error(format!("exited before listening; see {}", log.display())))?;
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .map(str::to_string)
    };
    let cluster =
        field("cluster=").ok_or_else(|| spawn_error(format!("unexpected line {line:?}")))?;
    let http = field("http=")
        .and_then(|h| h.parse().ok())
        .ok_or_else(|| spawn_error(format!("unexpected line {line:?}")))?;
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(NodeProcess {
        child,
        cluster,
        http,
        log,
    })
}

/// One node's view: (address, status, reachable) per member, and the leader.
pub type View = (Vec<(String, String, bool)>, Option<String>);

/// Reads `GET /cluster/members` of a node; None when it does not answer.
pub async fn view(http: SocketAddr) -> Option<View> {
    let response = http_client::get(http, "/cluster/members", HTTP_TIMEOUT)
        .await
        .ok()?;
    let json = response.json()?;
    let members = json["members"]
        .as_array()?
        .iter()
        .map(|m| {
            (
                m["address"].as_str().unwrap_or("?").to_string(),
                m["status"].as_str().unwrap_or("?").to_string(),
                m["reachable"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    Some((members, json["leader"].as_str().map(str::to_string)))
}

/// Sends SIGTERM to a child.
pub fn terminate(child: &Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) with a pid we own and a valid signal has no memory effects.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

fn print_views(views: &[(String, Option<View>)]) {
    for (name, v) in views {
        match v {
            Some((members, leader)) => {
                let list: Vec<String> = members
                    .iter()
                    .map(|(a, s, r)| format!("{a}={s}{}", if *r { "" } else { "(unreachable)" }))
                    .collect();
                println!(
                    "    {name} sees [{}] leader={}",
                    list.join(", "),
                    leader.as_deref().unwrap_or("-")
                );
            }
            None => println!("    {name}: not answering"),
        }
    }
}

async fn wait_for(
    phase: &str,
    nodes: &[&NodeProcess],
    start: Instant,
    mut done: impl FnMut(&[(String, Option<View>)]) -> bool,
) -> Result<(), DemoError> {
    let mut last_printed = Vec::new();
    loop {
        let mut views = Vec::new();
        for n in nodes {
            views.push((n.cluster.clone(), view(n.http).await));
        }
        let printable: Vec<String> = views.iter().map(|(n, v)| format!("{n}{v:?}")).collect();
        if printable != last_printed {
            println!("  t={:>5.1}s", start.elapsed().as_secs_f64());
            print_views(&views);
            last_printed = printable;
        }
        if done(&views) {
            return Ok(());
        }
        if start.elapsed() > PHASE_TIMEOUT {
            return Err(DemoError::Timeout {
                phase: phase.to_string(),
                timeout: PHASE_TIMEOUT,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Runs the demo with `node_count` nodes.
pub async fn run(node_count: u16) -> Result<(), DemoError> {
    if node_count < 2 {
        return Err(DemoError::TooFewNodes(node_count));
    }
    let exe = std::env::current_exe().map_err(DemoError::Executable)?;
    let dir = std::env::temp_dir().join(format!("tessera-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    println!(
        "tessera demo: {node_count} nodes on 127.0.0.1 (logs in {})",
        dir.display()
    );
    let common = |i: usize| {
        vec![
            "--host".to_string(),
            "127.0.0.1".to_string(),
            "--port".to_string(),
            "0".to_string(),
            "--http-port".to_string(),
            "0".to_string(),
            "--stable-after".to_string(),
            DEMO_STABLE_AFTER.to_string(),
            "--data-dir".to_string(),
            dir.join(format!("node-{i}")).display().to_string(),
        ]
    };

    println!("\n1. Starting node 1 and forming a new cluster with POST /cluster/join to itself");
    let first = spawn_node(&exe, 1, &common(1), dir.join("node-1.log")).await?;
    let body = format!("{{\"address\": \"{}\"}}", first.cluster);
    let joined = http_client::request(
        first.http,
        "POST",
        "/cluster/join",
        Some(&body),
        HTTP_TIMEOUT,
    )
    .await
    .map_err(|e| DemoError::Spawn {
        index: 1,
        reason: e.to_string(),
    })?;
    println!(
        "   node 1: cluster={} http={} -> join answered {}",
        first.cluster, first.http, joined.status
    );
    let mut nodes = vec![first];
    println!(
        "\n2. Starting {} more nodes with --seed {}",
        node_count - 1,
        nodes[0].cluster
    );
    for i in 2..=usize::from(node_count) {
        let mut args = common(i);
        args.push("--seed".to_string());
        args.push(nodes[0].cluster.clone());
        let node = spawn_node(&exe, i, &args, dir.join(format!("node-{i}.log"))).await?;
        println!("   node {i}: cluster={} http={}", node.cluster, node.http);
        nodes.push(node);
    }

    let start = Instant::now();
    let n = nodes.len();
    let all: Vec<&NodeProcess> = nodes.iter().collect();
    wait_for("all members Up", &all, start, |views| {
        let leaders: std::collections::BTreeSet<_> = views
            .iter()
            .map(|(_, v)| v.as_ref().map(|v| v.1.clone()))
            .collect();
        leaders.len() == 1
            && views.iter().all(|(_, v)| {
                v.as_ref()
                    .is_some_and(|(m, _)| m.len() == n && m.iter().all(|(_, s, r)| s == "up" && *r))
            })
    })
    .await?;
    println!(
        "=> all {n} nodes see {n} members Up with the same leader after {:.1}s",
        start.elapsed().as_secs_f64()
    );

    let mut victim = nodes.pop().ok_or(DemoError::TooFewNodes(0))?;
    println!("\n3. SIGKILL node {n} ({})", victim.cluster);
    victim.child.start_kill()?;
    let _ = victim.child.wait().await;
    let start = Instant::now();
    let survivors: Vec<&NodeProcess> = nodes.iter().collect();
    let victim_address = victim.cluster.clone();
    wait_for(
        "the killed node is seen unreachable",
        &survivors,
        start,
        |views| {
            views.iter().all(|(_, v)| {
                v.as_ref()
                    .is_some_and(|(m, _)| m.iter().any(|(a, _, r)| *a == victim_address && !*r))
            })
        },
    )
    .await?;
    println!(
        "=> every survivor sees {victim_address} unreachable after {:.1}s",
        start.elapsed().as_secs_f64()
    );
    wait_for(
        "the killed node is downed and removed",
        &survivors,
        start,
        |views| {
            views.iter().all(|(_, v)| {
                v.as_ref().is_some_and(|(m, _)| {
                    m.len() == n - 1 && m.iter().all(|(_, s, r)| s == "up" && *r)
                })
            })
        },
    )
    .await?;
    println!(
        "=> the split-brain resolver downed it (stable-after {DEMO_STABLE_AFTER}) and the leader removed it: {:.1}s after the kill",
        start.elapsed().as_secs_f64()
    );

    println!("\n4. SIGTERM the remaining nodes: each leaves gracefully");
    for node in &nodes {
        terminate(&node.child);
    }
    for (i, node) in nodes.iter_mut().enumerate() {
        let status = tokio::time::timeout(Duration::from_secs(30), node.child.wait())
            .await
            .map_err(|_| DemoError::Timeout {
                phase: format!("node {} exiting after SIGTERM", i + 1),
                timeout: Duration::from_secs(30),
            })??;
        println!("   node {} ({}) exited with {status}", i + 1, node.cluster);
    }
    println!("\ndemo complete");
    Ok(())
}
