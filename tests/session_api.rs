//! Session behaviour beyond single turns: concurrent requests, text completions tracked on the
//! same nodes, OpenAI logprobs, and the `rollout-proxy serve` binary with a config file.

mod common;

use common::mock_worker::{MockWorker, Reply, Sample, Wire};
use common::{Proxy, assert_node_shape, char_model_dir, chars, fixture_model};
use serde_json::json;

/// Two turns sent at once on one session run one after the other (the upstream never sees
/// them overlap) and both are recorded intact; different sessions do run in parallel.
#[tokio::test]
async fn concurrent_requests_on_one_session_are_serialised() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    for text in ["first", "second"] {
        proxy
            .worker
            .push(Reply::Delayed(300, vec![Sample::stop(chars(text))]));
    }
    let a = proxy.chat(
        &uuid,
        json!({"messages": [{"role": "user", "content": "a"}]}),
    );
    let b = proxy.chat(
        &uuid,
        json!({"messages": [{"role": "user", "content": "b"}]}),
    );
    let ((status_a, _), (status_b, _)) = tokio::join!(a, b);
    assert_eq!((status_a, status_b), (200, 200));
    assert_eq!(
        proxy.worker.max_in_flight(),
        1,
        "same-session turns never overlap"
    );
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 2);
    nodes.iter().for_each(assert_node_shape);

    let other = proxy.session(json!({})).await;
    for text in ["x", "y"] {
        proxy
            .worker
            .push(Reply::Delayed(300, vec![Sample::stop(chars(text))]));
    }
    let a = proxy.chat(
        &uuid,
        json!({"messages": [{"role": "user", "content": "c"}]}),
    );
    let b = proxy.chat(
        &other,
        json!({"messages": [{"role": "user", "content": "d"}]}),
    );
    let _ = tokio::join!(a, b);
    assert_eq!(
        proxy.worker.max_in_flight(),
        2,
        "different sessions overlap"
    );
}

/// `/v1/completions` extends the node whose text (or ids) the prompt starts with.
#[tokio::test]
async fn text_completions_extend_the_session_node() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/completions");
    proxy.worker.push_sample(Sample::stop(chars(" world")));
    let (status, data) = proxy
        .post(&path, json!({"prompt": "Hello", "max_tokens": 8}))
        .await;
    assert_eq!(status, 200, "{data}");
    assert_eq!(data["object"], "text_completion");
    assert_eq!(data["choices"][0]["text"], " world");
    assert_eq!(data["choices"][0]["token_ids"], json!(chars(" world")));

    proxy.worker.push_sample(Sample::stop(chars("!")));
    let (status, _) = proxy
        .post(&path, json!({"prompt": "Hello world, again"}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(proxy.worker.last_prompt(), chars("Hello world, again"));
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1, "the second prompt extends the first node");
    assert_eq!(nodes[0]["full_text"], "Hello world, again!");
    assert_eq!(nodes[0]["metadata"]["num_turns"], 2);
    assert_node_shape(&nodes[0]);

    // A prompt given as ids works the same way; an unrelated one starts a new node.
    let mut ids = chars("Hello world, again!");
    ids.extend(chars(" more"));
    proxy.worker.push_sample(Sample::stop(chars(".")));
    assert_eq!(proxy.post(&path, json!({"prompt": ids})).await.0, 200);
    proxy.worker.push_sample(Sample::stop(chars(".")));
    assert_eq!(
        proxy.post(&path, json!({"prompt": "Unrelated"})).await.0,
        200
    );
    assert_eq!(proxy.nodes(&uuid).await.len(), 2);
    let (status, _) = proxy.post(&path, json!({"prompt": ""})).await;
    assert_eq!(status, 400);
}

/// `logprobs`/`top_logprobs` come back in OpenAI's chat format with the backend's values.
#[tokio::test]
async fn chat_logprobs_are_the_backends_values() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(chars("ok")));
    let (status, data) = proxy
        .chat(&uuid, json!({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 2}))
        .await;
    assert_eq!(status, 200, "{data}");
    assert_eq!(proxy.worker.requests()[0]["top_logprobs_num"], 2);
    let content = data["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(content.len(), 2);
    assert_eq!(content[0]["token"], "o");
    assert!((content[0]["logprob"].as_f64().unwrap() - (-0.1)).abs() < 1e-6);
    assert!((content[1]["logprob"].as_f64().unwrap() - (-0.11)).abs() < 1e-6);
    let top = content[0]["top_logprobs"].as_array().unwrap();
    assert_eq!(top.len(), 2);
    assert_eq!(top[1]["token"], "p");
    assert!((top[1]["logprob"].as_f64().unwrap() - (-1.1)).abs() < 1e-6);
    assert_eq!(content[0]["bytes"], json!([111]));

    proxy.worker.push_sample(Sample::stop(chars("ok")));
    let (_, data) = proxy
        .chat(
            &uuid,
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert!(data["choices"][0]["logprobs"].is_null(), "only when asked");
}

/// A body sent in several chunks is read whole; one over the size limit is refused whole.
#[tokio::test]
async fn a_body_in_chunks_is_read_whole() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/chat/completions");
    let body = json!({"messages": [{"role": "user", "content": "hi there"}]}).to_string();
    let pieces: Vec<String> = body
        .as_bytes()
        .chunks(7)
        .map(|c| String::from_utf8(c.to_vec()).unwrap())
        .collect();
    assert!(pieces.len() > 3);
    proxy.worker.push_sample(Sample::stop(chars("ok")));
    let (status, data) = proxy.post_chunked(&path, pieces).await;
    assert_eq!(status, 200, "{data}");
    assert_eq!(data["choices"][0]["message"]["content"], "ok");
    let history = proxy.nodes(&uuid).await;
    assert_eq!(history.len(), 1);

    // The test proxy takes at most 1 MiB: 2 MiB in 64 KiB chunks is refused, nothing recorded.
    let padding = "x".repeat(64 * 1024);
    let big = (0..32).map(|_| padding.clone()).collect();
    let (status, data) = proxy.post_chunked(&path, big).await;
    assert_eq!(status, 413, "{data}");
    common::assert_openai_error(&data);
    assert_eq!(proxy.nodes(&uuid).await, history);
}

/// The README's serve command with an Atropos-style config file, against a vLLM-format upstream.
#[tokio::test]
async fn serve_binary_with_config_file() {
    let worker = MockWorker::start(Wire::Vllm);
    let model_dir = char_model_dir();
    let config = model_dir.join("servers.json");
    std::fs::write(
        &config,
        json!({
            "model_name": "cfg-model",
            "tokenizer_name": model_dir,
            "servers": [{"base_url": format!("{}/v1", worker.url), "server_type": "vllm",
                         "api_key": "secret", "num_max_requests_at_once": 4, "timeout": 30}]
        })
        .to_string(),
    )
    .unwrap();
    let port = common::free_port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_rollout-proxy"))
        .args([
            "serve",
            "--config",
            config.to_str().unwrap(),
            "--port",
            &port.to_string(),
            "--workers",
            "1",
        ])
        .spawn()
        .unwrap();
    let server = common::KillOnDrop(child);
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let health = common::wait_for_health(&client, &base).await;
    assert_eq!(health["model"], "cfg-model", "{health}");
    assert_eq!(health["servers"], 1);
    let created = common::post_json(&client, &format!("{base}/sessions/create"), &json!({})).await;
    let uuid = created["uuid"].as_str().unwrap();
    worker.push_sample(Sample::stop(chars("hey")));
    let reply = common::post_json(
        &client,
        &format!("{base}/{uuid}/v1/chat/completions"),
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    drop(server);
    assert_eq!(reply["choices"][0]["message"]["content"], "hey", "{reply}");
    let sent = &worker.requests()[0];
    assert_eq!(sent["model"], "cfg-model");
    assert_eq!(sent["prompt"], json!(chars("<user>hi</user><assistant>")));
    assert_eq!(sent["max_tokens"], 4096, "the default limit, not vLLM's 16");
}

/// A real model folder needs nothing else: its own template and special tokens are used.
#[tokio::test]
async fn model_folder_template_is_used_by_default() {
    let proxy = Proxy::start(fixture_model("llama3_1"), None, Wire::Sglang);
    let uuid = proxy.session(json!({})).await;
    let data = proxy
        .render(
            &uuid,
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(
        data["prompt_text"],
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    assert_eq!(
        data["token_ids"][0], 128000,
        "bos_token from tokenizer_config.json"
    );
}
