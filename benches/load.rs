//! A rollout load generator and a zero-latency SGLang upstream, both in Rust, against the
//! release `rollout-proxy` binary as a separate process (so its CPU is its own):
//!
//! - load: R rollouts, C at a time, T turns each, the Python harness's workload (`workload.rs`:
//!   its system prompt, questions and three tools; Hermes tool calls answered by tool results,
//!   text replies answered by the next question; the upstream answers from the harness's reply
//!   pool), every rollout checked to be one node with equal token/mask/logprob lengths, then
//!   deleted.
//!   Reports turns/s, the proxy's CPU per turn (from its threads' schedstat, nanoseconds),
//!   turn latency percentiles and the proxy's RSS.
//! - growth: one long rollout, the proxy's CPU for each turn as its history grows (tool results
//!   padded so turn 128 holds ~70k tokens).
//! - streams: the workload's first turn streamed one at a time, on fresh sessions: time to the
//!   first byte, to the first sampled tokens' event, and to the end.
//!
//! `cargo bench --bench load` (needs scripts/fetch-fixtures.sh). `LOAD_API` (`chat`, the
//! default; `messages`: Anthropic; `responses`: OpenAI Responses) is the API the rollouts
//! speak. `LOAD_C`, `LOAD_R`, `LOAD_T`, `STREAM_PROBES` (200; 0 skips them), `GROWTH_TURNS`
//! (0 skips growth), `GROWTH_REPEAT` (5). `LOAD_PROXY_BIN` measures another
//! build of rollout-proxy, and `LOAD_PROXY_ARGS` adds flags to it (e.g. `--data-dir DIR`);
//! `LOAD_PROXY_CMD` another proxy altogether (a shell command with
//! `{port}` and `{upstream}`: scripts/perf-compare.sh drives the Atropos reference this way).
//! Under `cargo test --all-targets` it runs a small smoke version.

#[path = "load/apis.rs"]
mod apis;
#[path = "../tests/common/mod.rs"]
mod common;
#[path = "load/proxy.rs"]
mod proxy;
#[path = "load/rollouts.rs"]
mod rollouts;
#[path = "load/workload.rs"]
mod workload;

use apis::{Api, Conversation};
use common::{env_or, fixture_model};
use proxy::ProxyProcess;
use rollout_proxy::tokenizer::Tokenizer;
use rollouts::{nodes_of, percentile, post, post_bytes, rollout, upstream};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use workload::{QUESTIONS, SYSTEM, tools};

// The proxy's allocator here too: the generator and the mock share the two cores with the
// proxy, and every cycle they save is the proxy's to use.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let (c, r, t, growth_turns, growth_repeat, probes) = if benchmarking {
        (
            env_or("LOAD_C", 32),
            env_or("LOAD_R", 200),
            env_or("LOAD_T", 6),
            env_or("GROWTH_TURNS", 128),
            env_or("GROWTH_REPEAT", 5),
            env_or("STREAM_PROBES", 200),
        )
    } else {
        (4, 8, 6, 8, 1, 4)
    };
    let api = Api::from_env();
    let tokenizer = Tokenizer::from_path(&fixture_model("qwen3")).unwrap();
    let worker = upstream(&tokenizer);
    let proxy = ProxyProcess::start(&worker.url);
    let base = proxy.url.clone();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(c)
        .build()
        .unwrap();
    runtime.block_on(async {
        // Warm-up: one rollout.
        rollout(&client, &base, api, 0, t).await;
        let idle_rss = proxy.rss_mib();
        let next = Arc::new(AtomicUsize::new(0));
        let cpu_before = proxy.cpu_ns();
        let start = Instant::now();
        let workers = (0..c).map(|_| {
            let (client, base, next) = (client.clone(), base.clone(), next.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= r {
                        return latencies;
                    }
                    latencies.extend(rollout(&client, &base, api, index, t).await);
                }
            })
        });
        let mut latencies: Vec<Duration> = futures::future::join_all(workers)
            .await
            .into_iter()
            .flat_map(Result::unwrap)
            .collect();
        let wall = start.elapsed().as_secs_f64();
        let cpu = (proxy.cpu_ns() - cpu_before) as f64 / 1e6;
        latencies.sort();
        let turns = latencies.len();
        println!(
            "load ({}): C={c} R={r} T={t}, zero-latency upstream, every rollout one node (checked)",
            api.name()
        );
        println!(
            "  {turns} turns in {wall:.2} s = {:.0} turns/s; proxy CPU {:.3} ms/turn; latency p50/p90/p99 = {:.2}/{:.2}/{:.2} ms; RSS idle {idle_rss:.1} MiB, after {:.1} MiB",
            turns as f64 / wall,
            cpu / turns as f64,
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.9),
            percentile(&latencies, 0.99),
            proxy.rss_mib(),
        );

        stream_probe(&client, &base, api, probes).await;

        // Growth: one session, its history growing by ~550 tokens a turn; the rollout is run
        // `growth_repeat` times and each turn's median CPU is reported (a single turn is noisy).
        // A short rollout before each long one: otherwise turn 1 would follow the deletion of the
        // previous 68k-token rollout and pay for its after-effects (cold caches, freed memory).
        // `GROWTH_TURNS=0` skips it (e.g. to profile the load alone).
        if growth_turns == 0 {
            return;
        }
        let mut runs = Vec::new();
        for _ in 0..growth_repeat {
            rollout(&client, &base, Api::Chat, 0, 2).await;
            runs.push(growth_rollout(&client, &base, &proxy, growth_turns).await);
        }
        let curve: Vec<(usize, u64, f64)> = (0..growth_turns)
            .map(|i| {
                let mut cpus: Vec<f64> = runs.iter().map(|run| run[i].2).collect();
                cpus.sort_by(f64::total_cmp);
                (runs[0][i].0, runs[0][i].1, cpus[cpus.len() / 2])
            })
            .collect();
        println!("growth: proxy CPU per turn of one rollout, median of {growth_repeat} (turn, prompt tokens, ms)");
        let first = curve[0].2;
        for &(turn, tokens, cpu) in &curve {
            if turn.is_power_of_two() || turn == growth_turns {
                println!("  turn {turn:>4}  {tokens:>7} tokens  {cpu:>8.3} ms  ({:.1}x turn 1)", cpu / first);
            }
        }
    });
}

/// Streams the workload's first turn `n` times, one at a time, each on a fresh session: the
/// time to the stream's first byte and to its first sampled tokens' event, and the whole turn.
async fn stream_probe(client: &reqwest::Client, base: &str, api: Api, n: usize) {
    use futures::StreamExt;
    if n == 0 {
        return;
    }
    let tools = api.tools(&tools());
    let marker = api.first_token_marker();
    let (mut first_byte, mut first_token, mut whole) = (Vec::new(), Vec::new(), Vec::new());
    for index in 0..n {
        let session = post(client, &format!("{base}/sessions/create"), &json!({})).await;
        let uuid = session["uuid"].as_str().unwrap();
        let body = Conversation::new(api, SYSTEM, QUESTIONS[index % QUESTIONS.len()])
            .body(&tools, None, true);
        let start = Instant::now();
        let response = client
            .post(api.url(base, uuid))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
        let mut stream = response.bytes_stream();
        let mut received = Vec::new();
        let mut token_at = None;
        while let Some(chunk) = stream.next().await {
            if received.is_empty() {
                first_byte.push(start.elapsed());
            }
            received.extend_from_slice(&chunk.unwrap());
            if token_at.is_none() && received.windows(marker.len()).any(|w| w == marker) {
                token_at = Some(start.elapsed());
            }
        }
        whole.push(start.elapsed());
        // A proxy that sends no token events (another one, measured for comparison) has none.
        first_token.extend(token_at);
        client
            .delete(format!("{base}/{uuid}"))
            .send()
            .await
            .unwrap();
    }
    for list in [&mut first_byte, &mut first_token, &mut whole] {
        list.sort();
    }
    let first_tokens = match first_token.len() {
        0 => "none".to_string(),
        seen => format!(
            "{:.2}/{:.2} ms{}",
            percentile(&first_token, 0.5),
            percentile(&first_token, 0.9),
            if seen < n {
                format!(" (in {seen} of {n} streams)")
            } else {
                String::new()
            }
        ),
    };
    println!(
        "streams ({}): {n} first turns one at a time; first byte p50/p90 {:.2}/{:.2} ms, first tokens' event {first_tokens}, whole turn {:.2}/{:.2} ms",
        api.name(),
        percentile(&first_byte, 0.5),
        percentile(&first_byte, 0.9),
        percentile(&whole, 0.5),
        percentile(&whole, 0.9),
    );
}

/// One long rollout on a fresh session; the proxy's CPU for each turn.
async fn growth_rollout(
    client: &reqwest::Client,
    base: &str,
    proxy: &ProxyProcess,
    growth_turns: usize,
) -> Vec<(usize, u64, f64)> {
    let pad = "river market window silver garden engine quiet morning harbor signal ".repeat(50);
    let session = post(client, &format!("{base}/sessions/create"), &json!({})).await;
    let uuid = session["uuid"].as_str().unwrap();
    let chat = Api::Chat.url(base, uuid);
    let mut conversation = Conversation::new(Api::Chat, SYSTEM, QUESTIONS[0]);
    let mut curve = Vec::new();
    let tools = tools();
    for turn in 1..=growth_turns {
        let body = conversation.body(&tools, None, false);
        let before = proxy.cpu_ns();
        let reply = post_bytes(client, &chat, body).await;
        let cpu = (proxy.cpu_ns() - before) as f64 / 1e6;
        let prompt_tokens = reply["usage"]["prompt_tokens"].as_u64().unwrap();
        curve.push((turn, prompt_tokens, cpu));
        conversation.answer(
            &reply,
            &format!("{} {pad}", QUESTIONS[turn % QUESTIONS.len()]),
            |_| format!("{{\"notes\": \"{pad}\"}}"),
        );
    }
    let nodes = nodes_of(client, base, uuid).await;
    assert_eq!(nodes.len(), 1, "the long rollout is one node");
    client
        .delete(format!("{base}/{uuid}"))
        .send()
        .await
        .unwrap();
    curve
}
