//! Routed experts (mixture-of-experts routing replay): a session created with
//! `"routed_experts": true` asks each turn's server for the experts every position was routed
//! to — only the positions its node lacks — and keeps one row per position, from the first,
//! through forks, the journal and both exports. The scripted upstream speaks vLLM's shapes (a
//! `.npy` per choice, on both routes, whole and on a stream's last chunk) and SGLang's (raw
//! `int32` in `meta_info`), each row a function of its position alone.

mod common;

use base64::Engine;
use common::mock_worker::{MockWorker, Sample, Wire};
use common::routing::{WIDTH, row};
use common::{
    KillOnDrop, Proxy, char_model_dir, chars, free_port, post_json, scratch_dir, wait_for_health,
};
use ndarray::ArrayD;
use ndarray_npy::ReadNpyExt;
use serde_json::{Value, json};

/// The rows a node's `routed_experts` holds, flat, and the array's shape.
fn decoded(node: &Value) -> (Vec<u16>, Vec<usize>) {
    let text = node["routed_experts"]
        .as_str()
        .unwrap_or_else(|| panic!("no rows: {node}"));
    let npy = base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap();
    let array = ArrayD::<u16>::read_npy(&npy[..]).unwrap();
    (array.iter().copied().collect(), array.shape().to_vec())
}

/// Every position but the last has its row, in order.
fn assert_rows_in_place(node: &Value) {
    let len = node["tokens"].as_array().unwrap().len();
    let (ids, _) = decoded(node);
    let expected: Vec<u16> = (0..len - 1).flat_map(row).collect();
    assert_eq!(ids, expected, "one row per fed position");
}

/// Where each request asked for routing from.
fn asked_from(worker: &MockWorker, wire: Wire) -> Vec<Value> {
    worker
        .requests()
        .iter()
        .map(|r| match wire {
            Wire::Vllm => r["routed_experts_prompt_start"].clone(),
            Wire::VllmGenerate => r["sampling_params"]["routed_experts_prompt_start"].clone(),
            _ => r["routed_experts_start_len"].clone(),
        })
        .collect()
}

#[tokio::test]
async fn each_position_keeps_its_routing_across_turns_and_apis() {
    for wire in [Wire::Vllm, Wire::VllmGenerate, Wire::Sglang] {
        let proxy = Proxy::start(char_model_dir(), None, wire);
        let (status, created) = proxy
            .post("/sessions/create", json!({"routed_experts": true}))
            .await;
        assert_eq!(status, 200, "{created}");
        assert_eq!(created["routed_experts"], true);
        let uuid = created["uuid"].as_str().unwrap();
        let mut messages = vec![json!({"role": "user", "content": "hi"})];
        for (turn, reply) in ["hello", "again", "bye"].into_iter().enumerate() {
            let body = json!({"messages": messages});
            // vLLM's completions stream carries no routing: stream where the server sends it.
            let status = if turn == 1 && wire != Wire::Vllm {
                proxy.worker.push_sample(Sample::stop(chars(reply)));
                proxy.chat_stream(uuid, body).await.0
            } else {
                proxy.turn(uuid, Sample::stop(chars(reply)), body).await.0
            };
            assert_eq!(status, 200, "{wire:?} turn {turn}");
            messages.push(json!({"role": "assistant", "content": reply}));
            messages.push(json!({"role": "user", "content": "more"}));
        }
        let nodes = proxy.nodes(uuid).await;
        assert_eq!(nodes.len(), 1);
        assert_rows_in_place(&nodes[0]);
        // Each turn asked only for what the node lacked: from its last token on.
        let turns = nodes[0]["metadata"]["turns"].as_array().unwrap();
        let mut expected = vec![json!(0)];
        for turn in &turns[..turns.len() - 1] {
            let end = turn["completion_start"].as_u64().unwrap()
                + turn["completion_tokens"].as_u64().unwrap();
            expected.push(json!(end - 1));
        }
        assert_eq!(asked_from(&proxy.worker, wire), expected, "{wire:?}");
        let (_, shape) = decoded(&nodes[0]);
        match wire {
            Wire::Sglang => assert_eq!(shape[1..], [WIDTH], "SGLang gives flat rows"),
            _ => assert_eq!(shape[1..], [2, 2], "vLLM gives layers × top-k"),
        }
    }
}

/// `n` > 1: each choice's node has the shared prefix's rows and its own; sessions that do not
/// ask get no routing and send no request for it.
#[tokio::test]
async fn forks_keep_their_own_rows_and_sessions_that_do_not_ask_get_none() {
    let proxy = Proxy::start(char_model_dir(), None, Wire::Vllm);
    let (_, created) = proxy
        .post("/sessions/create", json!({"routed_experts": true}))
        .await;
    let uuid = created["uuid"].as_str().unwrap();
    let messages = json!([{"role": "user", "content": "hi"}]);
    proxy.worker.push(common::mock_worker::Reply::Samples(vec![
        Sample::stop(chars("one")),
        Sample::stop(chars("three")),
    ]));
    let (status, reply) = proxy
        .chat(uuid, json!({"messages": messages, "n": 2}))
        .await;
    assert_eq!(status, 200, "{reply}");
    let nodes = proxy.nodes(uuid).await;
    assert_eq!(nodes.len(), 2);
    nodes.iter().for_each(assert_rows_in_place);

    let plain = proxy.session(json!({})).await;
    proxy.hi(&plain).await;
    let sent = proxy.worker.requests().pop().unwrap();
    assert!(sent.get("routed_experts_prompt_start").is_none(), "{sent}");
    assert!(proxy.nodes(&plain).await[0].get("routed_experts").is_none());
}

/// A `serve` process journaling into `dir` before the SGLang-shaped `upstream`, once it
/// answers, and its URL.
async fn serve(dir: &std::path::Path, upstream: &str) -> (KillOnDrop, String) {
    let port = free_port();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rollout-proxy"));
    command
        .args([
            "serve",
            "--port",
            &port.to_string(),
            "--workers",
            "1",
            "--tokenizer",
        ])
        .arg(char_model_dir())
        .args([
            "--backend",
            upstream,
            "--backend-type",
            "sglang",
            "--data-dir",
        ])
        .arg(dir)
        .stdout(std::process::Stdio::null());
    let server = KillOnDrop(command.spawn().unwrap());
    let url = format!("http://127.0.0.1:{port}");
    wait_for_health(&reqwest::Client::new(), &url).await;
    (server, url)
}

async fn get(url: &str) -> reqwest::Response {
    let response = reqwest::get(url).await.unwrap();
    assert_eq!(response.status(), 200, "{url}");
    response
}

/// The rows survive a `kill -9` and restart (the journal) and come out of both exports: JSON
/// lines as the node's base64 `.npy`, and the `.npz` as `routed_experts` (nodes × positions ×
/// ids, 65535 where a position has no row).
#[tokio::test]
async fn rows_survive_a_restart_and_are_exported() {
    let dir = scratch_dir("routed-experts-journal");
    let worker = MockWorker::start(Wire::Sglang);
    worker.respond_with(std::sync::Arc::new(|_: &[u32]| {
        Sample::stop(chars("hello"))
    }));
    let (server, url) = serve(&dir, &worker.url).await;
    let client = reqwest::Client::new();
    let create = format!("{url}/sessions/create");
    let created = post_json(&client, &create, &json!({"routed_experts": true})).await;
    let uuid = created["uuid"].as_str().unwrap().to_string();
    let turn = json!({"messages": [{"role": "user", "content": "hi"}]});
    let chat = format!("{url}/{uuid}/v1/chat/completions");
    let reply = client.post(&chat).json(&turn).send().await.unwrap();
    assert_eq!(reply.status(), 200);
    let before: Value = get(&format!("{url}/{uuid}/nodes"))
        .await
        .json()
        .await
        .unwrap();
    drop(server);
    let (_server, url) = serve(&dir, &worker.url).await;
    let after: Value = get(&format!("{url}/{uuid}/nodes"))
        .await
        .json()
        .await
        .unwrap();
    let node = &after["nodes"][0];
    assert_eq!(node["routed_experts"], before["nodes"][0]["routed_experts"]);
    assert_rows_in_place(node);

    let lines = get(&format!("{url}/export")).await.text().await.unwrap();
    let line: Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    assert_eq!(line["routed_experts"], node["routed_experts"]);
    let bytes = get(&format!("{url}/export?format=npz&pad_to=64"))
        .await
        .bytes()
        .await
        .unwrap();
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes.to_vec())).unwrap();
    let mut npy = Vec::new();
    let mut member = archive.by_name("routed_experts.npy").unwrap();
    std::io::Read::read_to_end(&mut member, &mut npy).unwrap();
    let array = ArrayD::<u16>::read_npy(&npy[..]).unwrap();
    assert_eq!(array.shape(), [1, 64, WIDTH]);
    let len = node["tokens"].as_array().unwrap().len();
    for position in 0..64 {
        let cells: Vec<u16> = (0..WIDTH).map(|k| array[[0, position, k]]).collect();
        let expected = match position < len - 1 {
            true => row(position).to_vec(),
            false => vec![u16::MAX; WIDTH],
        };
        assert_eq!(cells, expected, "position {position}");
    }
}
