//! Byte comparison a word at a time: the algorithm behind the guest's own `memcmp` and `bcmp`
//! on wasm32 (`wasm_runtime`), which replace wasi-libc's byte-at-a-time loop (most of the time
//! of a `BTreeMap<String, _>` lookup). Plain functions here, so they are tested natively.
//!
//! No slice comparison, `==` on arrays or `copy_from_slice` in here: the compiler lowers those
//! to `memcmp`/`bcmp`/`memcpy` calls, and on wasm32 `memcmp` is this very code.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

/// The 8 bytes at `p + i`, little-endian: byte `k` is bits `8k..8k + 8` (no byte swap, which
/// wasm has no instruction for).
///
/// # Safety
/// `p + i .. p + i + 8` must be readable.
#[inline(always)]
unsafe fn load64(p: *const u8, i: usize) -> u64 {
    // SAFETY: the caller guarantees the 8 bytes are readable; no alignment needed.
    u64::from_le(unsafe { p.add(i).cast::<u64>().read_unaligned() })
}

/// As [`load64`], 4 bytes.
///
/// # Safety
/// `p + i .. p + i + 4` must be readable.
#[inline(always)]
unsafe fn load32(p: *const u8, i: usize) -> u32 {
    // SAFETY: the caller guarantees the 4 bytes are readable; no alignment needed.
    u32::from_le(unsafe { p.add(i).cast::<u32>().read_unaligned() })
}

/// The difference of the first differing bytes (as unsigned) of two little-endian loads
/// that differ: the lowest set bit of `x ^ y` is in that byte.
#[inline(always)]
fn byte_difference(x: u64, y: u64) -> i32 {
    let shift = (x ^ y).trailing_zeros() & !7;
    i32::from((x >> shift) as u8) - i32::from((y >> shift) as u8)
}

/// C's `memcmp`: negative, zero or positive as the first differing byte of `a` (as an unsigned
/// byte) is smaller than, absent from or larger than `b`'s, over `n` bytes.
///
/// # Safety
/// `a .. a + n` and `b .. b + n` must be readable (any pointers when `n` is 0).
#[inline(always)]
pub(crate) unsafe fn memcmp_raw(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY (every load below): each reads inside `0..n` of both buffers.
    unsafe {
        if n >= 8 {
            let mut i = 0;
            // Whole words, then the last 8 bytes (overlapping the last word compared, which was
            // equal): no byte loop.
            while i + 8 < n {
                let (x, y) = (load64(a, i), load64(b, i));
                if x != y {
                    return byte_difference(x, y);
                }
                i += 8;
            }
            let (x, y) = (load64(a, n - 8), load64(b, n - 8));
            return if x != y { byte_difference(x, y) } else { 0 };
        }
        if n >= 4 {
            // The first 4 bytes, then the last 4 (overlapping when `n` < 8).
            let (x, y) = (load32(a, 0), load32(b, 0));
            if x != y {
                return byte_difference(u64::from(x), u64::from(y));
            }
            let (x, y) = (load32(a, n - 4), load32(b, n - 4));
            return if x != y {
                byte_difference(u64::from(x), u64::from(y))
            } else {
                0
            };
        }
        let mut i = 0;
        while i < n {
            let (x, y) = (*a.add(i), *b.add(i));
            if x != y {
                return i32::from(x) - i32::from(y);
            }
            i += 1;
        }
        0
    }
}

/// C's `bcmp`: zero when the `n` bytes at `a` and `b` are equal, non-zero otherwise.
///
/// # Safety
/// As [`memcmp_raw`].
#[inline(always)]
pub(crate) unsafe fn bcmp_raw(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY (every load below): each reads inside `0..n` of both buffers.
    unsafe {
        if n >= 8 {
            let mut i = 0;
            while i + 8 < n {
                if load64(a, i) != load64(b, i) {
                    return 1;
                }
                i += 8;
            }
            return (load64(a, n - 8) != load64(b, n - 8)) as i32;
        }
        if n >= 4 {
            let differ = (load32(a, 0) ^ load32(b, 0)) | (load32(a, n - 4) ^ load32(b, n - 4));
            return (differ != 0) as i32;
        }
        let mut i = 0;
        while i < n {
            if *a.add(i) != *b.add(i) {
                return 1;
            }
            i += 1;
        }
        0
    }
}

/// [`memcmp_raw`] over two slices of the same length.
#[cfg(test)]
fn compare(a: &[u8], b: &[u8]) -> i32 {
    assert_eq!(a.len(), b.len(), "memcmp compares equal lengths");
    // SAFETY: both slices hold `a.len()` readable bytes.
    unsafe { memcmp_raw(a.as_ptr(), b.as_ptr(), a.len()) }
}

/// [`bcmp_raw`] over two slices of the same length.
#[cfg(test)]
fn differ(a: &[u8], b: &[u8]) -> i32 {
    assert_eq!(a.len(), b.len(), "bcmp compares equal lengths");
    // SAFETY: both slices hold `a.len()` readable bytes.
    unsafe { bcmp_raw(a.as_ptr(), b.as_ptr(), a.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;
    use core::cmp::Ordering;
    use proptest::prelude::*;

    fn sign(x: i32) -> Ordering {
        x.cmp(&0)
    }

    fn check(a: &[u8], b: &[u8]) -> Result<(), TestCaseError> {
        let expected = a.cmp(b);
        prop_assert_eq!(sign(compare(a, b)), expected, "memcmp {:?} {:?}", a, b);
        prop_assert_eq!(sign(compare(b, a)), expected.reverse());
        prop_assert_eq!(
            differ(a, b) != 0,
            expected != Ordering::Equal,
            "bcmp {:?} {:?}",
            a,
            b
        );
        Ok(())
    }

    /// Two buffers of the same length, equal but for a few bytes (often none, often only the
    /// last, often bytes with the top bit set, so signedness shows): random buffers would
    /// nearly always differ at byte 0.
    fn pairs() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
        (0usize..80).prop_flat_map(|n| {
            let edit = (
                0..n.max(1),
                prop_oneof![Just(0u8), Just(0x7f), Just(0x80), Just(0xff), any::<u8>()],
            );
            (
                proptest::collection::vec(prop_oneof![Just(0x80u8), Just(0xff), any::<u8>()], n),
                proptest::collection::vec(edit, 0..3),
                any::<bool>(),
            )
                .prop_map(move |(a, edits, last)| {
                    let mut b = a.clone();
                    for (at, byte) in edits {
                        if at < n {
                            b[at] = byte;
                        }
                    }
                    if last && n > 0 {
                        b[n - 1] = b[n - 1].wrapping_add(1);
                    }
                    (a, b)
                })
        })
    }

    proptest! {
        #[test]
        fn agrees_with_slice_ord((a, b) in pairs()) {
            check(&a, &b)?;
        }

        #[test]
        fn agrees_with_slice_ord_on_random_bytes(
            a in proptest::collection::vec(any::<u8>(), 0..40),
            b in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let n = a.len().min(b.len());
            check(&a[..n], &b[..n])?;
        }

        /// Unaligned starts: the loads must not assume alignment.
        #[test]
        fn unaligned_offsets((a, b) in pairs(), skip_a in 0usize..8, skip_b in 0usize..8) {
            let (skip_a, skip_b) = (skip_a.min(a.len()), skip_b.min(a.len()));
            let n = a.len() - skip_a.max(skip_b);
            check(&a[skip_a..skip_a + n], &b[skip_b..skip_b + n])?;
        }
    }

    #[test]
    fn every_length_and_position_of_one_difference() {
        for n in 0..40 {
            let a: Vec<u8> = (0..n).map(|i| i as u8 ^ 0x5a).collect();
            assert_eq!(compare(&a, &a), 0);
            assert_eq!(differ(&a, &a), 0);
            for at in 0..n {
                for byte in [0u8, 1, 0x7f, 0x80, 0xfe, 0xff] {
                    let mut b = a.clone();
                    b[at] = byte;
                    // As wasi-libc's: the difference of the first differing bytes.
                    let expected = i32::from(a[at]) - i32::from(b[at]);
                    assert_eq!(compare(&a, &b), expected, "n {n}, byte {at} = {byte}");
                    assert_eq!(differ(&a, &b) != 0, a != b, "n {n}, byte {at} = {byte}");
                }
            }
        }
    }

    #[test]
    fn empty_and_dangling_are_equal() {
        // SAFETY: nothing is read when `n` is 0.
        unsafe {
            assert_eq!(memcmp_raw(core::ptr::null(), core::ptr::null(), 0), 0);
            assert_eq!(bcmp_raw(core::ptr::null(), core::ptr::null(), 0), 0);
        }
    }
}
