//! The nodeipam host: loads the nodeipam component into wasmtime, sandboxes it and wires it
//! to native backends.
//!
//! - [`backend`]: the narrow traits the component's imports call ([`KubeApi`],
//!   [`CloudAlias`], [`Events`]) and the native [`Node`].
//! - [`plugin`]: [`Plugin`], one sandboxed instance (memory cap, per-call deadline) that turns
//!   a trap into an [`Error`] and rebuilds itself from the cluster.
//! - [`driver`]: [`Driver`], the only user of a clock: feeds node events and due resyncs to
//!   a plugin; [`SystemClock`] for real time, [`ManualClock`] for tests.
//! - [`cache`]: precompiled components on disk, keyed by component and engine, verified
//!   before use.
//! - [`mock`]: in-memory backends with a call trace, scripted failures and strict checks.
//! - [`types`]: host-native configuration and reports mirroring the WIT types.
//! - [`bindings`] (generated) and `wiring` (its import implementations) stay behind the
//!   plugin's API.
//!
//! ```no_run
//! use nodeipam_host::{ClusterCidr, Config, Limits, Node, Plugin, SyncMode};
//! use nodeipam_host::mock::MockCluster;
//!
//! let cluster = MockCluster::new().with_node(Node::new("a", &[]));
//! let mut plugin = Plugin::from_file("target/nodeipam.wasm", Limits::default(), cluster)?;
//! let config = Config::new(SyncMode::SyncFromCluster, vec![ClusterCidr::new("10.0.0.0/8", 24)]);
//! plugin.init(&config, 0)?;
//! plugin.update(&Node::new("a", &[]), 0)?;
//! assert_eq!(plugin.backends().pod_cidrs("a").len(), 1);
//! # Ok::<(), nodeipam_host::Error>(())
//! ```

pub mod backend;
pub mod bindings;
pub mod cache;
pub mod config;
pub mod driver;
pub mod error;
pub mod import;
pub mod metrics;
pub mod mock;
pub mod plugin;
pub mod store;
#[cfg(test)]
mod testing;
pub mod types;
mod wiring;

pub use backend::{BackendError, Backends, CloudAlias, Events, KubeApi, Node};
pub use cache::{CacheOutcome, ComponentCache};
pub use driver::{Clock, Driver, ManualClock, NodeEvent, RunSummary, SystemClock};
pub use error::{Error, SyncError};
pub use plugin::{Limits, Plugin, PluginBuilder};
pub use types::{ClusterCidr, Config, Stats, SyncMode, TickReport, Usage};
