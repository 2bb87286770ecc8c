//! In-memory backends for tests and embedders: a cluster, a cloud and an event sink in one
//! [`MockCluster`], which implements [`KubeApi`], [`CloudAlias`] and [`Events`].
//!
//! Besides the state (nodes by name with their `NetworkUnavailable` flag, aliases by node
//! name, events), the mock keeps a trace of every call ([`Call`]), can fail calls on cue
//! ([`Failure`]: per operation, per node or any node, for the next N calls or always, with
//! any [`BackendError`], including [`BackendError::Fatal`] to make the component trap), and
//! can be strict: [`MockCluster::forbid`] and [`MockCluster::expect`] turn unwanted calls into
//! [`Violation`]s that a test asserts away with [`MockCluster::assert_clean`]. A violating
//! call still runs normally, so the test also sees what it caused.
//!
//! ```
//! use nodeipam_host::backend::{BackendError, KubeApi, Node};
//! use nodeipam_host::mock::{Failure, MockCluster, Op};
//!
//! let mut cluster = MockCluster::new()
//!     .with_node(Node::new("a", &[]))
//!     .with_alias("a", &["10.0.1.0/24"])
//!     .with_failure(Failure::new(Op::GetNode, BackendError::Unavailable("api down".into())).node("a"));
//! assert!(cluster.get_node("a").is_err());
//! assert!(cluster.get_node("a").is_ok());
//! assert_eq!(cluster.calls().len(), 2);
//! ```

use std::collections::BTreeMap;
use std::fmt;

use crate::backend::{BackendError, CloudAlias, Events, KubeApi, Node};

/// A backend operation, as [`Failure`]s, expectations and [`Call::op`] name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// [`KubeApi::get_node`].
    GetNode,
    /// [`KubeApi::list_nodes`].
    ListNodes,
    /// [`KubeApi::update_node_pod_cidrs`].
    UpdateNodePodCidrs,
    /// [`KubeApi::update_node_network_unavailable`].
    UpdateNodeNetworkUnavailable,
    /// [`CloudAlias::alias`].
    Alias,
    /// [`CloudAlias::add_alias`].
    AddAlias,
    /// [`Events::emit_node_warning`] (cannot fail: its trait method returns nothing).
    EmitNodeWarning,
}

/// One call the mock received, with its arguments.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    /// `get_node(name)`.
    GetNode {
        /// The node.
        name: String,
    },
    /// `list_nodes()`.
    ListNodes,
    /// `update_node_pod_cidrs(node, cidrs)`.
    UpdateNodePodCidrs {
        /// The node.
        name: String,
        /// The ranges to set.
        cidrs: Vec<String>,
    },
    /// `update_node_network_unavailable(name, unavailable)`.
    UpdateNodeNetworkUnavailable {
        /// The node.
        name: String,
        /// The condition's new value.
        unavailable: bool,
    },
    /// `alias(node)`.
    Alias {
        /// The node.
        name: String,
    },
    /// `add_alias(node, cidrs)`.
    AddAlias {
        /// The node.
        name: String,
        /// The ranges to attach.
        cidrs: Vec<String>,
    },
    /// `emit_node_warning(name, reason, message)`.
    EmitNodeWarning {
        /// The node.
        name: String,
        /// The event's reason.
        reason: String,
        /// The event's message.
        message: String,
    },
}

impl Call {
    /// The operation.
    pub fn op(&self) -> Op {
        match self {
            Self::GetNode { .. } => Op::GetNode,
            Self::ListNodes => Op::ListNodes,
            Self::UpdateNodePodCidrs { .. } => Op::UpdateNodePodCidrs,
            Self::UpdateNodeNetworkUnavailable { .. } => Op::UpdateNodeNetworkUnavailable,
            Self::Alias { .. } => Op::Alias,
            Self::AddAlias { .. } => Op::AddAlias,
            Self::EmitNodeWarning { .. } => Op::EmitNodeWarning,
        }
    }

    /// The node the call is about (none for `list_nodes`).
    pub fn node(&self) -> Option<&str> {
        match self {
            Self::ListNodes => None,
            Self::GetNode { name }
            | Self::UpdateNodePodCidrs { name, .. }
            | Self::UpdateNodeNetworkUnavailable { name, .. }
            | Self::Alias { name }
            | Self::AddAlias { name, .. }
            | Self::EmitNodeWarning { name, .. } => Some(name),
        }
    }
}

/// A warning event emitted on a node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Event {
    /// The node.
    pub name: String,
    /// CamelCase reason, e.g. `CloudCIDRAllocatorMismatch`.
    pub reason: String,
    /// The message.
    pub message: String,
}

/// A scripted failure: calls of one operation (on one node, or any) fail with `error`, for
/// the next call (the default), the next N calls, or always. The state is left unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    op: Op,
    node: Option<String>,
    /// Calls left to fail; `None`: always.
    remaining: Option<u32>,
    error: BackendError,
}

impl Failure {
    /// The next call of `op`, on any node, fails with `error`.
    pub fn new(op: Op, error: BackendError) -> Self {
        Self {
            op,
            node: None,
            remaining: Some(1),
            error,
        }
    }

    /// Only calls about this node fail.
    pub fn node(mut self, name: impl Into<String>) -> Self {
        self.node = Some(name.into());
        self
    }

    /// The next `n` matching calls fail.
    pub fn times(mut self, n: u32) -> Self {
        self.remaining = Some(n);
        self
    }

    /// Every matching call fails, until [`MockCluster::clear_failures`].
    pub fn always(mut self) -> Self {
        self.remaining = None;
        self
    }

    fn matches(&self, call: &Call) -> bool {
        self.op == call.op()
            && self.remaining != Some(0)
            && self
                .node
                .as_deref()
                .is_none_or(|node| call.node() == Some(node))
    }
}

/// Calls a test expects: of one operation, on one node or any, at least once (the default)
/// or exactly N times. In strict mode, any call that no expectation covers is a violation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expectation {
    op: Op,
    node: Option<String>,
    /// Exactly this many calls; `None`: at least one.
    times: Option<u32>,
    seen: u32,
}

impl Expectation {
    /// Calls of `op`, on any node, at least once.
    pub fn new(op: Op) -> Self {
        Self {
            op,
            node: None,
            times: None,
            seen: 0,
        }
    }

    /// Only calls about this node.
    pub fn node(mut self, name: impl Into<String>) -> Self {
        self.node = Some(name.into());
        self
    }

    /// Exactly `n` calls (0: none at all).
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }

    fn matches(&self, call: &Call) -> bool {
        self.op == call.op()
            && self
                .node
                .as_deref()
                .is_none_or(|node| call.node() == Some(node))
    }

    fn describe(&self) -> String {
        let node = self
            .node
            .as_deref()
            .map(|n| format!(" on node {n}"))
            .unwrap_or_default();
        let times = self
            .times
            .map_or_else(|| "at least 1".to_owned(), |n| n.to_string());
        format!(
            "{:?}{node}: expected {times} call(s), got {}",
            self.op, self.seen
        )
    }
}

/// A call the test did not want, or an expectation that was not met.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// A call of a forbidden operation.
    Forbidden(Call),
    /// In strict mode, a call no expectation covers (or beyond an exact count).
    Unexpected(Call),
    /// An expectation whose count was not met (reported by [`MockCluster::check`]).
    Unmet(String),
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Forbidden(call) => write!(f, "forbidden call {call:?}"),
            Self::Unexpected(call) => write!(f, "unexpected call {call:?}"),
            Self::Unmet(what) => write!(f, "unmet expectation {what}"),
        }
    }
}

/// An in-memory cluster, cloud and event sink with a call trace, scripted failures and
/// strict expectations.
#[derive(Clone, Debug, Default)]
pub struct MockCluster {
    nodes: BTreeMap<String, Node>,
    network_unavailable: BTreeMap<String, bool>,
    aliases: BTreeMap<String, Vec<String>>,
    events: Vec<Event>,
    calls: Vec<Call>,
    failures: Vec<Failure>,
    forbidden: Vec<(Op, Option<String>)>,
    strict: bool,
    expectations: Vec<Expectation>,
    violations: Vec<Violation>,
}

impl MockCluster {
    /// An empty cluster and cloud, lenient (no expectations).
    pub fn new() -> Self {
        Self::default()
    }

    /// With this node added (replacing one of the same name).
    pub fn with_node(mut self, node: Node) -> Self {
        self.add_node(node);
        self
    }

    /// With these nodes added.
    pub fn with_nodes(mut self, nodes: impl IntoIterator<Item = Node>) -> Self {
        nodes.into_iter().for_each(|node| self.add_node(node));
        self
    }

    /// With these alias ranges on the node's VM.
    pub fn with_alias(mut self, name: &str, cidrs: &[&str]) -> Self {
        self.set_alias(name, cidrs.iter().map(|c| (*c).to_owned()).collect());
        self
    }

    /// With this scripted failure.
    pub fn with_failure(mut self, failure: Failure) -> Self {
        self.fail(failure);
        self
    }

    /// Strict: every call must be covered by an [`Expectation`].
    pub fn strict(mut self) -> Self {
        self.strict = true;
        self
    }

    /// Add or replace a node.
    pub fn add_node(&mut self, node: Node) {
        self.nodes.insert(node.name.clone(), node);
    }

    /// Remove a node (its alias stays, as a VM's would).
    pub fn remove_node(&mut self, name: &str) -> Option<Node> {
        self.network_unavailable.remove(name);
        self.nodes.remove(name)
    }

    /// Replace the alias ranges of a node's VM (empty: none).
    pub fn set_alias(&mut self, name: &str, cidrs: Vec<String>) {
        if cidrs.is_empty() {
            self.aliases.remove(name);
        } else {
            self.aliases.insert(name.to_owned(), cidrs);
        }
    }

    /// Script a failure (checked in the order added).
    pub fn fail(&mut self, failure: Failure) {
        self.failures.push(failure);
    }

    /// Drop every scripted failure.
    pub fn clear_failures(&mut self) {
        self.failures.clear();
    }

    /// Any call of `op` is a violation.
    pub fn forbid(&mut self, op: Op) {
        self.forbidden.push((op, None));
    }

    /// Any call of `op` about this node is a violation.
    pub fn forbid_node(&mut self, op: Op, name: &str) {
        self.forbidden.push((op, Some(name.to_owned())));
    }

    /// Expect calls; switches the mock to strict mode.
    pub fn expect(&mut self, expectation: Expectation) {
        self.strict = true;
        self.expectations.push(expectation);
    }

    /// Strict mode on or off.
    pub fn set_strict(&mut self, strict: bool) {
        self.strict = strict;
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.get(name)
    }

    /// Every node, by name.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    /// A node's pod ranges (empty: none, or no such node).
    pub fn pod_cidrs(&self, name: &str) -> &[String] {
        self.nodes.get(name).map_or(&[], |node| &node.pod_cidrs)
    }

    /// The node's `NetworkUnavailable` condition: none until set.
    pub fn network_unavailable(&self, name: &str) -> Option<bool> {
        self.network_unavailable.get(name).copied()
    }

    /// The alias ranges of a node's VM (empty: none).
    pub fn alias_of(&self, name: &str) -> &[String] {
        self.aliases.get(name).map_or(&[], Vec::as_slice)
    }

    /// Every warning event, in order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> &[Call] {
        &self.calls
    }

    /// Every call so far, clearing the trace.
    pub fn take_calls(&mut self) -> Vec<Call> {
        std::mem::take(&mut self.calls)
    }

    /// The calls of one operation.
    pub fn calls_of(&self, op: Op) -> impl Iterator<Item = &Call> {
        self.calls.iter().filter(move |call| call.op() == op)
    }

    /// Violations recorded at call time (forbidden and unexpected calls).
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// Every violation: those recorded at call time, then every unmet expectation.
    pub fn check(&self) -> Result<(), Vec<Violation>> {
        let unmet = self.expectations.iter().filter(|e| match e.times {
            Some(n) => e.seen != n,
            None => e.seen == 0,
        });
        let all: Vec<Violation> = self
            .violations
            .iter()
            .cloned()
            .chain(unmet.map(|e| Violation::Unmet(e.describe())))
            .collect();
        if all.is_empty() { Ok(()) } else { Err(all) }
    }

    /// Panic, listing them, if there is any violation (a test helper).
    #[track_caller]
    pub fn assert_clean(&self) {
        if let Err(violations) = self.check() {
            let list: Vec<String> = violations.iter().map(ToString::to_string).collect();
            panic!(
                "mock cluster saw {} violation(s):\n  {}",
                list.len(),
                list.join("\n  ")
            );
        }
    }

    /// Record a call, check it against the rules, and return its scripted failure if any.
    fn enter(&mut self, call: Call) -> Result<(), BackendError> {
        let forbidden = self.forbidden.iter().any(|(op, node)| {
            *op == call.op() && node.as_deref().is_none_or(|n| call.node() == Some(n))
        });
        if forbidden {
            self.violations.push(Violation::Forbidden(call.clone()));
        } else if self.strict {
            let covered = self
                .expectations
                .iter_mut()
                .find(|e| e.matches(&call) && e.times.is_none_or(|n| e.seen < n));
            match covered {
                Some(expectation) => expectation.seen += 1,
                None => {
                    if let Some(e) = self.expectations.iter_mut().find(|e| e.matches(&call)) {
                        e.seen += 1;
                    }
                    self.violations.push(Violation::Unexpected(call.clone()));
                }
            }
        }
        let failure = self
            .failures
            .iter_mut()
            .find(|f| f.matches(&call))
            .map(|f| {
                if let Some(n) = &mut f.remaining {
                    *n -= 1;
                }
                f.error.clone()
            });
        self.failures.retain(|f| f.remaining != Some(0));
        self.calls.push(call);
        failure.map_or(Ok(()), Err)
    }

    fn known_node(&mut self, name: &str) -> Result<&mut Node, BackendError> {
        self.nodes
            .get_mut(name)
            .ok_or_else(|| BackendError::NotFound(format!("node {name}")))
    }
}

impl KubeApi for MockCluster {
    fn get_node(&mut self, name: &str) -> Result<Node, BackendError> {
        self.enter(Call::GetNode {
            name: name.to_owned(),
        })?;
        self.known_node(name).cloned()
    }

    fn list_nodes(&mut self) -> Result<Vec<Node>, BackendError> {
        self.enter(Call::ListNodes)?;
        Ok(self.nodes.values().cloned().collect())
    }

    fn update_node_pod_cidrs(&mut self, node: &Node, cidrs: &[String]) -> Result<(), BackendError> {
        self.enter(Call::UpdateNodePodCidrs {
            name: node.name.clone(),
            cidrs: cidrs.to_vec(),
        })?;
        self.known_node(&node.name)?.pod_cidrs = cidrs.to_vec();
        Ok(())
    }

    fn update_node_network_unavailable(
        &mut self,
        name: &str,
        unavailable: bool,
    ) -> Result<(), BackendError> {
        self.enter(Call::UpdateNodeNetworkUnavailable {
            name: name.to_owned(),
            unavailable,
        })?;
        self.known_node(name)?;
        self.network_unavailable
            .insert(name.to_owned(), unavailable);
        Ok(())
    }
}

impl CloudAlias for MockCluster {
    fn alias(&mut self, node: &Node) -> Result<Vec<String>, BackendError> {
        self.enter(Call::Alias {
            name: node.name.clone(),
        })?;
        Ok(self.alias_of(&node.name).to_vec())
    }

    fn add_alias(&mut self, node: &Node, cidrs: &[String]) -> Result<(), BackendError> {
        self.enter(Call::AddAlias {
            name: node.name.clone(),
            cidrs: cidrs.to_vec(),
        })?;
        let alias = self.aliases.entry(node.name.clone()).or_default();
        for cidr in cidrs {
            if !alias.contains(cidr) {
                alias.push(cidr.clone());
            }
        }
        Ok(())
    }
}

impl Events for MockCluster {
    fn emit_node_warning(&mut self, name: &str, reason: &str, message: &str) {
        let call = Call::EmitNodeWarning {
            name: name.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
        };
        // Events cannot fail: a scripted failure for them is consumed and ignored.
        let _ = self.enter(call);
        self.events.push(Event {
            name: name.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidrs(list: &[&str]) -> Vec<String> {
        list.iter().map(|c| (*c).to_owned()).collect()
    }

    fn unavailable() -> BackendError {
        BackendError::Unavailable("cloud down".into())
    }

    #[test]
    fn get_node_reads_and_unknown_is_not_found() {
        let mut mock = MockCluster::new().with_node(Node::new("a", &["10.0.0.0/24"]));
        assert_eq!(
            mock.get_node("a").unwrap(),
            Node::new("a", &["10.0.0.0/24"])
        );
        assert_eq!(
            mock.get_node("b"),
            Err(BackendError::NotFound("node b".into()))
        );
    }

    #[test]
    fn writes_change_state_and_are_traced() {
        let mut mock = MockCluster::new().with_node(Node::new("a", &[]));
        let node = Node::new("a", &[]);
        mock.update_node_pod_cidrs(&node, &cidrs(&["10.0.0.0/24"]))
            .unwrap();
        mock.update_node_network_unavailable("a", false).unwrap();
        mock.add_alias(&node, &cidrs(&["10.0.0.0/24"])).unwrap();
        mock.add_alias(&node, &cidrs(&["10.0.0.0/24", "fd00::/64"]))
            .unwrap();
        mock.emit_node_warning("a", "CloudCIDRAllocatorMismatch", "range differs");

        assert_eq!(mock.pod_cidrs("a"), cidrs(&["10.0.0.0/24"]));
        assert_eq!(mock.network_unavailable("a"), Some(false));
        assert_eq!(
            mock.alias_of("a"),
            cidrs(&["10.0.0.0/24", "fd00::/64"]),
            "no duplicates"
        );
        assert_eq!(mock.events()[0].reason, "CloudCIDRAllocatorMismatch");
        let ops: Vec<Op> = mock.calls().iter().map(Call::op).collect();
        assert_eq!(
            ops,
            [
                Op::UpdateNodePodCidrs,
                Op::UpdateNodeNetworkUnavailable,
                Op::AddAlias,
                Op::AddAlias,
                Op::EmitNodeWarning
            ]
        );
        assert_eq!(mock.take_calls().len(), 5);
        assert!(mock.calls().is_empty());
    }

    #[test]
    fn writes_to_unknown_nodes_are_not_found() {
        let mut mock = MockCluster::new();
        let ghost = Node::new("ghost", &[]);
        assert!(matches!(
            mock.update_node_pod_cidrs(&ghost, &[]),
            Err(BackendError::NotFound(_))
        ));
        assert!(matches!(
            mock.update_node_network_unavailable("ghost", true),
            Err(BackendError::NotFound(_))
        ));
        assert_eq!(mock.network_unavailable("ghost"), None);
    }

    #[test]
    fn alias_of_a_vm_without_one_is_empty() {
        let mut mock = MockCluster::new().with_alias("b", &["10.0.1.0/24"]);
        assert_eq!(
            mock.alias(&Node::new("a", &[])).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(
            mock.alias(&Node::new("b", &[])).unwrap(),
            cidrs(&["10.0.1.0/24"])
        );
    }

    #[test]
    fn failure_fires_once_by_default_and_leaves_state_alone() {
        let mut mock = MockCluster::new().with_node(Node::new("a", &[]));
        mock.fail(Failure::new(Op::UpdateNodePodCidrs, unavailable()));
        let node = Node::new("a", &[]);
        assert_eq!(
            mock.update_node_pod_cidrs(&node, &cidrs(&["10.0.0.0/24"])),
            Err(unavailable())
        );
        assert!(mock.pod_cidrs("a").is_empty());
        assert_eq!(
            mock.update_node_pod_cidrs(&node, &cidrs(&["10.0.0.0/24"])),
            Ok(())
        );
        assert_eq!(mock.calls().len(), 2, "failed calls are traced too");
    }

    #[test]
    fn failure_for_n_calls_then_passes() {
        let mut mock =
            MockCluster::new().with_failure(Failure::new(Op::Alias, unavailable()).times(2));
        let node = Node::new("a", &[]);
        let results: Vec<bool> = (0..3).map(|_| mock.alias(&node).is_ok()).collect();
        assert_eq!(results, [false, false, true]);
    }

    #[test]
    fn failure_always_until_cleared() {
        let mut mock =
            MockCluster::new().with_failure(Failure::new(Op::ListNodes, unavailable()).always());
        for _ in 0..5 {
            assert_eq!(mock.list_nodes(), Err(unavailable()));
        }
        mock.clear_failures();
        assert_eq!(mock.list_nodes(), Ok(vec![]));
    }

    #[test]
    fn failure_per_node_spares_other_nodes() {
        let fatal = BackendError::Fatal("boom".into());
        let mut mock =
            MockCluster::new().with_failure(Failure::new(Op::AddAlias, fatal.clone()).node("b"));
        assert_eq!(
            mock.add_alias(&Node::new("a", &[]), &cidrs(&["10.0.0.0/24"])),
            Ok(())
        );
        assert_eq!(
            mock.add_alias(&Node::new("b", &[]), &cidrs(&["10.0.1.0/24"])),
            Err(fatal)
        );
        assert!(mock.alias_of("b").is_empty());
        assert_eq!(
            mock.add_alias(&Node::new("b", &[]), &cidrs(&["10.0.1.0/24"])),
            Ok(())
        );
    }

    #[test]
    fn forbidden_calls_are_violations_but_still_run() {
        let mut mock = MockCluster::new().with_node(Node::new("a", &[]));
        mock.forbid(Op::AddAlias);
        mock.forbid_node(Op::GetNode, "b");
        mock.get_node("a").unwrap();
        mock.assert_clean();
        mock.add_alias(&Node::new("a", &[]), &cidrs(&["10.0.0.0/24"]))
            .unwrap();
        let _ = mock.get_node("b");
        assert_eq!(mock.alias_of("a"), cidrs(&["10.0.0.0/24"]));
        assert_eq!(mock.violations().len(), 2);
        assert!(
            matches!(&mock.violations()[0], Violation::Forbidden(Call::AddAlias { name, .. }) if name == "a")
        );
        assert!(
            matches!(&mock.violations()[1], Violation::Forbidden(Call::GetNode { name }) if name == "b")
        );
    }

    #[test]
    fn strict_mock_flags_calls_nobody_expected() {
        let mut mock = MockCluster::new().with_node(Node::new("a", &[])).strict();
        mock.expect(Expectation::new(Op::GetNode).node("a").times(1));
        mock.get_node("a").unwrap();
        assert_eq!(mock.check(), Ok(()));
        mock.get_node("a").unwrap();
        mock.list_nodes().unwrap();
        let violations = mock.check().unwrap_err();
        assert_eq!(violations.len(), 3, "{violations:?}");
        assert_eq!(
            violations[0],
            Violation::Unexpected(Call::GetNode { name: "a".into() })
        );
        assert_eq!(violations[1], Violation::Unexpected(Call::ListNodes));
        assert_eq!(
            violations[2],
            Violation::Unmet("GetNode on node a: expected 1 call(s), got 2".into())
        );
    }

    #[test]
    fn unmet_expectation_is_reported() {
        let mut mock = MockCluster::new();
        mock.expect(Expectation::new(Op::AddAlias));
        mock.expect(Expectation::new(Op::Alias).times(0));
        assert_eq!(
            mock.check(),
            Err(vec![Violation::Unmet(
                "AddAlias: expected at least 1 call(s), got 0".into()
            )])
        );
    }

    #[test]
    #[should_panic(expected = "1 violation(s)")]
    fn assert_clean_panics_on_violation() {
        let mut mock = MockCluster::new();
        mock.forbid(Op::ListNodes);
        let _ = mock.list_nodes();
        mock.assert_clean();
    }

    #[test]
    fn lenient_mock_accepts_anything() {
        let mut mock = MockCluster::new();
        let _ = mock.get_node("a");
        let _ = mock.list_nodes();
        mock.emit_node_warning("a", "R", "m");
        mock.assert_clean();
    }
}
