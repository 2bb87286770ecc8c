//! One sandboxed instance of the component, wired to native backends.
//!
//! A [`Plugin`] owns the engine (with its epoch ticker thread), the compiled component, the
//! store and the instance. Every export call runs under [`Limits`]: memory through a
//! resource limiter on the store, time through an epoch deadline set before the call. A call
//! that traps (a guest bug, the memory cap, the deadline, or a backend's
//! [`BackendError::Fatal`](crate::backend::BackendError::Fatal)) returns an error naming the
//! export and the kind of trap; the instance and its store are then dropped, a fresh one is
//! instantiated and re-initialised from the cluster (`list_nodes`) with the last config, so
//! that every range already on a node or alias is occupied before anything is allocated
//! again. The backends survive: they move from the old store to the new one.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::component::Linker;
use wasmtime::{Engine, Store, Trap};

use crate::backend::{Backends, Node};
use crate::bindings::nodeipam::sync::types as wit;
use crate::bindings::{Nodeipam, NodeipamPre};
use crate::cache::{self, CacheOutcome, ComponentCache};
use crate::error::Error;
use crate::types::{Config, Stats, TickReport};
use crate::wiring::{self, FatalCall, HostState, MemoryLimitExceeded};

/// How often the epoch ticker advances the engine's epoch: the granularity of
/// [`Limits::call_timeout`].
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// The sandbox of one instance. The defaults are far above what any legitimate call needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The most each linear memory of the component may grow to, in bytes (default 1 GiB).
    pub max_memory_bytes: usize,
    /// The longest one export call may run (default 60 s), to within [`EPOCH_TICK`]; the
    /// time spent in host calls counts. Zero interrupts every call at once.
    pub call_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_memory_bytes: 1 << 30,
            call_timeout: Duration::from_secs(60),
        }
    }
}

impl Limits {
    /// Epoch ticks from the start of a call to its deadline: never shorter than the timeout.
    fn deadline_ticks(&self) -> u64 {
        if self.call_timeout.is_zero() {
            return 0;
        }
        let ticks = self.call_timeout.as_nanos().div_ceil(EPOCH_TICK.as_nanos());
        u64::try_from(ticks)
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }
}

/// A WIT node with nothing in it (the generated record has no `Default`).
fn empty_node() -> wit::Node {
    wit::Node {
        name: String::new(),
        provider_id: None,
        pod_cidrs: Vec::new(),
    }
}

/// The engine configuration every plugin (and the cache key) uses.
pub(crate) fn engine_config() -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config.epoch_interruption(true);
    config
}

/// How to load a component: limits and cache. [`Plugin::from_file`] and
/// [`Plugin::from_bytes`] are the short forms.
#[derive(Clone, Debug)]
pub struct PluginBuilder {
    limits: Limits,
    cache: Option<ComponentCache>,
}

impl Default for PluginBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl PluginBuilder {
    /// Default limits; the default cache location ([`ComponentCache::default_location`]).
    pub fn new() -> Self {
        Self {
            limits: Limits::default(),
            cache: ComponentCache::default_location(),
        }
    }

    /// Use these limits.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Cache precompiled components in this directory.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache = Some(ComponentCache::new(dir));
        self
    }

    /// Compile in memory every time; write nothing.
    pub fn no_cache(mut self) -> Self {
        self.cache = None;
        self
    }

    /// Load the component from a file.
    pub fn load_file<B: Backends>(
        self,
        path: impl AsRef<Path>,
        backends: B,
    ) -> Result<Plugin<B>, Error> {
        let path = path.as_ref();
        let wasm = std::fs::read(path).map_err(|source| Error::ReadComponent {
            path: path.to_owned(),
            source,
        })?;
        self.load_bytes(&wasm, backends)
    }

    /// Load the component from its bytes (a `.wasm` component, not a precompiled artifact).
    pub fn load_bytes<B: Backends>(self, wasm: &[u8], backends: B) -> Result<Plugin<B>, Error> {
        let engine =
            Engine::new(&engine_config()).map_err(|e| Error::Engine(e.into_boxed_dyn_error()))?;
        let (component, cache_outcome) = match &self.cache {
            Some(cache) => cache.load(&engine, wasm)?,
            None => cache::compile_uncached(&engine, wasm)?,
        };
        let mut linker = Linker::<HostState<B>>::new(&engine);
        wiring::add_to_linker(&mut linker).map_err(|e| Error::Link(e.into_boxed_dyn_error()))?;
        let pre = linker
            .instantiate_pre(&component)
            .and_then(NodeipamPre::new)
            .map_err(|e| Error::Link(e.into_boxed_dyn_error()))?;
        let ticker = EpochTicker::start(engine.clone(), EPOCH_TICK)?;
        let store = new_store(
            &engine,
            HostState::new(backends, self.limits.max_memory_bytes),
        );
        let mut plugin = Plugin {
            engine,
            pre,
            limits: self.limits,
            cache_outcome,
            store: Some(store),
            instance: None,
            config: None,
            last_now_ms: 0,
            arg: empty_node(),
            recoveries: 0,
            _ticker: ticker,
        };
        plugin.instance = Some(plugin.instantiate()?);
        Ok(plugin)
    }
}

/// One sandboxed, self-healing instance of the component, wired to `B`.
pub struct Plugin<B: Backends> {
    engine: Engine,
    pre: NodeipamPre<HostState<B>>,
    limits: Limits,
    cache_outcome: CacheOutcome,
    /// Always `Some` outside of [`Plugin::fresh_store`], which swaps it for a new one.
    store: Option<Store<HostState<B>>>,
    /// `None` after a trap until the instance is rebuilt.
    instance: Option<Nodeipam>,
    /// The last config `init` succeeded with: what a rebuilt instance is initialised with.
    config: Option<Config>,
    /// The latest `now_ms` seen, for re-initialising outside a timed call (`stats`).
    last_now_ms: u64,
    /// The node argument of `update` and `delete`, reused: copying into it keeps its buffers.
    arg: wit::Node,
    recoveries: u64,
    _ticker: EpochTicker,
}

impl<B: Backends> Plugin<B> {
    /// Load a component file with these limits and the default cache.
    pub fn from_file(path: impl AsRef<Path>, limits: Limits, backends: B) -> Result<Self, Error> {
        PluginBuilder::new()
            .limits(limits)
            .load_file(path, backends)
    }

    /// Load a component from its bytes with these limits and the default cache.
    pub fn from_bytes(wasm: &[u8], limits: Limits, backends: B) -> Result<Self, Error> {
        PluginBuilder::new()
            .limits(limits)
            .load_bytes(wasm, backends)
    }

    /// Validate `config`, occupy the ranges of every node the cluster lists (and, in
    /// `sync-from-cluster`, the aliases of nodes without one) and schedule their resyncs.
    /// Calling it again starts over.
    pub fn init(&mut self, config: &Config, now_ms: u64) -> Result<(), Error> {
        self.last_now_ms = now_ms;
        if self.instance.is_none() {
            // About to be initialised anyway: rebuild without the old config.
            self.recover(false)
                .map_err(|e| Error::Recovery(Box::new(e)))?;
        }
        let nodes = self.list_nodes()?;
        let wit_config = wit::Config::from(config);
        let result = self.call("init", |instance, store| {
            instance.call_init(store, &wit_config, &nodes, now_ms)
        })?;
        match result {
            Ok(()) => {
                self.config = Some(config.clone());
                Ok(())
            }
            Err(e) => {
                self.config = None;
                Err(Error::Sync(e.into()))
            }
        }
    }

    /// A node was added or changed: sync it now and reschedule it.
    pub fn update(&mut self, node: &Node, now_ms: u64) -> Result<(), Error> {
        self.node_call("update", node, now_ms, |instance, store, arg| {
            instance.call_update(store, arg, now_ms)
        })
    }

    /// A node was deleted: release its ranges and forget it.
    pub fn delete(&mut self, node: &Node, now_ms: u64) -> Result<(), Error> {
        self.node_call("delete", node, now_ms, |instance, store, arg| {
            instance.call_delete(store, arg, now_ms)
        })
    }

    /// Calls an export that takes a node. The node is copied into a kept WIT record
    /// (`clone_from` reuses its buffers): an export call per node event is the hot path.
    fn node_call(
        &mut self,
        export: &'static str,
        node: &Node,
        now_ms: u64,
        f: impl FnOnce(
            &Nodeipam,
            &mut Store<HostState<B>>,
            &wit::Node,
        ) -> wasmtime::Result<Result<(), wit::SyncError>>,
    ) -> Result<(), Error> {
        self.last_now_ms = now_ms;
        let mut arg = std::mem::replace(&mut self.arg, empty_node());
        arg.name.clone_from(&node.name);
        arg.provider_id.clone_from(&node.provider_id);
        arg.pod_cidrs.clone_from(&node.pod_cidrs);
        let result = self.call(export, |instance, store| f(instance, store, &arg));
        self.arg = arg;
        result?.map_err(|e| Error::Sync(e.into()))
    }

    /// Run the resyncs due at `now_ms`, earliest first, at most `max_resyncs` (0: no limit).
    pub fn tick(&mut self, now_ms: u64, max_resyncs: u32) -> Result<TickReport, Error> {
        self.last_now_ms = now_ms;
        let report = self.call("tick", |instance, store| {
            instance.call_tick(store, now_ms, max_resyncs)
        })?;
        Ok(report.into())
    }

    /// The allocator's counters.
    pub fn stats(&mut self) -> Result<Stats, Error> {
        Ok(self
            .call("stats", |instance, store| instance.call_stats(store))?
            .into())
    }

    /// The backends.
    pub fn backends(&self) -> &B {
        &self.state().backends
    }

    /// The backends, mutably (e.g. to change the mock cluster between calls).
    pub fn backends_mut(&mut self) -> &mut B {
        &mut self.state_mut().backends
    }

    /// Drop the instance and return the backends.
    pub fn into_backends(mut self) -> B {
        self.instance = None;
        self.store
            .take()
            .map(Store::into_data)
            .map(|state| state.backends)
            .expect(STORE_INVARIANT)
    }

    /// The limits every call runs under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The last config `init` succeeded with.
    pub fn config(&self) -> Option<&Config> {
        self.config.as_ref()
    }

    /// How many times the instance was rebuilt after a trap.
    pub fn recoveries(&self) -> u64 {
        self.recoveries
    }

    /// Whether the component came from the cache.
    pub fn cache_outcome(&self) -> CacheOutcome {
        self.cache_outcome
    }

    /// Whether an instance is ready to serve (false after a trap whose rebuild failed; the
    /// next call rebuilds it first).
    pub fn is_ready(&self) -> bool {
        self.instance.is_some()
    }

    /// Drop the instance and its store and instantiate the already-compiled component afresh
    /// (the backends move over), without initialising it: the next call other than
    /// [`Plugin::init`], `tick` or `stats` fails with
    /// [`SyncError::NotInitialized`](crate::SyncError::NotInitialized), and the last config is
    /// forgotten. Not a recovery ([`Plugin::recoveries`] is unchanged). This is the cost of a
    /// fresh instance once the component is loaded, e.g. for benchmarks.
    pub fn reinstantiate(&mut self) -> Result<(), Error> {
        self.instance = None;
        self.config = None;
        self.fresh_store();
        self.instance = Some(self.instantiate()?);
        Ok(())
    }

    /// Run one export call under the deadline; on a trap, report it and rebuild.
    fn call<R>(
        &mut self,
        export: &'static str,
        f: impl FnOnce(&Nodeipam, &mut Store<HostState<B>>) -> wasmtime::Result<R>,
    ) -> Result<R, Error> {
        if self.instance.is_none() {
            self.recover(true)
                .map_err(|e| Error::Recovery(Box::new(e)))?;
        }
        let (Some(store), Some(instance)) = (self.store.as_mut(), self.instance.as_ref()) else {
            unreachable!("{STORE_INVARIANT}; an instance exists after recover");
        };
        store.set_epoch_deadline(self.limits.deadline_ticks());
        match f(instance, store) {
            Ok(result) => Ok(result),
            Err(trap) => {
                let error = classify(export, trap, self.limits.call_timeout);
                tracing::error!(%error, "component trapped: rebuilding the instance from the cluster");
                self.instance = None;
                if let Err(e) = self.recover(true) {
                    tracing::error!(error = %e, "cannot rebuild the instance yet: retrying before the next call");
                }
                Err(error)
            }
        }
    }

    /// Drop the instance and its store, instantiate afresh and, when `reinit` and a config
    /// is known, initialise it from the cluster.
    fn recover(&mut self, reinit: bool) -> Result<(), Error> {
        self.instance = None;
        self.fresh_store();
        let instance = self.instantiate()?;
        if let (true, Some(config)) = (reinit, self.config.clone()) {
            let nodes = self.list_nodes()?;
            let store = self.store.as_mut().expect(STORE_INVARIANT);
            store.set_epoch_deadline(self.limits.deadline_ticks());
            let now_ms = self.last_now_ms;
            match instance.call_init(&mut *store, &wit::Config::from(&config), &nodes, now_ms) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(Error::Sync(e.into())),
                Err(trap) => return Err(classify("init", trap, self.limits.call_timeout)),
            }
            tracing::info!(
                nodes = nodes.len(),
                "instance rebuilt and re-initialised from the cluster"
            );
        }
        self.instance = Some(instance);
        self.recoveries += 1;
        Ok(())
    }

    /// Replace the store by an empty one holding the same backends.
    fn fresh_store(&mut self) {
        let state = self
            .store
            .take()
            .map(Store::into_data)
            .expect(STORE_INVARIANT);
        let state = HostState::new(state.backends, self.limits.max_memory_bytes);
        self.store = Some(new_store(&self.engine, state));
    }

    /// Instantiate the component in the current store.
    fn instantiate(&mut self) -> Result<Nodeipam, Error> {
        let store = self.store.as_mut().expect(STORE_INVARIANT);
        store.set_epoch_deadline(self.limits.deadline_ticks());
        self.pre.instantiate(store).map_err(|e| {
            match classify("instantiate", e, self.limits.call_timeout) {
                Error::Trapped { reason, .. } => Error::Instantiate(reason.into()),
                other => other,
            }
        })
    }

    /// Every node of the cluster, as the component takes them.
    fn list_nodes(&mut self) -> Result<Vec<wit::Node>, Error> {
        let nodes = self.backends_mut().list_nodes().map_err(Error::ListNodes)?;
        Ok(nodes.into_iter().map(wit::Node::from).collect())
    }

    fn state(&self) -> &HostState<B> {
        self.store.as_ref().expect(STORE_INVARIANT).data()
    }

    fn state_mut(&mut self) -> &mut HostState<B> {
        self.store.as_mut().expect(STORE_INVARIANT).data_mut()
    }
}

/// Name what a trap was: the memory cap, a fatal backend call, the deadline, or anything else
/// wasmtime reports (a guest bug).
fn classify(export: &'static str, error: wasmtime::Error, call_timeout: Duration) -> Error {
    if let Some(e) = error.downcast_ref::<MemoryLimitExceeded>() {
        return Error::MemoryLimit {
            export,
            limit: e.limit,
            requested: e.requested,
        };
    }
    if let Some(e) = error.downcast_ref::<FatalCall>() {
        return Error::Fatal {
            export,
            call: e.call,
            source: e.source.clone(),
        };
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => Error::Deadline {
            export,
            timeout: call_timeout,
        },
        Some(trap) => {
            let reason = trap.to_string();
            let reason = reason.strip_prefix("wasm trap: ").unwrap_or(&reason);
            Error::Trapped {
                export,
                reason: reason.to_owned(),
            }
        }
        None => Error::Trapped {
            export,
            reason: format!("{error:#}"),
        },
    }
}

/// The store is only ever absent inside `fresh_store`, which puts a new one back.
const STORE_INVARIANT: &str = "the plugin always holds a store";

/// A store with the memory limiter installed.
fn new_store<B: Backends>(engine: &Engine, state: HostState<B>) -> Store<HostState<B>> {
    let mut store = Store::new(engine, state);
    store.limiter(|state| &mut state.limiter);
    store.epoch_deadline_trap();
    store
}

/// Advances the engine's epoch every `tick` on its own thread, until dropped.
struct EpochTicker {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine, tick: Duration) -> Result<Self, Error> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("nodeipam-epoch".to_owned())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
                    engine.increment_epoch();
                }
            })
            .map_err(|e| Error::Engine(Box::new(e)))?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::backend::BackendError;
    use crate::error::SyncError;
    use crate::mock::{Call, Failure, MockCluster, Op};
    use crate::testing::{cluster_config, plugin, plugin_with, try_plugin_with};
    use crate::types::{ClusterCidr, SyncMode};

    /// Every range on a node or an alias, with who holds it; panics if two nodes share one.
    fn assert_no_range_handed_twice(cluster: &MockCluster) {
        let mut seen = std::collections::BTreeMap::new();
        for node in cluster.nodes() {
            let held: BTreeSet<&String> = node
                .pod_cidrs
                .iter()
                .chain(cluster.alias_of(&node.name))
                .collect();
            for cidr in held {
                if let Some(other) = seen.insert(cidr.clone(), node.name.clone()) {
                    panic!("{cidr} handed to both {other} and {}", node.name);
                }
            }
        }
    }

    fn fatal() -> BackendError {
        BackendError::Fatal("injected".into())
    }

    #[test]
    fn deadline_ticks_never_undercut_the_timeout() {
        let ticks = |ms| {
            Limits {
                call_timeout: Duration::from_millis(ms),
                ..Limits::default()
            }
            .deadline_ticks()
        };
        assert_eq!(ticks(0), 0);
        assert_eq!(ticks(1), 2);
        assert_eq!(ticks(10), 2);
        assert_eq!(ticks(11), 3);
        assert_eq!(ticks(60_000), 6_001);
        let huge = Limits {
            call_timeout: Duration::MAX,
            ..Limits::default()
        };
        assert_eq!(huge.deadline_ticks(), u64::MAX);
    }

    #[test]
    fn traps_are_classified_by_kind() {
        let timeout = Duration::from_secs(60);
        let cases = [
            (
                wasmtime::Error::new(Trap::UnreachableCodeReached),
                "export tick trapped: wasm `unreachable` instruction executed",
            ),
            (
                wasmtime::Error::new(Trap::Interrupt),
                "export tick ran past its deadline of 60s",
            ),
            (
                wasmtime::Error::new(MemoryLimitExceeded {
                    limit: 10,
                    requested: 20,
                }),
                "export tick exceeded the memory limit of 10 bytes (it asked for 20)",
            ),
            (
                wasmtime::Error::new(FatalCall {
                    call: "alias",
                    source: BackendError::Fatal("x".into()),
                }),
                "export tick aborted: backend call alias failed",
            ),
            (
                wasmtime::Error::msg("something else"),
                "export tick trapped: something else",
            ),
        ];
        for (trap, message) in cases {
            let error = classify("tick", trap, timeout);
            assert!(error.is_trap(), "{error}");
            assert_eq!(error.to_string(), message);
        }
    }

    #[test]
    fn epoch_ticker_stops_at_once_on_drop() {
        let engine = Engine::new(&engine_config()).unwrap();
        let ticker = EpochTicker::start(engine, Duration::from_secs(3600)).unwrap();
        // Would block for an hour if the thread did not wake on the stop signal.
        drop(ticker);
    }

    #[test]
    fn smoke_init_update_stats() {
        let cluster = MockCluster::new()
            .with_node(Node::new("a", &["10.0.0.0/24"]))
            .with_node(Node::new("b", &[]));
        let mut plugin = plugin(cluster);
        plugin.init(&cluster_config(), 0).unwrap();
        plugin.update(&Node::new("b", &[]), 10).unwrap();

        let cluster = plugin.backends();
        assert_eq!(cluster.pod_cidrs("b").len(), 1);
        assert_ne!(cluster.pod_cidrs("b"), cluster.pod_cidrs("a"));
        assert_eq!(cluster.alias_of("b"), cluster.pod_cidrs("b"));
        assert_eq!(cluster.network_unavailable("b"), Some(false));
        let stats = plugin.stats().unwrap();
        // Occupying a's range counts as an allocation, as in Kubernetes' cidrset.
        assert_eq!((stats.nodes, stats.allocations, stats.releases), (2, 2, 0));
        assert_eq!(stats.sets.len(), 1);
        assert_eq!(
            (
                stats.sets[0].cidr.as_str(),
                stats.sets[0].max,
                stats.sets[0].used
            ),
            ("10.0.0.0/16", 256, 2)
        );
        assert_eq!(plugin.config(), Some(&cluster_config()));
        assert_eq!(plugin.recoveries(), 0);
    }

    #[test]
    fn tick_runs_due_resyncs_and_reports_the_next() {
        let cluster = MockCluster::new().with_node(Node::new("a", &["10.0.0.0/24"]));
        let mut plugin = plugin(cluster);
        plugin
            .init(&cluster_config().with_intervals(1_000, 0, 0), 0)
            .unwrap();
        assert_eq!(
            plugin.tick(999, 0).unwrap(),
            TickReport {
                resynced: 0,
                failed: 0,
                next_due_ms: Some(1_000)
            }
        );
        assert_eq!(
            plugin.tick(1_000, 0).unwrap(),
            TickReport {
                resynced: 1,
                failed: 0,
                next_due_ms: Some(2_000)
            }
        );
    }

    #[test]
    fn reinstantiate_starts_uninitialised_and_keeps_the_backends() {
        let cluster = MockCluster::new().with_node(Node::new("a", &[]));
        let mut plugin = plugin(cluster);
        plugin.init(&cluster_config(), 0).unwrap();
        plugin.update(&Node::new("a", &[]), 0).unwrap();
        plugin.reinstantiate().unwrap();
        assert!(plugin.is_ready());
        assert_eq!(plugin.config(), None);
        assert_eq!(plugin.recoveries(), 0);
        assert_eq!(plugin.backends().pod_cidrs("a").len(), 1);
        let error = plugin.update(&Node::new("b", &[]), 0).unwrap_err();
        assert!(
            matches!(error, Error::Sync(SyncError::NotInitialized)),
            "{error}"
        );
        plugin.init(&cluster_config(), 0).unwrap();
        assert_eq!(plugin.stats().unwrap().nodes, 1);
    }

    #[test]
    fn sync_errors_are_values_not_traps() {
        let mut plugin = plugin(MockCluster::new().with_node(Node::new("a", &[])));
        let error = plugin.update(&Node::new("a", &[]), 0).unwrap_err();
        assert!(
            matches!(error, Error::Sync(SyncError::NotInitialized)),
            "{error}"
        );

        let mut bad = cluster_config();
        bad.cluster_cidrs[0].node_mask_size = 8;
        let error = plugin.init(&bad, 0).unwrap_err();
        assert!(
            matches!(&error, Error::Sync(SyncError::InvalidConfig(m)) if m.contains("10.0.0.0/16")),
            "{error}"
        );
        assert!(!error.is_trap());
        assert_eq!(plugin.config(), None);
        assert_eq!(plugin.recoveries(), 0);
    }

    #[test]
    fn expected_backend_errors_reach_the_component_as_values() {
        let cluster = MockCluster::new()
            .with_node(Node::new("a", &[]))
            .with_failure(Failure::new(
                Op::AddAlias,
                BackendError::Other("quota".into()),
            ));
        let mut plugin = plugin(cluster);
        plugin.init(&cluster_config(), 0).unwrap();
        let error = plugin.update(&Node::new("a", &[]), 0).unwrap_err();
        assert!(
            matches!(&error, Error::Sync(SyncError::Host(BackendError::Other(m))) if m == "quota"),
            "{error}"
        );
        assert_eq!(plugin.recoveries(), 0);
        assert_eq!(
            plugin.stats().unwrap().releases,
            1,
            "a definite failure releases the range"
        );
    }

    #[test]
    fn fatal_add_alias_traps_rebuilds_and_hands_nothing_out_twice() {
        let nodes = (0..5).map(|i| Node::new(format!("n{i}"), &[&format!("10.0.{i}.0/24")]));
        let cluster = MockCluster::new()
            .with_nodes(nodes)
            .with_node(Node::new("new", &[]))
            .with_failure(Failure::new(Op::AddAlias, fatal()).node("new"));
        let mut plugin = plugin(cluster);
        plugin.init(&cluster_config(), 0).unwrap();
        plugin.backends_mut().take_calls();

        let error = plugin.update(&Node::new("new", &[]), 5).unwrap_err();
        assert!(
            matches!(&error, Error::Fatal { export: "update", call: "add-alias", source } if *source == fatal()),
            "{error}"
        );
        assert!(error.is_trap());
        assert_eq!(
            error.to_string(),
            "export update aborted: backend call add-alias failed"
        );
        assert_eq!(plugin.recoveries(), 1);
        assert!(plugin.is_ready());
        assert!(
            plugin.backends().calls().contains(&Call::ListNodes),
            "rebuilt from the cluster"
        );
        assert_eq!(
            plugin.stats().unwrap().sets[0].used,
            5,
            "the rebuilt instance occupies every node's range"
        );

        plugin.update(&Node::new("new", &[]), 6).unwrap();
        let node = Node::new("later", &[]);
        plugin.backends_mut().add_node(node.clone());
        plugin.update(&node, 7).unwrap();
        assert_eq!(plugin.backends().pod_cidrs("new").len(), 1);
        assert_eq!(plugin.backends().pod_cidrs("later").len(), 1);
        assert_no_range_handed_twice(plugin.backends());
    }

    #[test]
    fn trap_after_alias_added_adopts_the_alias_after_rebuild() {
        // The alias lands, then the node patch aborts: the rebuilt instance must occupy the
        // alias (a half-finished allocation) so that nobody else gets it.
        let cluster = MockCluster::new()
            .with_node(Node::new("a", &[]))
            .with_failure(Failure::new(Op::UpdateNodePodCidrs, fatal()).node("a"));
        let mut plugin = plugin(cluster);
        plugin.init(&cluster_config(), 0).unwrap();
        let error = plugin.update(&Node::new("a", &[]), 1).unwrap_err();
        assert!(
            matches!(
                error,
                Error::Fatal {
                    call: "update-node-pod-cidrs",
                    ..
                }
            ),
            "{error}"
        );
        let alias = plugin.backends().alias_of("a").to_vec();
        assert_eq!(alias.len(), 1);

        let b = Node::new("b", &[]);
        plugin.backends_mut().add_node(b.clone());
        plugin.update(&b, 2).unwrap();
        assert_ne!(
            plugin.backends().pod_cidrs("b"),
            alias.as_slice(),
            "a's alias was not handed to b"
        );
        plugin.update(&Node::new("a", &[]), 3).unwrap();
        assert_eq!(
            plugin.backends().pod_cidrs("a"),
            alias.as_slice(),
            "a completes with its alias"
        );
        assert_no_range_handed_twice(plugin.backends());
    }

    #[test]
    fn failed_rebuild_is_retried_before_the_next_call() {
        let cluster = MockCluster::new()
            .with_node(Node::new("a", &[]))
            .with_failure(Failure::new(Op::AddAlias, fatal()))
            .with_failure(Failure::new(
                Op::ListNodes,
                BackendError::Unavailable("api down".into()),
            ));
        let mut plugin = plugin(cluster);
        // The first list_nodes (init) fails: nothing is initialised.
        assert!(matches!(
            plugin.init(&cluster_config(), 0),
            Err(Error::ListNodes(_))
        ));
        plugin.init(&cluster_config(), 0).unwrap();

        plugin.backends_mut().fail(Failure::new(
            Op::ListNodes,
            BackendError::Unavailable("api down".into()),
        ));
        let error = plugin.update(&Node::new("a", &[]), 1).unwrap_err();
        assert!(matches!(error, Error::Fatal { .. }), "{error}");
        assert!(!plugin.is_ready(), "the rebuild could not list the nodes");

        plugin.update(&Node::new("a", &[]), 2).unwrap();
        assert!(plugin.is_ready());
        assert_eq!(plugin.recoveries(), 1);
        assert_eq!(plugin.backends().pod_cidrs("a").len(), 1);
    }

    #[test]
    fn memory_cap_below_the_initial_memory_fails_instantiation_naming_the_limit() {
        let limits = Limits {
            max_memory_bytes: 64 * 1024,
            ..Limits::default()
        };
        let error = try_plugin_with(limits, MockCluster::new())
            .err()
            .expect("fails");
        assert!(
            matches!(
                error,
                Error::MemoryLimit {
                    export: "instantiate",
                    limit: 65_536,
                    ..
                }
            ),
            "{error}"
        );
        assert!(error.to_string().contains("65536 bytes"), "{error}");
    }

    #[test]
    fn memory_cap_stops_a_large_init_and_the_instance_is_rebuilt() {
        let probe = Limits {
            max_memory_bytes: 64 * 1024,
            ..Limits::default()
        };
        let Some(Error::MemoryLimit {
            requested: initial, ..
        }) = try_plugin_with(probe, MockCluster::new()).err()
        else {
            panic!("probing the initial memory size failed");
        };
        let limit = initial + 512 * 1024;
        let nodes = (0..40_000u32).map(|i| {
            Node::new(
                format!("node-{i:06}"),
                &[&format!("10.{}.{}.0/24", i / 256, i % 256)],
            )
        });
        let cluster = MockCluster::new().with_nodes(nodes);
        let mut plugin = plugin_with(
            Limits {
                max_memory_bytes: limit,
                ..Limits::default()
            },
            cluster,
        );
        let config = Config::new(
            SyncMode::SyncFromCluster,
            vec![ClusterCidr::new("10.0.0.0/8", 24)],
        );

        let error = plugin.init(&config, 0).unwrap_err();
        assert!(
            matches!(error, Error::MemoryLimit { export: "init", limit: l, requested } if l == limit && requested > limit),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .contains(&format!("memory limit of {limit} bytes")),
            "{error}"
        );
        assert!(
            plugin.is_ready(),
            "a fresh instance replaced the one that hit the cap"
        );
        assert_eq!(
            plugin.stats().unwrap().nodes,
            0,
            "never initialised: there was no config yet"
        );
    }

    #[test]
    fn zero_call_timeout_interrupts_instantiation_naming_the_deadline() {
        let limits = Limits {
            call_timeout: Duration::ZERO,
            ..Limits::default()
        };
        let error = try_plugin_with(limits, MockCluster::new())
            .err()
            .expect("fails");
        assert!(
            matches!(
                error,
                Error::Deadline {
                    export: "instantiate",
                    timeout: Duration::ZERO
                }
            ),
            "{error}"
        );
    }

    #[test]
    fn epoch_deadline_interrupts_a_long_call_and_the_instance_is_rebuilt() {
        // 50,000 nodes take hundreds of milliseconds to initialise; the deadline is 10-20 ms
        // of epoch ticks away. Only a much faster machine could finish first.
        let nodes = (0..50_000u32).map(|i| {
            Node::new(
                format!("node-{i:06}"),
                &[&format!("10.{}.{}.0/24", i / 256, i % 256)],
            )
        });
        let limits = Limits {
            call_timeout: Duration::from_millis(1),
            ..Limits::default()
        };
        let mut plugin = plugin_with(limits, MockCluster::new().with_nodes(nodes));
        let config = Config::new(
            SyncMode::SyncFromCluster,
            vec![ClusterCidr::new("10.0.0.0/8", 24)],
        );
        let error = plugin.init(&config, 0).unwrap_err();
        assert!(
            matches!(error, Error::Deadline { export: "init", timeout } if timeout == Duration::from_millis(1)),
            "{error}"
        );
        assert_eq!(
            error.to_string(),
            "export init ran past its deadline of 1ms"
        );
        assert!(plugin.is_ready());
        assert_eq!(plugin.recoveries(), 1);
    }

    #[test]
    fn into_backends_returns_them_after_traps() {
        let cluster = MockCluster::new()
            .with_node(Node::new("a", &[]))
            .with_failure(Failure::new(Op::AddAlias, fatal()));
        let mut plugin = plugin(cluster);
        plugin.init(&cluster_config(), 0).unwrap();
        assert!(
            plugin
                .update(&Node::new("a", &[]), 1)
                .unwrap_err()
                .is_trap()
        );
        let cluster = plugin.into_backends();
        assert_eq!(cluster.calls_of(Op::AddAlias).count(), 1);
    }

    #[test]
    fn plugin_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Plugin<MockCluster>>();
    }

    #[test]
    fn corrupt_cache_entry_is_rebuilt_and_behaves_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let run = || {
            let cluster = MockCluster::new().with_node(Node::new("a", &[]));
            let mut plugin = PluginBuilder::new()
                .cache_dir(dir.path())
                .load_bytes(crate::testing::component(), cluster)
                .unwrap();
            plugin.init(&cluster_config(), 0).unwrap();
            plugin.update(&Node::new("a", &[]), 0).unwrap();
            (
                plugin.cache_outcome(),
                plugin.backends().pod_cidrs("a").to_vec(),
            )
        };
        let (outcome, first) = run();
        assert_eq!(outcome, CacheOutcome::Miss);
        let entry = std::fs::read_dir(dir.path())
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let mut bytes = std::fs::read(&entry).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        std::fs::write(&entry, &bytes).unwrap();
        assert_eq!(run(), (CacheOutcome::Rebuilt, first.clone()));
        assert_eq!(run(), (CacheOutcome::Hit, first));
    }

    #[test]
    fn second_load_hits_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let load = || {
            PluginBuilder::new()
                .cache_dir(dir.path())
                .load_bytes(crate::testing::component(), MockCluster::new())
                .unwrap()
                .cache_outcome()
        };
        assert_eq!(load(), CacheOutcome::Miss);
        assert_eq!(load(), CacheOutcome::Hit);
    }

    #[test]
    fn not_a_component_is_a_compile_error() {
        let error = PluginBuilder::new()
            .no_cache()
            .load_bytes(b"\0asm\x01\0\0\0", MockCluster::new())
            .err();
        assert!(
            matches!(error, Some(Error::Link(_) | Error::Compile { .. })),
            "{error:?}"
        );
        let missing = Plugin::from_file(
            "/nonexistent/nodeipam.wasm",
            Limits::default(),
            MockCluster::new(),
        )
        .err();
        assert!(
            matches!(missing, Some(Error::ReadComponent { .. })),
            "{missing:?}"
        );
    }
}
