//! Fault-injected load: R rollouts × T turns, C at a time, through the release proxy with
//! `--data-dir`, before two SGLang upstreams that fail a share of their requests (5xx, a
//! connection reset, a hang past the proxy's backend timeout, a stream cut mid-way), with
//! clients that hang up mid-stream on purpose, one upstream killed and restarted a quarter of
//! the way in, and the proxy itself killed with SIGKILL and restarted halfway.
//!
//! The rollouts speak chat (odd turns streamed), Messages and Responses in turn, each turn
//! with an `Idempotency-Key` that its retries reuse (rollout.rs). One in 50 (in 8 in the small version) is doomed: from
//! its fourth turn on every upstream request fails. Checked: every rollout either completes
//! with an exact node (check.rs: one node, each sampled run exactly the upstream's reply to
//! the prompt before it, ids and logprobs) or fails with its session exactly as before the
//! failed turn; after the run every session's `/nodes` is read again and must be byte-identical
//! to what was checked (nothing lost through the restart). Any violation fails the run.
//!
//! `cargo bench --bench faults`: `FAULTS_R` (1000), `FAULTS_C` (64), `FAULTS_T` (8),
//! `FAULTS_PER_MILLE` (100: upstream requests failed), `HANG_UP_EVERY` (8: streamed
//! attempts hung up). `LOAD_PROXY_BIN` runs another build. Under `cargo test --all-targets`
//! it runs a small version (24 rollouts) with every fault, kill and restart.

#[path = "load/apis.rs"]
mod apis;
#[path = "faults/chaos.rs"]
mod chaos;
#[path = "faults/check.rs"]
mod check;
#[path = "../tests/common/mod.rs"]
mod common;
#[path = "faults/rollout.rs"]
mod rollout;
#[path = "load/workload.rs"]
mod workload;

use apis::Api;
use chaos::{Injected, ProxyProcess};
use common::mock_worker::{MockWorker, Sample, Wire};
use common::{env_or, fixture_model, scratch_dir};
use rollout::{Outcome, Plan, Seen};
use rollout_proxy::tokenizer::Tokenizer;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A rollout's session and how it ended.
struct Ended {
    uuid: String,
    doomed: bool,
    outcome: Outcome,
    /// `/nodes` as checked when it ended.
    nodes: String,
}

fn main() {
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let (r, c, t, doom_every, hang_up_every) = match benchmarking {
        true => (
            env_or("FAULTS_R", 1000),
            env_or("FAULTS_C", 64),
            env_or("FAULTS_T", 8),
            50,
            env_or("HANG_UP_EVERY", 8) as u64,
        ),
        false => (24, 8, 8, 8, 2),
    };
    let per_mille = env_or("FAULTS_PER_MILLE", 100) as u64;
    let tokenizer = Arc::new(Tokenizer::from_path(&fixture_model("qwen3")).unwrap());
    let upstream = Arc::new(workload::ReplyPool::new(&tokenizer));
    let injected = Arc::new(Injected::default());
    let workers = [(); 2].map(|_| {
        let worker = MockWorker::start(Wire::Sglang);
        let replies = upstream.clone();
        worker.respond_with(Arc::new(move |prompt: &[u32]| {
            Sample::stop(replies.reply(prompt).to_vec())
        }));
        worker.inject_faults(chaos::injector(
            per_mille,
            tokenizer.clone(),
            injected.clone(),
        ));
        worker
    });
    let dir = scratch_dir("bench-faults");
    let mut proxy = ProxyProcess::start([&workers[0].url, &workers[1].url], &dir);
    let base = proxy.url.clone();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(c)
        .build()
        .unwrap();
    let seen = Arc::new(Seen::default());
    let started = Instant::now();
    let ended: Vec<Ended> = runtime.block_on(async {
        let next = Arc::new(AtomicUsize::new(0));
        let runners = (0..c).map(|_| {
            let (client, base, next, seen) =
                (client.clone(), base.clone(), next.clone(), seen.clone());
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let mut ended = Vec::new();
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= r {
                        return ended;
                    }
                    let plan = Plan {
                        index,
                        api: [Api::Chat, Api::Messages, Api::Responses][index % 3],
                        turns: t,
                        doomed_at: (index % doom_every == doom_every / 2).then_some(3.min(t - 1)),
                        hang_up_every,
                    };
                    let uuid = rollout::create_session(&client, &base).await;
                    let outcome = rollout::run(&client, &base, &plan, &uuid, &seen).await;
                    let nodes = rollout::nodes(&client, &base, &uuid).await;
                    judge(&plan, &outcome, &nodes, &upstream);
                    ended.push(Ended {
                        uuid,
                        doomed: plan.doomed_at.is_some(),
                        outcome,
                        nodes,
                    });
                }
            })
        });
        let runners = futures::future::join_all(runners);
        let chaos = chaos_schedule(&workers, &mut proxy, &seen, r * t);
        let (ended, (turns_at_kill, restart)) = futures::join!(runners, chaos);
        assert!(
            turns_at_kill < (r * t) as u64,
            "the proxy was killed mid-run"
        );
        let ended: Vec<Ended> = ended.into_iter().flat_map(Result::unwrap).collect();
        let wall = started.elapsed();
        // Nothing lost: every session reads back exactly as it was checked.
        for rollout in &ended {
            let now = rollout::nodes(&client, &base, &rollout.uuid).await;
            assert_eq!(now, rollout.nodes, "session {} changed", rollout.uuid);
        }
        report(
            &ended,
            &seen,
            &injected,
            (r, c, t, per_mille),
            (wall, turns_at_kill, restart),
        );
        ended
    });
    assert_eq!(ended.len(), r);
}

/// Fails the run unless the rollout ended as it must.
fn judge(plan: &Plan, outcome: &Outcome, nodes: &str, upstream: &workload::ReplyPool) {
    let parsed: serde_json::Value = serde_json::from_str(nodes).unwrap();
    match outcome {
        Outcome::Completed => {
            assert!(
                plan.doomed_at.is_none(),
                "doomed rollout {} completed",
                plan.index
            );
            if let Err(error) =
                check::exact_node(&parsed, plan.turns, &|p| upstream.reply(p).to_vec())
            {
                panic!("rollout {} ({}): {error}", plan.index, plan.api.name());
            }
        }
        Outcome::Failed {
            turns_done,
            before,
            after,
            ..
        } => {
            assert_eq!(
                before, after,
                "rollout {}: a failed turn changed the session",
                plan.index
            );
            if *turns_done > 0 {
                let replies = |p: &[u32]| upstream.reply(p).to_vec();
                if let Err(error) = check::exact_node(&parsed, *turns_done, &replies) {
                    panic!("rollout {} before its failed turn: {error}", plan.index);
                }
            }
        }
    }
}

/// Kills one upstream a quarter of the way in (back two seconds later) and, meanwhile, the
/// proxy (SIGKILL) halfway; returns the turns done when the proxy was killed and how long the
/// restarted proxy took to answer (its journal replayed).
async fn chaos_schedule(
    workers: &[MockWorker; 2],
    proxy: &mut ProxyProcess,
    seen: &Seen,
    total_turns: usize,
) -> (u64, Duration) {
    let reached = |share: f64| async move {
        while (seen.turns.load(Ordering::Relaxed) as f64) < share * total_turns as f64 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let upstream_down = async {
        reached(0.25).await;
        workers[1].kill().await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        workers[1].restart();
    };
    let proxy_killed = async {
        reached(0.5).await;
        let turns = seen.turns.load(Ordering::Relaxed);
        let killed = Instant::now();
        tokio::task::block_in_place(|| proxy.kill_9_and_restart());
        common::wait_for_health(&reqwest::Client::new(), &proxy.url).await;
        (turns, killed.elapsed())
    };
    futures::join!(upstream_down, proxy_killed).1
}

fn report(
    ended: &[Ended],
    seen: &Seen,
    injected: &Injected,
    (r, c, t, per_mille): (usize, usize, usize, u64),
    (wall, turns_at_kill, restart): (Duration, u64, Duration),
) {
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let completed = ended
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Completed))
        .count();
    let failed = ended.len() - completed;
    let doomed = ended.iter().filter(|e| e.doomed).count();
    // Why the others failed (their last error), most frequent first.
    let mut reasons: std::collections::BTreeMap<&str, usize> = Default::default();
    for rollout in ended.iter().filter(|e| !e.doomed) {
        if let Outcome::Failed { error, .. } = &rollout.outcome {
            *reasons.entry(error.as_str()).or_default() += 1;
        }
    }
    println!(
        "faults: {r} rollouts × {t} turns, {c} concurrent (chat/messages/responses), upstream faults {:.1}%, one upstream killed and restarted, proxy kill -9 + restart",
        per_mille as f64 / 10.0
    );
    println!(
        "  rollouts: {completed} completed with an exact node, {failed} failed with the session as before the failed turn ({doomed} doomed); 0 violations; all {} sessions byte-identical when read again after the run",
        ended.len()
    );
    for (reason, count) in &reasons {
        println!("    {count} not doomed failed on: {reason}");
    }
    println!(
        "  upstream requests {}: injected 5xx {}, resets {}, hangs past the timeout {}, cut streams {}, doomed {}",
        load(&injected.requests),
        load(&injected.status),
        load(&injected.resets),
        load(&injected.hangs),
        load(&injected.cuts),
        load(&injected.doomed)
    );
    println!(
        "  client: {} turns in {} attempts; retried after connection errors {}, 5xx {}, error events {}, own hang-ups {}; replies replayed by key {}",
        load(&seen.turns),
        load(&seen.attempts),
        load(&seen.connection_errors),
        load(&seen.error_statuses),
        load(&seen.error_events),
        load(&seen.hang_ups),
        load(&seen.replayed)
    );
    println!(
        "  wall {:.1} s ({:.0} turns/s); the proxy was killed after {turns_at_kill} turns and answered again {:.0} ms later",
        wall.as_secs_f64(),
        load(&seen.turns) as f64 / wall.as_secs_f64(),
        restart.as_secs_f64() * 1000.0
    );
}
