//! Tool calls handed back the way real clients hand them back: each test replays one habit
//! of one client, in the exact shape that client was seen sending (captured from the real
//! packages: Claude Code 2.1.332, LangChain 1.8 / LangGraph 1.2, the OpenAI SDK 3.63, the
//! Agents SDK 0.24, Codex CLI 0.171). A call the proxy issued, handed back re-serialised or
//! with its schema's defaults filled in, is still the call the model made: the rollout stays
//! one node, and the change is recorded on the turn (`echoed_calls`) and counted in
//! `/metrics`. A real change forks, with its reason. `tests/agents.rs` runs the real clients.

mod common;

use common::mock_worker::Sample;
use common::{Proxy, qwen3_proxy};
use rollout_proxy::tokenizer::Tokenizer;
use serde_json::{Value, json};

/// Arguments written the way a model writes them: compact, `\u` escapes, `\/`, `1.0`, `2.50`.
const ARGUMENTS: &str =
    r#"{"city":"Z\u00fcrich \u2713","days":2,"scale":1.0,"price":2.50,"note":"caf\u00e9\/x"}"#;

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
            "scale": {"type": "number"}, "price": {"type": "number"}, "note": {"type": "string"},
            "include_hourly": {"type": "boolean", "default": false}},
        "required": ["city"]}}}])
}

/// The model's reply calling `name` with `arguments`, in Qwen3's format, after "Let me check."
fn call_sample(tok: &Tokenizer, name: &str, arguments: &str) -> Sample {
    said_then_call(tok, "Let me check.\n", name, arguments)
}

/// The model's reply: `preamble`, then a call to `name` with `arguments`.
fn said_then_call(tok: &Tokenizer, preamble: &str, name: &str, arguments: &str) -> Sample {
    let text = format!(
        "{preamble}<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {arguments}}}\n</tool_call><|im_end|>"
    );
    Sample::stop(tok.encode(&text).unwrap())
}

fn answer(tok: &Tokenizer) -> Sample {
    Sample::stop(tok.encode("Sunny.<|im_end|>").unwrap())
}

/// A chat session whose first turn called `get_weather`: the proxy, the session, the user's
/// message and the assistant message as returned.
async fn chat_call() -> (Tokenizer, Proxy, String, Value, Value) {
    chat_call_after("Let me check.\n").await
}

/// The same, the model saying `preamble` before its call.
async fn chat_call_after(preamble: &str) -> (Tokenizer, Proxy, String, Value, Value) {
    let (tok, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    let user = json!({"role": "user", "content": "Weather in Zürich?"});
    let sample = said_then_call(&tok, preamble, "get_weather", ARGUMENTS);
    proxy.worker.push_sample(sample);
    let (status, reply) = proxy
        .chat(&uuid, json!({"messages": [user], "tools": weather_tools()}))
        .await;
    assert_eq!(status, 200, "{reply}");
    let message = reply["choices"][0]["message"].clone();
    assert_eq!(message["tool_calls"][0]["function"]["arguments"], ARGUMENTS);
    (tok, proxy, uuid, user, message)
}

/// The second chat turn, with the call handed back as `echoed`: the session's nodes.
async fn hand_back(
    tok: &Tokenizer,
    proxy: &Proxy,
    uuid: &str,
    user: Value,
    echoed: Value,
) -> Vec<Value> {
    let id = echoed["tool_calls"][0]["id"].clone();
    let result = json!({"role": "tool", "tool_call_id": id, "content": "sunny"});
    proxy.worker.push_sample(answer(tok));
    let body = json!({"messages": [user, echoed, result], "tools": weather_tools()});
    let (status, reply) = proxy.chat(uuid, body).await;
    assert_eq!(status, 200, "{reply}");
    proxy.nodes(uuid).await
}

/// The rollout is one node of two turns, and its second turn records `changes`.
fn assert_one_node(nodes: &[Value], changes: Value) {
    assert_eq!(
        nodes.len(),
        1,
        "forked: {:?}",
        nodes.get(1).map(|n| &n["metadata"]["divergence"])
    );
    let turns = &nodes[0]["metadata"]["turns"];
    assert_eq!(turns.as_array().unwrap().len(), 2);
    assert_eq!(turns[1]["echoed_calls"].clone(), changes, "{turns}");
}

#[tokio::test]
async fn langchain_reserialises_arguments_and_drops_reasoning() {
    let (tok, proxy, uuid, user, message) = chat_call().await;
    let call = &message["tool_calls"][0];
    // `json.dumps(args, ensure_ascii=False)` of the parsed arguments; keys as LangChain orders
    // them; `reasoning_content` left out.
    let echoed = json!({"content": message["content"], "role": "assistant", "tool_calls": [{
        "type": "function", "id": call["id"], "function": {"name": "get_weather",
        "arguments": r#"{"city": "Zürich ✓", "days": 2, "scale": 1.0, "price": 2.5, "note": "café/x"}"#}}]});
    let nodes = hand_back(&tok, &proxy, &uuid, user, echoed).await;
    assert_one_node(&nodes, json!([{"id": call["id"], "change": "formatting"}]));
    let metrics = proxy.metrics_text().await;
    assert!(
        metrics.contains(r#"rollout_echoed_calls_changed_total{change="formatting"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_openai_sdks_model_dump_adds_null_fields() {
    let (tok, proxy, uuid, user, message) = chat_call().await;
    let mut echoed = message.clone();
    for field in ["refusal", "annotations", "audio", "function_call"] {
        echoed[field] = Value::Null;
    }
    let nodes = hand_back(&tok, &proxy, &uuid, user, echoed).await;
    assert_one_node(&nodes, Value::Null);
}

#[tokio::test]
async fn the_openai_sdks_model_dump_exclude_none_drops_null_content() {
    // A reply that is only a call: its `content` is null, and the dump leaves the key out.
    let (tok, proxy, uuid, user, message) = chat_call_after("").await;
    assert_eq!(message["content"], Value::Null, "{message}");
    let echoed = json!({"role": "assistant", "tool_calls": message["tool_calls"]});
    let nodes = hand_back(&tok, &proxy, &uuid, user, echoed).await;
    assert_one_node(&nodes, Value::Null);
}

#[tokio::test]
async fn the_openai_sdks_stream_helper_adds_index_and_parsed_fields() {
    let (tok, proxy, uuid, user, message) = chat_call().await;
    let mut echoed = message.clone();
    echoed["parsed"] = Value::Null;
    echoed["refusal"] = Value::Null;
    echoed["tool_calls"][0]["index"] = json!(0);
    echoed["tool_calls"][0]["function"]["parsed_arguments"] = Value::Null;
    let nodes = hand_back(&tok, &proxy, &uuid, user, echoed).await;
    assert_one_node(&nodes, Value::Null);
}

/// The nodes after the first turn's call is handed back with `arguments`.
async fn handed_back_with(arguments: &str) -> Vec<Value> {
    let (tok, proxy, uuid, user, message) = chat_call().await;
    let mut echoed = message.clone();
    echoed["tool_calls"][0]["function"]["arguments"] = json!(arguments);
    hand_back(&tok, &proxy, &uuid, user, echoed).await
}

#[tokio::test]
async fn a_real_change_to_a_call_forks_with_its_reason() {
    let nodes = handed_back_with(r#"{"city": "Bern"}"#).await;
    assert_eq!(nodes.len(), 2);
    assert_eq!(
        nodes[1]["metadata"]["divergence"]["reason"],
        "unmatched_assistant_message"
    );
    // A default set to another value is a real change too.
    let nodes = handed_back_with(
        r#"{"city":"Zürich ✓","days":2,"scale":1.0,"price":2.50,"note":"café/x","include_hourly":true}"#,
    )
    .await;
    assert_eq!(nodes.len(), 2, "a default's key set to another value forks");
}

#[tokio::test]
async fn a_default_filled_in_on_the_chat_api_is_recorded() {
    let nodes = handed_back_with(
        r#"{"include_hourly":false,"city":"Zürich ✓","days":2,"scale":1,"price":2.5,"note":"café/x"}"#,
    )
    .await;
    // The session's first call.
    assert_one_node(
        &nodes,
        json!([{"id": "call_0", "change": "defaults", "keys": ["+include_hourly"]}]),
    );
}

/// Claude Code's `Edit` tool, as it declares it: `replace_all` defaults to false.
fn claude_code_tools() -> Value {
    json!([
        {"name": "Read", "input_schema": {"type": "object", "properties": {
            "file_path": {"type": "string"}, "offset": {"type": "number"}, "limit": {"type": "number"}},
            "required": ["file_path"]}},
        {"name": "Edit", "input_schema": {"type": "object", "properties": {
            "file_path": {"type": "string"}, "old_string": {"type": "string"},
            "new_string": {"type": "string"},
            "replace_all": {"type": "boolean", "default": false}},
            "required": ["file_path", "old_string", "new_string"]}}
    ])
}

/// Claude Code's conversation so far: its system prompt (a list with a cache marker on the
/// first request, a string after), the task, and the turns given.
fn claude_code_turn(system_as_list: bool, messages: Vec<Value>) -> Value {
    let system = match system_as_list {
        true => {
            json!([{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}])
        }
        false => json!("You are Claude Code."),
    };
    json!({"model": "claude-sonnet-4-5", "max_tokens": 512, "system": system,
        "tools": claude_code_tools(), "messages": messages})
}

#[tokio::test]
async fn claude_code_fills_in_schema_defaults_and_writes_numbers_by_value() {
    let (tok, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/messages");
    let task = json!({"role": "user", "content": [{"type": "text", "text": "Fix notes.txt"}]});
    // Turn 1: Read, with `offset` written as 1.0.
    proxy.worker.push_sample(call_sample(
        &tok,
        "Read",
        r#"{"file_path":"/w/Z\u00fcrich.txt","offset":1.0,"limit":50}"#,
    ));
    let (status, first) = proxy
        .post(&path, claude_code_turn(true, vec![task.clone()]))
        .await;
    assert_eq!(status, 200, "{first}");
    let read = first["content"][1].clone();
    assert_eq!(read["input"]["offset"], 1.0);
    // Turn 2: Claude Code hands the Read back with `offset: 1`, and the model calls Edit
    // without `replace_all`.
    let read_echo = json!({"type": "tool_use", "id": read["id"], "name": "Read",
        "input": {"file_path": "/w/Zürich.txt", "offset": 1, "limit": 50}});
    let mut messages = vec![
        task,
        json!({"role": "assistant", "content": [first["content"][0], read_echo]}),
        json!({"role": "user", "content": [{"tool_use_id": read["id"], "type": "tool_result",
            "content": "1\tThe secret word is PAPAYA", "cache_control": {"type": "ephemeral"}}]}),
    ];
    proxy.worker.push_sample(call_sample(
        &tok,
        "Edit",
        r#"{"file_path":"/w/Z\u00fcrich.txt","old_string":"PAPAYA","new_string":"MANGO \u2713 caf\u00e9\/x"}"#,
    ));
    let (status, second) = proxy
        .post(&path, claude_code_turn(false, messages.clone()))
        .await;
    assert_eq!(status, 200, "{second}");
    let edit = second["content"][1].clone();
    assert!(edit["input"].get("replace_all").is_none(), "{edit}");
    // Turn 3: the Edit comes back with `replace_all: false` first, escapes written out, and
    // the cache marker moved off the earlier tool result.
    messages[2]["content"][0]
        .as_object_mut()
        .unwrap()
        .remove("cache_control");
    let edit_echo = json!({"type": "tool_use", "id": edit["id"], "name": "Edit", "input": {
        "replace_all": false, "file_path": "/w/Zürich.txt", "old_string": "PAPAYA",
        "new_string": "MANGO ✓ café/x"}});
    messages.push(json!({"role": "assistant", "content": [second["content"][0], edit_echo]}));
    messages.push(
        json!({"role": "user", "content": [{"tool_use_id": edit["id"],
        "type": "tool_result", "content": "The file has been updated.",
        "cache_control": {"type": "ephemeral"}}]}),
    );
    proxy.worker.push_sample(answer(&tok));
    let (status, third) = proxy.post(&path, claude_code_turn(false, messages)).await;
    assert_eq!(status, 200, "{third}");

    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(
        nodes.len(),
        1,
        "{:?}",
        nodes.get(1).map(|n| &n["metadata"]["divergence"])
    );
    let turns = &nodes[0]["metadata"]["turns"];
    assert_eq!(
        turns[1]["echoed_calls"],
        json!([{"id": read["id"], "change": "formatting"}])
    );
    assert_eq!(
        turns[2]["echoed_calls"],
        json!([{"id": edit["id"], "change": "defaults", "keys": ["+replace_all"]}])
    );
    let metrics = proxy.metrics_text().await;
    for change in ["defaults", "formatting"] {
        let line = format!(r#"rollout_echoed_calls_changed_total{{change="{change}"}} 1"#);
        assert!(metrics.contains(&line), "{line}\n{metrics}");
    }
}

/// A Responses session whose first turn called `get_weather`: its output items.
async fn responses_call() -> (Tokenizer, Proxy, String, Value) {
    responses_call_after(json!({}), "Let me check.\n").await
}

/// The same in a session created with `options`, the model writing `preamble` before its call.
async fn responses_call_after(options: Value, preamble: &str) -> (Tokenizer, Proxy, String, Value) {
    let (tok, proxy) = qwen3_proxy();
    let uuid = proxy.session(options).await;
    proxy
        .worker
        .push_sample(said_then_call(&tok, preamble, "get_weather", ARGUMENTS));
    let (status, reply) = proxy
        .post(&format!("/{uuid}/v1/responses"), responses_turn(vec![]))
        .await;
    assert_eq!(status, 200, "{reply}");
    (tok, proxy, uuid, reply["output"].clone())
}

fn responses_turn(after: Vec<Value>) -> Value {
    let mut input = vec![json!({"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Weather in Zürich?"}]})];
    input.extend(after);
    let tools = json!([{"type": "function", "name": "get_weather",
        "parameters": weather_tools()[0]["function"]["parameters"]}]);
    json!({"model": "m", "input": input, "tools": tools, "store": false})
}

/// The second Responses turn: the first's items handed back as `echoed`, then the call's output
/// (given an `id`, as Codex gives it, when `output_id` names one); the session's nodes.
async fn hand_back_items(
    tok: &Tokenizer,
    proxy: &Proxy,
    uuid: &str,
    echoed: Vec<Value>,
    output_id: Option<&str>,
) -> Vec<Value> {
    let call = echoed
        .iter()
        .find(|item| item["type"] == "function_call")
        .unwrap();
    let mut output =
        json!({"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"});
    if let Some(id) = output_id {
        output["id"] = json!(id);
    }
    let items = echoed.iter().cloned().chain([output]).collect();
    proxy.worker.push_sample(answer(tok));
    let (status, reply) = proxy
        .post(&format!("/{uuid}/v1/responses"), responses_turn(items))
        .await;
    assert_eq!(status, 200, "{reply}");
    proxy.nodes(uuid).await
}

/// `output`'s items, each as `change` leaves it.
fn each_item(output: &Value, change: impl Fn(&mut Value)) -> Vec<Value> {
    let mut items = output.as_array().unwrap().clone();
    items.iter_mut().for_each(change);
    items
}

#[tokio::test]
async fn langchain_on_responses_drops_item_status() {
    let (tok, proxy, uuid, output) = responses_call().await;
    let echoed = each_item(&output, |item| {
        item.as_object_mut().unwrap().remove("status");
    });
    let nodes = hand_back_items(&tok, &proxy, &uuid, echoed, None).await;
    assert_one_node(&nodes, Value::Null);
}

#[tokio::test]
async fn codex_adds_ids_and_null_content_to_items() {
    let (tok, proxy, uuid, output) = responses_call().await;
    let echoed = each_item(&output, |item| {
        if item["type"] == "reasoning" {
            item["content"] = Value::Null;
        }
    });
    let nodes = hand_back_items(&tok, &proxy, &uuid, echoed, Some("fco_01a24d84")).await;
    assert_one_node(&nodes, Value::Null);
}

#[tokio::test]
async fn the_agents_sdk_reorders_item_keys() {
    let (tok, proxy, uuid, output) = responses_call().await;
    // Keys in alphabetical order, as `to_input_list()` writes them.
    let echoed = each_item(&output, |item| {
        let mut keys: Vec<(String, Value)> = item
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        *item = Value::Object(keys.into_iter().collect());
    });
    let nodes = hand_back_items(&tok, &proxy, &uuid, echoed, None).await;
    assert_one_node(&nodes, Value::Null);
}

/// Shapes agent frameworks send that must not change a rollout (seen running the OpenAI
/// Agents SDK, LangGraph, pydantic-ai and LiteLLM): `max_completion_tokens` for `max_tokens`,
/// `strict` tools that forbid extra properties, an explicit `content: null` beside the calls,
/// and the agent's `name` on its own messages.
#[tokio::test]
async fn agent_frameworks_chat_shapes_keep_one_node() {
    let (tok, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    let mut tools = weather_tools();
    tools[0]["function"]["strict"] = json!(true);
    tools[0]["function"]["parameters"]["additionalProperties"] = json!(false);
    let user = json!({"role": "user", "content": "Weather in Zürich?"});
    proxy
        .worker
        .push_sample(said_then_call(&tok, "", "get_weather", ARGUMENTS));
    let body = json!({"messages": [user], "tools": tools, "max_completion_tokens": 77});
    let (status, reply) = proxy.chat(&uuid, body).await;
    assert_eq!(status, 200, "{reply}");
    let sent = proxy.worker.requests().pop().unwrap();
    assert_eq!(sent["sampling_params"]["max_new_tokens"], 77, "{sent}");
    let message = &reply["choices"][0]["message"];
    let echoed = json!({"role": "assistant", "name": "weather_agent", "content": null,
        "tool_calls": message["tool_calls"]});
    let id = &message["tool_calls"][0]["id"];
    let result = json!({"role": "tool", "tool_call_id": id, "content": "sunny"});
    proxy.worker.push_sample(answer(&tok));
    let body = json!({"messages": [user, echoed, result], "tools": tools,
        "max_completion_tokens": 77});
    let (status, reply) = proxy.chat(&uuid, body).await;
    assert_eq!(status, 200, "{reply}");
    assert_one_node(&proxy.nodes(&uuid).await, Value::Null);
}

/// Responses items handed back without the `id` and `status` the proxy gave them, reasoning
/// with `encrypted_content: null` (LiteLLM's and pydantic-ai's dumps): still one node.
#[tokio::test]
async fn responses_items_without_ids_and_with_null_encrypted_content_keep_one_node() {
    let thinking = "<think>\nLook it up.\n</think>\n\n";
    let (tok, proxy, uuid, output) =
        responses_call_after(json!({"reasoning": true}), thinking).await;
    let kinds: Vec<&Value> = output
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["type"])
        .collect();
    assert_eq!(
        kinds,
        [&json!("reasoning"), &json!("function_call")],
        "{output}"
    );
    let echoed = each_item(&output, |item| {
        let fields = item.as_object_mut().unwrap();
        if fields["type"] == "function_call" {
            fields.remove("id");
            fields.remove("status");
        }
        if fields["type"] == "reasoning" {
            fields.insert("encrypted_content".into(), Value::Null);
        }
    });
    let nodes = hand_back_items(&tok, &proxy, &uuid, echoed, None).await;
    assert_one_node(&nodes, Value::Null);
}
