//! The per-node sync state machine: keeps each node's pod ranges and its VM's cloud alias in
//! agreement, and owns the allocators. Sans-IO: host calls go through [`Host`], time comes in
//! as `now_ms`, the next deadline goes out in [`TickReport`].

use alloc::collections::{BTreeMap, BinaryHeap};
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::cmp::Reverse;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use core::ops::Bound;
use hashbrown::HashMap;
use hashbrown::hash_map::EntryRef;
use smallvec::SmallVec;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::cidr::{cidr_string, parse_cidr};
use crate::cidrset::{CidrSet, CidrSetError};
use crate::host::Host;
use crate::types::{Config, HostError, Level, Node, Stats, SyncError, SyncMode, TickReport, Usage};

/// Warning reason: the node's range and its cloud alias differ.
pub const REASON_MISMATCH: &str = "CloudCIDRAllocatorMismatch";
/// Warning reason: the node needs an action the configured mode does not allow.
pub const REASON_INVALID_MODE: &str = "CloudCIDRAllocatorInvalidMode";
/// Warning reason: a deleted node carried a range that does not parse.
pub const REASON_INVALID_POD_CIDR: &str = "CloudCIDRAllocatorInvalidPodCIDR";

/// Default delay between resyncs of a node in sync.
pub const DEFAULT_RESYNC_MS: u64 = 30_000;
/// Default first retry delay after a failure.
pub const DEFAULT_INITIAL_RETRY_MS: u64 = 250;
/// Default upper bound of the retry delay.
pub const DEFAULT_MAX_BACKOFF_MS: u64 = 10_000;

/// Longest value quoted in a message; longer ones are cut (a megabyte name stays a line).
const MAX_QUOTED: usize = 64;
/// Longest host error message passed on.
const MAX_MESSAGE: usize = 256;

/// When a node is next re-checked: `resync_ms` after a success; after consecutive failures
/// `initial_retry_ms`, doubling up to `max_backoff_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    resync_ms: u64,
    initial_retry_ms: u64,
    max_backoff_ms: u64,
}

impl Backoff {
    /// Validates the intervals; zero means the default.
    pub fn new(
        resync_ms: u64,
        initial_retry_ms: u64,
        max_backoff_ms: u64,
    ) -> Result<Self, SyncError> {
        let or = |v: u64, d: u64| if v == 0 { d } else { v };
        let backoff = Self {
            resync_ms: or(resync_ms, DEFAULT_RESYNC_MS),
            initial_retry_ms: or(initial_retry_ms, DEFAULT_INITIAL_RETRY_MS),
            max_backoff_ms: or(max_backoff_ms, DEFAULT_MAX_BACKOFF_MS),
        };
        if backoff.initial_retry_ms > backoff.max_backoff_ms {
            return Err(SyncError::InvalidConfig(format!(
                "initial retry {} ms is longer than max backoff {} ms",
                backoff.initial_retry_ms, backoff.max_backoff_ms
            )));
        }
        Ok(backoff)
    }

    /// The delay after `failures` consecutive failures (0: after a success).
    pub fn delay_ms(&self, failures: u32) -> u64 {
        if failures == 0 {
            return self.resync_ms;
        }
        let doublings = (failures - 1).min(63);
        self.initial_retry_ms
            .checked_mul(1u64 << doublings)
            .map_or(self.max_backoff_ms, |d| d.min(self.max_backoff_ms))
    }
}

/// A node's ranges: one per cluster CIDR, so at most two, kept inline.
type Ranges = SmallVec<[IpNet; 2]>;

/// A node's index in the controller's table: cheap to copy, compare and queue.
type NodeId = u32;

/// A range as a key of integers within one IP family, ordered as `IpNet` is (address, then
/// prefix) but compared without a byte-wise `memcmp` of addresses, which is slow in wasm. The
/// address is two `u64` halves rather than a `u128`: a `u128` would make the key 16-aligned,
/// and every tree node an aligned allocation, which the guest's allocator serves on a slow path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct RangeKey {
    high: u64,
    low: u64,
    prefix: u8,
}

impl RangeKey {
    fn of(range: IpNet) -> Self {
        Self::at(range.addr(), range.prefix_len())
    }

    fn at(addr: IpAddr, prefix: u8) -> Self {
        let bits = match addr {
            IpAddr::V4(a) => u128::from(a.to_bits()),
            IpAddr::V6(a) => a.to_bits(),
        };
        Self {
            high: (bits >> 64) as u64,
            low: bits as u64,
            prefix,
        }
    }

    /// Below every key of a range starting inside `range`.
    fn first_of(range: IpNet) -> Self {
        Self::at(range.network(), 0)
    }

    /// Above every key of a range starting inside `range`.
    fn last_of(range: IpNet) -> Self {
        Self::at(range.broadcast(), u8::MAX)
    }

    /// The range the key was made of, in the family of `like`.
    fn range(self, like: IpNet) -> IpNet {
        let bits = (u128::from(self.high) << 64) | u128::from(self.low);
        let range = match like {
            IpNet::V4(_) => {
                Ipv4Net::new(Ipv4Addr::from_bits(bits as u32), self.prefix).map(IpNet::V4)
            }
            IpNet::V6(_) => Ipv6Net::new(Ipv6Addr::from_bits(bits), self.prefix).map(IpNet::V6),
        };
        range.expect("a key made of a valid range")
    }
}

/// Held ranges of one IP family and their holders, in descending order: the allocator hands
/// ranges out in ascending order, and a B-tree search scans each tree node from its first key,
/// so a new range finds its place after one comparison per level.
type Family = BTreeMap<Reverse<RangeKey>, NodeId>;

/// Which node holds each range (the allocator only knows that a range is used). Held ranges
/// never overlap.
#[derive(Debug, Default)]
struct Holders {
    v4: Family,
    v6: Family,
}

impl Holders {
    fn family(&self, range: IpNet) -> &Family {
        match range {
            IpNet::V4(_) => &self.v4,
            IpNet::V6(_) => &self.v6,
        }
    }

    fn family_mut(&mut self, range: IpNet) -> &mut Family {
        match range {
            IpNet::V4(_) => &mut self.v4,
            IpNet::V6(_) => &mut self.v6,
        }
    }

    fn insert(&mut self, range: IpNet, id: NodeId) {
        self.family_mut(range)
            .insert(Reverse(RangeKey::of(range)), id);
    }

    fn holder(&self, range: IpNet) -> Option<NodeId> {
        self.family(range)
            .get(&Reverse(RangeKey::of(range)))
            .copied()
    }

    fn remove(&mut self, range: IpNet) {
        self.family_mut(range).remove(&Reverse(RangeKey::of(range)));
    }

    /// A held range that overlaps `range`, and its holder. CIDRs overlap only by nesting, and
    /// held ranges never overlap each other, so two ordered lookups find it: a held range that
    /// starts inside `range`, or the last one starting before it, if that one contains it.
    fn overlapping(&self, range: IpNet) -> Option<(IpNet, NodeId)> {
        let family = self.family(range);
        let first = Reverse(RangeKey::first_of(range));
        let last = Reverse(RangeKey::last_of(range));
        let inside = family.range(last..=first).next();
        let before = family
            .range((Bound::Excluded(first), Bound::Unbounded))
            .next()
            .filter(|(held, _)| held.0.range(range).contains(&range));
        inside
            .or(before)
            .map(|(held, &holder)| (held.0.range(range), holder))
    }
}

/// What the controller remembers of one node.
#[derive(Debug)]
struct NodeState {
    name: String,
    /// Ranges occupied on the node's behalf (its own, an adopted alias, or an allocation).
    held: Ranges,
    /// The network has not been marked available since the node became known or since a
    /// write sequence for it started: a resync that finds it in sync marks it (again), so a
    /// failed or interrupted write sequence, or a restart, never leaves it unavailable.
    network_pending: bool,
    /// Consecutive failed syncs.
    failures: u32,
    /// Counts the node's schedulings: the queue entry with this number is its live one.
    schedule: u32,
}

impl NodeState {
    fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            held: Ranges::new(),
            network_pending: true,
            failures: 0,
            schedule: 0,
        }
    }
}

/// The node IPAM controller: allocators, per-node state and the resync schedule.
#[derive(Debug)]
pub struct Controller {
    mode: SyncMode,
    sets: Vec<CidrSet>,
    backoff: Backoff,
    /// Every known node by name, into `nodes`.
    ids: HashMap<String, NodeId>,
    /// Node states by id; a forgotten node's slot is reused (`free`).
    nodes: Vec<NodeState>,
    free: Vec<NodeId>,
    /// Which node holds each range.
    holders: Holders,
    /// Resync queue: a min-heap of (due, node, schedule). Rescheduling pushes a new entry and
    /// leaves the old one stale (its schedule number no longer matches the node's); stale
    /// entries are dropped when they reach the top, so the top is always live.
    queue: BinaryHeap<Reverse<(u64, NodeId, u32)>>,
}

impl Controller {
    /// Validates `config`, occupies the ranges of every node (and, in `sync-from-cluster`, the
    /// cloud alias of every node without a range), and schedules every node's first resync.
    /// Unusable ranges are logged and skipped; a failed alias lookup fails the whole init.
    pub fn init(
        config: &Config,
        nodes: &[Node],
        now_ms: u64,
        host: &mut impl Host,
    ) -> Result<Self, SyncError> {
        let mut controller = Self::new(config)?;
        controller.ids.reserve(nodes.len());
        controller.nodes.reserve(nodes.len());
        for node in nodes {
            let id = controller.know(&node.name);
            for text in &node.pod_cidrs {
                controller.occupy_at_start(host, id, "pod range", text);
            }
        }
        if controller.mode == SyncMode::SyncFromCluster {
            for node in nodes.iter().filter(|n| n.pod_cidrs.is_empty()) {
                let alias = match host.alias(node) {
                    Ok(alias) => alias,
                    Err(HostError::NotFound(_)) => continue,
                    Err(e) => return Err(host_error(e)),
                };
                let id = controller.know(&node.name);
                for text in &alias {
                    controller.occupy_at_start(host, id, "cloud alias", text);
                }
            }
        }
        let due = now_ms.saturating_add(controller.backoff.delay_ms(0));
        for id in 0..controller.nodes.len() {
            controller.schedule_at(id as NodeId, due);
        }
        host.log(
            Level::Info,
            "initialized",
            &[
                ("nodes", &controller.ids.len().to_string()),
                ("mode", mode_name(controller.mode)),
            ],
        );
        Ok(controller)
    }

    /// A controller with no nodes.
    pub fn new(config: &Config) -> Result<Self, SyncError> {
        Ok(Self {
            mode: config.mode,
            sets: cidr_sets(config)?,
            backoff: Backoff::new(
                config.resync_ms,
                config.initial_retry_ms,
                config.max_backoff_ms,
            )?,
            ids: HashMap::new(),
            nodes: Vec::new(),
            free: Vec::new(),
            holders: Holders::default(),
            queue: BinaryHeap::new(),
        })
    }

    /// A node was added or changed: sync it now and reschedule it.
    pub fn update(
        &mut self,
        host: &mut impl Host,
        node: &Node,
        now_ms: u64,
    ) -> Result<(), SyncError> {
        let id = self.know(&node.name);
        let result = self.sync(host, id, node);
        self.reschedule(id, now_ms, result.is_ok());
        result
    }

    /// A node was deleted: release its ranges and any range held for it, and forget it.
    pub fn delete(
        &mut self,
        host: &mut impl Host,
        node: &Node,
        _now_ms: u64,
    ) -> Result<(), SyncError> {
        let name = node.name.as_str();
        let Some(&id) = self.ids.get(name) else {
            host.log(
                Level::Info,
                "deleted node is not known: releasing nothing",
                &[("node", &quote(name))],
            );
            return Ok(());
        };
        for text in &node.pod_cidrs {
            match parse_cidr(text) {
                Ok(range) => self.release_for(host, id, range),
                Err(why) => host.emit_node_warning(
                    name,
                    REASON_INVALID_POD_CIDR,
                    &format!("node {}: pod range {}: {why}", quote(name), quote(text)),
                ),
            }
        }
        self.forget(host, id);
        Ok(())
    }

    /// Runs the resyncs due at `now_ms`, earliest first, at most `max_resyncs` (0: all).
    pub fn tick(&mut self, host: &mut impl Host, now_ms: u64, max_resyncs: u32) -> TickReport {
        let mut report = TickReport::default();
        let limit = if max_resyncs == 0 {
            u32::MAX
        } else {
            max_resyncs
        };
        while report.resynced + report.failed < limit {
            match self.queue.peek() {
                Some(&Reverse((due, _, _))) if due <= now_ms => {}
                _ => break,
            }
            let Some(Reverse((_, id, _))) = self.queue.pop() else {
                break;
            };
            // Not queued any more until rescheduled.
            self.nodes[id as usize].schedule = self.nodes[id as usize].schedule.wrapping_add(1);
            self.drop_stale();
            match self.resync(host, id, now_ms) {
                Ok(()) => report.resynced += 1,
                Err(e) => {
                    report.failed += 1;
                    host.log(
                        Level::Warn,
                        "resync failed",
                        &[("node", &quote(self.name(id))), ("error", &e.to_string())],
                    );
                }
            }
        }
        report.next_due_ms = self.next_due_ms();
        report
    }

    /// The allocators' counters.
    pub fn stats(&self) -> Stats {
        let mut stats = Stats {
            nodes: u32::try_from(self.ids.len()).unwrap_or(u32::MAX),
            ..Stats::default()
        };
        for set in &self.sets {
            stats.sets.push(Usage {
                cidr: set.cluster().to_string(),
                node_mask_size: set.node_mask_size(),
                max: set.max(),
                used: set.used(),
            });
            stats.allocations += set.allocations();
            stats.releases += set.releases();
            stats.allocation_tries += set.allocation_tries();
        }
        stats
    }

    /// When the earliest resync is due.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.queue.peek().map(|&Reverse((due, _, _))| due)
    }

    /// The ranges the controller holds for a node.
    pub fn held(&self, name: &str) -> &[IpNet] {
        self.ids
            .get(name)
            .map_or(&[], |&id| &self.nodes[id as usize].held)
    }

    /// Re-reads the node from the cluster and syncs it. A node the cluster no longer has is
    /// forgotten and its ranges released.
    fn resync(&mut self, host: &mut impl Host, id: NodeId, now_ms: u64) -> Result<(), SyncError> {
        let result = match host.get_node(self.name(id)) {
            Ok(node) => self.sync(host, id, &node),
            Err(HostError::NotFound(_)) => {
                host.log(
                    Level::Info,
                    "node is gone from the cluster: releasing its ranges",
                    &[("node", &quote(self.name(id)))],
                );
                self.forget(host, id);
                return Ok(());
            }
            Err(e) => Err(host_error(e)),
        };
        self.reschedule(id, now_ms, result.is_ok());
        result
    }

    /// The update: compare the node's ranges with its cloud alias and act (DESIGN.md's table).
    fn sync(&mut self, host: &mut impl Host, id: NodeId, node: &Node) -> Result<(), SyncError> {
        let ranges = self.parse_ranges(&node.name, "pod range", &node.pod_cidrs)?;
        let parsed_alias;
        let alias: &[IpNet] = match host.alias(node) {
            // The same texts as the node's: the same ranges (the common, in-sync case).
            Ok(alias) if alias == node.pod_cidrs => &ranges,
            Ok(alias) => {
                parsed_alias = self.parse_ranges(&node.name, "cloud alias", &alias)?;
                &parsed_alias
            }
            Err(HostError::NotFound(_)) => &[],
            Err(e) => return Err(host_error(e)),
        };
        match (ranges.is_empty(), alias.is_empty()) {
            (true, true) => self.allocate(host, id, node),
            (true, false) => self.update_node_from_alias(host, id, node, alias),
            (false, true) => self.update_alias_from_node(host, id, node, &ranges),
            (false, false) => self.validate(host, id, node, &ranges, alias),
        }
    }

    /// No range, no alias: allocate (or reuse a pending allocation), push it to the cloud,
    /// set it on the node, mark the network available.
    fn allocate(&mut self, host: &mut impl Host, id: NodeId, node: &Node) -> Result<(), SyncError> {
        self.require_mode(host, node, SyncMode::SyncFromCluster, "allocate a range")?;
        self.nodes[id as usize].network_pending = true;
        if self.nodes[id as usize].held.is_empty() {
            let ranges = self.allocate_all(&node.name)?;
            for range in ranges {
                self.hold(id, range);
            }
        }
        let cidrs = to_strings(&self.nodes[id as usize].held);
        match host.add_alias(node, &cidrs) {
            Ok(()) => {}
            Err(e @ HostError::Unavailable(_)) => {
                // The cloud may have applied it: the range stays held for this node (pending),
                // and the next resync pushes it again or adopts the alias.
                return Err(host_error(e));
            }
            Err(e) => {
                self.release_all(host, id);
                return Err(host_error(e));
            }
        }
        host.update_node_pod_cidrs(node, &cidrs)
            .map_err(host_error)?;
        self.mark_network_available(host, id)
    }

    /// No range, an alias: in `sync-from-cloud` copy the alias onto the node. In
    /// `sync-from-cluster` this is an allocation whose node write failed: complete it when the
    /// alias is a node-sized range in a cluster CIDR that no other node holds.
    fn update_node_from_alias(
        &mut self,
        host: &mut impl Host,
        id: NodeId,
        node: &Node,
        alias: &[IpNet],
    ) -> Result<(), SyncError> {
        if self.mode == SyncMode::SyncFromCluster && !self.is_unfinished_allocation(id, alias) {
            self.require_mode(
                host,
                node,
                SyncMode::SyncFromCloud,
                "copy the cloud alias to the node",
            )?;
        }
        self.nodes[id as usize].network_pending = true;
        self.settle(host, id, alias)?;
        host.update_node_pod_cidrs(node, &to_strings(alias))
            .map_err(host_error)?;
        self.mark_network_available(host, id)
    }

    /// A range, no alias: occupy the node's range and push it to the cloud.
    fn update_alias_from_node(
        &mut self,
        host: &mut impl Host,
        id: NodeId,
        node: &Node,
        ranges: &[IpNet],
    ) -> Result<(), SyncError> {
        self.require_mode(
            host,
            node,
            SyncMode::SyncFromCluster,
            "add the node's range as a cloud alias",
        )?;
        self.nodes[id as usize].network_pending = true;
        self.settle(host, id, ranges)?;
        host.add_alias(node, &to_strings(ranges))
            .map_err(host_error)?;
        self.mark_network_available(host, id)
    }

    /// A range and an alias: equal is in sync; different needs a person.
    fn validate(
        &mut self,
        host: &mut impl Host,
        id: NodeId,
        node: &Node,
        ranges: &[IpNet],
        alias: &[IpNet],
    ) -> Result<(), SyncError> {
        if ranges == alias {
            self.settle(host, id, ranges)?;
            if self.nodes[id as usize].network_pending {
                return self.mark_network_available(host, id);
            }
            return Ok(());
        }
        // The alias is attached to the node's VM: hold it too (where it is free) so it is not
        // handed to another node while a person decides.
        let mut keep = Ranges::from_slice(ranges);
        for &range in alias {
            let usable = self.set_for(range).is_some_and(|set| set.contains(range))
                && !keep.iter().any(|k| k.contains(&range) || range.contains(k))
                && self
                    .holders
                    .overlapping(range)
                    .is_none_or(|(held, holder)| held == range && holder == id);
            if usable {
                keep.push(range);
            }
        }
        self.settle(host, id, &keep)?;
        host.emit_node_warning(
            &node.name,
            REASON_MISMATCH,
            &format!(
                "node {} has pod ranges {} but its cloud alias is {}: not changing either",
                quote(&node.name),
                join(ranges),
                join(alias)
            ),
        );
        Ok(())
    }

    fn mark_network_available(
        &mut self,
        host: &mut impl Host,
        id: NodeId,
    ) -> Result<(), SyncError> {
        let result = host.update_node_network_unavailable(self.name(id), false);
        self.nodes[id as usize].network_pending = result.is_err();
        result.map_err(host_error)
    }

    /// Fails with `invalid-mode` (and a warning event) unless the mode is `needed`.
    fn require_mode(
        &self,
        host: &mut impl Host,
        node: &Node,
        needed: SyncMode,
        action: &str,
    ) -> Result<(), SyncError> {
        if self.mode == needed {
            return Ok(());
        }
        let message = format!(
            "node {}: cannot {action} in {} mode (that is done in {} mode)",
            quote(&node.name),
            mode_name(self.mode),
            mode_name(needed),
        );
        host.emit_node_warning(&node.name, REASON_INVALID_MODE, &message);
        Err(SyncError::InvalidMode(message))
    }

    /// An alias made of node-sized ranges in the cluster CIDRs, free or held by this node.
    fn is_unfinished_allocation(&self, id: NodeId, alias: &[IpNet]) -> bool {
        alias.iter().all(|&range| {
            let Some(set) = self.set_for(range) else {
                return false;
            };
            if range.prefix_len() != set.node_mask_size() || !set.contains(range) {
                return false;
            }
            match self.holders.overlapping(range) {
                Some((held, holder)) => held == range && holder == id,
                None => !set.is_occupied(range).unwrap_or(true),
            }
        })
    }

    /// One range from every set, all or nothing.
    fn allocate_all(&mut self, name: &str) -> Result<Ranges, SyncError> {
        let mut ranges = Ranges::new();
        for i in 0..self.sets.len() {
            match self.sets[i].allocate_next() {
                Ok(range) => ranges.push(range),
                Err(e) => {
                    for (set, &range) in self.sets.iter_mut().zip(&ranges) {
                        // Just allocated from this very set: releasing cannot fail.
                        let _ = set.release(range);
                    }
                    return Err(SyncError::Exhausted(format!("node {}: {e}", quote(name))));
                }
            }
        }
        Ok(ranges)
    }

    /// Occupies `range` for the node. A range overlapping one that is held already (by
    /// another node, or by this node under another range) is refused: held ranges never
    /// overlap.
    fn occupy_for(&mut self, id: NodeId, range: IpNet) -> Result<(), SyncError> {
        // Every held range is occupied in its set, so a range no larger than a node range
        // whose node range is free overlaps nothing held: skip the lookups (the common case
        // at start and for new nodes).
        let free_slot = self.set_for(range).is_some_and(|set| {
            range.prefix_len() >= set.node_mask_size() && set.is_occupied(range) == Ok(false)
        });
        let found = if free_slot {
            None
        } else {
            self.holders.overlapping(range)
        };
        if let Some((held, holder)) = found {
            if held == range && holder == id {
                return Ok(());
            }
            let relation = if held == range {
                String::from("is already held")
            } else {
                format!("overlaps range {held} held")
            };
            return Err(SyncError::InvalidCidr(format!(
                "node {}: range {range} {relation} by node {}",
                quote(self.name(id)),
                quote(self.name(holder))
            )));
        }
        let Some(set) = self
            .sets
            .iter_mut()
            .find(|s| same_family(s.cluster(), range))
        else {
            return Err(SyncError::InvalidCidr(format!(
                "node {}: range {range} has no cluster cidr of its ip family",
                quote(self.name(id))
            )));
        };
        if let Err(e) = set.occupy(range) {
            return Err(cidr_error(self.name(id), e));
        }
        self.hold(id, range);
        Ok(())
    }

    /// At start: occupy a node's range or alias, logging (not failing) what cannot be used.
    fn occupy_at_start(&mut self, host: &mut impl Host, id: NodeId, what: &str, text: &str) {
        let result = match parse_cidr(text) {
            Ok(range) => self.occupy_for(id, range),
            Err(why) => Err(SyncError::InvalidCidr(format!(
                "node {}: {what} {}: {why}",
                quote(self.name(id)),
                quote(text)
            ))),
        };
        if let Err(e) = result {
            host.log(
                Level::Warn,
                "skipping a range at start",
                &[("node", &quote(self.name(id))), ("error", &e.to_string())],
            );
        }
    }

    /// Makes `ranges` exactly what the node holds: releases anything else held for it (a
    /// pending allocation the node or the cloud did not end up with, a range the node no
    /// longer has), then occupies them.
    fn settle(
        &mut self,
        host: &mut impl Host,
        id: NodeId,
        ranges: &[IpNet],
    ) -> Result<(), SyncError> {
        let held = &self.nodes[id as usize].held;
        if held.len() == ranges.len() && held.iter().all(|r| ranges.contains(r)) {
            return Ok(());
        }
        for range in held.clone() {
            if !ranges.contains(&range) {
                self.release_for(host, id, range);
            }
        }
        for &range in ranges {
            self.occupy_for(id, range)?;
        }
        Ok(())
    }

    /// Records `range` as held by the node (the allocator already has it).
    fn hold(&mut self, id: NodeId, range: IpNet) {
        self.holders.insert(range, id);
        self.nodes[id as usize].held.push(range);
    }

    /// Releases `range` for the node: forgets it as held, and frees its node ranges in the
    /// allocator unless another held range still uses them (a range overlapping another node's
    /// is left alone; one smaller than a node range frees that node range only when nothing
    /// else held lies in it).
    fn release_for(&mut self, host: &mut impl Host, id: NodeId, range: IpNet) {
        if self.holders.holder(range) == Some(id) {
            self.holders.remove(range);
            self.nodes[id as usize].held.retain(|r| *r != range);
        }
        let Some(set) = self
            .sets
            .iter()
            .position(|s| same_family(s.cluster(), range))
        else {
            return;
        };
        let slot = node_range_of(range, self.sets[set].node_mask_size());
        if let Some((held, holder)) = self.holders.overlapping(slot) {
            host.log(
                Level::Info,
                "not releasing a range that another held range uses",
                &[
                    ("node", &quote(self.name(id))),
                    ("range", &range.to_string()),
                    ("held", &held.to_string()),
                    ("holder", &quote(self.name(holder))),
                ],
            );
            return;
        }
        if let Err(e) = self.sets[set].release(range) {
            host.log(
                Level::Warn,
                "not releasing a range outside the cluster cidrs",
                &[("node", &quote(self.name(id))), ("error", &e.to_string())],
            );
        }
    }

    /// Releases everything held for the node.
    fn release_all(&mut self, host: &mut impl Host, id: NodeId) {
        for range in self.nodes[id as usize].held.clone() {
            self.release_for(host, id, range);
        }
    }

    /// Releases everything held for the node, drops it from the schedule and frees its slot.
    fn forget(&mut self, host: &mut impl Host, id: NodeId) {
        self.release_all(host, id);
        let state = &mut self.nodes[id as usize];
        self.ids.remove(&state.name);
        let schedule = state.schedule.wrapping_add(1);
        *state = NodeState {
            schedule,
            ..NodeState::new("")
        };
        self.free.push(id);
        self.drop_stale();
    }

    /// The node's id, adding it when it is new (the name is hashed once either way).
    fn know(&mut self, name: &str) -> NodeId {
        let vacant = match self.ids.entry_ref(name) {
            EntryRef::Occupied(entry) => return *entry.get(),
            EntryRef::Vacant(vacant) => vacant,
        };
        let state = NodeState::new(name);
        let id = match self.free.pop() {
            Some(id) => {
                // Keep counting schedules: the slot's old queue entries must stay stale.
                let schedule = self.nodes[id as usize].schedule;
                self.nodes[id as usize] = NodeState { schedule, ..state };
                id
            }
            None => {
                self.nodes.push(state);
                (self.nodes.len() - 1) as NodeId
            }
        };
        vacant.insert(id);
        id
    }

    fn name(&self, id: NodeId) -> &str {
        &self.nodes[id as usize].name
    }

    fn reschedule(&mut self, id: NodeId, now_ms: u64, ok: bool) {
        let state = &mut self.nodes[id as usize];
        state.failures = if ok {
            0
        } else {
            state.failures.saturating_add(1)
        };
        let due = now_ms.saturating_add(self.backoff.delay_ms(state.failures));
        self.schedule_at(id, due);
    }

    fn schedule_at(&mut self, id: NodeId, due_ms: u64) {
        let state = &mut self.nodes[id as usize];
        state.schedule = state.schedule.wrapping_add(1);
        self.queue.push(Reverse((due_ms, id, state.schedule)));
        self.drop_stale();
        if self.queue.len() > 2 * self.ids.len() + 1024 {
            // Many reschedules since the stale entries last reached the top: rebuild.
            let nodes = &self.nodes;
            self.queue
                .retain(|&Reverse((_, id, schedule))| nodes[id as usize].schedule == schedule);
        }
    }

    /// Drops stale entries from the top of the queue.
    fn drop_stale(&mut self) {
        while let Some(&Reverse((_, id, schedule))) = self.queue.peek() {
            if self.nodes[id as usize].schedule == schedule {
                break;
            }
            self.queue.pop();
        }
    }

    fn set_for(&self, range: IpNet) -> Option<&CidrSet> {
        self.sets.iter().find(|s| same_family(s.cluster(), range))
    }

    /// Parses a node's range list: at most one range per cluster CIDR, each of a family the
    /// config has; returned in config order.
    fn parse_ranges(&self, name: &str, what: &str, texts: &[String]) -> Result<Ranges, SyncError> {
        if texts.len() > self.sets.len() {
            return Err(SyncError::InvalidCidr(format!(
                "node {}: {} {what}s given ({}) but only {} cluster cidr{} configured",
                quote(name),
                texts.len(),
                texts.iter().map(|t| quote(t)).collect::<Vec<_>>().join(","),
                self.sets.len(),
                if self.sets.len() == 1 { " is" } else { "s are" }
            )));
        }
        let mut ranges = Ranges::new();
        for text in texts {
            let range = parse_cidr(text).map_err(|why| {
                SyncError::InvalidCidr(format!(
                    "node {}: {what} {}: {why}",
                    quote(name),
                    quote(text)
                ))
            })?;
            if self.set_for(range).is_none() {
                return Err(SyncError::InvalidCidr(format!(
                    "node {}: {what} {range} has no cluster cidr of its ip family",
                    quote(name)
                )));
            }
            if ranges.iter().any(|r: &IpNet| same_family(*r, range)) {
                return Err(SyncError::InvalidCidr(format!(
                    "node {}: {what}s {} have two ranges of one ip family",
                    quote(name),
                    texts.iter().map(|t| quote(t)).collect::<Vec<_>>().join(",")
                )));
            }
            ranges.push(range);
        }
        // In the order of the cluster CIDRs: two ranges are one of each family.
        if ranges.len() == 2 && !same_family(ranges[0], self.sets[0].cluster()) {
            ranges.swap(0, 1);
        }
        Ok(ranges)
    }
}

/// Builds one allocator per cluster CIDR: one, or two of different families.
fn cidr_sets(config: &Config) -> Result<Vec<CidrSet>, SyncError> {
    let count = config.cluster_cidrs.len();
    if count == 0 || count > 2 {
        return Err(SyncError::InvalidConfig(format!(
            "{count} cluster cidrs given: need one, or two of different ip families"
        )));
    }
    let mut sets: Vec<CidrSet> = Vec::with_capacity(count);
    for cluster in &config.cluster_cidrs {
        let cidr = parse_cidr(&cluster.cidr).map_err(|why| {
            SyncError::InvalidConfig(format!("cluster cidr {}: {why}", quote(&cluster.cidr)))
        })?;
        if let Some(other) = sets.iter().find(|s| same_family(s.cluster(), cidr)) {
            return Err(SyncError::InvalidConfig(format!(
                "cluster cidrs {} and {cidr} are of one ip family: dual-stack needs one of each",
                other.cluster()
            )));
        }
        let set = CidrSet::new(cidr, cluster.node_mask_size)
            .map_err(|e| SyncError::InvalidConfig(e.to_string()))?;
        sets.push(set);
    }
    Ok(sets)
}

fn cidr_error(name: &str, e: CidrSetError) -> SyncError {
    let message = format!("node {}: {e}", quote(name));
    match e {
        CidrSetError::OutOfRange { .. } => SyncError::OutOfRange(message),
        CidrSetError::Exhausted { .. } => SyncError::Exhausted(message),
        CidrSetError::WrongFamily { .. } | CidrSetError::InvalidMask { .. } => {
            SyncError::InvalidCidr(message)
        }
    }
}

/// The node range a range smaller than a node range lies in; a larger range itself.
fn node_range_of(range: IpNet, node_mask_size: u8) -> IpNet {
    if range.prefix_len() <= node_mask_size {
        return range;
    }
    IpNet::new(range.addr(), node_mask_size).map_or(range, |n| n.trunc())
}

fn same_family(a: IpNet, b: IpNet) -> bool {
    matches!(
        (a, b),
        (IpNet::V4(_), IpNet::V4(_)) | (IpNet::V6(_), IpNet::V6(_))
    )
}

fn to_strings(ranges: &[IpNet]) -> Vec<String> {
    ranges.iter().map(|&range| cidr_string(range)).collect()
}

fn join(ranges: &[IpNet]) -> String {
    to_strings(ranges).join(",")
}

fn mode_name(mode: SyncMode) -> &'static str {
    match mode {
        SyncMode::SyncFromCloud => "sync-from-cloud",
        SyncMode::SyncFromCluster => "sync-from-cluster",
    }
}

/// A host error as a sync error, its message cut to a readable length.
fn host_error(e: HostError) -> SyncError {
    let cut = |m: String| {
        if m.len() <= MAX_MESSAGE {
            m
        } else {
            cut_to(&m, MAX_MESSAGE)
        }
    };
    SyncError::Host(match e {
        HostError::NotFound(m) => HostError::NotFound(cut(m)),
        HostError::Conflict(m) => HostError::Conflict(cut(m)),
        HostError::Unavailable(m) => HostError::Unavailable(cut(m)),
        HostError::Other(m) => HostError::Other(cut(m)),
    })
}

/// A value for a message, quoted, cut to a readable length.
fn quote(value: &str) -> String {
    if value.len() <= MAX_QUOTED {
        return format!("{value:?}");
    }
    format!("{:?}... ({} bytes)", prefix(value, MAX_QUOTED), value.len())
}

/// `value` cut to at most `max` bytes, marked as cut.
fn cut_to(value: &str, max: usize) -> String {
    format!("{}... ({} bytes)", prefix(value, max), value.len())
}

/// The longest prefix of `value` of at most `max` bytes that ends on a character boundary.
fn prefix(value: &str, max: usize) -> &str {
    let mut end = max.min(value.len());
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}

#[cfg(test)]
mod tests;
