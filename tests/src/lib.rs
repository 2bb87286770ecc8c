//! Shared helpers for the component tests in `tests/tests/`: the real component loaded by the
//! host with a [`MockCluster`], the expected call traces, the invariants every test checks
//! (no range on two nodes, nothing leaked) and a capture of the component's log lines.

use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use ipnet::IpNet;
use nodeipam_host::backend::{CloudAlias as _, KubeApi as _};
use nodeipam_host::mock::{Call, MockCluster};
use nodeipam_host::{
    ClusterCidr, Config, Error, Node, Plugin, PluginBuilder, Stats, SyncError, SyncMode,
};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};

/// Longest message any error or event may carry, however long its inputs (values are quoted
/// cut to 64 bytes by the component).
pub const MAX_MESSAGE: usize = 512;

/// The component `make component` builds: `target/nodeipam.wasm`, or `NODEIPAM_COMPONENT`.
pub fn component_path() -> PathBuf {
    std::env::var_os("NODEIPAM_COMPONENT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/nodeipam.wasm"),
        PathBuf::from,
    )
}

/// The component's bytes, read once per test binary.
pub fn component() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let path = component_path();
        std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "cannot read {}: {e} (run `make component` first)",
                path.display()
            )
        })
    })
}

/// Precompiled components shared by every test binary (keyed by the component's hash, so a
/// rebuilt component never meets a stale entry).
fn cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/nodeipam-test-cache")
}

/// The real component wired to `cluster`, default limits.
pub fn load(cluster: MockCluster) -> Plugin<MockCluster> {
    PluginBuilder::new()
        .cache_dir(cache_dir())
        .load_bytes(component(), cluster)
        .expect("the component loads")
}

/// The real component wired to `cluster`, initialised with `config` at `now_ms`, with the
/// call trace of `init` cleared.
#[track_caller]
pub fn start(cluster: MockCluster, config: &Config, now_ms: u64) -> Plugin<MockCluster> {
    let mut plugin = load(cluster);
    plugin
        .init(config, now_ms)
        .unwrap_or_else(|e| panic!("init failed: {e}"));
    plugin.backends_mut().take_calls();
    plugin
}

/// Drop the instance and start a fresh one from the mock's state (as a restarted host would),
/// initialised at `now_ms`; its trace starts empty.
#[track_caller]
pub fn restart(plugin: Plugin<MockCluster>, config: &Config, now_ms: u64) -> Plugin<MockCluster> {
    let mut cluster = plugin.into_backends();
    cluster.clear_failures();
    cluster.take_calls();
    start(cluster, config, now_ms)
}

/// `mode` over `10.0.0.0/16`, a /24 per node (256 ranges), default intervals.
pub fn config(mode: SyncMode) -> Config {
    Config::new(mode, vec![ClusterCidr::new("10.0.0.0/16", 24)])
}

/// `sync-from-cluster` over `10.0.0.0/16` by /24.
pub fn cluster_config() -> Config {
    config(SyncMode::SyncFromCluster)
}

/// `sync-from-cloud` over `10.0.0.0/16` by /24.
pub fn cloud_config() -> Config {
    config(SyncMode::SyncFromCloud)
}

/// `mode` over `10.0.0.0/16` by /24 and `fd00::/48` by /64, in that order.
pub fn dual_stack_config(mode: SyncMode) -> Config {
    Config::new(
        mode,
        vec![
            ClusterCidr::new("10.0.0.0/16", 24),
            ClusterCidr::new("fd00::/48", 64),
        ],
    )
}

/// Owned strings.
pub fn cidrs(list: &[&str]) -> Vec<String> {
    list.iter().map(|c| (*c).to_owned()).collect()
}

/// The node as the mock cluster has it now.
#[track_caller]
pub fn node(plugin: &Plugin<MockCluster>, name: &str) -> Node {
    plugin
        .backends()
        .node(name)
        .unwrap_or_else(|| panic!("the cluster has no node {name:?}"))
        .clone()
}

/// The component's error from a failed export: a `sync-error` value, never a trap.
#[track_caller]
pub fn sync_error(result: Result<(), Error>) -> SyncError {
    match result {
        Ok(()) => panic!("expected a sync error, the call succeeded"),
        Err(Error::Sync(e)) => e,
        Err(other) => panic!(
            "expected a sync error, got {other} (trap: {})",
            other.is_trap()
        ),
    }
}

/// The message of a `sync-error` that carries one (`not-initialized` carries none).
pub fn message(error: &SyncError) -> Option<&str> {
    match error {
        SyncError::InvalidConfig(m)
        | SyncError::InvalidCidr(m)
        | SyncError::OutOfRange(m)
        | SyncError::Exhausted(m)
        | SyncError::InvalidMode(m) => Some(m),
        SyncError::Host(_) | SyncError::NotInitialized => None,
    }
}

/// Assert a message names every one of `needles` and stays short.
#[track_caller]
pub fn assert_names(message: &str, needles: &[&str]) {
    for needle in needles {
        assert!(
            message.contains(needle),
            "message does not name {needle:?}: {message:?}"
        );
    }
    assert!(
        message.len() <= MAX_MESSAGE,
        "message of {} bytes (limit {MAX_MESSAGE}): {:?}...",
        message.len(),
        message.chars().take(MAX_MESSAGE).collect::<String>()
    );
}

/// The calls made since the last look, clearing the trace.
pub fn take_calls(plugin: &mut Plugin<MockCluster>) -> Vec<Call> {
    plugin.backends_mut().take_calls()
}

/// Assert the calls made since the last look are exactly `expected`, in order; clears the trace.
#[track_caller]
pub fn assert_calls(plugin: &mut Plugin<MockCluster>, expected: &[Call]) {
    let calls = take_calls(plugin);
    assert_eq!(
        calls,
        expected,
        "\n  got calls:\n    {}\n  expected:\n    {}",
        list(&calls),
        list(expected)
    );
}

fn list(calls: &[impl Debug]) -> String {
    if calls.is_empty() {
        return "(none)".to_owned();
    }
    calls
        .iter()
        .map(|c| format!("{c:?}"))
        .collect::<Vec<_>>()
        .join("\n    ")
}

/// Calls as the mock records them, for expected traces.
pub mod call {
    use nodeipam_host::mock::Call;

    use super::cidrs;

    /// `get-node(name)`.
    pub fn get_node(name: &str) -> Call {
        Call::GetNode { name: name.into() }
    }

    /// `list_nodes()` (the host, before `init`).
    pub fn list_nodes() -> Call {
        Call::ListNodes
    }

    /// `alias(node)`.
    pub fn alias(name: &str) -> Call {
        Call::Alias { name: name.into() }
    }

    /// `add-alias(node, ranges)`.
    pub fn add_alias(name: &str, ranges: &[&str]) -> Call {
        Call::AddAlias {
            name: name.into(),
            cidrs: cidrs(ranges),
        }
    }

    /// `update-node-pod-cidrs(node, ranges)`.
    pub fn set_pod_cidrs(name: &str, ranges: &[&str]) -> Call {
        Call::UpdateNodePodCidrs {
            name: name.into(),
            cidrs: cidrs(ranges),
        }
    }

    /// `update-node-network-unavailable(name, false)`.
    pub fn network_available(name: &str) -> Call {
        Call::UpdateNodeNetworkUnavailable {
            name: name.into(),
            unavailable: false,
        }
    }

    /// `emit-node-warning(name, reason, message)`.
    pub fn warning(name: &str, reason: &str, message: &str) -> Call {
        Call::EmitNodeWarning {
            name: name.into(),
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// Replay a write the component made (and that failed) on the mock, as if the backend had
/// applied it before failing: the mock cannot apply-then-fail by itself. Returns the trace
/// up to the replay and leaves it empty (the replay is not a call the component made).
/// Panics on a call that is not a write.
#[track_caller]
pub fn apply(cluster: &mut MockCluster, call: &Call) -> Vec<Call> {
    let before = cluster.take_calls();
    let result = match call {
        Call::AddAlias { name, cidrs } => cluster.add_alias(&Node::new(name.as_str(), &[]), cidrs),
        Call::UpdateNodePodCidrs { name, cidrs } => {
            cluster.update_node_pod_cidrs(&Node::new(name.as_str(), &[]), cidrs)
        }
        Call::UpdateNodeNetworkUnavailable { name, unavailable } => {
            cluster.update_node_network_unavailable(name, *unavailable)
        }
        other => panic!("not a write: {other:?}"),
    };
    result.unwrap_or_else(|e| panic!("replaying {call:?}: {e}"));
    cluster.take_calls();
    before
}

/// Parse a range the mock holds (every range a node or alias holds must parse).
#[track_caller]
pub fn net(text: &str) -> IpNet {
    text.parse()
        .unwrap_or_else(|e| panic!("{text:?} is not a cidr: {e}"))
}

/// Two ranges share an address.
pub fn overlap(a: IpNet, b: IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// No address is in the pod ranges of two nodes, nor in the aliases of two VMs.
#[track_caller]
pub fn assert_disjoint(cluster: &MockCluster) {
    let names: Vec<String> = cluster.nodes().map(|n| n.name.clone()).collect();
    let pods: Vec<(&str, IpNet)> = names
        .iter()
        .flat_map(|n| {
            cluster
                .pod_cidrs(n)
                .iter()
                .map(move |c| (n.as_str(), net(c)))
        })
        .collect();
    let aliases: Vec<(&str, IpNet)> = names
        .iter()
        .flat_map(|n| {
            cluster
                .alias_of(n)
                .iter()
                .map(move |c| (n.as_str(), net(c)))
        })
        .collect();
    for (what, ranges) in [("pod ranges", &pods), ("aliases", &aliases)] {
        for (i, (a, ra)) in ranges.iter().enumerate() {
            for (b, rb) in &ranges[i + 1..] {
                assert!(
                    a == b || !overlap(*ra, *rb),
                    "{what} overlap: node {a} has {ra}, node {b} has {rb}"
                );
            }
        }
    }
}

/// The node's range and its alias are the same set, and its network is marked available.
#[track_caller]
pub fn assert_in_sync(cluster: &MockCluster, name: &str) {
    let mut pods = cluster.pod_cidrs(name).to_vec();
    let mut alias = cluster.alias_of(name).to_vec();
    assert!(
        !pods.is_empty(),
        "node {name} has no range (alias {alias:?})"
    );
    pods.sort();
    alias.sort();
    assert_eq!(pods, alias, "node {name}: range and alias differ");
    assert_eq!(
        cluster.network_unavailable(name),
        Some(false),
        "node {name}: network not marked available"
    );
}

/// Node ranges in use, over every cluster CIDR.
pub fn used(stats: &Stats) -> u32 {
    stats.sets.iter().map(|s| s.used).sum()
}

/// Every node is in sync, no two share a range, and the allocator holds exactly the nodes'
/// ranges (node-sized ranges only): nothing leaked, nothing missing.
#[track_caller]
pub fn assert_converged(plugin: &mut Plugin<MockCluster>) {
    let cluster = plugin.backends();
    let names: Vec<String> = cluster.nodes().map(|n| n.name.clone()).collect();
    for name in &names {
        assert_in_sync(cluster, name);
    }
    assert_disjoint(cluster);
    let on_nodes: usize = names.iter().map(|n| cluster.pod_cidrs(n).len()).sum();
    let stats = plugin.stats().expect("stats");
    assert_eq!(
        usize::try_from(used(&stats)).unwrap(),
        on_nodes,
        "ranges in use vs ranges on nodes: {stats:?}"
    );
    assert_eq!(
        usize::try_from(stats.nodes).unwrap(),
        names.len(),
        "{stats:?}"
    );
    assert_eq!(plugin.recoveries(), 0, "no trap");
}

/// One log line of the component (target `nodeipam::guest`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    /// Its level.
    pub level: tracing::Level,
    /// The message.
    pub message: String,
    /// Its key/value fields, as `key=value key=value`.
    pub fields: String,
}

/// Run `f` and return what it returned with the component's log lines (those on this thread:
/// export calls run on the caller's thread).
pub fn capture_logs<R>(f: impl FnOnce() -> R) -> (R, Vec<LogLine>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Capture(Arc::clone(&lines)));
    let result = tracing::subscriber::with_default(subscriber, f);
    let lines = std::mem::take(&mut *lines.lock().expect("log capture"));
    (result, lines)
}

struct Capture(Arc<Mutex<Vec<LogLine>>>);

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() != "nodeipam::guest" {
            return;
        }
        let mut visitor = LineVisitor::default();
        event.record(&mut visitor);
        self.0.lock().expect("log capture").push(LogLine {
            level: *event.metadata().level(),
            message: visitor.message,
            fields: visitor.fields,
        });
    }
}

#[derive(Default)]
struct LineVisitor {
    message: String,
    fields: String,
}

impl Visit for LineVisitor {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "fields" => self.fields = format!("{value:?}"),
            _ => {}
        }
    }
}
