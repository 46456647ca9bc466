//! The OpenAI Responses API on a session (what Codex CLI and the Agents SDK speak): items read
//! into the turn, `response` objects and event streams, stored responses continued with
//! `previous_response_id`, reasoning returned as `encrypted_content` and matched when sent
//! back, built-in tools left out and named in the node.

mod common;

use common::mock_worker::Sample;
use common::{assert_node_shape, assert_openai_error, qwen3_proxy, sampled_ids};
use serde_json::{Value, json};

fn tools() -> Value {
    json!([
        {"type": "function", "name": "exec_command", "description": "Runs a command",
         "strict": false, "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
        {"type": "namespace", "name": "files", "description": "File tools",
         "tools": [{"type": "function", "name": "read", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]},
        {"type": "web_search", "external_web_access": false},
    ])
}

/// What Codex sends, trimmed: developer and user messages of `input_text` parts, empty
/// instructions, three kinds of tools, reasoning with encrypted content, nothing stored.
fn codex_turn(extra: &[Value]) -> Value {
    let mut input = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What does a.txt say?"}]}),
    ];
    input.extend(extra.iter().cloned());
    json!({
        "model": "gpt-5.5-codex", "instructions": "", "input": input, "tools": tools(),
        "tool_choice": "auto", "parallel_tool_calls": true, "store": false, "stream": false,
        "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "k1", "client_metadata": {"x": "y"}
    })
}

const CALL_TEXT: &str = "<think>\nI will read it.\n</think>\n\nReading.\n<tool_call>\n{\"name\": \"exec_command\", \"arguments\": {\"cmd\": \"cat a.txt\"}}\n</tool_call><|im_end|>";

#[tokio::test]
async fn a_codex_tool_loop_is_one_node_holding_exactly_the_sampled_ids() {
    let (tok, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({"reasoning": true})).await;
    let path = format!("/{uuid}/v1/responses");
    let call = tok.encode(CALL_TEXT).unwrap();
    proxy.worker.push_sample(Sample::stop(call.clone()));
    let (status, response) = proxy.post(&path, codex_turn(&[])).await;
    assert_eq!(status, 200, "{response}");
    let first_prompt = proxy.worker.last_prompt();
    assert!(response["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(response["object"], "response");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["model"], "gpt-5.5-codex");
    let output = response["output"].as_array().unwrap();
    let kinds: Vec<_> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["reasoning", "message", "function_call"]);
    assert_eq!(output[0]["content"][0]["text"], "I will read it.");
    assert!(output[0]["encrypted_content"].is_string());
    assert_eq!(output[1]["content"][0]["type"], "output_text");
    assert_eq!(output[1]["content"][0]["text"], "Reading.\n");
    assert_eq!(output[2]["call_id"], "call_0");
    assert_eq!(output[2]["name"], "exec_command");
    let arguments: Value = serde_json::from_str(output[2]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"cmd": "cat a.txt"}));
    assert_eq!(response["usage"]["input_tokens"], first_prompt.len());
    assert_eq!(response["usage"]["output_tokens"], call.len());
    assert!(response["usage"]["input_tokens_details"]["cached_tokens"].is_number());
    let prompt = tok.decode(&first_prompt);
    assert!(
        prompt.starts_with("<|im_start|>system\nYou are Codex."),
        "{prompt}"
    );
    assert!(
        prompt.contains("\"name\": \"files.read\""),
        "namespaced tools are declared"
    );
    assert!(
        !prompt.contains("web_search"),
        "built-in tools are left out"
    );

    // Turn 2: the whole input again (store: false), the output items sent back as they came.
    let mut items: Vec<Value> = output.to_vec();
    items.push(json!({"type": "function_call_output", "call_id": "call_0", "output": "hello"}));
    let answer = tok
        .encode("<think>\nDone.\n</think>\n\nIt says hello.<|im_end|>")
        .unwrap();
    proxy.worker.push_sample(Sample::stop(answer.clone()));
    let (status, response) = proxy.post(&path, codex_turn(&items)).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(
        response["output"][1]["content"][0]["text"],
        "It says hello."
    );
    let second_prompt = proxy.worker.last_prompt();
    assert_eq!(
        &second_prompt[..first_prompt.len() + call.len()],
        [first_prompt.as_slice(), call.as_slice()].concat(),
        "the second prompt extends the first turn's ids exactly"
    );
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1, "one rollout, one node");
    assert_node_shape(&nodes[0]);
    assert_eq!(sampled_ids(&nodes[0]), [call, answer].concat());
    let turn = &nodes[0]["metadata"]["turns"][0];
    assert_eq!(turn["api"], "responses");
    assert_eq!(turn["tools_left_out"], json!(["web_search"]));
}

#[tokio::test]
async fn a_streamed_response_writes_every_event_in_order() {
    let (tok, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    let text = "Reading.\n<tool_call>\n{\"name\": \"files.read\", \"arguments\": {\"path\": \"a.txt\"}}\n</tool_call><|im_end|>";
    proxy
        .worker
        .push_sample(Sample::stop(tok.encode(text).unwrap()));
    let (status, raw, events) = proxy
        .post_stream(&format!("/{uuid}/v1/responses"), codex_turn(&[]))
        .await;
    assert_eq!(status, 200, "{raw}");
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["sequence_number"], i, "{name}");
    }
    let mut names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    let deltas = names
        .iter()
        .filter(|n| **n == "response.output_text.delta")
        .count();
    assert!(deltas >= 2, "token by token: {names:?}");
    names.dedup();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let call = events
        .iter()
        .find(|(name, d)| {
            name == "response.output_item.done" && d["item"]["type"] == "function_call"
        })
        .unwrap();
    assert_eq!(call.1["item"]["name"], "read");
    assert_eq!(call.1["item"]["namespace"], "files");
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["output"].as_array().unwrap().len(), 2);
    assert_eq!(
        completed["usage"]["input_tokens"],
        proxy.worker.last_prompt().len()
    );

    // The call sent back (with its namespace) extends the node.
    let mut items: Vec<Value> = completed["output"].as_array().unwrap().clone();
    items.push(json!({"type": "function_call_output", "call_id": "call_0", "output": "hi"}));
    proxy
        .worker
        .push_sample(Sample::stop(tok.encode("hi<|im_end|>").unwrap()));
    let (status, raw, _) = proxy
        .post_stream(&format!("/{uuid}/v1/responses"), codex_turn(&items))
        .await;
    assert_eq!(status, 200, "{raw}");
    assert_eq!(proxy.nodes(&uuid).await.len(), 1);
}

#[tokio::test]
async fn a_stored_response_is_continued_by_id() {
    let (tok, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/responses");
    proxy
        .worker
        .push_sample(Sample::stop(tok.encode("Paris.<|im_end|>").unwrap()));
    let (status, first) = proxy
        .post(
            &path,
            json!({"input": "Capital of France?", "instructions": "Be brief."}),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    let id = first["id"].as_str().unwrap();
    let (status, stored) = proxy.get(&format!("{path}/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(stored, first);

    proxy
        .worker
        .push_sample(Sample::length(tok.encode("Berlin is").unwrap()));
    let body = json!({"previous_response_id": id, "input": "And Germany?", "instructions": "Be brief.",
        "max_output_tokens": 3});
    let (_, rendered) = proxy.post(&format!("{path}/render"), body.clone()).await;
    assert_eq!(rendered["extends_node"], 0, "{rendered}");
    let (status, second) = proxy.post(&path, body).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["status"], "incomplete");
    assert_eq!(second["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(second["previous_response_id"], id);
    let sent: Vec<u32> = serde_json::from_value(rendered["token_ids"].clone()).unwrap();
    assert_eq!(sent, proxy.worker.last_prompt());
    assert_eq!(
        proxy.worker.requests()[1]["sampling_params"]["max_new_tokens"],
        3
    );
    assert_eq!(proxy.nodes(&uuid).await.len(), 1);
}

#[tokio::test]
async fn bad_requests_get_openai_errors_and_change_nothing() {
    let (_, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/responses");
    let cases = [
        (json!({"input": 3}), "input"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}]}),
            "input[0].content[0]: a data: URL needs a ','",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image",
                "image_url": common::images::data_url(&common::images::png(8, 8, 0), "image/png")}]}]}),
            "this model takes no images",
        ),
        (
            json!({"input": "hi", "previous_response_id": "resp_nope"}),
            "previous_response_id",
        ),
        (
            json!({"input": "hi", "text": {"format": {"type": "xml"}}}),
            "text.format",
        ),
        (
            json!({"input": [{"type": "function_call", "call_id": 5}]}),
            "input[0]",
        ),
    ];
    for (body, needle) in cases {
        let (status, data) = proxy.post(&path, body.clone()).await;
        assert_eq!(status, 400, "{body} → {data}");
        assert_openai_error(&data);
        assert!(
            data["error"]["message"].as_str().unwrap().contains(needle),
            "{data}"
        );
    }
    let (status, data) = proxy.get(&format!("{path}/resp_nope")).await;
    assert_eq!(status, 404, "{data}");
    assert_openai_error(&data);
    assert!(proxy.worker.requests().is_empty());
    assert!(proxy.nodes(&uuid).await.is_empty());
}

#[tokio::test]
async fn a_long_rollout_keeps_and_journals_each_item_once() {
    let dir = common::scratch_dir("responses-linear");
    let worker = common::mock_worker::MockWorker::start(common::mock_worker::Wire::Sglang);
    worker.respond_with(std::sync::Arc::new(|_: &[u32]| {
        Sample::stop(common::chars("noted"))
    }));
    let journal_dir = dir.clone();
    let proxy = common::Proxy::start_with(common::char_model_dir(), None, worker, move |s| {
        s.data_dir = Some(journal_dir);
    });
    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/responses");
    let journal = dir.join("journal");
    let size = || std::fs::metadata(&journal).unwrap().len();
    let mut sizes = vec![size()];
    let mut previous: Option<String> = None;
    for turn in 0..40 {
        // 8 KB new each turn.
        let mut body = json!({"input": format!("{turn:04} {}", "x".repeat(8 * 1024))});
        if let Some(id) = &previous {
            body["previous_response_id"] = json!(id);
        }
        let (status, reply) = proxy.post(&path, body).await;
        assert_eq!(status, 200, "{reply}");
        previous = Some(reply["id"].as_str().unwrap().to_string());
        sizes.push(size());
    }
    let (early, late) = (sizes[10] - sizes[0], sizes[40] - sizes[30]);
    assert!(
        late * 2 < early * 3,
        "journal growth is linear: turns 1-10 wrote {early} bytes, turns 31-40 {late}"
    );
    // The last response still stands on the whole conversation.
    let body = json!({"input": "last", "previous_response_id": previous});
    let (status, rendered) = proxy.post(&format!("{path}/render"), body).await;
    assert_eq!(status, 200, "{rendered}");
    let text = rendered["prompt_text"].as_str().unwrap();
    for turn in [0, 17, 39] {
        assert!(
            text.contains(&format!("{turn:04} xxx")),
            "turn {turn} is in the prompt"
        );
    }
    assert_eq!(text.matches("noted").count(), 40);
}
