//! The CIDR allocator: one set per cluster CIDR, handing out node ranges of a fixed prefix
//! length, with Kubernetes' `cidrset` semantics (DESIGN.md, "Allocator rules").
//!
//! Unlike Kubernetes, which scans a flat bitmap bit by bit, the set keeps a hierarchical
//! bitmap: finding the next free range costs a few word operations per level (four levels at
//! most, for 2^24 ranges), however full the set is.

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;
use core::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// How many bits longer than the cluster prefix a node prefix may be: at most 2^24 =
/// 16,777,216 node ranges per set, in either family.
pub const MAX_EXTRA_BITS: u8 = 24;

/// The node ranges carved from one cluster CIDR, and which of them are in use.
#[derive(Clone)]
pub struct CidrSet {
    /// The cluster CIDR, host bits cleared.
    cluster: IpNet,
    /// The cluster's network address as an integer (IPv4: the low 32 bits), so that
    /// `range_at` does not convert it from bytes again on every allocation.
    network: u128,
    node_mask_size: u8,
    /// Address bits below the node prefix: `family bits - node_mask_size` (0..=128).
    host_bits: u32,
    /// Number of node ranges: `2^(node_mask_size - cluster prefix)`.
    max: u32,
    /// One bit per node range, set when the range is in use.
    bitmap: Bitmap,
    /// Where `allocate_next` starts looking: just after the range it handed out last. `max`
    /// after the last range: the search finds nothing from there and wraps around to 0 (the
    /// fast path has no wrap-around test).
    next_candidate: u32,
    // No `used` field: it is `allocations - releases` (every bit set is counted in one, every
    // bit cleared in the other), one counter less to update per allocation.
    allocations: u64,
    releases: u64,
    allocation_tries: u64,
}

/// Why a `CidrSet` cannot be built or a range cannot be used with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrSetError {
    /// The node mask size does not fit the cluster CIDR.
    #[error("node mask size {node_mask_size} {problem} cluster cidr {cluster}")]
    InvalidMask {
        /// The cluster CIDR as given.
        cluster: IpNet,
        node_mask_size: u8,
        problem: MaskProblem,
    },
    /// The range is IPv4 and the cluster IPv6, or the other way round.
    #[error("range {range} is not of the ip family of cluster cidr {cluster}")]
    WrongFamily { range: IpNet, cluster: IpNet },
    /// The range neither lies inside the cluster CIDR nor contains it.
    #[error("range {range} is outside cluster cidr {cluster}")]
    OutOfRange { range: IpNet, cluster: IpNet },
    /// Every node range is in use.
    #[error("cluster cidr {cluster} has no free node range left")]
    Exhausted { cluster: IpNet },
}

/// What is wrong with a node mask size, relative to its cluster CIDR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskProblem {
    /// Shorter than the cluster prefix: a node range would be larger than the cluster.
    ShorterThanCluster,
    /// Longer than the family's address (32 or 128 bits).
    LongerThanAddress,
    /// More than `MAX_EXTRA_BITS` longer than the cluster prefix: too many node ranges.
    TooManyRanges,
}

impl fmt::Display for MaskProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MaskProblem::ShorterThanCluster => "is shorter than the prefix of",
            MaskProblem::LongerThanAddress => "is longer than the addresses of",
            MaskProblem::TooManyRanges => "is more than 24 bits longer than",
        })
    }
}

impl CidrSet {
    /// A set of the `/node_mask_size` ranges of `cluster`, all free. Host bits of `cluster` are
    /// cleared. Errors when the node mask is shorter than the cluster prefix, longer than the
    /// family's address or more than 24 bits longer than the cluster prefix.
    pub fn new(cluster: IpNet, node_mask_size: u8) -> Result<Self, CidrSetError> {
        let invalid = |problem| CidrSetError::InvalidMask {
            cluster,
            node_mask_size,
            problem,
        };
        let cluster_prefix = cluster.prefix_len();
        if node_mask_size < cluster_prefix {
            return Err(invalid(MaskProblem::ShorterThanCluster));
        }
        if node_mask_size > cluster.max_prefix_len() {
            return Err(invalid(MaskProblem::LongerThanAddress));
        }
        let extra_bits = node_mask_size - cluster_prefix;
        if extra_bits > MAX_EXTRA_BITS {
            return Err(invalid(MaskProblem::TooManyRanges));
        }
        let max = 1u32 << extra_bits;
        let network = match cluster {
            IpNet::V4(c) => u128::from(u32::from(c.network())),
            IpNet::V6(c) => u128::from(c.network()),
        };
        Ok(CidrSet {
            cluster: cluster.trunc(),
            network,
            node_mask_size,
            host_bits: u32::from(cluster.max_prefix_len() - node_mask_size),
            max,
            bitmap: Bitmap::new(max as usize),
            next_candidate: 0,
            allocations: 0,
            releases: 0,
            allocation_tries: 0,
        })
    }

    /// The cluster CIDR, host bits cleared.
    pub fn cluster(&self) -> IpNet {
        self.cluster
    }

    /// The prefix length of every node range.
    pub fn node_mask_size(&self) -> u8 {
        self.node_mask_size
    }

    /// Marks the first free node range after the one handed out last (from the first range
    /// in a fresh set), wrapping around, as used and returns it.
    ///
    /// Always inlined: the fast path is a few instructions (the search is out of line), and
    /// in wasm a call costs an epoch check at function entry.
    #[inline(always)]
    pub fn allocate_next(&mut self) -> Result<IpNet, CidrSetError> {
        let start = self.next_candidate as usize;
        // Fast path, no loop and no call: a free range in the cursor's leaf word, at or after
        // the cursor (63 allocations out of 64 when filling a set).
        match self.bitmap.next_zero_in_word(start) {
            // In the cursor's word, at or after it: `found - start` candidates skipped.
            Some(found) => self.take(found, found - start),
            None => self.allocate_next_searching(start),
        }
    }

    /// `allocate_next` when the cursor's leaf word has no free range at or after the cursor:
    /// through the summary levels, then around from the start.
    #[inline(never)]
    fn allocate_next_searching(&mut self, start: usize) -> Result<IpNet, CidrSetError> {
        let found = match self.bitmap.next_zero_after_word(start / 64) {
            Some(found) => Some(found),
            None => self.bitmap.first_zero(),
        };
        let Some(found) = found else {
            return Err(CidrSetError::Exhausted {
                cluster: self.cluster,
            });
        };
        // Candidates skipped before the free one: from `start` up to `found`, around the end.
        let tries = if found >= start {
            found - start
        } else {
            self.max as usize - start + found
        };
        self.take(found, tries)
    }

    /// Marks the free range `found` used, found after skipping `tries` candidates, and
    /// returns it.
    #[inline(always)]
    fn take(&mut self, found: usize, tries: usize) -> Result<IpNet, CidrSetError> {
        let range = self.range_at(found as u32)?;
        self.bitmap.set_free(found);
        self.allocation_tries += tries as u64;
        self.allocations += 1;
        // At most `max` (2^24): see `next_candidate`.
        self.next_candidate = (found + 1) as u32;
        Ok(range)
    }

    /// Marks every node range covered by `range` as used: all those inside a range larger
    /// than a node range (all of them if it contains the cluster CIDR), or the one containing
    /// a smaller range. Idempotent.
    pub fn occupy(&mut self, range: IpNet) -> Result<(), CidrSetError> {
        let (start, end) = self.indices(range)?;
        let flipped = if end - start == 1 {
            u32::from(self.bitmap.set(start as usize))
        } else {
            self.bitmap.set_range(start as usize, end as usize) as u32
        };
        self.allocations += u64::from(flipped);
        Ok(())
    }

    /// Marks every node range covered by `range` (as in `occupy`) as free. Idempotent.
    pub fn release(&mut self, range: IpNet) -> Result<(), CidrSetError> {
        let (start, end) = self.indices(range)?;
        let flipped = if end - start == 1 {
            u32::from(self.bitmap.clear(start as usize))
        } else {
            self.bitmap.clear_range(start as usize, end as usize) as u32
        };
        self.releases += u64::from(flipped);
        Ok(())
    }

    /// Whether every node range covered by `range` (as in `occupy`) is in use.
    pub fn is_occupied(&self, range: IpNet) -> Result<bool, CidrSetError> {
        let (start, end) = self.indices(range)?;
        Ok(self.bitmap.all_set(start as usize, end as usize))
    }

    /// Whether `range` lies inside the cluster CIDR (and so is of its family).
    pub fn contains(&self, range: IpNet) -> bool {
        self.cluster.contains(&range)
    }

    /// The number of node ranges: at most 2^24.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// The number of node ranges in use.
    pub fn used(&self) -> u32 {
        // At most `max`: each range is counted as allocated once more than released.
        (self.allocations - self.releases) as u32
    }

    /// Node ranges marked used so far, by `allocate_next` or `occupy`, each counted when its
    /// bit is set: one per successful `allocate_next`, and for `occupy` the ranges it found
    /// free (none for a range already in use). As Kubernetes' `cidrSetAllocations` counter
    /// (pkg/controller/nodeipam/ipam/cidrset, `AllocateNext` and `Occupy`).
    pub fn allocations(&self) -> u64 {
        self.allocations
    }

    /// Node ranges freed by `release` so far (each counted when its bit is cleared).
    pub fn releases(&self) -> u64 {
        self.releases
    }

    /// Candidate ranges skipped by successful `allocate_next` calls so far: for each, the
    /// distance from where it started looking to the range it found, around the end (0 when
    /// the first candidate was free). Failed calls count nothing. The sum of what Kubernetes
    /// observes into `cidrSetAllocationTriesPerRequest` (pkg/controller/nodeipam/ipam/cidrset,
    /// `AllocateNext`: the loop index `i` at the free candidate).
    pub fn allocation_tries(&self) -> u64 {
        self.allocation_tries
    }

    /// The node range with index `index` (< `max`).
    #[inline]
    fn range_at(&self, index: u32) -> Result<IpNet, CidrSetError> {
        // `new` checked the node mask against the family, so `Ipv4Net::new` / `Ipv6Net::new`
        // cannot fail. The `min`s say so to the compiler: no check and no branch left on the
        // allocation path (they change nothing: the mask is within them).
        let net = match self.cluster {
            IpNet::V4(_) => {
                let offset = index.checked_shl(self.host_bits).unwrap_or(0);
                let addr = Ipv4Addr::from(self.network as u32 | offset);
                Ipv4Net::new(addr, self.node_mask_size.min(32)).map(IpNet::V4)
            }
            IpNet::V6(_) => {
                let offset = shl128(index, self.host_bits);
                let addr = Ipv6Addr::from(self.network | offset);
                Ipv6Net::new(addr, self.node_mask_size.min(128)).map(IpNet::V6)
            }
        };
        net.map_err(|_| CidrSetError::InvalidMask {
            cluster: self.cluster,
            node_mask_size: self.node_mask_size,
            problem: MaskProblem::LongerThanAddress,
        })
    }

    /// The node range indices `start..end` that `range` covers.
    fn indices(&self, range: IpNet) -> Result<(u32, u32), CidrSetError> {
        let cluster = self.cluster;
        let (prefix, cluster_prefix) = (range.prefix_len(), cluster.prefix_len());
        // Address bits the range and the cluster must share: the shorter prefix of the two.
        let common = u32::from(prefix.min(cluster_prefix));
        // `diff`: where the range's address differs from the cluster's network. `index`: the
        // node range holding the range's address, if the range lies inside the cluster (then
        // the top `cluster_prefix` bits of `diff` are zero and `index` is below 2^24).
        let (outside, index) = match (range, cluster) {
            (IpNet::V4(r), IpNet::V4(_)) => {
                let diff = u32::from(r.addr()) ^ self.network as u32;
                let outside = diff.checked_shr(32 - common).unwrap_or(0) != 0;
                (outside, diff.checked_shr(self.host_bits).unwrap_or(0))
            }
            (IpNet::V6(r), IpNet::V6(_)) => {
                let diff = u128::from(r.addr()) ^ self.network;
                let outside = diff.checked_shr(128 - common).unwrap_or(0) != 0;
                (
                    outside,
                    diff.checked_shr(self.host_bits).unwrap_or(0) as u32,
                )
            }
            _ => return Err(CidrSetError::WrongFamily { range, cluster }),
        };
        if outside {
            return Err(CidrSetError::OutOfRange { range, cluster });
        }
        if prefix <= cluster_prefix {
            // As large as the cluster or larger, and containing it: all of it.
            return Ok((0, self.max));
        }
        // Fewer than 24 bits, as the range's prefix is longer than the cluster's.
        let extra_bits = self.node_mask_size.saturating_sub(prefix);
        let count = 1u32 << extra_bits;
        let start = index & !(count - 1);
        Ok((start, start + count))
    }
}

impl fmt::Debug for CidrSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CidrSet")
            .field("cluster", &self.cluster)
            .field("node_mask_size", &self.node_mask_size)
            .field("max", &self.max)
            .field("used", &self.used())
            .field("next_candidate", &(self.next_candidate % self.max))
            .finish_non_exhaustive()
    }
}

/// A bitmap of `len` bits with summary levels: `levels[0]` holds the bits; in `levels[k + 1]`,
/// bit `j` is set when word `j` of `levels[k]` is full. Level `depth - 1` is one word; the
/// levels above it are empty. Bits past the end of a level are kept set, so they look used and
/// are never returned as free.
///
/// The hot paths (`next_zero_in_word`, `set`, `clear`, `next_zero_from`) run their level loops
/// to the constant [`MAX_LEVELS`], which the compiler unrolls: in wasm a loop header costs an
/// epoch (deadline) check per iteration, straight-line code does not.
#[derive(Clone)]
struct Bitmap {
    len: usize,
    /// The levels in use: 1 to `MAX_LEVELS`.
    depth: usize,
    /// In the struct, not behind a second pointer: the leaf word is one load away.
    levels: [Vec<u64>; MAX_LEVELS],
}

/// Levels of a bitmap of at most 2^24 bits (`MAX_EXTRA_BITS`): 2^18, 2^12, 2^6 words, 1 word.
const MAX_LEVELS: usize = 4;

impl Bitmap {
    /// `len` clear bits; `len` at most 2^24.
    fn new(len: usize) -> Self {
        assert!(len <= 1 << MAX_EXTRA_BITS, "bitmap of {len} bits");
        let mut levels: [Vec<u64>; MAX_LEVELS] = Default::default();
        let mut depth = 0;
        let mut bits = len;
        loop {
            let words = bits.div_ceil(64).max(1);
            let mut level = vec![0u64; words];
            if !bits.is_multiple_of(64) || bits == 0 {
                level[words - 1] = !0 << (bits % 64);
            }
            levels[depth] = level;
            depth += 1;
            if words == 1 {
                break;
            }
            bits = words;
        }
        Bitmap { len, depth, levels }
    }

    /// Sets bit `i`; returns whether it was clear.
    #[inline]
    fn set(&mut self, i: usize) -> bool {
        let word = &mut self.levels[0][i / 64];
        let bit = 1u64 << (i % 64);
        if *word & bit != 0 {
            return false;
        }
        *word |= bit;
        if *word == !0 {
            self.mark_full(i / 64);
        }
        true
    }

    /// Sets bit `i`, which is clear.
    #[inline(always)]
    fn set_free(&mut self, i: usize) {
        let word = &mut self.levels[0][i / 64];
        debug_assert!(*word & (1u64 << (i % 64)) == 0, "bit {i} is set");
        *word |= 1u64 << (i % 64);
        if *word == !0 {
            self.mark_full(i / 64);
        }
    }

    /// Word `index` of the leaf level has just become full: set its bit in the level above,
    /// and so on while words fill up.
    #[inline(never)]
    fn mark_full(&mut self, mut index: usize) {
        for level in 1..MAX_LEVELS {
            // Past the top level: no word (empty level).
            let Some(word) = self.levels[level].get_mut(index / 64) else {
                return;
            };
            *word |= 1u64 << (index % 64);
            if *word != !0 {
                return;
            }
            index /= 64;
        }
    }

    /// Clears bit `i`; returns whether it was set.
    #[inline]
    fn clear(&mut self, i: usize) -> bool {
        let word = &mut self.levels[0][i / 64];
        let bit = 1u64 << (i % 64);
        if *word & bit == 0 {
            return false;
        }
        let was_full = *word == !0;
        *word &= !bit;
        if was_full {
            self.mark_not_full(i / 64);
        }
        true
    }

    /// Word `index` of the leaf level was full and no longer is: clear its bit in the level
    /// above, and so on while those words were full.
    #[inline]
    fn mark_not_full(&mut self, mut index: usize) {
        for level in 1..MAX_LEVELS {
            // Past the top level: no word (empty level).
            let Some(word) = self.levels[level].get_mut(index / 64) else {
                return;
            };
            let was_full = *word == !0;
            *word &= !(1u64 << (index % 64));
            if !was_full {
                return;
            }
            index /= 64;
        }
    }

    /// Sets bits `start..end` (clamped to the length); returns how many were clear.
    fn set_range(&mut self, start: usize, end: usize) -> usize {
        let (mut lo, mut hi) = (start, end.min(self.len));
        let mut flipped = 0;
        for (level, words) in self.levels.iter_mut().take(self.depth).enumerate() {
            if lo >= hi {
                break;
            }
            let (first, last) = (lo / 64, (hi - 1) / 64);
            for (w, word) in words.iter_mut().enumerate().take(last + 1).skip(first) {
                let mask = word_mask(w, lo, hi);
                if level == 0 {
                    flipped += (mask & !*word).count_ones() as usize;
                }
                *word |= mask;
            }
            // Words strictly between the first and the last are full now; those two may be.
            lo = if words[first] == !0 { first } else { first + 1 };
            hi = if words[last] == !0 { last + 1 } else { last };
        }
        flipped
    }

    /// Clears bits `start..end` (clamped to the length); returns how many were set.
    fn clear_range(&mut self, start: usize, end: usize) -> usize {
        let (mut lo, mut hi) = (start, end.min(self.len));
        let mut flipped = 0;
        for (level, words) in self.levels.iter_mut().take(self.depth).enumerate() {
            if lo >= hi {
                break;
            }
            let (first, last) = (lo / 64, (hi - 1) / 64);
            for (w, word) in words.iter_mut().enumerate().take(last + 1).skip(first) {
                let mask = word_mask(w, lo, hi);
                if level == 0 {
                    flipped += (mask & *word).count_ones() as usize;
                }
                *word &= !mask;
            }
            // Every word touched lost a bit, so none of them is full.
            (lo, hi) = (first, last + 1);
        }
        flipped
    }

    /// Whether bits `start..end` (clamped to the length) are all set.
    fn all_set(&self, start: usize, end: usize) -> bool {
        let (mut lo, mut hi) = (start, end.min(self.len));
        for words in &self.levels[..self.depth] {
            if lo >= hi {
                return true;
            }
            let (first, last) = (lo / 64, (hi - 1) / 64);
            let full = |w: usize| {
                let mask = word_mask(w, lo, hi);
                words[w] & mask == mask
            };
            if !full(first) || !full(last) {
                return false;
            }
            // The words in between must be full: ask the level above.
            (lo, hi) = (first + 1, last);
        }
        true
    }

    /// The first clear bit at or after `i` in `i`'s leaf word, if any.
    #[inline(always)]
    fn next_zero_in_word(&self, i: usize) -> Option<usize> {
        let w = i / 64;
        let word = *self.levels[0].get(w)? | ((1u64 << (i % 64)) - 1);
        // Padding bits are set: a clear bit is below `len`.
        (word != !0).then(|| w * 64 + word.trailing_ones() as usize)
    }

    /// The first clear bit, if any: `next_zero_from(0)`, kept out of line (wrapping around
    /// is the rare case of `allocate_next`).
    #[inline(never)]
    fn first_zero(&self) -> Option<usize> {
        self.next_zero_from(0)
    }

    /// The first clear bit at or after `i`, if any (no wrap-around). Straight-line code
    /// (the level loop is unrolled), inlined into its callers.
    #[inline(always)]
    fn next_zero_from(&self, i: usize) -> Option<usize> {
        if i >= self.len {
            return None;
        }
        self.climb(0, i)
    }

    /// The first clear bit past leaf word `w` (none of its bits), if any (no wrap-around):
    /// `next_zero_from` once `w` is known to have no clear bit at or after the start.
    #[inline(always)]
    fn next_zero_after_word(&self, w: usize) -> Option<usize> {
        self.climb(1, w + 1)
    }

    /// The first clear leaf bit under bits `index..` of level `level` (those past the end of
    /// the level excluded).
    #[inline(always)]
    fn climb(&self, from: usize, mut index: usize) -> Option<usize> {
        // Climb until a word has a clear bit at or after `index`, then descend taking the
        // first clear bit of each word below.
        for level in from..MAX_LEVELS {
            let w = index / 64;
            // None past the end of the level, and past the top level (empty).
            let word = *self.levels[level].get(w)? | ((1u64 << (index % 64)) - 1);
            if word != !0 {
                return Some(self.descend(level, w * 64 + word.trailing_ones() as usize));
            }
            index = w + 1;
        }
        None
    }

    /// From clear bit `found` of level `level` down to the first clear bit under it in the
    /// leaf level.
    #[inline(always)]
    fn descend(&self, level: usize, mut found: usize) -> usize {
        for below in (0..MAX_LEVELS - 1).rev() {
            if below < level {
                found = found * 64 + self.levels[below][found].trailing_ones() as usize;
            }
        }
        found
    }
}

/// `index << shift` as a u128, 0 when `shift` is 128 (as `checked_shl(..).unwrap_or(0)`),
/// with 64-bit shifts: a u128 shift is a libcall (`__ashlti3`) in wasm32.
#[inline(always)]
fn shl128(index: u32, shift: u32) -> u128 {
    let index = u64::from(index);
    let (hi, lo) = match shift {
        0 => (0, index),
        1..=63 => (index >> (64 - shift), index << shift),
        64..=127 => (index << (shift - 64), 0),
        _ => (0, 0),
    };
    (u128::from(hi) << 64) | u128::from(lo)
}

/// The bits of word `w` that lie in `lo..hi` (which overlaps the word).
fn word_mask(w: usize, lo: usize, hi: usize) -> u64 {
    let base = w * 64;
    let from = lo.max(base) - base;
    let to = hi.min(base + 64) - base;
    let width = to - from;
    if width == 64 {
        !0
    } else {
        ((1u64 << width) - 1) << from
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use proptest::prelude::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn set(cluster: &str, node_mask_size: u8) -> CidrSet {
        CidrSet::new(net(cluster), node_mask_size).unwrap()
    }

    // ---- masks -------------------------------------------------------------------------

    /// `cluster, node mask => Ok(max)` or `Err(message)`.
    macro_rules! mask_cases {
        ($($name:ident: $cluster:literal, $mask:literal => $expected:expr;)*) => {$(
            #[test]
            fn $name() {
                let got = CidrSet::new(net($cluster), $mask)
                    .map(|s| s.max())
                    .map_err(|e| e.to_string());
                let expected: Result<u32, &str> = $expected;
                assert_eq!(got, expected.map_err(str::to_string));
            }
        )*};
    }

    mask_cases! {
        v4_node_mask_equal_to_cluster_mask_gives_one_range: "10.0.0.0/8", 8 => Ok(1);
        v4_slash8_by_slash24_gives_65536_ranges: "10.0.0.0/8", 24 => Ok(65_536);
        v4_24_extra_bits_allowed: "10.0.0.0/8", 32 => Ok(16_777_216);
        v4_whole_space_as_one_range_allowed: "0.0.0.0/0", 0 => Ok(1);
        v4_whole_space_by_24_allowed: "0.0.0.0/0", 24 => Ok(16_777_216);
        v4_25_extra_bits_rejected: "10.0.0.0/4", 29 =>
            Err("node mask size 29 is more than 24 bits longer than cluster cidr 10.0.0.0/4");
        v4_26_extra_bits_rejected: "10.0.0.0/4", 30 =>
            Err("node mask size 30 is more than 24 bits longer than cluster cidr 10.0.0.0/4");
        v4_node_mask_shorter_than_cluster_rejected: "10.0.0.0/16", 8 =>
            Err("node mask size 8 is shorter than the prefix of cluster cidr 10.0.0.0/16");
        v4_node_mask_longer_than_32_rejected: "10.0.0.0/16", 33 =>
            Err("node mask size 33 is longer than the addresses of cluster cidr 10.0.0.0/16");
        v6_slash48_by_slash64_gives_65536_ranges: "2001:db8::/48", 64 => Ok(65_536);
        v6_24_extra_bits_allowed: "2001:db8::/48", 72 => Ok(16_777_216);
        v6_24_extra_bits_across_64_bit_halves_allowed: "2001:db8::/56", 80 => Ok(16_777_216);
        v6_slash128_nodes_allowed: "fd00::/104", 128 => Ok(16_777_216);
        v6_whole_space_as_one_range_allowed: "::/0", 0 => Ok(1);
        v6_25_extra_bits_rejected: "2001:db8::/48", 73 =>
            Err("node mask size 73 is more than 24 bits longer than cluster cidr 2001:db8::/48");
        v6_node_mask_shorter_than_cluster_rejected: "2001:db8::/64", 48 =>
            Err("node mask size 48 is shorter than the prefix of cluster cidr 2001:db8::/64");
        v6_node_mask_longer_than_128_rejected: "2001:db8::/112", 129 =>
            Err("node mask size 129 is longer than the addresses of cluster cidr 2001:db8::/112");
    }

    #[test]
    fn cluster_host_bits_are_cleared() {
        let s = set("10.1.2.3/8", 24);
        assert_eq!(s.cluster(), net("10.0.0.0/8"));
        assert_eq!(s.node_mask_size(), 24);
    }

    // ---- index <-> range ---------------------------------------------------------------

    /// `cluster, node mask, index <=> node range`, both ways.
    macro_rules! index_cases {
        ($($name:ident: $cluster:literal, $mask:literal, $index:literal <=> $range:literal;)*) => {$(
            #[test]
            fn $name() {
                let s = set($cluster, $mask);
                assert_eq!(s.range_at($index), Ok(net($range)));
                assert_eq!(s.indices(net($range)), Ok(($index, $index + 1)));
            }
        )*};
    }

    index_cases! {
        v4_first_range: "10.0.0.0/8", 24, 0 <=> "10.0.0.0/24";
        v4_middle_range: "10.0.0.0/8", 24, 258 <=> "10.1.2.0/24";
        v4_last_range: "10.0.0.0/8", 24, 65_535 <=> "10.255.255.0/24";
        v4_last_slash32_of_16m: "10.0.0.0/8", 32, 16_777_215 <=> "10.255.255.255/32";
        v4_whole_space_single_range: "0.0.0.0/0", 0, 0 <=> "0.0.0.0/0";
        v4_whole_space_last_slash24: "0.0.0.0/0", 24, 16_777_215 <=> "255.255.255.0/24";
        v6_first_range: "2001:db8::/48", 64, 0 <=> "2001:db8::/64";
        v6_last_range: "2001:db8::/48", 64, 65_535 <=> "2001:db8:0:ffff::/64";
        v6_middle_range_across_64_bit_halves: "2001:db8::/56", 80, 0xab_cdef
            <=> "2001:db8:0:ab:cdef::/80";
        v6_last_slash128_of_16m: "fd00::/104", 128, 0xff_ffff <=> "fd00::ff:ffff/128";
        v6_whole_space_single_range: "::/0", 0, 0 <=> "::/0";
    }

    // ---- allocation --------------------------------------------------------------------

    fn allocate_all(s: &mut CidrSet) -> Vec<IpNet> {
        core::iter::from_fn(|| s.allocate_next().ok()).collect()
    }

    #[test]
    fn allocates_in_address_order_from_first_range() {
        let mut s = set("10.0.0.0/24", 26);
        let got = allocate_all(&mut s);
        let expected = [
            "10.0.0.0/26",
            "10.0.0.64/26",
            "10.0.0.128/26",
            "10.0.0.192/26",
        ];
        assert_eq!(got, expected.map(net));
        // Each first candidate was free: nothing skipped.
        assert_eq!((s.used(), s.allocations(), s.allocation_tries()), (4, 4, 0));
    }

    #[test]
    fn allocation_skips_occupied_ranges_and_counts_tries() {
        let mut s = set("10.0.0.0/24", 26);
        s.occupy(net("10.0.0.0/25")).unwrap();
        assert_eq!(s.allocate_next(), Ok(net("10.0.0.128/26")));
        // Skipped indices 0 and 1.
        assert_eq!(s.allocation_tries(), 2);
        assert_eq!(s.allocations(), 2 + 1);
    }

    #[test]
    fn allocation_continues_after_last_range_handed_out() {
        let mut s = set("10.0.0.0/24", 26);
        s.allocate_next().unwrap();
        s.allocate_next().unwrap();
        s.release(net("10.0.0.0/26")).unwrap();
        assert_eq!(s.allocate_next(), Ok(net("10.0.0.128/26")));
        assert_eq!(s.allocate_next(), Ok(net("10.0.0.192/26")));
        // Wraps around to the released first range.
        assert_eq!(s.allocate_next(), Ok(net("10.0.0.0/26")));
        // Every search started at a free range.
        assert_eq!((s.allocations(), s.allocation_tries()), (5, 0));
    }

    #[test]
    fn occupy_does_not_move_the_cursor() {
        let mut s = set("10.0.0.0/24", 26);
        s.occupy(net("10.0.0.128/26")).unwrap();
        assert_eq!(s.allocate_next(), Ok(net("10.0.0.0/26")));
    }

    #[test]
    fn allocation_wraps_around_and_counts_tries_across_the_end() {
        let mut s = set("10.0.0.0/24", 26);
        allocate_all(&mut s);
        s.allocate_next().unwrap_err();
        s.release(net("10.0.0.0/26")).unwrap();
        s.allocate_next().unwrap(); // index 0; cursor at 1
        s.release(net("10.0.0.0/26")).unwrap();
        // From index 1: 1, 2, 3 used and skipped, then 0 free. No earlier search skipped any.
        assert_eq!(s.allocate_next(), Ok(net("10.0.0.0/26")));
        assert_eq!(s.allocation_tries(), 3);
        assert_eq!(s.allocations(), 4 + 1 + 1);
    }

    #[test]
    fn exhausted_set_errors_naming_cluster_and_keeps_counters() {
        let mut s = set("10.0.0.0/8", 8);
        s.allocate_next().unwrap();
        let err = s.allocate_next().unwrap_err();
        assert_eq!(
            err,
            CidrSetError::Exhausted {
                cluster: net("10.0.0.0/8")
            }
        );
        assert_eq!(
            err.to_string(),
            "cluster cidr 10.0.0.0/8 has no free node range left"
        );
        // The failed call counts neither an allocation nor tries.
        assert_eq!((s.used(), s.allocations(), s.allocation_tries()), (1, 1, 0));
    }

    #[test]
    fn single_free_range_of_16m_found_from_just_after_it() {
        let mut s = set("2001:db8::/48", 72);
        s.occupy(s.cluster()).unwrap();
        let hole = net("2001:db8:0:1234:5600::/72"); // index 0x123456
        s.release(hole).unwrap();
        assert_eq!(s.allocate_next(), Ok(hole));
        s.release(hole).unwrap();
        // The cursor is just after the hole: the search wraps around, skipping the other
        // 2^24 - 1 ranges.
        assert_eq!(s.allocate_next(), Ok(hole));
        assert_eq!(s.allocation_tries(), 0x12_3456 + ((1 << 24) - 1));
        assert_eq!(s.used(), 1 << 24);
        // Occupying the whole set counted every range; each allocation one more.
        assert_eq!(s.allocations(), (1 << 24) + 2);
    }

    // ---- occupy / release / is_occupied ------------------------------------------------

    #[test]
    fn occupy_larger_range_marks_every_node_range_inside() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(net("10.0.4.0/22")).unwrap();
        assert_eq!(s.used(), 4);
        assert_eq!(s.is_occupied(net("10.0.4.0/22")), Ok(true));
        assert_eq!(s.is_occupied(net("10.0.3.0/24")), Ok(false));
        assert_eq!(s.is_occupied(net("10.0.8.0/24")), Ok(false));
    }

    #[test]
    fn occupy_range_containing_cluster_marks_everything() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(net("10.0.0.0/8")).unwrap();
        assert_eq!(s.used(), 256);
        assert!(s.allocate_next().is_err());
        assert_eq!((s.allocations(), s.allocation_tries()), (256, 0));
    }

    #[test]
    fn occupy_counts_an_allocation_per_range_it_marks() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(net("10.0.0.0/16")).unwrap();
        assert_eq!(s.allocations(), 256);
        // Already occupied: nothing flips, nothing counted.
        s.occupy(net("10.0.0.0/16")).unwrap();
        s.occupy(net("10.0.7.0/24")).unwrap();
        s.occupy(net("10.0.7.9/32")).unwrap();
        assert_eq!(s.allocations(), 256);
        // Only the ranges found free count.
        s.release(net("10.0.4.0/22")).unwrap();
        s.release(net("10.0.200.0/24")).unwrap();
        s.occupy(net("10.0.0.0/16")).unwrap();
        assert_eq!((s.used(), s.allocations(), s.releases()), (256, 256 + 5, 5));
        assert_eq!(s.allocation_tries(), 0);
    }

    #[test]
    fn occupy_equal_range_marks_one() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(net("10.0.5.0/24")).unwrap();
        assert_eq!(s.used(), 1);
        assert_eq!(s.is_occupied(net("10.0.5.0/24")), Ok(true));
    }

    #[test]
    fn occupy_range_with_host_bits_marks_its_network() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(net("10.0.5.9/24")).unwrap();
        assert_eq!(s.is_occupied(net("10.0.5.0/24")), Ok(true));
        assert_eq!(s.used(), 1);
    }

    #[test]
    fn occupy_larger_range_with_host_bits_marks_its_network() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(net("10.0.5.9/22")).unwrap();
        assert_eq!(s.used(), 4);
        assert_eq!(s.is_occupied(net("10.0.4.0/22")), Ok(true));
    }

    #[test]
    fn occupy_smaller_range_marks_the_one_containing_it() {
        let mut s = set("2001:db8::/48", 64);
        s.occupy(net("2001:db8:0:7::1/128")).unwrap();
        assert_eq!(s.used(), 1);
        assert_eq!(s.is_occupied(net("2001:db8:0:7::/64")), Ok(true));
        assert_eq!(s.is_occupied(net("2001:db8:0:6::/64")), Ok(false));
    }

    #[test]
    fn release_larger_range_frees_every_node_range_inside() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(net("10.0.0.0/20")).unwrap();
        s.release(net("10.0.4.0/22")).unwrap();
        assert_eq!((s.used(), s.releases()), (12, 4));
        assert_eq!(s.is_occupied(net("10.0.0.0/22")), Ok(true));
        assert_eq!(s.is_occupied(net("10.0.8.0/21")), Ok(true));
        assert_eq!(s.is_occupied(net("10.0.5.0/24")), Ok(false));
    }

    #[test]
    fn release_smaller_range_frees_the_one_containing_it() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(net("10.0.7.0/24")).unwrap();
        s.release(net("10.0.7.128/25")).unwrap();
        assert_eq!((s.used(), s.releases()), (0, 1));
    }

    #[test]
    fn is_occupied_is_false_when_any_node_range_inside_is_free() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(net("10.0.0.0/16")).unwrap();
        s.release(net("10.0.200.0/24")).unwrap();
        assert_eq!(s.is_occupied(net("10.0.0.0/16")), Ok(false));
        assert_eq!(s.is_occupied(net("10.0.192.0/18")), Ok(false));
        assert_eq!(s.is_occupied(net("10.0.0.0/17")), Ok(true));
        assert_eq!(s.is_occupied(net("10.0.201.0/24")), Ok(true));
    }

    #[test]
    fn out_of_range_rejected_naming_both() {
        let mut s = set("10.0.0.0/8", 24);
        let expected = "range 192.168.0.0/24 is outside cluster cidr 10.0.0.0/8";
        let range = net("192.168.0.0/24");
        assert_eq!(s.occupy(range).unwrap_err().to_string(), expected);
        assert_eq!(s.release(range).unwrap_err().to_string(), expected);
        assert_eq!(s.is_occupied(range).unwrap_err().to_string(), expected);
        assert_eq!(s.used(), 0);
    }

    #[test]
    fn larger_range_not_containing_cluster_rejected() {
        let mut s = set("10.1.0.0/16", 24);
        let err = s.occupy(net("12.0.0.0/7")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "range 12.0.0.0/7 is outside cluster cidr 10.1.0.0/16"
        );
        let sibling = s.occupy(net("10.0.0.0/16")).unwrap_err();
        assert!(
            matches!(sibling, CidrSetError::OutOfRange { .. }),
            "{sibling}"
        );
    }

    #[test]
    fn wrong_family_rejected_naming_both() {
        let mut v4 = set("10.0.0.0/8", 24);
        let err = v4.occupy(net("2001:db8::/64")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "range 2001:db8::/64 is not of the ip family of cluster cidr 10.0.0.0/8"
        );
        let err = v4.release(net("::/0")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "range ::/0 is not of the ip family of cluster cidr 10.0.0.0/8"
        );
        let v6 = set("2001:db8::/48", 64);
        let err = v6.is_occupied(net("10.0.0.0/24")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "range 10.0.0.0/24 is not of the ip family of cluster cidr 2001:db8::/48"
        );
    }

    #[test]
    fn contains_only_ranges_inside_cluster_of_same_family() {
        let s = set("10.0.0.0/8", 24);
        assert!(s.contains(net("10.3.0.0/16")));
        assert!(s.contains(net("10.0.0.0/8")));
        assert!(!s.contains(net("10.0.0.0/7")));
        assert!(!s.contains(net("11.0.0.0/24")));
        assert!(!s.contains(net("::a00:0/104")));
    }

    // ---- operation sequences -----------------------------------------------------------

    #[derive(Debug, Clone, Copy)]
    enum Op {
        Occupy(&'static str),
        Release(&'static str),
        /// `allocate_next`, expecting this range.
        Allocate(&'static str),
        /// `allocate_next` until it fails, expecting this many successes.
        AllocateAll(u32),
    }

    /// `(used, allocations, releases, allocation_tries)` expected after a step.
    type Counters = (u32, u64, u64, u64);

    /// Runs the steps' ops, checking the counters after each.
    fn run_sequence(cluster: &str, mask: u8, steps: &[(Op, Counters)]) {
        let mut s = set(cluster, mask);
        for (n, &(op, counters)) in steps.iter().enumerate() {
            match op {
                Op::Occupy(r) => s.occupy(net(r)).unwrap(),
                Op::Release(r) => s.release(net(r)).unwrap(),
                Op::Allocate(r) => assert_eq!(s.allocate_next(), Ok(net(r)), "step {n}: {op:?}"),
                Op::AllocateAll(count) => {
                    assert_eq!(
                        allocate_all(&mut s).len(),
                        count as usize,
                        "step {n}: {op:?}"
                    );
                    assert_eq!(
                        s.allocate_next(),
                        Err(CidrSetError::Exhausted {
                            cluster: s.cluster()
                        })
                    );
                }
            }
            let got = (
                s.used(),
                s.allocations(),
                s.releases(),
                s.allocation_tries(),
            );
            assert_eq!(got, counters, "step {n}: {op:?}");
        }
    }

    #[test]
    fn double_occupy_and_double_release_count_once() {
        use Op::*;
        run_sequence(
            "10.10.0.0/16",
            24,
            &[
                (Occupy("10.10.1.0/24"), (1, 1, 0, 0)),
                (Occupy("10.10.1.0/24"), (1, 1, 0, 0)),
                (Occupy("10.10.0.0/23"), (2, 2, 0, 0)),
                (Release("10.10.1.0/24"), (1, 2, 1, 0)),
                (Release("10.10.1.0/24"), (1, 2, 1, 0)),
                // The first allocation skips index 0; the rest find their first candidate.
                (AllocateAll(255), (256, 2 + 255, 1, 1)),
            ],
        );
    }

    #[test]
    fn block_occupy_then_release_inside_then_allocate_refills_the_hole() {
        use Op::*;
        run_sequence(
            "10.0.0.0/24",
            28,
            &[
                (Occupy("10.0.0.0/26"), (4, 4, 0, 0)),
                (Occupy("10.0.0.16/28"), (4, 4, 0, 0)),
                (Release("10.0.0.32/27"), (2, 4, 2, 0)),
                (Release("10.0.0.32/27"), (2, 4, 2, 0)),
                (Allocate("10.0.0.32/28"), (3, 5, 2, 2)),
                (Allocate("10.0.0.48/28"), (4, 6, 2, 2)),
                (Allocate("10.0.0.64/28"), (5, 7, 2, 2)),
                (AllocateAll(11), (16, 18, 2, 2)),
            ],
        );
    }

    #[test]
    fn release_of_free_ranges_counts_nothing() {
        use Op::*;
        run_sequence(
            "10.0.0.0/24",
            26,
            &[
                (Release("10.0.0.0/24"), (0, 0, 0, 0)),
                (Allocate("10.0.0.0/26"), (1, 1, 0, 0)),
                (Release("10.0.0.0/24"), (0, 1, 1, 0)),
                (Release("10.0.0.0/24"), (0, 1, 1, 0)),
                (Allocate("10.0.0.64/26"), (1, 2, 1, 0)),
            ],
        );
    }

    #[test]
    fn v6_full_set_release_and_wrap_around() {
        use Op::*;
        run_sequence(
            "fd00::/120",
            122,
            &[
                (Occupy("fd00::/64"), (4, 4, 0, 0)),
                (AllocateAll(0), (4, 4, 0, 0)),
                (Release("fd00::c0/122"), (3, 4, 1, 0)),
                (Release("fd00::1/128"), (2, 4, 2, 0)),
                (Allocate("fd00::/122"), (3, 5, 2, 0)),
                // From index 1: skips 1 and 2.
                (Allocate("fd00::c0/122"), (4, 6, 2, 2)),
                (Release("fd00::/122"), (3, 6, 3, 2)),
                // The cursor wrapped to index 0, which is free.
                (Allocate("fd00::/122"), (4, 7, 3, 2)),
            ],
        );
    }

    // ---- bitmap ------------------------------------------------------------------------

    fn naive_next_zero(bits: &[bool], i: usize) -> Option<usize> {
        (i..bits.len()).find(|&j| !bits[j])
    }

    #[test]
    fn bitmap_level_count_grows_by_64() {
        let levels = |len| Bitmap::new(len).depth;
        assert_eq!(
            [
                levels(1),
                levels(64),
                levels(65),
                levels(4096),
                levels(4097)
            ],
            [1, 1, 2, 2, 3]
        );
        assert_eq!(levels(1 << 24), 4);
    }

    #[test]
    fn bitmap_padding_is_never_free() {
        let mut b = Bitmap::new(65);
        assert_eq!(b.set_range(0, 64), 64);
        assert_eq!(b.next_zero_from(0), Some(64));
        assert!(b.set(64));
        assert_eq!(b.next_zero_from(0), None);
        assert!(b.all_set(0, 65));
    }

    #[test]
    fn bitmap_set_and_clear_report_flips() {
        let mut b = Bitmap::new(200);
        assert!(b.set(70));
        assert!(!b.set(70));
        assert_eq!(b.set_range(60, 80), 19);
        assert_eq!(b.clear_range(0, 200), 20);
        assert!(!b.clear(70));
        assert_eq!(b.next_zero_from(70), Some(70));
    }

    #[test]
    fn bitmap_finds_single_hole_in_16m_from_anywhere() {
        let mut b = Bitmap::new(1 << 24);
        assert_eq!(b.set_range(0, 1 << 24), 1 << 24);
        assert!(b.clear(12_345_678));
        assert_eq!(b.next_zero_from(0), Some(12_345_678));
        assert_eq!(b.next_zero_from(12_345_678), Some(12_345_678));
        assert_eq!(b.next_zero_from(12_345_679), None);
        assert_eq!(b.next_zero_after_word(0), Some(12_345_678));
        assert_eq!(
            b.next_zero_after_word(12_345_678 / 64 - 1),
            Some(12_345_678)
        );
        assert_eq!(b.next_zero_after_word(12_345_678 / 64), None);
        assert!(b.set(12_345_678));
        assert_eq!(b.next_zero_from(0), None);
        assert_eq!(b.clear_range(4096 * 64 - 3, 4096 * 64 + 2), 5);
        assert_eq!(b.next_zero_from(0), Some(4096 * 64 - 3));
    }

    #[derive(Debug, Clone)]
    enum BitOp {
        Set(usize),
        Clear(usize),
        SetRange(usize, usize),
        ClearRange(usize, usize),
    }

    fn bit_ops(len: usize) -> impl Strategy<Value = Vec<BitOp>> {
        let range = (0..len, 0..=len).prop_map(|(a, b)| (a.min(b), a.max(b)));
        let op = prop_oneof![
            (0..len).prop_map(BitOp::Set),
            (0..len).prop_map(BitOp::Clear),
            range.clone().prop_map(|(a, b)| BitOp::SetRange(a, b)),
            range.prop_map(|(a, b)| BitOp::ClearRange(a, b)),
        ];
        proptest::collection::vec(op, 1..40)
    }

    fn sizes_and_ops() -> impl Strategy<Value = (usize, Vec<BitOp>, Vec<usize>)> {
        prop_oneof![1usize..=130, 4000usize..=4200].prop_flat_map(|len| {
            (
                Just(len),
                bit_ops(len),
                proptest::collection::vec(0..=len, 1..20),
            )
        })
    }

    proptest! {
        #[test]
        fn bitmap_agrees_with_naive_model((len, ops, queries) in sizes_and_ops()) {
            let mut b = Bitmap::new(len);
            let mut model = vec![false; len];
            for op in &ops {
                let flipped = match *op {
                    BitOp::Set(i) => usize::from(b.set(i)),
                    BitOp::Clear(i) => usize::from(b.clear(i)),
                    BitOp::SetRange(lo, hi) => b.set_range(lo, hi),
                    BitOp::ClearRange(lo, hi) => b.clear_range(lo, hi),
                };
                let (lo, hi, value) = match *op {
                    BitOp::Set(i) => (i, i + 1, true),
                    BitOp::Clear(i) => (i, i + 1, false),
                    BitOp::SetRange(lo, hi) => (lo, hi, true),
                    BitOp::ClearRange(lo, hi) => (lo, hi, false),
                };
                let expected = model[lo..hi].iter().filter(|&&bit| bit != value).count();
                model[lo..hi].fill(value);
                prop_assert_eq!(flipped, expected, "{:?}", op);
                for &q in queries.iter().chain([0, len.saturating_sub(1)].iter()) {
                    prop_assert_eq!(b.next_zero_from(q), naive_next_zero(&model, q), "from {}", q);
                    let next_word = (q / 64 + 1) * 64;
                    prop_assert_eq!(
                        b.next_zero_after_word(q / 64),
                        naive_next_zero(&model, next_word),
                        "after word {}", q / 64
                    );
                }
            }
            for pair in queries.windows(2) {
                let (lo, hi) = (pair[0].min(pair[1]), pair[0].max(pair[1]));
                prop_assert_eq!(b.all_set(lo, hi), model[lo..hi].iter().all(|&bit| bit));
            }
        }
    }

    // ---- set properties ----------------------------------------------------------------

    #[derive(Debug, Clone)]
    enum SetOp {
        Allocate,
        /// A range of prefix `cluster prefix + .0`, at offset `.1` (scaled into the set).
        Occupy(i8, u32),
        Release(i8, u32),
        /// A range outside the cluster: must be rejected without changing anything.
        OccupyOutside,
    }

    fn set_ops() -> impl Strategy<Value = Vec<SetOp>> {
        let op = prop_oneof![
            4 => Just(SetOp::Allocate),
            2 => (-2i8..=10, any::<u32>()).prop_map(|(p, o)| SetOp::Occupy(p, o)),
            2 => (-2i8..=10, any::<u32>()).prop_map(|(p, o)| SetOp::Release(p, o)),
            1 => Just(SetOp::OccupyOutside),
        ];
        proptest::collection::vec(op, 0..150)
    }

    /// A cluster (v4 or v6) with 1 to 2^13 node ranges.
    fn clusters() -> impl Strategy<Value = CidrSet> {
        (
            prop_oneof![Just("10.20.0.0/16"), Just("2001:db8:0:ff00::/56")],
            0u8..=13,
        )
            .prop_map(|(cluster, extra)| {
                let cluster = net(cluster);
                CidrSet::new(cluster, cluster.prefix_len() + extra).unwrap()
            })
    }

    /// The range of prefix `cluster prefix + dp` at a position picked by `offset`, host bits
    /// included (callers must ignore them).
    fn range_in(s: &CidrSet, dp: i8, offset: u32) -> IpNet {
        let cluster = s.cluster();
        let prefix = (i16::from(cluster.prefix_len()) + i16::from(dp)) as u8;
        let prefix = prefix.min(cluster.max_prefix_len());
        match cluster {
            IpNet::V4(c) => {
                let host = offset.checked_shr(u32::from(c.prefix_len())).unwrap_or(0);
                let a = Ipv4Addr::from(u32::from(c.network()) | host);
                IpNet::V4(Ipv4Net::new(a, prefix).unwrap())
            }
            IpNet::V6(c) => {
                let host = (u128::from(offset) << 96)
                    .checked_shr(u32::from(c.prefix_len()))
                    .unwrap_or(0);
                let a = Ipv6Addr::from(u128::from(c.network()) | host);
                IpNet::V6(Ipv6Net::new(a, prefix).unwrap())
            }
        }
    }

    fn outside(s: &CidrSet) -> IpNet {
        match s.cluster() {
            IpNet::V4(_) => net("192.168.0.0/24"),
            IpNet::V6(_) => net("fd00::/64"),
        }
    }

    /// Naive model: one bool per node range, and Kubernetes' bit-by-bit allocation loop.
    /// Node ranges are found through ipnet's `subnets`, not the set's own index arithmetic.
    struct Model {
        cluster: IpNet,
        node_mask_size: u8,
        index: std::collections::BTreeMap<IpNet, usize>,
        bits: Vec<bool>,
        cursor: usize,
        allocations: u64,
        releases: u64,
        tries: u64,
    }

    impl Model {
        fn new(s: &CidrSet) -> Self {
            let cluster = s.cluster();
            let subnets = cluster.subnets(s.node_mask_size()).unwrap();
            Model {
                cluster,
                node_mask_size: s.node_mask_size(),
                index: subnets.enumerate().map(|(i, r)| (r, i)).collect(),
                bits: vec![false; s.max() as usize],
                cursor: 0,
                allocations: 0,
                releases: 0,
                tries: 0,
            }
        }

        /// The indices of the node ranges `range` covers.
        fn covered(&self, range: IpNet) -> Vec<usize> {
            let range = range.trunc();
            if range.contains(&self.cluster) {
                return (0..self.bits.len()).collect();
            }
            if range.prefix_len() <= self.node_mask_size {
                let subnets = range.subnets(self.node_mask_size).unwrap();
                return subnets.map(|r| self.index[&r]).collect();
            }
            let node = IpNet::new(range.addr(), self.node_mask_size)
                .unwrap()
                .trunc();
            vec![self.index[&node]]
        }

        fn allocate(&mut self) -> Option<usize> {
            let n = self.bits.len();
            let i = (0..n)
                .map(|k| (self.cursor + k) % n)
                .position(|c| !self.bits[c])?;
            let found = (self.cursor + i) % n;
            self.bits[found] = true;
            self.cursor = (found + 1) % n;
            self.allocations += 1;
            self.tries += i as u64;
            Some(found)
        }

        fn mark(&mut self, range: IpNet, value: bool) {
            for i in self.covered(range) {
                match (self.bits[i], value) {
                    (false, true) => self.allocations += 1,
                    (true, false) => self.releases += 1,
                    _ => {}
                }
                self.bits[i] = value;
            }
        }

        fn used(&self) -> u32 {
            self.bits.iter().filter(|&&b| b).count() as u32
        }
    }

    /// Runs `ops` against the set and the model, checking every invariant after each.
    fn run_against_model(
        s: &mut CidrSet,
        model: &mut Model,
        live: &mut Vec<IpNet>,
        ops: &[SetOp],
    ) -> Result<(), TestCaseError> {
        for op in ops {
            match *op {
                SetOp::Allocate => {
                    let got = s.allocate_next();
                    match model.allocate() {
                        Some(index) => {
                            let range = got
                                .clone()
                                .map_err(|e| TestCaseError::fail(e.to_string()))?;
                            prop_assert_eq!(Ok(range), s.range_at(index as u32));
                            prop_assert!(s.contains(range), "{} outside {}", range, s.cluster());
                            prop_assert_eq!(range.prefix_len(), s.node_mask_size());
                            prop_assert_eq!(range, range.trunc());
                            live.push(range);
                        }
                        None => prop_assert_eq!(
                            got,
                            Err(CidrSetError::Exhausted {
                                cluster: s.cluster()
                            })
                        ),
                    }
                }
                SetOp::Occupy(dp, offset) => {
                    let range = range_in(s, dp, offset);
                    s.occupy(range)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    model.mark(range, true);
                }
                SetOp::Release(dp, offset) => {
                    let range = range_in(s, dp, offset);
                    s.release(range)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    model.mark(range, false);
                    live.retain(|l| !(range.contains(l) || l.contains(&range)));
                }
                SetOp::OccupyOutside => {
                    let range = outside(s);
                    let err = s.occupy(range).unwrap_err();
                    prop_assert_eq!(
                        err,
                        CidrSetError::OutOfRange {
                            range,
                            cluster: s.cluster()
                        }
                    );
                }
            }
            prop_assert_eq!(s.used(), model.used());
            prop_assert_eq!(s.allocations(), model.allocations);
            prop_assert_eq!(s.releases(), model.releases);
            prop_assert_eq!(s.allocation_tries(), model.tries);
            // No two live ranges overlap: sorted, each ends before the next begins.
            live.sort();
            for pair in live.windows(2) {
                prop_assert!(
                    pair[0].broadcast() < pair[1].network(),
                    "{} overlaps {}",
                    pair[0],
                    pair[1]
                );
            }
            for &range in live.iter() {
                prop_assert_eq!(s.is_occupied(range), Ok(true));
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn live_ranges_disjoint_inside_cluster_and_counted(mut s in clusters(), ops in set_ops()) {
            let (mut model, mut live) = (Model::new(&s), Vec::new());
            run_against_model(&mut s, &mut model, &mut live, &ops)?;
            // Every bit set was counted as an allocation, every bit cleared as a release.
            prop_assert_eq!(s.allocations() - s.releases(), u64::from(s.used()));
        }

        /// After any history, allocating until exhausted yields some order A. Releasing every
        /// range of A, in any order, and allocating until exhausted again yields A again: the
        /// cursor stays just after the last range of A, and every range between it and A's
        /// first is still occupied by the history, so both runs start at A's first range.
        #[test]
        fn release_all_then_allocate_all_repeats_the_same_order(
            mut s in clusters(),
            history in set_ops(),
            shuffle_keys in proptest::collection::vec(any::<u64>(), 1 << 13),
        ) {
            let (mut model, mut live) = (Model::new(&s), Vec::new());
            run_against_model(&mut s, &mut model, &mut live, &history)?;
            let used_before = s.used();
            let first = allocate_all(&mut s);
            prop_assert_eq!(s.used(), s.max());
            prop_assert_eq!(first.len() as u32, s.max() - used_before);
            let mut order: Vec<usize> = (0..first.len()).collect();
            order.sort_by_key(|&i| shuffle_keys[i]);
            for &i in &order {
                s.release(first[i]).unwrap();
            }
            prop_assert_eq!(s.used(), used_before);
            let second = allocate_all(&mut s);
            prop_assert_eq!(first, second);
        }
    }
}
