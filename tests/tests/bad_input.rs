//! Bad input through the component boundary: each is a `sync-error` value whose message names
//! the node and the value (cut short when huge), never a trap, and changes nothing.
//!
//! Node cases use `sync-from-cluster` over 10.0.0.0/16 by /24 (dual-stack where said); the
//! node is in the cluster, so any write the component made would succeed: none may be made.

use nodeipam_host::mock::{Call, MockCluster, Op};
use nodeipam_host::{
    BackendError, ClusterCidr, Config, Node, Stats, SyncError, SyncMode, TickReport,
};
use nodeipam_tests::call::{alias, list_nodes};
use nodeipam_tests::{
    MAX_MESSAGE, assert_calls, assert_names, capture_logs, cidrs, cloud_config, cluster_config,
    dual_stack_config, load, node, start, sync_error, take_calls, used,
};

const MIB: usize = 1 << 20;

fn megabyte(fill: char) -> String {
    std::iter::repeat_n(fill, MIB).collect()
}

/// Update `name` (in the cluster with `ranges`, its VM with `alias`) under `config`: the error,
/// after checking it is a value, that no write was made, nothing is held, and no trap.
fn bad_update(
    config: &Config,
    name: &str,
    ranges: &[&str],
    alias: &[&str],
) -> (SyncError, Vec<Call>) {
    let mut plugin = start(MockCluster::new(), config, 0);
    let node = Node {
        name: name.to_owned(),
        provider_id: None,
        pod_cidrs: cidrs(ranges),
    };
    plugin.backends_mut().add_node(node.clone());
    plugin.backends_mut().set_alias(name, cidrs(alias));
    let error = sync_error(plugin.update(&node, 10));
    let calls = take_calls(&mut plugin);
    assert_no_write(&calls);
    assert_eq!(used(&plugin.stats().unwrap()), 0, "nothing held");
    assert_eq!(plugin.recoveries(), 0, "a value, not a trap");
    // The component still serves.
    assert_eq!(plugin.tick(10, 0).unwrap().failed, 0);
    (error, calls)
}

fn assert_no_write(calls: &[Call]) {
    let writes: Vec<&Call> = calls
        .iter()
        .filter(|c| {
            matches!(
                c.op(),
                Op::AddAlias | Op::UpdateNodePodCidrs | Op::UpdateNodeNetworkUnavailable
            )
        })
        .collect();
    assert!(writes.is_empty(), "writes made: {writes:?}");
}

#[track_caller]
fn assert_invalid_cidr(error: &SyncError, needles: &[&str]) {
    assert!(matches!(error, SyncError::InvalidCidr(_)), "{error:?}");
    assert_names(&error.to_string(), needles);
}

// ---- node ranges ----

#[test]
fn a_malformed_range_is_invalid_cidr_and_calls_nothing() {
    for text in [
        "10.0.0.0/33",
        "banana",
        "10.0.0/24",
        "10.0.0.0",
        "::ffff::/64",
        "10.0.0.0/24 ",
    ] {
        let (error, calls) = bad_update(&cluster_config(), "a", &[text], &[]);
        assert_invalid_cidr(&error, &["node \"a\"", &format!("{text:?}")]);
        assert!(calls.is_empty(), "{text}: {calls:?}");
    }
}

#[test]
fn a_range_of_a_family_without_a_cluster_cidr_is_invalid_cidr() {
    let (error, calls) = bad_update(&cluster_config(), "a", &["fd00::/64"], &[]);
    assert_eq!(
        error,
        SyncError::InvalidCidr(
            "node \"a\": pod range fd00::/64 has no cluster cidr of its ip family".into()
        )
    );
    assert!(calls.is_empty());
}

#[test]
fn a_range_outside_the_cluster_cidr_is_out_of_range() {
    let (error, calls) = bad_update(&cluster_config(), "a", &["192.168.0.0/24"], &[]);
    assert_eq!(
        error,
        SyncError::OutOfRange(
            "node \"a\": range 192.168.0.0/24 is outside cluster cidr 10.0.0.0/16".into()
        )
    );
    assert_eq!(calls, [alias("a")]);
}

#[test]
fn more_ranges_than_cluster_cidrs_is_invalid_cidr() {
    let (error, calls) = bad_update(&cluster_config(), "a", &["10.0.0.0/24", "fd00::/64"], &[]);
    assert_invalid_cidr(&error, &["node \"a\"", "2 pod ranges", "1 cluster cidr"]);
    assert!(calls.is_empty());
    let dual = dual_stack_config(SyncMode::SyncFromCluster);
    let (error, _) = bad_update(
        &dual,
        "a",
        &["10.0.0.0/24", "fd00::/64", "10.0.1.0/24"],
        &[],
    );
    assert_invalid_cidr(&error, &["node \"a\"", "3 pod ranges", "2 cluster cidrs"]);
}

#[test]
fn an_empty_range_string_is_invalid_cidr() {
    let (error, calls) = bad_update(&cluster_config(), "a", &[""], &[]);
    assert_eq!(
        error,
        SyncError::InvalidCidr("node \"a\": pod range \"\": empty, expected address/prefix".into())
    );
    assert!(calls.is_empty());
}

#[test]
fn a_megabyte_range_string_is_invalid_cidr_with_a_short_message() {
    let huge = megabyte('1');
    let (error, _) = bad_update(&cluster_config(), "a", &[&huge], &[]);
    assert_invalid_cidr(
        &error,
        &[
            "node \"a\"",
            &format!("\"{}\"... ({MIB} bytes)", &huge[..64]),
        ],
    );
}

#[test]
fn an_empty_node_name_is_named_in_the_message() {
    let (error, _) = bad_update(&cluster_config(), "", &["banana"], &[]);
    assert_invalid_cidr(&error, &["node \"\":", "\"banana\""]);
}

#[test]
fn a_megabyte_node_name_is_cut_in_the_message() {
    let name = megabyte('n');
    let (error, _) = bad_update(&cluster_config(), &name, &["banana"], &[]);
    assert_invalid_cidr(
        &error,
        &[
            &format!("node \"{}\"... ({MIB} bytes)", &name[..64]),
            "\"banana\"",
        ],
    );
}

#[test]
fn a_range_another_node_holds_is_invalid_cidr_naming_the_holder() {
    let cluster = MockCluster::new().with_node(Node::new("b", &["10.0.0.0/24"]));
    let mut plugin = start(cluster, &cluster_config(), 0);
    plugin
        .backends_mut()
        .add_node(Node::new("a", &["10.0.0.0/24"]));
    let error = sync_error(plugin.update(&node(&plugin, "a"), 1));
    assert_eq!(
        error,
        SyncError::InvalidCidr(
            "node \"a\": range 10.0.0.0/24 is already held by node \"b\"".into()
        )
    );
    assert_calls(&mut plugin, &[alias("a")]);
    assert_eq!(used(&plugin.stats().unwrap()), 1);
}

// ---- cloud aliases ----

#[test]
fn a_malformed_alias_is_invalid_cidr_naming_the_node_and_alias() {
    let (error, calls) = bad_update(&cluster_config(), "a", &[], &["banana"]);
    assert_eq!(
        error,
        SyncError::InvalidCidr(
            "node \"a\": cloud alias \"banana\": not a cidr (expected address/prefix, e.g. \
             10.0.0.0/24)"
                .into()
        )
    );
    assert_eq!(calls, [alias("a")]);
}

#[test]
fn a_megabyte_alias_is_invalid_cidr_with_a_short_message() {
    let huge = megabyte('f');
    let (error, _) = bad_update(&cluster_config(), "a", &[], &[&huge]);
    assert_invalid_cidr(
        &error,
        &["node \"a\"", "cloud alias", &format!("({MIB} bytes)")],
    );
}

#[test]
fn an_alias_of_a_family_without_a_cluster_cidr_is_invalid_cidr() {
    let (error, _) = bad_update(&cluster_config(), "a", &[], &["fd00::/64"]);
    assert_invalid_cidr(&error, &["node \"a\"", "cloud alias fd00::/64"]);
}

#[test]
fn an_alias_with_two_ranges_of_one_family_is_invalid_cidr() {
    let dual = dual_stack_config(SyncMode::SyncFromCloud);
    let (error, _) = bad_update(&dual, "a", &[], &["10.0.0.0/24", "10.0.1.0/24"]);
    assert_invalid_cidr(&error, &["node \"a\"", "10.0.0.0/24", "10.0.1.0/24"]);
}

// ---- nodes the cluster does not have ----

#[test]
fn updating_a_node_the_cluster_does_not_have_fails_and_its_range_is_released_at_resync() {
    for name in [String::from("ghost"), String::new(), megabyte('g')] {
        let mut plugin = start(MockCluster::new(), &cluster_config(), 0);
        let error = sync_error(plugin.update(&Node::new(name.as_str(), &[]), 10));
        assert!(
            matches!(&error, SyncError::Host(BackendError::NotFound(m))
                if m.contains(&name[..name.len().min(200)]) && m.len() < 512),
            "{:.200}",
            error.to_string()
        );
        assert_eq!(plugin.recoveries(), 0);
        // Its retry finds it gone: forgotten, its allocation released.
        assert_eq!(
            plugin.tick(260, 0).unwrap(),
            TickReport {
                resynced: 1,
                failed: 0,
                next_due_ms: None
            }
        );
        let stats = plugin.stats().unwrap();
        assert_eq!(
            (stats.nodes, used(&stats)),
            (0, 0),
            "node name of {} bytes",
            name.len()
        );
    }
}

// ---- events and logs stay short ----

#[test]
fn events_about_a_megabyte_node_name_are_short() {
    let name = megabyte('m');
    let cluster = MockCluster::new()
        .with_node(Node::new(name.as_str(), &["10.0.0.0/24"]))
        .with_alias(&name, &["10.0.1.0/24"]);
    let mut plugin = start(cluster, &cluster_config(), 0);
    plugin.update(&node(&plugin, &name), 1).unwrap();
    plugin
        .delete(&Node::new(name.as_str(), &["banana"]), 2)
        .unwrap();
    let mut plugin_cloud = start(MockCluster::new(), &cloud_config(), 0);
    plugin_cloud
        .backends_mut()
        .add_node(Node::new(name.as_str(), &[]));
    let _ = sync_error(plugin_cloud.update(&node(&plugin_cloud, &name), 1));

    let events: Vec<_> = plugin
        .backends()
        .events()
        .iter()
        .chain(plugin_cloud.backends().events())
        .collect();
    let reasons: Vec<&str> = events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "CloudCIDRAllocatorMismatch",
            "CloudCIDRAllocatorInvalidPodCIDR",
            "CloudCIDRAllocatorInvalidMode"
        ]
    );
    let cut = format!("\"{}\"... ({MIB} bytes)", &name[..64]);
    for event in events {
        assert_eq!(event.name, name, "the event is on the node");
        assert_names(&event.message, &[&cut]);
    }
}

#[test]
fn logs_about_megabyte_values_are_short() {
    let name = megabyte('l');
    let cluster = MockCluster::new().with_node(Node::new(name.as_str(), &[&megabyte('9')]));
    let mut plugin = load(cluster);
    let (result, logs) = capture_logs(|| plugin.init(&cluster_config(), 0));
    result.unwrap();
    let line = logs
        .iter()
        .find(|l| l.message == "skipping a range at start")
        .expect("the range is reported");
    assert!(
        line.fields.len() <= 2 * MAX_MESSAGE,
        "{} bytes",
        line.fields.len()
    );
    assert_names(&line.fields, &[&format!("\"{}\"...", &name[..64])]);
}

// ---- configurations ----

/// `init` with `config` fails with invalid-config naming `needles`; nothing is initialised,
/// no alias is looked up, no trap.
#[track_caller]
fn assert_invalid_config(config: &Config, needles: &[&str]) {
    let mut plugin = load(MockCluster::new().with_node(Node::new("a", &[])));
    let error = sync_error(plugin.init(config, 0));
    assert!(matches!(error, SyncError::InvalidConfig(_)), "{error:?}");
    assert_names(&error.to_string(), needles);
    assert_calls(&mut plugin, &[list_nodes()]);
    assert_eq!(plugin.config(), None);
    assert_eq!(
        sync_error(plugin.update(&Node::new("a", &[]), 1)),
        SyncError::NotInitialized
    );
    assert_eq!(plugin.stats().unwrap(), Stats::default());
    assert_eq!(plugin.recoveries(), 0);
}

fn single(cidr: &str, mask: u8) -> Config {
    Config::new(
        SyncMode::SyncFromCluster,
        vec![ClusterCidr::new(cidr, mask)],
    )
}

fn many(cidrs: &[(&str, u8)]) -> Config {
    Config::new(
        SyncMode::SyncFromCluster,
        cidrs
            .iter()
            .map(|(c, m)| ClusterCidr::new(*c, *m))
            .collect(),
    )
}

#[test]
fn a_node_mask_longer_than_the_address_is_invalid_config() {
    assert_invalid_config(
        &single("10.0.0.0/16", 33),
        &["33", "10.0.0.0/16", "longer than the addresses"],
    );
    assert_invalid_config(&single("fd00::/112", 129), &["129", "fd00::/112"]);
}

#[test]
fn a_node_mask_25_bits_longer_than_the_cluster_is_invalid_config() {
    assert_invalid_config(&single("10.0.0.0/7", 32), &["32", "10.0.0.0/7", "24 bits"]);
    assert_invalid_config(&single("fd00::/48", 73), &["73", "fd00::/48", "24 bits"]);
}

#[test]
fn a_node_mask_24_bits_longer_than_the_cluster_is_accepted_in_both_families() {
    let config = many(&[("10.0.0.0/8", 32), ("fd00::/40", 64)]);
    let mut plugin = start(MockCluster::new(), &config, 0);
    let stats = plugin.stats().unwrap();
    assert_eq!(
        stats.sets.iter().map(|s| s.max).collect::<Vec<_>>(),
        [16_777_216, 16_777_216]
    );
    plugin.backends_mut().add_node(Node::new("a", &[]));
    plugin.update(&node(&plugin, "a"), 1).unwrap();
    assert_eq!(
        plugin.backends().pod_cidrs("a"),
        ["10.0.0.0/32", "fd00::/64"]
    );
}

#[test]
fn a_node_mask_shorter_than_the_cluster_is_invalid_config() {
    assert_invalid_config(&single("10.0.0.0/16", 8), &["8", "10.0.0.0/16", "shorter"]);
}

#[test]
fn three_cluster_cidrs_are_invalid_config() {
    let config = many(&[("10.0.0.0/16", 24), ("fd00::/48", 64), ("10.1.0.0/16", 24)]);
    assert_invalid_config(&config, &["3 cluster cidrs"]);
}

#[test]
fn no_cluster_cidr_is_invalid_config() {
    assert_invalid_config(&many(&[]), &["0 cluster cidrs"]);
}

#[test]
fn two_cluster_cidrs_of_one_family_are_invalid_config() {
    assert_invalid_config(
        &many(&[("10.0.0.0/16", 24), ("10.1.0.0/16", 24)]),
        &["10.0.0.0/16", "10.1.0.0/16", "one ip family"],
    );
    assert_invalid_config(
        &many(&[("fd00::/48", 64), ("fd01::/48", 64)]),
        &["fd00::/48", "fd01::/48"],
    );
}

#[test]
fn a_malformed_cluster_cidr_is_invalid_config() {
    assert_invalid_config(&single("10.0.0.0/99", 24), &["\"10.0.0.0/99\""]);
    assert_invalid_config(&single("", 24), &["\"\"", "empty"]);
    let huge = megabyte('7');
    assert_invalid_config(&single(&huge, 24), &[&format!("({MIB} bytes)")]);
}

#[test]
fn an_initial_retry_longer_than_the_max_backoff_is_invalid_config() {
    assert_invalid_config(
        &cluster_config().with_intervals(0, 20_000, 0),
        &["20000", "10000"],
    );
}
