//! Plain-Rust mirrors of the WIT types: what the core takes and returns. The component
//! adapter converts between these and the generated bindings; nothing here knows about wasm.

use alloc::string::String;
use alloc::vec::Vec;

/// A Kubernetes node, as far as pod ranges are concerned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Node {
    /// `metadata.name`.
    pub name: String,
    /// `spec.providerID`, when set.
    pub provider_id: Option<String>,
    /// `spec.podCIDRs`: empty when the node has no range.
    pub pod_cidrs: Vec<String>,
}

/// Which side allocates ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// The cloud allocates; nodes get their cloud alias.
    SyncFromCloud,
    /// The plugin allocates and pushes ranges to the cloud.
    SyncFromCluster,
}

/// One cluster CIDR and the prefix length of the node ranges carved from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterCidr {
    /// The cluster range, as text.
    pub cidr: String,
    /// Prefix length of each node range.
    pub node_mask_size: u8,
}

/// The configuration `init` takes. A zero interval means its default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Who allocates.
    pub mode: SyncMode,
    /// One cluster CIDR, or two of different families (dual-stack).
    pub cluster_cidrs: Vec<ClusterCidr>,
    /// Delay before a node is re-checked after a success.
    pub resync_ms: u64,
    /// First retry delay after a failure.
    pub initial_retry_ms: u64,
    /// Upper bound of the retry delay.
    pub max_backoff_ms: u64,
}

/// Log levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Detail for debugging.
    Debug,
    /// Normal operation.
    Info,
    /// Something a person may want to look at.
    Warn,
    /// Something failed.
    Error,
}

/// Why a host call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// The object does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The write lost a race.
    #[error("conflict: {0}")]
    Conflict(String),
    /// No answer: a write may or may not have taken effect.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Any other failure: a write did not take effect.
    #[error("{0}")]
    Other(String),
}

/// Why an export failed. Messages name the node and the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SyncError {
    /// The configuration is not usable.
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    /// A range does not parse, or has the wrong family or size.
    #[error("invalid cidr: {0}")]
    InvalidCidr(String),
    /// A range lies outside the cluster CIDRs.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// No free range left.
    #[error("exhausted: {0}")]
    Exhausted(String),
    /// The action is not allowed in the configured mode.
    #[error("invalid mode: {0}")]
    InvalidMode(String),
    /// A host call failed.
    #[error("host call failed: {0}")]
    Host(HostError),
    /// `init` has not succeeded yet.
    #[error("not initialized: call init first")]
    NotInitialized,
}

/// How full one cluster CIDR is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usage {
    /// The cluster CIDR.
    pub cidr: String,
    /// Prefix length of its node ranges.
    pub node_mask_size: u8,
    /// Node ranges it holds.
    pub max: u32,
    /// Node ranges in use.
    pub used: u32,
}

/// The allocator's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Nodes known.
    pub nodes: u32,
    /// One entry per cluster CIDR, in config order.
    pub sets: Vec<Usage>,
    /// Node ranges marked used, by allocation or by occupying an existing range (Kubernetes'
    /// `cidrset_cidrs_allocations_total`).
    pub allocations: u64,
    /// Ranges released.
    pub releases: u64,
    /// Occupied candidates skipped by all allocations (the sum of Kubernetes'
    /// `cidrset_allocation_tries_per_request`).
    pub allocation_tries: u64,
}

/// What one `tick` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Resyncs that succeeded.
    pub resynced: u32,
    /// Resyncs that failed.
    pub failed: u32,
    /// When the earliest remaining resync is due.
    pub next_due_ms: Option<u64>,
}
