//! Images in sessions against a real vLLM: its CPU build (`scripts/install-vllm.sh`) serving
//! tiny random-weight Qwen2-VL, Qwen2.5-VL and Qwen3-VL checkpoints (the Qwen3 tokenizer, the
//! models' own templates and processor configs), with the tokens-in route on.
//!
//! For each model, a two-turn rollout with a new image in each turn (a PNG, then a JPEG that its
//! EXIF orientation turns) after a system message of two text parts, whole and streamed, is
//! one node holding both images' runs; each turn's prompt ids, sampled ids and logprobs are the
//! ones vLLM's own chat route gives for the same conversation and seed. Turn two is compared where vLLM's chat route re-tokenizes the
//! first reply as it was sampled (the node keeps the sampled ids; the chat route only has the
//! text): the test tries seeds until the first reply is one the re-tokenizing matches.
//!
//! The servers run one at a time: each takes about 6 GB and compiles its model on start.

mod common;

use common::images::{data_url, png, turned_jpeg};
use common::vllm::{VllmServer, proxy_for, vision_models};
use common::{Proxy, assert_node_shape};
use serde_json::{Value, json};

/// Seeds tried for a first reply vLLM's chat route re-tokenizes as sampled.
const SEEDS: u64 = 12;
/// vLLM reports the same float for the same token by either route.
const SAME_LOGPROB: f64 = 1e-4;
/// Placeholder token of the Qwen-VL family.
const IMAGE_PAD: u64 = 151655;

static ONE_SERVER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn user(text: &str, image: Value, image_first: bool) -> Value {
    let text = json!({"type": "text", "text": text});
    let image = json!({"type": "image_url", "image_url": {"url": image}});
    let content = match image_first {
        true => vec![image, text],
        false => vec![text, image],
    };
    json!({"role": "user", "content": content})
}

fn sampling(seed: u64) -> Value {
    json!({"max_tokens": 3, "temperature": 1.0, "seed": seed, "logprobs": true})
}

fn with(mut body: Value, extra: Value) -> Value {
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

/// A turn through the proxy: the reply's text and its logprobs.
async fn proxy_turn(proxy: &Proxy, uuid: &str, body: Value, streamed: bool) -> (String, Vec<f64>) {
    if !streamed {
        let (status, reply) = proxy.chat(uuid, body).await;
        assert_eq!(status, 200, "{reply}");
        let choice = &reply["choices"][0];
        let text = choice["message"]["content"]
            .as_str()
            .unwrap_or("")
            .to_string();
        return (text, logprobs(&choice["logprobs"]));
    }
    let (status, raw, events) = proxy.chat_stream(uuid, body).await;
    assert_eq!(status, 200, "{raw}");
    let mut text = String::new();
    let mut values = Vec::new();
    for event in events.iter().filter(|e| e.is_object()) {
        let Some(choice) = event["choices"].get(0) else {
            continue;
        };
        text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        values.extend(logprobs(&choice["logprobs"]));
    }
    (text, values)
}

fn logprobs(logprobs: &Value) -> Vec<f64> {
    let content = logprobs["content"].as_array().into_iter().flatten();
    content.map(|c| c["logprob"].as_f64().unwrap()).collect()
}

/// vLLM's own chat route on the same conversation: its prompt ids, sampled ids, logprobs.
async fn vllm_chat(server: &VllmServer, body: Value) -> (Vec<u64>, Vec<u64>, Vec<f64>) {
    let body = with(body, json!({"model": "tiny", "return_token_ids": true}));
    let reply: Value = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.url()))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids = |v: &Value| -> Vec<u64> {
        let array = v.as_array().unwrap_or_else(|| panic!("{reply}"));
        array.iter().map(|i| i.as_u64().unwrap()).collect()
    };
    let choice = &reply["choices"][0];
    let sampled = ids(&choice["token_ids"]);
    (
        ids(&reply["prompt_token_ids"]),
        sampled,
        logprobs(&choice["logprobs"]),
    )
}

fn numbers(node: &Value, key: &str) -> Vec<i64> {
    let array = node[key].as_array().unwrap();
    array.iter().map(|v| v.as_i64().unwrap()).collect()
}

/// The turn `turn` of `node` equals vLLM's chat route: prompt, sampled ids, logprobs.
fn assert_turn_is_vllms(node: &Value, turn: usize, vllm: &(Vec<u64>, Vec<u64>, Vec<f64>)) {
    let tokens: Vec<u64> = numbers(node, "tokens").iter().map(|&t| t as u64).collect();
    let record = &node["metadata"]["turns"][turn];
    let start = record["completion_start"].as_u64().unwrap() as usize;
    let count = record["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(tokens[..start], vllm.0[..], "turn {turn}'s prompt");
    assert_eq!(
        tokens[start..start + count],
        vllm.1[..],
        "turn {turn}'s sample"
    );
    let recorded = &node["logprobs"].as_array().unwrap()[start..start + count];
    for (ours, theirs) in recorded.iter().zip(&vllm.2) {
        let ours = ours.as_f64().unwrap();
        assert!(
            (ours - theirs).abs() < SAME_LOGPROB,
            "turn {turn}: {ours} vs {theirs}"
        );
    }
}

/// The node's images: two runs of placeholders, masked, with the grids vLLM's processor makes.
fn assert_images(node: &Value, grids: [[u32; 3]; 2], merge: u32) {
    let images = node["images"]
        .as_array()
        .unwrap_or_else(|| panic!("{node}"));
    assert_eq!(images.len(), 2, "{images:?}");
    let tokens = numbers(node, "tokens");
    let masked = numbers(node, "masked_tokens");
    for (image, grid) in images.iter().zip(grids) {
        assert_eq!(image["grid_thw"], json!(grid), "{image}");
        let (offset, length) = (
            image["offset"].as_u64().unwrap() as usize,
            image["length"].as_u64().unwrap() as usize,
        );
        assert_eq!(
            length as u32,
            grid.iter().product::<u32>() / (merge * merge)
        );
        assert!(
            tokens[offset..offset + length]
                .iter()
                .all(|&t| t as u64 == IMAGE_PAD)
        );
        assert!(masked[offset..offset + length].iter().all(|&m| m == -100));
        assert_eq!(image["sha256"].as_str().unwrap().len(), 64);
    }
    assert_eq!(images[0]["media_type"], "image/png");
    assert_eq!(images[1]["media_type"], "image/jpeg");
}

/// Two turns, a new image in each, whole or streamed: one node, each turn as vLLM's chat
/// route samples it.
async fn two_turns(
    server: &VllmServer,
    proxy: &Proxy,
    streamed: bool,
    grids: [[u32; 3]; 2],
    merge: u32,
) {
    let first = data_url(&png(100, 60, 1), "image/png");
    let second = data_url(&turned_jpeg(100, 60, 2), "image/jpeg");
    for seed in 0..SEEDS {
        let uuid = proxy.session(json!({})).await;
        let mut messages = vec![
            // Several text parts: the templates read parts, and vLLM hands them the parts
            // (not their text joined by newlines).
            json!({"role": "system", "content": [
                {"type": "text", "text": "You see pictures."},
                {"type": "text", "text": "You answer briefly."}]}),
            user(
                "Describe the picture in one word.",
                first.clone().into(),
                true,
            ),
        ];
        let body = with(json!({"messages": messages}), sampling(seed));
        let (reply, _) = proxy_turn(proxy, &uuid, body.clone(), streamed).await;
        let node = &proxy.nodes(&uuid).await[0];
        assert_turn_is_vllms(node, 0, &vllm_chat(server, body).await);

        messages.push(json!({"role": "assistant", "content": reply}));
        messages.push(user("And this one?", second.clone().into(), false));
        let body = with(json!({"messages": messages}), sampling(seed + 100));
        proxy_turn(proxy, &uuid, body.clone(), streamed).await;
        let nodes = proxy.nodes(&uuid).await;
        assert_eq!(
            nodes.len(),
            1,
            "one node: {:?}",
            nodes[1]["metadata"]["divergence"]
        );
        let node = &nodes[0];
        assert_node_shape(node);
        assert_images(node, grids, merge);
        let vllm = vllm_chat(server, body).await;
        let start = node["metadata"]["turns"][1]["completion_start"]
            .as_u64()
            .unwrap() as usize;
        let tokens: Vec<u64> = numbers(node, "tokens").iter().map(|&t| t as u64).collect();
        if tokens[..start] != vllm.0[..] {
            // vLLM re-tokenized the first reply's text otherwise than it was sampled.
            continue;
        }
        assert_turn_is_vllms(node, 1, &vllm);
        return;
    }
    panic!("no seed of {SEEDS} gave a first reply vLLM's chat route re-tokenizes as sampled");
}

async fn vision_rollouts(model: &str, grids: [[u32; 3]; 2]) {
    let _one = ONE_SERVER.lock().await;
    let dir = vision_models().join(model);
    let limits = r#"{"image": 4, "video": 0}"#;
    let server = VllmServer::start_model(
        dir,
        &["--enable-scale-out", "--limit-mm-per-prompt", limits],
    );
    let proxy = proxy_for(&server);
    for streamed in [false, true] {
        two_turns(&server, &proxy, streamed, grids, 2).await;
    }
}

#[tokio::test]
async fn qwen2_vl_rollouts_are_vllms() {
    vision_rollouts("qwen2-vl", [[1, 4, 8], [1, 8, 4]]).await;
}

/// The README's vision rollout, run as written (only the proxy's address changed) in front of
/// the tiny Qwen2-VL, with a 100x60 `photo.png`; and what it prints.
#[tokio::test]
async fn the_readme_vision_rollout_runs_as_written() {
    let _one = ONE_SERVER.lock().await;
    let dir = vision_models().join("qwen2-vl");
    let server = VllmServer::start_model(dir, &["--enable-scale-out"]);
    let proxy = proxy_for(&server);
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = &readme[readme.find("### A vision rollout").unwrap()..];
    let start = section.find("```bash\n").unwrap() + "```bash\n".len();
    let block = &section[start..];
    let block = &block[..block.find("```").unwrap()];
    let script = block.replace("P=http://127.0.0.1:9000", &format!("P={}", proxy.url));
    assert_ne!(script, block, "the block names the proxy's address in P");
    let work = common::scratch_dir("readme-vision");
    std::fs::write(work.join("photo.png"), png(100, 60, 5)).unwrap();
    let output = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(&work)
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout, "assistant\nthe same bytes\n");
    assert_eq!(stderr, "8 placeholders at 15 grid [1, 4, 8]\n");
}

#[tokio::test]
async fn qwen2_5_vl_rollouts_are_vllms() {
    vision_rollouts("qwen2.5-vl", [[1, 4, 8], [1, 8, 4]]).await;
}

#[tokio::test]
async fn qwen3_vl_rollouts_are_vllms() {
    vision_rollouts("qwen3-vl", [[1, 14, 22], [1, 22, 14]]).await;
}
