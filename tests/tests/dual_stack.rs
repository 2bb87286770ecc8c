//! Dual-stack end to end (10.0.0.0/16 by /24 and fd00::/48 by /64 unless a case says
//! otherwise): one range per family in config order, ranges and aliases compared as sets,
//! all-or-nothing allocation, start-up, delete and convergence.

use nodeipam_host::mock::{Failure, MockCluster, Op};
use nodeipam_host::{BackendError, ClusterCidr, Config, Node, Plugin, SyncError, SyncMode};
use nodeipam_tests::call::{add_alias, alias, network_available, set_pod_cidrs, warning};
use nodeipam_tests::{
    assert_calls, assert_converged, assert_names, cidrs, dual_stack_config, node, restart, start,
    sync_error, take_calls, used,
};

const V4: &str = "10.0.0.0/24";
const V6: &str = "fd00::/64";

fn cluster_dual() -> Config {
    dual_stack_config(SyncMode::SyncFromCluster)
}

/// A started dual-stack plugin whose cluster then gets `a` with `ranges` and `alias`.
fn with_node_a(config: &Config, ranges: &[&str], alias: &[&str]) -> Plugin<MockCluster> {
    let mut plugin = start(MockCluster::new(), config, 0);
    plugin.backends_mut().add_node(Node::new("a", ranges));
    plugin.backends_mut().set_alias("a", cidrs(alias));
    plugin
}

fn add_and_update(
    plugin: &mut Plugin<MockCluster>,
    name: &str,
    now: u64,
) -> Result<(), nodeipam_host::Error> {
    plugin.backends_mut().add_node(Node::new(name, &[]));
    plugin.update(&node(plugin, name), now)
}

#[test]
fn allocation_gives_one_range_per_family_in_config_order() {
    let mut plugin = with_node_a(&cluster_dual(), &[], &[]);
    plugin.update(&node(&plugin, "a"), 10).unwrap();
    assert_calls(
        &mut plugin,
        &[
            alias("a"),
            add_alias("a", &[V4, V6]),
            set_pod_cidrs("a", &[V4, V6]),
            network_available("a"),
        ],
    );
    let stats = plugin.stats().unwrap();
    assert_eq!(
        stats
            .sets
            .iter()
            .map(|s| (s.cidr.as_str(), s.max, s.used))
            .collect::<Vec<_>>(),
        [("10.0.0.0/16", 256, 1), ("fd00::/48", 65_536, 1)]
    );
    assert_eq!(stats.allocations, 2);

    add_and_update(&mut plugin, "b", 20).unwrap();
    assert_eq!(
        plugin.backends().pod_cidrs("b"),
        ["10.0.1.0/24", "fd00:0:0:1::/64"]
    );
    assert_converged(&mut plugin);
}

#[test]
fn allocation_follows_the_config_order_ipv6_first() {
    let config = Config::new(
        SyncMode::SyncFromCluster,
        vec![
            ClusterCidr::new("fd00::/48", 64),
            ClusterCidr::new("10.0.0.0/16", 24),
        ],
    );
    let mut plugin = with_node_a(&config, &[], &[]);
    plugin.update(&node(&plugin, "a"), 10).unwrap();
    assert_eq!(plugin.backends().pod_cidrs("a"), [V6, V4]);
    assert_eq!(plugin.backends().alias_of("a"), [V6, V4]);
}

#[test]
fn ranges_and_aliases_in_another_order_are_equal_sets() {
    let mut plugin = with_node_a(&cluster_dual(), &[V6, V4], &[V4, V6]);
    plugin.update(&node(&plugin, "a"), 10).unwrap();
    assert_calls(&mut plugin, &[alias("a"), network_available("a")]);
    assert!(plugin.backends().events().is_empty());
    assert_eq!(used(&plugin.stats().unwrap()), 2);
}

#[test]
fn ranges_differing_in_one_family_are_a_mismatch_naming_both_sets() {
    let mut plugin = with_node_a(&cluster_dual(), &[V4, V6], &[V4, "fd00:0:0:1::/64"]);
    plugin.update(&node(&plugin, "a"), 10).unwrap();
    assert_calls(
        &mut plugin,
        &[
            alias("a"),
            warning(
                "a",
                "CloudCIDRAllocatorMismatch",
                "node \"a\" has pod ranges 10.0.0.0/24,fd00::/64 but its cloud alias is \
                 10.0.0.0/24,fd00:0:0:1::/64: not changing either",
            ),
        ],
    );
}

#[test]
fn exhaustion_of_the_second_family_releases_the_first() {
    // fd00::/63 holds two /64s.
    let config = Config::new(
        SyncMode::SyncFromCluster,
        vec![
            ClusterCidr::new("10.0.0.0/16", 24),
            ClusterCidr::new("fd00::/63", 64),
        ],
    );
    let mut plugin = start(MockCluster::new(), &config, 0);
    add_and_update(&mut plugin, "a", 1).unwrap();
    add_and_update(&mut plugin, "b", 1).unwrap();
    take_calls(&mut plugin);

    let error = sync_error(add_and_update(&mut plugin, "c", 2));
    assert_eq!(
        error,
        SyncError::Exhausted(
            "node \"c\": cluster cidr fd00::/63 has no free node range left".into()
        )
    );
    assert_calls(&mut plugin, &[alias("c")]);
    let stats = plugin.stats().unwrap();
    assert_eq!(
        (
            stats.sets[0].used,
            stats.sets[1].used,
            stats.allocations,
            stats.releases
        ),
        (2, 2, 5, 1),
        "c's IPv4 range was allocated, then released"
    );

    // Deleting a frees one of each; c's retry takes them.
    let a = node(&plugin, "a");
    plugin.backends_mut().remove_node("a");
    plugin.delete(&a, 3).unwrap();
    let report = plugin.tick(2 + 250, 0).unwrap();
    assert_eq!((report.resynced, report.failed), (1, 0));
    assert_eq!(plugin.backends().pod_cidrs("c")[1], a.pod_cidrs[1]);
    assert_converged(&mut plugin);
}

#[test]
fn exhaustion_of_the_first_family_allocates_nothing() {
    let config = Config::new(
        SyncMode::SyncFromCluster,
        vec![
            ClusterCidr::new("10.0.0.0/24", 24),
            ClusterCidr::new("fd00::/48", 64),
        ],
    );
    let mut plugin = start(MockCluster::new(), &config, 0);
    add_and_update(&mut plugin, "a", 1).unwrap();
    let error = sync_error(add_and_update(&mut plugin, "b", 2));
    assert!(matches!(error, SyncError::Exhausted(_)), "{error:?}");
    assert_names(&error.to_string(), &["\"b\"", "10.0.0.0/24"]);
    let stats = plugin.stats().unwrap();
    assert_eq!(
        (stats.sets[0].used, stats.sets[1].used, stats.releases),
        (1, 1, 0)
    );
}

#[test]
fn half_finished_dual_stack_allocation_is_completed_in_config_order() {
    let cluster = MockCluster::new()
        .with_node(Node::new("a", &[]))
        .with_alias("a", &[V6, V4]);
    let mut plugin = start(cluster, &cluster_dual(), 0);
    assert_eq!(
        used(&plugin.stats().unwrap()),
        2,
        "init occupied both aliases"
    );
    plugin.update(&node(&plugin, "a"), 10).unwrap();
    assert_calls(
        &mut plugin,
        &[
            alias("a"),
            set_pod_cidrs("a", &[V4, V6]),
            network_available("a"),
        ],
    );
    assert_converged(&mut plugin);
}

#[test]
fn sync_from_cloud_copies_both_families_in_config_order() {
    let mut plugin = with_node_a(&dual_stack_config(SyncMode::SyncFromCloud), &[], &[V6, V4]);
    plugin.update(&node(&plugin, "a"), 10).unwrap();
    assert_calls(
        &mut plugin,
        &[
            alias("a"),
            set_pod_cidrs("a", &[V4, V6]),
            network_available("a"),
        ],
    );
    assert_converged(&mut plugin);
}

#[test]
fn two_ranges_of_one_family_are_invalid_naming_both() {
    let mut plugin = with_node_a(&cluster_dual(), &["10.0.0.0/24", "10.0.1.0/24"], &[]);
    let error = sync_error(plugin.update(&node(&plugin, "a"), 10));
    assert!(matches!(error, SyncError::InvalidCidr(_)), "{error:?}");
    assert_names(&error.to_string(), &["\"a\"", "10.0.0.0/24", "10.0.1.0/24"]);
    assert_calls(&mut plugin, &[]);
}

#[test]
fn init_occupies_both_families_and_a_restart_hands_out_neither_twice() {
    let cluster = MockCluster::new()
        .with_node(Node::new("a", &[V4, V6]))
        .with_alias("a", &[V4, V6]);
    let mut plugin = start(cluster, &cluster_dual(), 0);
    let stats = plugin.stats().unwrap();
    assert_eq!((stats.sets[0].used, stats.sets[1].used), (1, 1));
    add_and_update(&mut plugin, "b", 1).unwrap();
    assert_eq!(
        plugin.backends().pod_cidrs("b"),
        ["10.0.1.0/24", "fd00:0:0:1::/64"]
    );

    // c's alias write fails ambiguously but lands; then a restart.
    plugin
        .backends_mut()
        .fail(Failure::new(Op::AddAlias, BackendError::Unavailable("timed out".into())).node("c"));
    assert!(add_and_update(&mut plugin, "c", 2).is_err());
    let calls = take_calls(&mut plugin);
    nodeipam_tests::apply(plugin.backends_mut(), calls.last().unwrap());
    let mut plugin = restart(plugin, &cluster_dual(), 3);
    add_and_update(&mut plugin, "d", 4).unwrap();
    assert_eq!(plugin.tick(30_004, 0).unwrap().failed, 0);
    assert_converged(&mut plugin);
}

#[test]
fn deleting_a_dual_stack_node_releases_both_ranges() {
    let cluster = MockCluster::new()
        .with_node(Node::new("a", &[V4, V6]))
        .with_alias("a", &[V4, V6]);
    let mut plugin = start(cluster, &cluster_dual(), 0);
    plugin.delete(&node(&plugin, "a"), 1).unwrap();
    let stats = plugin.stats().unwrap();
    assert_eq!((stats.nodes, used(&stats), stats.releases), (0, 0, 2));
}
