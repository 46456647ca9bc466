//! The token viewer (`GET /ui`) in a real headless Chromium: Debian's `chromium`, driven by
//! playwright-core (tests/ui/viewer.mjs; `scripts/install-browser.sh` installs both, and
//! `scripts/test.sh` runs it). The page's token boxes, their colours, messages, tool calls,
//! hover facts, text view, divergence flags and live updates are checked against the proxy's
//! own `GET /{uuid}/nodes`. Screenshots are kept in `target/ui-screenshots/`.

mod common;

use common::mock_worker::Sample;
use common::{Proxy, chars, qwen3_proxy};
use rollout_proxy::tokenizer::Tokenizer;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// Chromium and playwright-core, from the environment or installed by the script.
fn browser() -> (PathBuf, PathBuf) {
    let mut paths =
        common::installed("install-browser.sh", &["CHROMIUM_BIN", "PLAYWRIGHT_CORE"]).into_iter();
    (paths.next().unwrap(), paths.next().unwrap())
}

/// Runs the driver on `session`; screenshots go to `target/ui-screenshots/{name}/`.
async fn drive(proxy: &Proxy, session: &str, name: &str, live_turn: Option<Value>) -> Value {
    let (chromium, playwright) = browser();
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("target/ui-screenshots/{name}"));
    std::fs::create_dir_all(&out).unwrap();
    let mut command = tokio::process::Command::new("node");
    command
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui/viewer.mjs"))
        .env("PROXY_URL", &proxy.url)
        .env("SESSION", session)
        .env("OUT_DIR", &out)
        .env("CHROMIUM_BIN", chromium)
        .env("PLAYWRIGHT_CORE", playwright);
    if let Some(body) = live_turn {
        command.env("LIVE_TURN", body.to_string());
    }
    let output = command.output().await.expect("run node");
    assert!(
        output.status.success(),
        "the browser driver failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("the driver's JSON");
    // Under its own content policy the page works (a blocked script or fetch is logged as an
    // error) and the policy is enforced.
    assert_eq!(report["errors"], json!([]), "the page logged errors");
    let headers = &report["headers"];
    let policy = headers["content-security-policy"]
        .as_str()
        .unwrap_or_default();
    assert!(
        policy.contains("script-src 'self'") && policy.contains("frame-ancestors 'none'"),
        "{headers}"
    );
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["x-frame-options"], "DENY");
    assert_eq!(headers["referrer-policy"], "no-referrer");
    assert_eq!(
        report["inline_script_ran"], false,
        "an injected inline script ran"
    );
    for url in report["requests"].as_array().unwrap() {
        let url = url.as_str().unwrap();
        // Images are shown from `blob:` URLs of bytes fetched from the proxy.
        let own = url.strip_prefix("blob:").unwrap_or(url);
        assert!(
            own.starts_with(&proxy.url),
            "the page fetched {url} from elsewhere"
        );
    }
    report
}

/// The heat class the viewer gives a sampled token: h0 (p > 0.9) to h9 (p <= 0.1).
fn heat(logprob: f64) -> String {
    format!(
        "h{}",
        ((1.0 - logprob.exp()) * 10.0).floor().clamp(0.0, 9.0)
    )
}

/// Logprobs that run over the whole heat scale.
fn varied(ids: Vec<u32>) -> Sample {
    let logprobs = (0..ids.len())
        .map(|i| -[0.01f32, 0.2, 0.6, 1.2, 2.5][i % 5] - (i % 7) as f32 * 0.05)
        .collect();
    Sample {
        logprobs,
        ..Sample::stop(ids)
    }
}

fn ids(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    tokenizer.encode(text).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_viewer_shows_a_tool_calling_rollout_token_by_token_in_chromium() {
    let (tokenizer, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let mut messages = vec![
        json!({"role": "system", "content": "You answer weather questions."}),
        json!({"role": "user", "content": "What is the weather in Paris?"}),
    ];
    let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n\
                </tool_call><|im_end|>";
    let (status, reply) = proxy
        .turn(
            &uuid,
            varied(ids(&tokenizer, call)),
            json!({"messages": messages, "tools": tools}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let assistant = reply["choices"][0]["message"].clone();
    let call_id = assistant["tool_calls"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    messages.push(assistant);
    messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": "sunny, 21 C"}));
    let answer = "It is sunny in Paris: 21 °C.<|im_end|>";
    let (status, reply) = proxy
        .turn(
            &uuid,
            varied(ids(&tokenizer, answer)),
            json!({"messages": messages, "tools": tools}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    messages.push(reply["choices"][0]["message"].clone());
    // An environment that rewrites the answer starts a second node: a divergence to flag.
    let mut edited = messages.clone();
    edited.last_mut().unwrap()["content"] = json!("It is rainy in Paris.");
    edited.push(json!({"role": "user", "content": "Sure?"}));
    let (status, _) = proxy
        .turn(
            &uuid,
            varied(ids(&tokenizer, "Yes.<|im_end|>")),
            json!({"messages": edited, "tools": tools}),
        )
        .await;
    assert_eq!(status, 200);
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 2);
    // The turn the page must show as it happens: it extends node 0.
    messages.push(json!({"role": "user", "content": "Thanks!"}));
    proxy
        .worker
        .push_sample(varied(ids(&tokenizer, "You're welcome.<|im_end|>")));
    let live = json!({"messages": messages, "tools": tools});

    let report = drive(&proxy, &uuid, "rollout", Some(live)).await;

    let tokens: Vec<u32> = serde_json::from_value(nodes[0]["tokens"].clone()).unwrap();
    let masked: Vec<i64> = serde_json::from_value(nodes[0]["masked_tokens"].clone()).unwrap();
    let logprobs: Vec<f64> = serde_json::from_value(nodes[0]["logprobs"].clone()).unwrap();
    let boxes = report["boxes"].as_array().unwrap();
    assert_eq!(boxes.len(), tokens.len(), "one box per token");
    let mut colour_of_class = std::collections::HashMap::new();
    for (at, b) in boxes.iter().enumerate() {
        assert_eq!(b["i"], json!(at));
        let classes = b["classes"].as_str().unwrap();
        let class = match masked[at] {
            -100 if tokenizer.is_special(tokens[at]) => "sp".to_string(),
            -100 => "p".to_string(),
            _ => heat(logprobs[at]),
        };
        assert!(
            classes.split(' ').any(|c| c == class),
            "token {at}: {classes}, want {class}"
        );
        let colour = b["background"].as_str().unwrap().to_string();
        let seen = colour_of_class
            .entry(class.clone())
            .or_insert(colour.clone());
        assert_eq!(*seen, colour, "class {class} has two colours");
    }
    assert_eq!(colour_of_class["p"], "rgb(255, 255, 255)");
    let mut colours: Vec<_> = colour_of_class.values().collect();
    let classes = colours.len();
    colours.sort();
    colours.dedup();
    assert_eq!(colours.len(), classes, "every class its own colour");
    assert!(
        classes >= 6,
        "the rollout spans the heat scale: {colour_of_class:?}"
    );
    // The boxes hold the node's text (newlines shown as ↵).
    let shown: String = boxes
        .iter()
        .map(|b| b["text"].as_str().unwrap().replace("↵\n", "\n"))
        .collect();
    assert_eq!(shown, tokenizer.decode(&tokens));

    let heads: Vec<&str> = report["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert_eq!(
        heads,
        ["system", "user", "assistant", "tool result", "assistant"]
    );
    assert_eq!(report["turn_headers"], 2);
    assert_eq!(
        report["calls"],
        json!([{"name": "get_weather", "healed": false, "tag": "call get_weather"}])
    );

    let hovered = report["hovered"]["i"].as_u64().unwrap() as usize;
    assert_ne!(masked[hovered], -100);
    let tip = report["hovered"]["tip"].as_str().unwrap();
    for fact in [
        format!("id {}", tokens[hovered]),
        format!("logprob {:.4}", logprobs[hovered]),
        format!("backend {}", proxy.worker.url),
        "message assistant · turn 0".to_string(),
    ] {
        assert!(tip.contains(&fact), "{tip:?} lacks {fact:?}");
    }

    assert_eq!(report["text_view"]["boxes"], 0);
    assert_eq!(report["text_view"]["text"], tokenizer.decode(&tokens));

    let second = &report["second_node"];
    let second_len = nodes[1]["tokens"].as_array().unwrap().len();
    assert_eq!(second["boxes"], second_len);
    let (_, divergences) = proxy.get(&format!("/{uuid}/divergences")).await;
    let position = &divergences["divergences"][0]["position"];
    assert_eq!(second["flagged"], json!([position]));
    let banner = second["banner"][0].as_str().unwrap();
    assert!(banner.contains("node 0"), "{banner}");

    let live = &report["live"];
    assert_eq!(live["status"], 200);
    let grown = proxy.nodes(&uuid).await[0]["tokens"]
        .as_array()
        .unwrap()
        .len();
    assert!(grown > tokens.len());
    assert_eq!(
        live["after"], grown,
        "the new turn appeared without a reload"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_64k_token_node_opens_in_the_viewer() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let prompt: String = (0..65_536).map(|i| ['a', 'b', ' ', 'c'][i % 4]).collect();
    let (status, _) = proxy
        .turn(
            &uuid,
            varied(chars("done")),
            json!({"messages": [{"role": "user", "content": prompt}]}),
        )
        .await;
    assert_eq!(status, 200);
    let tokens = proxy.nodes(&uuid).await[0]["tokens"]
        .as_array()
        .unwrap()
        .len();
    assert!(tokens > 65_536);
    let report = drive(&proxy, &uuid, "64k", None).await;
    assert_eq!(report["boxes"].as_array().unwrap().len(), tokens);
    let open_ms = report["open_ms"].as_u64().unwrap();
    eprintln!("a {tokens}-token node opened in {open_ms} ms");
    // A generous bound for a shared machine: the page must stay usable, not be fast here.
    assert!(open_ms < 15_000, "{open_ms} ms");
}

#[tokio::test]
async fn viewing_a_session_leaves_its_idle_time_alone() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let (status, _) = proxy.turn(&uuid, varied(chars("yes")), body).await;
    assert_eq!(status, 200);
    let last_used = || async {
        let (_, listed) = proxy.get("/sessions").await;
        listed["sessions"][0]["last_accessed"].as_f64().unwrap()
    };
    let tokens = proxy.nodes(&uuid).await[0]["tokens"].clone();
    let before = last_used().await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let (status, view) = proxy.get(&format!("/{uuid}/view")).await;
    assert_eq!(status, 200);
    assert_eq!(view["nodes"][0]["tokens"], tokens);
    assert_eq!(last_used().await, before, "a look is not a use");
    let (status, error) = proxy
        .get("/00000000-0000-4000-8000-000000000000/view")
        .await;
    assert_eq!(status, 404);
    common::assert_openai_error(&error);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_stands_as_a_thumbnail_where_its_run_is() {
    let proxy = Proxy::start(
        common::images::qwen2_vl_dir(),
        None,
        common::mock_worker::Wire::VllmGenerate,
    );
    proxy.worker.expand_images(vec![8]);
    let uuid = proxy.session(json!({})).await;
    let bytes = common::images::png(100, 60, 3);
    let url = common::images::data_url(&bytes, "image/png");
    proxy.worker.push_sample(varied(vec![9707, 151645]));
    let (status, reply) = proxy
        .chat(&uuid, json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is it?"}]}]}))
        .await;
    assert_eq!(status, 200, "{reply}");
    let report = drive(&proxy, &uuid, "image", None).await;
    let node = &proxy.nodes(&uuid).await[0];
    let image = &node["images"][0];
    assert_eq!(
        report["images"],
        json!([{"sha256": image["sha256"], "width": 100, "height": 60, "i": image["offset"]}])
    );
    let tokens = node["tokens"].as_array().unwrap().len();
    let length = image["length"].as_u64().unwrap() as usize;
    assert_eq!(
        report["boxes"].as_array().unwrap().len(),
        tokens - (length - 1),
        "the run is one box"
    );
}
