//! Start-up through the component boundary: `init` occupies what the cluster (and, in
//! sync-from-cluster, the cloud) already uses before anything is allocated, skips and logs
//! what it cannot use, fails as a whole when an alias is unknown, and every other export
//! before a successful `init` is `not-initialized`.

use nodeipam_host::mock::{Failure, MockCluster, Op};
use nodeipam_host::{BackendError, Node, Plugin, Stats, SyncError, TickReport};
use nodeipam_tests::call::{alias, list_nodes};
use nodeipam_tests::{
    assert_calls, assert_converged, assert_names, capture_logs, cloud_config, cluster_config, load,
    node, start, sync_error, used,
};

/// Add `name` to the cluster without a range and update it at `now`.
fn add_and_update(plugin: &mut Plugin<MockCluster>, name: &str, now: u64) {
    plugin.backends_mut().add_node(Node::new(name, &[]));
    plugin
        .update(&node(plugin, name), now)
        .unwrap_or_else(|e| panic!("update {name}: {e}"));
}

#[test]
fn init_occupies_existing_ranges_and_the_next_allocations_avoid_them() {
    let cluster = MockCluster::new()
        .with_node(Node::new("a", &["10.0.0.0/24"]))
        .with_node(Node::new("b", &["10.0.1.0/24"]))
        .with_node(Node::new("c", &["10.0.3.0/24"]));
    let mut plugin = load(cluster);
    plugin.init(&cluster_config(), 0).unwrap();
    // Every node has a range: no alias is looked up.
    assert_calls(&mut plugin, &[list_nodes()]);
    let stats = plugin.stats().unwrap();
    assert_eq!((stats.nodes, used(&stats), stats.allocations), (3, 3, 3));

    add_and_update(&mut plugin, "d", 10);
    add_and_update(&mut plugin, "e", 10);
    assert_eq!(plugin.backends().pod_cidrs("d"), ["10.0.2.0/24"]);
    assert_eq!(plugin.backends().pod_cidrs("e"), ["10.0.4.0/24"]);
    let stats = plugin.stats().unwrap();
    // d skipped 10.0.0.0 and 10.0.1.0; e skipped 10.0.3.0.
    assert_eq!(
        (used(&stats), stats.allocations, stats.allocation_tries),
        (5, 5, 3)
    );
}

#[test]
fn init_schedules_every_nodes_first_resync_one_resync_later() {
    let cluster = MockCluster::new()
        .with_node(Node::new("a", &["10.0.0.0/24"]))
        .with_alias("a", &["10.0.0.0/24"]);
    let mut plugin = start(cluster, &cluster_config(), 5_000);
    assert_eq!(
        plugin.tick(34_999, 0).unwrap(),
        TickReport {
            resynced: 0,
            failed: 0,
            next_due_ms: Some(35_000)
        }
    );
    assert_calls(&mut plugin, &[]);
    assert_eq!(plugin.tick(35_000, 0).unwrap().resynced, 1);
}

#[test]
fn init_skips_and_logs_a_node_whose_range_does_not_parse() {
    let cluster = MockCluster::new()
        .with_node(Node::new("bad", &["10.0.0.0/99"]))
        .with_node(Node::new("far", &["192.168.0.0/24"]))
        .with_node(Node::new("good", &["10.0.1.0/24"]));
    let mut plugin = load(cluster);
    let (result, logs) = capture_logs(|| plugin.init(&cluster_config(), 0));
    result.unwrap();
    let skipped: Vec<_> = logs
        .iter()
        .filter(|l| l.message == "skipping a range at start")
        .collect();
    assert_eq!(skipped.len(), 2, "{logs:?}");
    assert_eq!(skipped[0].level, tracing::Level::WARN);
    assert_names(&skipped[0].fields, &["node=\"bad\"", "\"10.0.0.0/99\""]);
    assert_names(
        &skipped[1].fields,
        &["node=\"far\"", "192.168.0.0/24", "10.0.0.0/16"],
    );
    let stats = plugin.stats().unwrap();
    assert_eq!(
        (stats.nodes, used(&stats)),
        (3, 1),
        "only good's range is occupied"
    );

    // Not fatal: the others are served; the bad node fails on its own, naming itself.
    add_and_update(&mut plugin, "new", 10);
    assert_eq!(plugin.backends().pod_cidrs("new"), ["10.0.0.0/24"]);
    let error = sync_error(plugin.update(&node(&plugin, "bad"), 10));
    assert!(matches!(error, SyncError::InvalidCidr(_)), "{error:?}");
    assert_names(&error.to_string(), &["\"bad\"", "\"10.0.0.0/99\""]);
}

#[test]
fn init_in_sync_from_cluster_occupies_the_aliases_of_nodes_without_a_range() {
    let cluster = MockCluster::new()
        .with_node(Node::new("half", &[]))
        .with_alias("half", &["10.0.0.0/24"])
        .with_node(Node::new("bare", &[]))
        .with_node(Node::new("b", &["10.0.1.0/24"]))
        .with_alias("b", &["10.0.1.0/24"]);
    let mut plugin = load(cluster);
    plugin.init(&cluster_config(), 0).unwrap();
    // Only the nodes without a range, in the cluster's order.
    assert_calls(&mut plugin, &[list_nodes(), alias("bare"), alias("half")]);
    let stats = plugin.stats().unwrap();
    assert_eq!(used(&stats), 2);

    add_and_update(&mut plugin, "c", 10);
    assert_eq!(
        plugin.backends().pod_cidrs("c"),
        ["10.0.2.0/24"],
        "skips half's alias"
    );
    plugin.update(&node(&plugin, "bare"), 10).unwrap();
    assert_eq!(plugin.backends().pod_cidrs("bare"), ["10.0.3.0/24"]);
    plugin.update(&node(&plugin, "half"), 10).unwrap();
    plugin.update(&node(&plugin, "b"), 10).unwrap();
    assert_eq!(
        plugin.backends().pod_cidrs("half"),
        ["10.0.0.0/24"],
        "completed"
    );
    assert_converged(&mut plugin);
}

#[test]
fn init_in_sync_from_cloud_looks_up_no_alias() {
    let mut cluster = MockCluster::new()
        .with_node(Node::new("a", &[]))
        .with_alias("a", &["10.0.0.0/24"]);
    cluster.forbid(Op::Alias);
    let mut plugin = load(cluster);
    plugin.init(&cloud_config(), 0).unwrap();
    plugin.backends().assert_clean();
    assert_calls(&mut plugin, &[list_nodes()]);
    assert_eq!(used(&plugin.stats().unwrap()), 0);
}

#[test]
fn init_treats_an_alias_lookup_answering_not_found_as_no_alias() {
    let cluster = MockCluster::new()
        .with_node(Node::new("a", &[]))
        .with_failure(Failure::new(
            Op::Alias,
            BackendError::NotFound("no vm".into()),
        ));
    let mut plugin = load(cluster);
    plugin.init(&cluster_config(), 0).unwrap();
    assert_eq!(plugin.stats().unwrap().nodes, 1);
}

#[test]
fn init_fails_when_an_alias_lookup_is_unavailable_and_update_is_then_not_initialized() {
    let down = BackendError::Unavailable("cloud down".into());
    let cluster = MockCluster::new()
        .with_node(Node::new("a", &["10.0.0.0/24"]))
        .with_node(Node::new("b", &[]))
        .with_failure(Failure::new(Op::Alias, down.clone()).node("b"));
    let mut plugin = load(cluster);
    let error = sync_error(plugin.init(&cluster_config(), 0));
    assert_eq!(error, SyncError::Host(down));
    assert_eq!(plugin.config(), None);
    assert_eq!(plugin.recoveries(), 0, "a value, not a trap");

    assert_eq!(
        sync_error(plugin.update(&node(&plugin, "b"), 10)),
        SyncError::NotInitialized
    );
    assert_eq!(plugin.tick(60_000, 0).unwrap(), TickReport::default());
    assert_eq!(plugin.stats().unwrap(), Stats::default());
    // Nothing was allocated while b's alias was unknown.
    assert!(plugin.backends().calls_of(Op::AddAlias).next().is_none());

    // Once the cloud answers, init succeeds.
    plugin.init(&cluster_config(), 20).unwrap();
    assert_eq!(plugin.stats().unwrap().nodes, 2);
}

#[test]
fn exports_before_init_are_not_initialized_and_call_nothing() {
    let mut plugin = load(MockCluster::new().with_node(Node::new("a", &["10.0.0.0/24"])));
    let a = node(&plugin, "a");
    assert_eq!(sync_error(plugin.update(&a, 0)), SyncError::NotInitialized);
    assert_eq!(sync_error(plugin.delete(&a, 0)), SyncError::NotInitialized);
    assert_eq!(plugin.tick(0, 0).unwrap(), TickReport::default());
    assert_eq!(plugin.stats().unwrap(), Stats::default());
    assert_calls(&mut plugin, &[]);
    assert_eq!(plugin.recoveries(), 0);
}

#[test]
fn init_again_starts_over_and_a_failed_init_leaves_it_uninitialised() {
    let cluster = MockCluster::new().with_node(Node::new("a", &["10.0.0.0/24"]));
    let mut plugin = start(cluster, &cluster_config(), 0);
    add_and_update(&mut plugin, "b", 1);
    assert_eq!(used(&plugin.stats().unwrap()), 2);

    // Again, over another cluster CIDR: the old allocator is gone.
    let other = nodeipam_host::Config::new(
        nodeipam_host::SyncMode::SyncFromCluster,
        vec![nodeipam_host::ClusterCidr::new("10.0.0.0/8", 24)],
    );
    plugin.init(&other, 2).unwrap();
    let stats = plugin.stats().unwrap();
    assert_eq!(
        (
            stats.sets[0].cidr.as_str(),
            stats.sets[0].max,
            stats.sets[0].used,
            stats.nodes
        ),
        ("10.0.0.0/8", 65_536, 2, 2)
    );

    let mut bad = other.clone();
    bad.cluster_cidrs[0].node_mask_size = 4;
    assert!(matches!(
        sync_error(plugin.init(&bad, 3)),
        SyncError::InvalidConfig(_)
    ));
    assert_eq!(
        sync_error(plugin.update(&node(&plugin, "a"), 4)),
        SyncError::NotInitialized
    );
    assert_eq!(plugin.stats().unwrap(), Stats::default());
}

#[test]
fn a_restart_hands_out_nothing_a_node_or_alias_already_has() {
    // Ranges on nodes, a half-finished allocation (alias only), a node to allocate for.
    let cluster = MockCluster::new()
        .with_nodes((0..4).map(|i| Node::new(format!("n{i}"), &[&format!("10.0.{i}.0/24")])))
        .with_node(Node::new("half", &[]))
        .with_alias("half", &["10.0.4.0/24"]);
    let mut plugin = start(cluster, &cluster_config(), 0);
    add_and_update(&mut plugin, "x", 1);
    let mut plugin = nodeipam_tests::restart(plugin, &cluster_config(), 2);
    for i in 0..4 {
        add_and_update(&mut plugin, &format!("new{i}"), 3);
    }
    let report = plugin.tick(30_002, 0).unwrap();
    assert_eq!(report.failed, 0, "{report:?}");
    assert_converged(&mut plugin);
}
