//! The backends the component's imports are wired to, as narrow native traits.
//!
//! Implementations: in-memory mocks (`mock`), the embedded local store, and real
//! Kubernetes / cloud clients. None of them know about wasm: the wiring to the generated
//! bindings lives in one place (`wiring`).

/// A Kubernetes node, as far as pod ranges are concerned (mirrors the WIT `node`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Node {
    /// `metadata.name`.
    pub name: String,
    /// `spec.providerID`, when set.
    pub provider_id: Option<String>,
    /// `spec.podCIDRs`: empty when the node has none.
    pub pod_cidrs: Vec<String>,
}

impl Node {
    /// A node with a name and pod ranges, no provider id.
    pub fn new(name: impl Into<String>, pod_cidrs: &[&str]) -> Self {
        Self {
            name: name.into(),
            provider_id: None,
            pod_cidrs: pod_cidrs.iter().map(|c| (*c).to_owned()).collect(),
        }
    }
}

/// Why a backend call failed. The first four become the WIT `host-error` (a value the
/// component handles); `Fatal` aborts the export call (a trap) and makes the host rebuild
/// the instance.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The object does not exist (for `alias`: the node has no alias).
    #[error("not found: {0}")]
    NotFound(String),
    /// The write lost a race with another writer.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The backend did not answer; a write may or may not have taken effect.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Any other failure; a write did not take effect.
    #[error("{0}")]
    Other(String),
    /// Not an expected failure: the call is aborted and the instance rebuilt.
    #[error("fatal: {0}")]
    Fatal(String),
}

/// The cluster: Kubernetes' node API (reads come from a cache).
pub trait KubeApi {
    /// Read one node.
    fn get_node(&mut self, name: &str) -> Result<Node, BackendError>;
    /// Every node (used to build or rebuild an instance; not a WIT import).
    fn list_nodes(&mut self) -> Result<Vec<Node>, BackendError>;
    /// Set `spec.podCIDRs` of a node.
    fn update_node_pod_cidrs(&mut self, node: &Node, cidrs: &[String]) -> Result<(), BackendError>;
    /// Set or clear the node's `NetworkUnavailable` condition.
    fn update_node_network_unavailable(
        &mut self,
        name: &str,
        unavailable: bool,
    ) -> Result<(), BackendError>;
}

/// The cloud: alias IP ranges of a node's VM.
pub trait CloudAlias {
    /// The node's alias ranges; empty when it has none.
    fn alias(&mut self, node: &Node) -> Result<Vec<String>, BackendError>;
    /// Attach ranges to the node's VM.
    fn add_alias(&mut self, node: &Node, cidrs: &[String]) -> Result<(), BackendError>;
}

/// Kubernetes events about nodes.
pub trait Events {
    /// Record a warning event on a node.
    fn emit_node_warning(&mut self, name: &str, reason: &str, message: &str);
}

/// Everything one instance needs: the cluster, the cloud and an event sink.
pub trait Backends: KubeApi + CloudAlias + Events + Send + 'static {}

impl<T: KubeApi + CloudAlias + Events + Send + 'static> Backends for T {}
