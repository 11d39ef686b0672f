//! tessera-cluster: the membership layer every other tessera capability stands on.
//!
//! Protocol logic ([`gossip`], [`membership`], [`failure_detector`], [`heartbeat`], [`sbr`]) is
//! written as plain state machines with time passed in; [`transport`] and [`node`] are the thin
//! tokio layer that owns sockets and timers and drives them.

pub mod address;
pub mod bootstrap;
pub mod codec;
pub mod core;
pub mod events;
pub mod failure_detector;
pub mod gossip;
pub mod heartbeat;
pub mod member;
pub mod membership;
pub mod node;
pub mod reachability;
pub mod sbr;
pub mod sim;
pub mod singleton;
pub mod transport;
pub mod vclock;

pub use address::{Address, AddressParseError, UniqueAddress};
pub use member::{Member, MemberStatus};
