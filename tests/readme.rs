//! The README's walk-through, run as written: its bash block (only the port changed) against
//! `rollout-proxy serve` on the default model, and what each step prints.

mod common;

use common::{KillOnDrop, fixture_model, free_port, scratch_dir, wait_for_health};
use serde_json::{Value, json};
use std::process::{Command, Stdio};

/// The first bash block after `heading` in `readme`.
fn bash_block_after<'r>(readme: &'r str, heading: &str) -> &'r str {
    let section = &readme[readme.find(heading).expect("the heading is in the README")..];
    let start = section.find("```bash\n").expect("a bash block") + "```bash\n".len();
    let block = &section[start..];
    &block[..block.find("```").expect("the block ends")]
}

#[tokio::test]
async fn the_readme_walk_through_runs_as_written() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let block = bash_block_after(&readme, "### Walk-through");
    let port = free_port();
    let script = block.replace(
        "P=http://127.0.0.1:9000",
        &format!("P=http://127.0.0.1:{port}"),
    );
    assert_ne!(
        script, block,
        "the walk-through names the proxy's address in P"
    );

    // `scripts/serve.sh` with its defaults; the default model is where
    // `scripts/fetch-fixtures.sh` put it, which is where serve looks for it.
    let gguf = std::fs::canonicalize(fixture_model("smollm2").join("model.gguf")).unwrap();
    let _server = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_rollout-proxy"))
            .args(["serve", "--port", &port.to_string()])
            .env("ROLLOUT_PROXY_CACHE", gguf.parent().unwrap())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://127.0.0.1:{port}");
    wait_for_health(&reqwest::Client::new(), &base).await;

    let work = scratch_dir("readme-walk-through");
    let output = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(&work)
        .output()
        .unwrap();
    let printed = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{printed}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 3, "{printed}");

    // Turn 1 is a tool call, exactly as the README shows it.
    assert!(
        lines[0].contains(
            "'tool_calls': [{'id': 'call_0', 'type': 'function', 'function': \
             {'name': 'get_weather', 'arguments': '{\"city\": \"Paris\"}'}}]"
        ),
        "{printed}"
    );
    assert!(
        block.contains(&format!("# {}\n", lines[0])),
        "the README shows {}",
        lines[0]
    );
    // Turn 2 answers in text (its words may differ by CPU; the README says so).
    assert!(
        lines[1].starts_with("{'role': 'assistant', 'content': '")
            && !lines[1].contains("tool_calls"),
        "{printed}"
    );
    // One node holding both turns.
    let counts: Vec<usize> = lines[2]
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    assert!(
        lines[2].starts_with("1 node, 2 turns, ") && counts.len() == 4 && counts[3] < counts[2],
        "{printed}"
    );

    // Why it holds on other CPUs: the grammar fixes the call's markup, name and keys; at the
    // one free word, the city, the model's first choice leads its second by far more than
    // llama.cpp's arithmetic moves logprobs between machines, thread counts and batch shapes
    // (tenths of a nat). The first turn again, on a new session:
    let client = reqwest::Client::new();
    let mut first_turn: Value =
        serde_json::from_str(&std::fs::read_to_string(work.join("turn.json")).unwrap()).unwrap();
    let messages = first_turn["messages"].as_array_mut().unwrap();
    messages.truncate(messages.len() - 2);
    first_turn["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
    first_turn["logprobs"] = json!(true);
    first_turn["top_logprobs"] = json!(2);
    let created = common::post_json(&client, &format!("{base}/sessions/create"), &json!({})).await;
    let uuid = created["uuid"].as_str().unwrap();
    let reply = common::post_json(
        &client,
        &format!("{base}/{uuid}/v1/chat/completions"),
        &first_turn,
    )
    .await;
    let city = reply["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|token| token["token"].as_str().unwrap().contains("Paris"))
        .unwrap_or_else(|| panic!("no token of the city: {reply}"));
    let mut top: Vec<f64> = city["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["logprob"].as_f64().unwrap())
        .collect();
    top.sort_by(|a, b| b.total_cmp(a));
    let margin = top[0] - top[1];
    assert!(
        city["logprob"].as_f64() == Some(top[0]) && margin > 2.0,
        "the city's lead is {margin} nats: {reply}"
    );
}
