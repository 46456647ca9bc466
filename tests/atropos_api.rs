//! The Atropos ManagedServer proxy test suite, ported as black-box HTTP tests (including the
//! tool-call tests it skips without vLLM). Same mock tokenizer (id = code point) and template.

mod common;

use common::mock_worker::Sample;
use common::{Proxy, assert_node_shape, assert_openai_error, chars};
use serde_json::{Value, json};

fn prompt(messages: &[Value], tools: Option<&Value>) -> String {
    let mut out = String::new();
    if let Some(tools) = tools {
        out.push_str(&format!(
            "<tools>{}</tools>\n",
            rollout_proxy::template::pyjson::dumps(
                &minijinja::Value::from(minijinja::value::Serde(tools)),
                &Default::default()
            )
            .unwrap()
        ));
    }
    for m in messages {
        let role = m["role"].as_str().unwrap();
        out.push_str(&format!(
            "<{role}>{}</{role}>",
            m["content"].as_str().unwrap_or("")
        ));
    }
    out + "<assistant>"
}

#[tokio::test]
async fn health_and_models() {
    let proxy = Proxy::atropos();
    let (status, data) = proxy.get("/health").await;
    assert_eq!(status, 200);
    assert_eq!(data["status"], "ok");
    assert_eq!(data["model"], "test_model");
    assert_eq!(data["sessions"], 0);
    assert_eq!(data["servers"], 1);
    assert_eq!(data["healthy_servers"], 1);
    let (status, data) = proxy.get("/v1/models").await;
    assert_eq!(status, 200);
    assert_eq!(data["object"], "list");
    assert_eq!(data["data"].as_array().unwrap().len(), 1);
    assert_eq!(data["data"][0]["id"], "test_model");
    let (status, data) = proxy.get("/v1/models/test_model").await;
    assert_eq!((status, &data["id"]), (200, &json!("test_model")), "{data}");
    let (status, data) = proxy.get("/v1/models/other/model").await;
    assert_eq!(status, 404);
    assert_openai_error(&data);
}

/// Clients whose base URL is a session's (`/{uuid}/v1`: the OpenAI SDK, LiteLLM) list the
/// models there too; an unknown session is a 404, and listing leaves the session unused.
#[tokio::test]
async fn models_under_a_session_base_url() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let (_, before) = proxy.get("/sessions").await;
    let (status, data) = proxy.get(&format!("/{uuid}/v1/models")).await;
    assert_eq!(status, 200, "{data}");
    assert_eq!(data, proxy.get("/v1/models").await.1);
    let (status, data) = proxy.get(&format!("/{uuid}/v1/models/test_model")).await;
    assert_eq!((status, &data["id"]), (200, &json!("test_model")), "{data}");
    let (status, data) = proxy.get(&format!("/{uuid}/v1/models/gpt-4o")).await;
    assert_eq!(status, 404);
    assert_openai_error(&data);
    let (status, data) = proxy.get("/no-such-session/v1/models").await;
    assert_eq!(status, 404);
    assert_openai_error(&data);
    assert_eq!(proxy.get("/sessions").await.1, before);
}

#[tokio::test]
async fn session_management() {
    let proxy = Proxy::atropos();
    let (status, data) = proxy.post("/sessions/create", json!({})).await;
    assert_eq!(status, 200);
    assert!(data["uuid"].is_string());
    assert_eq!(data["model_name"], "test_model");
    assert_eq!(data["tool_parser"], "hermes");
    assert!(data["created_at"].is_number());
    let (_, data) = proxy
        .post("/sessions/create", json!({"tool_parser": "hermes"}))
        .await;
    assert_eq!(data["tool_parser"], "hermes");

    let proxy = Proxy::atropos();
    let mut uuids = Vec::new();
    for _ in 0..3 {
        uuids.push(proxy.session(json!({})).await);
    }
    let (status, data) = proxy.get("/sessions").await;
    assert_eq!(status, 200);
    let listed: std::collections::HashSet<String> = data["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            assert!(s["created_at"].is_number() && s["last_accessed"].is_number());
            assert_eq!(s["num_nodes"], 0);
            s["uuid"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(listed, uuids.iter().cloned().collect());

    let (status, data) = proxy.delete(&format!("/{}", uuids[0])).await;
    assert_eq!(status, 200);
    assert_eq!(data["status"], "deleted");
    assert_eq!(data["uuid"], uuids[0]);
    assert_eq!(proxy.get(&format!("/{}/nodes", uuids[0])).await.0, 404);
    assert_eq!(proxy.delete("/nonexistent-uuid").await.0, 404);
    let (status, _) = proxy
        .chat(
            "nonexistent-uuid",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn basic_completion_and_n() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let messages = vec![json!({"role": "user", "content": "Hello"})];
    proxy.worker.push_sample(Sample::stop(chars("Hi there!")));
    let (status, data) = proxy
        .chat(
            &uuid,
            json!({"messages": messages, "max_tokens": 100, "return_token_ids": true}),
        )
        .await;
    assert_eq!(status, 200, "{data}");
    assert_eq!(data["object"], "chat.completion");
    assert_eq!(data["model"], "test_model");
    assert_eq!(data["choices"].as_array().unwrap().len(), 1);
    assert_eq!(data["choices"][0]["message"]["role"], "assistant");
    assert_eq!(data["choices"][0]["message"]["content"], "Hi there!");
    assert_eq!(data["choices"][0]["finish_reason"], "stop");
    assert!(data["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(proxy.worker.last_prompt(), chars(&prompt(&messages, None)));
    assert_eq!(
        data["prompt_token_ids"],
        json!(chars(&prompt(&messages, None)))
    );
    assert_eq!(data["choices"][0]["token_ids"], json!(chars("Hi there!")));
    assert_eq!(
        proxy.worker.requests()[0]["sampling_params"]["max_new_tokens"],
        100
    );

    let uuid = proxy.session(json!({})).await;
    proxy.worker.push(common::mock_worker::Reply::Samples(
        ["One", "Two", "Three"]
            .iter()
            .map(|t| Sample::stop(chars(t)))
            .collect(),
    ));
    let (status, data) = proxy
        .chat(&uuid, json!({"messages": [{"role": "user", "content": "Pick a number"}], "n": 3, "max_tokens": 50}))
        .await;
    assert_eq!(status, 200, "{data}");
    assert_eq!(data["choices"].as_array().unwrap().len(), 3);
    assert_eq!(data["choices"][2]["message"]["content"], "Three");
    // Prompt ids travel only when asked for (vLLM's `return_token_ids`); sampled ids always.
    assert!(data.get("prompt_token_ids").is_none(), "{data}");
    assert_eq!(data["choices"][2]["token_ids"], json!(chars("Three")));
    assert_eq!(
        proxy.nodes(&uuid).await.len(),
        3,
        "each choice gets its own node"
    );
}

#[tokio::test]
async fn empty_messages_and_system_prompt() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let (status, data) = proxy.chat(&uuid, json!({"messages": []})).await;
    assert_eq!(status, 400);
    assert!(data["error"]["message"].is_string());
    let messages = vec![
        json!({"role": "system", "content": "You are helpful."}),
        json!({"role": "user", "content": "Hi"}),
    ];
    proxy.worker.push_sample(Sample::stop(chars("Hello!")));
    let (status, data) = proxy.chat(&uuid, json!({"messages": messages})).await;
    assert_eq!(status, 200);
    assert_eq!(data["choices"][0]["message"]["content"], "Hello!");
    assert_eq!(proxy.worker.last_prompt(), chars(&prompt(&messages, None)));
}

fn search_tools() -> Value {
    json!([{"type": "function", "function": {"name": "search", "parameters": {}}}])
}

const SEARCH_CALL: &str =
    r#"<tool_call>{"name": "search", "arguments": {"query": "cats"}}</tool_call>"#;

#[tokio::test]
async fn tool_call_outbound_and_nodes_keep_raw_text() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let messages = vec![json!({"role": "user", "content": "Search cats"})];
    proxy.worker.push_sample(Sample::stop(chars(SEARCH_CALL)));
    let (status, data) = proxy
        .chat(
            &uuid,
            json!({"messages": messages, "tools": search_tools()}),
        )
        .await;
    assert_eq!(status, 200, "{data}");
    let choice = &data["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["function"]["name"], "search");
    assert_eq!(calls[0]["type"], "function");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"query": "cats"}));
    assert_eq!(
        proxy.worker.last_prompt(),
        chars(&prompt(&messages, Some(&search_tools())))
    );

    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1);
    let full_text = nodes[0]["full_text"].as_str().unwrap();
    assert!(
        full_text.ends_with(SEARCH_CALL),
        "node keeps the raw text: {full_text}"
    );
}

#[tokio::test]
async fn tool_choice_none_returns_raw_text() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(chars(SEARCH_CALL)));
    let (status, data) = proxy
        .chat(&uuid, json!({"messages": [{"role": "user", "content": "Search cats"}], "tools": search_tools(), "tool_choice": "none"}))
        .await;
    assert_eq!(status, 200);
    let choice = &data["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert!(
        choice["message"]
            .get("tool_calls")
            .is_none_or(Value::is_null)
    );
    assert_eq!(choice["message"]["content"], SEARCH_CALL);
}

#[tokio::test]
async fn render_endpoint() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let data = proxy
        .render(
            &uuid,
            json!({"messages": [{"role": "user", "content": "Hello"}]}),
        )
        .await;
    assert_eq!(
        data["num_tokens"].as_u64().unwrap() as usize,
        data["token_ids"].as_array().unwrap().len()
    );
    assert!(
        data["prompt_text"]
            .as_str()
            .unwrap()
            .contains("<user>Hello</user>")
    );
    let data = proxy
        .render(&uuid, json!({"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function", "function": {"name": "search"}}]}))
        .await;
    assert!(data["prompt_text"].as_str().unwrap().contains("search"));
    assert_eq!(
        proxy.nodes(&uuid).await,
        Vec::<Value>::new(),
        "render creates no node"
    );
    assert!(
        proxy.worker.requests().is_empty(),
        "render calls no backend"
    );
}

#[tokio::test]
async fn nodes_after_completion_are_masked() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    assert!(proxy.nodes(&uuid).await.is_empty());
    let messages = vec![json!({"role": "user", "content": "Hi"})];
    let prompt_len = chars(&prompt(&messages, None)).len();
    proxy.worker.push_sample(Sample::stop(chars("Hello!")));
    proxy.chat(&uuid, json!({"messages": messages})).await;
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1);
    let node = &nodes[0];
    for key in [
        "tokens",
        "masked_tokens",
        "logprobs",
        "full_text",
        "metadata",
    ] {
        assert!(node.get(key).is_some(), "{key}");
    }
    assert_node_shape(node);
    let masked = node["masked_tokens"].as_array().unwrap();
    let logprobs = node["logprobs"].as_array().unwrap();
    assert!(masked[..prompt_len].iter().all(|t| t == -100));
    assert!(logprobs[..prompt_len].iter().all(|lp| lp == 1.0));
    assert!(
        logprobs[prompt_len..]
            .iter()
            .all(|lp| lp.as_f64().unwrap() < 0.0)
    );
    assert_eq!(masked.len() - prompt_len, "Hello!".len());
}

/// Use render for the exact prompt, script the output, run the step (Atropos `_do_step`).
async fn step(
    proxy: &Proxy,
    uuid: &str,
    messages: &[Value],
    output: &str,
    tools: Option<&Value>,
) -> Value {
    let mut body = json!({"messages": messages, "max_tokens": 200});
    if let Some(tools) = tools {
        body["tools"] = tools.clone();
    }
    let rendered = proxy.render(uuid, body.clone()).await;
    proxy.worker.push_sample(Sample::stop(chars(output)));
    let (status, data) = proxy.chat(uuid, body).await;
    assert_eq!(status, 200, "step failed: {data}");
    assert_eq!(
        json!(proxy.worker.last_prompt()),
        rendered["token_ids"],
        "render shows exactly what was sent"
    );
    data
}

#[tokio::test]
async fn ten_message_tool_conversation_is_one_node() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {}}},
        {"type": "function", "function": {"name": "get_forecast", "parameters": {}}},
    ]);
    let mut messages = vec![json!({"role": "user", "content": "What's the weather in SF?"})];
    let data = step(
        &proxy,
        &uuid,
        &messages,
        r#"<tool_call>{"name": "get_weather", "arguments": {"city": "SF"}}</tool_call>"#,
        Some(&tools),
    )
    .await;
    assert_eq!(data["choices"][0]["finish_reason"], "tool_calls");
    let tc1 = data["choices"][0]["message"]["tool_calls"].clone();
    assert_eq!(proxy.nodes(&uuid).await.len(), 1);

    messages.push(json!({"role": "assistant", "content": null, "tool_calls": tc1}));
    messages
        .push(json!({"role": "tool", "tool_call_id": tc1[0]["id"], "content": "72°F and sunny"}));
    let out2 = "The weather in SF is 72°F and sunny! Want the forecast too?";
    step(&proxy, &uuid, &messages, out2, Some(&tools)).await;
    assert_eq!(proxy.nodes(&uuid).await.len(), 1);

    messages.push(json!({"role": "assistant", "content": out2}));
    messages.push(json!({"role": "user", "content": "Yes please, get the forecast"}));
    let data = step(
        &proxy,
        &uuid,
        &messages,
        r#"<tool_call>{"name": "get_forecast", "arguments": {"city": "SF"}}</tool_call>"#,
        Some(&tools),
    )
    .await;
    let tc3 = data["choices"][0]["message"]["tool_calls"].clone();
    assert_eq!(proxy.nodes(&uuid).await.len(), 1);

    messages.push(json!({"role": "assistant", "content": null, "tool_calls": tc3}));
    messages.push(
        json!({"role": "tool", "tool_call_id": tc3[0]["id"], "content": "Rain expected tomorrow"}),
    );
    let out4 = "The forecast says rain is expected tomorrow in SF.";
    step(&proxy, &uuid, &messages, out4, Some(&tools)).await;
    assert_eq!(proxy.nodes(&uuid).await.len(), 1);

    messages.push(json!({"role": "assistant", "content": out4}));
    messages.push(json!({"role": "user", "content": "What about NYC?"}));
    let data = step(
        &proxy,
        &uuid,
        &messages,
        r#"<tool_call>{"name": "get_weather", "arguments": {"city": "NYC"}}</tool_call>"#,
        Some(&tools),
    )
    .await;
    let tc5 = data["choices"][0]["message"]["tool_calls"].clone();
    assert_eq!(proxy.nodes(&uuid).await.len(), 1);

    messages.push(json!({"role": "assistant", "content": null, "tool_calls": tc5}));
    messages
        .push(json!({"role": "tool", "tool_call_id": tc5[0]["id"], "content": "55°F and cloudy"}));
    step(
        &proxy,
        &uuid,
        &messages,
        "NYC is 55°F and cloudy. Quite different from SF!",
        Some(&tools),
    )
    .await;

    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1, "one node after 6 completions");
    let node = &nodes[0];
    assert_node_shape(node);
    let masked = node["masked_tokens"].as_array().unwrap();
    assert!(masked.iter().any(|t| t == -100));
    assert!(masked.iter().any(|t| t != -100));
    assert_eq!(node["metadata"]["num_turns"], 6);
    assert!(node["metadata"]["divergence"].is_null());
}

#[tokio::test]
async fn plain_multi_turn_is_one_node() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let mut conversation = Vec::new();
    for i in 1..=5 {
        conversation.push(json!({"role": "user", "content": format!("Turn {i} question")}));
        let output = format!("Response to turn {i}");
        proxy.worker.push_sample(Sample::stop(chars(&output)));
        let (status, _) = proxy.chat(&uuid, json!({"messages": conversation})).await;
        assert_eq!(status, 200);
        // The prompt the model saw equals the template's rendering of the conversation.
        assert_eq!(
            proxy.worker.last_prompt(),
            chars(&prompt(&conversation, None))
        );
        conversation.push(json!({"role": "assistant", "content": output}));
    }
    assert_eq!(proxy.nodes(&uuid).await.len(), 1);
}

#[tokio::test]
async fn tool_then_plain_then_tool_is_one_node() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let tools = search_tools();
    let mut messages = vec![json!({"role": "user", "content": "Search for cats"})];
    let data = step(
        &proxy,
        &uuid,
        &messages,
        r#"<tool_call>{"name": "search", "arguments": {"q": "cats"}}</tool_call>"#,
        Some(&tools),
    )
    .await;
    let tc = data["choices"][0]["message"]["tool_calls"].clone();
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": tc}));
    messages.push(json!({"role": "tool", "tool_call_id": tc[0]["id"], "content": "Found 10 cats"}));
    step(&proxy, &uuid, &messages, "Here are 10 cats!", Some(&tools)).await;
    messages.push(json!({"role": "assistant", "content": "Here are 10 cats!"}));
    messages.push(json!({"role": "user", "content": "Search for dogs too"}));
    let data = step(
        &proxy,
        &uuid,
        &messages,
        r#"<tool_call>{"name": "search", "arguments": {"q": "dogs"}}</tool_call>"#,
        Some(&tools),
    )
    .await;
    let tc2 = data["choices"][0]["message"]["tool_calls"].clone();
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": tc2}));
    messages.push(json!({"role": "tool", "tool_call_id": tc2[0]["id"], "content": "Found 5 dogs"}));
    step(&proxy, &uuid, &messages, "Found 5 dogs too!", Some(&tools)).await;
    messages.push(json!({"role": "assistant", "content": "Found 5 dogs too!"}));
    messages.push(json!({"role": "user", "content": "Thanks!"}));
    step(&proxy, &uuid, &messages, "You're welcome!", Some(&tools)).await;
    assert_eq!(proxy.nodes(&uuid).await.len(), 1);
}

#[tokio::test]
async fn delete_resets_nodes_and_errors_are_openai_shaped() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(chars("Hello!")));
    proxy
        .chat(
            &uuid,
            json!({"messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await;
    assert_eq!(proxy.delete(&format!("/{uuid}")).await.0, 200);
    assert_eq!(proxy.get(&format!("/{uuid}/nodes")).await.0, 404);
    let (status, data) = proxy.get("/nonexistent-uuid/nodes").await;
    assert_eq!(status, 404);
    assert_openai_error(&data);
}
