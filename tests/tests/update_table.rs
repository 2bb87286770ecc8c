//! DESIGN.md's update table, row by row, in both modes, through the component boundary: the
//! exact calls each case makes, its result, its event and the allocator's counters.
//!
//! Set-up: 10.0.0.0/16 by /24; the node under test is `a`, added to the cluster after `init`
//! unless the case is about `init`'s occupation, so each row starts from an empty allocator.

use nodeipam_host::mock::{MockCluster, Op};
use nodeipam_host::{Node, SyncError, SyncMode};
use nodeipam_tests::call::{add_alias, alias, network_available, set_pod_cidrs, warning};
use nodeipam_tests::{
    assert_calls, assert_in_sync, cluster_config, config, node, start, sync_error, used,
};

const MISMATCH: &str = "CloudCIDRAllocatorMismatch";
const INVALID_MODE: &str = "CloudCIDRAllocatorInvalidMode";

/// A started plugin in `mode` whose cluster then gets node `a` with `ranges` and `alias`.
fn with_node_a(
    mode: SyncMode,
    ranges: &[&str],
    alias: &[&str],
) -> nodeipam_host::Plugin<MockCluster> {
    let mut plugin = start(MockCluster::new(), &config(mode), 0);
    let cluster = plugin.backends_mut();
    cluster.add_node(Node::new("a", ranges));
    cluster.set_alias("a", nodeipam_tests::cidrs(alias));
    plugin
}

fn invalid_mode_message(mode: &str, action: &str, needed: &str) -> String {
    format!("node \"a\": cannot {action} in {mode} mode (that is done in {needed} mode)")
}

// ---- sync-from-cluster ----

#[test]
fn cluster_none_none_allocates_pushes_the_alias_sets_the_node_and_marks_the_network() {
    let mut plugin = with_node_a(SyncMode::SyncFromCluster, &[], &[]);
    plugin.update(&node(&plugin, "a"), 10).unwrap();
    assert_calls(
        &mut plugin,
        &[
            alias("a"),
            add_alias("a", &["10.0.0.0/24"]),
            set_pod_cidrs("a", &["10.0.0.0/24"]),
            network_available("a"),
        ],
    );
    assert_in_sync(plugin.backends(), "a");
    let stats = plugin.stats().unwrap();
    assert_eq!(
        (stats.nodes, used(&stats), stats.allocations, stats.releases),
        (1, 1, 1, 0)
    );
    assert!(plugin.backends().events().is_empty());
}

#[test]
fn cluster_none_some_half_finished_allocation_found_at_init_is_completed() {
    // A previous instance added the alias, then failed to patch the node: init occupies the
    // alias for `a`, and the update completes the allocation instead of failing.
    let cluster = MockCluster::new()
        .with_node(Node::new("a", &[]))
        .with_alias("a", &["10.0.7.0/24"]);
    let mut plugin = start(cluster, &cluster_config(), 0);
    assert_eq!(used(&plugin.stats().unwrap()), 1, "init occupied the alias");
    plugin.update(&node(&plugin, "a"), 10).unwrap();
    assert_calls(
        &mut plugin,
        &[
            alias("a"),
            set_pod_cidrs("a", &["10.0.7.0/24"]),
            network_available("a"),
        ],
    );
    assert_in_sync(plugin.backends(), "a");
    let stats = plugin.stats().unwrap();
    assert_eq!((used(&stats), stats.allocations, stats.releases), (1, 1, 0));
}

#[test]
fn cluster_none_some_free_node_sized_alias_is_completed() {
    let mut plugin = with_node_a(SyncMode::SyncFromCluster, &[], &["10.0.9.0/24"]);
    plugin.update(&node(&plugin, "a"), 10).unwrap();
    assert_calls(
        &mut plugin,
        &[
            alias("a"),
            set_pod_cidrs("a", &["10.0.9.0/24"]),
            network_available("a"),
        ],
    );
    assert_in_sync(plugin.backends(), "a");
    assert_eq!(used(&plugin.stats().unwrap()), 1);
}

/// In sync-from-cluster, an alias that is not a half-finished allocation fails with
/// invalid-mode and its event, and changes nothing.
fn assert_cluster_none_some_is_invalid_mode(plugin: &mut nodeipam_host::Plugin<MockCluster>) {
    let used_before = used(&plugin.stats().unwrap());
    let error = sync_error(plugin.update(&node(plugin, "a"), 10));
    let message = invalid_mode_message(
        "sync-from-cluster",
        "copy the cloud alias to the node",
        "sync-from-cloud",
    );
    assert_eq!(error, SyncError::InvalidMode(message.clone()));
    assert_calls(plugin, &[alias("a"), warning("a", INVALID_MODE, &message)]);
    assert!(plugin.backends().pod_cidrs("a").is_empty());
    assert_eq!(used(&plugin.stats().unwrap()), used_before);
}

#[test]
fn cluster_none_some_alias_held_by_another_node_is_invalid_mode() {
    let cluster = MockCluster::new().with_node(Node::new("b", &["10.0.3.0/24"]));
    let mut plugin = start(cluster, &cluster_config(), 0);
    plugin.backends_mut().add_node(Node::new("a", &[]));
    plugin
        .backends_mut()
        .set_alias("a", nodeipam_tests::cidrs(&["10.0.3.0/24"]));
    assert_cluster_none_some_is_invalid_mode(&mut plugin);
}

#[test]
fn cluster_none_some_alias_larger_than_a_node_range_is_invalid_mode() {
    let mut plugin = with_node_a(SyncMode::SyncFromCluster, &[], &["10.0.16.0/20"]);
    assert_cluster_none_some_is_invalid_mode(&mut plugin);
}

#[test]
fn cluster_none_some_alias_outside_the_cluster_cidr_is_invalid_mode() {
    let mut plugin = with_node_a(SyncMode::SyncFromCluster, &[], &["192.168.1.0/24"]);
    assert_cluster_none_some_is_invalid_mode(&mut plugin);
}

#[test]
fn cluster_some_none_occupies_the_range_pushes_it_and_marks_the_network() {
    let mut plugin = with_node_a(SyncMode::SyncFromCluster, &["10.0.4.0/24"], &[]);
    plugin.update(&node(&plugin, "a"), 10).unwrap();
    assert_calls(
        &mut plugin,
        &[
            alias("a"),
            add_alias("a", &["10.0.4.0/24"]),
            network_available("a"),
        ],
    );
    assert_in_sync(plugin.backends(), "a");
    let stats = plugin.stats().unwrap();
    assert_eq!((used(&stats), stats.allocations), (1, 1), "occupied");

    // The occupied range is never handed out: the next allocations skip it.
    for i in 0..8 {
        let name = format!("n{i}");
        plugin
            .backends_mut()
            .add_node(Node::new(name.as_str(), &[]));
        plugin.update(&node(&plugin, &name), 20).unwrap();
        assert_ne!(
            plugin.backends().pod_cidrs(&name),
            ["10.0.4.0/24"],
            "{name}"
        );
    }
}

#[test]
fn cluster_some_some_equal_marks_a_new_nodes_network_once_then_does_nothing() {
    let mut plugin = with_node_a(
        SyncMode::SyncFromCluster,
        &["10.0.4.0/24"],
        &["10.0.4.0/24"],
    );
    // First sight of the node: its network was never marked by this instance.
    plugin.update(&node(&plugin, "a"), 10).unwrap();
    assert_calls(&mut plugin, &[alias("a"), network_available("a")]);

    let cluster = plugin.backends_mut();
    cluster.forbid(Op::AddAlias);
    cluster.forbid(Op::UpdateNodePodCidrs);
    cluster.forbid(Op::UpdateNodeNetworkUnavailable);
    cluster.forbid(Op::EmitNodeWarning);
    plugin.update(&node(&plugin, "a"), 20).unwrap();
    assert_calls(&mut plugin, &[alias("a")]);
    plugin.backends().assert_clean();
    assert_eq!(used(&plugin.stats().unwrap()), 1);
}

#[test]
fn cluster_some_some_different_warns_mismatch_and_changes_neither() {
    let mut plugin = with_node_a(
        SyncMode::SyncFromCluster,
        &["10.0.4.0/24"],
        &["10.0.5.0/24"],
    );
    plugin.update(&node(&plugin, "a"), 10).unwrap();
    assert_calls(
        &mut plugin,
        &[
            alias("a"),
            warning(
                "a",
                MISMATCH,
                "node \"a\" has pod ranges 10.0.4.0/24 but its cloud alias is 10.0.5.0/24: \
                 not changing either",
            ),
        ],
    );
    let cluster = plugin.backends();
    assert_eq!(cluster.pod_cidrs("a"), ["10.0.4.0/24"]);
    assert_eq!(cluster.alias_of("a"), ["10.0.5.0/24"]);
    assert_eq!(cluster.network_unavailable("a"), None);
}

// ---- sync-from-cloud ----

#[test]
fn cloud_none_none_is_invalid_mode_and_allocates_nothing() {
    let mut plugin = with_node_a(SyncMode::SyncFromCloud, &[], &[]);
    let error = sync_error(plugin.update(&node(&plugin, "a"), 10));
    let message = invalid_mode_message("sync-from-cloud", "allocate a range", "sync-from-cluster");
    assert_eq!(error, SyncError::InvalidMode(message.clone()));
    assert_calls(
        &mut plugin,
        &[alias("a"), warning("a", INVALID_MODE, &message)],
    );
    let stats = plugin.stats().unwrap();
    assert_eq!((used(&stats), stats.allocations), (0, 0));
}

#[test]
fn cloud_none_some_copies_the_alias_to_the_node_and_marks_the_network() {
    let mut plugin = with_node_a(SyncMode::SyncFromCloud, &[], &["10.0.6.0/24"]);
    plugin.update(&node(&plugin, "a"), 10).unwrap();
    assert_calls(
        &mut plugin,
        &[
            alias("a"),
            set_pod_cidrs("a", &["10.0.6.0/24"]),
            network_available("a"),
        ],
    );
    assert_in_sync(plugin.backends(), "a");
    assert_eq!(used(&plugin.stats().unwrap()), 1, "the alias is occupied");
}

#[test]
fn cloud_some_none_is_invalid_mode_and_pushes_nothing() {
    let mut plugin = with_node_a(SyncMode::SyncFromCloud, &["10.0.4.0/24"], &[]);
    let error = sync_error(plugin.update(&node(&plugin, "a"), 10));
    let message = invalid_mode_message(
        "sync-from-cloud",
        "add the node's range as a cloud alias",
        "sync-from-cluster",
    );
    assert_eq!(error, SyncError::InvalidMode(message.clone()));
    assert_calls(
        &mut plugin,
        &[alias("a"), warning("a", INVALID_MODE, &message)],
    );
    assert!(plugin.backends().alias_of("a").is_empty());
}

#[test]
fn cloud_some_some_equal_marks_a_new_nodes_network_once_then_does_nothing() {
    let mut plugin = with_node_a(SyncMode::SyncFromCloud, &["10.0.4.0/24"], &["10.0.4.0/24"]);
    plugin.update(&node(&plugin, "a"), 10).unwrap();
    assert_calls(&mut plugin, &[alias("a"), network_available("a")]);
    plugin.update(&node(&plugin, "a"), 20).unwrap();
    assert_calls(&mut plugin, &[alias("a")]);
    assert_eq!(used(&plugin.stats().unwrap()), 1);
}

#[test]
fn cloud_some_some_different_warns_mismatch_and_changes_neither() {
    let mut plugin = with_node_a(SyncMode::SyncFromCloud, &["10.0.4.0/24"], &["10.0.5.0/24"]);
    plugin.update(&node(&plugin, "a"), 10).unwrap();
    assert_calls(
        &mut plugin,
        &[
            alias("a"),
            warning(
                "a",
                MISMATCH,
                "node \"a\" has pod ranges 10.0.4.0/24 but its cloud alias is 10.0.5.0/24: \
                 not changing either",
            ),
        ],
    );
    assert_eq!(plugin.backends().pod_cidrs("a"), ["10.0.4.0/24"]);
    assert_eq!(plugin.backends().alias_of("a"), ["10.0.5.0/24"]);
}

// ---- both modes ----

#[test]
fn a_resync_rereads_the_node_from_the_cluster_before_the_update() {
    for mode in [SyncMode::SyncFromCluster, SyncMode::SyncFromCloud] {
        let cluster = MockCluster::new()
            .with_node(Node::new("a", &["10.0.4.0/24"]))
            .with_alias("a", &["10.0.4.0/24"]);
        let mut plugin = start(cluster, &config(mode), 0);
        let report = plugin.tick(30_000, 0).unwrap();
        assert_eq!((report.resynced, report.failed), (1, 0), "{mode:?}");
        assert_calls(
            &mut plugin,
            &[
                nodeipam_tests::call::get_node("a"),
                alias("a"),
                network_available("a"),
            ],
        );
    }
}

#[test]
fn an_alias_lookup_answering_not_found_means_no_alias() {
    let mut plugin = with_node_a(SyncMode::SyncFromCluster, &[], &[]);
    plugin
        .backends_mut()
        .fail(nodeipam_host::mock::Failure::new(
            Op::Alias,
            nodeipam_host::BackendError::NotFound("no vm alias".into()),
        ));
    plugin.update(&node(&plugin, "a"), 10).unwrap();
    assert_calls(
        &mut plugin,
        &[
            alias("a"),
            add_alias("a", &["10.0.0.0/24"]),
            set_pod_cidrs("a", &["10.0.0.0/24"]),
            network_available("a"),
        ],
    );
}

#[test]
fn cluster_some_some_different_alias_is_not_handed_to_another_node() {
    let cluster = MockCluster::new()
        .with_node(Node::new("a", &["10.0.5.0/24"]))
        .with_alias("a", &["10.0.0.0/24"]);
    let mut plugin = start(cluster, &cluster_config(), 0);
    plugin.update(&node(&plugin, "a"), 1).unwrap();
    plugin.backends_mut().add_node(Node::new("b", &[]));
    plugin.update(&node(&plugin, "b"), 2).unwrap();
    // b must not get 10.0.0.0/24: it is still a's VM's alias.
    nodeipam_tests::assert_disjoint(plugin.backends());
}
