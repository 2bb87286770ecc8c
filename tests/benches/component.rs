//! Component benchmark against DESIGN.md's targets ("Targets"): the real components driven by
//! the host, each figure the median of several timed runs, next to its target and, where the
//! same work can run natively, next to the same core built natively (in this process, same run).
//!
//! - One node update of each kind through `Plugin::update` (one export, its host calls).
//! - `init` of 130,000 dual-stack nodes through `Plugin::init`, and `Controller::init` natively.
//! - Start-up from the precompiled cache, and instantiation alone.
//! - The allocator workloads through the benchmark component (`target/nodeipam-bench.wasm`)
//!   beside `nodeipam_guest::workload` natively.
//! - Node updates inside one call (the cluster and cloud inside the component too): allocating
//!   (held to 1.5x of native), and in sync, first sync and resync (for scale).
//!
//! Backend: [`Lean`], an in-memory cluster and cloud written here (a map and a call counter):
//! `MockCluster` records every call with its arguments and checks scripted failures and
//! expectations on each, which is part of what it is for but not part of an update's cost (the
//! `MockCluster` row shows how much it adds).
//!
//! `make bench-component component && cargo bench -p nodeipam-tests --bench component`
//! (`-- update init startup alloc inside`: only those sections; `$NODEIPAM_COMPONENT` and
//! `$NODEIPAM_BENCH_COMPONENT` override the two `.wasm` paths).

use std::collections::HashMap;
use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nodeipam_guest::{self as guest, workload};
use nodeipam_host::mock::MockCluster;
use nodeipam_host::{
    BackendError, CacheOutcome, CloudAlias, ClusterCidr, ComponentCache, Config, Events, KubeApi,
    Node, PluginBuilder, SyncMode,
};
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store};

wasmtime::component::bindgen!({
    path: "../guest/bench-wit",
    world: "bench",
});

use exports::nodeipam::bench::workload::Kind;

/// Timed runs per figure; the median is reported.
const RUNS: usize = 11;
/// Timed runs of the 130,000-node `init` (each on a fresh instance).
const INIT_RUNS: usize = 5;
/// Timed runs of start-up and instantiation.
const STARTUP_RUNS: usize = 51;
/// Nodes updated per timed batch (distinct nodes: the allocator never runs out).
const BATCH: usize = 10_000;
/// Nodes of the `init` figure.
const INIT_NODES: usize = 130_000;
/// Allocate-and-release rounds per timed run of the single-free-range workloads.
const ROUNDS: u32 = 100_000;
/// Nodes of the sync workloads inside one call.
const SYNC_NODES: u32 = 20_000;

fn main() {
    let wasm = read(
        &artifact("NODEIPAM_COMPONENT", "nodeipam.wasm"),
        "make component",
    );
    let bench_wasm = read(
        &artifact("NODEIPAM_BENCH_COMPONENT", "nodeipam-bench.wasm"),
        "make bench-component",
    );
    let cache_dir = std::env::temp_dir().join(format!("nodeipam-bench-{}", std::process::id()));
    let builder = PluginBuilder::new().cache_dir(&cache_dir);
    // Compile once and fill the cache: every plugin below loads from it.
    let first = builder
        .clone()
        .load_bytes(&wasm, Lean::default())
        .expect("the component loads");
    assert_ne!(
        first.cache_outcome(),
        CacheOutcome::Hit,
        "fresh cache directory"
    );
    drop(first);

    println!(
        "nodeipam through the component (wasmtime 48) vs the same core natively, medians of \
         {RUNS} runs (init {INIT_RUNS}, start-up {STARTUP_RUNS}); backend: Lean (in-memory, \
         bench-local)"
    );
    println!(
        "{:<56} {:>10} {:>10} {:>7} {:>15}  ok",
        "figure", "wasm", "native", "ratio", "target"
    );

    // `cargo bench ... -- init alloc`: only those sections (update, init, startup, alloc,
    // inside).
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let run = |section: &str| only.is_empty() || only.iter().any(|o| o == section);
    if run("update") {
        updates(&builder, &wasm);
    }
    if run("init") {
        init(&builder, &wasm);
    }
    if run("startup") {
        startup(&builder, &wasm, &cache_dir);
    }
    if run("alloc") {
        allocator(&bench_wasm, true);
        allocator(&bench_wasm, false);
    }
    if run("inside") {
        sync_inside(&bench_wasm);
    }

    let _ = std::fs::remove_dir_all(&cache_dir);
}

// ---------------------------------------------------------------------------------------------
// Node updates

/// The update kinds of DESIGN.md's table, as the component sees them.
#[derive(Clone, Copy, Debug)]
enum Update {
    /// No range, no alias (sync-from-cluster): alias, add-alias, update-node-pod-cidrs,
    /// update-node-network-unavailable.
    Allocate,
    /// No range, an alias (sync-from-cloud): alias, update-node-pod-cidrs, network.
    CopyAlias,
    /// A range, no alias (sync-from-cluster): alias, add-alias, network.
    PushRange,
    /// A range and the same alias, already synced once: alias.
    InSync,
}

impl Update {
    fn label(self) -> &'static str {
        match self {
            Self::Allocate => "allocate",
            Self::CopyAlias => "copy alias",
            Self::PushRange => "push node range",
            Self::InSync => "in sync",
        }
    }

    fn mode(self) -> SyncMode {
        match self {
            Self::CopyAlias => SyncMode::SyncFromCloud,
            _ => SyncMode::SyncFromCluster,
        }
    }

    /// The node's pod ranges and its alias before the update: one range, or one per family.
    fn state(self, i: usize, dual: bool) -> (Vec<String>, Vec<String>) {
        let ranges = || {
            if dual {
                vec![v4(i), v6(i)]
            } else {
                vec![v4(i)]
            }
        };
        match self {
            Self::Allocate => (vec![], vec![]),
            Self::CopyAlias => (vec![], ranges()),
            Self::PushRange => (ranges(), vec![]),
            Self::InSync => (ranges(), ranges()),
        }
    }

    /// Whether the batch is synced once, untimed, before the timed one.
    fn warm(self) -> bool {
        matches!(self, Self::InSync)
    }

    /// The cluster before the batch, and the nodes `update` is given.
    fn fixture(self, dual: bool) -> (Lean, Vec<Node>) {
        let mut lean = Lean::default();
        let mut nodes = Vec::with_capacity(BATCH);
        for i in 0..BATCH {
            let (pod_cidrs, alias) = self.state(i, dual);
            let node = Node {
                name: name(i),
                provider_id: None,
                pod_cidrs,
            };
            lean.insert(node.clone(), alias);
            nodes.push(node);
        }
        (lean, nodes)
    }
}

fn updates(builder: &PluginBuilder, wasm: &[u8]) {
    let mut plugin = builder
        .clone()
        .load_bytes(wasm, Lean::default())
        .expect("loads");
    for (kind, dual) in [false, true].into_iter().flat_map(|dual| {
        [
            Update::Allocate,
            Update::CopyAlias,
            Update::PushRange,
            Update::InSync,
        ]
        .map(|kind| (kind, dual))
    }) {
        let config = if dual {
            dual_stack(kind.mode())
        } else {
            single_stack(kind.mode())
        };
        let (lean, nodes) = kind.fixture(dual);
        let guest_config = to_guest_config(&config);
        let guest_nodes: Vec<guest::Node> = nodes.iter().map(to_guest_node).collect();
        let mut calls = 0.0;
        let (wasm_ns, native_ns) = paired(RUNS, |_| {
            *plugin.backends_mut() = lean.clone();
            plugin.init(&config, 0).expect("init");
            if kind.warm() {
                for node in &nodes {
                    plugin.update(node, 0).expect("update");
                }
            }
            let before = plugin.backends().calls;
            let start = Instant::now();
            for node in &nodes {
                plugin.update(black_box(node), 0).expect("update");
            }
            let wasm = per(start.elapsed(), BATCH);
            calls = (plugin.backends().calls - before) as f64 / BATCH as f64;

            let mut lean = lean.clone();
            let init_nodes: Vec<guest::Node> = lean
                .list_nodes()
                .unwrap()
                .iter()
                .map(to_guest_node)
                .collect();
            let mut controller =
                guest::Controller::init(&guest_config, &init_nodes, 0, &mut lean).expect("init");
            if kind.warm() {
                for node in &guest_nodes {
                    controller.update(&mut lean, node, 0).expect("update");
                }
            }
            let start = Instant::now();
            for node in &guest_nodes {
                controller
                    .update(&mut lean, black_box(node), 0)
                    .expect("update");
            }
            (wasm, per(start.elapsed(), BATCH))
        });
        row(
            &format!(
                "update, {}: {} ({calls} host call{})",
                if dual { "dual-stack" } else { "single-stack" },
                kind.label(),
                if calls == 1.0 { "" } else { "s" }
            ),
            Some(wasm_ns),
            Some(native_ns),
            &[Target::Under(3_000.0)],
        );
    }

    // The smallest export call through the plugin: `tick` with nothing due, no host call.
    let tick_ns = median(RUNS, |_| {
        let start = Instant::now();
        for _ in 0..BATCH {
            black_box(plugin.tick(black_box(0), 0).expect("tick"));
        }
        per(start.elapsed(), BATCH)
    });
    row(
        "  for scale: an export call alone (tick, none due)",
        Some(tick_ns),
        None,
        &[],
    );

    // The same allocate batch with MockCluster, for scale: a test double that records every
    // call with its arguments (copies of names and ranges) and checks scripted failures.
    let (_, nodes) = Update::Allocate.fixture(true);
    let mock = MockCluster::new().with_nodes(nodes.iter().cloned());
    let mut plugin = builder
        .clone()
        .load_bytes(wasm, mock.clone())
        .expect("loads");
    let config = dual_stack(SyncMode::SyncFromCluster);
    let mock_ns = median(RUNS, |_| {
        *plugin.backends_mut() = mock.clone();
        plugin.init(&config, 0).expect("init");
        let start = Instant::now();
        for node in &nodes {
            plugin.update(black_box(node), 0).expect("update");
        }
        per(start.elapsed(), BATCH)
    });
    row(
        "  for scale: dual-stack allocate, recording MockCluster",
        Some(mock_ns),
        None,
        &[],
    );
}

// ---------------------------------------------------------------------------------------------
// init

fn init(builder: &PluginBuilder, wasm: &[u8]) {
    let config = dual_stack(SyncMode::SyncFromCluster);
    let mut lean = Lean::default();
    for i in 0..INIT_NODES {
        lean.insert(
            Node {
                name: name(i),
                provider_id: None,
                pod_cidrs: vec![v4(i), v6(i)],
            },
            vec![],
        );
    }

    let guest_config = to_guest_config(&config);
    let nodes: Vec<guest::Node> = lean
        .list_nodes()
        .unwrap()
        .iter()
        .map(to_guest_node)
        .collect();
    let mut backends = Some(lean.clone());
    let (wasm_ns, native_ns) = paired(INIT_RUNS, |_| {
        let mut plugin = builder
            .clone()
            .load_bytes(wasm, backends.take().expect("backends"))
            .expect("loads");
        let start = Instant::now();
        plugin.init(black_box(&config), 0).expect("init");
        let wasm = elapsed_ns(start);
        let stats = plugin.stats().expect("stats");
        assert_eq!(
            (
                stats.nodes as usize,
                stats.sets[0].used as usize,
                stats.sets[1].used as usize
            ),
            (INIT_NODES, INIT_NODES, INIT_NODES)
        );
        backends = Some(plugin.into_backends());

        let start = Instant::now();
        let controller =
            guest::Controller::init(&guest_config, black_box(&nodes), 0, &mut Noop).expect("init");
        let native = elapsed_ns(start);
        assert_eq!(controller.stats().nodes as usize, INIT_NODES);
        drop(black_box(controller));
        (wasm, native)
    });
    // The 1.5x ratio target is for the work inside the call: see "init ... inside one call"
    // (the native run gets the node list without passing it through the canonical ABI).
    row(
        "init 130,000 dual-stack nodes (incl. list + lower)",
        Some(wasm_ns),
        Some(native_ns),
        &[Target::Under(1e9)],
    );

    let list_ns = median(INIT_RUNS, |_| {
        let start = Instant::now();
        let nodes = black_box(lean.list_nodes().unwrap());
        let elapsed = start.elapsed();
        drop(nodes);
        elapsed.as_nanos() as f64
    });
    row(
        "  of which the backend's list_nodes",
        None,
        Some(list_ns),
        &[],
    );
}

// ---------------------------------------------------------------------------------------------
// Start-up

fn startup(builder: &PluginBuilder, wasm: &[u8], cache_dir: &Path) {
    // Everything `PluginBuilder::load_bytes` does on a cache hit: engine, epoch thread, cache
    // key, read and verify the entry, deserialize, link, instantiate.
    let load_ns = median(STARTUP_RUNS, |_| {
        let start = Instant::now();
        let plugin = builder
            .clone()
            .load_bytes(wasm, Lean::default())
            .expect("loads");
        let elapsed = start.elapsed();
        assert_eq!(plugin.cache_outcome(), CacheOutcome::Hit);
        drop(plugin);
        elapsed.as_nanos() as f64
    });
    row(
        "start-up from cache (PluginBuilder::load_bytes)",
        Some(load_ns),
        None,
        &[Target::Under(1e6)],
    );

    // The cache alone: key, read, checksum, deserialize. Same engine config as the plugin's
    // (epoch interruption), or the key would miss.
    let mut config = wasmtime::Config::new();
    config.epoch_interruption(true);
    let engine = Engine::new(&config).expect("engine");
    let cache = ComponentCache::new(cache_dir);
    let deserialize_ns = median(STARTUP_RUNS, |_| {
        let start = Instant::now();
        let (component, outcome) = cache.load(&engine, wasm).expect("cache load");
        let elapsed = start.elapsed();
        assert_eq!(outcome, CacheOutcome::Hit);
        drop(black_box(component));
        elapsed.as_nanos() as f64
    });
    row(
        "  of which ComponentCache::load (key, read, verify)",
        Some(deserialize_ns),
        None,
        &[],
    );

    // wasmtime alone, from the artifact in memory: deserialize, link (every import a stub that
    // traps: the plugin's linker costs the same), instantiate.
    let artifact = engine.precompile_component(wasm).expect("precompiles");
    let wasmtime_ns = median(STARTUP_RUNS, |_| {
        let start = Instant::now();
        // SAFETY: `artifact` was produced by `precompile_component` on this very engine.
        let component = unsafe { Component::deserialize(&engine, &artifact) }.expect("loads");
        let mut linker = Linker::new(&engine);
        linker
            .define_unknown_imports_as_traps(&component)
            .expect("links");
        let mut store = Store::new(&engine, ());
        store.set_epoch_deadline(1);
        let instance = linker
            .instantiate(&mut store, &component)
            .expect("instantiates");
        let elapsed = elapsed_ns(start);
        drop(black_box((instance, store)));
        elapsed
    });
    row(
        "deserialize + instantiate (wasmtime, in memory)",
        Some(wasmtime_ns),
        None,
        &[Target::Under(1e6)],
    );

    let mut plugin = builder
        .clone()
        .load_bytes(wasm, Lean::default())
        .expect("loads");
    let instantiate_ns = median(STARTUP_RUNS, |_| {
        let start = Instant::now();
        plugin.reinstantiate().expect("instantiates");
        elapsed_ns(start)
    });
    row(
        "instantiate only (Plugin::reinstantiate)",
        Some(instantiate_ns),
        None,
        &[Target::Under(1e6)],
    );
}

// ---------------------------------------------------------------------------------------------
// Allocator

/// The allocator workloads through the bench component, beside the same functions natively.
/// With `epoch`, the plugin's engine config (epoch interruption: a deadline check on every
/// loop back-edge and function entry), held to the target; without, for scale only.
fn allocator(bench_wasm: &[u8], epoch: bool) {
    let mut config = wasmtime::Config::new();
    config.epoch_interruption(epoch);
    let engine = Engine::new(&config).expect("engine");
    let component = Component::new(&engine, bench_wasm).expect("the bench component compiles");
    let mut store = Store::new(&engine, ());
    store.set_epoch_deadline(u64::MAX / 2);
    let bench = Bench::instantiate(&mut store, &component, &Linker::new(&engine))
        .expect("the bench component instantiates");
    let w = bench.nodeipam_bench_workload();
    let (ratio, suffix): (&[Target], &str) = if epoch {
        (&[Target::Ratio(1.5)], "")
    } else {
        (&[], " (no epoch)")
    };

    let (fill_wasm, fill_native) = paired(RUNS, |_| {
        let count = w
            .call_prepare(&mut store, Kind::Fill, 16, 0)
            .expect("prepare");
        let start = Instant::now();
        let done = w.call_run(&mut store, 0).expect("run");
        let wasm = per(start.elapsed(), count as usize);
        assert_eq!(done, u64::from(count));

        let mut set = workload::fill_prepare();
        let start = Instant::now();
        let count = black_box(workload::fill_run(black_box(&mut set)));
        (wasm, per(start.elapsed(), count as usize))
    });
    row(
        &format!("fill 65,536, per allocation{suffix}"),
        Some(fill_wasm),
        Some(fill_native),
        ratio,
    );

    let (frag_wasm, frag_native) = paired(RUNS, |run| {
        let seed = run as u64 + 1;
        let free = w
            .call_prepare(&mut store, Kind::Fragmented, 16, seed)
            .expect("prepare");
        let start = Instant::now();
        let done = w.call_run(&mut store, 0).expect("run");
        let wasm = per(start.elapsed(), free as usize);
        assert_eq!(done, u64::from(free));

        let (mut set, free) = workload::fragmented_prepare(seed);
        let start = Instant::now();
        let count = black_box(workload::fragmented_run(black_box(&mut set)));
        assert_eq!(count, free);
        (wasm, per(start.elapsed(), count as usize))
    });
    row(
        &format!("last 1% of fragmented 65,536, per alloc{suffix}"),
        Some(frag_wasm),
        Some(frag_native),
        ratio,
    );

    for (extra_bits, label) in [
        (16, "single free of 65,536, per find+release"),
        (24, "single free of 16,777,216, per find+release"),
    ] {
        w.call_prepare(&mut store, Kind::LastFree, extra_bits, 42)
            .expect("prepare");
        let mut set = workload::last_free_prepare(extra_bits, 42);
        let (wasm_ns, native_ns) = paired(RUNS, |_| {
            let start = Instant::now();
            black_box(w.call_run(&mut store, ROUNDS).expect("run"));
            let wasm = per(start.elapsed(), ROUNDS as usize);
            let start = Instant::now();
            black_box(workload::last_free_run(black_box(&mut set), ROUNDS));
            (wasm, per(start.elapsed(), ROUNDS as usize))
        });
        row(
            &format!("{label}{suffix}"),
            Some(wasm_ns),
            Some(native_ns),
            ratio,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The sync state machine inside one call

/// Node updates with the cluster and cloud inside the component (no host calls cross the
/// boundary), beside the same workload natively: the cost of the guest's own work in wasm.
fn sync_inside(bench_wasm: &[u8]) {
    let mut config = wasmtime::Config::new();
    config.epoch_interruption(true);
    let engine = Engine::new(&config).expect("engine");
    let component = Component::new(&engine, bench_wasm).expect("the bench component compiles");
    let mut store = Store::new(&engine, ());
    store.set_epoch_deadline(u64::MAX / 2);
    let bench = Bench::instantiate(&mut store, &component, &Linker::new(&engine))
        .expect("the bench component instantiates");
    let w = bench.nodeipam_bench_workload();
    // DESIGN.md holds allocating and `init` to 1.5x of native. In-sync updates are shown for
    // scale: the first sync after start (which also marks each node's network available once),
    // and a resync of nodes already synced (no write at all), which is mostly lookups
    // (the node table, the in-core cloud's map) and per-call overhead rather than work.
    let ratio: &[Target] = &[Target::Ratio(1.5)];
    for (in_sync, dual, passes, label, targets) in [
        (
            true,
            false,
            1,
            "inside one call, single-stack: in sync, first",
            &[][..],
        ),
        (
            true,
            false,
            2,
            "inside one call, single-stack: in sync, resync",
            &[],
        ),
        (
            false,
            false,
            1,
            "inside one call, single-stack: allocate",
            ratio,
        ),
        (
            true,
            true,
            1,
            "inside one call, dual-stack: in sync, first",
            &[],
        ),
        (
            true,
            true,
            2,
            "inside one call, dual-stack: in sync, resync",
            &[],
        ),
        (
            false,
            true,
            1,
            "inside one call, dual-stack: allocate",
            ratio,
        ),
    ] {
        let (wasm_ns, native_ns) = paired(RUNS, |_| {
            assert!(
                w.call_prepare_sync(&mut store, SYNC_NODES, in_sync, dual)
                    .expect("prepare")
            );
            for _ in 1..passes {
                w.call_run_sync(&mut store).expect("run");
            }
            let start = Instant::now();
            let done = w.call_run_sync(&mut store).expect("run");
            let wasm = per(start.elapsed(), SYNC_NODES as usize);
            assert_eq!(done, SYNC_NODES);

            let mut native = workload::sync_prepare(SYNC_NODES, in_sync, dual).expect("prepare");
            for _ in 1..passes {
                workload::sync_run(&mut native);
            }
            let start = Instant::now();
            let done = black_box(workload::sync_run(black_box(&mut native)));
            assert_eq!(done, SYNC_NODES);
            (wasm, per(start.elapsed(), SYNC_NODES as usize))
        });
        row(label, Some(wasm_ns), Some(native_ns), targets);
    }

    let count = INIT_NODES as u32;
    w.call_prepare_init(&mut store, count).expect("prepare");
    let native = workload::init_prepare(count);
    let (wasm_ns, native_ns) = paired(INIT_RUNS, |_| {
        let start = Instant::now();
        assert_eq!(w.call_run_init(&mut store).expect("run"), 2 * count);
        let wasm = start.elapsed().as_nanos() as f64;
        let start = Instant::now();
        assert_eq!(black_box(workload::init_run(black_box(&native))), 2 * count);
        (wasm, start.elapsed().as_nanos() as f64)
    });
    row(
        "init 130,000 dual-stack nodes inside one call",
        Some(wasm_ns),
        Some(native_ns),
        &[Target::Ratio(1.5)],
    );
}

// ---------------------------------------------------------------------------------------------
// The in-memory backend

/// An in-memory cluster and cloud: nodes in insertion order, found by name through a map; a
/// counter of host calls. Implements both the host's backend traits (for the plugin) and the
/// core's `Host` (for the native runs), with the same behaviour.
#[derive(Clone, Debug, Default)]
struct Lean {
    index: HashMap<String, usize>,
    entries: Vec<Entry>,
    /// Host calls so far (list_nodes excluded).
    calls: u64,
}

#[derive(Clone, Debug, Default)]
struct Entry {
    name: String,
    pod_cidrs: Vec<String>,
    alias: Vec<String>,
    network_unavailable: Option<bool>,
}

impl Lean {
    fn insert(&mut self, node: Node, alias: Vec<String>) {
        self.index.insert(node.name.clone(), self.entries.len());
        self.entries.push(Entry {
            name: node.name,
            pod_cidrs: node.pod_cidrs,
            alias,
            network_unavailable: None,
        });
    }

    fn entry(&mut self, name: &str) -> Option<&mut Entry> {
        self.calls += 1;
        let i = *self.index.get(name)?;
        Some(&mut self.entries[i])
    }

    fn node_of(entry: &Entry) -> Node {
        Node {
            name: entry.name.clone(),
            provider_id: None,
            pod_cidrs: entry.pod_cidrs.clone(),
        }
    }

    fn add(entry: &mut Entry, cidrs: &[String]) {
        for cidr in cidrs {
            if !entry.alias.contains(cidr) {
                entry.alias.push(cidr.clone());
            }
        }
    }
}

fn not_found(name: &str) -> BackendError {
    BackendError::NotFound(format!("node {name}"))
}

impl KubeApi for Lean {
    fn get_node(&mut self, name: &str) -> Result<Node, BackendError> {
        self.entry(name)
            .map(|e| Self::node_of(e))
            .ok_or_else(|| not_found(name))
    }

    fn list_nodes(&mut self) -> Result<Vec<Node>, BackendError> {
        Ok(self.entries.iter().map(Self::node_of).collect())
    }

    fn update_node_pod_cidrs(&mut self, node: &Node, cidrs: &[String]) -> Result<(), BackendError> {
        let entry = self
            .entry(&node.name)
            .ok_or_else(|| not_found(&node.name))?;
        entry.pod_cidrs = cidrs.to_vec();
        Ok(())
    }

    fn update_node_network_unavailable(
        &mut self,
        name: &str,
        unavailable: bool,
    ) -> Result<(), BackendError> {
        let entry = self.entry(name).ok_or_else(|| not_found(name))?;
        entry.network_unavailable = Some(unavailable);
        Ok(())
    }
}

impl CloudAlias for Lean {
    fn alias(&mut self, node: &Node) -> Result<Vec<String>, BackendError> {
        Ok(self
            .entry(&node.name)
            .map(|e| e.alias.clone())
            .unwrap_or_default())
    }

    fn add_alias(&mut self, node: &Node, cidrs: &[String]) -> Result<(), BackendError> {
        let entry = self
            .entry(&node.name)
            .ok_or_else(|| not_found(&node.name))?;
        Self::add(entry, cidrs);
        Ok(())
    }
}

impl Events for Lean {
    fn emit_node_warning(&mut self, _name: &str, _reason: &str, _message: &str) {
        self.calls += 1;
    }
}

fn guest_not_found(name: &str) -> guest::HostError {
    guest::HostError::NotFound(format!("node {name}"))
}

impl guest::KubeApi for Lean {
    fn get_node(&mut self, name: &str) -> Result<guest::Node, guest::HostError> {
        self.entry(name)
            .map(|e| to_guest_node(&Self::node_of(e)))
            .ok_or_else(|| guest_not_found(name))
    }

    fn update_node_pod_cidrs(
        &mut self,
        node: &guest::Node,
        cidrs: &[String],
    ) -> Result<(), guest::HostError> {
        let entry = self
            .entry(&node.name)
            .ok_or_else(|| guest_not_found(&node.name))?;
        entry.pod_cidrs = cidrs.to_vec();
        Ok(())
    }

    fn update_node_network_unavailable(
        &mut self,
        name: &str,
        unavailable: bool,
    ) -> Result<(), guest::HostError> {
        let entry = self.entry(name).ok_or_else(|| guest_not_found(name))?;
        entry.network_unavailable = Some(unavailable);
        Ok(())
    }
}

impl guest::CloudAlias for Lean {
    fn alias(&mut self, node: &guest::Node) -> Result<Vec<String>, guest::HostError> {
        Ok(self
            .entry(&node.name)
            .map(|e| e.alias.clone())
            .unwrap_or_default())
    }

    fn add_alias(&mut self, node: &guest::Node, cidrs: &[String]) -> Result<(), guest::HostError> {
        let entry = self
            .entry(&node.name)
            .ok_or_else(|| guest_not_found(&node.name))?;
        Self::add(entry, cidrs);
        Ok(())
    }
}

impl guest::Events for Lean {
    fn emit_node_warning(&mut self, _name: &str, _reason: &str, _message: &str) {
        self.calls += 1;
    }

    fn log(&mut self, _level: guest::Level, _message: &str, _fields: &[(&str, &str)]) {}
}

/// The native `init`'s host: no node has an alias, nothing is recorded.
struct Noop;

impl guest::KubeApi for Noop {
    fn get_node(&mut self, name: &str) -> Result<guest::Node, guest::HostError> {
        Err(guest_not_found(name))
    }

    fn update_node_pod_cidrs(
        &mut self,
        _: &guest::Node,
        _: &[String],
    ) -> Result<(), guest::HostError> {
        Ok(())
    }

    fn update_node_network_unavailable(
        &mut self,
        _: &str,
        _: bool,
    ) -> Result<(), guest::HostError> {
        Ok(())
    }
}

impl guest::CloudAlias for Noop {
    fn alias(&mut self, _: &guest::Node) -> Result<Vec<String>, guest::HostError> {
        Ok(Vec::new())
    }

    fn add_alias(&mut self, _: &guest::Node, _: &[String]) -> Result<(), guest::HostError> {
        Ok(())
    }
}

impl guest::Events for Noop {
    fn emit_node_warning(&mut self, _: &str, _: &str, _: &str) {}

    fn log(&mut self, _: guest::Level, _: &str, _: &[(&str, &str)]) {}
}

// ---------------------------------------------------------------------------------------------
// Fixtures and conversions

/// 10.0.0.0/8 by /26 (262,144 ranges) and fd00::/40 by /64 (16,777,216 ranges).
/// 10.0.0.0/8 by /26 (262,144 ranges).
fn single_stack(mode: SyncMode) -> Config {
    Config::new(mode, vec![ClusterCidr::new("10.0.0.0/8", 26)])
}

fn dual_stack(mode: SyncMode) -> Config {
    Config::new(
        mode,
        vec![
            ClusterCidr::new("10.0.0.0/8", 26),
            ClusterCidr::new("fd00::/40", 64),
        ],
    )
}

fn name(i: usize) -> String {
    format!("node-{i:06}")
}

/// The `i`-th /26 of 10.0.0.0/8.
fn v4(i: usize) -> String {
    let index = u32::try_from(i).expect("fits") << 6;
    format!("{}/26", Ipv4Addr::from(0x0A00_0000 | index))
}

/// The `i`-th /64 of fd00::/40.
fn v6(i: usize) -> String {
    format!(
        "{}/64",
        Ipv6Addr::from((0xfd00u128 << 112) | ((i as u128) << 64))
    )
}

fn to_guest_config(config: &Config) -> guest::Config {
    guest::Config {
        mode: match config.mode {
            SyncMode::SyncFromCloud => guest::SyncMode::SyncFromCloud,
            SyncMode::SyncFromCluster => guest::SyncMode::SyncFromCluster,
        },
        cluster_cidrs: config
            .cluster_cidrs
            .iter()
            .map(|c| guest::ClusterCidr {
                cidr: c.cidr.clone(),
                node_mask_size: c.node_mask_size,
            })
            .collect(),
        resync_ms: config.resync_ms,
        initial_retry_ms: config.initial_retry_ms,
        max_backoff_ms: config.max_backoff_ms,
    }
}

fn to_guest_node(node: &Node) -> guest::Node {
    guest::Node {
        name: node.name.clone(),
        provider_id: node.provider_id.clone(),
        pod_cidrs: node.pod_cidrs.clone(),
    }
}

/// `$VAR`, else `target/NAME` of the workspace.
fn artifact(var: &str, name: &str) -> PathBuf {
    std::env::var_os(var).map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../target")
                .join(name)
        },
        PathBuf::from,
    )
}

fn read(path: &Path, make: &str) -> Vec<u8> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e} (run `{make}` first)", path.display()))
}

// ---------------------------------------------------------------------------------------------
// Timing and the table

/// The median of `runs` results of `run(i)`.
fn median(runs: usize, mut run: impl FnMut(usize) -> f64) -> f64 {
    let mut results: Vec<f64> = (0..runs).map(&mut run).collect();
    results.sort_by(f64::total_cmp);
    results[runs / 2]
}

/// The medians of `runs` pairs of results of `run(i)`: wasm and native measured alternately,
/// so that a noisy neighbour on this shared machine weighs on both alike.
fn paired(runs: usize, mut run: impl FnMut(usize) -> (f64, f64)) -> (f64, f64) {
    let (wasm, native): (Vec<f64>, Vec<f64>) = (0..runs).map(&mut run).unzip();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[runs / 2]
    };
    (median(wasm), median(native))
}

/// Nanoseconds per operation.
fn per(elapsed: Duration, ops: usize) -> f64 {
    elapsed.as_nanos() as f64 / ops as f64
}

fn elapsed_ns(start: Instant) -> f64 {
    start.elapsed().as_nanos() as f64
}

/// What a figure must meet.
#[derive(Clone, Copy)]
enum Target {
    /// The wasm figure under this many nanoseconds.
    Under(f64),
    /// The wasm figure within this factor of the native one.
    Ratio(f64),
}

fn row(label: &str, wasm: Option<f64>, native: Option<f64>, targets: &[Target]) {
    let ratio = wasm.zip(native).map(|(w, n)| w / n);
    let ok = targets.iter().all(|target| match *target {
        Target::Under(ns) => wasm.is_some_and(|w| w < ns),
        Target::Ratio(x) => ratio.is_some_and(|r| r < x),
    });
    let target = targets
        .iter()
        .map(|target| match *target {
            Target::Under(ns) => format!("< {}", short(ns)),
            Target::Ratio(x) => format!("< {x}x"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let ok = match (targets.is_empty(), ok) {
        (true, _) => "",
        (false, true) => "yes",
        (false, false) => "NO",
    };
    println!(
        "{label:<56} {:>10} {:>10} {:>7} {target:>15}  {ok}",
        wasm.map_or_else(|| "-".to_owned(), human),
        native.map_or_else(|| "-".to_owned(), human),
        ratio.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}x")),
    );
}

fn human(ns: f64) -> String {
    if ns < 1_000.0 {
        format!("{ns:.1} ns")
    } else if ns < 1_000_000.0 {
        format!("{:.2} µs", ns / 1_000.0)
    } else if ns < 1_000_000_000.0 {
        format!("{:.2} ms", ns / 1_000_000.0)
    } else {
        format!("{:.2} s", ns / 1_000_000_000.0)
    }
}

/// A target as written in DESIGN.md: `3 µs`, `1 ms`, `1 s`.
fn short(ns: f64) -> String {
    human(ns).replace(".00 ", " ").replace(".0 ", " ")
}
