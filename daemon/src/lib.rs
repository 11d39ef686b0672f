//! Sharded daemon processes (Akka's `ShardedDaemonProcess`): `count` instances, numbered
//! `0..count`, of a long-running task that a service gives by name, each kept running on
//! exactly one node of the cluster while the view is stable.
//!
//! The instances are the entities of a sharded type of their own (`daemon.<name>`), whose
//! entity ids are the instance numbers and whose shard ids are the same numbers
//! ([`ShardIds::Numbered`](tessera_coordinator::ShardIds)), so that allocation, which
//! balances shards over the nodes, balances the instances. Sharding gives the guarantees: an
//! instance starts where its shard is allocated, moves with a rebalance (stopped on the old
//! node before it starts on the new one) and is started elsewhere when its node is removed.
//! What starts an instance is a keep-alive: every node asks each of the `count` instances
//! every `keep_alive_interval` ([`keep_alive`]); an instance that ended (its task returned,
//! or panicked) is started again by the next one.
//!
//! The number of instances is kept in Distributed Data ([`count`]) and can change while the
//! cluster runs: each node's host restarts its instances with the new count, and stops those
//! whose number is no longer below it. Like Akka's, the change reaches nodes at different
//! times: for a moment an instance may run with the old count on one node while another
//! runs with the new one.
//!
//! Layout: [`context`] (what an instance's task is given), [`host`] (this node's instances,
//! as sharding's host of the type), [`count`] (the count in Distributed Data), [`keep_alive`]
//! (the pings), [`settings`].

pub mod context;
pub mod count;
pub mod host;
pub mod keep_alive;
pub mod settings;

pub use context::DaemonContext;
pub use count::{DaemonCount, SetCountError};
pub use host::{DaemonBehavior, DaemonCounters, DaemonHost, InstanceStatus, KeepAlive};
pub use keep_alive::KeepAlivePinger;
pub use settings::{DaemonSettings, InvalidDaemon};

/// The sharded type that runs daemon `name`'s instances.
pub fn type_name_of(name: &str) -> String {
    format!("daemon.{name}")
}
