//! The allocator, and giving freed memory back to the operating system.
//!
//! The proxy allocates with jemalloc ([`Allocator`], installed by the binary): a turn makes
//! hundreds of small allocations (request, render, backend buffers), and under load glibc
//! malloc took about a sixth of the proxy's CPU; with jemalloc a short turn costs about a fifth
//! less. Its size classes round the nodes' exactly sized blocks up a little (3.9–4.0 rather
//! than glibc's 3.7–3.8 bytes per held history token, with the options below).
//!
//! Allocators keep what the process frees for reuse: the transient allocations of start-up
//! (parsing a tokenizer file), of every turn, and the nodes of deleted sessions. A proxy that
//! holds thousands of sessions and then lets them go should shrink again, so freed memory is
//! returned after start-up and, at most once a second, after sessions were used or deleted (a
//! turn frees its request, render and backend buffers, which would otherwise stay resident in
//! the holes between the nodes that live on). That is done for jemalloc and for glibc malloc,
//! which the C and C++ parts (oniguruma, llama.cpp) still use; glibc's arenas are limited too.

use std::sync::atomic::{AtomicBool, Ordering};

/// The global allocator the binary installs.
pub use tikv_jemallocator::Jemalloc as Allocator;

/// jemalloc's options, read when it starts: its per-thread caches keep only blocks up to
/// 4 KiB (32 KiB by default). A turn's large buffers (request body, render, ids) then go back
/// to the shared arenas, where the periodic purge returns them, instead of staying cached per
/// thread: 4.1–4.3 → 3.9–4.0 bytes per held history token in the memory test (close to a
/// run's noise, but at or under 4.2 in every run since), at no measurable CPU.
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static JEMALLOC_OPTIONS: &[u8; 16] = b"tcache_max:4096\0";

/// Arenas glibc malloc may use. Turns run on a few worker threads; more arenas only spread the
/// same freed memory over more places.
const ARENAS: i32 = 2;

/// Limits glibc malloc's arenas; call first thing in `main`, before threads start.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it is called before other threads run.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
}

/// `arena.<i>.purge` for every arena: jemalloc's "return all unused dirty pages".
const PURGE_ALL_ARENAS: &std::ffi::CStr = c"arena.4096.purge";

/// Returns the heaps' free pages to the operating system.
pub fn release_freed() {
    // SAFETY: a purge takes no value in or out; jemalloc's controls are thread-safe.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            PURGE_ALL_ARENAS.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim is thread-safe; it only releases memory malloc holds as free.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Remembers that memory was freed (a turn ended, a session was deleted), so a periodic task
/// releases it once rather than after every request.
#[derive(Debug, Default)]
pub struct FreedMemory {
    pending: AtomicBool,
}

impl FreedMemory {
    /// Something large was dropped.
    pub fn note(&self) {
        self.pending.store(true, Ordering::Relaxed);
    }

    /// Whether anything was freed since the last call.
    pub fn take(&self) -> bool {
        self.pending.swap(false, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jemalloc_reads_the_options() {
        let mut tcache_max: usize = 0;
        let mut size = std::mem::size_of::<usize>();
        // SAFETY: `opt.tcache_max` is a size_t; `size` says how many bytes may be written.
        let status = unsafe {
            tikv_jemalloc_sys::mallctl(
                c"opt.tcache_max".as_ptr(),
                (&raw mut tcache_max).cast(),
                &mut size,
                std::ptr::null_mut(),
                0,
            )
        };
        assert_eq!((status, tcache_max), (0, 4096));
    }

    #[test]
    fn a_release_is_due_once_per_batch_of_deletions() {
        let freed = FreedMemory::default();
        assert!(!freed.take());
        freed.note();
        freed.note();
        assert!(freed.take());
        assert!(!freed.take());
        release_freed();
    }
}
