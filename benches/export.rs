//! The trainer's read of a run: N sessions of about T tokens each, read back one by one with
//! `GET /{uuid}/nodes` (as a trainer without `/export` must), then all at once with
//! `GET /export` as JSON lines and as a NumPy `.npz`. Reports time and MB/s of each, side by
//! side in one run, against the proxy in this process (char-level model: a token per
//! character).
//!
//! `cargo bench --bench export`: `EXPORT_SESSIONS` (1000), `EXPORT_TOKENS` (4096). Under
//! `cargo test --all-targets` it runs a small version.

#[path = "../tests/common/mod.rs"]
mod common;

use common::mock_worker::Sample;
use common::{Proxy, chars, env_or};
use serde_json::json;
use std::time::Instant;

fn main() {
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let (sessions, tokens) = match benchmarking {
        true => (
            env_or("EXPORT_SESSIONS", 1000),
            env_or("EXPORT_TOKENS", 4096),
        ),
        false => (20, 512),
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let proxy = Proxy::atropos();
        let reply = "a sampled reply of some forty characters.";
        proxy
            .worker
            .respond_with(std::sync::Arc::new(move |_: &[u32]| {
                Sample::stop(chars(reply))
            }));
        let question = "x".repeat(tokens.saturating_sub(reply.len() + 40));
        let mut ids = Vec::with_capacity(sessions);
        for i in 0..sessions {
            let uuid = proxy.session(json!({})).await;
            let body = json!({"messages": [{"role": "user", "content": question}]});
            let (status, _) = proxy.chat(&uuid, body).await;
            assert_eq!(status, 200);
            if i % 2 == 0 {
                proxy
                    .post(&format!("/{uuid}/reward"), json!({"reward": 1.0}))
                    .await;
            }
            ids.push(uuid);
        }
        let client = reqwest::Client::new();
        let get = |url: String| {
            let client = client.clone();
            async move {
                let response = client.get(url).send().await.unwrap();
                assert!(response.status().is_success());
                response.bytes().await.unwrap().len()
            }
        };
        let start = Instant::now();
        let mut one_by_one = 0;
        for uuid in &ids {
            one_by_one += get(format!("{}/{uuid}/nodes", proxy.url)).await;
        }
        let nodes_s = start.elapsed().as_secs_f64();
        let start = Instant::now();
        let jsonl = get(format!("{}/export", proxy.url)).await;
        let jsonl_s = start.elapsed().as_secs_f64();
        let start = Instant::now();
        let npz = get(format!("{}/export?format=npz", proxy.url)).await;
        let npz_s = start.elapsed().as_secs_f64();
        let mb = |bytes: usize| bytes as f64 / 1e6;
        println!(
            "export: {sessions} sessions x ~{tokens} tokens ({:.1}M tokens)",
            (sessions * tokens) as f64 / 1e6
        );
        println!(
            "  GET /nodes one by one: {:.2} s, {:.1} MB ({:.0} MB/s)",
            nodes_s,
            mb(one_by_one),
            mb(one_by_one) / nodes_s
        );
        println!(
            "  GET /export (jsonl):   {:.2} s, {:.1} MB ({:.0} MB/s), {:.1}x faster",
            jsonl_s,
            mb(jsonl),
            mb(jsonl) / jsonl_s,
            nodes_s / jsonl_s
        );
        println!(
            "  GET /export?format=npz: {:.2} s, {:.1} MB ({:.0} MB/s), {:.1}x faster",
            npz_s,
            mb(npz),
            mb(npz) / npz_s,
            nodes_s / npz_s
        );
    });
}
