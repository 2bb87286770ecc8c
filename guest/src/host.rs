//! What the core needs from its host, as narrow traits. The component adapter implements
//! them over the WIT imports; tests implement them with in-memory mocks.

use alloc::string::String;
use alloc::vec::Vec;

use crate::types::{HostError, Level, Node};

/// The cluster: Kubernetes' node API.
pub trait KubeApi {
    /// Read a node by name.
    fn get_node(&mut self, name: &str) -> Result<Node, HostError>;
    /// Set the node's pod ranges.
    fn update_node_pod_cidrs(&mut self, node: &Node, cidrs: &[String]) -> Result<(), HostError>;
    /// Set or clear the node's `NetworkUnavailable` condition.
    fn update_node_network_unavailable(
        &mut self,
        name: &str,
        unavailable: bool,
    ) -> Result<(), HostError>;
}

/// The cloud: alias ranges of a node's VM.
pub trait CloudAlias {
    /// The node's alias ranges: empty (or `NotFound`) when it has none.
    fn alias(&mut self, node: &Node) -> Result<Vec<String>, HostError>;
    /// Attach ranges to the node's VM.
    fn add_alias(&mut self, node: &Node, cidrs: &[String]) -> Result<(), HostError>;
}

/// Warning events and logs.
pub trait Events {
    /// Emit a warning event on a node.
    fn emit_node_warning(&mut self, name: &str, reason: &str, message: &str);
    /// Log a message with key/value fields.
    fn log(&mut self, level: Level, message: &str, fields: &[(&str, &str)]);
}

/// Everything the core calls.
pub trait Host: KubeApi + CloudAlias + Events {}

impl<T: KubeApi + CloudAlias + Events> Host for T {}
