//! The imports hand each backend exactly what the component passed: the whole node record
//! (name, provider id, pod ranges) and the ranges, through the buffers the host keeps from
//! call to call — so a long value followed by a shorter or empty one leaves nothing behind.

use nodeipam_host::mock::MockCluster;
use nodeipam_host::{
    BackendError, CloudAlias, Events, KubeApi, Node, Plugin, PluginBuilder, SyncMode,
};
use nodeipam_tests::{component, dual_stack_config};

/// What one import received.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Alias(Node),
    AddAlias(Node, Vec<String>),
    SetPodCidrs(Node, Vec<String>),
    Network(String, bool),
}

/// A [`MockCluster`] that also records the whole arguments of every import.
#[derive(Default)]
struct Recording {
    cluster: MockCluster,
    seen: Vec<Seen>,
}

impl KubeApi for Recording {
    fn get_node(&mut self, name: &str) -> Result<Node, BackendError> {
        self.cluster.get_node(name)
    }

    fn list_nodes(&mut self) -> Result<Vec<Node>, BackendError> {
        self.cluster.list_nodes()
    }

    fn update_node_pod_cidrs(&mut self, node: &Node, cidrs: &[String]) -> Result<(), BackendError> {
        self.seen
            .push(Seen::SetPodCidrs(node.clone(), cidrs.to_vec()));
        self.cluster.update_node_pod_cidrs(node, cidrs)
    }

    fn update_node_network_unavailable(
        &mut self,
        name: &str,
        unavailable: bool,
    ) -> Result<(), BackendError> {
        self.seen.push(Seen::Network(name.to_owned(), unavailable));
        self.cluster
            .update_node_network_unavailable(name, unavailable)
    }
}

impl CloudAlias for Recording {
    fn alias(&mut self, node: &Node) -> Result<Vec<String>, BackendError> {
        self.seen.push(Seen::Alias(node.clone()));
        self.cluster.alias(node)
    }

    fn add_alias(&mut self, node: &Node, cidrs: &[String]) -> Result<(), BackendError> {
        self.seen.push(Seen::AddAlias(node.clone(), cidrs.to_vec()));
        self.cluster.add_alias(node, cidrs)
    }
}

impl Events for Recording {
    fn emit_node_warning(&mut self, name: &str, reason: &str, message: &str) {
        self.cluster.emit_node_warning(name, reason, message);
    }
}

fn node(name: &str, provider_id: Option<&str>, pod_cidrs: &[&str]) -> Node {
    Node {
        provider_id: provider_id.map(str::to_owned),
        ..Node::new(name, pod_cidrs)
    }
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn imports_receive_the_whole_node_and_ranges_and_keep_nothing_from_earlier_calls() {
    // A long name with a provider id and two ranges, then shorter, id-less and range-less
    // nodes, so that every buffer the host reuses shrinks at some point.
    let long = "node-with-a-rather-long-name-ü-ñ-字";
    let pushed = node(
        long,
        Some("gce://project/zone/vm-1"),
        &["10.0.9.0/24", "fd00:0:0:9::/64"],
    );
    let fresh = node("b", None, &[]);
    let mut cluster = MockCluster::new();
    cluster.add_node(pushed.clone());
    cluster.add_node(fresh.clone());
    let mut plugin: Plugin<Recording> = PluginBuilder::new()
        .no_cache()
        .load_bytes(
            component(),
            Recording {
                cluster,
                seen: Vec::new(),
            },
        )
        .expect("the component loads");
    plugin
        .init(&dual_stack_config(SyncMode::SyncFromCluster), 0)
        .expect("init");
    plugin.backends_mut().seen.clear();

    plugin.update(&pushed, 1).expect("push the node's ranges");
    plugin.update(&fresh, 2).expect("allocate for a new node");

    let ranges = strings(&["10.0.9.0/24", "fd00:0:0:9::/64"]);
    let allocated = strings(&["10.0.0.0/24", "fd00::/64"]);
    assert_eq!(
        plugin.backends().seen,
        [
            Seen::Alias(pushed.clone()),
            Seen::AddAlias(pushed.clone(), ranges),
            Seen::Network(long.to_owned(), false),
            Seen::Alias(fresh.clone()),
            Seen::AddAlias(fresh.clone(), allocated.clone()),
            Seen::SetPodCidrs(fresh.clone(), allocated),
            Seen::Network("b".to_owned(), false),
        ]
    );
}
