//! Cluster singleton: one instance of a service in the whole cluster, on the oldest member.
//!
//! - [`manager::SingletonManager`] is the protocol: a pure state machine per node and name
//!   deciding when this node may start the instance and running the hand-over with the other
//!   nodes' managers (Akka's ClusterSingletonManager).
//! - [`driver`] is the tokio layer: [`driver::Singletons`] owns the transport's
//!   [`services::SINGLETON`](crate::transport::services::SINGLETON) queue for every singleton
//!   of the node, [`driver::ClusterSingleton`] runs one manager and its instance.
//! - [`proxy::SingletonProxy`] sends requests to wherever the instance runs, buffering
//!   (bounded) while there is none.
//! - [`message`] is the wire format, [`settings`] the settings.

pub mod driver;
pub mod manager;
pub mod message;
pub mod proxy;
pub mod requests;
pub mod settings;

pub use driver::{ClusterSingleton, InstanceContext, SingletonError, SingletonStatus, Singletons};
pub use manager::{InstancePhase, MembershipView, SingletonEffect, SingletonManager};
pub use message::{HandOver, HandOverKind};
pub use proxy::{ProxyError, SingletonProxy};
pub use requests::{SINGLETON_LANE, SingletonRequest, SingletonRequests, SingletonResponder};
pub use settings::{SingletonSettings, SingletonSettingsError};
