//! The Anthropic Messages API on a session (what Claude Code speaks): requests read into the
//! turn, replies and event streams in Anthropic's shape, a tool loop kept in one node whose
//! sampled ids are exactly the upstream's, errors in Anthropic's shape.

mod common;

use common::mock_worker::{Sample, Wire};
use common::{Proxy, assert_node_shape, fixture_model, qwen3_proxy, sampled_ids};
use rollout_proxy::tokenizer::Tokenizer;
use serde_json::{Value, json};

fn tools() -> Value {
    json!([
        {"name": "Read", "description": "Reads a file", "cache_control": {"type": "ephemeral"},
         "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
        {"name": "Bash", "defer_loading": true,
         "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}},
    ])
}

/// What Claude Code sends, trimmed: system blocks with `cache_control`, a `system`-role
/// message among the messages, any model name, a huge `max_tokens`, fields we ignore.
fn first_turn() -> Value {
    json!({
        "model": "claude-opus-5-5", "max_tokens": 128000, "stream": false,
        "system": [{"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What does a.txt say?"}]},
            {"role": "system", "content": "The working folder is /w."}],
        "tools": tools(),
        "thinking": {"type": "disabled"},
        "metadata": {"user_id": "u1"}, "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}
    })
}

const CALL_TEXT: &str = "Let me read it.\n<tool_call>\n{\"name\": \"Read\", \"arguments\": {\"path\": \"a.txt\"}}\n</tool_call><|im_end|>";

/// The second request: the reply sent back as it came, then the tool's result.
fn second_turn(reply_content: &Value) -> Value {
    let mut body = first_turn();
    let messages = body["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": reply_content}));
    let id = reply_content
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap()["id"]
        .clone();
    messages.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": id, "content": [{"type": "text", "text": "hello"}]}]}));
    body
}

#[tokio::test]
async fn a_tool_loop_is_one_node_holding_exactly_the_sampled_ids() {
    let (tok, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/messages?beta=true");

    let call = tok.encode(CALL_TEXT).unwrap();
    proxy.worker.push_sample(Sample::stop(call.clone()));
    let (status, reply) = proxy.post(&path, first_turn()).await;
    assert_eq!(status, 200, "{reply}");
    let first_prompt = proxy.worker.last_prompt();
    assert!(reply["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(reply["type"], "message");
    assert_eq!(reply["role"], "assistant");
    assert_eq!(reply["model"], "claude-opus-5-5");
    assert_eq!(reply["stop_reason"], "tool_use");
    assert_eq!(reply["stop_sequence"], Value::Null);
    assert_eq!(
        reply["content"],
        json!([
            {"type": "text", "text": "Let me read it.\n"},
            {"type": "tool_use", "id": "toolu_0", "name": "Read", "input": {"path": "a.txt"}},
        ])
    );
    assert_eq!(reply["usage"]["input_tokens"], first_prompt.len());
    assert_eq!(reply["usage"]["output_tokens"], call.len());
    let prompt_text = tok.decode(&first_prompt);
    assert!(
        prompt_text
            .starts_with("<|im_start|>system\nYou are a coding agent.\nThe working folder is /w.")
    );
    assert!(
        prompt_text.contains("\"name\": \"Read\""),
        "the tools are in the prompt"
    );
    let sent = &proxy.worker.requests()[0];
    assert_eq!(sent["sampling_params"]["max_new_tokens"], 128000);

    // Turn 2: render and count first (they change nothing), then the real call.
    let second = second_turn(&reply["content"]);
    let (status, rendered) = proxy
        .post(&format!("/{uuid}/v1/messages/render"), second.clone())
        .await;
    assert_eq!(status, 200, "{rendered}");
    let (_, counted) = proxy
        .post(&format!("/{uuid}/v1/messages/count_tokens"), second.clone())
        .await;
    assert_eq!(counted["input_tokens"], rendered["num_tokens"]);
    assert_eq!(rendered["extends_node"], 0);

    let answer = tok.encode("It says hello.<|im_end|>").unwrap();
    proxy.worker.push_sample(Sample::stop(answer.clone()));
    let (status, reply) = proxy.post(&path, second).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply["content"],
        json!([{"type": "text", "text": "It says hello."}])
    );
    assert_eq!(reply["stop_reason"], "end_turn");
    let second_prompt = proxy.worker.last_prompt();
    let token_ids: Vec<u32> = serde_json::from_value(rendered["token_ids"].clone()).unwrap();
    assert_eq!(
        token_ids, second_prompt,
        "/render shows the ids the call sent"
    );
    assert_eq!(
        &second_prompt[..first_prompt.len() + call.len()],
        [first_prompt.as_slice(), call.as_slice()].concat(),
        "the second prompt extends the first turn's ids exactly"
    );

    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1, "one rollout, one node");
    assert_node_shape(&nodes[0]);
    assert_eq!(
        sampled_ids(&nodes[0]),
        [call, answer].concat(),
        "the sampled ids are the upstream's"
    );
}

#[tokio::test]
async fn a_streamed_turn_writes_anthropic_events_token_by_token() {
    let (tok, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/messages?beta=true");
    proxy
        .worker
        .push_sample(Sample::stop(tok.encode(CALL_TEXT).unwrap()));
    let (status, raw, events) = proxy.post_stream(&path, first_turn()).await;
    assert_eq!(status, 200, "{raw}");
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    let text_deltas = names
        .iter()
        .filter(|n| **n == "content_block_delta")
        .count();
    assert!(text_deltas >= 3, "token by token: {names:?}");
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str(), "each event's data names it");
    }
    let mut expected = vec!["message_start", "content_block_start"];
    expected.extend(std::iter::repeat_n("content_block_delta", text_deltas - 1));
    expected.extend([
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]);
    assert_eq!(names, expected);
    let start = &events[0].1["message"];
    assert_eq!(
        start["usage"]["input_tokens"],
        proxy.worker.last_prompt().len()
    );
    let text: String = events
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "Let me read it.\n");
    let tool = events
        .iter()
        .find(|(_, d)| d["content_block"]["type"] == "tool_use")
        .unwrap();
    assert_eq!(tool.1["content_block"]["id"], "toolu_0");
    assert_eq!(tool.1["index"], 1);
    let input = events
        .iter()
        .find_map(|(_, d)| d["delta"]["partial_json"].as_str())
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(input).unwrap(),
        json!({"path": "a.txt"})
    );
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert_eq!(
        delta["usage"]["output_tokens"],
        tok.encode(CALL_TEXT).unwrap().len()
    );

    // The streamed reply sent back extends the node, as Claude Code's second request does.
    let content = json!([
        {"type": "text", "text": text},
        {"type": "tool_use", "id": "toolu_0", "name": "Read", "input": {"path": "a.txt"}}]);
    proxy
        .worker
        .push_sample(Sample::stop(tok.encode("hello<|im_end|>").unwrap()));
    let (status, raw, _) = proxy.post_stream(&path, second_turn(&content)).await;
    assert_eq!(status, 200, "{raw}");
    assert_eq!(proxy.nodes(&uuid).await.len(), 1);
}

#[tokio::test]
async fn a_turn_may_switch_apis_within_one_node() {
    let (tok, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    proxy
        .worker
        .push_sample(Sample::stop(tok.encode(CALL_TEXT).unwrap()));
    let user = json!({"role": "user", "content": "What does a.txt say?"});
    let openai_tools = json!([{"type": "function", "function": {"name": "Read",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]);
    let (_, chat) = proxy
        .chat(&uuid, json!({"messages": [user], "tools": openai_tools}))
        .await;
    let call = &chat["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["id"], "call_0");
    proxy
        .worker
        .push_sample(Sample::stop(tok.encode("hello<|im_end|>").unwrap()));
    let body = json!({"max_tokens": 64, "tools": [{"name": "Read", "input_schema":
        {"type": "object", "properties": {"path": {"type": "string"}}}}],
        "messages": [user,
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me read it."},
                {"type": "tool_use", "id": "call_0", "name": "Read", "input": {"path": "a.txt"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_0", "content": "hello"}]}]});
    let (status, reply) = proxy.post(&format!("/{uuid}/v1/messages"), body).await;
    assert_eq!(status, 200, "{reply}");
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(
        nodes.len(),
        1,
        "{:?}",
        nodes.iter().map(|n| &n["metadata"]).collect::<Vec<_>>()
    );
    assert_eq!(nodes[0]["metadata"]["num_turns"], 2);
}

#[tokio::test]
async fn stop_sequences_and_thinking_blocks() {
    let (tok, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({"reasoning": true})).await;
    let sampled = tok
        .encode("<think>\nshort\n</think>\n\nOne, two###")
        .unwrap();
    proxy
        .worker
        .push_sample(Sample::stop_string(sampled, "###"));
    let body = json!({"max_tokens": 64, "stop_sequences": ["###"], "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [{"role": "user", "content": "Count."}]});
    let (status, reply) = proxy.post(&format!("/{uuid}/v1/messages"), body).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["stop_reason"], "stop_sequence");
    assert_eq!(reply["stop_sequence"], "###");
    assert_eq!(
        reply["content"],
        json!([{"type": "thinking", "thinking": "short", "signature": ""}, {"type": "text", "text": "One, two"}])
    );
    let sent = &proxy.worker.requests()[0];
    assert_eq!(sent["sampling_params"]["stop"], json!(["###"]));
    let prompt = tok.decode(&proxy.worker.last_prompt());
    assert!(
        !prompt.contains("<think>\n\n</think>"),
        "thinking on: no empty think block"
    );
}

#[tokio::test]
async fn bad_requests_get_anthropic_errors_and_change_nothing() {
    let (_, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/messages");
    let user = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (json!({"messages": user}), 400, "max_tokens"),
        (
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}),
            400,
            "messages[0].content[0]: the image cannot be decoded",
        ),
        (
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                    "data": common::images::base64(&common::images::png(8, 8, 0))}}]}]}),
            400,
            "this model takes no images",
        ),
        (
            json!({"max_tokens": 8, "messages": user, "temperature": 3}),
            400,
            "temperature",
        ),
        (json!({"max_tokens": 8, "messages": "hi"}), 400, "messages"),
    ];
    for (body, status, needle) in cases {
        let (got, data) = proxy.post(&path, body.clone()).await;
        assert_eq!(got, status, "{body} → {data}");
        assert_eq!(data["type"], "error", "{data}");
        assert_eq!(data["error"]["type"], "invalid_request_error", "{data}");
        let message = data["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{message}");
    }
    let (status, data) = proxy.post_raw(&path, "{not json".into()).await;
    assert_eq!((status, &data["type"]), (400, &json!("error")), "{data}");
    let (status, data) = proxy
        .post(
            &format!("/{}/v1/messages", uuid::Uuid::new_v4()),
            json!({"max_tokens": 8, "messages": user}),
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(data["error"]["type"], "not_found_error");
    assert!(proxy.worker.requests().is_empty());
    assert!(proxy.nodes(&uuid).await.is_empty());

    // Refused on every try (the pool retries twice): Anthropic's "overloaded".
    for _ in 0..3 {
        proxy
            .worker
            .push(common::mock_worker::Reply::Error(503, "busy"));
    }
    let (status, data) = proxy
        .post(&path, json!({"max_tokens": 8, "messages": user}))
        .await;
    assert_eq!(status, 503, "{data}");
    assert_eq!(data["error"]["type"], "overloaded_error");
    assert!(proxy.nodes(&uuid).await.is_empty());
}

/// Claude Code asks for `max_tokens: 128000`: with the model's context known, the request is
/// served with what the prompt leaves of it; a prompt that fills the context is refused.
#[tokio::test]
async fn max_tokens_is_clamped_to_the_context_left() {
    let tok = Tokenizer::from_path(&fixture_model("qwen3")).unwrap();
    let worker = common::mock_worker::MockWorker::start(Wire::Sglang);
    let proxy = Proxy::start_with(fixture_model("qwen3"), None, worker, |settings| {
        settings.context_length = Some(300);
    });
    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/messages");
    proxy
        .worker
        .push_sample(Sample::stop(tok.encode("ok<|im_end|>").unwrap()));
    let body = json!({"max_tokens": 128000, "messages": [{"role": "user", "content": "hi"}]});
    let (status, reply) = proxy.post(&path, body).await;
    assert_eq!(status, 200, "{reply}");
    let prompt = proxy.worker.last_prompt().len();
    let sent = &proxy.worker.requests()[0]["sampling_params"]["max_new_tokens"];
    assert_eq!(sent, 300 - prompt);

    let long = "word ".repeat(400);
    let body = json!({"max_tokens": 10, "messages": [{"role": "user", "content": long}]});
    let (status, data) = proxy.post(&path, body.clone()).await;
    assert_eq!(status, 400, "{data}");
    assert_eq!(data["error"]["type"], "invalid_request_error");
    assert!(
        data["error"]["message"]
            .as_str()
            .unwrap()
            .contains("fills the model's context")
    );
    let (status, raw, _) = proxy.post_stream(&path, body).await;
    assert_eq!(status, 400, "{raw}");
    assert_eq!(proxy.nodes(&uuid).await.len(), 1);
}

/// An agent's side request (a title, a summary) on the rollout's session starts a node of its
/// own that says why, and the main conversation goes on extending its node.
#[tokio::test]
async fn a_side_request_gets_its_own_node_and_the_main_one_goes_on() {
    let (tok, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/messages");
    proxy
        .worker
        .push_sample(Sample::stop(tok.encode(CALL_TEXT).unwrap()));
    let (_, reply) = proxy.post(&path, first_turn()).await;
    proxy.worker.push_sample(Sample::stop(
        tok.encode("Reading a file<|im_end|>").unwrap(),
    ));
    let title = json!({"max_tokens": 32, "system": "Write a title for this conversation.",
        "messages": [{"role": "user", "content": "What does a.txt say?"}]});
    let (status, _) = proxy.post(&path, title).await;
    assert_eq!(status, 200);
    proxy
        .worker
        .push_sample(Sample::stop(tok.encode("hello<|im_end|>").unwrap()));
    let (status, _) = proxy.post(&path, second_turn(&reply["content"])).await;
    assert_eq!(status, 200);
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 2);
    assert_eq!(
        nodes[0]["metadata"]["num_turns"], 2,
        "the main node went on"
    );
    assert_eq!(nodes[1]["metadata"]["num_turns"], 1);
    assert_eq!(
        nodes[1]["metadata"]["divergence"]["reason"],
        "new_conversation"
    );
}

/// A client that hangs up mid-stream cancels the backend request and changes nothing, on the
/// Messages API and the Responses API alike.
#[tokio::test]
async fn hanging_up_cancels_the_backend_on_messages_and_responses() {
    let (tok, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.set_token_delay(100);
    let long = tok.encode(&"slowly ".repeat(40)).unwrap();
    let requests = [
        (
            format!("/{uuid}/v1/messages"),
            json!({"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}),
            "text_delta",
        ),
        (
            format!("/{uuid}/v1/responses"),
            json!({"input": "hi"}),
            "output_text.delta",
        ),
    ];
    for (cancelled, (path, body, seen)) in requests.into_iter().enumerate() {
        proxy.worker.push_sample(Sample::stop(long.clone()));
        proxy.stream_and_hang_up(&path, body, seen).await;
        let start = std::time::Instant::now();
        while proxy.worker.cancelled_streams() == cancelled {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(2),
                "{path}: not cancelled"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(
            proxy.nodes(&uuid).await.is_empty(),
            "{path}: nothing recorded"
        );
    }
}

/// While the backend is silent, the stream carries `ping` events (Responses: comments).
#[tokio::test]
async fn a_silent_backend_gets_pings() {
    let (tok, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.set_token_delay(1000);
    proxy
        .worker
        .push_sample(Sample::stop(tok.encode("ok<|im_end|>").unwrap()));
    let body = json!({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let (status, raw, events) = proxy
        .post_stream(&format!("/{uuid}/v1/messages"), body)
        .await;
    assert_eq!(status, 200);
    assert!(
        events
            .iter()
            .any(|(name, data)| name == "ping" && data["type"] == "ping"),
        "{raw}"
    );
    assert_eq!(events.last().unwrap().0, "message_stop");
}
