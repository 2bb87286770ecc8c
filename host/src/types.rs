//! Host-native mirrors of the WIT types the plugin's API speaks: configuration, counters and
//! tick reports. The generated types stay in `bindings`; `wiring` converts.

/// Which side allocates ranges (WIT `sync-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SyncMode {
    /// The cloud allocates; the component copies each node's alias onto the node.
    SyncFromCloud,
    /// The component allocates and pushes each range to the cloud as an alias.
    #[default]
    SyncFromCluster,
}

/// One cluster CIDR and the size of the node ranges carved from it (WIT `cluster-cidr`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClusterCidr {
    /// The cluster range, e.g. `10.0.0.0/8` or `fd00::/48`.
    pub cidr: String,
    /// Prefix length of each node's range.
    pub node_mask_size: u8,
}

impl ClusterCidr {
    /// A cluster CIDR with its node mask size.
    pub fn new(cidr: impl Into<String>, node_mask_size: u8) -> Self {
        Self {
            cidr: cidr.into(),
            node_mask_size,
        }
    }
}

/// The configuration given to `init` (WIT `config`). A zero interval means its default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Config {
    /// Who allocates.
    pub mode: SyncMode,
    /// One cluster CIDR, or two of different IP families for dual-stack.
    pub cluster_cidrs: Vec<ClusterCidr>,
    /// Delay before a node is re-checked after a successful sync (0: 30000).
    pub resync_ms: u64,
    /// Delay before the first retry after a failed sync (0: 250).
    pub initial_retry_ms: u64,
    /// Upper bound of the retry delay (0: 10000).
    pub max_backoff_ms: u64,
}

impl Config {
    /// A configuration with default intervals.
    pub fn new(mode: SyncMode, cluster_cidrs: Vec<ClusterCidr>) -> Self {
        Self {
            mode,
            cluster_cidrs,
            ..Self::default()
        }
    }

    /// The same configuration with these intervals (0: default).
    pub fn with_intervals(
        mut self,
        resync_ms: u64,
        initial_retry_ms: u64,
        max_backoff_ms: u64,
    ) -> Self {
        self.resync_ms = resync_ms;
        self.initial_retry_ms = initial_retry_ms;
        self.max_backoff_ms = max_backoff_ms;
        self
    }
}

/// How full one cluster CIDR is (WIT `usage`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Usage {
    /// The cluster CIDR.
    pub cidr: String,
    /// Prefix length of its node ranges.
    pub node_mask_size: u8,
    /// How many node ranges it holds.
    pub max: u32,
    /// How many of them are in use.
    pub used: u32,
}

/// The allocator's counters (WIT `stats`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Stats {
    /// Nodes the component knows.
    pub nodes: u32,
    /// One entry per cluster CIDR, in config order.
    pub sets: Vec<Usage>,
    /// Node ranges handed out by allocation.
    pub allocations: u64,
    /// Node ranges released.
    pub releases: u64,
    /// Candidate ranges examined by all allocations together.
    pub allocation_tries: u64,
}

/// What one `tick` did (WIT `tick-report`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TickReport {
    /// Resyncs that succeeded.
    pub resynced: u32,
    /// Resyncs that failed (each is retried with backoff).
    pub failed: u32,
    /// When the earliest remaining resync is due; none when no node is known.
    pub next_due_ms: Option<u64>,
}
