//! The state machine against an in-memory cluster and cloud with scripted faults.

use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use super::*;
use crate::host::{CloudAlias, Events, KubeApi};
use crate::types::ClusterCidr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    GetNode,
    UpdatePodCidrs,
    UpdateNetwork,
    Alias,
    AddAlias,
}

use Op::*;

/// A scripted failure of the next call to `op`. `applied`: the write happened anyway (an
/// ambiguous failure whose effect landed).
#[derive(Clone, Debug)]
struct Fault {
    op: Op,
    error: HostError,
    applied: bool,
}

/// The cluster and the cloud, in memory, with a call trace.
#[derive(Default)]
struct World {
    nodes: BTreeMap<String, Node>,
    network_unavailable: BTreeMap<String, bool>,
    aliases: BTreeMap<String, Vec<String>>,
    events: Vec<(String, String, String)>,
    logs: Vec<String>,
    calls: Vec<(Op, String)>,
    faults: Vec<Fault>,
}

impl World {
    fn with_nodes(nodes: &[(&str, &[&str], &[&str])]) -> Self {
        let mut world = Self::default();
        for (name, ranges, alias) in nodes {
            world.add_node(name, ranges, alias);
        }
        world
    }

    fn add_node(&mut self, name: &str, ranges: &[&str], alias: &[&str]) -> Node {
        let node = node(name, ranges);
        self.nodes.insert(name.to_string(), node.clone());
        self.network_unavailable.insert(name.to_string(), true);
        if !alias.is_empty() {
            self.aliases.insert(
                name.to_string(),
                alias.iter().map(|a| a.to_string()).collect(),
            );
        }
        node
    }

    fn node(&self, name: &str) -> Node {
        self.nodes[name].clone()
    }

    fn fail(&mut self, op: Op, error: HostError, applied: bool) {
        self.faults.push(Fault { op, error, applied });
    }

    /// Records the call; returns the scripted fault for it, if any.
    fn call(&mut self, op: Op, name: &str) -> Option<Fault> {
        self.calls.push((op, name.to_string()));
        let i = self.faults.iter().position(|f| f.op == op)?;
        Some(self.faults.remove(i))
    }

    fn take_calls(&mut self) -> Vec<Op> {
        core::mem::take(&mut self.calls)
            .into_iter()
            .map(|(op, _)| op)
            .collect()
    }

    fn reasons(&self) -> Vec<&str> {
        self.events
            .iter()
            .map(|(_, reason, _)| reason.as_str())
            .collect()
    }
}

impl KubeApi for World {
    fn get_node(&mut self, name: &str) -> Result<Node, HostError> {
        if let Some(f) = self.call(GetNode, name) {
            return Err(f.error);
        }
        self.nodes
            .get(name)
            .cloned()
            .ok_or_else(|| HostError::NotFound(name.to_string()))
    }

    fn update_node_pod_cidrs(&mut self, node: &Node, cidrs: &[String]) -> Result<(), HostError> {
        let fault = self.call(UpdatePodCidrs, &node.name);
        if fault.as_ref().is_none_or(|f| f.applied) {
            let stored = self
                .nodes
                .get_mut(&node.name)
                .ok_or_else(|| HostError::NotFound(node.name.clone()))?;
            stored.pod_cidrs = cidrs.to_vec();
        }
        fault.map_or(Ok(()), |f| Err(f.error))
    }

    fn update_node_network_unavailable(
        &mut self,
        name: &str,
        unavailable: bool,
    ) -> Result<(), HostError> {
        let fault = self.call(UpdateNetwork, name);
        if fault.as_ref().is_none_or(|f| f.applied) {
            self.network_unavailable
                .insert(name.to_string(), unavailable);
        }
        fault.map_or(Ok(()), |f| Err(f.error))
    }
}

impl CloudAlias for World {
    fn alias(&mut self, node: &Node) -> Result<Vec<String>, HostError> {
        if let Some(f) = self.call(Alias, &node.name) {
            return Err(f.error);
        }
        Ok(self.aliases.get(&node.name).cloned().unwrap_or_default())
    }

    fn add_alias(&mut self, node: &Node, cidrs: &[String]) -> Result<(), HostError> {
        let fault = self.call(AddAlias, &node.name);
        if fault.as_ref().is_none_or(|f| f.applied) {
            self.aliases.insert(node.name.clone(), cidrs.to_vec());
        }
        fault.map_or(Ok(()), |f| Err(f.error))
    }
}

impl Events for World {
    fn emit_node_warning(&mut self, name: &str, reason: &str, message: &str) {
        self.events
            .push((name.to_string(), reason.to_string(), message.to_string()));
    }

    fn log(&mut self, _level: Level, message: &str, fields: &[(&str, &str)]) {
        let fields: Vec<String> = fields
            .iter()
            .map(|(k, v)| alloc::format!("{k}={v}"))
            .collect();
        self.logs
            .push(alloc::format!("{message} {}", fields.join(" ")));
    }
}

fn update(c: &mut Controller, world: &mut World, name: &str, now_ms: u64) -> Result<(), SyncError> {
    let node = world.node(name);
    c.update(world, &node, now_ms)
}

fn delete(c: &mut Controller, world: &mut World, name: &str, now_ms: u64) -> Result<(), SyncError> {
    let node = world.node(name);
    c.delete(world, &node, now_ms)
}

fn node(name: &str, ranges: &[&str]) -> Node {
    Node {
        name: name.to_string(),
        provider_id: Some(alloc::format!("gce://p/z/{name}")),
        pod_cidrs: ranges.iter().map(|r| r.to_string()).collect(),
    }
}

fn config(mode: SyncMode, clusters: &[(&str, u8)]) -> Config {
    Config {
        mode,
        cluster_cidrs: clusters
            .iter()
            .map(|(cidr, mask)| ClusterCidr {
                cidr: cidr.to_string(),
                node_mask_size: *mask,
            })
            .collect(),
        resync_ms: 0,
        initial_retry_ms: 0,
        max_backoff_ms: 0,
    }
}

const CLUSTER: SyncMode = SyncMode::SyncFromCluster;
const CLOUD: SyncMode = SyncMode::SyncFromCloud;

fn start(mode: SyncMode, world: &mut World) -> Controller {
    let nodes: Vec<Node> = world.nodes.values().cloned().collect();
    let controller =
        Controller::init(&config(mode, &[("10.0.0.0/16", 24)]), &nodes, 0, world).unwrap();
    world.calls.clear();
    controller
}

fn net(text: &str) -> IpNet {
    text.parse().unwrap()
}

/// The node's ranges, its alias and what the controller holds all agree, the network is
/// marked available, and no range is held by two nodes.
fn assert_converged(controller: &Controller, world: &World) {
    let mut seen: BTreeMap<IpNet, &str> = BTreeMap::new();
    for (name, node) in &world.nodes {
        assert!(!node.pod_cidrs.is_empty(), "node {name} has no range");
        assert_eq!(
            Some(&node.pod_cidrs),
            world.aliases.get(name),
            "node {name}: range vs alias"
        );
        assert!(
            !world.network_unavailable[name],
            "node {name}: network still unavailable"
        );
        let held = to_strings(controller.held(name));
        assert_eq!(held, node.pod_cidrs, "node {name}: held vs node range");
        for range in controller.held(name) {
            if let Some(other) = seen.insert(*range, name) {
                panic!("range {range} held by {other} and {name}");
            }
        }
    }
    let used: u32 = controller.stats().sets.iter().map(|s| s.used).sum();
    assert_eq!(used as usize, seen.len(), "allocator use vs ranges held");
}

// --- the update table, one case per row and mode ---------------------------------------

#[test]
fn no_range_no_alias_allocates_in_sync_from_cluster() {
    let mut world = World::with_nodes(&[("n1", &[], &[])]);
    let mut c = start(CLUSTER, &mut world);
    update(&mut c, &mut world, "n1", 0).unwrap();
    assert_eq!(
        world.take_calls(),
        vec![Alias, AddAlias, UpdatePodCidrs, UpdateNetwork]
    );
    assert_eq!(world.node("n1").pod_cidrs, vec!["10.0.0.0/24"]);
    assert_converged(&c, &world);
    assert_eq!(c.stats().allocations, 1);
}

#[test]
fn no_range_no_alias_is_invalid_mode_in_sync_from_cloud() {
    let mut world = World::with_nodes(&[("n1", &[], &[])]);
    let mut c = start(CLOUD, &mut world);
    let err = update(&mut c, &mut world, "n1", 0).unwrap_err();
    assert!(
        matches!(&err, SyncError::InvalidMode(m) if m.contains("\"n1\"") && m.contains("sync-from-cloud")),
        "{err}"
    );
    assert_eq!(world.take_calls(), vec![Alias]);
    assert_eq!(world.reasons(), vec![REASON_INVALID_MODE]);
    assert_eq!(c.stats().sets[0].used, 0);
}

#[test]
fn no_range_with_alias_copies_alias_in_sync_from_cloud() {
    let mut world = World::with_nodes(&[("n1", &[], &["10.0.7.0/24"])]);
    let mut c = start(CLOUD, &mut world);
    update(&mut c, &mut world, "n1", 0).unwrap();
    assert_eq!(
        world.take_calls(),
        vec![Alias, UpdatePodCidrs, UpdateNetwork]
    );
    assert_eq!(world.node("n1").pod_cidrs, vec!["10.0.7.0/24"]);
    assert_converged(&c, &world);
    // Copied, not allocated: occupying the alias counts one allocation, as Kubernetes'
    // Occupy does, and no search ran.
    let stats = c.stats();
    assert_eq!(
        (stats.allocations, stats.allocation_tries),
        (1, 0),
        "copied alias occupied once"
    );
}

#[test]
fn no_range_with_free_node_sized_alias_completes_allocation_in_sync_from_cluster() {
    let mut world = World::with_nodes(&[("n1", &[], &[])]);
    let mut c = start(CLUSTER, &mut world);
    world
        .aliases
        .insert("n1".into(), vec!["10.0.9.0/24".into()]);
    update(&mut c, &mut world, "n1", 0).unwrap();
    assert_eq!(
        world.take_calls(),
        vec![Alias, UpdatePodCidrs, UpdateNetwork]
    );
    assert!(world.events.is_empty());
    assert_converged(&c, &world);
}

#[test]
fn no_range_with_alias_held_by_another_node_is_invalid_mode_in_sync_from_cluster() {
    let mut world = World::with_nodes(&[
        ("n1", &["10.0.3.0/24"], &["10.0.3.0/24"]),
        ("n2", &[], &["10.0.3.0/24"]),
    ]);
    let mut c = start(CLUSTER, &mut world);
    let err = update(&mut c, &mut world, "n2", 0).unwrap_err();
    assert!(matches!(err, SyncError::InvalidMode(_)), "{err}");
    assert_eq!(world.reasons(), vec![REASON_INVALID_MODE]);
    assert!(world.node("n2").pod_cidrs.is_empty());
    assert_eq!(c.held("n1"), &[net("10.0.3.0/24")]);
    assert!(c.held("n2").is_empty());
}

#[test]
fn no_range_with_alias_of_other_size_is_invalid_mode_in_sync_from_cluster() {
    let mut world = World::with_nodes(&[("n1", &[], &[])]);
    let mut c = start(CLUSTER, &mut world);
    world
        .aliases
        .insert("n1".into(), vec!["10.0.8.0/23".into()]);
    let err = update(&mut c, &mut world, "n1", 0).unwrap_err();
    assert!(matches!(err, SyncError::InvalidMode(_)), "{err}");
    assert_eq!(world.take_calls(), vec![Alias]);
}

#[test]
fn range_without_alias_pushes_alias_in_sync_from_cluster() {
    let mut world = World::with_nodes(&[("n1", &["10.0.5.0/24"], &[])]);
    let mut c = start(CLUSTER, &mut world);
    update(&mut c, &mut world, "n1", 0).unwrap();
    assert_eq!(world.take_calls(), vec![Alias, AddAlias, UpdateNetwork]);
    assert_converged(&c, &world);
}

#[test]
fn range_without_alias_is_invalid_mode_in_sync_from_cloud() {
    let mut world = World::with_nodes(&[("n1", &["10.0.5.0/24"], &[])]);
    let mut c = start(CLOUD, &mut world);
    let err = update(&mut c, &mut world, "n1", 0).unwrap_err();
    assert!(matches!(err, SyncError::InvalidMode(_)), "{err}");
    assert_eq!(world.take_calls(), vec![Alias]);
    assert_eq!(world.reasons(), vec![REASON_INVALID_MODE]);
    assert!(!world.aliases.contains_key("n1"));
}

#[test]
fn equal_range_and_alias_does_nothing_in_both_modes() {
    for mode in [CLUSTER, CLOUD] {
        let mut world = World::with_nodes(&[("n1", &["10.0.5.0/24"], &["10.0.5.0/24"])]);
        let mut c = start(mode, &mut world);
        // The first sync of a node found in sync confirms its network once.
        update(&mut c, &mut world, "n1", 0).unwrap();
        assert_eq!(world.take_calls(), vec![Alias, UpdateNetwork], "{mode:?}");
        update(&mut c, &mut world, "n1", 1).unwrap();
        assert_eq!(world.take_calls(), vec![Alias], "{mode:?}");
        assert!(world.events.is_empty());
        assert_converged(&c, &world);
    }
}

#[test]
fn different_range_and_alias_warns_and_changes_nothing_in_both_modes() {
    for mode in [CLUSTER, CLOUD] {
        let mut world = World::with_nodes(&[("n1", &["10.0.5.0/24"], &["10.0.6.0/24"])]);
        let mut c = start(mode, &mut world);
        update(&mut c, &mut world, "n1", 0).unwrap();
        assert_eq!(world.take_calls(), vec![Alias], "{mode:?}");
        assert_eq!(world.reasons(), vec![REASON_MISMATCH]);
        let message = &world.events[0].2;
        assert!(
            message.contains("10.0.5.0/24") && message.contains("10.0.6.0/24"),
            "{message}"
        );
        assert_eq!(world.node("n1").pod_cidrs, vec!["10.0.5.0/24"]);
        assert_eq!(world.aliases["n1"], vec!["10.0.6.0/24"]);
    }
}

#[test]
fn alias_not_found_means_no_alias() {
    let mut world = World::with_nodes(&[("n1", &[], &[])]);
    let mut c = start(CLUSTER, &mut world);
    world.fail(Alias, HostError::NotFound("no alias".into()), false);
    update(&mut c, &mut world, "n1", 0).unwrap();
    assert_converged(&c, &world);
}

// --- partial failures: fail every step of every branch, then resync -------------------

/// The branches that write, with the host calls each makes in order.
fn branches() -> Vec<(&'static str, SyncMode, World, Vec<Op>)> {
    vec![
        (
            "allocate",
            CLUSTER,
            World::with_nodes(&[("n1", &[], &[])]),
            vec![Alias, AddAlias, UpdatePodCidrs, UpdateNetwork],
        ),
        (
            "push node range",
            CLUSTER,
            World::with_nodes(&[("n1", &["10.0.5.0/24"], &[])]),
            vec![Alias, AddAlias, UpdateNetwork],
        ),
        (
            "copy alias",
            CLOUD,
            World::with_nodes(&[("n1", &[], &["10.0.7.0/24"])]),
            vec![Alias, UpdatePodCidrs, UpdateNetwork],
        ),
    ]
}

fn faults() -> Vec<(HostError, bool)> {
    vec![
        (HostError::Unavailable("timeout".into()), false),
        (HostError::Unavailable("timeout".into()), true),
        (HostError::Other("quota".into()), false),
        (HostError::Conflict("resource version".into()), false),
    ]
}

#[test]
fn every_failed_step_converges_on_resync() {
    for (branch, mode, world, steps) in branches() {
        for (step, op) in steps.iter().enumerate() {
            for (error, applied) in faults() {
                let case = alloc::format!(
                    "{branch}: {op:?} (step {step}) fails with {error:?}, applied {applied}"
                );
                let mut world = World {
                    ..clone_world(&world)
                };
                let mut c = start(mode, &mut world);
                world.fail(*op, error.clone(), applied);
                let result = update(&mut c, &mut world, "n1", 0);
                assert!(result.is_err(), "{case}: the failure is reported");
                // A second node arrives meanwhile and must not get n1's range.
                world.add_node("n2", &[], &[]);
                if mode == CLUSTER {
                    update(&mut c, &mut world, "n2", 1)
                        .unwrap_or_else(|e| panic!("{case}: n2: {e}"));
                } else {
                    world
                        .aliases
                        .insert("n2".into(), vec!["10.0.8.0/24".into()]);
                    update(&mut c, &mut world, "n2", 1)
                        .unwrap_or_else(|e| panic!("{case}: n2: {e}"));
                }
                // Resync with the failure gone: the retry is due after the initial backoff.
                let report = c.tick(&mut world, DEFAULT_INITIAL_RETRY_MS, 0);
                assert_eq!(
                    (report.resynced, report.failed),
                    (1, 0),
                    "{case}: {:?}",
                    world.logs
                );
                assert_converged(&c, &world);
                assert!(world.events.is_empty(), "{case}: {:?}", world.events);
            }
        }
    }
}

#[test]
fn every_failed_step_converges_after_a_restart() {
    for (branch, mode, world, steps) in branches() {
        for (step, op) in steps.iter().enumerate() {
            for (error, applied) in faults() {
                let case = alloc::format!(
                    "{branch}: {op:?} (step {step}) fails with {error:?}, applied {applied}"
                );
                let mut world = clone_world(&world);
                let mut c = start(mode, &mut world);
                world.fail(*op, error.clone(), applied);
                assert!(update(&mut c, &mut world, "n1", 0).is_err(), "{case}");
                // The plugin restarts: a fresh controller from the cluster as it is now.
                let mut c = start(mode, &mut world);
                world.add_node("n2", &[], &[]);
                if mode == CLOUD {
                    world
                        .aliases
                        .insert("n2".into(), vec!["10.0.8.0/24".into()]);
                }
                update(&mut c, &mut world, "n2", 1).unwrap_or_else(|e| panic!("{case}: n2: {e}"));
                update(&mut c, &mut world, "n1", 2).unwrap_or_else(|e| panic!("{case}: n1: {e}"));
                assert_converged(&c, &world);
            }
        }
    }
}

fn clone_world(world: &World) -> World {
    World {
        nodes: world.nodes.clone(),
        network_unavailable: world.network_unavailable.clone(),
        aliases: world.aliases.clone(),
        ..World::default()
    }
}

#[test]
fn definite_add_alias_failure_releases_the_range() {
    let mut world = World::with_nodes(&[("n1", &[], &[])]);
    let mut c = start(CLUSTER, &mut world);
    world.fail(AddAlias, HostError::Other("quota exceeded".into()), false);
    let err = update(&mut c, &mut world, "n1", 0).unwrap_err();
    assert_eq!(
        err,
        SyncError::Host(HostError::Other("quota exceeded".into()))
    );
    assert!(c.held("n1").is_empty());
    let stats = c.stats();
    assert_eq!(
        (stats.sets[0].used, stats.allocations, stats.releases),
        (0, 1, 1)
    );
}

#[test]
fn ambiguous_add_alias_failure_keeps_the_range_pending_and_pushes_it_again() {
    let mut world = World::with_nodes(&[("n1", &[], &[])]);
    let mut c = start(CLUSTER, &mut world);
    world.fail(AddAlias, HostError::Unavailable("timeout".into()), false);
    update(&mut c, &mut world, "n1", 0).unwrap_err();
    assert_eq!(c.held("n1"), &[net("10.0.0.0/24")]);
    world.take_calls();
    c.tick(&mut world, DEFAULT_INITIAL_RETRY_MS, 0);
    assert_eq!(
        world.take_calls(),
        vec![GetNode, Alias, AddAlias, UpdatePodCidrs, UpdateNetwork]
    );
    assert_eq!(
        world.aliases["n1"],
        vec!["10.0.0.0/24"],
        "the same range pushed again"
    );
    assert_eq!(c.stats().allocations, 1, "not allocated twice");
}

#[test]
fn failed_network_update_is_retried_until_it_succeeds() {
    let mut world = World::with_nodes(&[("n1", &[], &[])]);
    let mut c = start(CLUSTER, &mut world);
    world.fail(
        UpdateNetwork,
        HostError::Unavailable("apiserver".into()),
        false,
    );
    update(&mut c, &mut world, "n1", 0).unwrap_err();
    world.fail(
        UpdateNetwork,
        HostError::Unavailable("apiserver".into()),
        false,
    );
    let report = c.tick(&mut world, 250, 0);
    assert_eq!((report.resynced, report.failed), (0, 1));
    assert_eq!(report.next_due_ms, Some(250 + 500));
    world.take_calls();
    let report = c.tick(&mut world, 750, 0);
    assert_eq!((report.resynced, report.failed), (1, 0));
    assert_eq!(world.take_calls(), vec![GetNode, Alias, UpdateNetwork]);
    assert_converged(&c, &world);
    // Once it succeeded, an in-sync resync makes no write.
    c.tick(&mut world, 750 + DEFAULT_RESYNC_MS, 0);
    assert_eq!(world.take_calls(), vec![GetNode, Alias]);
}

// --- dual-stack --------------------------------------------------------------------------

const DUAL: &[(&str, u8)] = &[("10.0.0.0/24", 26), ("fd00::/120", 122)];

#[test]
fn dual_stack_allocates_one_range_per_family_in_config_order() {
    let mut world = World::with_nodes(&[("n1", &[], &[])]);
    let mut c = Controller::init(&config(CLUSTER, DUAL), &[], 0, &mut world).unwrap();
    update(&mut c, &mut world, "n1", 0).unwrap();
    assert_eq!(
        world.node("n1").pod_cidrs,
        vec!["10.0.0.0/26", "fd00::/122"]
    );
    assert_converged(&c, &world);
}

#[test]
fn dual_stack_compares_ranges_as_sets() {
    let mut world = World::with_nodes(&[(
        "n1",
        &["fd00::40/122", "10.0.0.64/26"],
        &["10.0.0.64/26", "fd00::40/122"],
    )]);
    world.network_unavailable.insert("n1".into(), false);
    let nodes: Vec<Node> = world.nodes.values().cloned().collect();
    let mut c = Controller::init(&config(CLUSTER, DUAL), &nodes, 0, &mut world).unwrap();
    update(&mut c, &mut world, "n1", 0).unwrap();
    assert!(world.events.is_empty(), "{:?}", world.events);
    assert_eq!(
        c.stats().sets.iter().map(|s| s.used).collect::<Vec<_>>(),
        vec![1, 1]
    );
}

#[test]
fn dual_stack_exhausted_second_family_releases_the_first() {
    // 4 IPv4 ranges, 1 IPv6 range.
    let dual = &[("10.0.0.0/24", 26), ("fd00::/120", 120)];
    let mut world = World::with_nodes(&[("n1", &[], &[]), ("n2", &[], &[])]);
    let mut c = Controller::init(&config(CLUSTER, dual), &[], 0, &mut world).unwrap();
    update(&mut c, &mut world, "n1", 0).unwrap();
    let err = update(&mut c, &mut world, "n2", 0).unwrap_err();
    assert!(
        matches!(&err, SyncError::Exhausted(m) if m.contains("fd00::/120") && m.contains("\"n2\"")),
        "{err}"
    );
    assert_eq!(
        c.stats().sets.iter().map(|s| s.used).collect::<Vec<_>>(),
        vec![1, 1]
    );
    assert!(c.held("n2").is_empty());
}

// --- init -----------------------------------------------------------------------------------

#[test]
fn init_occupies_existing_ranges_before_allocating() {
    let mut world = World::with_nodes(&[
        ("a", &["10.0.0.0/24"], &["10.0.0.0/24"]),
        ("b", &["10.0.1.0/24"], &["10.0.1.0/24"]),
        ("c", &[], &[]),
    ]);
    let mut c = start(CLUSTER, &mut world);
    update(&mut c, &mut world, "c", 0).unwrap();
    assert_eq!(world.node("c").pod_cidrs, vec!["10.0.2.0/24"]);
}

#[test]
fn init_skips_and_logs_unusable_ranges() {
    let mut world = World::with_nodes(&[
        ("bad", &["not-a-cidr"], &[]),
        ("far", &["192.168.0.0/24"], &[]),
        ("ok", &["10.0.0.0/24"], &[]),
    ]);
    let nodes: Vec<Node> = world.nodes.values().cloned().collect();
    let c = Controller::init(
        &config(CLUSTER, &[("10.0.0.0/16", 24)]),
        &nodes,
        0,
        &mut world,
    )
    .unwrap();
    assert_eq!(c.stats().sets[0].used, 1);
    assert_eq!(c.stats().nodes, 3);
    assert!(
        world.logs.iter().any(|l| l.contains("not-a-cidr")),
        "{:?}",
        world.logs
    );
    assert!(
        world
            .logs
            .iter()
            .any(|l| l.contains("192.168.0.0/24") && l.contains("10.0.0.0/16")),
        "{:?}",
        world.logs
    );
}

#[test]
fn init_occupies_aliases_of_nodes_without_range_in_sync_from_cluster() {
    let mut world = World::with_nodes(&[("half", &[], &["10.0.0.0/24"]), ("new", &[], &[])]);
    let mut c = start(CLUSTER, &mut world);
    update(&mut c, &mut world, "new", 0).unwrap();
    assert_eq!(
        world.node("new").pod_cidrs,
        vec!["10.0.1.0/24"],
        "the half-finished range is not handed out"
    );
    update(&mut c, &mut world, "half", 0).unwrap();
    assert_converged(&c, &world);
}

#[test]
fn init_fails_when_an_alias_is_unknown() {
    let mut world = World::with_nodes(&[("n1", &[], &[])]);
    world.fail(
        Alias,
        HostError::Unavailable("cloud api down".into()),
        false,
    );
    let nodes: Vec<Node> = world.nodes.values().cloned().collect();
    let err = Controller::init(
        &config(CLUSTER, &[("10.0.0.0/16", 24)]),
        &nodes,
        0,
        &mut world,
    )
    .unwrap_err();
    assert_eq!(
        err,
        SyncError::Host(HostError::Unavailable("cloud api down".into()))
    );
}

#[test]
fn init_schedules_first_resync_one_interval_later() {
    let mut world = World::with_nodes(&[("n1", &["10.0.0.0/24"], &["10.0.0.0/24"])]);
    let nodes: Vec<Node> = world.nodes.values().cloned().collect();
    let c = Controller::init(
        &config(CLUSTER, &[("10.0.0.0/16", 24)]),
        &nodes,
        1_000,
        &mut world,
    )
    .unwrap();
    assert_eq!(c.next_due_ms(), Some(1_000 + DEFAULT_RESYNC_MS));
}

// --- config -------------------------------------------------------------------------------

#[test]
fn config_errors_name_the_value() {
    /// A case's name, its cluster cidrs with node mask sizes, and what the error must contain.
    type Case = (&'static str, &'static [(&'static str, u8)], &'static str);
    let cases: &[Case] = &[
        ("no cluster cidr", &[], "0 cluster cidrs"),
        (
            "three cluster cidrs",
            &[("10.0.0.0/8", 24), ("fd00::/48", 64), ("11.0.0.0/8", 24)],
            "3 cluster cidrs",
        ),
        ("malformed", &[("10.0.0.0/33", 24)], "10.0.0.0/33"),
        ("empty", &[("", 24)], "empty"),
        (
            "same family twice",
            &[("10.0.0.0/8", 24), ("11.0.0.0/8", 24)],
            "11.0.0.0/8",
        ),
        (
            "mask shorter than cluster",
            &[("10.0.0.0/16", 8)],
            "10.0.0.0/16",
        ),
        ("mask 25 bits longer", &[("fd00::/48", 73)], "fd00::/48"),
    ];
    for (case, clusters, expected) in cases {
        let err = Controller::new(&config(CLUSTER, clusters)).unwrap_err();
        assert!(
            matches!(&err, SyncError::InvalidConfig(m) if m.contains(expected)),
            "{case}: {err}"
        );
    }
    let mut bad = config(CLUSTER, &[("10.0.0.0/8", 24)]);
    bad.initial_retry_ms = 20_000;
    let err = Controller::new(&bad).unwrap_err();
    assert!(
        matches!(&err, SyncError::InvalidConfig(m) if m.contains("20000")),
        "{err}"
    );
}

#[test]
fn backoff_doubles_from_initial_retry_up_to_max() {
    let b = Backoff::new(0, 0, 0).unwrap();
    let delays: Vec<u64> = (0..=9).map(|f| b.delay_ms(f)).collect();
    assert_eq!(
        delays,
        vec![
            30_000, 250, 500, 1_000, 2_000, 4_000, 8_000, 10_000, 10_000, 10_000
        ]
    );
    assert_eq!(b.delay_ms(u32::MAX), 10_000);
}

// --- bad input ------------------------------------------------------------------------------

#[test]
fn bad_node_ranges_are_errors_naming_node_and_value() {
    let huge = "1".repeat(1 << 20);
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        ("malformed", vec!["10.0.0/24".into()], "10.0.0/24"),
        ("empty string", vec!["".into()], "empty"),
        ("megabyte string", vec![huge.clone()], "bytes)"),
        ("wrong family", vec!["fd00::/64".into()], "fd00::/64"),
        (
            "more ranges than cluster cidrs",
            vec!["10.0.0.0/24".into(), "10.0.1.0/24".into()],
            "2 pod ranges",
        ),
    ];
    for (case, ranges, expected) in cases {
        let mut world = World::default();
        let mut c = start(CLUSTER, &mut world);
        let n = Node {
            name: "n1".into(),
            provider_id: None,
            pod_cidrs: ranges,
        };
        world.nodes.insert("n1".into(), n.clone());
        let err = c.update(&mut world, &n, 0).unwrap_err();
        let message = err.to_string();
        assert!(
            matches!(err, SyncError::InvalidCidr(_)),
            "{case}: {message}"
        );
        assert!(
            message.contains("\"n1\"") && message.contains(expected),
            "{case}: {message}"
        );
        assert!(
            message.len() < 300,
            "{case}: message of {} bytes",
            message.len()
        );
    }
}

#[test]
fn out_of_range_node_range_is_out_of_range() {
    let mut world = World::with_nodes(&[("n1", &["192.168.0.0/24"], &[])]);
    let mut c = Controller::new(&config(CLUSTER, &[("10.0.0.0/16", 24)])).unwrap();
    let err = update(&mut c, &mut world, "n1", 0).unwrap_err();
    assert!(
        matches!(&err, SyncError::OutOfRange(m) if m.contains("192.168.0.0/24") && m.contains("10.0.0.0/16") && m.contains("\"n1\"")),
        "{err}"
    );
}

#[test]
fn megabyte_node_name_is_cut_in_messages() {
    let name = "n".repeat(1 << 20);
    let mut world = World::default();
    let mut c = start(CLOUD, &mut world);
    let n = world.add_node(&name, &[], &[]);
    let err = c.update(&mut world, &n, 0).unwrap_err();
    assert!(
        err.to_string().len() < 300,
        "{} bytes",
        err.to_string().len()
    );
}

// --- delete -------------------------------------------------------------------------------

#[test]
fn delete_releases_the_range_for_reuse() {
    let mut world = World::with_nodes(&[("n1", &["10.0.0.0/24"], &["10.0.0.0/24"])]);
    let mut c = start(CLUSTER, &mut world);
    delete(&mut c, &mut world, "n1", 0).unwrap();
    assert_eq!(
        (c.stats().nodes, c.stats().sets[0].used, c.stats().releases),
        (0, 0, 1)
    );
    assert_eq!(c.next_due_ms(), None);
}

#[test]
fn delete_with_empty_range_releases_a_pending_allocation() {
    let mut world = World::with_nodes(&[("n1", &[], &[])]);
    let mut c = start(CLUSTER, &mut world);
    world.fail(AddAlias, HostError::Unavailable("timeout".into()), false);
    update(&mut c, &mut world, "n1", 0).unwrap_err();
    assert_eq!(c.stats().sets[0].used, 1);
    delete(&mut c, &mut world, "n1", 0).unwrap();
    assert_eq!(c.stats().sets[0].used, 0);
}

#[test]
fn delete_with_invalid_range_emits_event_and_succeeds() {
    let mut world = World::with_nodes(&[("n1", &["10.0.0.0/24"], &[])]);
    let mut c = start(CLUSTER, &mut world);
    c.delete(&mut world, &node("n1", &["bogus"]), 0).unwrap();
    assert_eq!(world.reasons(), vec![REASON_INVALID_POD_CIDR]);
    assert!(world.events[0].2.contains("bogus"));
    assert_eq!(
        c.stats().sets[0].used,
        0,
        "what the plugin held for n1 is released"
    );
}

#[test]
fn delete_of_unknown_node_releases_nothing() {
    let mut world = World::with_nodes(&[("n1", &["10.0.0.0/24"], &[])]);
    let mut c = start(CLUSTER, &mut world);
    c.delete(&mut world, &node("stranger", &["10.0.0.0/24"]), 0)
        .unwrap();
    assert_eq!(c.stats().sets[0].used, 1);
    assert!(world.logs.iter().any(|l| l.contains("stranger")));
}

// --- tick -----------------------------------------------------------------------------------

#[test]
fn tick_runs_due_resyncs_earliest_first_up_to_the_limit() {
    let mut world = World::with_nodes(&[("a", &[], &[]), ("b", &[], &[]), ("c", &[], &[])]);
    let mut c = start(CLUSTER, &mut world);
    update(&mut c, &mut world, "c", 10).unwrap();
    update(&mut c, &mut world, "a", 20).unwrap();
    update(&mut c, &mut world, "b", 30).unwrap();
    world.take_calls();
    let report = c.tick(&mut world, 30 + DEFAULT_RESYNC_MS, 2);
    assert_eq!((report.resynced, report.failed), (2, 0));
    let order: Vec<String> = world
        .calls
        .iter()
        .filter(|(op, _)| *op == GetNode)
        .map(|(_, n)| n.clone())
        .collect();
    assert_eq!(order, vec!["c", "a"]);
    assert_eq!(report.next_due_ms, Some(30 + DEFAULT_RESYNC_MS));
    let report = c.tick(&mut world, 0, 0);
    assert_eq!((report.resynced, report.failed), (0, 0), "nothing due yet");
}

#[test]
fn tick_forgets_a_node_the_cluster_no_longer_has() {
    let mut world = World::with_nodes(&[("n1", &[], &[])]);
    let mut c = start(CLUSTER, &mut world);
    update(&mut c, &mut world, "n1", 0).unwrap();
    world.nodes.remove("n1");
    let report = c.tick(&mut world, DEFAULT_RESYNC_MS, 0);
    assert_eq!((report.resynced, report.next_due_ms), (1, None));
    assert_eq!((c.stats().nodes, c.stats().sets[0].used), (0, 0));
}

#[test]
fn failures_back_off_then_success_returns_to_resync_interval() {
    let mut world = World::with_nodes(&[("n1", &[], &[])]);
    let mut c = start(CLUSTER, &mut world);
    let mut now = 0;
    let mut delays = Vec::new();
    for _ in 0..8 {
        world.fail(GetNode, HostError::Unavailable("apiserver".into()), false);
        let due = c.next_due_ms().unwrap();
        now = due;
        c.tick(&mut world, now, 0);
        delays.push(c.next_due_ms().unwrap() - now);
    }
    assert_eq!(
        delays,
        vec![250, 500, 1_000, 2_000, 4_000, 8_000, 10_000, 10_000]
    );
    c.tick(&mut world, c.next_due_ms().unwrap(), 0);
    assert_eq!(c.next_due_ms().unwrap() - (now + 10_000), DEFAULT_RESYNC_MS);
}

// --- ranges of other sizes than the node mask ------------------------------------------

#[test]
fn range_overlapping_another_nodes_larger_range_is_refused() {
    let mut world = World::with_nodes(&[("big", &["10.0.0.0/23"], &["10.0.0.0/23"])]);
    let mut c = start(CLUSTER, &mut world);
    world.add_node("s", &["10.0.1.0/24"], &[]);
    let err = update(&mut c, &mut world, "s", 1).unwrap_err();
    assert_eq!(
        err,
        SyncError::InvalidCidr(
            "node \"s\": range 10.0.1.0/24 overlaps range 10.0.0.0/23 held by node \"big\"".into()
        )
    );
    assert!(!world.aliases.contains_key("s"));
}

#[test]
fn releasing_half_a_node_range_keeps_it_while_the_other_half_is_held() {
    let mut world =
        World::with_nodes(&[("p", &["10.0.0.0/25"], &[]), ("q", &["10.0.0.128/25"], &[])]);
    let mut c = start(CLUSTER, &mut world);
    delete(&mut c, &mut world, "p", 1).unwrap();
    assert_eq!(c.stats().sets[0].used, 1, "q still uses the /24");
    world.add_node("n", &[], &[]);
    update(&mut c, &mut world, "n", 2).unwrap();
    assert_eq!(world.node("n").pod_cidrs, vec!["10.0.1.0/24"]);
    delete(&mut c, &mut world, "q", 3).unwrap();
    assert_eq!(
        c.stats().sets[0].used,
        1,
        "the /24 is free once both halves are gone"
    );
}

#[test]
fn mismatched_alias_is_held_for_its_node_until_resolved() {
    let mut world = World::with_nodes(&[("a", &["10.0.5.0/24"], &["10.0.0.0/24"])]);
    let mut c = start(CLUSTER, &mut world);
    update(&mut c, &mut world, "a", 1).unwrap();
    assert_eq!(c.held("a"), &[net("10.0.5.0/24"), net("10.0.0.0/24")]);
    world.add_node("b", &[], &[]);
    update(&mut c, &mut world, "b", 2).unwrap();
    assert_eq!(world.node("b").pod_cidrs, vec!["10.0.1.0/24"]);
    // A person settles it by giving the node its alias: the old range is released.
    world.nodes.get_mut("a").unwrap().pod_cidrs = vec!["10.0.0.0/24".into()];
    update(&mut c, &mut world, "a", 3).unwrap();
    assert_eq!(c.held("a"), &[net("10.0.0.0/24")]);
    assert_eq!(c.stats().sets[0].used, 2);
}

#[test]
fn a_reused_node_slot_does_not_inherit_old_queue_entries() {
    // x, due first, keeps a's stale queue entries buried under the top.
    let mut world = World::with_nodes(&[("x", &[], &[]), ("a", &[], &[])]);
    let mut c = start(CLUSTER, &mut world);
    update(&mut c, &mut world, "x", 0).unwrap();
    for now in 1..5 {
        update(&mut c, &mut world, "a", now).unwrap();
    }
    delete(&mut c, &mut world, "a", 5).unwrap();
    world.add_node("b", &[], &[]);
    for now in 6..9 {
        update(&mut c, &mut world, "b", now).unwrap();
    }
    world.take_calls();
    // Only x is due before b's one live entry at 8 + 30 s.
    let report = c.tick(&mut world, 8 + DEFAULT_RESYNC_MS - 1, 0);
    assert_eq!((report.resynced, report.failed), (1, 0));
    assert_eq!(report.next_due_ms, Some(8 + DEFAULT_RESYNC_MS));
    let report = c.tick(&mut world, 8 + DEFAULT_RESYNC_MS, 0);
    assert_eq!(report.resynced, 1);
}
