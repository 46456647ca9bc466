//! A real vLLM behind the proxy: vLLM's CPU build (`scripts/install-vllm.sh`) serving a tiny
//! random-weight Qwen3 with the pinned Qwen3 tokenizer. Sessions over every API, streamed and
//! not, `n` > 1, seeds and several turns each stay one exact node, and every logprob the node
//! records is the one vLLM computes for that token when it scores the whole node
//! (`prompt_logprobs`). Forced tool calls go through vLLM's structured outputs; a client that
//! hangs up aborts its request inside vLLM.
//!
//! Each test owns one server (a cold start compiles the model: about a minute on 2 cores):
//! one started as users start it, one with `--enable-scale-out` (the tokens-in endpoint).

mod common;

use common::vllm::{SERVED_NAME, VllmServer, proxy_for};
use common::{Proxy, assert_node_shape};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// How far a recorded logprob may be from vLLM's score of the same token: both are computed
/// from bf16 activations, once while decoding and once in one prefill of the whole node.
const LOGPROB_TOLERANCE: f64 = 0.05;

async fn post(url: &str, body: Value) -> Value {
    let reply = reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = reply.status();
    let text = reply.text().await.unwrap();
    assert!(status.is_success(), "{url}: {status} {text}");
    serde_json::from_str(&text).unwrap()
}

/// vLLM's logprob of each token of `tokens` given the tokens before it (none for the first),
/// under `model` (the served model or a LoRA adapter).
async fn score(server: &VllmServer, model: &str, tokens: &[u32]) -> Vec<Option<f64>> {
    let body = json!({"model": model, "prompt": tokens, "max_tokens": 1,
        "prompt_logprobs": 0, "temperature": 0});
    let reply = post(&format!("{}/v1/completions", server.url()), body).await;
    let scored = reply["choices"][0]["prompt_logprobs"].as_array().unwrap();
    assert_eq!(scored.len(), tokens.len());
    tokens
        .iter()
        .zip(scored)
        .map(|(id, entry)| entry[id.to_string()]["logprob"].as_f64())
        .collect()
}

/// How a node's logprobs compare with vLLM's unconstrained score of its tokens.
#[derive(Clone, Copy, PartialEq)]
enum Sampled {
    /// Freely: each recorded logprob is the score.
    Freely,
    /// Under a grammar: vLLM reports the masked distribution's logprob, which can only be
    /// higher than the unmasked score (and is 0.0 where one token was allowed).
    Constrained,
}

/// The node is well formed and every sampled position's logprob is vLLM's score of it.
async fn assert_exact(server: &VllmServer, node: &Value) {
    assert_scored(server, node, Sampled::Freely).await
}

/// The node is well formed and every sampled position's logprob is as vLLM scores it.
async fn assert_scored(server: &VllmServer, node: &Value, sampled_how: Sampled) {
    assert_node_shape(node);
    let ids = |key: &str| -> Vec<i64> {
        node[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect()
    };
    let tokens: Vec<u32> = ids("tokens").iter().map(|&t| t as u32).collect();
    let masked = ids("masked_tokens");
    let logprobs: Vec<f64> = node["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    // A node sampled with a LoRA adapter is scored with it.
    let model = node["metadata"]["turns"][0]["adapter"]
        .as_str()
        .unwrap_or(SERVED_NAME);
    let scored = score(server, model, &tokens).await;
    let mut sampled = 0;
    for (at, &mask) in masked.iter().enumerate() {
        if mask == -100 {
            continue;
        }
        sampled += 1;
        let vllm = scored[at].unwrap_or_else(|| panic!("no score at {at}"));
        let agrees = match sampled_how {
            Sampled::Freely => (logprobs[at] - vllm).abs() < LOGPROB_TOLERANCE,
            Sampled::Constrained => logprobs[at] > vllm - LOGPROB_TOLERANCE && logprobs[at] <= 0.0,
        };
        assert!(
            agrees,
            "position {at} (token {}): recorded {} but vLLM scores {vllm}",
            tokens[at], logprobs[at]
        );
    }
    assert!(sampled > 0, "the node has sampled positions");
}

/// Three chat turns (the second streamed), each reply sent back as the model wrote it.
async fn chat_rollout(proxy: &Proxy, uuid: &str, seed: u64) -> Vec<Value> {
    let mut messages = vec![json!({"role": "user", "content": "Name a fruit."})];
    let mut replies = Vec::new();
    for turn in 0..3u64 {
        let body = json!({"messages": messages, "max_tokens": 12, "seed": seed + turn,
            "temperature": 1.0, "logprobs": true, "return_token_ids": true,
            "chat_template_kwargs": {"enable_thinking": false}});
        let reply = if turn == 1 {
            let (status, raw, events) = proxy.chat_stream(uuid, body).await;
            assert_eq!(status, 200, "{raw}");
            let text: String = events
                .iter()
                .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
                .collect();
            json!({"choices": [{"message": {"role": "assistant", "content": text}}]})
        } else {
            let (status, reply) = proxy.chat(uuid, body).await;
            assert_eq!(status, 200, "{reply}");
            reply
        };
        let message = &reply["choices"][0]["message"];
        messages.push(json!({"role": "assistant", "content": message["content"]}));
        messages.push(json!({"role": "user", "content": format!("And another ({turn})?")}));
        replies.push(reply);
    }
    replies
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
            "required": ["city"], "additionalProperties": false}}})
}

/// A random model never calls a tool by itself: a forced call goes to vLLM as a grammar, which
/// vLLM accepts and enforces; the call's result goes back, and a second forced call extends
/// the same node.
async fn forced_tool_calls(server: &VllmServer, proxy: &Proxy) {
    let uuid = proxy.session(json!({})).await;
    let mut messages = vec![json!({"role": "user", "content": "Weather in Paris?"})];
    for (turn, choice) in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ]
    .into_iter()
    .enumerate()
    {
        // One call each (with several allowed, a random model goes on calling until its
        // budget ends).
        let body = json!({"messages": messages, "tools": [weather_tool()], "tool_choice": choice,
            "parallel_tool_calls": false, "max_tokens": 200, "seed": 7 + turn,
            "chat_template_kwargs": {"enable_thinking": false}});
        let (status, reply) = proxy.chat(&uuid, body).await;
        assert_eq!(status, 200, "{reply}");
        let message = &reply["choices"][0]["message"];
        let calls = message["tool_calls"]
            .as_array()
            .unwrap_or_else(|| panic!("no call: {reply}"));
        assert_eq!(calls[0]["function"]["name"], "get_weather", "{reply}");
        let arguments: Value =
            serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(
            ["Paris", "Rome", "Oslo"].contains(&arguments["city"].as_str().unwrap()),
            "{arguments}"
        );
        assert_eq!(
            reply["choices"][0]["finish_reason"], "tool_calls",
            "{reply}"
        );
        messages.push(message.clone());
        messages.push(json!({"role": "tool", "tool_call_id": calls[0]["id"], "content": "sunny"}));
    }
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1, "both forced calls extend one node");
    assert_scored(server, &nodes[0], Sampled::Constrained).await;

    // Structured output through the same structured-outputs field, compiled by vLLM itself:
    // its JSON grammar allows any whitespace between tokens, which a random model fills its
    // budget with, so what is checked is that vLLM took the schema and every character it let
    // through is whitespace or the start of an object the schema allows.
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"], "additionalProperties": false});
    let body = json!({"messages": [{"role": "user", "content": "Answer in JSON."}], "max_tokens": 40,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        "chat_template_kwargs": {"enable_thinking": false}});
    let uuid = proxy.session(json!({})).await;
    let (status, reply) = proxy.chat(&uuid, body).await;
    assert_eq!(status, 200, "{reply}");
    let content = reply["choices"][0]["message"]["content"].as_str().unwrap();
    let shown: String = content.chars().filter(|c| !c.is_whitespace()).collect();
    assert!(
        ["{\"ok\":true}", "{\"ok\":false}"]
            .iter()
            .any(|valid| valid.starts_with(&shown)),
        "{content:?}"
    );
    let nodes = proxy.nodes(&uuid).await;
    assert_scored(server, &nodes[0], Sampled::Constrained).await;
}

/// The completions API, Messages (whole, then streamed) and Responses (chained by
/// `previous_response_id`, whole then streamed) each keep one exact node.
async fn other_apis(server: &VllmServer, proxy: &Proxy) {
    let uuid = proxy.session(json!({})).await;
    let (status, reply) = proxy
        .post(
            &format!("/{uuid}/v1/completions"),
            json!({"prompt": "Once upon a time", "max_tokens": 10, "seed": 3, "logprobs": 1}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1);
    assert_exact(server, &nodes[0]).await;

    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/messages");
    let mut messages = vec![json!({"role": "user", "content": "Say hi."})];
    let (status, reply) = proxy
        .post(
            &path,
            json!({"model": "any", "max_tokens": 10, "messages": messages}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    messages.push(json!({"role": "assistant", "content": reply["content"]}));
    messages.push(json!({"role": "user", "content": "Again."}));
    let (status, raw, _) = proxy
        .post_stream(
            &path,
            json!({"model": "any", "max_tokens": 10, "messages": messages}),
        )
        .await;
    assert_eq!(status, 200, "{raw}");
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1, "the Messages turns extend one node");
    assert_exact(server, &nodes[0]).await;

    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/responses");
    let (status, first) = proxy
        .post(&path, json!({"input": "Say hi.", "max_output_tokens": 10}))
        .await;
    assert_eq!(status, 200, "{first}");
    let (status, second) = proxy
        .post(
            &path,
            json!({"input": "Again.", "max_output_tokens": 10, "previous_response_id": first["id"]}),
        )
        .await;
    assert_eq!(status, 200, "{second}");
    let (status, raw, _) = proxy
        .post_stream(
            &path,
            json!({"input": "Once more.", "max_output_tokens": 10, "previous_response_id": second["id"]}),
        )
        .await;
    assert_eq!(status, 200, "{raw}");
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(
        nodes.len(),
        1,
        "chained responses, whole and streamed, extend one node"
    );
    assert_exact(server, &nodes[0]).await;
}

/// `n` > 1 gives one node per choice, each exact; a seed gives the same sample whether the
/// reply is streamed or whole.
async fn samples_and_seeds(server: &VllmServer, proxy: &Proxy) {
    let uuid = proxy.session(json!({})).await;
    let body = json!({"messages": [{"role": "user", "content": "Pick a number."}], "n": 3,
        "max_tokens": 8, "seed": 5, "chat_template_kwargs": {"enable_thinking": false}});
    let (status, reply) = proxy.chat(&uuid, body).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["choices"].as_array().unwrap().len(), 3);
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 3);
    for node in &nodes {
        assert_exact(server, node).await;
    }

    let body = json!({"messages": [{"role": "user", "content": "Pick a letter."}],
        "max_tokens": 8, "seed": 99, "return_token_ids": true,
        "chat_template_kwargs": {"enable_thinking": false}});
    let whole = proxy.session(json!({})).await;
    let (status, reply) = proxy.chat(&whole, body.clone()).await;
    assert_eq!(status, 200, "{reply}");
    let streamed = proxy.session(json!({})).await;
    let (status, raw, _) = proxy.chat_stream(&streamed, body).await;
    assert_eq!(status, 200, "{raw}");
    let tokens = |nodes: Vec<Value>| nodes[0]["tokens"].clone();
    assert_eq!(
        tokens(proxy.nodes(&whole).await),
        tokens(proxy.nodes(&streamed).await),
        "the same seed samples the same tokens streamed and whole"
    );
}

/// A client that hangs up mid-stream aborts its request in vLLM: the server stops running it
/// (its own `/metrics` says so) long before the 3,000 tokens it was asked for.
async fn hang_up_aborts_in_vllm(server: &VllmServer, proxy: &Proxy) {
    let uuid = proxy.session(json!({})).await;
    let body = json!({"messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 3000, "chat_template_kwargs": {"enable_thinking": false}});
    let generated = "vllm:generation_tokens_total";
    let before = vllm_metric(server, generated).await;
    proxy
        .chat_stream_and_hang_up(&uuid, body, "\"content\"")
        .await;
    // vLLM's metrics trail its engine by a step or so: wait until they show the tokens it
    // sampled, no request running, and no token more a second later.
    let deadline = Instant::now() + Duration::from_secs(20);
    let sampled = loop {
        assert!(Instant::now() < deadline, "vLLM still runs the request");
        let sampled = vllm_metric(server, generated).await - before;
        let running = vllm_metric(server, "vllm:num_requests_running").await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        if sampled > 0.0
            && running == 0.0
            && vllm_metric(server, generated).await - before == sampled
        {
            break sampled;
        }
    };
    assert!(sampled < 3000.0, "aborted after {sampled} tokens");
    assert!(proxy.nodes(&uuid).await.is_empty(), "nothing recorded");
}

/// The sum of the samples of `metric` in vLLM's `/metrics`.
async fn vllm_metric(server: &VllmServer, metric: &str) -> f64 {
    let text = reqwest::get(format!("{}/metrics", server.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|line| line.starts_with(&format!("{metric}{{")))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// vLLM as users start it (`/v1/completions` with token-id prompts): every API, tools,
/// samples, seeds and cancellation.
#[tokio::test]
async fn vllm_started_plainly() {
    let server = VllmServer::start(&[]);
    let proxy = proxy_for(&server);
    let (_, servers) = proxy.get("/servers").await;
    assert_eq!(servers["servers"][0]["model"], SERVED_NAME, "{servers}");
    assert_eq!(servers["servers"][0]["context_length"], 4096);
    assert_eq!(servers["servers"][0]["refused"], Value::Null);

    let uuid = proxy.session(json!({})).await;
    let replies = chat_rollout(&proxy, &uuid, 11).await;
    assert_eq!(
        replies[0]["model"], SERVED_NAME,
        "the name the server serves"
    );
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1, "three turns, one node");
    assert_exact(&server, &nodes[0]).await;

    samples_and_seeds(&server, &proxy).await;
    other_apis(&server, &proxy).await;
    forced_tool_calls(&server, &proxy).await;
    hang_up_aborts_in_vllm(&server, &proxy).await;
}

/// A weight update under a stream that is under way: the proxy's pause with
/// `"in_flight": "keep"` freezes the request inside vLLM (KV cache kept), the new version is
/// announced through the proxy, and after the resume the same stream goes on. The turn records
/// both versions with the tokens each produced, and stays exact.
async fn weights_swapped_mid_stream(server: &VllmServer, proxy: &Proxy) {
    let uuid = proxy.session(json!({})).await;
    let body = json!({"messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 2000, "chat_template_kwargs": {"enable_thinking": false}});
    let mut response = proxy.start_stream(&uuid, body).await;
    let mut raw = String::new();
    // Sampled tokens, not the role chunk's empty content: the pause lands mid-sample.
    while !raw.contains("\"token_ids\"") {
        let chunk = response.chunk().await.unwrap().expect("the stream goes on");
        raw.push_str(&String::from_utf8_lossy(&chunk));
    }
    let (status, paused) = proxy.post("/pause", json!({"in_flight": "keep"})).await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["backends"][0]["held"], true, "{paused}");
    let is_paused = reqwest::get(format!("{}/is_paused", server.url()))
        .await
        .unwrap();
    assert_eq!(is_paused.json::<Value>().await.unwrap()["is_paused"], true);
    let (status, announced) = proxy
        .post("/weight_version", json!({"weight_version": "v2"}))
        .await;
    assert_eq!(status, 200, "{announced}");
    assert_eq!(
        announced["backends"][0]["weight_version"], true,
        "{announced}"
    );
    let (status, resumed) = proxy.post("/resume", json!({})).await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["backends"][0]["released"], true, "{resumed}");
    while let Some(chunk) = response.chunk().await.unwrap() {
        raw.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(raw.ends_with("data: [DONE]\n\n"), "{raw}");
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1);
    let turn = &nodes[0]["metadata"]["turns"][0];
    assert_eq!(turn["weight_version"], "v2", "{turn}");
    let spans = turn["weight_versions"]
        .as_array()
        .unwrap_or_else(|| panic!("{turn}"));
    let versions: Vec<&str> = spans
        .iter()
        .map(|s| s["version"].as_str().unwrap())
        .collect();
    assert_eq!(versions, ["default", "v2"], "{turn}");
    assert_eq!(spans[0]["start"], 0);
    assert_eq!(spans[0]["end"], spans[1]["start"]);
    assert_eq!(spans[1]["end"], turn["completion_tokens"]);
    assert_exact(server, &nodes[0]).await;
    // Later samples carry the new version from the start.
    let (status, _) = proxy
        .chat(
            &uuid,
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
        )
        .await;
    assert_eq!(status, 200);
    let nodes = proxy.nodes(&uuid).await;
    let last = nodes
        .iter()
        .flat_map(|n| n["metadata"]["turns"].as_array().unwrap())
        .last()
        .unwrap();
    assert_eq!(last["weight_version"], "v2", "{last}");
}

/// A session that names a LoRA adapter samples with it: every logprob is the adapter's score
/// of the token, not the base model's, and each turn records the adapter.
async fn lora_sessions(server: &VllmServer, proxy: &Proxy) {
    let uuid = proxy.session(json!({"adapter": "tiny-lora"})).await;
    chat_rollout(proxy, &uuid, 31).await;
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1);
    for turn in nodes[0]["metadata"]["turns"].as_array().unwrap() {
        assert_eq!(turn["adapter"], "tiny-lora", "{turn}");
    }
    assert_exact(server, &nodes[0]).await;
    // The node matches the adapter's scores (above); the base model's are far from them at
    // some of its tokens (13 of 90 by more than 0.5 when written), so the adapter was used.
    let tokens: Vec<u32> = serde_json::from_value(nodes[0]["tokens"].clone()).unwrap();
    let with = score(server, "tiny-lora", &tokens).await;
    let without = score(server, SERVED_NAME, &tokens).await;
    let apart = with
        .iter()
        .zip(&without)
        .filter(|(a, b)| matches!((a, b), (Some(a), Some(b)) if (a - b).abs() > 0.5))
        .count();
    assert!(apart > 0, "the adapter changes no score");
}

/// vLLM with `--enable-scale-out`: tokens in and out through `/inference/v1/generate`, which
/// also reports the weight versions each sample was drawn from; weights swapped under a
/// stream; a LoRA adapter (vLLM on CPU serves them, with torch.compile off).
#[tokio::test]
async fn vllm_with_the_tokens_in_endpoint() {
    let server = VllmServer::start(&[
        "--enable-scale-out",
        "--enable-lora",
        "--max-lora-rank",
        "8",
    ]);
    let proxy = proxy_for(&server);
    let uuid = proxy.session(json!({})).await;
    chat_rollout(&proxy, &uuid, 21).await;
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1);
    assert_exact(&server, &nodes[0]).await;
    for turn in nodes[0]["metadata"]["turns"].as_array().unwrap() {
        assert_eq!(turn["weight_version"], "default", "{turn}");
    }
    samples_and_seeds(&server, &proxy).await;
    weights_swapped_mid_stream(&server, &proxy).await;
    lora_sessions(&server, &proxy).await;
}
