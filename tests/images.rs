//! Images in sessions against a scripted vLLM tokens-in route (`tests/common/vllm_generate.rs` expands
//! images as vLLM does): what is sent (each image's run collapsed to one placeholder, the image
//! as a `content_parts` data URL named by its hash), what the node records, and every refusal:
//! a server that expands otherwise, images it cannot take, bad images over each API — each
//! answered in the API's error shape, with nothing recorded.
//! `tests/vllm_vision.rs` runs the same against a real vLLM.

mod common;

use common::images::{
    base64, data_url, messages_and_responses_nodes, png, qwen2_vl_dir, sha256, turned_jpeg, user,
};
use common::mock_worker::{MockWorker, Sample, Wire};
use common::vllm_generate::IMAGE_PAD;
use common::{Proxy, assert_node_shape, assert_openai_error};
use serde_json::{Value, json};

const IM_END: u32 = 151645;
/// Placeholders of a 100x60 image for Qwen2-VL: its grid is 1x4x8 patches, merged 2x2.
const RUN: usize = 8;

fn proxy(wire: Wire) -> Proxy {
    Proxy::start(qwen2_vl_dir(), None, wire)
}

fn ids(value: &Value) -> Vec<u32> {
    serde_json::from_value(value.clone()).unwrap()
}

#[tokio::test]
async fn an_image_rollout_is_one_node_with_its_runs() {
    let proxy = proxy(Wire::VllmGenerate);
    proxy.worker.expand_images(vec![RUN, RUN]);
    let uuid = proxy.session(json!({})).await;
    let first = png(100, 60, 1);
    let second = turned_jpeg(100, 60, 2);
    let mut messages = vec![user("What is it?", &data_url(&first, "image/png"))];
    proxy.worker.push_sample(Sample::stop(vec![9707, IM_END]));
    let (status, reply) = proxy.chat(&uuid, json!({"messages": messages})).await;
    assert_eq!(status, 200, "{reply}");
    messages.push(reply["choices"][0]["message"].clone());
    messages.push(user("And this?", &data_url(&second, "image/jpeg")));
    proxy.worker.push_sample(Sample::stop(vec![9707, IM_END]));
    let (status, _, events) = proxy
        .chat_stream(&uuid, json!({"messages": messages, "stream": true}))
        .await;
    assert_eq!(status, 200, "{events:?}");

    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let node = &nodes[0];
    assert_node_shape(node);
    // `/render` shows the prompt a turn would send now: the node's, runs and all.
    let rendered = proxy.render(&uuid, json!({"messages": messages})).await;
    assert_eq!(rendered["images"], node["images"]);
    let prompt = ids(&rendered["token_ids"]);
    let prompt_end = node["metadata"]["turns"][1]["completion_start"]
        .as_u64()
        .unwrap() as usize;
    assert_eq!(prompt[..], ids(&node["tokens"])[..prompt_end]);
    let images = node["images"].as_array().unwrap();
    assert_eq!(images.len(), 2);
    let tokens = ids(&node["tokens"]);
    for (image, (bytes, grid)) in images
        .iter()
        .zip([(&first, [1, 4, 8]), (&second, [1, 8, 4])])
    {
        assert_eq!(image["grid_thw"], json!(grid));
        assert_eq!(image["length"], RUN);
        let digest = sha256(bytes);
        assert_eq!(image["sha256"], digest);
        let offset = image["offset"].as_u64().unwrap() as usize;
        assert!(tokens[offset..offset + RUN].iter().all(|&t| t == IMAGE_PAD));
        assert_eq!(tokens[offset - 1], 151652, "after <|vision_start|>");
        assert_eq!(tokens[offset + RUN], 151653, "before <|vision_end|>");
    }

    // What vLLM was sent: one placeholder per image, the images by data URL and hash.
    let requests = proxy.worker.requests();
    let last = requests.last().unwrap();
    let sent = ids(&last["token_ids"]);
    assert_eq!(sent.iter().filter(|&&t| t == IMAGE_PAD).count(), 2);
    assert_eq!(
        sent.len(),
        tokens.len() - 2 - 2 * (RUN - 1),
        "the node's prompt, collapsed"
    );
    let parts = last["content_parts"].as_array().unwrap();
    // The image the server took in turn one is named alone; the new one comes with its bytes.
    assert_eq!(
        parts[0],
        json!({"type": "image_url", "uuid": images[0]["sha256"]})
    );
    assert_eq!(parts[1]["uuid"], images[1]["sha256"]);
    assert_eq!(parts[1]["url"], data_url(&second, "image/jpeg"));
    assert_eq!(
        requests[0]["content_parts"][0]["url"],
        data_url(&first, "image/png")
    );
    assert_eq!(last["return_token_ids"], true);
}

/// A rollout whose bodies are long (32 KiB or more: the proxy reads such a body only where it
/// is new, `src/chat/resent.rs`) and resend every earlier image: one node holding each image
/// once, in order, and each turn sends vLLM only its new image's bytes.
#[tokio::test]
async fn a_long_rollout_of_large_images_reads_each_once_and_stays_one_node() {
    let proxy = proxy(Wire::VllmGenerate);
    let uuid = proxy.session(json!({})).await;
    let mut messages = Vec::new();
    let mut sent = Vec::new();
    for turn in 0..4u32 {
        let bytes = common::images::noisy_png(120, 100, turn + 1);
        assert!(bytes.len() > 32 * 1024);
        messages.push(user(
            &format!("Turn {turn}?"),
            &data_url(&bytes, "image/png"),
        ));
        sent.push(sha256(&bytes));
        proxy.worker.expand_images(vec![RUN * 2; 4]);
        proxy.worker.push_sample(Sample::stop(vec![9707, IM_END]));
        let (status, reply) = proxy.chat(&uuid, json!({"messages": messages})).await;
        assert_eq!(status, 200, "turn {turn}: {reply}");
        messages.push(reply["choices"][0]["message"].clone());
    }
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1);
    let recorded: Vec<&str> = nodes[0]["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|image| image["sha256"].as_str().unwrap())
        .collect();
    assert_eq!(
        recorded,
        sent.iter().map(String::as_str).collect::<Vec<_>>()
    );
    // Each turn sent only its new image's bytes.
    for (turn, request) in proxy.worker.requests().iter().enumerate() {
        let parts = request["content_parts"].as_array().unwrap();
        let with_bytes: Vec<usize> = (0..parts.len())
            .filter(|&i| parts[i].get("url").is_some())
            .collect();
        assert_eq!(with_bytes, [turn], "turn {turn}");
    }
}

#[tokio::test]
async fn an_image_the_server_no_longer_keeps_is_sent_again() {
    let proxy = proxy(Wire::VllmGenerate);
    proxy.worker.expand_images(vec![RUN, RUN]);
    let uuid = proxy.session(json!({})).await;
    let first = png(100, 60, 5);
    let mut messages = vec![user("What is it?", &data_url(&first, "image/png"))];
    proxy.worker.push_sample(Sample::stop(vec![9707, IM_END]));
    let (status, reply) = proxy.chat(&uuid, json!({"messages": messages})).await;
    assert_eq!(status, 200, "{reply}");
    messages.push(reply["choices"][0]["message"].clone());
    messages.push(user("And this?", &data_url(&png(60, 100, 6), "image/png")));
    // The server lost its cache (a restart, an eviction): naming the image alone misses.
    proxy.worker.forget_images();
    proxy.worker.push_sample(Sample::stop(vec![9707, IM_END]));
    let (status, reply) = proxy.chat(&uuid, json!({"messages": messages})).await;
    assert_eq!(status, 200, "{reply}");
    let sent = proxy.worker.requests();
    let parts = sent.last().unwrap()["content_parts"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        parts[0]["url"],
        data_url(&first, "image/png"),
        "sent again with its bytes"
    );
    assert_eq!(proxy.nodes(&uuid).await.len(), 1);
}

#[tokio::test]
async fn a_server_that_expands_otherwise_records_nothing() {
    let proxy = proxy(Wire::VllmGenerate);
    // One placeholder more than the processor makes: the prompt is not the node's.
    proxy.worker.expand_images(vec![RUN + 1]);
    let uuid = proxy.session(json!({})).await;
    let messages = vec![user(
        "What is it?",
        &data_url(&png(100, 60, 1), "image/png"),
    )];
    proxy.worker.push_sample(Sample::stop(vec![9707, IM_END]));
    let (status, reply) = proxy.chat(&uuid, json!({"messages": messages})).await;
    assert_eq!(status, 502, "{reply}");
    assert_openai_error(&reply);
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("placed the prompt's images otherwise"),
        "{message}"
    );
    proxy.worker.push_sample(Sample::stop(vec![9707, IM_END]));
    let (status, raw, _) = proxy
        .chat_stream(&uuid, json!({"messages": messages, "stream": true}))
        .await;
    assert!(status != 200 || raw.contains("otherwise"), "{status} {raw}");
    assert!(proxy.nodes(&uuid).await.is_empty());
}

#[tokio::test]
async fn servers_that_cannot_take_images_refuse_them() {
    for (wire, why) in [
        (Wire::Sglang, "only vLLM's tokens-in route"),
        (Wire::VllmScaleOutOff, "--enable-scale-out"),
    ] {
        let proxy = proxy(wire);
        let uuid = proxy.session(json!({})).await;
        let messages = vec![user("What is it?", &data_url(&png(10, 10, 1), "image/png"))];
        let (status, reply) = proxy.chat(&uuid, json!({"messages": messages})).await;
        assert_eq!(status, 400, "{reply}");
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains(why), "{message}");
        assert!(proxy.nodes(&uuid).await.is_empty());
    }
    // A model without an image processor takes no images.
    let text_only = Proxy::start(common::fixture_model("qwen3"), None, Wire::VllmGenerate);
    let uuid = text_only.session(json!({})).await;
    let messages = vec![user("What is it?", &data_url(&png(10, 10, 1), "image/png"))];
    let (status, reply) = text_only.chat(&uuid, json!({"messages": messages})).await;
    assert_eq!(status, 400, "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains("takes no images"), "{message}");
}

/// A PNG header claiming `width × height` pixels (no pixel data follows).
fn png_header(width: u32, height: u32) -> Vec<u8> {
    let mut chunk = b"IHDR".to_vec();
    chunk.extend_from_slice(&width.to_be_bytes());
    chunk.extend_from_slice(&height.to_be_bytes());
    chunk.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut out = b"\x89PNG\r\n\x1a\n\0\0\0\x0d".to_vec();
    out.extend_from_slice(&chunk);
    out.extend_from_slice(&crc32(&chunk).to_be_bytes());
    // An empty IDAT and the IEND: the header is read up to the first IDAT.
    for kind in [&b"IDAT"[..], b"IEND"] {
        out.extend_from_slice(&[0, 0, 0, 0]);
        out.extend_from_slice(kind);
        out.extend_from_slice(&crc32(kind).to_be_bytes());
    }
    out
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[tokio::test]
async fn bad_images_are_refused_in_each_apis_shape() {
    let proxy = proxy(Wire::VllmGenerate);
    proxy.worker.expand_images(vec![RUN; 70]);
    let uuid = proxy.session(json!({})).await;
    let tiny = data_url(&png(4, 4, 1), "image/png");
    let many: Vec<Value> = (0..65)
        .map(|_| json!({"type": "image_url", "image_url": {"url": tiny}}))
        .collect();
    let cases = [
        (
            user("x", "data:image/png;base64,aGVsbG8="),
            "cannot be decoded",
        ),
        (
            user("x", &data_url(b"II*\0\x08\0\0\0", "image/tiff")),
            "format Tiff is not supported",
        ),
        (
            user("x", &data_url(&png_header(20_000, 10_000), "image/png")),
            "over the limit of 178956970 pixels",
        ),
        (
            user("x", &data_url(&png(201, 1, 1), "image/png")),
            "aspect ratio 201.0 is over 200",
        ),
        (
            user("x", "ftp://example.test/cat.png"),
            "must be a data: URL (data:image/png;base64,...) or an http(s) URL",
        ),
        (
            json!({"role": "user", "content": many}),
            "at most 64 are taken",
        ),
        (
            json!({"role": "user", "content": [{"type": "text", "text": "<|image_pad|>"}]}),
            "must not hold the placeholder",
        ),
        (
            json!({"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": tiny}}]}),
            "assistant message cannot hold images",
        ),
    ];
    for (message, why) in cases {
        proxy.worker.push_sample(Sample::stop(vec![9707, IM_END]));
        let (status, reply) = proxy.chat(&uuid, json!({"messages": [message]})).await;
        assert_eq!(status, 400, "{why}: {reply}");
        assert_openai_error(&reply);
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains(why), "{why}: {message}");
    }
    let bad = base64(b"hello");
    let (status, reply) = proxy
        .post(&format!("/{uuid}/v1/messages"), json!({"max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": bad}}]}]}))
        .await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["type"], "error");
    assert_eq!(reply["error"]["type"], "invalid_request_error");
    let (status, reply) = proxy
        .post(
            &format!("/{uuid}/v1/responses"),
            json!({"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,aGVsbG8="}]}]}),
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    assert_openai_error(&reply);
    assert!(proxy.nodes(&uuid).await.is_empty(), "nothing recorded");
}

#[tokio::test]
async fn a_sampled_placeholder_is_refused_before_it_reaches_the_server() {
    let proxy = proxy(Wire::VllmGenerate);
    proxy.worker.expand_images(vec![RUN]);
    let uuid = proxy.session(json!({})).await;
    let mut messages = vec![user(
        "What is it?",
        &data_url(&png(100, 60, 1), "image/png"),
    )];
    // The model writes a placeholder of its own.
    proxy
        .worker
        .push_sample(Sample::stop(vec![9707, IMAGE_PAD, IM_END]));
    let (status, reply) = proxy.chat(&uuid, json!({"messages": messages})).await;
    assert_eq!(status, 200, "{reply}");
    let before = proxy.nodes(&uuid).await;
    messages.push(reply["choices"][0]["message"].clone());
    messages.push(json!({"role": "user", "content": "Go on."}));
    let sent = proxy.worker.requests().len();
    let (status, reply) = proxy.chat(&uuid, json!({"messages": messages})).await;
    assert_eq!(status, 400, "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("outside the runs of its images"),
        "{message}"
    );
    assert_eq!(proxy.worker.requests().len(), sent, "nothing sent");
    assert_eq!(proxy.nodes(&uuid).await, before, "nothing recorded");
}

#[tokio::test]
async fn messages_and_responses_send_images_too() {
    let proxy = proxy(Wire::VllmGenerate);
    proxy.worker.expand_images(vec![RUN]);
    let image = png(100, 60, 3);
    let source = json!({"type": "base64", "media_type": "image/png", "data": base64(&image)});
    let (a, b) = messages_and_responses_nodes(&proxy, source, &data_url(&image, "image/png")).await;
    assert_eq!(
        a[0]["images"], b[0]["images"],
        "the same image, placed alike"
    );
    assert_eq!(a[0]["tokens"], b[0]["tokens"]);
}

#[tokio::test]
async fn images_outlive_kill_9_and_go_with_their_last_session() {
    let dir = common::scratch_dir("images-durability");
    let worker = MockWorker::start(Wire::VllmGenerate);
    worker.expand_images(vec![RUN]);
    let port = common::free_port();
    let serve = || {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rollout-proxy"));
        command
            .args(["serve", "--port", &port.to_string(), "--workers", "1"])
            .arg("--tokenizer")
            .arg(qwen2_vl_dir())
            .args(["--backend", &worker.url, "--backend-type", "vllm"])
            .arg("--data-dir")
            .arg(&dir)
            .stdout(std::process::Stdio::null());
        common::KillOnDrop(command.spawn().unwrap())
    };
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let mut server = serve();
    common::wait_for_health(&http, &base).await;
    let client = common::client::Client::on(port);
    let uuid = client.session().await;
    let bytes = png(100, 60, 7);
    worker.push_sample(Sample::stop(vec![9707, IM_END]));
    let messages = vec![user("What is it?", &data_url(&bytes, "image/png"))];
    client
        .post(
            &format!("/{uuid}/v1/chat/completions"),
            json!({"messages": messages}),
        )
        .await;
    let (_, before) = client.nodes_text(&uuid).await;
    let digest = sha256(&bytes);
    assert!(dir.join("blobs").join(&digest).is_file());

    drop(server); // SIGKILL
    server = serve();
    common::wait_for_health(&http, &base).await;
    assert_eq!(
        client.nodes_text(&uuid).await,
        (200, before),
        "byte-identical nodes"
    );
    for path in [
        format!("/blobs/{digest}"),
        format!("/{uuid}/blobs/{digest}"),
    ] {
        let reply = http.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(reply.status(), 200, "{path}");
        assert_eq!(reply.headers()["content-type"], "image/png");
        assert_eq!(reply.bytes().await.unwrap(), bytes);
    }
    let other = client.session().await;
    let (status, _) = client.get_json(&format!("/{other}/blobs/{digest}")).await;
    assert_eq!(status, 404, "a session fetches only its own images");
    let (status, _) = client.get_json("/blobs/..%2Fjournal").await;
    assert!(status == 400 || status == 404, "{status}");

    client.delete_session(&uuid).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while dir.join("blobs").join(&digest).exists() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        !dir.join("blobs").join(&digest).exists(),
        "dropped with its last session"
    );
    let (status, _) = client.get_json(&format!("/blobs/{digest}")).await;
    assert_eq!(status, 404);
    drop(server);
}

#[tokio::test]
async fn every_export_carries_the_image_records() {
    let proxy = proxy(Wire::VllmGenerate);
    proxy.worker.expand_images(vec![RUN]);
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(vec![9707, IM_END]));
    let messages = vec![user(
        "What is it?",
        &data_url(&png(100, 60, 4), "image/png"),
    )];
    let (status, reply) = proxy.chat(&uuid, json!({"messages": messages})).await;
    assert_eq!(status, 200, "{reply}");
    let images = proxy.nodes(&uuid).await[0]["images"].clone();
    assert_eq!(images.as_array().unwrap().len(), 1);
    let get = |query: &'static str| {
        let url = format!("{}/export?{query}", proxy.url);
        async move { reqwest::get(url).await.unwrap().bytes().await.unwrap() }
    };
    let jsonl: Value = serde_json::from_slice(&get("format=jsonl").await).unwrap();
    assert_eq!(jsonl["images"], images);
    let atif: Value = serde_json::from_slice(&get("format=atif").await).unwrap();
    assert_eq!(atif["extra"]["images"], images);
    common::assert_valid_atif(&atif, "images-atif");
    let npz = get("format=npz").await;
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(npz)).unwrap();
    let described: Value = serde_json::from_reader(zip.by_name("nodes.json").unwrap()).unwrap();
    assert_eq!(described[0]["images"], images);
}

/// A fleet keeps images in its store, with their session: any replica serves their bytes and
/// extends the node with more, and they go with the session.
#[tokio::test]
async fn a_fleet_keeps_images_in_its_store() {
    let redis = common::redis::RedisServer::start(&common::scratch_dir("images-fleet"));
    let worker = MockWorker::start(Wire::VllmGenerate);
    worker.expand_images(vec![RUN, RUN]);
    let (store, upstream) = (redis.url(), worker.url.clone());
    let replica = || {
        let (store, upstream) = (store.clone(), upstream.clone());
        async move {
            let model = (qwen2_vl_dir(), "vllm");
            common::fleet::Replica::serving(&store, &[&upstream], &[], model).await
        }
    };
    let (a, b) = (replica().await, replica().await);
    let (on_a, on_b) = (a.client(), b.client());
    let uuid = on_a.session().await;
    let (first, second) = (png(100, 60, 8), png(60, 100, 9));
    let mut messages = vec![user("What is it?", &data_url(&first, "image/png"))];
    worker.push_sample(Sample::stop(vec![9707, IM_END]));
    let reply = on_a
        .post(
            &format!("/{uuid}/v1/chat/completions"),
            json!({"messages": messages}),
        )
        .await;
    messages.push(reply["choices"][0]["message"].clone());
    messages.push(user("And this?", &data_url(&second, "image/png")));
    worker.push_sample(Sample::stop(vec![9707, IM_END]));
    on_b.post(
        &format!("/{uuid}/v1/chat/completions"),
        json!({"messages": messages}),
    )
    .await;
    let (_, nodes) = on_a.get_json(&format!("/{uuid}/nodes")).await;
    let nodes = nodes["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1, "one node across replicas");
    assert_eq!(nodes[0]["images"].as_array().unwrap().len(), 2);
    let http = reqwest::Client::new();
    for (client, bytes) in [(&on_b, &first), (&on_a, &second), (&on_b, &second)] {
        let digest = sha256(bytes);
        for path in [
            format!("/blobs/{digest}"),
            format!("/{uuid}/blobs/{digest}"),
        ] {
            let reply = http
                .get(format!("{}{path}", client.base))
                .send()
                .await
                .unwrap();
            assert_eq!(reply.status(), 200, "{path}");
            assert_eq!(reply.bytes().await.unwrap(), *bytes, "{path}");
        }
    }
    on_b.delete_session(&uuid).await;
    let (status, _) = on_a.get_json(&format!("/blobs/{}", sha256(&first))).await;
    assert_eq!(status, 404, "gone with its session");
}
