//! tessera root package: node configuration, command line, HTTP management API and logging
//! setup. The node wiring plugs the cluster into these; nothing here knows how membership works.

pub mod cli;
pub mod config;
pub mod http;
pub mod logging;
pub mod bench;
pub mod demo;
pub mod http_client;
pub mod node;
