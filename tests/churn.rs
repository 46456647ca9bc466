//! 100,000 sessions churned through create, a committed turn (a 440-token node) and delete:
//! the process's resident memory comes back to within a few MiB of where it started (the
//! HTTP path's figure is the load bench's RSS before and after; BENCHMARKS.md). Its own test
//! binary, so the memory is its own.

#[path = "common/records.rs"]
mod records;

use records::synthetic_turn;
use rollout_proxy::session::{SessionOptions, SessionStore, apply};

#[global_allocator]
static ALLOCATOR: rollout_proxy::memory::Allocator = rollout_proxy::memory::Allocator;

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb / 1024.0
}

#[test]
fn a_hundred_thousand_sessions_come_and_go_and_memory_comes_back() {
    let store = SessionStore::default();
    // Warm up the allocator's classes and the map's capacity with a first round.
    let churn = |n: u32| {
        for i in 0..n {
            let session = store.create(SessionOptions::default()).unwrap();
            {
                let mut state = session.state.try_lock().unwrap();
                apply(&mut state, &synthetic_turn(None, 400, 40, i));
            }
            store.remove(&session.id.to_string()).unwrap();
        }
    };
    churn(1_000);
    rollout_proxy::memory::release_freed();
    let before = rss_mib();
    churn(100_000);
    rollout_proxy::memory::release_freed();
    let after = rss_mib();
    assert!(store.is_empty());
    assert!(
        after - before < 4.0,
        "RSS {before:.1} MiB before, {after:.1} MiB after 100,000 sessions"
    );
    println!("RSS {before:.1} MiB before, {after:.1} MiB after 100,000 sessions");
}
