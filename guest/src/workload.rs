//! Benchmark workloads (the allocator, and the sync state machine with its host inside the
//! core), shared by the native benchmark (`benches/alloc.rs`) and the
//! wasm one. Each comes as a `*_prepare` (setup, not measured) and a `*_run` (the measured
//! part). No timing in here: callers time `*_run`.

use alloc::vec::Vec;
use core::net::Ipv4Addr;

use ipnet::{IpNet, Ipv4Net};

use alloc::string::{String, ToString};
use hashbrown::HashMap;

use crate::cidrset::{CidrSet, MAX_EXTRA_BITS};
use crate::host::{CloudAlias, Events, KubeApi};
use crate::sync::Controller;
use crate::types::{ClusterCidr, Config, HostError, Level, Node, SyncError, SyncMode};

/// The cluster CIDR of every workload: 10.0.0.0/8.
const CLUSTER: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(10, 0, 0, 0), 8);

/// A fresh set of the 65,536 /24 ranges of 10.0.0.0/8.
pub fn fill_prepare() -> CidrSet {
    set(16)
}

/// Allocates until the set is exhausted; returns how many ranges it allocated.
pub fn fill_run(set: &mut CidrSet) -> u32 {
    let mut count = 0;
    while set.allocate_next().is_ok() {
        count += 1;
    }
    count
}

/// The 65,536 /24 ranges of 10.0.0.0/8 with 99% of them occupied at positions drawn from
/// `seed`, and how many remain free (655).
pub fn fragmented_prepare(seed: u64) -> (CidrSet, u32) {
    let mut set = set(16);
    let max = set.max();
    let free = max / 100;
    // A partial Fisher-Yates shuffle: the first `max - free` indices are the occupied ones.
    let mut indices: Vec<u32> = (0..max).collect();
    let mut rng = SplitMix64(seed);
    for i in 0..(max - free) as usize {
        let j = i + (rng.next() % (indices.len() - i) as u64) as usize;
        indices.swap(i, j);
        let _ = set.occupy(range(16, indices[i]));
    }
    (set, free)
}

/// Allocates the ranges left by `fragmented_prepare` until exhausted; returns how many.
pub fn fragmented_run(set: &mut CidrSet) -> u32 {
    fill_run(set)
}

/// A set of 2^`extra_bits` ranges of 10.0.0.0/8 (`extra_bits` capped at 24: 16 gives 65,536
/// /24s, 24 gives 16,777,216 /32s), full except one range at a position drawn from `seed`,
/// with the allocation cursor just after that range: finding it wraps around the whole set.
pub fn last_free_prepare(extra_bits: u8, seed: u64) -> CidrSet {
    let extra_bits = extra_bits.min(MAX_EXTRA_BITS);
    let mut set = set(extra_bits);
    let hole = range(
        extra_bits,
        (SplitMix64(seed).next() % u64::from(set.max())) as u32,
    );
    let _ = set.occupy(IpNet::V4(CLUSTER));
    let _ = set.release(hole);
    // Allocate and release the hole once to leave the cursor just after it.
    let _ = set.allocate_next();
    let _ = set.release(hole);
    set
}

/// `rounds` times: allocates the single free range (searching from just after it, around the
/// whole set) and releases it again. Returns a checksum of the ranges found.
pub fn last_free_run(set: &mut CidrSet, rounds: u32) -> u64 {
    let mut checksum = 0u64;
    for _ in 0..rounds {
        let Ok(range) = set.allocate_next() else {
            break;
        };
        checksum = checksum.wrapping_mul(31).wrapping_add(fold(range));
        let _ = set.release(range);
    }
    checksum
}

/// A fresh set of 10.0.0.0/8 by /(8 + `extra_bits`), `extra_bits` at most 24.
fn set(extra_bits: u8) -> CidrSet {
    CidrSet::new(IpNet::V4(CLUSTER), CLUSTER.prefix_len() + extra_bits)
        .expect("10.0.0.0/8 by /8 to /32 is a valid set")
}

/// Node range `index` of 10.0.0.0/8 by /(8 + `extra_bits`).
fn range(extra_bits: u8, index: u32) -> IpNet {
    let host_bits = u32::from(24 - extra_bits);
    let addr = u32::from(CLUSTER.network()) | index.checked_shl(host_bits).unwrap_or(0);
    IpNet::V4(Ipv4Net::new_assert(
        Ipv4Addr::from(addr),
        CLUSTER.prefix_len() + extra_bits,
    ))
}

fn fold(range: IpNet) -> u64 {
    match range {
        IpNet::V4(net) => u64::from(u32::from(net.network())),
        IpNet::V6(net) => {
            let bits = u128::from(net.network());
            (bits as u64) ^ ((bits >> 64) as u64)
        }
    }
}

/// Seeded pseudo-random numbers (splitmix64): enough for spreading benchmark positions.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The sync workloads' cluster and cloud, inside the core: every host call stays in the same
/// build, so the wasm and the native figures time the same work (the state machine, the
/// allocator and this map), without the component boundary.
#[derive(Default)]
pub struct MemoryHost {
    /// Pod ranges and cloud alias by node name.
    nodes: HashMap<String, (Vec<String>, Vec<String>)>,
}

impl KubeApi for MemoryHost {
    fn get_node(&mut self, name: &str) -> Result<Node, HostError> {
        let (pod_cidrs, _) = self
            .nodes
            .get(name)
            .ok_or_else(|| HostError::NotFound(name.to_string()))?;
        Ok(Node {
            name: name.to_string(),
            provider_id: None,
            pod_cidrs: pod_cidrs.clone(),
        })
    }

    fn update_node_pod_cidrs(&mut self, node: &Node, cidrs: &[String]) -> Result<(), HostError> {
        let entry = self
            .nodes
            .get_mut(&node.name)
            .ok_or_else(|| HostError::NotFound(node.name.clone()))?;
        entry.0 = cidrs.to_vec();
        Ok(())
    }

    fn update_node_network_unavailable(&mut self, _: &str, _: bool) -> Result<(), HostError> {
        Ok(())
    }
}

impl CloudAlias for MemoryHost {
    fn alias(&mut self, node: &Node) -> Result<Vec<String>, HostError> {
        Ok(self
            .nodes
            .get(&node.name)
            .map(|(_, alias)| alias.clone())
            .unwrap_or_default())
    }

    fn add_alias(&mut self, node: &Node, cidrs: &[String]) -> Result<(), HostError> {
        let entry = self
            .nodes
            .get_mut(&node.name)
            .ok_or_else(|| HostError::NotFound(node.name.clone()))?;
        entry.1 = cidrs.to_vec();
        Ok(())
    }
}

impl Events for MemoryHost {
    fn emit_node_warning(&mut self, _: &str, _: &str, _: &str) {}

    fn log(&mut self, _: Level, _: &str, _: &[(&str, &str)]) {}
}

/// A controller, its in-core host and the nodes to update.
pub struct SyncWorkload {
    controller: Controller,
    host: MemoryHost,
    nodes: Vec<Node>,
}

/// `count` nodes in sync-from-cluster over 10.0.0.0/8 by /26 (and fd00::/40 by /64 when
/// `dual_stack`): in sync (ranges equal alias) when `in_sync`, else new (no range, no alias:
/// each update allocates and makes 4 host calls).
pub fn sync_prepare(
    count: u32,
    in_sync: bool,
    dual_stack: bool,
) -> Result<SyncWorkload, SyncError> {
    let mut host = MemoryHost::default();
    let nodes: Vec<Node> = (0..count)
        .map(|i| {
            let name = alloc::format!("node-{i:06}");
            let ranges = if in_sync {
                node_ranges(i, dual_stack)
            } else {
                Vec::new()
            };
            host.nodes
                .insert(name.clone(), (ranges.clone(), ranges.clone()));
            Node {
                name,
                provider_id: None,
                pod_cidrs: ranges,
            }
        })
        .collect();
    let controller = Controller::init(&cluster_config(dual_stack), &nodes, 0, &mut host)?;
    Ok(SyncWorkload {
        controller,
        host,
        nodes,
    })
}

/// sync-from-cluster over 10.0.0.0/8 by /26, and fd00::/40 by /64 when `dual_stack`.
fn cluster_config(dual_stack: bool) -> Config {
    let mut cluster_cidrs = alloc::vec![ClusterCidr {
        cidr: "10.0.0.0/8".into(),
        node_mask_size: 26,
    }];
    if dual_stack {
        cluster_cidrs.push(ClusterCidr {
            cidr: "fd00::/40".into(),
            node_mask_size: 64,
        });
    }
    Config {
        mode: SyncMode::SyncFromCluster,
        cluster_cidrs,
        resync_ms: 0,
        initial_retry_ms: 0,
        max_backoff_ms: 0,
    }
}

/// Node `i`'s ranges: the `i`-th /26 of 10.0.0.0/8, and the `i`-th /64 of fd00::/40.
fn node_ranges(i: u32, dual_stack: bool) -> Vec<String> {
    let v4 = Ipv4Addr::from(0x0A00_0000 | (i << 6));
    let mut ranges = alloc::vec![alloc::format!("{v4}/26")];
    if dual_stack {
        let v6 = core::net::Ipv6Addr::from((0xfd00u128 << 112) | (u128::from(i) << 64));
        ranges.push(alloc::format!("{v6}/64"));
    }
    ranges
}

/// Updates every node once; returns how many updates succeeded.
pub fn sync_run(workload: &mut SyncWorkload) -> u32 {
    let SyncWorkload {
        controller,
        host,
        nodes,
    } = workload;
    nodes
        .iter()
        .filter(|node| controller.update(host, node, 1).is_ok())
        .count() as u32
}

/// The nodes and config of the `init` workload: `count` dual-stack nodes, each with the
/// `i`-th /26 of 10.0.0.0/8 and the `i`-th /64 of fd00::/40.
pub struct InitWorkload {
    config: Config,
    nodes: Vec<Node>,
}

/// Builds the `init` workload's nodes (not timed).
pub fn init_prepare(count: u32) -> InitWorkload {
    let nodes = (0..count)
        .map(|i| Node {
            name: alloc::format!("node-{i:06}"),
            provider_id: None,
            pod_cidrs: node_ranges(i, true),
        })
        .collect();
    InitWorkload {
        config: cluster_config(true),
        nodes,
    }
}

/// `Controller::init` over the workload's nodes (every node has a range: no host call);
/// returns how many node ranges are in use.
pub fn init_run(workload: &InitWorkload) -> u32 {
    Controller::init(
        &workload.config,
        &workload.nodes,
        0,
        &mut MemoryHost::default(),
    )
    .map_or(0, |c| c.stats().sets.iter().map(|s| s.used).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_allocates_every_range() {
        let mut set = fill_prepare();
        assert_eq!(fill_run(&mut set), 65_536);
        assert_eq!(set.used(), 65_536);
    }

    #[test]
    fn fragmented_leaves_one_percent_and_run_takes_it() {
        let (mut set, free) = fragmented_prepare(7);
        assert_eq!((free, set.used()), (655, 65_536 - 655));
        assert_eq!(fragmented_run(&mut set), free);
    }

    #[test]
    fn fragmented_positions_depend_on_seed() {
        let (mut a, _) = fragmented_prepare(1);
        let (mut b, _) = fragmented_prepare(2);
        assert_ne!(a.allocate_next(), b.allocate_next());
    }

    #[test]
    fn last_free_wraps_around_whole_set_each_round() {
        let mut set = last_free_prepare(16, 3);
        let tries = set.allocation_tries();
        let first = last_free_run(&mut set, 1);
        assert_ne!(first, 0);
        // Skips the 65,535 other ranges, all occupied.
        assert_eq!(set.allocation_tries() - tries, 65_535);
        assert_eq!(set.used(), 65_535);
    }

    #[test]
    fn last_free_extra_bits_capped_at_24() {
        assert_eq!(last_free_prepare(30, 1).max(), 1 << 24);
    }

    #[test]
    fn splitmix64_matches_reference_output() {
        // First output of the reference splitmix64 seeded with 0.
        assert_eq!(SplitMix64(0).next(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn sync_workloads_update_every_node() {
        let mut in_sync = sync_prepare(100, true, true).unwrap();
        assert_eq!(sync_run(&mut in_sync), 100);
        assert_eq!(
            in_sync.controller.stats().allocations,
            200,
            "both families occupied at init, none allocated"
        );
        let mut new = sync_prepare(100, false, true).unwrap();
        assert_eq!(sync_run(&mut new), 100);
        let used: Vec<u32> = new.controller.stats().sets.iter().map(|s| s.used).collect();
        assert_eq!(used, [100, 100]);
        assert!(
            new.host
                .nodes
                .values()
                .all(|(ranges, alias)| ranges.len() == 2 && ranges == alias)
        );
        let mut single = sync_prepare(100, false, false).unwrap();
        assert_eq!(sync_run(&mut single), 100);
        assert_eq!(single.controller.stats().sets.len(), 1);
    }

    #[test]
    fn init_workload_occupies_both_families_of_every_node() {
        assert_eq!(init_run(&init_prepare(1_000)), 2_000);
    }
}
