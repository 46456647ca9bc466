//! Every tool-call format through our HTTP API, both directions: the model's text becomes
//! `tool_calls` (streamed and not), ids are `call_0, call_1, …` across the session, and calls
//! the proxy never produced reach the model in its own format.

mod common;

use common::mock_worker::Sample;
use common::{Proxy, char_model_dir, chars};
use serde_json::{Value, json};

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "Bash", "parameters": {"type": "object",
            "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
        {"type": "function", "function": {"name": "Read", "parameters": {}}},
    ])
}

fn user(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}], "tools": tools()})
}

/// `(session tool_parser, what the model wrote)`: one `Bash {"command": "ls -la"}` call after
/// the text "Running.\n", in every format.
const FORMATS: &[(&str, &str)] = &[
    (
        "hermes",
        "Running.\n<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls -la\"}}\n</tool_call>",
    ),
    (
        "qwen3_coder",
        "Running.\n<tool_call>\n<function=Bash>\n<parameter=command>\nls -la\n</parameter>\n</function>\n</tool_call>",
    ),
    (
        "mistral",
        "Running.\n[TOOL_CALLS][{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls -la\"}}]",
    ),
    (
        "mistral",
        "Running.\n[TOOL_CALLS]Bash[CALL_ID]a1b2c3d4e[ARGS]{\"command\": \"ls -la\"}",
    ),
    (
        "llama3_json",
        "Running.\n<|python_tag|>{\"name\": \"Bash\", \"parameters\": {\"command\": \"ls -la\"}}",
    ),
    (
        "llama3_json",
        "Running.\n{\"name\": \"Bash\", \"parameters\": {\"command\": \"ls -la\"}}",
    ),
    ("pythonic", "Running.\n[Bash(command='ls -la')]"),
    (
        "pythonic",
        "Running.\n<|python_start|>[Bash(command=\"ls -la\")]<|python_end|>",
    ),
    (
        "gemma4",
        "Running.\n<|tool_call>call:Bash{command:<|\"|>ls -la<|\"|>}<tool_call|>",
    ),
    (
        "deepseek_v3",
        "Running.\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>Bash\n```json\n{\"command\": \"ls -la\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ),
    (
        "deepseek_v3",
        "Running.\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>Bash<｜tool▁sep｜>{\"command\": \"ls -la\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ),
    (
        "auto",
        "Running.\n<|tool_call>call:Bash{command:<|\"|>ls -la<|\"|>}<tool_call|>",
    ),
    (
        "auto",
        "Running.\n<｜tool▁call▁begin｜>Bash<｜tool▁sep｜>{\"command\": \"ls -la\"}<｜tool▁call▁end｜>",
    ),
];

fn call_of(call: &Value) -> (String, Value) {
    let arguments = call["function"]["arguments"].as_str().unwrap();
    (
        call["function"]["name"].as_str().unwrap().to_string(),
        serde_json::from_str(arguments).unwrap(),
    )
}

#[tokio::test]
async fn every_format_becomes_tool_calls_streamed_and_not() {
    let proxy = Proxy::atropos();
    let expected = vec![("Bash".to_string(), json!({"command": "ls -la"}))];
    for (parser, output) in FORMATS {
        let uuid = proxy.session(json!({"tool_parser": parser})).await;
        let (status, data) = proxy
            .turn(&uuid, Sample::stop(chars(output)), user("go"))
            .await;
        assert_eq!(status, 200, "{data}");
        let message = &data["choices"][0]["message"];
        let calls: Vec<_> = message["tool_calls"]
            .as_array()
            .unwrap_or_else(|| panic!("{parser}: no calls in {data}"))
            .iter()
            .map(call_of)
            .collect();
        assert_eq!(calls, expected, "{parser}: {output}");
        assert_eq!(message["content"], "Running.\n", "{parser}");
        assert_eq!(data["choices"][0]["finish_reason"], "tool_calls");
        let node = &proxy.nodes(&uuid).await[0];
        assert!(
            node["full_text"].as_str().unwrap().ends_with(output),
            "raw text kept"
        );

        let uuid = proxy.session(json!({"tool_parser": parser})).await;
        proxy.worker.push_sample(Sample::stop(chars(output)));
        let (_, raw, events) = proxy.chat_stream(&uuid, user("go")).await;
        let streamed: Vec<_> = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].as_array())
            .flatten()
            .map(call_of)
            .collect();
        assert_eq!(streamed, expected, "{parser} streamed: {raw}");
        let text: String = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Running.\n", "{parser} streamed");
    }
}

/// Ids count the calls a session returned: `call_0`, `call_1` on the first turn, `call_2` next;
/// the conversation sent back with them still extends one node.
#[tokio::test]
async fn call_ids_are_numbered_across_the_session() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let two = "<tool_call>{\"name\": \"Read\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}</tool_call>";
    let (_, first) = proxy
        .turn(&uuid, Sample::stop(chars(two)), user("go"))
        .await;
    let message = first["choices"][0]["message"].clone();
    let ids: Vec<&str> = message["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["call_0", "call_1"]);
    let mut body = user("go");
    body["messages"] = json!([
        {"role": "user", "content": "go"},
        message,
        {"role": "tool", "tool_call_id": "call_0", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "call_1", "content": "b.txt"},
    ]);
    let one = "<tool_call>{\"name\": \"Read\", \"arguments\": {}}</tool_call>";
    let (_, second) = proxy.turn(&uuid, Sample::stop(chars(one)), body).await;
    assert_eq!(
        second["choices"][0]["message"]["tool_calls"][0]["id"],
        "call_2"
    );
    assert_eq!(proxy.nodes(&uuid).await.len(), 1);
}

/// A template that cannot render `tool_calls` (the Atropos mock) gets calls the proxy never
/// produced written into the content the way the session's model writes them.
#[tokio::test]
async fn calls_the_proxy_never_produced_are_written_in_the_model_format() {
    let proxy = Proxy::atropos();
    let history = json!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Sure.", "tool_calls": [{"id": "x1", "type": "function",
            "function": {"name": "Bash", "arguments": "{\"command\": \"ls\"}"}}]},
        {"role": "tool", "tool_call_id": "x1", "content": "a.txt"},
    ]);
    for (parser, written) in [
        (
            "hermes",
            "<assistant>Sure.\n<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call></assistant>",
        ),
        (
            "gemma4",
            "<assistant>Sure.\n<|tool_call>call:Bash{command:<|\"|>ls<|\"|>}<tool_call|></assistant>",
        ),
        (
            "pythonic",
            "<assistant>Sure.\n[Bash(command=\"ls\")]</assistant>",
        ),
        (
            "llama3_json",
            "<assistant>Sure.\n{\"name\": \"Bash\", \"parameters\": {\"command\": \"ls\"}}</assistant>",
        ),
    ] {
        let uuid = proxy.session(json!({"tool_parser": parser})).await;
        let render = proxy
            .render(&uuid, json!({"messages": history, "tools": tools()}))
            .await;
        let prompt = render["prompt_text"].as_str().unwrap();
        assert!(prompt.contains(written), "{parser}: {prompt}");
    }
}

/// Where a format's markers are special tokens (Llama 3.1's `<|python_tag|>`), the reply text
/// keeps them so the call can be read; other special tokens stay out of the text.
#[tokio::test]
async fn special_token_markers_are_kept_in_reply_text() {
    // A copy of the shared character model, with two special tokens added.
    let dir = common::scratch_dir("python-tag-model");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(char_model_dir().join(file), dir.join(file)).unwrap();
    }
    let path = dir.join("tokenizer.json");
    let mut tokenizer = tokenizers::Tokenizer::from_file(&path).unwrap();
    tokenizer
        .add_special_tokens([
            tokenizers::AddedToken::from("<|python_tag|>", true),
            tokenizers::AddedToken::from("<|eom_id|>", true),
        ])
        .unwrap();
    tokenizer.save(&path, false).unwrap();
    let tag = tokenizer.token_to_id("<|python_tag|>").unwrap();
    let eom = tokenizer.token_to_id("<|eom_id|>").unwrap();
    let proxy = Proxy::start(dir, None, common::mock_worker::Wire::Sglang);
    let call = "{\"name\": \"Bash\", \"parameters\": {\"command\": \"ls\"}}";
    let sample = || {
        let mut ids = chars("Ok.");
        ids.push(tag);
        ids.extend(chars(call));
        ids.push(eom);
        Sample::stop(ids)
    };
    let uuid = proxy.session(json!({"tool_parser": "llama3_json"})).await;
    let (_, data) = proxy.turn(&uuid, sample(), user("go")).await;
    let message = &data["choices"][0]["message"];
    assert_eq!(message["tool_calls"][0]["function"]["name"], "Bash");
    assert_eq!(message["content"], "Ok.");

    let mut undeclared = user("go");
    undeclared["tools"] = json!([{"type": "function", "function": {"name": "Other"}}]);
    let uuid = proxy.session(json!({"tool_parser": "llama3_json"})).await;
    let (_, data) = proxy.turn(&uuid, sample(), undeclared).await;
    assert_eq!(
        data["choices"][0]["message"]["content"],
        format!("Ok.<|python_tag|>{call}"),
        "an unpromoted call keeps its marker; the end token is not text"
    );
    let uuid = proxy.session(json!({"tool_parser": "hermes"})).await;
    let (_, data) = proxy.turn(&uuid, sample(), user("go")).await;
    assert_eq!(
        data["choices"][0]["message"]["content"],
        format!("Ok.{call}"),
        "formats without that marker leave special tokens out"
    );
}
