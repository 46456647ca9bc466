//! Rendering only the end of a conversation: over a long tool-calling rollout every prompt the
//! proxy sends is the one a full render gives (`/render` renders in full), checked against a
//! full render on the first tail-only turn and every sixteenth after; a template whose text
//! after a turn depends on the whole conversation is caught there, the full prompt is sent and
//! every later turn renders in full; and `check-template` refuses tail renders to a template
//! its shapes prove non-local.

mod common;

use common::mock_worker::{MockWorker, Sample, Wire};
use common::{KillOnDrop, Proxy, fixture_model, free_port, scratch_dir};
use rollout_proxy::tokenizer::Tokenizer;
use serde_json::{Value, json};
use std::path::Path;

/// The counts of `rollout_tail_renders_total` by outcome.
async fn tail_renders(proxy: &Proxy) -> (u64, u64, u64) {
    let text = proxy.metrics_text().await;
    let count = |outcome: &str| {
        text.lines()
            .find_map(|line| {
                line.strip_prefix(&format!(
                    "rollout_tail_renders_total{{outcome=\"{outcome}\"}} "
                ))
            })
            .map_or(0, |n| n.trim().parse().unwrap())
    };
    (count("used"), count("verified"), count("mismatch"))
}

/// Runs `turns` turns on one session (a tool call and its result every third turn), each
/// turn's prompt compared with a full render of the same request; returns the session.
async fn rollout(proxy: &Proxy, tokenizer: &Tokenizer, turns: usize) -> String {
    let uuid = proxy.session(json!({})).await;
    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    go_on(proxy, tokenizer, &uuid, &mut messages, 0..turns).await;
    uuid
}

/// Turns `turns` of a rollout on `uuid` whose conversation so far is `messages`.
async fn go_on(
    proxy: &Proxy,
    tokenizer: &Tokenizer,
    uuid: &str,
    messages: &mut Vec<Value>,
    turns: std::ops::Range<usize>,
) {
    let tools = json!([{"type": "function", "function": {"name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]);
    for turn in turns {
        let last_is_tool = messages.last().is_some_and(|m| m["role"] == "tool");
        if !last_is_tool {
            messages.push(json!({"role": "user", "content": format!("question {turn}")}));
        }
        let body = json!({"messages": messages, "tools": tools});
        let full = proxy.render(uuid, body.clone()).await;
        let calls = turn % 3 == 1;
        let text = match calls {
            true => format!(
                "<tool_call>\n{{\"name\": \"lookup\", \"arguments\": {{\"q\": \"{turn}\"}}}}\n</tool_call><|im_end|>"
            ),
            false => format!("answer {turn}<|im_end|>"),
        };
        let (status, reply) = proxy
            .turn(uuid, Sample::stop(tokenizer.encode(&text).unwrap()), body)
            .await;
        assert_eq!(status, 200, "{reply}");
        let sent = proxy.worker.last_prompt();
        let rendered: Vec<u32> = serde_json::from_value(full["token_ids"].clone()).unwrap();
        assert_eq!(
            sent, rendered,
            "turn {turn}: the prompt sent is not the full render's"
        );
        let message = reply["choices"][0]["message"].clone();
        messages.push(message.clone());
        if calls {
            let id = message["tool_calls"][0]["id"].clone();
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": "found"}));
        }
    }
}

#[tokio::test]
async fn a_long_rollout_sends_what_a_full_render_gives() {
    let (tokenizer, proxy) = common::qwen3_proxy();
    let uuid = rollout(&proxy, &tokenizer, 40).await;
    assert_eq!(proxy.nodes(&uuid).await.len(), 1, "one node");
    let (used, verified, mismatch) = tail_renders(&proxy).await;
    // Turn 1 has nothing sampled before it; the first tail turn and every 16th are verified.
    assert_eq!((used + verified, mismatch), (39, 0));
    assert_eq!(verified, 3);
}

/// A verified tail render that kept every message (a short rollout's second turn) is the full
/// render: the conversation is rendered once, not twice.
#[tokio::test]
async fn a_tail_render_of_the_whole_conversation_is_verified_without_a_second_render() {
    let (tokenizer, proxy) = common::qwen3_proxy();
    let renders = |text: String| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with("rollout_stage_seconds_count{stage=\"render\"}"))
            .unwrap_or("x 0")
            .to_string();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let before = renders(proxy.metrics_text().await);
    let uuid = proxy.session(json!({})).await;
    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    go_on(&proxy, &tokenizer, &uuid, &mut messages, 0..3).await;
    let (used, verified, mismatch) = tail_renders(&proxy).await;
    assert_eq!((used, verified, mismatch), (1, 1, 0));
    // `go_on` asks `/render` for every turn's full render: three of those, one render per turn.
    assert_eq!(renders(proxy.metrics_text().await) - before, 3 + 3);
}

/// The conversation each turn was sampled after is journaled with it: a proxy restarted on
/// its data directory renders only the end of a conversation from its first turn on.
#[tokio::test]
async fn a_restarted_proxy_renders_only_the_end_from_its_first_turn() {
    let dir = scratch_dir("tail-render-restart");
    let tokenizer = Tokenizer::from_path(&fixture_model("qwen3")).unwrap();
    let worker = MockWorker::start(Wire::Sglang);
    let serve = |port: u16| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rollout-proxy"));
        command
            .args(["serve", "--port", &port.to_string(), "--workers", "1"])
            .arg("--tokenizer")
            .arg(fixture_model("qwen3"))
            .args(["--backend", &worker.url, "--backend-type", "sglang"])
            .arg("--data-dir")
            .arg(&dir)
            .stdout(std::process::Stdio::null());
        KillOnDrop(command.spawn().unwrap())
    };
    let port = free_port();
    let first = serve(port);
    let proxy = Proxy::attach(format!("http://127.0.0.1:{port}"), worker.clone()).await;
    let uuid = proxy.session(json!({})).await;
    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    go_on(&proxy, &tokenizer, &uuid, &mut messages, 0..3).await;
    drop(first);

    let port = free_port();
    let _second = serve(port);
    let proxy = Proxy::attach(format!("http://127.0.0.1:{port}"), worker).await;
    go_on(&proxy, &tokenizer, &uuid, &mut messages, 3..5).await;
    let (used, verified, mismatch) = tail_renders(&proxy).await;
    assert_eq!(
        (used, verified, mismatch),
        (1, 1, 0),
        "both turns after the restart rendered only the end (the first checked)"
    );
}

#[tokio::test]
async fn a_disagreeing_tail_render_is_caught_and_turns_render_in_full_after() {
    // ChatML that writes a marker into the generation prompt once a conversation is long: the
    // shapes are short, so start-up proves tail renders; the rollout's 17th tail turn, a check,
    // is where it first shows.
    let template = scratch_dir("tail-render-long").join("long.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|im_start|>assistant\n\
         {% if messages|length > 34 %}(long) {% endif %}{% endif %}",
    )
    .unwrap();
    let tokenizer = Tokenizer::from_path(&fixture_model("qwen3")).unwrap();
    let proxy = Proxy::start(fixture_model("qwen3"), template.to_str(), Wire::Sglang);
    let uuid = proxy.session(json!({})).await;
    let mut messages: Vec<Value> = Vec::new();
    for turn in 0..20 {
        messages.push(json!({"role": "user", "content": format!("q{turn}")}));
        let body = json!({"messages": messages});
        let full = proxy.render(&uuid, body.clone()).await;
        let text = format!("a{turn}<|im_end|>");
        let (status, reply) = proxy
            .turn(&uuid, Sample::stop(tokenizer.encode(&text).unwrap()), body)
            .await;
        assert_eq!(status, 200, "{reply}");
        let rendered: Vec<u32> = serde_json::from_value(full["token_ids"].clone()).unwrap();
        assert_eq!(proxy.worker.last_prompt(), rendered, "turn {turn}");
        messages.push(reply["choices"][0]["message"].clone());
    }
    // Turns 2..17 rendered their end (the first checked), turn 18 (35 messages) was the next
    // check and disagreed; turns 19 and 20 rendered in full.
    assert_eq!(tail_renders(&proxy).await, (15, 1, 1));
}

#[test]
fn check_template_refuses_tail_renders_to_a_template_that_needs_the_whole_conversation() {
    let template = scratch_dir("tail-render-count").join("count.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|im_start|>assistant\n{{ messages|length }} {% endif %}",
    )
    .unwrap();
    let report = rollout_proxy::checker::check_model(
        &fixture_model("qwen3"),
        template.to_str(),
        None::<&Path>,
    )
    .unwrap();
    assert!(!report.tail_renders);
    assert!(
        report.table().contains("tail render off"),
        "{}",
        report.table()
    );
    let local = rollout_proxy::checker::check_model(&fixture_model("qwen3"), None, None).unwrap();
    assert!(local.tail_renders);
}
