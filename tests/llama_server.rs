//! Integration with a real llama.cpp `llama-server` (SmolLM2-135M-Instruct): multi-turn
//! rollouts through the proxy, stop strings, a crash and restart mid-rollout, and a pool of two
//! servers with affinity and failover.

mod common;

use common::llama::LlamaServer;
use common::mock_worker::{MockWorker, Wire};
use common::{Proxy, assert_node_shape, fixture_model};
use rollout_proxy::backend::{BackendConfig, BackendKind};
use serde_json::{Value, json};
use std::path::PathBuf;

/// llama-server tests share two cores: run them one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn proxy_for(servers: &[&LlamaServer], model_dir: PathBuf, template: Option<&str>) -> Proxy {
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    Proxy::start_with(
        model_dir,
        template,
        MockWorker::start(Wire::Sglang),
        move |settings| {
            settings.backends.clear();
            settings.config.servers = urls
                .iter()
                .map(|u| BackendConfig::new(u, BackendKind::Llamacpp))
                .collect();
        },
    )
}

fn ids(value: &Value) -> Vec<u32> {
    serde_json::from_value(value.clone()).unwrap()
}

/// The node's sampled positions hold exactly the ids and logprobs llama-server returned.
fn assert_sampled_as_reported(node: &Value, replies: &[Value]) {
    let masked = node["masked_tokens"].as_array().unwrap();
    let logprobs = node["logprobs"].as_array().unwrap();
    let mut sampled_ids = Vec::new();
    let mut sampled_logprobs = Vec::new();
    for (m, lp) in masked.iter().zip(logprobs) {
        if m != -100 {
            sampled_ids.push(m.as_u64().unwrap() as u32);
            sampled_logprobs.push(lp.as_f64().unwrap());
        }
    }
    let mut reported_ids = Vec::new();
    let mut reported_logprobs = Vec::new();
    for reply in replies {
        reported_ids.extend(ids(&reply["choices"][0]["token_ids"]));
        for entry in reply["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
        {
            reported_logprobs.push(entry["logprob"].as_f64().unwrap());
        }
    }
    assert_eq!(sampled_ids, reported_ids);
    assert_eq!(sampled_logprobs.len(), reported_logprobs.len());
    for (a, b) in sampled_logprobs.iter().zip(&reported_logprobs) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
}

/// Sends back each reply's message, adds a user (or tool) message, and repeats. Returns the
/// replies and the conversation, ready for its next turn.
async fn rollout(
    proxy: &Proxy,
    uuid: &str,
    turns: usize,
    tools: Option<&Value>,
) -> (Vec<Value>, Vec<Value>) {
    let mut messages = vec![json!({"role": "user", "content": "Name a fruit."})];
    let mut replies = Vec::new();
    for turn in 0..turns {
        let mut body = json!({"messages": messages, "max_tokens": 16, "temperature": 0.7, "seed": 11 + turn, "logprobs": true, "return_token_ids": true});
        if let Some(tools) = tools {
            body["tools"] = tools.clone();
        }
        let (status, reply) = proxy.chat(uuid, body).await;
        assert_eq!(status, 200, "{reply}");
        let message = reply["choices"][0]["message"].clone();
        let calls = message["tool_calls"].clone();
        messages.push(message);
        match calls.as_array() {
            Some(calls) if !calls.is_empty() => {
                for call in calls {
                    messages
                        .push(json!({"role": "tool", "tool_call_id": call["id"], "content": "42"}));
                }
            }
            _ => messages
                .push(json!({"role": "user", "content": format!("And another one? ({turn})")})),
        }
        replies.push(reply);
    }
    (replies, messages)
}

#[tokio::test]
async fn real_rollouts_are_one_node_with_the_servers_ids_and_logprobs() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let server = LlamaServer::start();
    let proxy = proxy_for(&[&server], fixture_model("smollm2"), Some("hermes"));
    // The server was asked: one slot's context (-c 4096 over 2 slots), and its tokenizer
    // splits the probe as the proxy's (the fixture's tokenizer.json) does.
    let (_, servers) = proxy.get("/servers").await;
    assert_eq!(servers["servers"][0]["context_length"], 2048, "{servers}");
    assert_eq!(servers["servers"][0]["refused"], Value::Null, "{servers}");
    let tools = json!([{"type": "function", "function": {"name": "lookup", "description": "Look a word up",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]);
    for tools in [None, Some(&tools)] {
        let uuid = proxy.session(json!({})).await;
        let (replies, _) = rollout(&proxy, &uuid, 3, tools).await;
        let nodes = proxy.nodes(&uuid).await;
        assert_eq!(
            nodes.len(),
            1,
            "{:?}",
            nodes.iter().map(|n| &n["metadata"]).collect::<Vec<_>>()
        );
        assert_node_shape(&nodes[0]);
        assert_sampled_as_reported(&nodes[0], &replies);
        // Each prompt is the previous node plus a suffix, so llama-server reuses its cache.
        let turns = nodes[0]["metadata"]["turns"].as_array().unwrap();
        for turn in &turns[1..] {
            assert!(turn["cached_tokens"].as_u64().unwrap() > 0, "{turn}");
        }
        for reply in &replies {
            let prompt = ids(&reply["prompt_token_ids"]);
            assert!(ids(&nodes[0]["tokens"]).starts_with(&prompt));
        }
    }
}

/// n>1 in one `n_cmpl` request: n choices, the first extends the node, the others are new.
#[tokio::test]
async fn several_samples_per_request() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let server = LlamaServer::start();
    let proxy = proxy_for(&[&server], fixture_model("smollm2"), None);
    let uuid = proxy.session(json!({})).await;
    let (status, reply) = proxy
        .chat(
            &uuid,
            json!({"messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": 6, "n": 3, "seed": 1, "logprobs": true}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let choices = reply["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 3);
    for (node, choice) in nodes.iter().zip(choices) {
        assert_node_shape(node);
        assert!(ids(&node["tokens"]).ends_with(&ids(&choice["token_ids"])));
    }
}

/// A stop string cuts the sample; its tokens stay in the node with real logprobs.
#[tokio::test]
async fn stop_strings_keep_every_sampled_token_with_its_logprob() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let server = LlamaServer::start();
    let proxy = proxy_for(&[&server], fixture_model("smollm2"), None);
    let uuid = proxy.session(json!({})).await;
    let (status, reply) = proxy
        .chat(
            &uuid,
            json!({"messages": [{"role": "user", "content": "Write a sentence about the sea."}],
            "max_tokens": 48, "seed": 5, "stop": [" "], "logprobs": true}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["stop_reason"], " ");
    assert!(!choice["message"]["content"].as_str().unwrap().contains(' '));
    let nodes = proxy.nodes(&uuid).await;
    assert_sampled_as_reported(&nodes[0], std::slice::from_ref(&reply));
    // The sampled text holds the stop string (possibly inside a token such as " seas"); the
    // reply's content ends before it.
    let text = nodes[0]["full_text"].as_str().unwrap();
    let sampled = text.rsplit("<|im_start|>assistant\n").next().unwrap();
    let content = choice["message"]["content"].as_str().unwrap();
    assert!(
        sampled.starts_with(content) && sampled[content.len()..].starts_with(' '),
        "{sampled:?}"
    );
}

/// Killing the server mid-rollout fails the turn cleanly; after a restart it goes through.
#[tokio::test]
async fn crash_and_restart_mid_rollout() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut server = LlamaServer::start();
    let port = server.port;
    let proxy = proxy_for(&[&server], fixture_model("smollm2"), None);
    let uuid = proxy.session(json!({})).await;
    let (_, messages) = rollout(&proxy, &uuid, 1, None).await;
    let before = proxy.nodes(&uuid).await;
    server.kill();
    let (status, body) = proxy
        .chat(&uuid, json!({"messages": messages, "max_tokens": 8}))
        .await;
    // 502 after the retries, or 503 once the health checker has taken the server out.
    assert!(status == 502 || status == 503, "{body}");
    assert_eq!(proxy.nodes(&uuid).await, before, "the session is intact");
    let _restarted = LlamaServer::start_on(port);
    proxy.wait_until_healthy().await;
    let (status, body) = proxy
        .chat(&uuid, json!({"messages": messages, "max_tokens": 8}))
        .await;
    assert_eq!(status, 200, "{body}");
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0]["metadata"]["num_turns"], 2);
}

/// Two servers: a session's turns stay on one (affinity); when it dies they fail over.
#[tokio::test]
async fn two_servers_affinity_and_failover() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut servers = [LlamaServer::start(), LlamaServer::start()];
    let proxy = proxy_for(&[&servers[0], &servers[1]], fixture_model("smollm2"), None);
    let uuid = proxy.session(json!({})).await;
    let (_, messages) = rollout(&proxy, &uuid, 3, None).await;
    let node = proxy.nodes(&uuid).await.remove(0);
    let backends: Vec<Value> = node["metadata"]["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["backend"].clone())
        .collect();
    assert!(backends.iter().all(|b| *b == backends[0]), "{backends:?}");
    let (_, status) = proxy.get("/servers").await;
    assert_eq!(status["affinity"]["ratio"], 1.0);

    let home = servers
        .iter()
        .position(|s| json!(s.url()) == backends[0])
        .unwrap();
    servers[home].kill();
    // The same conversation goes on: the turn runs on the other server and the node still
    // grows, because the prompt is the same ids wherever it runs.
    let (status, reply) = proxy
        .chat(&uuid, json!({"messages": messages, "max_tokens": 8}))
        .await;
    assert_eq!(status, 200, "{reply}");
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1);
    let last = nodes[0]["metadata"]["turns"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["backend"], json!(servers[1 - home].url()));
    let (_, status) = proxy.get("/servers").await;
    let dead = &status["servers"][home];
    assert!(
        dead["retries"].as_u64().unwrap() >= 1 || dead["healthy"] == false,
        "{dead}"
    );
}

/// With no template configured, the llama-server's own (from the GGUF) is used.
#[tokio::test]
async fn template_comes_from_llama_server_props() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let server = LlamaServer::start();
    let dir = common::scratch_dir("tokenizer-only");
    std::fs::copy(
        fixture_model("smollm2").join("tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    let proxy = proxy_for(&[&server], dir, None);
    let uuid = proxy.session(json!({})).await;
    let data = proxy
        .render(
            &uuid,
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    // SmolLM2's GGUF template injects its default system prompt.
    assert!(
        data["prompt_text"]
            .as_str()
            .unwrap()
            .starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"),
        "{data}"
    );
}
