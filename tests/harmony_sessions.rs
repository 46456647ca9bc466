//! Sessions on gpt-oss (the pinned gpt-oss tokenizer, the bundled `gpt_oss` template, an
//! SGLang-format upstream scripted with Harmony replies): the `harmony` tool format is chosen
//! by itself; reasoning in the `analysis` channel comes back as `reasoning_content`, a call in
//! `commentary` as a tool call, the `final` answer as content, whole or streamed; and a
//! tool-calling rollout keeps one node whose sampled tokens (`<|call|>`, `<|return|>` included)
//! stand verbatim in every later prompt.

mod common;

use common::mock_worker::{Sample, Wire};
use common::{Proxy, assert_node_shape, fixture_model, sampled_ids};
use rollout_proxy::tokenizer::{Tokenizer, harmony};
use serde_json::{Value, json};

const CALL: &str = "<|channel|>analysis<|message|>Need the weather.<|end|>\
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json\
    <|message|>{\"city\":\"Oslo\"}<|call|>";
const ANSWER: &str = "<|channel|>analysis<|message|>It is sunny.<|end|>\
    <|start|>assistant<|channel|>final<|message|>Sunny in Oslo.<|return|>";

fn gpt_oss() -> (Tokenizer, Proxy) {
    let dir = fixture_model("gpt_oss");
    (
        Tokenizer::from_path(&dir).unwrap(),
        Proxy::start(dir, Some("gpt_oss"), Wire::Sglang),
    )
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}}}])
}

fn sample(tokenizer: &Tokenizer, text: &str) -> Sample {
    Sample::stop(harmony::encode(tokenizer, text).unwrap())
}

fn first_turn() -> Value {
    json!({"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": tools()})
}

/// The first turn's messages, its reply sent back, and the call's result (without a `name`:
/// OpenAI clients leave it out).
fn second_turn(reply: &Value) -> Value {
    let id = reply["tool_calls"][0]["id"].clone();
    json!({"messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": reply["tool_calls"]},
        {"role": "tool", "tool_call_id": id, "content": "sunny, 18 C"},
    ], "tools": tools()})
}

#[tokio::test]
async fn a_tool_calling_rollout_keeps_one_node_with_the_sampled_harmony_tokens() {
    let (tokenizer, proxy) = gpt_oss();
    let (_, created) = proxy.post("/sessions/create", json!({})).await;
    assert_eq!(created["tool_parser"], "harmony", "{created}");
    let uuid = created["uuid"].as_str().unwrap().to_string();

    let (status, data) = proxy
        .turn(&uuid, sample(&tokenizer, CALL), first_turn())
        .await;
    assert_eq!(status, 200, "{data}");
    let choice = &data["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let reply = &choice["message"];
    assert_eq!(reply["reasoning_content"], "Need the weather.");
    assert!(reply["content"].is_null(), "{reply}");
    assert_eq!(reply["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(
        reply["tool_calls"][0]["function"]["arguments"],
        "{\"city\":\"Oslo\"}"
    );
    let first_prompt = proxy.worker.last_prompt();
    let first_text = tokenizer.decode(&first_prompt);
    assert!(
        first_text.contains("type get_weather = (_: {"),
        "{first_text}"
    );
    assert!(first_text.ends_with("<|end|><|start|>assistant"));

    let (status, data) = proxy
        .turn(&uuid, sample(&tokenizer, ANSWER), second_turn(reply))
        .await;
    assert_eq!(status, 200, "{data}");
    let answer = &data["choices"][0]["message"];
    assert_eq!(answer["content"], "Sunny in Oslo.");
    assert_eq!(answer["reasoning_content"], "It is sunny.");
    assert_eq!(data["choices"][0]["finish_reason"], "stop");
    // The sampled call stands verbatim, `<|call|>` and all, then the result from
    // `functions.get_weather` (named from the call it answers).
    let mut expected = first_prompt.clone();
    expected.extend(harmony::encode(&tokenizer, CALL).unwrap());
    expected.extend(
        harmony::encode(
            &tokenizer,
            "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\
             sunny, 18 C<|end|><|start|>assistant",
        )
        .unwrap(),
    );
    assert_eq!(proxy.worker.last_prompt(), expected);

    // A follow-up after the final answer: its `<|return|>` stays as sampled.
    let mut third = second_turn(reply);
    let messages = third["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": "Sunny in Oslo."}));
    messages.push(json!({"role": "user", "content": "And tomorrow?"}));
    let (status, data) = proxy
        .turn(
            &uuid,
            sample(
                &tokenizer,
                "<|channel|>final<|message|>Ask me tomorrow.<|return|>",
            ),
            third,
        )
        .await;
    assert_eq!(status, 200, "{data}");
    let prompt = proxy.worker.last_prompt();
    let mut sampled_so_far = expected.clone();
    sampled_so_far.extend(harmony::encode(&tokenizer, ANSWER).unwrap());
    assert!(prompt.starts_with(&sampled_so_far));
    assert_eq!(
        tokenizer.decode(&prompt[sampled_so_far.len()..]),
        "<|start|>user<|message|>And tomorrow?<|end|><|start|>assistant"
    );

    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1, "one node for the whole rollout");
    assert_node_shape(&nodes[0]);
    let mut all_sampled = harmony::encode(&tokenizer, CALL).unwrap();
    all_sampled.extend(harmony::encode(&tokenizer, ANSWER).unwrap());
    all_sampled.extend(
        harmony::encode(
            &tokenizer,
            "<|channel|>final<|message|>Ask me tomorrow.<|return|>",
        )
        .unwrap(),
    );
    assert_eq!(sampled_ids(&nodes[0]), all_sampled);

    // The token viewer frames the call, and its messages are the Harmony messages.
    let (_, view) = proxy.get(&format!("/{uuid}/view")).await;
    let calls = view["nodes"][0]["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{}", view["nodes"][0]["calls"]);
    assert_eq!(calls[0]["name"], "get_weather");
    assert_eq!(calls[0]["healed"], false);
    let roles: Vec<&str> = view["nodes"][0]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert!(roles.contains(&"tool"), "{roles:?}");
}

#[tokio::test]
async fn a_streamed_harmony_reply_sends_reasoning_then_the_call() {
    let (tokenizer, proxy) = gpt_oss();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(sample(&tokenizer, CALL));
    let (status, raw, events) = proxy.chat_stream(&uuid, first_turn()).await;
    assert_eq!(status, 200, "{raw}");
    let deltas: Vec<&Value> = events.iter().map(|e| &e["choices"][0]["delta"]).collect();
    let reasoning: String = deltas
        .iter()
        .filter_map(|d| d["reasoning_content"].as_str())
        .collect();
    assert_eq!(reasoning, "Need the weather.");
    let content: String = deltas
        .iter()
        .filter_map(|d| d["content"].as_str())
        .collect();
    assert_eq!(content, "", "no channel markup reaches the content: {raw}");
    let calls: Vec<&Value> = deltas
        .iter()
        .filter_map(|d| d["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(calls.len(), 1, "{raw}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
    let finish = events
        .iter()
        .find_map(|e| e["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"));
}

#[tokio::test]
async fn a_call_cut_by_the_length_limit_is_healed_and_an_undeclared_one_left_as_text() {
    let (tokenizer, proxy) = gpt_oss();
    let uuid = proxy.session(json!({})).await;
    let cut = CALL.strip_suffix("<|call|>").unwrap();
    let ids = harmony::encode(&tokenizer, cut).unwrap();
    let (status, data) = proxy.turn(&uuid, Sample::length(ids), first_turn()).await;
    assert_eq!(status, 200, "{data}");
    let choice = &data["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(
        choice["message"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );

    let undeclared = CALL.replace("get_weather", "launch");
    let uuid = proxy.session(json!({})).await;
    let (_, data) = proxy
        .turn(&uuid, sample(&tokenizer, &undeclared), first_turn())
        .await;
    let message = &data["choices"][0]["message"];
    assert!(message["tool_calls"].is_null() || message["tool_calls"] == json!([]));
    assert!(
        message["content"]
            .as_str()
            .unwrap()
            .contains("to=functions.launch"),
        "{message}"
    );
}

#[tokio::test]
async fn template_history_renders_the_conversation_as_the_harmony_library_does() {
    let (tokenizer, proxy) = gpt_oss();
    let uuid = proxy.session(json!({"history": "template"})).await;
    let (_, data) = proxy
        .turn(&uuid, sample(&tokenizer, CALL), first_turn())
        .await;
    let reply = data["choices"][0]["message"].clone();
    let (status, data) = proxy
        .turn(&uuid, sample(&tokenizer, ANSWER), second_turn(&reply))
        .await;
    assert_eq!(status, 200, "{data}");
    let prompt = tokenizer.decode(&proxy.worker.last_prompt());
    // Analysis before the first final answer is dropped; the call is the template's own.
    assert!(!prompt.contains("Need the weather."), "{prompt}");
    assert!(
        prompt.ends_with(
            "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json\
             <|message|>{\"city\": \"Oslo\"}<|call|><|start|>functions.get_weather \
             to=assistant<|channel|>commentary<|message|>sunny, 18 C<|end|><|start|>assistant"
        ),
        "{prompt}"
    );
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 2, "the template rewrote the sampled turn");
    let (_, divergences) = proxy.get(&format!("/{uuid}/divergences")).await;
    assert_eq!(
        divergences["divergences"][0]["reason"], "template_rewrites_history",
        "{divergences}"
    );
}

#[tokio::test]
async fn a_session_may_still_name_another_format() {
    let (_, proxy) = gpt_oss();
    let (_, created) = proxy
        .post("/sessions/create", json!({"tool_parser": "hermes"}))
        .await;
    assert_eq!(created["tool_parser"], "hermes");
    let (_, created) = proxy
        .post("/sessions/create", json!({"tool_parser": "openai"}))
        .await;
    assert_eq!(created["tool_parser"], "openai", "vLLM's name for it");
}

#[tokio::test]
async fn anthropic_clients_get_the_analysis_as_a_thinking_block() {
    let (tokenizer, proxy) = gpt_oss();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(sample(&tokenizer, CALL));
    let body = json!({"model": "gpt-oss", "max_tokens": 256,
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [{"name": "get_weather", "description": "Weather for a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]});
    let (status, data) = proxy.post(&format!("/{uuid}/v1/messages"), body).await;
    assert_eq!(status, 200, "{data}");
    let content = data["content"].as_array().unwrap();
    assert_eq!(content[0]["type"], "thinking", "{data}");
    assert_eq!(content[0]["thinking"], "Need the weather.");
    assert_eq!(content[1]["type"], "tool_use");
    assert_eq!(content[1]["input"], json!({"city": "Oslo"}));
    assert_eq!(data["stop_reason"], "tool_use");
}
