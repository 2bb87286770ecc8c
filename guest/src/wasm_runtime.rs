//! What `no_std` on wasm32 needs: an allocator, a panic handler that traps, the canonical
//! ABI's `cabi_realloc`, `memcpy` from the target's bundled libc, and our own `memcmp` and
//! `bcmp` (a word at a time, `crate::mem`) in place of its byte-at-a-time ones.

use alloc::alloc::{Layout, alloc, realloc};

#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}

#[link(name = "c")]
unsafe extern "C" {}

/// C's `memcmp`, 8 bytes at a time. Defined in our object, so the linker never pulls
/// wasi-libc's (byte-at-a-time) one from the archive. Its callers compare names and range
/// texts: the node table's lookups, the cloud's alias against the node's ranges.
///
/// # Safety
/// `a .. a + n` and `b .. b + n` must be readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: forwarded from the caller.
    unsafe { crate::mem::memcmp_raw(a, b, n) }
}

/// C's `bcmp` (equality only), 8 bytes at a time; as [`memcmp`].
///
/// # Safety
/// `a .. a + n` and `b .. b + n` must be readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: forwarded from the caller.
    unsafe { crate::mem::bcmp_raw(a, b, n) }
}

/// The canonical ABI's allocation hook: the host calls it to pass lists and strings in.
#[unsafe(no_mangle)]
unsafe extern "C" fn cabi_realloc(
    old_ptr: *mut u8,
    old_len: usize,
    align: usize,
    new_len: usize,
) -> *mut u8 {
    if new_len == 0 {
        return align as *mut u8;
    }
    // SAFETY: the canonical ABI passes a valid power-of-two `align`, and `old_ptr` /
    // `old_len` describe an allocation this function made.
    let ptr = unsafe {
        if old_len == 0 {
            alloc(Layout::from_size_align_unchecked(new_len, align))
        } else {
            realloc(
                old_ptr,
                Layout::from_size_align_unchecked(old_len, align),
                new_len,
            )
        }
    };
    if ptr.is_null() {
        core::arch::wasm32::unreachable();
    }
    ptr
}
