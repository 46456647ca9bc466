//! 100,000 sessions churned through create, a committed turn (a 440-token node) and delete:
//! the process's resident memory comes back to within a few MiB of where it started (the
//! HTTP path's figure is the load bench's RSS before and after; BENCHMARKS.md). Its own test
//! binary, so the memory is its own.

use rollout_proxy::generation::FinishReason;
use rollout_proxy::session::{CommitRecord, RecordedChoice, Start, TurnLabels, apply};
use rollout_proxy::session::{SegmentCheck, SessionOptions, SessionStore};

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

/// A first turn of 400 prompt and 40 sampled tokens.
fn first_turn(seed: u32) -> CommitRecord {
    CommitRecord {
        start: Start::New { divergence: None },
        new_prompt: (0..400).map(|i| (i * 31 + seed) % 150_000).collect(),
        history: Vec::new(),
        next_check: SegmentCheck {
            prefix_len: 40,
            prefix_hash: u64::from(seed),
            generation_prompt: None,
        },
        labels: TurnLabels {
            api: "chat.completions",
            ..TurnLabels::default()
        },
        track_tree: false,
        choices: vec![RecordedChoice {
            token_ids: (0..40).map(|i| (i * 7 + seed) % 150_000).collect(),
            logprobs: vec![-0.5; 40],
            finish_reason: FinishReason::Stop,
            stop: None,
            weight_version: None,
            cached_tokens: None,
            approximate: false,
            end_token_text: Some("<|im_end|>".into()),
            tool_calls: Vec::new(),
            fingerprints: vec![u64::from(seed)],
            backend: "http://gpu:1".into(),
        }],
        key: None,
    }
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
                apply(&mut state, &first_turn(i));
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
