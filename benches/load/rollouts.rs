//! What the load generators do to a proxy: a zero-latency SGLang upstream answering from the
//! harness's reply pool, and rollouts of the harness's workload, each checked to be one node.
#![allow(dead_code)]

use super::apis::{Api, Conversation};
use super::common::mock_worker::{MockWorker, Sample, Wire};
use super::workload::{self, QUESTIONS, SYSTEM, tools};
use rollout_proxy::tokenizer::Tokenizer;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `GET /nodes` as the checks read it: each node's array lengths and divergence; the ids are
/// counted, not built.
#[derive(Deserialize)]
pub struct Nodes {
    pub nodes: Vec<NodeShape>,
}

#[derive(Deserialize)]
pub struct NodeShape {
    pub tokens: Vec<IgnoredAny>,
    pub masked_tokens: Vec<IgnoredAny>,
    pub logprobs: Vec<IgnoredAny>,
    #[serde(default)]
    pub metadata: NodeMetadata,
}

/// Only rollout-proxy explains a divergence; the reference's nodes have no such field.
#[derive(Debug, Default, Deserialize)]
pub struct NodeMetadata {
    #[serde(default)]
    pub divergence: Value,
}

/// A zero-latency upstream answering from the harness's reply pool, each reply ending with
/// `<|im_end|>`.
pub fn upstream(tokenizer: &Tokenizer) -> MockWorker {
    let pool = workload::ReplyPool::new(tokenizer);
    let worker = MockWorker::start(Wire::Sglang);
    worker.respond_with(Arc::new(move |prompt: &[u32]| {
        Sample::stop(pool.reply(prompt).to_vec())
    }));
    worker
}

pub async fn post(client: &reqwest::Client, url: &str, body: &impl Serialize) -> Value {
    post_bytes(client, url, serde_json::to_vec(body).unwrap()).await
}

pub async fn post_bytes(client: &reqwest::Client, url: &str, body: Vec<u8>) -> Value {
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    assert!(status.is_success(), "{url}: {status}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// One rollout of `turns` turns in `api`; returns the turn latencies. Panics on a node-check
/// failure.
pub async fn rollout(
    client: &reqwest::Client,
    base: &str,
    api: Api,
    index: usize,
    turns: usize,
) -> Vec<Duration> {
    let session = post(
        client,
        &format!("{base}/sessions/create"),
        &json!({"tool_parser": "hermes"}),
    )
    .await;
    let uuid = session["uuid"].as_str().unwrap().to_string();
    let url = api.url(base, &uuid);
    let mut conversation = Conversation::new(api, SYSTEM, QUESTIONS[index % QUESTIONS.len()]);
    let mut rng = workload::rollout_rng(index);
    let mut questions_asked = 1;
    let mut latencies = Vec::with_capacity(turns);
    let tools = api.tools(&tools());
    for _ in 0..turns {
        let body = conversation.body(&tools, Some(1.0), false);
        let start = Instant::now();
        let reply = post_bytes(client, &url, body).await;
        latencies.push(start.elapsed());
        let asked = conversation.answer(
            &reply,
            QUESTIONS[(index + questions_asked) % QUESTIONS.len()],
            |call| workload::tool_result(call, &mut rng),
        );
        questions_asked += usize::from(asked);
    }
    let nodes = nodes_of(client, base, &uuid).await;
    assert_eq!(
        nodes.len(),
        1,
        "one node per rollout: {:?}",
        nodes
            .iter()
            .map(|n| &n.metadata.divergence)
            .collect::<Vec<_>>()
    );
    let node = &nodes[0];
    let lengths = [
        node.tokens.len(),
        node.masked_tokens.len(),
        node.logprobs.len(),
    ];
    assert!(lengths.windows(2).all(|w| w[0] == w[1]), "{lengths:?}");
    client
        .delete(format!("{base}/{uuid}"))
        .send()
        .await
        .unwrap();
    latencies
}

pub fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at].as_secs_f64() * 1000.0
}

/// `GET /{uuid}/nodes`.
pub async fn nodes_of(client: &reqwest::Client, base: &str, uuid: &str) -> Vec<NodeShape> {
    let body: Nodes = client
        .get(format!("{base}/{uuid}/nodes"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body.nodes
}
