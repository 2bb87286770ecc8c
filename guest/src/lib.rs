//! nodeipam's core: the CIDR allocator and the per-node sync state machine of Kubernetes'
//! node IPAM controller, as plain Rust with no I/O and no clock. On wasm32 the `component`
//! module binds it to the WIT world `nodeipam`; natively the same core is tested and
//! benchmarked directly.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

pub mod cidr;
pub mod cidrset;
pub mod host;
mod mem;
pub mod sync;
pub mod types;
pub mod workload;

#[cfg(all(target_arch = "wasm32", feature = "bench"))]
mod bench_component;
#[cfg(all(target_arch = "wasm32", not(feature = "bench")))]
mod component;
#[cfg(target_arch = "wasm32")]
mod wasm_runtime;

pub use host::{CloudAlias, Events, Host, KubeApi};
pub use sync::Controller;
pub use types::{
    ClusterCidr, Config, HostError, Level, Node, Stats, SyncError, SyncMode, TickReport, Usage,
};
