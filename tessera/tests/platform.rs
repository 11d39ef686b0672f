//! The platform a service builds on, over real nodes in one process on loopback: sharded
//! daemon processes and projections.

#[path = "platform/cluster.rs"]
mod cluster;
#[path = "platform/daemon.rs"]
mod daemon;
#[path = "platform/projection.rs"]
mod projection;
