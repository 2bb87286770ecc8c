//! The one place that binds the component's imports to the native backends, and that
//! converts between generated and host-native types.
//!
//! `kube-api` and `cloud-alias` are defined here by hand ([`add_to_linker`]): every node update
//! calls them, and they read the node and ranges in place from guest memory into buffers kept
//! across calls, instead of lifting them into fresh `String`s on every call. `events` and `log`
//! go through the generated bindings.
//!
//! Error-versus-trap is decided here: [`BackendError::NotFound`], `Conflict`, `Unavailable`
//! and `Other` become a WIT `host-error` value that the component handles;
//! [`BackendError::Fatal`] becomes a trap (`Err(wasmtime::Error)`) carrying a [`FatalCall`],
//! which the plugin recognises and reports as [`Error::Fatal`](crate::Error::Fatal).

use std::fmt;

use wasmtime::component::{ComponentType, HasData, Lift, Linker, WasmStr};
use wasmtime::{ResourceLimiter, StoreContextMut, StoreLimits, StoreLimitsBuilder};

use crate::backend::{BackendError, Backends, Node};
use crate::bindings::nodeipam::sync::{events, log, types as wit};
use crate::error::SyncError;
use crate::types::{ClusterCidr, Config, Stats, SyncMode, TickReport, Usage};

/// The data of every store: the backends the imports call, and the memory limiter.
pub(crate) struct HostState<B> {
    /// The cluster, cloud and event sink.
    pub(crate) backends: B,
    /// Enforces [`Limits::max_memory_bytes`](crate::plugin::Limits::max_memory_bytes).
    pub(crate) limiter: MemoryLimiter,
    /// The arguments of the last node-taking import, copied out of guest memory.
    args: Args,
}

impl<B: Backends> HostState<B> {
    /// Store data for these backends, with a memory limit per linear memory.
    pub(crate) fn new(backends: B, max_memory_bytes: usize) -> Self {
        Self {
            backends,
            limiter: MemoryLimiter::new(max_memory_bytes),
            args: Args::default(),
        }
    }
}

/// [`HasData`] marker: the imports are implemented on the store data itself.
pub(crate) struct Imports<B>(std::marker::PhantomData<B>);

impl<B: Backends> HasData for Imports<B> {
    type Data<'a> = &'a mut HostState<B>;
}

/// A backend call failed with [`BackendError::Fatal`]: the payload of the trap it causes.
#[derive(Debug, thiserror::Error)]
#[error("backend call {call} failed: {source}")]
pub(crate) struct FatalCall {
    /// The WIT import, e.g. `add-alias`.
    pub(crate) call: &'static str,
    /// The backend's error.
    pub(crate) source: BackendError,
}

/// The component asked for more memory than allowed: the payload of the trap it causes.
#[derive(Debug, thiserror::Error)]
#[error("memory limit of {limit} bytes exceeded: asked for {requested}")]
pub(crate) struct MemoryLimitExceeded {
    /// The limit, in bytes.
    pub(crate) limit: usize,
    /// The size asked for, in bytes.
    pub(crate) requested: usize,
}

/// Caps each linear memory at `max_memory_bytes`, and traps (rather than letting
/// `memory.grow` return -1, which the guest's allocator would turn into an anonymous abort)
/// with a [`MemoryLimitExceeded`] that names the limit. Tables and instance counts use
/// wasmtime's [`StoreLimits`] defaults.
pub(crate) struct MemoryLimiter {
    max_memory_bytes: usize,
    limits: StoreLimits,
}

impl MemoryLimiter {
    fn new(max_memory_bytes: usize) -> Self {
        let limits = StoreLimitsBuilder::new()
            .memory_size(max_memory_bytes)
            .build();
        Self {
            max_memory_bytes,
            limits,
        }
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_memory_bytes {
            return Err(wasmtime::Error::new(MemoryLimitExceeded {
                limit: self.max_memory_bytes,
                requested: desired,
            }));
        }
        self.limits.memory_growing(current, desired, maximum)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.limits.table_growing(current, desired, maximum)
    }

    fn instances(&self) -> usize {
        self.limits.instances()
    }

    fn tables(&self) -> usize {
        self.limits.tables()
    }

    fn memories(&self) -> usize {
        self.limits.memories()
    }
}

/// A backend result as the component sees it: an expected failure is a value, `Fatal` traps.
fn to_wit<T>(
    call: &'static str,
    result: Result<T, BackendError>,
) -> wasmtime::Result<Result<T, wit::HostError>> {
    match result {
        Ok(value) => Ok(Ok(value)),
        Err(BackendError::NotFound(m)) => Ok(Err(wit::HostError::NotFound(m))),
        Err(BackendError::Conflict(m)) => Ok(Err(wit::HostError::Conflict(m))),
        Err(BackendError::Unavailable(m)) => Ok(Err(wit::HostError::Unavailable(m))),
        Err(BackendError::Other(m)) => Ok(Err(wit::HostError::Other(m))),
        Err(source @ BackendError::Fatal(_)) => {
            tracing::error!(call, error = %source, "backend call failed fatally: aborting the export call");
            Err(wasmtime::Error::new(FatalCall { call, source }))
        }
    }
}

impl<B: Backends> wit::Host for HostState<B> {}

/// WIT `node` as an import receives it: the strings stay in guest memory until copied (a list
/// arrives as a vector of such strings, lifted in the same pass as the call's other arguments).
#[derive(ComponentType, Lift)]
#[component(record)]
struct NodeArg {
    name: WasmStr,
    #[component(name = "provider-id")]
    provider_id: Option<WasmStr>,
    #[component(name = "pod-cidrs")]
    pod_cidrs: Vec<WasmStr>,
}

/// What a node-taking import passes to its backend, copied out of guest memory into buffers
/// that keep their capacity from call to call.
#[derive(Debug, Default)]
struct Args {
    node: Node,
    cidrs: Vec<String>,
}

type Ctx<'a, B> = StoreContextMut<'a, HostState<B>>;

/// Copies a guest string into `dst`, reusing its buffer.
fn copy_str<B: Backends>(cx: &Ctx<'_, B>, src: &WasmStr, dst: &mut String) -> wasmtime::Result<()> {
    dst.clear();
    dst.push_str(&src.to_str(cx)?);
    Ok(())
}

/// Copies guest strings into `dst`, reusing its strings.
fn copy_strings<B: Backends>(
    cx: &Ctx<'_, B>,
    src: &[WasmStr],
    dst: &mut Vec<String>,
) -> wasmtime::Result<()> {
    dst.truncate(src.len());
    for (i, item) in src.iter().enumerate() {
        match dst.get_mut(i) {
            Some(text) => copy_str(cx, item, text)?,
            None => dst.push(item.to_str(cx)?.into_owned()),
        }
    }
    Ok(())
}

/// Copies a guest node into `dst`, reusing its buffers.
fn copy_node<B: Backends>(cx: &Ctx<'_, B>, src: &NodeArg, dst: &mut Node) -> wasmtime::Result<()> {
    copy_str(cx, &src.name, &mut dst.name)?;
    match &src.provider_id {
        Some(id) => copy_str(cx, id, dst.provider_id.get_or_insert_with(String::new))?,
        None => dst.provider_id = None,
    }
    copy_strings(cx, &src.pod_cidrs, &mut dst.pod_cidrs)
}

/// Runs an import whose arguments the backend gets as copies in the kept buffers: `copy`
/// fills them from guest memory, `run` calls the backend with them, and [`to_wit`] converts
/// its result.
fn with_args<B: Backends, T>(
    mut cx: Ctx<'_, B>,
    call: &'static str,
    copy: impl FnOnce(&mut Ctx<'_, B>, &mut Args) -> wasmtime::Result<()>,
    run: impl FnOnce(&mut B, &Args) -> Result<T, BackendError>,
) -> wasmtime::Result<(Result<T, wit::HostError>,)> {
    let mut args = std::mem::take(&mut cx.data_mut().args);
    let copied = copy(&mut cx, &mut args);
    let result = copied.map(|()| run(&mut cx.data_mut().backends, &args));
    cx.data_mut().args = args;
    Ok((to_wit(call, result?)?,))
}

/// The instance names of the hand-wired interfaces (the world's package and version).
const KUBE_API: &str = "nodeipam:sync/kube-api@0.1.0";
const CLOUD_ALIAS: &str = "nodeipam:sync/cloud-alias@0.1.0";

/// Adds the component's imports to `linker`.
pub(crate) fn add_to_linker<B: Backends>(
    linker: &mut Linker<HostState<B>>,
) -> wasmtime::Result<()> {
    events::add_to_linker::<_, Imports<B>>(linker, |state| state)?;
    log::add_to_linker::<_, Imports<B>>(linker, |state| state)?;

    let mut kube = linker.instance(KUBE_API)?;
    kube.func_wrap("get-node", |mut cx: Ctx<'_, B>, (name,): (String,)| {
        let node = cx.data_mut().backends.get_node(&name).map(wit::Node::from);
        Ok((to_wit("get-node", node)?,))
    })?;
    kube.func_wrap(
        "update-node-pod-cidrs",
        |cx: Ctx<'_, B>, (node, cidrs): (NodeArg, Vec<WasmStr>)| {
            with_args(
                cx,
                "update-node-pod-cidrs",
                |cx, args| {
                    copy_node(cx, &node, &mut args.node)?;
                    copy_strings(cx, &cidrs, &mut args.cidrs)
                },
                |backends, args| backends.update_node_pod_cidrs(&args.node, &args.cidrs),
            )
        },
    )?;
    kube.func_wrap(
        "update-node-network-unavailable",
        |cx: Ctx<'_, B>, (name, unavailable): (WasmStr, bool)| {
            with_args(
                cx,
                "update-node-network-unavailable",
                |cx, args| copy_str(cx, &name, &mut args.node.name),
                |backends, args| {
                    backends.update_node_network_unavailable(&args.node.name, unavailable)
                },
            )
        },
    )?;

    let mut cloud = linker.instance(CLOUD_ALIAS)?;
    cloud.func_wrap("alias", |cx: Ctx<'_, B>, (node,): (NodeArg,)| {
        with_args(
            cx,
            "alias",
            |cx, args| copy_node(cx, &node, &mut args.node),
            |backends, args| backends.alias(&args.node),
        )
    })?;
    cloud.func_wrap(
        "add-alias",
        |cx: Ctx<'_, B>, (node, cidrs): (NodeArg, Vec<WasmStr>)| {
            with_args(
                cx,
                "add-alias",
                |cx, args| {
                    copy_node(cx, &node, &mut args.node)?;
                    copy_strings(cx, &cidrs, &mut args.cidrs)
                },
                |backends, args| backends.add_alias(&args.node, &args.cidrs),
            )
        },
    )?;
    Ok(())
}

impl<B: Backends> events::Host for HostState<B> {
    fn emit_node_warning(
        &mut self,
        name: String,
        reason: String,
        message: String,
    ) -> wasmtime::Result<()> {
        self.backends.emit_node_warning(&name, &reason, &message);
        Ok(())
    }
}

impl<B: Backends> log::Host for HostState<B> {
    fn log(
        &mut self,
        level: wit::Level,
        message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        let fields = Fields(&fields);
        match level {
            wit::Level::Debug => tracing::debug!(target: "nodeipam::guest", %fields, "{message}"),
            wit::Level::Info => tracing::info!(target: "nodeipam::guest", %fields, "{message}"),
            wit::Level::Warn => tracing::warn!(target: "nodeipam::guest", %fields, "{message}"),
            wit::Level::Error => tracing::error!(target: "nodeipam::guest", %fields, "{message}"),
        }
        Ok(())
    }
}

/// A guest log's key/value fields, displayed as `key=value key=value`.
struct Fields<'a>(&'a [(String, String)]);

impl fmt::Display for Fields<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (key, value)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{key}={value}")?;
        }
        Ok(())
    }
}

impl From<wit::Node> for Node {
    fn from(node: wit::Node) -> Self {
        Self {
            name: node.name,
            provider_id: node.provider_id,
            pod_cidrs: node.pod_cidrs,
        }
    }
}

impl From<Node> for wit::Node {
    fn from(node: Node) -> Self {
        Self {
            name: node.name,
            provider_id: node.provider_id,
            pod_cidrs: node.pod_cidrs,
        }
    }
}

impl From<&Node> for wit::Node {
    fn from(node: &Node) -> Self {
        node.clone().into()
    }
}

impl From<wit::HostError> for BackendError {
    fn from(error: wit::HostError) -> Self {
        match error {
            wit::HostError::NotFound(m) => Self::NotFound(m),
            wit::HostError::Conflict(m) => Self::Conflict(m),
            wit::HostError::Unavailable(m) => Self::Unavailable(m),
            wit::HostError::Other(m) => Self::Other(m),
        }
    }
}

impl From<wit::SyncError> for SyncError {
    fn from(error: wit::SyncError) -> Self {
        match error {
            wit::SyncError::InvalidConfig(m) => Self::InvalidConfig(m),
            wit::SyncError::InvalidCidr(m) => Self::InvalidCidr(m),
            wit::SyncError::OutOfRange(m) => Self::OutOfRange(m),
            wit::SyncError::Exhausted(m) => Self::Exhausted(m),
            wit::SyncError::InvalidMode(m) => Self::InvalidMode(m),
            wit::SyncError::Host(e) => Self::Host(e.into()),
            wit::SyncError::NotInitialized => Self::NotInitialized,
        }
    }
}

impl From<&Config> for wit::Config {
    fn from(config: &Config) -> Self {
        Self {
            mode: match config.mode {
                SyncMode::SyncFromCloud => wit::SyncMode::SyncFromCloud,
                SyncMode::SyncFromCluster => wit::SyncMode::SyncFromCluster,
            },
            cluster_cidrs: config
                .cluster_cidrs
                .iter()
                .map(wit::ClusterCidr::from)
                .collect(),
            resync_ms: config.resync_ms,
            initial_retry_ms: config.initial_retry_ms,
            max_backoff_ms: config.max_backoff_ms,
        }
    }
}

impl From<&ClusterCidr> for wit::ClusterCidr {
    fn from(cidr: &ClusterCidr) -> Self {
        Self {
            cidr: cidr.cidr.clone(),
            node_mask_size: cidr.node_mask_size,
        }
    }
}

impl From<wit::Stats> for Stats {
    fn from(stats: wit::Stats) -> Self {
        Self {
            nodes: stats.nodes,
            sets: stats.sets.into_iter().map(Usage::from).collect(),
            allocations: stats.allocations,
            releases: stats.releases,
            allocation_tries: stats.allocation_tries,
        }
    }
}

impl From<wit::Usage> for Usage {
    fn from(usage: wit::Usage) -> Self {
        Self {
            cidr: usage.cidr,
            node_mask_size: usage.node_mask_size,
            max: usage.max,
            used: usage.used,
        }
    }
}

impl From<wit::TickReport> for TickReport {
    fn from(report: wit::TickReport) -> Self {
        Self {
            resynced: report.resynced,
            failed: report.failed,
            next_due_ms: report.next_due_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_backend_errors_become_host_error_values() {
        let cases = [
            (
                BackendError::NotFound("node a".into()),
                wit::HostError::NotFound("node a".into()),
            ),
            (
                BackendError::Conflict("node a".into()),
                wit::HostError::Conflict("node a".into()),
            ),
            (
                BackendError::Unavailable("x".into()),
                wit::HostError::Unavailable("x".into()),
            ),
            (
                BackendError::Other("x".into()),
                wit::HostError::Other("x".into()),
            ),
        ];
        for (error, expected) in cases {
            let result = to_wit::<()>("get-node", Err(error.clone())).expect("not a trap");
            assert_eq!(
                format!("{:?}", result),
                format!("{:?}", Err::<(), _>(expected)),
                "{error}"
            );
            assert_eq!(BackendError::from(result.unwrap_err()), error);
        }
    }

    #[test]
    fn fatal_backend_error_becomes_a_trap_naming_the_call() {
        let trap = to_wit::<()>("add-alias", Err(BackendError::Fatal("boom".into()))).unwrap_err();
        let fatal = trap.downcast_ref::<FatalCall>().expect("a FatalCall");
        assert_eq!(fatal.call, "add-alias");
        assert_eq!(fatal.source, BackendError::Fatal("boom".into()));
    }

    #[test]
    fn memory_limiter_traps_past_the_limit_with_the_numbers() {
        let mut limiter = MemoryLimiter::new(1 << 20);
        assert!(limiter.memory_growing(0, 1 << 20, None).unwrap());
        let error = limiter.memory_growing(1 << 20, 2 << 20, None).unwrap_err();
        let exceeded = error
            .downcast_ref::<MemoryLimitExceeded>()
            .expect("MemoryLimitExceeded");
        assert_eq!((exceeded.limit, exceeded.requested), (1 << 20, 2 << 20));
    }

    #[test]
    fn log_fields_display_as_key_value_pairs() {
        let fields = vec![
            ("node".to_owned(), "a".to_owned()),
            ("cidr".to_owned(), "10.0.0.0/24".to_owned()),
        ];
        assert_eq!(Fields(&fields).to_string(), "node=a cidr=10.0.0.0/24");
        assert_eq!(Fields(&[]).to_string(), "");
    }
}
