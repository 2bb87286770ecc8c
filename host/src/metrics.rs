//! Metrics in Prometheus' text format, and a backend wrapper that counts and times every call.
//!
//! Allocator metrics keep the names and label of Kubernetes' `cidrset/metrics.go`, upstream's
//! misspelling included (`node_ipam_controller_cirdset_max_cidrs`, sic), so existing dashboards
//! work:
//! - `node_ipam_controller_cidrset_cidrs_allocations_total{clusterCIDR}` (counter)
//! - `node_ipam_controller_cidrset_cidrs_releases_total{clusterCIDR}` (counter)
//! - `node_ipam_controller_cidrset_usage_cidrs{clusterCIDR}` (gauge: used / max, a fraction)
//! - `node_ipam_controller_cirdset_max_cidrs{clusterCIDR}` (gauge)
//! - `node_ipam_controller_cidrset_allocation_tries_per_request{clusterCIDR}`: upstream a
//!   histogram; here a summary without quantiles (`_sum` tries, `_count` allocations), since the
//!   component reports totals, not one value per request.
//!
//! The component counts allocations, releases and tries over all its sets together: with one
//! cluster CIDR they are exactly that set's; with two (dual-stack) they are exported once, with
//! `clusterCIDR` naming both sets (`"10.0.0.0/8,fd00::/48"`). Usage and maximum are per set.
//!
//! Plus, per operation: `nodeipam_backend_calls_total{op}`, `nodeipam_backend_errors_total{op}`,
//! `nodeipam_backend_seconds_total{op}` for each backend call the component makes, and
//! `nodeipam_plugin_calls_total{export}`, `nodeipam_plugin_errors_total{export}`,
//! `nodeipam_plugin_seconds_total{export}` for each export the host calls.

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backend::{BackendError, CloudAlias, Events, KubeApi, Node};
use crate::types::Stats;

/// Why the metrics endpoint cannot start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address cannot be bound.
    #[error("cannot serve metrics on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Backend operations, in the order they are exported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `get-node`.
    GetNode,
    /// Listing nodes (to build an instance).
    ListNodes,
    /// `update-node-pod-cidrs`.
    UpdateNodePodCidrs,
    /// `update-node-network-unavailable`.
    UpdateNodeNetworkUnavailable,
    /// `alias`.
    Alias,
    /// `add-alias`.
    AddAlias,
    /// `emit-node-warning`.
    EmitNodeWarning,
}

impl Op {
    /// Every operation.
    pub const ALL: [Self; 7] = [
        Self::GetNode,
        Self::ListNodes,
        Self::UpdateNodePodCidrs,
        Self::UpdateNodeNetworkUnavailable,
        Self::Alias,
        Self::AddAlias,
        Self::EmitNodeWarning,
    ];

    /// The WIT name.
    pub fn name(self) -> &'static str {
        match self {
            Self::GetNode => "get-node",
            Self::ListNodes => "list-nodes",
            Self::UpdateNodePodCidrs => "update-node-pod-cidrs",
            Self::UpdateNodeNetworkUnavailable => "update-node-network-unavailable",
            Self::Alias => "alias",
            Self::AddAlias => "add-alias",
            Self::EmitNodeWarning => "emit-node-warning",
        }
    }
}

/// Component exports the host calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Export {
    /// `init`.
    Init,
    /// `update`.
    Update,
    /// `delete`.
    Delete,
    /// `tick`.
    Tick,
}

impl Export {
    /// Every export counted.
    pub const ALL: [Self; 4] = [Self::Init, Self::Update, Self::Delete, Self::Tick];

    /// The WIT name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Init => "init",
            Self::Update => "update",
            Self::Delete => "delete",
            Self::Tick => "tick",
        }
    }
}

#[derive(Debug, Default)]
struct Counter {
    calls: AtomicU64,
    errors: AtomicU64,
    nanos: AtomicU64,
}

impl Counter {
    fn record(&self, elapsed: Duration, failed: bool) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    fn read(&self) -> (u64, u64, Duration) {
        (
            self.calls.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
            Duration::from_nanos(self.nanos.load(Ordering::Relaxed)),
        )
    }
}

/// Call counts, error counts and time, per backend operation and per export. Shared (`Arc`)
/// between the [`Metered`] backend, the run loop and the metrics endpoint.
#[derive(Debug, Default)]
pub struct Counters {
    ops: [Counter; Op::ALL.len()],
    exports: [Counter; Export::ALL.len()],
}

impl Counters {
    /// Record one export call.
    pub fn record_export(&self, export: Export, elapsed: Duration, failed: bool) {
        self.exports[export as usize].record(elapsed, failed);
    }

    /// Calls, errors and total time of one backend operation.
    pub fn op(&self, op: Op) -> (u64, u64, Duration) {
        self.ops[op as usize].read()
    }

    /// Calls, errors and total time of one export.
    pub fn export(&self, export: Export) -> (u64, u64, Duration) {
        self.exports[export as usize].read()
    }

    /// Time spent in every backend call together.
    pub fn backend_time(&self) -> Duration {
        Op::ALL.iter().map(|&op| self.op(op).2).sum()
    }

    /// Time spent in every export call together (backend calls made from them included).
    pub fn export_time(&self) -> Duration {
        Export::ALL.iter().map(|&e| self.export(e).2).sum()
    }
}

/// A backend that counts and times every call, then forwards it.
#[derive(Debug)]
pub struct Metered<B> {
    inner: B,
    counters: Arc<Counters>,
}

impl<B> Metered<B> {
    /// Wrap `inner`, counting into `counters`.
    pub fn new(inner: B, counters: Arc<Counters>) -> Self {
        Self { inner, counters }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The wrapped backend, mutably.
    pub fn inner_mut(&mut self) -> &mut B {
        &mut self.inner
    }
}

fn timed<T>(
    counters: &Counters,
    op: Op,
    call: impl FnOnce() -> Result<T, BackendError>,
) -> Result<T, BackendError> {
    let start = Instant::now();
    let result = call();
    counters.ops[op as usize].record(start.elapsed(), result.is_err());
    result
}

impl<B: KubeApi> KubeApi for Metered<B> {
    fn get_node(&mut self, name: &str) -> Result<Node, BackendError> {
        timed(&self.counters, Op::GetNode, || self.inner.get_node(name))
    }

    fn list_nodes(&mut self) -> Result<Vec<Node>, BackendError> {
        timed(&self.counters, Op::ListNodes, || self.inner.list_nodes())
    }

    fn update_node_pod_cidrs(&mut self, node: &Node, cidrs: &[String]) -> Result<(), BackendError> {
        timed(&self.counters, Op::UpdateNodePodCidrs, || {
            self.inner.update_node_pod_cidrs(node, cidrs)
        })
    }

    fn update_node_network_unavailable(
        &mut self,
        name: &str,
        unavailable: bool,
    ) -> Result<(), BackendError> {
        timed(&self.counters, Op::UpdateNodeNetworkUnavailable, || {
            self.inner
                .update_node_network_unavailable(name, unavailable)
        })
    }
}

impl<B: CloudAlias> CloudAlias for Metered<B> {
    fn alias(&mut self, node: &Node) -> Result<Vec<String>, BackendError> {
        timed(&self.counters, Op::Alias, || self.inner.alias(node))
    }

    fn add_alias(&mut self, node: &Node, cidrs: &[String]) -> Result<(), BackendError> {
        timed(&self.counters, Op::AddAlias, || {
            self.inner.add_alias(node, cidrs)
        })
    }
}

impl<B: Events> Events for Metered<B> {
    fn emit_node_warning(&mut self, name: &str, reason: &str, message: &str) {
        let _ = timed(&self.counters, Op::EmitNodeWarning, || {
            self.inner.emit_node_warning(name, reason, message);
            Ok(())
        });
    }
}

/// Everything the endpoint shows.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The component's counters as last read by the run loop.
    pub stats: Mutex<Stats>,
    /// Live call counters.
    pub counters: Arc<Counters>,
}

/// Render the metrics in Prometheus' text exposition format (version 0.0.4).
pub fn render(stats: &Stats, counters: &Counters) -> String {
    let mut out = String::new();
    let all = stats
        .sets
        .iter()
        .map(|s| s.cidr.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let label = |cidr: &str| format!("{{clusterCIDR=\"{}\"}}", escape(cidr));
    family(
        &mut out,
        "node_ipam_controller_cidrset_cidrs_allocations_total",
        "counter",
        "Counter measuring total number of CIDR allocations.",
        &[(label(&all), stats.allocations.to_string())],
    );
    family(
        &mut out,
        "node_ipam_controller_cidrset_cidrs_releases_total",
        "counter",
        "Counter measuring total number of CIDR releases.",
        &[(label(&all), stats.releases.to_string())],
    );
    let usage: Vec<_> = stats
        .sets
        .iter()
        .map(|s| {
            let fraction = if s.max == 0 {
                0.0
            } else {
                f64::from(s.used) / f64::from(s.max)
            };
            (label(&s.cidr), fraction.to_string())
        })
        .collect();
    family(
        &mut out,
        "node_ipam_controller_cidrset_usage_cidrs",
        "gauge",
        "Gauge measuring percentage of allocated CIDRs.",
        &usage,
    );
    let max: Vec<_> = stats
        .sets
        .iter()
        .map(|s| (label(&s.cidr), s.max.to_string()))
        .collect();
    family(
        &mut out,
        "node_ipam_controller_cirdset_max_cidrs",
        "gauge",
        "Maximum number of CIDRs that can be allocated.",
        &max,
    );
    let _ = writeln!(
        out,
        "# HELP node_ipam_controller_cidrset_allocation_tries_per_request Number of tries per \
         allocation (sum and count; no quantiles).\n\
         # TYPE node_ipam_controller_cidrset_allocation_tries_per_request summary\n\
         node_ipam_controller_cidrset_allocation_tries_per_request_sum{l} {}\n\
         node_ipam_controller_cidrset_allocation_tries_per_request_count{l} {}",
        stats.allocation_tries,
        stats.allocations,
        l = label(&all),
    );
    let ops: Vec<_> = Op::ALL
        .iter()
        .map(|&op| (op.name(), counters.op(op)))
        .collect();
    let exports: Vec<_> = Export::ALL
        .iter()
        .map(|&e| (e.name(), counters.export(e)))
        .collect();
    for (prefix, key, rows, what) in [
        (
            "nodeipam_backend",
            "op",
            &ops,
            "backend calls made by the component",
        ),
        (
            "nodeipam_plugin",
            "export",
            &exports,
            "component export calls",
        ),
    ] {
        for (suffix, kind, help) in [
            ("calls_total", "counter", "Number of"),
            ("errors_total", "counter", "Failed"),
            ("seconds_total", "counter", "Seconds spent in"),
        ] {
            let samples: Vec<_> = rows
                .iter()
                .map(|(name, (calls, errors, time))| {
                    let value = match suffix {
                        "calls_total" => calls.to_string(),
                        "errors_total" => errors.to_string(),
                        _ => time.as_secs_f64().to_string(),
                    };
                    (format!("{{{key}=\"{name}\"}}"), value)
                })
                .collect();
            family(
                &mut out,
                &format!("{prefix}_{suffix}"),
                kind,
                &format!("{help} {what}."),
                &samples,
            );
        }
    }
    out
}

fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, String)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, value) in samples {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Serve `GET /metrics` (any path, in fact) on `addr` from a background thread; returns the
/// bound address (useful with port 0).
pub fn serve(addr: SocketAddr, snapshot: Arc<Snapshot>) -> Result<SocketAddr, MetricsError> {
    let listener = TcpListener::bind(addr).map_err(|source| MetricsError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| MetricsError::Bind { addr, source })?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                let mut buf = [0u8; 2048];
                let _ = stream.read(&mut buf);
                let body = {
                    let stats = snapshot.stats.lock().map(|s| s.clone()).unwrap_or_default();
                    render(&stats, &snapshot.counters)
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        })
        .map_err(|source| MetricsError::Bind { addr, source })?;
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Usage;

    fn stats(sets: &[(&str, u32, u32)]) -> Stats {
        Stats {
            nodes: 3,
            sets: sets
                .iter()
                .map(|&(cidr, max, used)| Usage {
                    cidr: cidr.into(),
                    node_mask_size: 24,
                    max,
                    used,
                })
                .collect(),
            allocations: 5,
            releases: 2,
            allocation_tries: 9,
        }
    }

    #[test]
    fn kubernetes_names_and_label() {
        let text = render(&stats(&[("10.0.0.0/16", 256, 64)]), &Counters::default());
        for line in [
            "node_ipam_controller_cidrset_cidrs_allocations_total{clusterCIDR=\"10.0.0.0/16\"} 5",
            "node_ipam_controller_cidrset_cidrs_releases_total{clusterCIDR=\"10.0.0.0/16\"} 2",
            "node_ipam_controller_cidrset_usage_cidrs{clusterCIDR=\"10.0.0.0/16\"} 0.25",
            "node_ipam_controller_cirdset_max_cidrs{clusterCIDR=\"10.0.0.0/16\"} 256",
            "node_ipam_controller_cidrset_allocation_tries_per_request_sum{clusterCIDR=\"10.0.0.0/16\"} 9",
            "node_ipam_controller_cidrset_allocation_tries_per_request_count{clusterCIDR=\"10.0.0.0/16\"} 5",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
    }

    #[test]
    fn dual_stack_totals_name_both_sets() {
        let text = render(
            &stats(&[("10.0.0.0/16", 256, 1), ("fd00::/48", 65536, 1)]),
            &Counters::default(),
        );
        assert!(
            text.contains("allocations_total{clusterCIDR=\"10.0.0.0/16,fd00::/48\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("max_cidrs{clusterCIDR=\"fd00::/48\"} 65536"),
            "{text}"
        );
    }

    #[test]
    fn metered_backend_counts_calls_and_errors() {
        struct Failing;
        impl KubeApi for Failing {
            fn get_node(&mut self, name: &str) -> Result<Node, BackendError> {
                Err(BackendError::NotFound(name.into()))
            }
            fn list_nodes(&mut self) -> Result<Vec<Node>, BackendError> {
                Ok(Vec::new())
            }
            fn update_node_pod_cidrs(
                &mut self,
                _: &Node,
                _: &[String],
            ) -> Result<(), BackendError> {
                Ok(())
            }
            fn update_node_network_unavailable(
                &mut self,
                _: &str,
                _: bool,
            ) -> Result<(), BackendError> {
                Ok(())
            }
        }
        let counters = Arc::new(Counters::default());
        let mut m = Metered::new(Failing, counters.clone());
        assert!(m.get_node("a").is_err());
        m.list_nodes().unwrap();
        m.list_nodes().unwrap();
        assert_eq!(
            counters.op(Op::GetNode).0..=counters.op(Op::GetNode).1,
            1..=1
        );
        assert_eq!(
            (counters.op(Op::ListNodes).0, counters.op(Op::ListNodes).1),
            (2, 0)
        );
        let text = render(&Stats::default(), &counters);
        assert!(
            text.contains("nodeipam_backend_errors_total{op=\"get-node\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("nodeipam_backend_calls_total{op=\"list-nodes\"} 2"),
            "{text}"
        );
    }

    #[test]
    fn endpoint_serves_the_text() {
        let snapshot = Arc::new(Snapshot::default());
        *snapshot.stats.lock().unwrap() = stats(&[("10.0.0.0/16", 256, 64)]);
        let addr = serve("127.0.0.1:0".parse().unwrap(), snapshot).unwrap();
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
        assert!(
            response.contains(
                "node_ipam_controller_cirdset_max_cidrs{clusterCIDR=\"10.0.0.0/16\"} 256"
            )
        );
    }
}
