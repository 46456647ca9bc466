//! The journal (`--data-dir`) at scale: N sessions holding T tokens each are written as a
//! rollout writes them (a session's creation, then turns of a growing prompt), and the
//! journal is then replayed as a restart does. Reports bytes on disk per held token, the
//! write rate, and the restart (replay) time.
//!
//! `cargo bench --bench journal`: `JOURNAL_SESSIONS` (10000), `JOURNAL_TOKENS` (4096 per
//! session), `JOURNAL_TURNS` (4 per session). Under `cargo test --all-targets` it runs a small
//! smoke version.

#[path = "../tests/common/records.rs"]
mod records;

use records::synthetic_turn;
use rollout_proxy::journal::{Entry, Journal};
use rollout_proxy::session::{SessionLog, SessionOptions, SessionStore};
use std::time::Instant;

fn env_or(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let (sessions, tokens, turns) = if benchmarking {
        (
            env_or("JOURNAL_SESSIONS", 10_000),
            env_or("JOURNAL_TOKENS", 4096),
            env_or("JOURNAL_TURNS", 4),
        )
    } else {
        (50, 512, 4)
    };
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("journal-bench");
    let _ = std::fs::remove_dir_all(&dir);
    let per_turn = tokens / turns;
    let sampled = per_turn / 8;
    {
        let store = SessionStore::default();
        let (journal, _) = Journal::open(&dir, &store).unwrap();
        let start = Instant::now();
        for s in 0..sessions {
            let id = uuid::Uuid::new_v4();
            journal
                .append(&Entry::Created {
                    id,
                    options: SessionOptions::default(),
                    created_at: 0.0,
                })
                .unwrap();
            for t in 0..turns {
                let node = (t > 0).then_some(0);
                let record =
                    synthetic_turn(node, per_turn - sampled, sampled, (s * turns + t) as u32);
                futures::executor::block_on(journal.committed(id, &record)).unwrap();
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        let bytes = journal.size() as f64;
        let held = (sessions * turns * per_turn) as f64;
        println!(
            "journal: {sessions} sessions x {} tokens ({turns} turns, 1/8 sampled): {:.1} MB, {:.2} bytes per held token; written in {seconds:.2} s ({:.0} turns/s)",
            turns * per_turn,
            bytes / 1e6,
            bytes / held,
            (sessions * turns) as f64 / seconds,
        );
    }
    let store = SessionStore::default();
    let start = Instant::now();
    let (_, replayed) = Journal::open(&dir, &store).unwrap();
    let seconds = start.elapsed().as_secs_f64();
    assert_eq!(replayed.sessions, sessions);
    assert_eq!(replayed.turns, sessions * turns);
    println!(
        "restart: replayed {} sessions and {} turns in {seconds:.2} s",
        replayed.sessions, replayed.turns
    );
    let _ = std::fs::remove_dir_all(&dir);
}
