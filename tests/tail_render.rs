//! Rendering only the end of a conversation: over a long tool-calling rollout every prompt the
//! proxy sends is the one a full render gives (`/render` renders in full), checked against a
//! full render on the first tail-only turn and every sixteenth after; a template whose text
//! after a turn depends on the whole conversation is caught there, the full prompt is sent and
//! every later turn renders in full; and `check-template` refuses tail renders to a template
//! its shapes prove non-local.

mod common;

use common::mock_worker::{Sample, Wire};
use common::{Proxy, fixture_model, scratch_dir};
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
    let tools = json!([{"type": "function", "function": {"name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]);
    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    for turn in 0..turns {
        let last_is_tool = messages.last().is_some_and(|m| m["role"] == "tool");
        if !last_is_tool {
            messages.push(json!({"role": "user", "content": format!("question {turn}")}));
        }
        let body = json!({"messages": messages, "tools": tools});
        let full = proxy.render(&uuid, body.clone()).await;
        let calls = turn % 3 == 1;
        let text = match calls {
            true => format!(
                "<tool_call>\n{{\"name\": \"lookup\", \"arguments\": {{\"q\": \"{turn}\"}}}}\n</tool_call><|im_end|>"
            ),
            false => format!("answer {turn}<|im_end|>"),
        };
        let (status, reply) = proxy
            .turn(&uuid, Sample::stop(tokenizer.encode(&text).unwrap()), body)
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
    uuid
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
