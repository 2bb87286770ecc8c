//! Resync scheduling through `tick` on virtual time: retries back off from `initial-retry`,
//! doubling up to `max-backoff`; a success returns to `resync`. Nothing runs before it is
//! due: a tick one millisecond early runs nothing and calls nothing.

use nodeipam_host::mock::{Failure, MockCluster, Op};
use nodeipam_host::{
    BackendError, Clock as _, Driver, ManualClock, Node, NodeEvent, Plugin, SyncError, TickReport,
};
use nodeipam_tests::call::{add_alias, alias, get_node, network_available, set_pod_cidrs};
use nodeipam_tests::{assert_calls, cluster_config, load, node, start, sync_error, take_calls};

fn down() -> BackendError {
    BackendError::Unavailable("cloud down".into())
}

/// `a` without a range, known from `init` at 0, its alias lookups failing until cleared.
fn failing_node() -> Plugin<MockCluster> {
    let cluster = MockCluster::new().with_node(Node::new("a", &[]));
    let mut plugin = start(cluster, &cluster_config(), 0);
    plugin
        .backends_mut()
        .fail(Failure::new(Op::Alias, down()).node("a").always());
    plugin
}

/// Tick at `due - 1` (nothing runs, nothing is called), then at `due`: one failed resync of
/// `a` (get-node, alias) whose retry is due `delay` later.
#[track_caller]
fn assert_retry(plugin: &mut Plugin<MockCluster>, due: u64, delay: u64) {
    assert_eq!(
        plugin.tick(due - 1, 0).unwrap(),
        TickReport {
            resynced: 0,
            failed: 0,
            next_due_ms: Some(due)
        },
        "a tick 1 ms early"
    );
    assert_calls(plugin, &[]);
    assert_eq!(
        plugin.tick(due, 0).unwrap(),
        TickReport {
            resynced: 0,
            failed: 1,
            next_due_ms: Some(due + delay)
        },
        "the failing resync at {due}"
    );
    assert_calls(plugin, &[get_node("a"), alias("a")]);
}

#[test]
fn consecutive_failures_retry_after_250ms_doubling_to_10s_and_a_success_resyncs_after_30s() {
    let mut plugin = failing_node();
    // The first failure (the update at 1000) retries 250 ms later.
    assert_eq!(
        sync_error(plugin.update(&node(&plugin, "a"), 1_000)),
        SyncError::Host(down())
    );
    take_calls(&mut plugin);
    let mut due = 1_000 + 250;
    for delay in [500, 1_000, 2_000, 4_000, 8_000, 10_000, 10_000] {
        assert_retry(&mut plugin, due, delay);
        due += delay;
    }
    assert_eq!(
        due,
        1_000 + 250 + 500 + 1_000 + 2_000 + 4_000 + 8_000 + 10_000 + 10_000
    );

    plugin.backends_mut().clear_failures();
    assert_eq!(plugin.tick(due - 1, 0).unwrap().resynced, 0);
    assert_calls(&mut plugin, &[]);
    assert_eq!(
        plugin.tick(due, 0).unwrap(),
        TickReport {
            resynced: 1,
            failed: 0,
            next_due_ms: Some(due + 30_000)
        }
    );
    assert_calls(
        &mut plugin,
        &[
            get_node("a"),
            alias("a"),
            add_alias("a", &["10.0.0.0/24"]),
            set_pod_cidrs("a", &["10.0.0.0/24"]),
            network_available("a"),
        ],
    );
    // In sync from now on: every 30 s.
    assert_eq!(
        plugin.tick(due + 30_000, 0).unwrap(),
        TickReport {
            resynced: 1,
            failed: 0,
            next_due_ms: Some(due + 60_000)
        }
    );
}

#[test]
fn configured_intervals_are_honoured() {
    let cluster = MockCluster::new().with_node(Node::new("a", &[]));
    let mut plugin = start(
        cluster,
        &cluster_config().with_intervals(5_000, 100, 350),
        0,
    );
    assert_eq!(
        plugin.tick(0, 0).unwrap().next_due_ms,
        Some(5_000),
        "first resync: resync-ms"
    );
    plugin
        .backends_mut()
        .fail(Failure::new(Op::Alias, down()).always());
    assert!(plugin.update(&node(&plugin, "a"), 0).is_err());
    take_calls(&mut plugin);
    let mut due = 100;
    for delay in [200, 350, 350] {
        assert_retry(&mut plugin, due, delay);
        due += delay;
    }
    plugin.backends_mut().clear_failures();
    assert_eq!(
        plugin.tick(due, 0).unwrap(),
        TickReport {
            resynced: 1,
            failed: 0,
            next_due_ms: Some(due + 5_000)
        }
    );
}

#[test]
fn a_successful_update_resets_the_backoff() {
    let mut plugin = failing_node();
    assert!(plugin.update(&node(&plugin, "a"), 0).is_err());
    take_calls(&mut plugin);
    assert_retry(&mut plugin, 250, 500);
    assert_retry(&mut plugin, 750, 1_000);
    plugin.backends_mut().clear_failures();
    plugin.update(&node(&plugin, "a"), 1_000).unwrap();
    assert_eq!(plugin.tick(1_000, 0).unwrap().next_due_ms, Some(31_000));

    // The next failure starts over at 250 ms.
    plugin
        .backends_mut()
        .fail(Failure::new(Op::Alias, down()).always());
    take_calls(&mut plugin);
    assert_eq!(
        plugin.tick(31_000, 0).unwrap(),
        TickReport {
            resynced: 0,
            failed: 1,
            next_due_ms: Some(31_250)
        }
    );
}

#[test]
fn a_failing_get_node_backs_off_like_any_failure() {
    let cluster = MockCluster::new()
        .with_node(Node::new("a", &["10.0.0.0/24"]))
        .with_alias("a", &["10.0.0.0/24"]);
    let mut plugin = start(cluster, &cluster_config(), 0);
    plugin
        .backends_mut()
        .fail(Failure::new(Op::GetNode, BackendError::Unavailable("api down".into())).times(2));
    assert_eq!(
        plugin.tick(30_000, 0).unwrap(),
        TickReport {
            resynced: 0,
            failed: 1,
            next_due_ms: Some(30_250)
        }
    );
    assert_calls(&mut plugin, &[get_node("a")]);
    assert_eq!(
        plugin.tick(30_250, 0).unwrap(),
        TickReport {
            resynced: 0,
            failed: 1,
            next_due_ms: Some(30_750)
        }
    );
    assert_eq!(
        plugin.tick(30_750, 0).unwrap(),
        TickReport {
            resynced: 1,
            failed: 0,
            next_due_ms: Some(60_750)
        }
    );
}

#[test]
fn tick_runs_due_resyncs_earliest_first_and_at_most_max_resyncs() {
    let cluster = MockCluster::new().with_nodes(["a", "b", "c"].map(|n| Node::new(n, &[])));
    let mut plugin = start(cluster, &cluster_config(), 0);
    // Each update fails once and is retried 250 ms later: c due 260, b 270, a 280.
    plugin
        .backends_mut()
        .fail(Failure::new(Op::Alias, down()).times(3));
    for (name, at) in [("c", 10), ("b", 20), ("a", 30)] {
        assert!(plugin.update(&node(&plugin, name), at).is_err());
    }
    take_calls(&mut plugin);
    assert_eq!(
        plugin.tick(300, 2).unwrap(),
        TickReport {
            resynced: 2,
            failed: 0,
            next_due_ms: Some(280)
        },
        "two of three due; a's still due"
    );
    let order: Vec<String> = take_calls(&mut plugin)
        .into_iter()
        .filter(|c| c.op() == Op::GetNode)
        .filter_map(|c| c.node().map(str::to_owned))
        .collect();
    assert_eq!(order, ["c", "b"]);
    assert_eq!(
        plugin.tick(300, 0).unwrap(),
        TickReport {
            resynced: 1,
            failed: 0,
            next_due_ms: Some(30_300)
        }
    );
}

#[test]
fn a_driver_on_a_manual_clock_ticks_exactly_at_the_backoff_deadlines() {
    let cluster = MockCluster::new().with_node(Node::new("a", &[]));
    let clock = ManualClock::new(0);
    let mut driver = Driver::new(load(cluster), clock.clone());
    driver.init(&cluster_config()).unwrap();
    driver
        .plugin_mut()
        .backends_mut()
        .fail(Failure::new(Op::Alias, down()).times(4));
    driver
        .handle(&NodeEvent::Changed(Node::new("a", &[])))
        .unwrap_err();
    let mut ticks = Vec::new();
    let mut reports = Vec::new();
    while ticks.len() < 6 {
        if let Some(report) = driver.run_due().unwrap() {
            ticks.push(clock.now_ms());
            reports.push((report.resynced, report.failed));
        }
        let deadline = driver.next_deadline().expect("a node is scheduled");
        clock.advance_to(deadline);
    }
    // After the failed update: the driver asks at once (0), then 250, 750, 1750, 3750
    // (failures 2-4), then the success schedules 30 s later.
    assert_eq!(ticks, [0, 250, 750, 1_750, 3_750, 33_750]);
    assert_eq!(reports, [(0, 0), (0, 1), (0, 1), (0, 1), (1, 0), (1, 0)]);
    assert_eq!(driver.plugin().backends().pod_cidrs("a"), ["10.0.0.0/24"]);
}
