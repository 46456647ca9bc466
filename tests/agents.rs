//! The real clients, end to end: Claude Code (`claude -p`) and Codex CLI (`codex exec`) from
//! npm, and the official `anthropic` and `openai` Python SDKs, each pointed at a session URL
//! and completing a task that needs a tool call, against a scripted upstream that writes
//! Qwen3's tool format. Every node's sampled ids must be exactly the upstream's.
//!
//! The clients are installed (pinned, cached outside the clone) by `scripts/install-agents.sh`,
//! which `scripts/test.sh` runs; `CLAUDE_BIN`, `CODEX_BIN` and `CLIENTS_PYTHON` name them.

mod common;

use common::mock_worker::{MockWorker, Sample, Wire};
use common::{Proxy, assert_node_shape, fixture_model, scratch_dir};
use rollout_proxy::tokenizer::Tokenizer;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

/// Paths of the installed clients.
struct Clients {
    claude: PathBuf,
    codex: PathBuf,
    python: PathBuf,
}

/// The clients named by the environment, else installed (or found) by the script.
fn clients() -> Clients {
    let names = ["CLAUDE_BIN", "CODEX_BIN", "CLIENTS_PYTHON"];
    let mut paths = common::installed("install-agents.sh", &names).into_iter();
    Clients {
        claude: paths.next().unwrap(),
        codex: paths.next().unwrap(),
        python: paths.next().unwrap(),
    }
}

/// Every prompt the upstream was sent, with the ids it sampled for it.
type Log = Arc<Mutex<Vec<(Vec<u32>, Vec<u32>)>>>;

/// A proxy (Qwen3's tokenizer and template) before an upstream playing an agent's model: it
/// calls the tool the request declares (`call` picks the call from the prompt's text), and
/// once the prompt ends with the tool's result, answers with what the result said.
fn proxy_with_model(call: impl Fn(&str) -> String + Send + Sync + 'static) -> (Proxy, Log) {
    proxy_with_script(move |text| {
        let last_user = text.rsplit("<|im_start|>user").next().unwrap_or("");
        match last_user.split_once("<tool_response>") {
            Some((_, result)) => {
                let secret = result
                    .split("secret word is ")
                    .nth(1)
                    .and_then(|rest| rest.split_whitespace().next())
                    .unwrap_or("unknown");
                format!("The secret word is {secret}.<|im_end|>")
            }
            None => format!(
                "Let me check.\n<tool_call>\n{}\n</tool_call><|im_end|>",
                call(text)
            ),
        }
    })
}

/// A proxy (Qwen3's tokenizer and template) before an upstream whose every reply `reply`
/// writes from the prompt's text.
fn proxy_with_script(reply: impl Fn(&str) -> String + Send + Sync + 'static) -> (Proxy, Log) {
    let tok = Arc::new(Tokenizer::from_path(&fixture_model("qwen3")).unwrap());
    let log: Log = Default::default();
    let worker = MockWorker::start(Wire::Sglang);
    let (seen, tokenizer) = (log.clone(), tok.clone());
    worker.respond_with(Arc::new(move |prompt: &[u32]| {
        let ids = tokenizer.encode(&reply(&tokenizer.decode(prompt))).unwrap();
        seen.lock().unwrap().push((prompt.to_vec(), ids.clone()));
        Sample::stop(ids)
    }));
    (
        Proxy::start_with(fixture_model("qwen3"), None, worker, |_| {}),
        log,
    )
}

/// Each turn of `node` sampled exactly the ids the upstream returned for that turn's prompt.
fn assert_sampled_by_upstream(node: &Value, log: &Log) {
    assert_node_shape(node);
    let tokens: Vec<u32> = serde_json::from_value(node["tokens"].clone()).unwrap();
    let log = log.lock().unwrap();
    for turn in node["metadata"]["turns"].as_array().unwrap() {
        let start = turn["completion_start"].as_u64().unwrap() as usize;
        let len = turn["completion_tokens"].as_u64().unwrap() as usize;
        let (_, sampled) = log
            .iter()
            .find(|(prompt, _)| prompt.as_slice() == &tokens[..start])
            .expect("every turn's prompt is one the upstream was sent, id for id");
        assert_eq!(&tokens[start..start + len], sampled.as_slice());
    }
}

/// Runs `command` in `dir` with only `env` (and PATH) set; its stdout, after checking it
/// succeeded.
fn run(mut command: Command, dir: &Path, env: &[(&str, String)]) -> String {
    command
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(std::process::Stdio::null());
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("start the agent");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{:?} failed\nstdout: {stdout}\nstderr: {}",
        command.get_program(),
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Runs `claude -p task` in `dir`'s workspace against `base_url` (a session's), with at most
/// `max_turns` turns and the tools `allowed`; its stdout.
fn run_claude(
    clients: &Clients,
    dir: &Path,
    base_url: &str,
    task: &str,
    (max_turns, allowed): (&str, &str),
) -> String {
    let mut claude = Command::new(&clients.claude);
    claude.args([
        "-p",
        task,
        "--max-turns",
        max_turns,
        "--allowedTools",
        allowed,
    ]);
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    run(
        claude,
        &dir.join("work"),
        &[
            ("HOME", home.display().to_string()),
            ("ANTHROPIC_BASE_URL", base_url.to_string()),
            ("ANTHROPIC_API_KEY", "test".into()),
            ("DISABLE_TELEMETRY", "1".into()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
        ],
    )
}

/// A scratch folder holding `notes.txt` with the secret.
fn workspace(name: &str) -> PathBuf {
    let dir = scratch_dir(name);
    std::fs::create_dir_all(dir.join("work")).unwrap();
    std::fs::write(dir.join("work/notes.txt"), "The secret word is PAPAYA\n").unwrap();
    dir
}

#[tokio::test]
async fn claude_code_completes_a_tool_task_in_one_node() {
    let clients = clients();
    let dir = workspace("agents-claude");
    let notes = dir.join("work/notes.txt");
    let (proxy, log) = proxy_with_model(move |_| {
        json!({"name": "Read", "arguments": {"file_path": notes}}).to_string()
    });
    let uuid = proxy.session(json!({})).await;
    let task = "What is the secret word in notes.txt? Use the Read tool.";
    let stdout = run_claude(
        &clients,
        &dir,
        &format!("{}/{uuid}", proxy.url),
        task,
        ("4", "Read"),
    );
    assert!(stdout.contains("PAPAYA"), "{stdout}");
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1, "the main conversation is one node");
    assert_eq!(nodes[0]["metadata"]["num_turns"], 2);
    assert_eq!(nodes[0]["metadata"]["turns"][0]["api"], "messages");
    assert_sampled_by_upstream(&nodes[0], &log);
}

/// Claude Code hands its `Edit` calls back with the schema's default `"replace_all": false`
/// filled in: the rollout stays one node, and the turn after says so.
#[tokio::test]
async fn claude_codes_edit_comes_back_with_its_default_and_stays_one_node() {
    let clients = clients();
    let dir = workspace("agents-claude-edit");
    let notes = dir.join("work/notes.txt");
    let file = notes.display().to_string();
    let (proxy, log) = proxy_with_script(move |text| {
        let last_user = text.rsplit("<|im_start|>user").next().unwrap_or("");
        let call = |name: &str, arguments: Value| {
            let call = json!({"name": name, "arguments": arguments});
            format!("<tool_call>\n{call}\n</tool_call><|im_end|>")
        };
        match last_user.split_once("<tool_response>") {
            None => call("Read", json!({"file_path": file})),
            Some((_, result)) if result.contains("PAPAYA") => call(
                "Edit",
                json!({"file_path": file, "old_string": "PAPAYA", "new_string": "MANGO"}),
            ),
            Some(_) => "Done: the secret word is now MANGO.<|im_end|>".into(),
        }
    });
    let uuid = proxy.session(json!({})).await;
    let task = "Replace the secret word in notes.txt with MANGO. Read it, then Edit it.";
    let base_url = format!("{}/{uuid}", proxy.url);
    let stdout = run_claude(&clients, &dir, &base_url, task, ("6", "Read,Edit"));
    assert!(stdout.contains("MANGO"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(&notes).unwrap(),
        "The secret word is MANGO\n"
    );
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(
        nodes.len(),
        1,
        "one node: {:?}",
        nodes.get(1).map(|n| &n["metadata"]["divergence"])
    );
    let turns = &nodes[0]["metadata"]["turns"];
    assert_eq!(turns.as_array().unwrap().len(), 3, "{turns}");
    let edit_echo = &turns[2]["echoed_calls"][0];
    assert_eq!(edit_echo["change"], "defaults", "{turns}");
    assert_eq!(edit_echo["keys"], json!(["+replace_all"]));
    assert_sampled_by_upstream(&nodes[0], &log);
}

#[tokio::test]
async fn codex_completes_a_tool_task_in_one_node() {
    let clients = clients();
    let dir = workspace("agents-codex");
    let (proxy, log) = proxy_with_model(|_| {
        json!({"name": "exec_command", "arguments": {"cmd": "cat notes.txt"}}).to_string()
    });
    let uuid = proxy.session(json!({})).await;
    let codex_home = dir.join("codex-home");
    std::fs::create_dir_all(&codex_home).unwrap();
    let config = format!(
        "model = \"local-model\"\nmodel_provider = \"proxy\"\n\n[model_providers.proxy]\n\
         name = \"rollout-proxy\"\nbase_url = \"{}/{uuid}/v1\"\nwire_api = \"responses\"\n\
         env_key = \"PROXY_API_KEY\"\nrequest_max_retries = 0\nstream_max_retries = 0\n",
        proxy.url
    );
    std::fs::write(codex_home.join("config.toml"), config).unwrap();
    let mut codex = Command::new(&clients.codex);
    codex.args([
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "What is the secret word in notes.txt?",
    ]);
    let stdout = run(
        codex,
        &dir.join("work"),
        &[
            ("HOME", codex_home.display().to_string()),
            ("CODEX_HOME", codex_home.display().to_string()),
            ("PROXY_API_KEY", "sk-test".into()),
        ],
    );
    assert!(stdout.contains("PAPAYA"), "{stdout}");
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1, "the main conversation is one node");
    assert_eq!(nodes[0]["metadata"]["num_turns"], 2);
    let turn = &nodes[0]["metadata"]["turns"][0];
    assert_eq!(turn["api"], "responses");
    assert_eq!(turn["tools_left_out"], json!(["web_search"]));
    assert_sampled_by_upstream(&nodes[0], &log);
}

/// Runs `tests/clients/{script}` against the proxy: the session of each scenario it ran.
fn python_scenarios(python: &Path, script: &str, proxy: &Proxy) -> Vec<(String, String)> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(script);
    let output = Command::new(python)
        .arg(script)
        .arg(&proxy.url)
        .output()
        .expect("run the client script");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let sessions: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    sessions
        .as_object()
        .unwrap()
        .iter()
        .map(|(scenario, uuid)| (scenario.clone(), uuid.as_str().unwrap().to_string()))
        .collect()
}

#[tokio::test]
async fn the_python_sdks_run_tool_loops_one_node_each() {
    let clients = clients();
    let (proxy, log) = proxy_with_model(|_| {
        json!({"name": "lookup", "arguments": {"query": "secret"}}).to_string()
    });
    let sessions = python_scenarios(&clients.python, "sdk_tool_loops.py", &proxy);
    assert_eq!(sessions.len(), 4, "{sessions:?}");
    for (scenario, uuid) in sessions {
        let nodes = proxy.nodes(&uuid).await;
        assert_eq!(nodes.len(), 1, "{scenario}: one node");
        assert_eq!(nodes[0]["metadata"]["num_turns"], 2, "{scenario}");
        assert_sampled_by_upstream(&nodes[0], &log);
    }
}

/// LangChain, LangGraph, the Agents SDK and the OpenAI SDK's ways of handing a call back (see
/// `tests/echoes.rs` for each habit's exact shape): every rollout one node, and the calls
/// LangChain re-serialises recorded as such.
#[tokio::test]
async fn agent_frameworks_hand_calls_back_their_way_and_stay_one_node() {
    let clients = clients();
    let (proxy, log) = proxy_with_model(|_| {
        json!({"name": "lookup", "arguments": {"query": "secret"}}).to_string()
    });
    let sessions = python_scenarios(&clients.python, "framework_loops.py", &proxy);
    assert_eq!(sessions.len(), 8, "{sessions:?}");
    for (scenario, uuid) in sessions {
        let nodes = proxy.nodes(&uuid).await;
        assert_eq!(
            nodes.len(),
            1,
            "{scenario}: {:?}",
            nodes.get(1).map(|n| &n["metadata"]["divergence"])
        );
        let turns = &nodes[0]["metadata"]["turns"];
        assert_eq!(turns.as_array().unwrap().len(), 2, "{scenario}");
        // LangChain writes the arguments with `json.dumps`: `{"query": "secret"}`.
        let changes: Vec<&str> = turns[1]["echoed_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|change| change["change"].as_str().unwrap())
            .collect();
        let expected: &[&str] = match scenario.as_str() {
            "langchain chat" | "langgraph create_agent" => &["formatting"],
            _ => &[],
        };
        assert_eq!(changes, expected, "{scenario}: {turns}");
        assert_sampled_by_upstream(&nodes[0], &log);
    }
}

/// A streamed Responses reply in every order of items (reasoning then text, reasoning then a
/// call, text then a call, two calls), read by the openai SDK's own stream accumulator: each
/// item at the next index, every event of an item at its index (a message after reasoning
/// used to be announced at the reasoning's index, which the SDK refuses and LangGraph filed
/// under the reasoning item), and each rollout one node.
#[tokio::test]
async fn the_openai_sdk_reads_every_order_of_streamed_items() {
    let clients = clients();
    let call = |query: &str| {
        let call = json!({"name": "lookup", "arguments": {"query": query}});
        format!("<tool_call>\n{call}\n</tool_call>")
    };
    let (proxy, log) = proxy_with_script(move |text| {
        let asked = text.rsplit("order: ").next().unwrap_or("");
        let order: String = asked
            .chars()
            .take_while(|c| c.is_ascii_alphabetic() || *c == '-')
            .collect();
        let items = match order.as_str() {
            "reasoning-text" => "<think>\nTwo and two.\n</think>\n\nIt is 4.".to_string(),
            "reasoning-call" => format!("<think>\nI should look.\n</think>\n\n{}", call("a")),
            "text-call" => format!("Let me check.\n{}", call("a")),
            _ => format!("{}\n{}", call("a"), call("b")),
        };
        format!("{items}<|im_end|>")
    });
    let sessions = python_scenarios(&clients.python, "responses_item_orders.py", &proxy);
    assert_eq!(sessions.len(), 4, "{sessions:?}");
    for (order, uuid) in sessions {
        let nodes = proxy.nodes(&uuid).await;
        assert_eq!(nodes.len(), 1, "{order}");
        assert_sampled_by_upstream(&nodes[0], &log);
    }
}
