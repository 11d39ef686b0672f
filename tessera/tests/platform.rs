//! The platform a service builds on, over real nodes in one process on loopback: sharded
//! daemon processes and projections, at-least-once and exactly-once into PostgreSQL.

#[path = "platform/cluster.rs"]
mod cluster;
#[path = "platform/daemon.rs"]
mod daemon;
#[path = "platform/operating.rs"]
mod operating;
#[path = "platform/projection.rs"]
mod projection;
#[path = "platform/projection_postgres.rs"]
mod projection_postgres;
