//! `delete` through the component boundary: a valid, empty and invalid range on the deleted
//! node object, a pending allocation, an unknown node, and a range another node holds.
//! Deleting makes no cluster or cloud call: only the invalid range emits an event.

use nodeipam_host::mock::{Failure, MockCluster, Op};
use nodeipam_host::{BackendError, Node, Plugin, TickReport};
use nodeipam_tests::call::warning;
use nodeipam_tests::{
    assert_calls, assert_names, capture_logs, cluster_config, node, start, sync_error, used,
};

/// Nodes `a` (10.0.0.0/24) and `b` (10.0.1.0/24), in sync, known from `init`.
fn two_nodes() -> Plugin<MockCluster> {
    let cluster = MockCluster::new()
        .with_node(Node::new("a", &["10.0.0.0/24"]))
        .with_alias("a", &["10.0.0.0/24"])
        .with_node(Node::new("b", &["10.0.1.0/24"]))
        .with_alias("b", &["10.0.1.0/24"]);
    let mut plugin = start(cluster, &cluster_config(), 0);
    let stats = plugin.stats().unwrap();
    assert_eq!((stats.nodes, used(&stats), stats.releases), (2, 2, 0));
    plugin
}

#[test]
fn deleting_a_node_with_a_valid_range_releases_it_and_forgets_the_node() {
    let mut plugin = two_nodes();
    plugin
        .delete(&Node::new("a", &["10.0.0.0/24"]), 10)
        .unwrap();
    assert_calls(&mut plugin, &[]);
    let stats = plugin.stats().unwrap();
    assert_eq!((stats.nodes, used(&stats), stats.releases), (1, 1, 1));
    // Forgotten: only b's resync is left on the schedule.
    assert_eq!(
        plugin.tick(30_000, 0).unwrap(),
        TickReport {
            resynced: 1,
            failed: 0,
            next_due_ms: Some(60_000)
        }
    );
    assert_eq!(
        plugin
            .backends()
            .calls()
            .iter()
            .filter_map(|c| c.node())
            .collect::<Vec<_>>(),
        ["b", "b", "b"],
        "get-node, alias and network of b only"
    );
}

#[test]
fn a_released_range_is_handed_out_again() {
    let mut plugin = start(MockCluster::new(), &cluster_config(), 0);
    // Fill the /16 but one range, then free one in the middle: it is the only one left.
    for i in 0..256 {
        let name = format!("n{i:03}");
        plugin
            .backends_mut()
            .add_node(Node::new(name.as_str(), &[]));
        plugin.update(&node(&plugin, &name), 1).unwrap();
    }
    assert_eq!(used(&plugin.stats().unwrap()), 256);
    let freed = node(&plugin, "n100");
    assert_eq!(freed.pod_cidrs, ["10.0.100.0/24"]);
    plugin.backends_mut().remove_node("n100");
    plugin.delete(&freed, 2).unwrap();
    plugin.backends_mut().add_node(Node::new("new", &[]));
    plugin.update(&node(&plugin, "new"), 3).unwrap();
    assert_eq!(plugin.backends().pod_cidrs("new"), ["10.0.100.0/24"]);
}

#[test]
fn deleting_a_node_with_an_empty_range_releases_its_pending_allocation() {
    let mut plugin = start(MockCluster::new(), &cluster_config(), 0);
    plugin.backends_mut().add_node(Node::new("a", &[]));
    plugin.backends_mut().fail(Failure::new(
        Op::AddAlias,
        BackendError::Unavailable("cloud down".into()),
    ));
    // The alias write may have landed: the range stays held for a, pending.
    let error = sync_error(plugin.update(&node(&plugin, "a"), 10));
    assert_eq!(
        error,
        nodeipam_host::SyncError::Host(BackendError::Unavailable("cloud down".into()))
    );
    let stats = plugin.stats().unwrap();
    assert_eq!(
        (used(&stats), stats.releases),
        (1, 0),
        "pending, not released"
    );
    plugin.backends_mut().take_calls();

    plugin.delete(&Node::new("a", &[]), 20).unwrap();
    assert_calls(&mut plugin, &[]);
    let stats = plugin.stats().unwrap();
    assert_eq!((stats.nodes, used(&stats), stats.releases), (0, 0, 1));
}

#[test]
fn deleting_a_node_with_an_empty_range_that_holds_nothing_releases_nothing() {
    let mut plugin = two_nodes();
    plugin.backends_mut().add_node(Node::new("c", &[]));
    // c becomes known through an update that fails before anything is allocated.
    plugin.backends_mut().fail(Failure::new(
        Op::Alias,
        BackendError::Unavailable("cloud down".into()),
    ));
    let _ = sync_error(plugin.update(&node(&plugin, "c"), 5));
    plugin.backends_mut().take_calls();
    assert_eq!(plugin.stats().unwrap().nodes, 3);

    plugin.delete(&Node::new("c", &[]), 10).unwrap();
    assert_calls(&mut plugin, &[]);
    let stats = plugin.stats().unwrap();
    assert_eq!((stats.nodes, used(&stats), stats.releases), (2, 2, 0));
}

#[test]
fn deleting_a_node_with_an_invalid_range_warns_invalid_pod_cidr_and_is_not_an_error() {
    let mut plugin = two_nodes();
    plugin.delete(&Node::new("a", &["not-a-cidr"]), 10).unwrap();
    let message = "node \"a\": pod range \"not-a-cidr\": not a cidr (expected address/prefix, \
                   e.g. 10.0.0.0/24)";
    assert_calls(
        &mut plugin,
        &[warning("a", "CloudCIDRAllocatorInvalidPodCIDR", message)],
    );
    assert_names(message, &["\"a\"", "\"not-a-cidr\""]);
    // The range the plugin held for a is still released, and a is forgotten.
    let stats = plugin.stats().unwrap();
    assert_eq!((stats.nodes, used(&stats), stats.releases), (1, 1, 1));
}

#[test]
fn deleting_a_node_with_an_empty_string_range_warns_naming_it() {
    let mut plugin = two_nodes();
    plugin.delete(&Node::new("a", &[""]), 10).unwrap();
    assert_calls(
        &mut plugin,
        &[warning(
            "a",
            "CloudCIDRAllocatorInvalidPodCIDR",
            "node \"a\": pod range \"\": empty, expected address/prefix",
        )],
    );
}

#[test]
fn deleting_an_unknown_node_releases_nothing_and_logs_it() {
    let mut plugin = two_nodes();
    // It claims a's range: the range belongs to a, so nothing may be released.
    let (result, logs) = capture_logs(|| plugin.delete(&Node::new("ghost", &["10.0.0.0/24"]), 10));
    result.unwrap();
    assert_calls(&mut plugin, &[]);
    let stats = plugin.stats().unwrap();
    assert_eq!((stats.nodes, used(&stats), stats.releases), (2, 2, 0));
    assert!(
        logs.iter().any(
            |l| l.message == "deleted node is not known: releasing nothing"
                && l.fields == "node=\"ghost\""
        ),
        "{logs:?}"
    );
}

#[test]
fn deleting_a_node_whose_object_claims_another_nodes_range_keeps_that_range() {
    let mut plugin = two_nodes();
    let (result, logs) = capture_logs(|| plugin.delete(&Node::new("b", &["10.0.0.0/24"]), 10));
    result.unwrap();
    assert_calls(&mut plugin, &[]);
    let stats = plugin.stats().unwrap();
    // b's own range (held for b) is released; a's is not.
    assert_eq!((stats.nodes, used(&stats), stats.releases), (1, 1, 1));
    assert!(
        logs.iter().any(
            |l| l.message == "not releasing a range that another held range uses"
                && l.fields.contains("node=\"b\"")
                && l.fields.contains("range=10.0.0.0/24")
                && l.fields.contains("holder=\"a\"")
        ),
        "{logs:?}"
    );
    plugin.backends_mut().add_node(Node::new("c", &[]));
    plugin.update(&node(&plugin, "c"), 20).unwrap();
    assert_ne!(
        plugin.backends().pod_cidrs("c"),
        ["10.0.0.0/24"],
        "a's range stays a's"
    );
}

#[test]
fn a_node_gone_from_the_cluster_is_forgotten_at_its_resync() {
    let mut plugin = two_nodes();
    plugin.backends_mut().remove_node("a");
    let report = plugin.tick(30_000, 0).unwrap();
    assert_eq!((report.resynced, report.failed), (2, 0));
    let stats = plugin.stats().unwrap();
    assert_eq!((stats.nodes, used(&stats), stats.releases), (1, 1, 1));
}

// ---- ranges of another size than the node mask ----

#[test]
fn deleting_one_half_of_a_node_sized_slot_keeps_the_other_half_occupied() {
    // Two nodes with /25 ranges (e.g. from an earlier node mask) share the /24 slot 10.0.0.0.
    let cluster = MockCluster::new()
        .with_node(Node::new("p", &["10.0.0.0/25"]))
        .with_node(Node::new("q", &["10.0.0.128/25"]));
    let mut plugin = start(cluster, &cluster_config(), 0);
    let p = node(&plugin, "p");
    plugin.backends_mut().remove_node("p");
    plugin.delete(&p, 1).unwrap();
    plugin.backends_mut().add_node(Node::new("c", &[]));
    plugin.update(&node(&plugin, "c"), 2).unwrap();
    // c must not get 10.0.0.0/24, which contains q's 10.0.0.128/25.
    nodeipam_tests::assert_disjoint(plugin.backends());
}

#[test]
fn a_range_overlapping_another_nodes_larger_range_is_refused() {
    let cluster = MockCluster::new()
        .with_node(Node::new("big", &["10.0.0.0/23"]))
        .with_alias("big", &["10.0.0.0/23"]);
    let mut plugin = start(cluster, &cluster_config(), 0);
    plugin
        .backends_mut()
        .add_node(Node::new("s", &["10.0.1.0/24"]));
    // Accepting it would push 10.0.1.0/24 as s's alias, and deleting s would then free it
    // for the next allocation while big still has it.
    let error = sync_error(plugin.update(&node(&plugin, "s"), 1));
    assert!(
        matches!(error, nodeipam_host::SyncError::InvalidCidr(_)),
        "{error:?}"
    );
    assert_names(&error.to_string(), &["\"s\"", "10.0.1.0/24", "\"big\""]);
    assert!(plugin.backends().alias_of("s").is_empty());
}
