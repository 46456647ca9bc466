//! Forced tool calls and structured output, enforced by constrained decoding: on the real
//! default model in the in-process engine and in a real llama-server (a 135M model that,
//! asked with no examples, answers in prose), a forced call is always a call to the right
//! tool with schema-valid arguments, and `response_format` always valid JSON; the node still
//! records exactly what was sampled. SGLang and vLLM get the grammar in their wire fields; a
//! backend or tool format that cannot enforce it is refused with a 400 naming the option.

mod common;

use common::llama::LlamaServer;
use common::mock_worker::{MockWorker, Sample, Wire};
use common::{Proxy, assert_openai_error, engine_proxy, fixture_model, qwen3_proxy, sampled_ids};
use rollout_proxy::backend::{BackendConfig, BackendKind};
use serde_json::{Value, json};

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
            "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}})
}

fn question(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [weather_tool(), {"type": "function", "function": {"name": "get_time",
            "parameters": {"type": "object", "properties": {}}}}],
        "max_tokens": 60});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

/// The reply's one call: name and arguments.
fn the_call(reply: &Value) -> (String, Value) {
    let calls = reply["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("no tool calls: {reply}"));
    assert!(!calls.is_empty(), "{reply}");
    let function = &calls[0]["function"];
    let arguments = serde_json::from_str(function["arguments"].as_str().unwrap()).unwrap();
    (function["name"].as_str().unwrap().to_string(), arguments)
}

/// Checks a forced call to `get_weather`: its arguments satisfy the schema.
fn assert_weather_call(reply: &Value) {
    let (name, arguments) = the_call(reply);
    assert_eq!(name, "get_weather", "{reply}");
    assert!(arguments["city"].is_string(), "{arguments}");
    let unit = &arguments["unit"];
    assert!(
        unit.is_null() || unit == "celsius" || unit == "fahrenheit",
        "{arguments}"
    );
    assert_eq!(reply["choices"][0]["finish_reason"], "tool_calls");
}

/// Forced calls, free and named, and structured output on one proxy; `label` names the backend.
async fn enforced_on(proxy: &Proxy, label: &str) {
    // Without a constraint the model answers in prose.
    let uuid = proxy.session(json!({})).await;
    let (status, free) = proxy.chat(&uuid, question(json!({"temperature": 0}))).await;
    assert_eq!(status, 200, "{free}");
    assert!(
        free["choices"][0]["message"]["tool_calls"].is_null(),
        "{label}: the unconstrained model already calls a tool: {free}"
    );
    for seed in 0..3 {
        let uuid = proxy.session(json!({})).await;
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let (status, reply) = proxy
            .chat(
                &uuid,
                question(json!({"tool_choice": named, "temperature": 1.0, "seed": seed})),
            )
            .await;
        assert_eq!(status, 200, "{label}: {reply}");
        assert_weather_call(&reply);
        // The node holds what was sampled: the call as the model wrote it.
        let nodes = proxy.nodes(&uuid).await;
        assert_eq!(
            sampled_ids(&nodes[0]),
            serde_json::from_value::<Vec<u32>>(reply["choices"][0]["token_ids"].clone()).unwrap()
        );
        assert!(
            nodes[0]["full_text"]
                .as_str()
                .unwrap()
                .contains("<tool_call>")
        );
    }
    let uuid = proxy.session(json!({})).await;
    let (_, reply) = proxy
        .chat(
            &uuid,
            question(json!({"tool_choice": "required", "temperature": 0})),
        )
        .await;
    let (name, _) = the_call(&reply);
    assert!(
        name == "get_weather" || name == "get_time",
        "{label}: {reply}"
    );

    let schema = json!({"type": "object", "properties": {"city": {"type": "string"},
        "temperature_c": {"type": "integer"}}, "required": ["city", "temperature_c"]});
    let uuid = proxy.session(json!({})).await;
    let body = json!({"messages": [{"role": "user", "content": "Describe the weather in Oslo."}],
        "max_tokens": 60, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}});
    let (status, reply) = proxy.chat(&uuid, body).await;
    assert_eq!(status, 200, "{label}: {reply}");
    let content = reply["choices"][0]["message"]["content"].as_str().unwrap();
    let answer: Value = serde_json::from_str(content.trim())
        .unwrap_or_else(|e| panic!("{label}: not JSON ({e}): {content}"));
    assert!(
        answer["city"].is_string() && answer["temperature_c"].is_i64(),
        "{answer}"
    );
}

#[tokio::test]
async fn the_engine_enforces_forced_calls_and_schemas() {
    enforced_on(&engine_proxy(), "engine").await;
}

#[tokio::test]
async fn llama_server_enforces_forced_calls_and_schemas() {
    let server = LlamaServer::start();
    let url = server.url();
    let proxy = Proxy::start_with(
        fixture_model("smollm2"),
        Some("hermes"),
        MockWorker::start(Wire::Sglang),
        move |settings| {
            settings.backends.clear();
            settings.config.servers = vec![BackendConfig::new(&url, BackendKind::Llamacpp)];
        },
    );
    enforced_on(&proxy, "llama-server").await;
}

/// The upstream request of a forced call on a scripted server of `wire`.
async fn upstream_request(wire: Wire, body: Value) -> Value {
    let proxy = Proxy::start(fixture_model("qwen3"), None, wire);
    let uuid = proxy.session(json!({})).await;
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let tokenizer =
        rollout_proxy::tokenizer::Tokenizer::from_path(&fixture_model("qwen3")).unwrap();
    let mut ids = tokenizer.encode(text).unwrap();
    ids.extend(tokenizer.encode("<|im_end|>").unwrap());
    let (status, reply) = proxy.turn(&uuid, Sample::stop(ids), body).await;
    assert_eq!(status, 200, "{reply}");
    assert_weather_call(&reply);
    proxy.worker.requests().pop().unwrap()
}

#[tokio::test]
async fn sglang_and_vllm_get_the_grammar_in_their_fields() {
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let sglang = upstream_request(Wire::Sglang, question(json!({"tool_choice": named}))).await;
    let ebnf = sglang["sampling_params"]["ebnf"].as_str().unwrap();
    assert!(ebnf.starts_with("root ::= "), "{ebnf}");
    // Qwen3 may think first, and then writes "\n\n" (one token) before the call: allowed.
    assert!(
        ebnf.contains(r#"think-end ::= "</think>" ( "\n\n" | ws )"#),
        "{ebnf}"
    );
    // The call follows in Hermes' tags.
    assert!(
        ebnf.contains("\"<think>\"") && ebnf.contains("\"<tool_call>\\n\""),
        "{ebnf}"
    );
    assert!(
        ebnf.contains(r#""\"get_weather\"""#) && !ebnf.contains("get_time"),
        "{ebnf}"
    );

    let vllm = upstream_request(Wire::Vllm, question(json!({"tool_choice": "required"}))).await;
    let grammar = vllm["structured_outputs"]["grammar"].as_str().unwrap();
    assert!(grammar.contains("get_time") && grammar.contains("get_weather"));
}

/// With thinking off, Qwen3's generation prompt already holds an empty, closed think block:
/// the forced call's grammar opens none (found against a real vLLM, where the grammar let a
/// random model open a block it never closed).
#[tokio::test]
async fn a_prompt_that_closed_its_think_block_gets_a_grammar_without_one() {
    let off =
        json!({"tool_choice": "required", "chat_template_kwargs": {"enable_thinking": false}});
    let sent = upstream_request(Wire::Sglang, question(off)).await;
    let ebnf = sent["sampling_params"]["ebnf"].as_str().unwrap();
    assert!(
        !ebnf.contains("<think>") && !ebnf.contains("</think>"),
        "{ebnf}"
    );
    assert!(ebnf.starts_with("root ::= call"), "{ebnf}");
}

#[tokio::test]
async fn responses_text_format_is_enforced_too() {
    let (tokenizer, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(
        tokenizer.encode("{\"n\": 4}<|im_end|>").unwrap(),
    ));
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
    let body = json!({"input": "2 + 2?", "text": {"format": {"type": "json_schema",
        "name": "sum", "schema": schema, "strict": true}}});
    let (status, reply) = proxy.post(&format!("/{uuid}/v1/responses"), body).await;
    assert_eq!(status, 200, "{reply}");
    let sent = proxy.worker.requests().pop().unwrap();
    let sent_schema: Value =
        serde_json::from_str(sent["sampling_params"]["json_schema"].as_str().unwrap()).unwrap();
    assert_eq!(sent_schema, schema);
}

#[tokio::test]
async fn text_completions_take_response_format_too() {
    let (tokenizer, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    proxy
        .worker
        .push_sample(Sample::stop(tokenizer.encode("{}<|im_end|>").unwrap()));
    let body = json!({"prompt": "JSON please:", "max_tokens": 8,
        "response_format": {"type": "json_object"}});
    let (status, reply) = proxy.post(&format!("/{uuid}/v1/completions"), body).await;
    assert_eq!(status, 200, "{reply}");
    let sent = proxy.worker.requests().pop().unwrap();
    assert_eq!(
        sent["sampling_params"]["json_schema"],
        "{\"type\":\"object\"}"
    );
    let bad = json!({"prompt": "x", "response_format": {"type": "yaml"}});
    let (status, error) = proxy.post(&format!("/{uuid}/v1/completions"), bad).await;
    assert_eq!(status, 400, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("response_format")
    );
}

#[tokio::test]
async fn anthropic_any_is_enforced_too() {
    let (tokenizer, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>";
    proxy
        .worker
        .push_sample(Sample::stop(tokenizer.encode(text).unwrap()));
    let body = json!({"model": "m", "max_tokens": 60, "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object",
            "properties": {"city": {"type": "string"}}, "required": ["city"]}}]});
    let (status, reply) = proxy.post(&format!("/{uuid}/v1/messages"), body).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["stop_reason"], "tool_use");
    let sent = proxy.worker.requests().pop().unwrap();
    assert!(
        sent["sampling_params"]["ebnf"]
            .as_str()
            .unwrap()
            .contains("get_weather")
    );
}

#[tokio::test]
async fn what_cannot_be_enforced_is_refused_naming_the_option() {
    // A tool format whose markers are special tokens.
    let (_, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({"tool_parser": "mistral"})).await;
    let (status, error) = proxy
        .chat(&uuid, question(json!({"tool_choice": "required"})))
        .await;
    assert_eq!(status, 400, "{error}");
    assert_openai_error(&error);
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("tool_choice") && message.contains("'mistral'"),
        "{message}"
    );
    assert!(proxy.nodes(&uuid).await.is_empty(), "nothing recorded");
    assert!(proxy.worker.requests().is_empty(), "nothing sent");

    // A backend without constrained decoding.
    let proxy = Proxy::start(fixture_model("qwen3"), None, Wire::OpenAiText);
    let uuid = proxy.session(json!({})).await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_object"}});
    let (status, error) = proxy.chat(&uuid, body).await;
    assert_eq!(status, 400, "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("'response_format'"), "{message}");
    assert!(proxy.nodes(&uuid).await.is_empty());

    // A response_format that is not one.
    let body = json!({"messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "xml"}});
    let (status, error) = proxy.chat(&uuid, body).await;
    assert_eq!(status, 400);
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("response_format")
    );
}

/// Every kind of grammar the proxy writes, and texts each must and must not match.
fn grammar_cases() -> Vec<Value> {
    use rollout_proxy::grammar::{Reasoning, for_request, gbnf};
    use rollout_proxy::http::openai::request::ChatCompletionBody;
    let with_separator = |extra: Value, format: &str, reasoning: Reasoning, separator| {
        let body: ChatCompletionBody = serde_json::from_value(question(extra)).unwrap();
        let request = body.validate(None).unwrap().turn;
        gbnf(
            &for_request(&request, format, reasoning, separator)
                .unwrap()
                .unwrap(),
        )
    };
    let grammar = |extra: Value, format: &str, reasoning: Reasoning| {
        with_separator(extra, format, reasoning, None)
    };
    // What Qwen3's template writes between its think block and a call: one token, "\n\n".
    let qwen3 =
        rollout_proxy::template::load_template(None, Some(&fixture_model("qwen3"))).unwrap();
    let separator = rollout_proxy::tools::detect::think_separator(&qwen3);
    assert_eq!(separator.as_deref(), Some("\n\n"));
    let named = json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let required = json!({"tool_choice": "required"});
    let hermes = |arguments: &str| {
        format!(
            "<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {arguments}}}\n</tool_call>"
        )
    };
    let paris = hermes(r#"{"city": "Paris"}"#);
    let time = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"},
        "temperature_c": {"type": "integer"}}, "required": ["city", "temperature_c"]});
    let schema_body = json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "w", "schema": schema}}});
    vec![
        json!({"name": "hermes, named", "grammar": grammar(named.clone(), "hermes", Reasoning::None),
            "accept": [paris, hermes(r#"{"city":"Paris","unit":"celsius"}"#),
                hermes("{\n  \"city\": \"Paris\"\n}")],
            "reject": [hermes(r#"{"city": "Paris", "unit": "kelvin"}"#), hermes("{}"), time,
                "It is sunny.", hermes(&format!("{{\n{}\"city\": \"Paris\"}}", " ".repeat(21)))]}),
        json!({"name": "hermes, required, thinking", "grammar": grammar(required.clone(), "hermes", Reasoning::MayOpen),
            "accept": [format!("<think>a < b, </x></think>\n{paris}"), format!("{paris}\n{time}"),
                time],
            "reject": [format!("<think>x</think>It is sunny.")]}),
        json!({"name": "hermes, required, thinking, Qwen3's separator",
            "grammar": with_separator(required.clone(), "hermes", Reasoning::MayOpen, separator.as_deref()),
            "accept": [format!("<think>x</think>\n\n{paris}"), format!("<think>x</think>\n{paris}"), time.to_string()],
            "reject": [format!("<think>x</think>\n\n\n\n{paris}")]}),
        json!({"name": "hermes, required, in an opened block", "grammar": grammar(required, "hermes", Reasoning::Open),
            "accept": [format!("a < b, </x></think>\n{paris}"), format!("</think>{time}")],
            "reject": [paris.clone(), "x</think>It is sunny.".to_string()]}),
        json!({"name": "qwen3_coder, named", "grammar": grammar(named.clone(), "qwen3_coder", Reasoning::None),
            "accept": ["<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
                </function>\n</tool_call>"],
            "reject": ["<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"]}),
        json!({"name": "llama3_json, named", "grammar": grammar(named, "llama3_json", Reasoning::None),
            "accept": [r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#],
            "reject": [r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#]}),
        json!({"name": "response_format", "grammar": grammar(schema_body, "hermes", Reasoning::None),
            "accept": [r#"{"city": "Oslo", "temperature_c": -3}"#],
            "reject": [r#"{"city": "Oslo"}"#, r#"{"city": 3, "temperature_c": 1}"#]}),
    ]
}

#[test]
fn xgrammar_reads_every_grammar_the_proxy_writes() {
    let [python] = <[_; 1]>::try_from(common::installed(
        "install-xgrammar.sh",
        &["XGRAMMAR_PYTHON"],
    ))
    .unwrap();
    let cases = common::scratch_dir("xgrammar").join("cases.json");
    std::fs::write(&cases, serde_json::to_vec(&grammar_cases()).unwrap()).unwrap();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/grammar/xgrammar_check.py");
    let output = std::process::Command::new(python)
        .arg(script)
        .arg(&cases)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
