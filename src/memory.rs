//! Giving freed memory back to the operating system.
//!
//! glibc malloc keeps what the process frees for reuse: the transient allocations of start-up
//! (parsing a tokenizer file), of every turn, and the nodes of deleted sessions. It also makes
//! up to eight arenas per core, each holding its own freed memory. A proxy that holds thousands
//! of sessions and then lets them go should shrink again, so the arenas are limited and freed
//! memory is returned after start-up and, at most once a second, after sessions were used or
//! deleted (a turn frees its request, render and backend buffers, which would otherwise stay
//! resident in the holes between the nodes that live on).
//! Elsewhere than glibc these calls do nothing.

use std::sync::atomic::{AtomicBool, Ordering};

/// Arenas malloc may use. Turns run on a few worker threads; more arenas only spread the
/// same freed memory over more places.
const ARENAS: i32 = 2;

/// Limits malloc's arenas; call first thing in `main`, before threads start.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it is called before other threads run.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
}

/// Returns the heap's free pages to the operating system.
pub fn release_freed() {
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
