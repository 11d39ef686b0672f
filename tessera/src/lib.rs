//! tessera root package: node configuration, command line, HTTP management API and logging
//! setup. The node wiring plugs the cluster into these; nothing here knows how membership works.

pub mod bench;
pub mod bootstrap;
pub mod cli;
pub mod client;
pub mod config;
pub mod dashboard;
pub mod demo;
pub mod entities;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
#[doc(hidden)]
pub mod http_client;
pub mod logging;
#[doc(hidden)]
pub mod netns;
pub mod node;
pub mod sharding_tool;
pub mod soak;
