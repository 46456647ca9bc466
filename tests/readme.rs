//! The README's walk-through, run as written: its bash block (only the port changed) against
//! `rollout-proxy serve` on the default model, and what each step prints.

mod common;

use common::{KillOnDrop, fixture_model, free_port, scratch_dir, wait_for_health};
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

    let output = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(scratch_dir("readme-walk-through"))
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
}
