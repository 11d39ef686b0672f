//! Real network partitions between local processes, for the partition test and `tessera
//! soak`: each node runs in a network namespace of its own, and links between namespaces are
//! cut and healed by the kernel, so nodes see real lost packets and stalled TCP connections.
//! Not part of the library API (hidden from its documentation; public because the
//! integration tests are other crates). Needs root and the `ip` and `tc` tools (iproute2).
//!
//! The network: one bridge in the root namespace with the address `A.B.X.1` (so the process
//! that created it reaches every node), one veth pair per node, its host end on the bridge and
//! its other end moved into the node's namespace with the address `A.B.X.(11 + i)`. Nodes bind
//! that address (the same ports in every namespace).
//!
//! The cut: this kernel lacks netem, the `drop` action and iptables, so the drop rules use
//! what it has. tc only shapes egress, so they go on the namespace end of each veth, where a
//! node's own packets leave it: an `htb` root qdisc (default class 1:10 passes) whose class
//! 1:20 has a `blackhole` qdisc, and a u32 filter (`match ip dst B/32 flowid 1:20`) per node
//! the packets must not reach. Packets to and from the bridge address (the controlling
//! process) are untouched, so both sides can still be observed. Deleting the root qdiscs
//! heals.
//!
//! Every namespace and link is named `<prefix><pid>...` after the creating process, so that
//! [`remove_stale`] can remove what a killed earlier run left behind without touching a live
//! run's (or another tool's, with another prefix).

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A command of the network set-up failed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("{command}: {reason}")]
    Command { command: String, reason: String },
    #[error("no free {net}.X.0/24 subnet for the bridge")]
    NoFreeSubnet { net: String },
    #[error("partition groups {groups:?} must hold every node 0..{nodes} exactly once")]
    BadGroups {
        groups: Vec<Vec<usize>>,
        nodes: usize,
    },
}

/// Runs `program args`; its stdout, or an error with its stderr (or why it did not run).
pub fn run(program: &str, args: &[&str]) -> Result<String, NetnsError> {
    let command = || format!("{program} {}", args.join(" "));
    let output = std::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| NetnsError::Command {
            command: command(),
            reason: e.to_string(),
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(NetnsError::Command {
            command: command(),
            reason: format!(
                "exited with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        })
    }
}

/// Why namespaces cannot be used here, if they cannot: not root, no `ip` or `tc`, or root
/// without the capabilities (in a container). Probes by creating and deleting a namespace
/// named after `prefix`.
pub fn unavailable_reason(prefix: &str) -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid != 0 {
        return Some(format!(
            "network namespaces need root (running as uid {uid})"
        ));
    }
    if let Err(e) = run("ip", &["netns", "list"]) {
        return Some(format!("`ip netns` is unavailable: {e}"));
    }
    if let Err(e) = run("tc", &["-V"]) {
        return Some(format!("`tc` is unavailable: {e}"));
    }
    let probe = format!("{prefix}{}-probe", std::process::id());
    if let Err(e) = run("ip", &["netns", "add", &probe]) {
        return Some(format!("cannot create a network namespace: {e}"));
    }
    let _ = run("ip", &["netns", "del", &probe]);
    None
}

/// Whether a process with this pid exists.
fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The pid in a name `<prefix><pid>...`.
fn owner(prefix: &str, name: &str) -> Option<u32> {
    let digits: String = name
        .strip_prefix(prefix)?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

fn netns_names() -> Vec<String> {
    run("ip", &["netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The root namespace's links, without the `@peer` suffix.
fn link_names() -> Vec<String> {
    run("ip", &["-o", "link", "show"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_string())
        .collect()
}

/// Removes the namespaces and links named `<prefix><pid>...` whose process is gone (a run
/// killed before it could clean up); returns their names.
pub fn remove_stale(prefix: &str) -> Vec<String> {
    let stale = |name: &String| owner(prefix, name).is_some_and(|pid| !alive(pid));
    let mut removed = Vec::new();
    for ns in netns_names().into_iter().filter(stale) {
        let _ = run("ip", &["netns", "del", &ns]);
        removed.push(ns);
    }
    for link in link_names().into_iter().filter(stale) {
        let _ = run("ip", &["link", "del", &link]);
        removed.push(link);
    }
    removed
}

/// The names and addresses of one run's namespaces and links.
#[derive(Clone, Debug)]
pub struct Names {
    prefix: String,
    pid: u32,
    /// The first two octets of every address.
    net: [u8; 2],
    /// The third octet: the run's /24.
    subnet: u8,
}

impl Names {
    pub fn bridge(&self) -> String {
        format!("{}{}br", self.prefix, self.pid)
    }

    pub fn netns(&self, i: usize) -> String {
        format!("{}{}-n{i}", self.prefix, self.pid)
    }

    /// The veth end on the bridge, in the root namespace.
    pub fn host_veth(&self, i: usize) -> String {
        format!("{}{}h{i}", self.prefix, self.pid)
    }

    /// The veth end in node `i`'s namespace.
    pub fn node_veth(&self, i: usize) -> String {
        format!("{}{}n{i}", self.prefix, self.pid)
    }

    pub fn bridge_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(self.net[0], self.net[1], self.subnet, 1)
    }

    /// Node `i`'s address (nodes 0 to 243).
    pub fn ip(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(self.net[0], self.net[1], self.subnet, 11 + i as u8)
    }

    /// The run's subnet, e.g. `10.231.17.0/24`.
    pub fn subnet(&self) -> String {
        format!("{}.{}.{}.0/24", self.net[0], self.net[1], self.subnet)
    }

    /// Runs `args` inside node `i`'s namespace.
    fn in_netns(&self, i: usize, args: &[&str]) -> Result<String, NetnsError> {
        let ns = self.netns(i);
        let mut all = vec!["netns", "exec", &ns];
        all.extend_from_slice(args);
        run("ip", &all)
    }
}

/// The namespaces, veths and bridge of one run; dropping it deletes them (the processes in
/// the namespaces are the creator's to stop first).
pub struct Network {
    names: Names,
    nodes: usize,
    /// The nodes whose veth has a root qdisc (a cut) now.
    shaped: BTreeSet<usize>,
    torn_down: bool,
}

impl Network {
    /// A bridge on a free `net.X.0/24` (X chosen from the pid) and a namespace joined to it
    /// for each of `nodes` nodes. A failure half-way removes what was made.
    pub fn create(prefix: &str, net: [u8; 2], nodes: usize) -> Result<Network, NetnsError> {
        let pid = std::process::id();
        let used = run("ip", &["-o", "-4", "addr", "show"]).unwrap_or_default()
            + &run("ip", &["-4", "route", "show", "table", "all"]).unwrap_or_default();
        let net_text = format!("{}.{}", net[0], net[1]);
        let subnet = (0..254u32)
            .map(|k| ((pid + k) % 254 + 1) as u8)
            .find(|x| !used.contains(&format!("{net_text}.{x}.")))
            .ok_or(NetnsError::NoFreeSubnet { net: net_text })?;
        let network = Network {
            names: Names {
                prefix: prefix.to_string(),
                pid,
                net,
                subnet,
            },
            nodes,
            shaped: BTreeSet::new(),
            torn_down: false,
        };
        let l = &network.names;
        let bridge = l.bridge();
        run("ip", &["link", "add", &bridge, "type", "bridge"])?;
        let bridge_address = format!("{}/24", l.bridge_ip());
        run("ip", &["addr", "add", &bridge_address, "dev", &bridge])?;
        run("ip", &["link", "set", &bridge, "up"])?;
        for i in 0..nodes {
            let (ns, host, node) = (l.netns(i), l.host_veth(i), l.node_veth(i));
            run("ip", &["netns", "add", &ns])?;
            run(
                "ip",
                &["link", "add", &host, "type", "veth", "peer", "name", &node],
            )?;
            run("ip", &["link", "set", &node, "netns", &ns])?;
            run("ip", &["link", "set", &host, "master", &bridge])?;
            run("ip", &["link", "set", &host, "up"])?;
            let address = format!("{}/24", l.ip(i));
            run("ip", &["-n", &ns, "addr", "add", &address, "dev", &node])?;
            run("ip", &["-n", &ns, "link", "set", &node, "up"])?;
            // A node's own address is routed through lo.
            run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(network)
    }

    pub fn names(&self) -> &Names {
        &self.names
    }

    /// Drops every packet node `from` sends to the nodes `to`: an htb root qdisc on the
    /// namespace end of its veth (egress, that is: what leaves the node), whose default class
    /// 1:10 passes and whose class 1:20, where u32 filters send packets to `to`, is a
    /// blackhole.
    fn drop_egress(&mut self, from: usize, to: &[usize]) -> Result<(), NetnsError> {
        let l = &self.names;
        let dev = l.node_veth(from);
        let dev = dev.as_str();
        l.in_netns(
            from,
            &[
                "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10",
            ],
        )?;
        self.shaped.insert(from);
        for class in ["1:10", "1:20"] {
            l.in_netns(
                from,
                &[
                    "tc", "class", "add", "dev", dev, "parent", "1:", "classid", class, "htb",
                    "rate", "10gbit", "quantum", "60000",
                ],
            )?;
        }
        l.in_netns(
            from,
            &[
                "tc",
                "qdisc",
                "add",
                "dev",
                dev,
                "parent",
                "1:20",
                "handle",
                "20:",
                "blackhole",
            ],
        )?;
        for &target in to {
            let dst = format!("{}/32", l.ip(target));
            l.in_netns(
                from,
                &[
                    "tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio",
                    "1", "u32", "match", "ip", "dst", &dst, "flowid", "1:20",
                ],
            )?;
        }
        Ok(())
    }

    /// Splits the nodes into `groups` (every node in exactly one): no packet passes between
    /// groups, in either direction. Heals an earlier partition first.
    pub fn partition(&mut self, groups: &[Vec<usize>]) -> Result<(), NetnsError> {
        let mut seen: Vec<usize> = groups.iter().flatten().copied().collect();
        seen.sort_unstable();
        if seen != (0..self.nodes).collect::<Vec<_>>() {
            return Err(NetnsError::BadGroups {
                groups: groups.to_vec(),
                nodes: self.nodes,
            });
        }
        self.heal()?;
        for group in groups {
            let others: Vec<usize> = (0..self.nodes).filter(|n| !group.contains(n)).collect();
            if others.is_empty() {
                continue;
            }
            for &from in group {
                self.drop_egress(from, &others)?;
            }
        }
        Ok(())
    }

    /// Cuts node `a` from every other node, in both directions.
    pub fn cut(&mut self, a: usize) -> Result<(), NetnsError> {
        let others: Vec<usize> = (0..self.nodes).filter(|&b| b != a).collect();
        self.partition(&[vec![a], others])
    }

    /// Undoes a partition: deletes the root qdiscs it put on the nodes' veths.
    pub fn heal(&mut self) -> Result<(), NetnsError> {
        while let Some(&i) = self.shaped.iter().next() {
            let dev = self.names.node_veth(i);
            self.names
                .in_netns(i, &["tc", "qdisc", "del", "dev", &dev, "root"])?;
            self.shaped.remove(&i);
        }
        Ok(())
    }

    /// Deletes the namespaces and links, and returns what is still there afterwards
    /// (nothing, normally). Stop the processes in the namespaces first.
    pub fn teardown(&mut self) -> Vec<String> {
        self.torn_down = true;
        let l = &self.names;
        for i in 0..self.nodes {
            let _ = run("ip", &["netns", "del", &l.netns(i)]);
            // Deleting the namespace destroys its veth end, and with it the pair; this covers
            // a pair whose end never moved there.
            let _ = run("ip", &["link", "del", &l.host_veth(i)]);
        }
        let _ = run("ip", &["link", "del", &l.bridge()]);
        // A namespace's devices go away asynchronously.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let remaining: Vec<String> = netns_names()
                .into_iter()
                .chain(link_names())
                .filter(|n| owner(&l.prefix, n) == Some(l.pid))
                .collect();
            if remaining.is_empty() || Instant::now() > deadline {
                return remaining;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        if !self.torn_down {
            let left = self.teardown();
            if !left.is_empty() {
                eprintln!("network namespaces: cleanup left {left:?}");
            }
        }
    }
}

/// `ip netns exec NS program`: `ip` execs the program, so the child is the program itself.
/// The child gets SIGKILL should the thread that spawns it die (PR_SET_PDEATHSIG), so spawn
/// it from a thread that lives as long as it should (not one of tokio's blocking pool).
pub fn command_in(ns: &str, program: &Path) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("ip");
    command.args(["netns", "exec", ns]).arg(program);
    kill_with_parent(&mut command);
    command
}

/// Makes the child of `command` get SIGKILL when the thread that spawned it dies
/// (PR_SET_PDEATHSIG), so that a killed controlling process leaves no node behind.
pub fn kill_with_parent(command: &mut tokio::process::Command) {
    // SAFETY: prctl(2) is async-signal-safe; the closure allocates nothing.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Whether a TCP connection from inside namespace `ns` to `to` opens within `timeout`. The
/// probe runs on a thread of its own, which enters the namespace and then ends.
pub async fn connects(ns: String, to: SocketAddr, timeout: Duration) -> bool {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let opened = std::fs::File::open(format!("/run/netns/{ns}")).is_ok_and(|file| {
            // SAFETY: setns(2) with a namespace fd we hold; it changes this thread only.
            let entered = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            entered == 0 && std::net::TcpStream::connect_timeout(&to, timeout).is_ok()
        });
        let _ = tx.send(opened);
    });
    rx.await.unwrap_or(false)
}
