//! The soak's cluster: `tessera node` processes (this binary, as children), each with its own
//! data directory and a fixed address, so that a node restarted after a kill, a pause that got
//! it downed, or a graceful stop comes back as a new incarnation of the same member. Nodes run
//! on 127.0.0.1 with ports picked free once, or each in a network namespace of its own (so the
//! nemesis can cut links between them; see [`crate::netns`]).

use super::SoakError;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tessera_harness::demo::{self, NodeProcess};
use tessera_harness::netns;

/// The cluster port of nodes in namespaces (each namespace has its own address).
const NAMESPACE_CLUSTER_PORT: u16 = 25520;
const NAMESPACE_HTTP_PORT: u16 = 8558;
/// How long a node has to exit after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// The settings every soak node runs with, beyond its addresses, data directory and
/// `stable_after`.
pub const NODE_SETTINGS: &[&str] = &[
    "--entity-ask-timeout",
    "5s",
    // Rebalancing after restarted nodes rejoin is part of what the soak exercises.
    "--rebalance-interval",
    "5s",
    // Half of the soak's Distributed Data keys are durable (`d-...`), half live in memory.
    "--durable-keys",
    "d-*",
];

/// Where the nodes run.
pub enum Placement {
    /// On 127.0.0.1, node `i` on cluster port `ports[i].0` and HTTP port `ports[i].1`.
    Loopback { ports: Vec<(u16, u16)> },
    /// Node `i` in namespace `i` of `network`, on its address.
    Namespaces {
        network: Arc<Mutex<netns::Network>>,
        names: netns::Names,
    },
}

impl Placement {
    /// Ports picked free on 127.0.0.1 for `nodes` nodes (a port taken meanwhile makes that
    /// node's start fail, which is reported).
    pub fn loopback(nodes: usize) -> Result<Placement, SoakError> {
        let mut listeners = Vec::new();
        for _ in 0..nodes * 2 {
            // Held until all are picked, so that no port is picked twice.
            listeners.push(std::net::TcpListener::bind("127.0.0.1:0")?);
        }
        let mut ports = Vec::new();
        for pair in listeners.chunks(2) {
            ports.push((pair[0].local_addr()?.port(), pair[1].local_addr()?.port()));
        }
        Ok(Placement::Loopback { ports })
    }

    fn ip(&self, i: usize) -> IpAddr {
        match self {
            Placement::Loopback { .. } => IpAddr::from([127, 0, 0, 1]),
            Placement::Namespaces { names, .. } => IpAddr::V4(names.ip(i)),
        }
    }

    fn ports(&self, i: usize) -> (u16, u16) {
        match self {
            Placement::Loopback { ports } => ports[i],
            Placement::Namespaces { .. } => (NAMESPACE_CLUSTER_PORT, NAMESPACE_HTTP_PORT),
        }
    }

    /// A description for the summary.
    pub fn describe(&self) -> String {
        match self {
            Placement::Loopback { .. } => "127.0.0.1, one port pair per node".to_string(),
            Placement::Namespaces { names, .. } => format!(
                "a network namespace per node ({}0..), on {}",
                names.netns(0).trim_end_matches('0'),
                names.subnet()
            ),
        }
    }
}

/// One node's fixed identity across its incarnations.
pub struct NodeSpec {
    /// `host:port` of its cluster transport.
    pub cluster: String,
    pub http: SocketAddr,
    pub data_dir: PathBuf,
    pub log: PathBuf,
}

/// The node processes. Owned by the nemesis, which starts, signals and restarts them; the
/// memory sampler reads their pids through [`Cluster::pids`].
pub struct Cluster {
    exe: PathBuf,
    placement: Placement,
    specs: Vec<NodeSpec>,
    args: Vec<Vec<String>>,
    processes: Vec<Option<NodeProcess>>,
    incarnations: Vec<u32>,
    pids: Arc<Mutex<Vec<Option<u32>>>>,
    start: Instant,
}

impl Cluster {
    /// `nodes` nodes of `exe` in `dir` (data in `node-<n>/`, logs in `node-<n>.log`, every
    /// incarnation appended), every node a seed, sharing `secret`. None is started yet.
    pub fn new(
        exe: &Path,
        dir: &Path,
        placement: Placement,
        nodes: usize,
        secret: &str,
        stable_after: Duration,
        start: Instant,
    ) -> Cluster {
        let seeds: Vec<String> = (0..nodes)
            .map(|i| format!("{}:{}", placement.ip(i), placement.ports(i).0))
            .collect();
        let mut specs = Vec::new();
        let mut args = Vec::new();
        for i in 0..nodes {
            let host = placement.ip(i).to_string();
            let (port, http_port) = placement.ports(i);
            let data_dir = dir.join(format!("node-{}", i + 1));
            let mut node_args: Vec<String> = vec![
                "--host".into(),
                host.clone(),
                "--port".into(),
                port.to_string(),
                "--http-host".into(),
                host.clone(),
                "--http-port".into(),
                http_port.to_string(),
                "--seed".into(),
                seeds.join(","),
                "--data-dir".into(),
                data_dir.display().to_string(),
                "--cluster-secret".into(),
                secret.to_string(),
            ];
            if matches!(placement, Placement::Namespaces { .. }) {
                // HTTP on a namespace's address, not loopback: the node requires a token.
                node_args.extend(["--http-token".to_string(), secret.to_string()]);
            }
            node_args.extend(NODE_SETTINGS.iter().map(|s| s.to_string()));
            // Short, so that the soak sees several downings: a node cut off or paused for
            // longer than failure detection (about 4 s) plus this is downed.
            node_args.extend([
                "--stable-after".to_string(),
                humantime::format_duration(stable_after).to_string(),
            ]);
            args.push(node_args);
            specs.push(NodeSpec {
                cluster: format!("{host}:{port}"),
                http: SocketAddr::new(placement.ip(i), http_port),
                data_dir,
                log: dir.join(format!("node-{}.log", i + 1)),
            });
        }
        Cluster {
            exe: exe.to_path_buf(),
            placement,
            specs,
            args,
            processes: (0..nodes).map(|_| None).collect(),
            incarnations: vec![0; nodes],
            pids: Arc::new(Mutex::new(vec![None; nodes])),
            start,
        }
    }

    pub fn len(&self) -> usize {
        self.specs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    pub fn specs(&self) -> &[NodeSpec] {
        &self.specs
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The running processes' pids by node, for the memory sampler.
    pub fn pids(&self) -> Arc<Mutex<Vec<Option<u32>>>> {
        self.pids.clone()
    }

    /// How many times node `i` was started.
    pub fn incarnations(&self, i: usize) -> u32 {
        self.incarnations[i]
    }

    fn set_pid(&self, i: usize, pid: Option<u32>) {
        self.pids.lock().unwrap_or_else(PoisonError::into_inner)[i] = pid;
    }

    /// Starts node `i` (which must not be running) and waits for its "listening" line.
    pub async fn start(&mut self, i: usize) -> Result<(), SoakError> {
        let spec = &self.specs[i];
        self.incarnations[i] += 1;
        // Each incarnation's log follows the previous one's in the same file.
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log)?;
        writeln!(
            log,
            "=== tessera soak: incarnation {} of node {} started at {:.1}s",
            self.incarnations[i],
            i + 1,
            self.start.elapsed().as_secs_f64()
        )?;
        let mut command = match &self.placement {
            Placement::Loopback { .. } => {
                let mut command = tokio::process::Command::new(&self.exe);
                netns::kill_with_parent(&mut command);
                command
            }
            Placement::Namespaces { names, .. } => netns::command_in(&names.netns(i), &self.exe),
        };
        command.arg("node").args(&self.args[i]);
        // Every setting comes from the flags above: none from the environment the soak runs
        // in (a TESSERA_STABLE_AFTER there would change what the soak exercises).
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("TESSERA_") {
                command.env_remove(name);
            }
        }
        // Plain text logs in the files (tracing's colours otherwise).
        command.env("NO_COLOR", "1");
        let process = demo::spawn_command(command, i + 1, spec.log.clone())
            .await
            .map_err(|e| SoakError::Node {
                node: i + 1,
                reason: e.to_string(),
            })?;
        if process.http != spec.http {
            return Err(SoakError::Node {
                node: i + 1,
                reason: format!("listens on {} instead of {}", process.http, spec.http),
            });
        }
        self.set_pid(i, process.child.id());
        self.processes[i] = Some(process);
        Ok(())
    }

    /// Whether node `i` has a process (running or paused).
    pub fn has_process(&self, i: usize) -> bool {
        self.processes[i].is_some()
    }

    fn signal(&self, i: usize, signal: libc::c_int) -> bool {
        let Some(pid) = self.processes[i]
            .as_ref()
            .and_then(|p| p.child.id())
            .and_then(|p| i32::try_from(p).ok())
        else {
            return false;
        };
        // SAFETY: kill(2) with the pid of a child we have not reaped and a valid signal has
        // no memory effects.
        unsafe { libc::kill(pid, signal) == 0 }
    }

    /// SIGSTOP: the process stops answering anything, its sockets stay open.
    pub fn pause(&self, i: usize) -> bool {
        self.signal(i, libc::SIGSTOP)
    }

    pub fn resume(&self, i: usize) -> bool {
        self.signal(i, libc::SIGCONT)
    }

    /// SIGTERM: the node hands its shards off, leaves the cluster and exits.
    pub fn terminate(&self, i: usize) -> bool {
        self.signal(i, libc::SIGTERM)
    }

    /// SIGKILL, and waits for the process to be gone; its exit status.
    pub async fn kill(&mut self, i: usize) -> Option<ExitStatus> {
        let mut process = self.processes[i].take()?;
        self.set_pid(i, None);
        let _ = process.child.start_kill();
        tokio::time::timeout(KILL_WAIT, process.child.wait())
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// The exit status of node `i`'s process if it exited (the process is then forgotten).
    pub fn poll_exit(&mut self, i: usize) -> Option<ExitStatus> {
        let process = self.processes[i].as_mut()?;
        match process.child.try_wait() {
            Ok(Some(status)) => {
                self.processes[i] = None;
                self.set_pid(i, None);
                Some(status)
            }
            Ok(None) => None,
            // Reaped elsewhere: gone, status unknown.
            Err(_) => {
                self.processes[i] = None;
                self.set_pid(i, None);
                None
            }
        }
    }

    /// Kills every node (SIGCONT first, so that a paused one dies at once).
    pub async fn kill_all(&mut self) {
        for i in 0..self.len() {
            self.resume(i);
            self.kill(i).await;
        }
    }
}
