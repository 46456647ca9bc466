//! A corpus of bad requests across every API — wrong JSON types in every field a route reads,
//! unknown roles and content parts, malformed tool calls, huge and negative numbers, invalid
//! UTF-8, lone surrogates, deep nesting, truncated bodies, wrong methods, unknown sessions —
//! each a 4xx in its API's error shape; none reaches the backend, and the session is
//! byte-identical afterwards.

mod common;

use common::mock_worker::Sample;
use common::{Proxy, chars};
use serde_json::{Value, json};

/// Values of the wrong type (or range) for a field of each kind.
fn bad_for(kind: &str) -> Vec<Value> {
    let objects = [json!("x"), json!(true), json!([1]), json!(5)];
    match kind {
        "count" => vec![
            json!("x"),
            json!(-1),
            json!(1.5),
            json!(1e30),
            json!([]),
            json!({}),
        ],
        "float" => vec![json!("x"), json!(-5), json!(1e300), json!([]), json!({})],
        "bool" => vec![json!("yes"), json!(1), json!([]), json!({})],
        "int" => vec![json!("x"), json!(1.5), json!(true), json!([]), json!({})],
        "string" => vec![json!(5), json!(true), json!([]), json!({})],
        "object" => objects.to_vec(),
        "strings" => vec![json!("x"), json!(5), json!([1]), json!({})],
        // Out of every backend's range (vLLM and SGLang: -1 or 0 is off).
        "top_k" => vec![json!(-2), json!(-100), json!(1e12), json!("x"), json!(1.5)],
        "unit" => vec![json!(-0.1), json!(1.5), json!("x"), json!([])],
        _ => unreachable!("{kind}"),
    }
}

/// `(route, valid body, fields with their kind, extra bad bodies)` per API.
fn corpus(uuid: &str) -> Vec<(String, Value)> {
    let user = json!([{"role": "user", "content": "hi"}]);
    let mut cases = Vec::new();
    let mut mutate = |path: &str, base: &Value, fields: &[(&str, &str)]| {
        for (field, kind) in fields {
            for value in bad_for(kind) {
                let mut body = base.clone();
                body[*field] = value;
                cases.push((path.to_string(), body));
            }
        }
    };
    let chat = format!("/{uuid}/v1/chat/completions");
    let chat_base = json!({"messages": user});
    mutate(
        &chat,
        &chat_base,
        &[
            ("max_tokens", "count"),
            ("max_completion_tokens", "count"),
            ("temperature", "float"),
            ("top_p", "float"),
            ("n", "count"),
            ("top_logprobs", "count"),
            ("logprobs", "bool"),
            ("stream", "bool"),
            ("parallel_tool_calls", "bool"),
            ("chat_template_kwargs", "object"),
            ("add_generation_prompt", "bool"),
            ("seed", "int"),
            ("top_k", "int"),
            ("top_k", "top_k"),
            ("min_p", "unit"),
        ],
    );
    let completions = format!("/{uuid}/v1/completions");
    mutate(
        &completions,
        &json!({"prompt": "hi"}),
        &[
            ("max_tokens", "count"),
            ("temperature", "float"),
            ("top_p", "float"),
            ("n", "count"),
            ("logprobs", "count"),
            ("top_k", "top_k"),
            ("min_p", "unit"),
        ],
    );
    let messages = format!("/{uuid}/v1/messages");
    let messages_base = json!({"max_tokens": 8, "messages": user});
    mutate(
        &messages,
        &messages_base,
        &[
            ("max_tokens", "count"),
            ("temperature", "float"),
            ("top_p", "float"),
            ("stream", "bool"),
            ("stop_sequences", "strings"),
            ("model", "string"),
            ("top_k", "top_k"),
        ],
    );
    let responses = format!("/{uuid}/v1/responses");
    mutate(
        &responses,
        &json!({"input": "hi"}),
        &[
            ("max_output_tokens", "count"),
            ("temperature", "float"),
            ("top_p", "float"),
            ("stream", "bool"),
            ("store", "bool"),
            ("instructions", "string"),
            ("previous_response_id", "string"),
            ("include", "strings"),
        ],
    );
    // Shapes each API refuses by name.
    let bad_messages = [
        json!("hi"),
        json!(5),
        json!({}),
        json!([]),
        json!([5]),
        json!([{"role": 5}]),
        json!([{"role": "wizard", "content": "x"}]),
        json!([{"role": "user", "content": 5}]),
        json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data/"}}]}]),
        json!([{"role": "user", "content": [{"type": "text"}]}]),
        json!([{"role": "assistant", "tool_calls": "x"}]),
        json!([{"role": "assistant", "tool_calls": [{"function": {"name": 5}}]}]),
        json!([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}]),
        json!([{"role": "user", "tool_calls": []}]),
        // A tool result must say which call it answers; a name is a string.
        json!([{"role": "user", "content": "hi"}, {"role": "tool", "content": "72F"}]),
        json!([{"role": "tool", "content": "72F", "tool_call_id": 5}]),
        json!([{"role": "user", "content": "hi", "name": 5}]),
        json!([{"role": "user", "content": "hi", "name": {"first": "a"}}]),
    ];
    for m in bad_messages {
        cases.push((chat.clone(), json!({"messages": m})));
    }
    for tools in [
        json!("x"),
        json!(5),
        json!([5]),
        json!([{"type": "function"}]),
        json!([{"type": "function", "function": {}}]),
    ] {
        cases.push((chat.clone(), json!({"messages": user, "tools": tools})));
    }
    for choice in [json!(5), json!("maybe"), json!({"x": 1})] {
        cases.push((
            chat.clone(),
            json!({"messages": user, "tool_choice": choice}),
        ));
    }
    // A forced call to a tool that is not declared, or with no tools at all; limits no backend
    // goes past.
    let weather = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    for extra in [
        json!({"tools": weather, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
        json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        json!({"tool_choice": "required"}),
        json!({"max_tokens": 0}),
        json!({"max_completion_tokens": 0}),
        json!({"stop": vec!["x"; 65]}),
        json!({"stop": "x".repeat(5000)}),
        json!({"temperature": -0.5}),
        json!({"top_p": 1.01}),
    ] {
        let mut body = json!({"messages": user});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        cases.push((chat.clone(), body));
    }
    cases.push((
        completions.clone(),
        json!({"prompt": "hi", "max_tokens": 0}),
    ));
    cases.push((
        completions.clone(),
        json!({"prompt": "hi", "stop": vec!["x"; 65]}),
    ));
    for prompt in [
        json!(5),
        json!([-1]),
        json!(["a"]),
        json!([]),
        json!(""),
        json!([1, 4_000_000_000u64]),
        json!({}),
    ] {
        cases.push((completions.clone(), json!({"prompt": prompt})));
    }
    let bad_anthropic = [
        json!({"messages": user}),
        json!({"max_tokens": 8, "messages": "hi"}),
        json!({"max_tokens": 8, "messages": []}),
        json!({"max_tokens": 8, "messages": [{"role": "robot", "content": "x"}]}),
        json!({"max_tokens": 8, "messages": [{"role": "user"}]}),
        json!({"max_tokens": 8, "messages": [{"role": "user", "content": 5}]}),
        json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
        json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://127.0.0.1:9/x.png"}}]}]}),
        json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}),
        json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"text": "no type"}]}]}),
        json!({"max_tokens": 8, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {}}]}]}),
        json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}),
        json!({"max_tokens": 8, "messages": user, "tool_choice": {"type": "tool"}}),
        json!({"max_tokens": 8, "messages": user, "tool_choice": {"type": "sometimes"}}),
        json!({"max_tokens": 8, "messages": user, "thinking": {"type": "maybe"}}),
        json!({"max_tokens": 8, "messages": user, "system": [{"type": "image"}]}),
        json!({"max_tokens": 8, "messages": user, "tools": "x"}),
        json!({"max_tokens": 0, "messages": user}),
        json!({"max_tokens": 8, "messages": user, "tool_choice": {"type": "tool", "name": "nope"},
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]}),
        json!({"max_tokens": 8, "messages": user, "tool_choice": {"type": "any"}}),
        json!({"max_tokens": 8, "messages": user, "temperature": 1.5}),
    ];
    for body in bad_anthropic {
        cases.push((messages.clone(), body));
    }
    let bad_responses = [
        json!({"input": 5}),
        json!({"input": []}),
        json!({"input": [5]}),
        json!({"input": [{"type": "message", "role": "robot", "content": "x"}]}),
        json!({"input": [{"type": "message", "role": "user", "content": 5}]}),
        json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
        json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://[::1]/x.png"}]}]}),
        json!({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}),
        json!({"input": [{"type": "function_call", "call_id": 1, "name": "f", "arguments": "{}"}]}),
        json!({"input": [{"type": "function_call_output", "output": "x"}]}),
        json!({"input": [{"type": "item_reference", "id": "x"}]}),
        json!({"input": [{"type": "teleport"}]}),
        json!({"input": "hi", "text": {"format": {"type": "json_schema"}}}),
        json!({"input": "hi", "tool_choice": "sometimes"}),
        json!({"input": "hi", "tool_choice": {"type": "function"}}),
        json!({"input": "hi", "previous_response_id": "resp_unknown"}),
        json!({"input": "hi", "tools": "x"}),
        json!({"input": "hi", "tool_choice": {"type": "function", "name": "nope"},
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]}),
        json!({"input": "hi", "tool_choice": "required"}),
        json!({"input": "hi", "max_output_tokens": 0}),
    ];
    for body in bad_responses {
        cases.push((responses.clone(), body));
    }
    // Unknown and malformed sessions, on every API.
    let nobody = uuid::Uuid::new_v4();
    for (path, body) in [
        (format!("/{nobody}/v1/chat/completions"), chat_base.clone()),
        (format!("/{nobody}/v1/completions"), json!({"prompt": "hi"})),
        (format!("/{nobody}/v1/messages"), messages_base.clone()),
        (format!("/{nobody}/v1/responses"), json!({"input": "hi"})),
        (
            "/not-a-uuid/v1/chat/completions".to_string(),
            chat_base.clone(),
        ),
        ("/not-a-uuid/v1/messages".to_string(), messages_base.clone()),
        (format!("/{uuid}/v1/nothing"), chat_base.clone()),
    ] {
        cases.push((path, body));
    }
    cases
}

/// Raw bodies that are not JSON, or not JSON we accept.
fn raw_bodies() -> Vec<Vec<u8>> {
    let deep = "[".repeat(100_000);
    vec![
        b"{\"messages\": [".to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}".to_vec(),
        b"not json".to_vec(),
        b"\xff\xfe{\"messages\": []}".to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xc3\x28\"}]}".to_vec(),
        br#"{"messages": [{"role": "user", "content": "\ud800"}]}"#.to_vec(),
        br#"{"messages": [{"role": "user", "content": "\udc00 tail"}]}"#.to_vec(),
        format!("{{\"messages\": {deep}").into_bytes(),
        format!(
            "{{\"max_tokens\": 8, \"messages\": {}}}",
            "[".repeat(5000) + &"]".repeat(5000)
        )
        .into_bytes(),
        b"[]".to_vec(),
        b"5".to_vec(),
        b"null".to_vec(),
    ]
}

/// `path` may be followed by the request, for the message.
fn assert_error_shape(path: &str, status: u16, body: &Value) {
    assert!((400..500).contains(&status), "{path}: {status} {body}");
    if path.contains("/v1/messages") {
        assert_eq!(body["type"], "error", "{path}: {body}");
        assert!(
            body["error"]["type"].is_string() && body["error"]["message"].is_string(),
            "{path}: {body}"
        );
    } else {
        common::assert_openai_error(body);
    }
}

#[tokio::test]
async fn every_bad_request_is_a_4xx_in_its_apis_shape_and_changes_nothing() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(chars("fine")));
    let (status, _) = proxy
        .chat(
            &uuid,
            json!({"messages": [{"role": "user", "content": "a"}]}),
        )
        .await;
    assert_eq!(status, 200);
    let before = proxy.get(&format!("/{uuid}/nodes")).await;
    let requests_before = proxy.worker.requests().len();

    let cases = corpus(&uuid);
    let mut count = 0;
    for (path, body) in &cases {
        let (status, data) = proxy.post(path, body.clone()).await;
        assert_error_shape(&format!("{path} {body}"), status, &data);
        count += 1;
    }
    let routes = [
        format!("/{uuid}/v1/chat/completions"),
        format!("/{uuid}/v1/completions"),
        format!("/{uuid}/v1/messages"),
        format!("/{uuid}/v1/responses"),
    ];
    for path in &routes {
        for raw in raw_bodies() {
            let response = reqwest::Client::new()
                .post(format!("{}{path}", proxy.url))
                .header("content-type", "application/json")
                .body(raw)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let data: Value = response.json().await.unwrap_or(Value::Null);
            assert_error_shape(path, status, &data);
            count += 1;
        }
        // Wrong methods.
        for method in [
            reqwest::Method::GET,
            reqwest::Method::PUT,
            reqwest::Method::DELETE,
        ] {
            let response = reqwest::Client::new()
                .request(method.clone(), format!("{}{path}", proxy.url))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let data: Value = response.json().await.unwrap_or(Value::Null);
            assert_error_shape(path, status, &data);
            count += 1;
        }
    }
    assert!(count >= 200, "{count} requests");
    assert_eq!(
        proxy.worker.requests().len(),
        requests_before,
        "nothing reached the backend"
    );
    assert_eq!(
        proxy.get(&format!("/{uuid}/nodes")).await,
        before,
        "the session is unchanged"
    );
}
