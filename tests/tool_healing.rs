//! Tool-call healing through our HTTP API (the route behaviour of the healing spec), on the
//! Atropos mock tokenizer so the model's text is scripted exactly.

mod common;

use common::mock_worker::Sample;
use common::{Proxy, chars};
use serde_json::{Value, json};

const BASH_CALL: &str = r#"<tool_call>{"name":"Bash","arguments":{"cmd":"ls"}}</tool_call>"#;
const NUKE_CALL: &str = r#"<tool_call>{"name":"Nuke","arguments":{}}</tool_call>"#;

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "Bash", "parameters": {"type": "object",
            "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
        {"type": "function", "function": {"name": "Read", "parameters": {}}},
    ])
}

async fn turn(proxy: &Proxy, output: &str, extra: Value, length: bool) -> Value {
    let uuid = proxy.session(json!({})).await;
    let sample = if length {
        Sample::length(chars(output))
    } else {
        Sample::stop(chars(output))
    };
    let mut body = json!({"messages": [{"role": "user", "content": "go"}], "tools": tools()});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (status, data) = proxy.turn(&uuid, sample, body).await;
    assert_eq!(status, 200, "{data}");
    let nodes = proxy.nodes(&uuid).await;
    assert!(
        nodes[0]["full_text"].as_str().unwrap().ends_with(output),
        "the node keeps the raw text"
    );
    data["choices"][0].clone()
}

/// A streamed "go" turn whose model writes `output`, on a new session made with `session`:
/// the session, the raw stream and the tool-call deltas.
async fn stream_turn(proxy: &Proxy, session: Value, output: &str) -> (String, String, Vec<Value>) {
    let uuid = proxy.session(session).await;
    proxy.worker.push_sample(Sample::stop(chars(output)));
    let body = json!({"messages": [{"role": "user", "content": "go"}], "tools": tools()});
    let (_, raw, events) = proxy.chat_stream(&uuid, body).await;
    let calls = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .cloned()
        .collect();
    (uuid, raw, calls)
}

fn calls(choice: &Value) -> Vec<(String, Value)> {
    choice["message"]["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let args = serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
            (c["function"]["name"].as_str().unwrap().to_string(), args)
        })
        .collect()
}

#[tokio::test]
async fn closed_and_unclosed_calls_are_promoted() {
    let proxy = Proxy::atropos();
    let choice = turn(&proxy, BASH_CALL, json!({}), false).await;
    assert_eq!(
        calls(&choice),
        vec![("Bash".to_string(), json!({"cmd": "ls"}))]
    );
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert!(choice["message"]["content"].is_null());
    let unclosed = r#"Let me check. <tool_call>{"name":"Read","arguments":{"path":"/etc"}}"#;
    let choice = turn(&proxy, unclosed, json!({}), false).await;
    assert_eq!(
        calls(&choice),
        vec![("Read".to_string(), json!({"path": "/etc"}))]
    );
    assert_eq!(choice["message"]["content"], "Let me check. ");
}

#[tokio::test]
async fn bare_string_arguments_use_the_schema_key() {
    let proxy = Proxy::atropos();
    let choice = turn(
        &proxy,
        r#"<tool_call>{"name":"Bash","arguments":"echo hi"}</tool_call>"#,
        json!({}),
        false,
    )
    .await;
    assert_eq!(
        calls(&choice),
        vec![("Bash".to_string(), json!({"command": "echo hi"}))]
    );
    // Read's schema has no single required string key: not promoted, kept as text.
    let text = r#"<tool_call>{"name":"Read","arguments":"x"}</tool_call>"#;
    let choice = turn(&proxy, text, json!({}), false).await;
    assert!(calls(&choice).is_empty());
    assert_eq!(choice["message"]["content"], text);
}

#[tokio::test]
async fn opting_out_of_healing_keeps_unclosed_calls_as_text() {
    let proxy = Proxy::atropos();
    let unclosed = r#"<tool_call>{"name":"Bash","arguments":{"cmd":"ls"}}"#;
    let choice = turn(
        &proxy,
        unclosed,
        json!({"auto_heal_tool_calls": false}),
        false,
    )
    .await;
    assert!(calls(&choice).is_empty());
    assert_eq!(choice["message"]["content"], unclosed);
    assert_eq!(choice["finish_reason"], "stop");
    // Well-formed calls in the session's format are still parsed.
    let choice = turn(
        &proxy,
        BASH_CALL,
        json!({"auto_heal_tool_calls": false}),
        false,
    )
    .await;
    assert_eq!(calls(&choice).len(), 1);
}

#[tokio::test]
async fn length_stays_length_with_the_call_attached() {
    let proxy = Proxy::atropos();
    let choice = turn(&proxy, BASH_CALL, json!({}), true).await;
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(calls(&choice).len(), 1);
}

#[tokio::test]
async fn tool_choice_narrows_what_is_promoted() {
    let proxy = Proxy::atropos();
    let forced_read = json!({"tool_choice": {"type": "function", "function": {"name": "Read"}}});
    let choice = turn(&proxy, BASH_CALL, forced_read, false).await;
    assert!(calls(&choice).is_empty());
    assert_eq!(choice["message"]["content"], BASH_CALL);
    let choice = turn(&proxy, BASH_CALL, json!({"tool_choice": "none"}), false).await;
    assert!(calls(&choice).is_empty());
    let choice = turn(&proxy, BASH_CALL, json!({"tool_choice": "required"}), false).await;
    assert_eq!(calls(&choice).len(), 1);
}

#[tokio::test]
async fn undeclared_calls_stay_text_in_document_order() {
    let proxy = Proxy::atropos();
    let choice = turn(
        &proxy,
        &format!("pre {BASH_CALL} mid {NUKE_CALL} post"),
        json!({}),
        false,
    )
    .await;
    assert_eq!(calls(&choice).len(), 1);
    assert_eq!(
        choice["message"]["content"],
        format!("pre  mid {NUKE_CALL} post")
    );
}

#[tokio::test]
async fn parallel_tool_calls_false_keeps_one_call() {
    let proxy = Proxy::atropos();
    let two = format!("{BASH_CALL}{}", BASH_CALL.replace("ls", "pwd"));
    let choice = turn(&proxy, &two, json!({}), false).await;
    assert_eq!(calls(&choice).len(), 2);
    let choice = turn(&proxy, &two, json!({"parallel_tool_calls": false}), false).await;
    assert_eq!(
        calls(&choice),
        vec![("Bash".to_string(), json!({"cmd": "ls"}))]
    );
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(chars(&two)));
    let (_, _, events) = proxy
        .chat_stream(&uuid, json!({"messages": [{"role": "user", "content": "go"}], "tools": tools(), "parallel_tool_calls": false}))
        .await;
    let streamed: usize = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].as_array())
        .map(Vec::len)
        .sum();
    assert_eq!(streamed, 1);
}

#[tokio::test]
async fn streaming_heals_an_unclosed_call_at_the_end_and_flushes_false_alarms() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(chars(
        r#"Use <div> here <tool_call>{"name":"Bash","arguments":"ls -la"}"#,
    )));
    let (_, raw, events) = proxy
        .chat_stream(
            &uuid,
            json!({"messages": [{"role": "user", "content": "go"}], "tools": tools()}),
        )
        .await;
    let content: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "Use <div> here ");
    let calls: Vec<&Value> = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(calls.len(), 1, "{raw}");
    assert_eq!(calls[0]["function"]["arguments"], r#"{"command":"ls -la"}"#);
    assert_eq!(
        events[events.len() - 2]["choices"][0]["finish_reason"],
        "tool_calls"
    );
}

/// Sessions pick the format: Qwen3-Coder XML, or `auto` for any supported format, streamed or
/// not.
#[tokio::test]
async fn session_formats_xml_and_auto() {
    let proxy = Proxy::atropos();
    let xml = "Running.\n<tool_call>\n<function=Bash>\n<parameter=command>\nls -la\n</parameter>\n</function>\n</tool_call>";
    let mistral = r#"Running.
[TOOL_CALLS][{"name": "Bash", "arguments": {"command": "ls -la"}}]"#;
    for (parser, xml) in [
        ("qwen3_coder", xml),
        ("auto", xml),
        ("mistral", mistral),
        ("auto", mistral),
    ] {
        let uuid = proxy.session(json!({"tool_parser": parser})).await;
        let (_, data) = proxy
            .turn(
                &uuid,
                Sample::stop(chars(xml)),
                json!({"messages": [{"role": "user", "content": "go"}], "tools": tools()}),
            )
            .await;
        let choice = &data["choices"][0];
        assert_eq!(
            calls(choice),
            vec![("Bash".to_string(), json!({"command": "ls -la"}))],
            "{parser}"
        );
        assert_eq!(choice["message"]["content"], "Running.\n");
        let (_, raw, streamed) = stream_turn(&proxy, json!({"tool_parser": parser}), xml).await;
        assert_eq!(streamed.len(), 1, "{raw}");
        assert!(
            !raw.contains("<function=") && !raw.contains("TOOL_CALLS"),
            "{raw}"
        );
    }
    let (status, _) = proxy
        .post("/sessions/create", json!({"tool_parser": "klingon"}))
        .await;
    assert_eq!(status, 400);
}

/// A call written in another tagged format than the session's is promoted too, as healed,
/// streamed or not (the node keeps the raw text); with healing off it stays text.
#[tokio::test]
async fn calls_in_another_format_than_the_sessions_are_healed() {
    let proxy = Proxy::atropos();
    let xml = "Listing.\n<function=Bash>\n<parameter=command>\nls -la\n</parameter>\n</function>";
    let mistral = r#"[TOOL_CALLS][{"name": "Bash", "arguments": {"command": "pwd"}}]"#;
    for (text, command) in [(xml, "ls -la"), (mistral, "pwd")] {
        // The session speaks Hermes (the default).
        let choice = turn(&proxy, text, json!({}), false).await;
        assert_eq!(
            calls(&choice),
            vec![("Bash".to_string(), json!({"command": command}))],
            "{text}"
        );
        assert_eq!(choice["finish_reason"], "tool_calls");
        let kept = turn(&proxy, text, json!({"auto_heal_tool_calls": false}), false).await;
        assert_eq!(kept["message"]["content"], text);
        assert!(kept["message"].get("tool_calls").is_none_or(Value::is_null));
    }
    let (uuid, raw, streamed) = stream_turn(&proxy, json!({}), xml).await;
    assert_eq!(streamed.len(), 1, "{raw}");
    assert!(!raw.contains("<function="), "{raw}");
    // The node's turn says which call came from which format; metrics count it as healed.
    let node = &proxy.nodes(&uuid).await[0];
    assert_eq!(
        node["metadata"]["turns"][0]["healed_calls"],
        json!([{"id": streamed[0]["id"], "format": "qwen3_coder"}])
    );
    let metrics = proxy.metrics_text().await;
    assert!(
        metrics.contains(r#"rollout_tool_calls_total{parser="hermes",outcome="healed"} 3"#),
        "{metrics}"
    );
}

const GARBLED: &str =
    r#"I'll run it. <tool_call>{"name": "Bash", "arguments": {"cmd": </tool_call>"#;

/// `nudge_tool_calls`: a reply that wrote call markup nothing could be promoted from is retried
/// once on the same node; the node records which attempt was kept.
#[tokio::test]
async fn nudge_retry_extends_the_node_and_keeps_the_attempt_with_a_call() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(chars(GARBLED)));
    proxy.worker.push_sample(Sample::stop(chars(BASH_CALL)));
    let body = json!({"messages": [{"role": "user", "content": "go"}], "tools": tools(), "nudge_tool_calls": true});
    let (status, data) = proxy.chat(&uuid, body).await;
    assert_eq!(status, 200, "{data}");
    assert_eq!(
        calls(&data["choices"][0]),
        vec![("Bash".to_string(), json!({"cmd": "ls"}))]
    );
    let requests = proxy.worker.requests();
    assert_eq!(requests.len(), 2);
    let first: Vec<u32> = serde_json::from_value(requests[0]["input_ids"].clone()).unwrap();
    let second: Vec<u32> = serde_json::from_value(requests[1]["input_ids"].clone()).unwrap();
    assert!(
        second.starts_with(&first),
        "the retry extends the same prompt"
    );
    let second_text: String = second.iter().filter_map(|&c| char::from_u32(c)).collect();
    assert!(
        second_text.contains(GARBLED) && second_text.contains("call `Bash` or `Read` now"),
        "{second_text}"
    );
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1);
    let turns = nodes[0]["metadata"]["turns"].as_array().unwrap();
    assert_eq!(
        (turns[0]["nudge"].clone(), turns[1]["nudge"].clone()),
        (json!("discarded"), json!("kept"))
    );
}

#[tokio::test]
async fn nudge_keeps_the_original_when_the_retry_has_no_call_and_is_off_by_default() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(chars(GARBLED)));
    proxy
        .worker
        .push_sample(Sample::stop(chars("still just talking")));
    let body = json!({"messages": [{"role": "user", "content": "go"}], "tools": tools(), "nudge_tool_calls": true});
    let (_, data) = proxy.chat(&uuid, body).await;
    assert_eq!(data["choices"][0]["message"]["content"], GARBLED);
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(
        nodes[0]["metadata"]["num_turns"], 1,
        "the discarded retry is not in the node"
    );
    assert_eq!(
        nodes[0]["metadata"]["turns"][0]["nudge"],
        "kept_retry_discarded"
    );

    for extra in [
        json!({}),
        json!({"nudge_tool_calls": true, "auto_heal_tool_calls": false}),
    ] {
        let proxy = Proxy::atropos();
        let uuid = proxy.session(json!({})).await;
        proxy.worker.push_sample(Sample::stop(chars(GARBLED)));
        let mut body = json!({"messages": [{"role": "user", "content": "go"}], "tools": tools()});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        proxy.chat(&uuid, body).await;
        assert_eq!(proxy.worker.requests().len(), 1, "no retry with {extra}");
    }
    // Clean prose, and a reply healing can already promote, never trigger a retry.
    let unclosed = r#"<tool_call>{"name":"Bash","arguments":{"cmd":"ls"}}"#;
    for reply in ["Here is the answer.", unclosed] {
        let proxy = Proxy::atropos();
        let uuid = proxy.session(json!({})).await;
        proxy.worker.push_sample(Sample::stop(chars(reply)));
        proxy
            .chat(&uuid, json!({"messages": [{"role": "user", "content": "go"}], "tools": tools(), "nudge_tool_calls": true}))
            .await;
        assert_eq!(proxy.worker.requests().len(), 1, "{reply}");
    }
}

/// A retry whose only call names an undeclared tool is no improvement: the original is kept.
#[tokio::test]
async fn nudge_retry_with_an_undeclared_call_is_not_kept() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(chars(GARBLED)));
    proxy.worker.push_sample(Sample::stop(chars(NUKE_CALL)));
    let body = json!({"messages": [{"role": "user", "content": "go"}], "tools": tools(), "nudge_tool_calls": true});
    let (_, data) = proxy.chat(&uuid, body).await;
    assert_eq!(data["choices"][0]["message"]["content"], GARBLED);
    assert!(data["choices"][0]["message"]["tool_calls"].is_null());
    assert_eq!(proxy.worker.requests().len(), 2);
}
