//! `GET /metrics`: Prometheus' text format, read back by `prometheus_client`'s own parser in
//! Python, counting what the turns did.

mod common;

use common::mock_worker::{Reply, Sample};
use common::{Proxy, chars, scratch_dir};
use serde_json::{Value, json};

/// Every sample of the scrape as `{"name{label=value,...}": value}`, by the Python parser;
/// `test` names the scratch folder (tests run at once).
fn parse_with_prometheus_client(text: &str, test: &str) -> Value {
    let dir = scratch_dir(&format!("metrics-scrape-{test}"));
    std::fs::write(dir.join("scrape.txt"), text).unwrap();
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
samples = {}
for family in text_string_to_metric_families(open(sys.argv[1]).read()):
    for s in family.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        samples[f"{s.name}{{{labels}}}"] = s.value
print(json.dumps(samples))
"#;
    // prometheus_client: scripts/test.sh installs it.
    let output = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(dir.join("scrape.txt"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[tokio::test]
async fn metrics_count_turns_tokens_stages_failures_and_backends() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let backend = proxy.worker.url.clone();
    let first = json!({"messages": [{"role": "user", "content": "hi"}]});
    let (status, reply) = proxy
        .turn(&uuid, Sample::stop(chars("hello")), first.clone())
        .await;
    assert_eq!(status, 200);
    let prompt_tokens = reply["usage"]["prompt_tokens"].as_u64().unwrap();
    // An edited history: a new node, counted as a divergence.
    let edited = json!({"messages": [{"role": "user", "content": "hi"},
        {"role": "assistant", "content": "something else"},
        {"role": "user", "content": "and?"}]});
    proxy.turn(&uuid, Sample::stop(chars("ok")), edited).await;
    proxy.worker.push(Reply::Error(400, "context too long"));
    let (status, _) = proxy.chat(&uuid, first).await;
    assert_eq!(status, 400);
    let response = reqwest::get(format!("{}/metrics", proxy.url))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let samples = parse_with_prometheus_client(&response.text().await.unwrap(), "turns");
    let at = |key: &str| samples.get(key).and_then(Value::as_f64).unwrap_or(-1.0);
    let turn = format!("api=chat.completions,backend={backend}");
    assert_eq!(
        at(&format!("rollout_turns_total{{{turn}}}")),
        2.0,
        "{samples}"
    );
    assert_eq!(
        at(&format!("rollout_tokens_total{{{turn},kind=sampled}}")),
        7.0
    );
    assert!(at(&format!("rollout_tokens_total{{{turn},kind=prompt}}")) > prompt_tokens as f64);
    assert_eq!(
        at("rollout_node_divergences_total{reason=unmatched_assistant_message}"),
        1.0,
        "{samples}"
    );
    assert_eq!(
        at("rollout_turn_failures_total{api=chat.completions,cause=backend}"),
        1.0
    );
    for stage in [
        "parse", "plan", "render", "tokenize", "queue", "backend", "commit", "turn",
    ] {
        assert!(
            at(&format!("rollout_stage_seconds_count{{stage={stage}}}")) >= 2.0,
            "{stage}: {samples}"
        );
    }
    let of_backend = format!("{{backend={backend}}}");
    assert_eq!(at(&format!("rollout_backend_healthy{of_backend}")), 1.0);
    assert_eq!(
        at(&format!("rollout_backend_requests_total{of_backend}")),
        3.0
    );
    assert_eq!(
        at(&format!("rollout_backend_errors_total{of_backend}")),
        1.0
    );
    assert_eq!(at("rollout_sessions{}"), 1.0);
    assert_eq!(at("rollout_paused{}"), 0.0);
}

#[tokio::test]
async fn a_turns_log_lines_carry_its_session_and_api() {
    use common::mock_worker::{MockWorker, Wire};
    use common::{KillOnDrop, char_model_dir, free_port, wait_for_health};
    let worker = MockWorker::start(Wire::Sglang);
    worker.push_sample(Sample::stop(chars("logged")));
    let port = free_port();
    // The proxy logs to standard output.
    let log = scratch_dir("metrics-log").join("stdout.log");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_rollout-proxy"))
        .args(["serve", "--port", &port.to_string(), "--workers", "1"])
        .arg("--tokenizer")
        .arg(char_model_dir())
        .args(["--backend", &worker.url, "--backend-type", "sglang"])
        .env("RUST_LOG", "rollout_proxy=debug")
        .env("NO_COLOR", "1")
        .stdout(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let server = KillOnDrop(child);
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    wait_for_health(&client, &base).await;
    let created = common::post_json(&client, &format!("{base}/sessions/create"), &json!({})).await;
    let uuid = created["uuid"].as_str().unwrap().to_string();
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let turn = format!("{base}/{uuid}/v1/chat/completions");
    common::post_json(&client, &turn, &body).await;
    // The next turn fails at the backend.
    worker.push(Reply::Error(400, "context too long"));
    let refused = client.post(&turn).json(&body).send().await.unwrap();
    assert_eq!(refused.status(), 400);
    drop(server);
    let text = std::fs::read_to_string(&log).unwrap();
    let recorded = text
        .lines()
        .find(|l| l.contains("turn recorded"))
        .unwrap_or_else(|| panic!("no turn line in:\n{text}"));
    assert!(
        recorded.contains(&format!("turn{{session={uuid} api=\"chat.completions\"}}")),
        "{recorded}"
    );
    assert!(recorded.contains("sampled=6"), "{recorded}");
    let failed = text
        .lines()
        .find(|l| l.contains("turn failed"))
        .unwrap_or_else(|| panic!("no failure line in:\n{text}"));
    assert!(failed.contains(&format!("session={uuid}")), "{failed}");
    assert!(failed.contains("cause=\"backend\""), "{failed}");
}

#[tokio::test]
async fn tool_call_outcomes_are_counted_per_format() {
    let proxy = Proxy::atropos();
    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    let call = |name: &str| format!("<tool_call>{{\"name\": \"{name}\", \"arguments\": {{}}}}");
    for (text, stream) in [
        // Read as written, streamed and not.
        (format!("{}</tool_call>", call("f")), false),
        (format!("{}</tool_call>", call("f")), true),
        // The closing tag never came: healed.
        (call("f"), true),
        // Not a declared tool: left in the content.
        (format!("{}</tool_call>", call("g")), false),
    ] {
        let uuid = proxy.session(json!({})).await;
        proxy.worker.push_sample(Sample::stop(chars(&text)));
        let body = json!({"messages": [{"role": "user", "content": "go"}], "tools": tools,
            "stream": stream});
        let status = match stream {
            true => proxy.chat_stream(&uuid, body).await.0,
            false => proxy.chat(&uuid, body).await.0,
        };
        assert_eq!(status, 200);
    }
    let text = proxy.metrics_text().await;
    let samples = parse_with_prometheus_client(&text, "tool-calls");
    for (outcome, count) in [("promoted", 2.0), ("healed", 1.0), ("left_as_text", 1.0)] {
        let key = format!("rollout_tool_calls_total{{outcome={outcome},parser=hermes}}");
        assert_eq!(samples[&key].as_f64(), Some(count), "{key}: {samples}");
    }
}
