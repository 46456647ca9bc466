//! `stream: true`: the SSE bytes from our server — role first, token-by-token content with the
//! ids each chunk stands for, tool-call deltas, finish, usage, `[DONE]` — the node committed at
//! the end, and a client that hangs up cancels the backend and leaves the session as it was.

mod common;

use common::llama::LlamaServer;
use common::mock_worker::{MockWorker, Reply, Sample, Wire};
use common::{Proxy, assert_node_shape, char_model_dir, chars, fixture_model};
use rollout_proxy::backend::{BackendConfig, BackendKind};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn deltas(events: &[Value]) -> Vec<&Value> {
    events.iter().filter_map(|e| e["choices"].get(0)).collect()
}

fn content(events: &[Value]) -> String {
    deltas(events)
        .iter()
        .filter_map(|c| c["delta"]["content"].as_str())
        .collect()
}

fn streamed_ids(events: &[Value]) -> Vec<u32> {
    deltas(events)
        .iter()
        .filter_map(|c| c["token_ids"].as_array())
        .flatten()
        .map(|id| id.as_u64().unwrap() as u32)
        .collect()
}

#[tokio::test]
async fn sse_chunks_in_order_with_token_ids_and_usage() {
    for wire in [Wire::Sglang, Wire::Vllm, Wire::VllmGenerate] {
        let proxy = Proxy::start(char_model_dir(), None, wire);
        let uuid = proxy.session(json!({})).await;
        proxy.worker.push_sample(Sample::stop(chars("Hi there!")));
        let body = json!({"messages": [{"role": "user", "content": "Hello"}], "stream_options": {"include_usage": true}, "logprobs": true, "return_token_ids": true});
        let (status, raw, events) = proxy.chat_stream(&uuid, body).await;
        assert_eq!(status, 200, "{raw}");
        assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(
            events[0]["prompt_token_ids"],
            json!(chars("<user>Hello</user><assistant>"))
        );
        assert_eq!(content(&events), "Hi there!");
        assert_eq!(streamed_ids(&events), chars("Hi there!"));
        // One chunk per token: the backend's own stream, not a buffered reply.
        assert_eq!(
            deltas(&events)
                .iter()
                .filter(|c| c["delta"]["content"].is_string())
                .count(),
            1 + 9
        );
        let finish = &events[events.len() - 3];
        assert_eq!(finish["choices"][0]["finish_reason"], "stop");
        let usage = &events[events.len() - 2];
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], 9);
        assert_eq!(events.last().unwrap(), "[DONE]");
        let lps: Vec<f64> = deltas(&events)
            .iter()
            .filter_map(|c| c["logprobs"]["content"].as_array())
            .flatten()
            .map(|e| e["logprob"].as_f64().unwrap())
            .collect();
        assert_eq!(lps.len(), 9);
        assert!(raw.ends_with("data: [DONE]\n\n"));
        let nodes = proxy.nodes(&uuid).await;
        assert_eq!(nodes.len(), 1);
        assert_node_shape(&nodes[0]);
        assert_eq!(
            nodes[0]["full_text"],
            "<user>Hello</user><assistant>Hi there!"
        );
    }
}

/// The stream says its charset: a client that goes by the header (Python `requests` falls back
/// to Latin-1 for a text type without one) reads `— ça` as sent.
#[tokio::test]
async fn event_streams_declare_utf8() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(chars("— ça")));
    let body = json!({"messages": [{"role": "user", "content": "Hello"}]});
    let response = proxy.start_stream(&uuid, body).await;
    assert_eq!(
        response.headers()["content-type"],
        "text/event-stream; charset=utf-8"
    );
    let raw = response.bytes().await.unwrap();
    let events: Vec<Value> = std::str::from_utf8(&raw)
        .unwrap()
        .split("\n\n")
        .filter_map(|block| serde_json::from_str(block.strip_prefix("data: ")?).ok())
        .collect();
    assert_eq!(content(&events), "— ça");
}

#[tokio::test]
async fn chunks_arrive_as_tokens_are_sampled() {
    let proxy = Proxy::atropos();
    proxy.worker.set_token_delay(150);
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(chars("abcdef")));
    let start = Instant::now();
    let response = reqwest::Client::new()
        .post(format!("{}/{uuid}/v1/chat/completions", proxy.url))
        .json(&json!({"messages": [{"role": "user", "content": "x"}], "stream": true}))
        .send()
        .await
        .unwrap();
    use futures::StreamExt;
    let mut chunks = response.bytes_stream();
    let mut first_content = None;
    let mut all = String::new();
    while let Some(chunk) = chunks.next().await {
        let chunk = String::from_utf8(chunk.unwrap().to_vec()).unwrap();
        if first_content.is_none() && chunk.contains("\"content\":\"a\"") {
            first_content = Some(start.elapsed());
        }
        all.push_str(&chunk);
    }
    let total = start.elapsed();
    let first = first_content.expect("a content chunk");
    assert!(total >= Duration::from_millis(900), "{total:?}");
    assert!(
        first + Duration::from_millis(500) < total,
        "first token at {first:?}, end at {total:?}"
    );
}

#[tokio::test]
async fn streamed_tool_calls_and_the_next_turn_extends_the_node() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let tools = json!([{"type": "function", "function": {"name": "search", "parameters": {}}}]);
    let raw_call = r#"Looking.<tool_call>{"name": "search", "arguments": {"q": "cats", "n": 1.50}}</tool_call>"#;
    proxy.worker.push_sample(Sample::stop(chars(raw_call)));
    let mut messages = vec![json!({"role": "user", "content": "find cats"})];
    let (status, raw, events) = proxy
        .chat_stream(&uuid, json!({"messages": messages, "tools": tools}))
        .await;
    assert_eq!(status, 200, "{raw}");
    assert_eq!(content(&events), "Looking.");
    assert!(
        !raw.contains("<tool_call>"),
        "markup never reaches the client"
    );
    let calls: Vec<&Value> = deltas(&events)
        .iter()
        .filter_map(|c| c["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["index"], 0);
    assert_eq!(calls[0]["function"]["name"], "search");
    assert_eq!(
        calls[0]["function"]["arguments"],
        r#"{"q": "cats", "n": 1.50}"#
    );
    assert_eq!(
        streamed_ids(&events),
        chars(raw_call),
        "every sampled id is carried by some chunk"
    );
    assert_eq!(
        events[events.len() - 2]["choices"][0]["finish_reason"],
        "tool_calls"
    );

    messages.push(json!({"role": "assistant", "content": "Looking.", "tool_calls": [{"id": calls[0]["id"], "type": "function", "function": calls[0]["function"]}]}));
    messages.push(json!({"role": "tool", "tool_call_id": calls[0]["id"], "content": "3 cats"}));
    proxy.worker.push_sample(Sample::stop(chars("Three cats.")));
    let (status, _, _) = proxy
        .chat_stream(&uuid, json!({"messages": messages, "tools": tools}))
        .await;
    assert_eq!(status, 200);
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0]["metadata"]["num_turns"], 2);
}

#[tokio::test]
async fn stop_strings_never_reach_the_client() {
    let proxy = Proxy::start(char_model_dir(), None, Wire::Vllm);
    let uuid = proxy.session(json!({})).await;
    proxy
        .worker
        .push_sample(Sample::stop_string(chars("Answer: 4\n###"), "###"));
    let (_, raw, events) = proxy
        .chat_stream(
            &uuid,
            json!({"messages": [{"role": "user", "content": "2+2"}], "stop": ["###"]}),
        )
        .await;
    assert_eq!(content(&events), "Answer: 4\n");
    assert!(
        deltas(&events)
            .iter()
            .all(|c| !c["delta"]["content"].as_str().unwrap_or("").contains('#')),
        "{raw}"
    );
    assert_eq!(events[events.len() - 2]["choices"][0]["stop_reason"], "###");
    assert_eq!(streamed_ids(&events), chars("Answer: 4\n###"));
}

#[tokio::test]
async fn hanging_up_cancels_the_backend_and_leaves_the_session_unchanged() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(chars("fine")));
    proxy
        .chat(
            &uuid,
            json!({"messages": [{"role": "user", "content": "a"}]}),
        )
        .await;
    let before = proxy.nodes(&uuid).await;
    proxy.worker.set_token_delay(200);
    proxy
        .worker
        .push_sample(Sample::stop(chars("a long answer that takes a while")));
    let next = json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "fine"}, {"role": "user", "content": "b"}]});
    proxy
        .chat_stream_and_hang_up(&uuid, next.clone(), "data: ")
        .await;
    let start = Instant::now();
    while proxy.worker.cancelled_streams() == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "the backend stream was not cancelled within a second"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        proxy.nodes(&uuid).await,
        before,
        "the session is exactly as before the turn"
    );
    proxy.worker.set_token_delay(0);
    proxy.worker.push_sample(Sample::stop(chars("ok")));
    let (status, _) = proxy.chat(&uuid, next).await;
    assert_eq!(status, 200, "the session lock was released");
    assert_eq!(proxy.nodes(&uuid).await.len(), 1);
}

#[tokio::test]
async fn streaming_from_a_real_llama_server() {
    let server = LlamaServer::start();
    let url = server.url();
    let proxy = Proxy::start_with(
        fixture_model("smollm2"),
        None,
        MockWorker::start(Wire::Sglang),
        move |s| {
            s.backends.clear();
            s.config.servers = vec![BackendConfig::new(&url, BackendKind::Llamacpp)];
        },
    );
    let uuid = proxy.session(json!({})).await;
    let (status, raw, events) = proxy
        .chat_stream(&uuid, json!({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 12, "seed": 3}))
        .await;
    assert_eq!(status, 200, "{raw}");
    let nodes = proxy.nodes(&uuid).await;
    let node = &nodes[0];
    let sampled: Vec<u32> = node["masked_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| **t != -100)
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(streamed_ids(&events), sampled);
    assert!(deltas(&events).len() >= 3, "token by token");
}

/// `reasoning: true` sessions return `<think>` blocks as `reasoning_content` (streamed as
/// reasoning deltas); the node keeps the raw tokens and the conversation stays one node.
#[tokio::test]
async fn reasoning_is_returned_separately_and_the_node_keeps_raw_tokens() {
    let tok = rollout_proxy::tokenizer::Tokenizer::from_path(&fixture_model("qwen3")).unwrap();
    let proxy = Proxy::start(fixture_model("qwen3"), None, Wire::Sglang);
    let uuid = proxy.session(json!({"reasoning": true})).await;
    let sampled = tok
        .encode("<think>\nhmm, 2+2\n</think>\n\n4<|im_end|>")
        .unwrap();
    proxy.worker.push_sample(Sample::stop(sampled.clone()));
    let (_, data) = proxy
        .chat(
            &uuid,
            json!({"messages": [{"role": "user", "content": "2+2?"}]}),
        )
        .await;
    let message = &data["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "hmm, 2+2");
    assert_eq!(message["content"], "4");

    proxy.worker.push_sample(Sample::stop(
        tok.encode("<think>\nok\n</think>\n\n6<|im_end|>").unwrap(),
    ));
    let body = json!({"messages": [{"role": "user", "content": "2+2?"}, message, {"role": "user", "content": "3+3?"}]});
    let (status, raw, events) = proxy.chat_stream(&uuid, body).await;
    assert_eq!(status, 200, "{raw}");
    let reasoning: String = deltas(&events)
        .iter()
        .filter_map(|c| c["delta"]["reasoning_content"].as_str())
        .collect();
    assert_eq!(reasoning, "ok");
    assert_eq!(content(&events), "6");
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(
        nodes.len(),
        1,
        "the reply sent back with its reasoning extends the node"
    );
    let tokens: Vec<u32> = serde_json::from_value(nodes[0]["tokens"].clone()).unwrap();
    assert!(tokens.windows(sampled.len()).any(|w| w == sampled));
}

/// A client that hangs up while the backend is still silent (a long prefill) is noticed through
/// the keep-alive, and the backend request is dropped: its pool slot is free within a second.
#[tokio::test]
async fn hanging_up_during_a_silent_prefill_cancels_the_backend() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.set_token_delay(5000);
    proxy.worker.push_sample(Sample::stop(chars("late")));
    proxy
        .chat_stream_and_hang_up(
            &uuid,
            json!({"messages": [{"role": "user", "content": "a"}]}),
            "data: ",
        )
        .await;
    let start = Instant::now();
    loop {
        let (_, servers) = proxy.get("/servers").await;
        if servers["servers"][0]["in_flight"] == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_millis(1000),
            "the backend request is still open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(proxy.nodes(&uuid).await.is_empty());
}

/// `n > 1` streams every choice token by token (one backend stream each, chunks tagged with
/// their index); every choice is committed when all have finished.
#[tokio::test]
async fn several_choices_stream_side_by_side() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(chars("one")));
    proxy.worker.push_sample(Sample::stop(chars("two!")));
    let body = json!({"messages": [{"role": "user", "content": "count"}], "n": 2, "seed": 7,
        "stream_options": {"include_usage": true}});
    let (status, raw, events) = proxy.chat_stream(&uuid, body).await;
    assert_eq!(status, 200, "{raw}");
    let of = |index: u64| -> Vec<&Value> {
        deltas(&events)
            .into_iter()
            .filter(|c| c["index"] == index)
            .collect()
    };
    let mut texts = Vec::new();
    for index in 0..2 {
        let chunks = of(index);
        assert_eq!(chunks[0]["delta"]["role"], "assistant");
        assert_eq!(chunks.last().unwrap()["finish_reason"], "stop");
        let text: String = chunks
            .iter()
            .filter_map(|c| c["delta"]["content"].as_str())
            .collect();
        let ids: Vec<u32> = chunks
            .iter()
            .filter_map(|c| c["token_ids"].as_array())
            .flatten()
            .map(|id| id.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(ids, chars(&text));
        texts.push(text);
    }
    texts.sort();
    assert_eq!(texts, ["one", "two!"]);
    assert_eq!(
        seeds_sent(&proxy),
        [7, 8],
        "one stream per choice, seeds apart"
    );
    let usage = &events[events.len() - 2];
    assert_eq!(usage["usage"]["completion_tokens"], 7);
    assert_eq!(proxy.nodes(&uuid).await.len(), 2);
}

/// The seeds of every request the upstream got, in order.
fn seeds_sent(proxy: &Proxy) -> Vec<u64> {
    let mut seeds: Vec<u64> = proxy
        .worker
        .requests()
        .iter()
        .filter_map(|r| r["sampling_params"]["sampling_seed"].as_u64())
        .collect();
    seeds.sort();
    seeds
}

/// A seed gives choice `i` the seed `seed + i` whether the reply is whole or streamed (as vLLM
/// seeds the samples of one request), so a seeded turn samples the same choices either way;
/// without a seed a whole reply's choices are one request's.
#[tokio::test]
async fn a_seeded_turn_samples_the_same_choices_whole_and_streamed() {
    let proxy = Proxy::atropos();
    let ask = |stream: bool, seed: Option<u64>| {
        let mut body = json!({"messages": [{"role": "user", "content": "count"}], "n": 2,
            "stream": stream});
        if let Some(seed) = seed {
            body["seed"] = json!(seed);
        }
        body
    };
    for stream in [false, true] {
        let uuid = proxy.session(json!({})).await;
        proxy.worker.push_sample(Sample::stop(chars("one")));
        proxy.worker.push_sample(Sample::stop(chars("two")));
        let before = proxy.worker.requests().len();
        let (status, raw) = match stream {
            true => {
                let path = format!("/{uuid}/v1/chat/completions");
                let (status, raw, _) = proxy.post_stream(&path, ask(true, Some(7))).await;
                (status, raw)
            }
            false => {
                let (status, reply) = proxy.chat(&uuid, ask(false, Some(7))).await;
                (status, reply.to_string())
            }
        };
        assert_eq!(status, 200, "{raw}");
        assert_eq!(proxy.worker.requests().len() - before, 2, "stream={stream}");
        assert_eq!(proxy.nodes(&uuid).await.len(), 2);
    }
    assert_eq!(
        seeds_sent(&proxy),
        [7, 7, 8, 8],
        "the same seeds, streamed or whole"
    );

    let uuid = proxy.session(json!({})).await;
    let both = vec![Sample::stop(chars("one")), Sample::stop(chars("two"))];
    proxy.worker.push(Reply::Samples(both));
    let before = proxy.worker.requests().len();
    let (status, reply) = proxy.chat(&uuid, ask(false, None)).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["choices"].as_array().unwrap().len(), 2);
    assert_eq!(
        proxy.worker.requests().len() - before,
        1,
        "one request for both"
    );
}

/// A streamed request that waits in the pool's queue gets its response headers at once and
/// keep-alive comments while it waits; a client that leaves while queued leaves the queue.
#[tokio::test]
async fn a_queued_stream_keeps_the_client_informed_and_can_be_abandoned() {
    let proxy = Proxy::single_slot(1024);
    let (a, b, c) = (
        proxy.session(json!({})).await,
        proxy.session(json!({})).await,
        proxy.session(json!({})).await,
    );
    let hello = json!({"messages": [{"role": "user", "content": "hi"}]});
    proxy
        .worker
        .push(Reply::Delayed(2500, vec![Sample::stop(chars("slow"))]));
    proxy.worker.push_sample(Sample::stop(chars("queued")));
    let occupy = proxy.chat(&a, hello.clone());
    let queued = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        proxy.chat_stream(&b, hello.clone()).await
    };
    let ((status, _), (queued_status, raw, events)) = tokio::join!(occupy, queued);
    assert_eq!((status, queued_status), (200, 200), "{raw}");
    let first_data = raw.find("data: ").unwrap();
    assert!(
        raw[..first_data].contains(": keep-alive"),
        "keep-alives while queued: {raw}"
    );
    assert_eq!(content(&events), "queued");

    proxy
        .worker
        .push(Reply::Delayed(2500, vec![Sample::stop(chars("slow"))]));
    let occupy = proxy.chat(&a, hello.clone());
    let abandon = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        proxy
            .chat_stream_and_hang_up(&c, hello.clone(), ": keep-alive")
            .await;
        let start = Instant::now();
        loop {
            let (_, servers) = proxy.get("/servers").await;
            if servers["queued"] == 0 {
                assert_eq!(
                    servers["servers"][0]["in_flight"], 1,
                    "the first still runs"
                );
                break;
            }
            assert!(
                start.elapsed() < Duration::from_millis(1000),
                "still queued"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let ((status, _), ()) = tokio::join!(occupy, abandon);
    assert_eq!(status, 200);
    assert!(proxy.nodes(&c).await.is_empty());
}
