//! The project's process harness, for its demo, soak and multi-process tests: `tessera node`
//! processes spawned and watched over their HTTP API ([`demo`]'s `NodeProcess`), network
//! namespaces to put them on hosts of their own and partition them ([`netns`]), a PostgreSQL server of a test's own ([`postgres`]), and requests
//! to their management API ([`http_client`]). Not an API of the product.

pub mod demo;
pub mod http_client;
pub mod netns;
pub mod postgres;
