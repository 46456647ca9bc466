//! The token-exact node invariants on real tokenizers and chat templates (Qwen3, Llama 3.1,
//! SmolLM2 with the bundled Hermes template), against a scripted SGLang or vLLM upstream.

mod common;

use common::mock_worker::{Sample, Wire};
use common::{Proxy, assert_node_shape, fixture_model};
use rollout_proxy::tokenizer::Tokenizer;
use serde_json::{Value, json};

fn tokenizer(name: &str) -> Tokenizer {
    Tokenizer::from_path(&fixture_model(name)).unwrap()
}

fn ids(node: &Value) -> Vec<u32> {
    serde_json::from_value(node["tokens"].clone()).unwrap()
}

fn contains(haystack: &[u32], needle: &[u32]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Invariant 1: a deliberately non-canonical sampling (a word as single characters) appears
/// verbatim in the next prompt and the node; a re-tokenizing proxy would merge it.
#[tokio::test]
async fn sampled_tokens_are_never_retokenized() {
    let tok = tokenizer("qwen3");
    let proxy = Proxy::start(fixture_model("qwen3"), None, Wire::Sglang);
    let uuid = proxy.session(json!({})).await;
    let mut sampled: Vec<u32> = "Hello"
        .chars()
        .map(|c| tok.encode(&c.to_string()).unwrap()[0])
        .collect();
    sampled.extend(tok.encode(" world").unwrap());
    sampled.push(tok.token_id("<|im_end|>").unwrap());
    assert_ne!(
        tok.encode("Hello").unwrap(),
        sampled[..5].to_vec(),
        "the sampling is non-canonical"
    );
    proxy.worker.push_sample(Sample::stop(sampled.clone()));
    let mut messages = vec![json!({"role": "user", "content": "Say hello"})];
    let (status, data) = proxy.chat(&uuid, json!({"messages": messages})).await;
    assert_eq!(status, 200, "{data}");
    assert_eq!(data["choices"][0]["message"]["content"], "Hello world");

    messages.push(json!({"role": "assistant", "content": "Hello world"}));
    messages.push(json!({"role": "user", "content": "Again"}));
    proxy
        .turn(
            &uuid,
            Sample::stop(tok.encode("Hi<|im_end|>").unwrap()),
            json!({"messages": messages}),
        )
        .await;
    let prompt = proxy.worker.last_prompt();
    assert!(
        contains(&prompt, &sampled),
        "second prompt carries the sampled ids verbatim"
    );
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1);
    assert!(contains(&ids(&nodes[0]), &sampled));
    assert_node_shape(&nodes[0]);
}

/// Invariants 2 and 4: logprobs are the backend's, masks follow sampling, earlier turns stay
/// unmasked; an EOS-ended turn gets no second `<|im_end|>` (with and without tools), and the
/// prompt of a turn is the node's ids plus the new suffix.
#[tokio::test]
async fn eos_is_not_duplicated_and_prompt_extends_the_node() {
    for tools in [
        None,
        Some(json!([{"type": "function", "function": {"name": "search", "parameters": {}}}])),
    ] {
        let tok = tokenizer("qwen3");
        let proxy = Proxy::start(fixture_model("qwen3"), None, Wire::Sglang);
        let uuid = proxy.session(json!({})).await;
        let im_end = tok.token_id("<|im_end|>").unwrap();
        let first = tok
            .encode("<think>\nok\n</think>\n\nSure.<|im_end|>")
            .unwrap();
        proxy.worker.push_sample(Sample::stop(first.clone()));
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
        if let Some(tools) = &tools {
            body["tools"] = tools.clone();
        }
        let (_, data) = proxy.chat(&uuid, body.clone()).await;
        let content = data["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        let node_after_1 = ids(&proxy.nodes(&uuid).await[0]);

        body["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "assistant", "content": content}));
        body["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "user", "content": "more"}));
        proxy
            .worker
            .push_sample(Sample::stop(tok.encode("Done.<|im_end|>").unwrap()));
        proxy.chat(&uuid, body).await;
        let prompt = proxy.worker.last_prompt();
        assert_eq!(
            &prompt[..node_after_1.len()],
            &node_after_1[..],
            "prompt = node ids + suffix"
        );
        let suffix = tok.decode(&prompt[node_after_1.len()..]);
        assert_eq!(
            suffix,
            "\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(!prompt.windows(2).any(|w| w == [im_end, im_end]));

        let nodes = proxy.nodes(&uuid).await;
        assert_eq!(nodes.len(), 1);
        assert_node_shape(&nodes[0]);
        let masked = nodes[0]["masked_tokens"].as_array().unwrap();
        let first_start = node_after_1.len() - first.len();
        assert_eq!(
            masked[first_start..node_after_1.len()],
            json!(first).as_array().unwrap()[..],
            "turn 1 stays unmasked"
        );
        let logprobs = nodes[0]["logprobs"].as_array().unwrap();
        assert!(
            (logprobs[first_start].as_f64().unwrap() - (-0.1)).abs() < 1e-6,
            "the backend's logprob"
        );
    }
}

/// Invariant 4: a turn cut by max_tokens gets the template's closing tokens as masked prompt.
#[tokio::test]
async fn length_cut_turn_gets_closing_tokens_as_prompt() {
    let tok = tokenizer("qwen3");
    let proxy = Proxy::start(fixture_model("qwen3"), None, Wire::Vllm);
    let uuid = proxy.session(json!({})).await;
    let cut = tok.encode("A very long ans").unwrap();
    let (_, data) = proxy
        .turn(
            &uuid,
            Sample::length(cut.clone()),
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
        )
        .await;
    assert_eq!(data["choices"][0]["finish_reason"], "length");
    let content = data["choices"][0]["message"]["content"].clone();
    proxy.turn(&uuid, Sample::stop(tok.encode("ok<|im_end|>").unwrap()), json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}, {"role": "user", "content": "go on"}]})).await;
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1);
    let tokens = ids(&nodes[0]);
    let masked = nodes[0]["masked_tokens"].as_array().unwrap();
    let end = tokens.windows(cut.len()).position(|w| w == cut).unwrap() + cut.len();
    assert_eq!(tokens[end], tok.token_id("<|im_end|>").unwrap());
    assert_eq!(masked[end], -100, "the closing token was not sampled");
    assert_eq!(
        nodes[0]["metadata"]["finish_reasons"],
        json!(["length", "stop"])
    );
}

/// Invariant 4: a stop string the backend reports is cut from the text but its ids stay.
#[tokio::test]
async fn stop_string_ids_stay_in_the_node() {
    let tok = tokenizer("qwen3");
    let proxy = Proxy::start(fixture_model("qwen3"), None, Wire::Vllm);
    let uuid = proxy.session(json!({})).await;
    let sampled = tok.encode("Answer: 4\nObservation:").unwrap();
    let (_, data) = proxy
        .turn(
            &uuid,
            Sample::stop_string(sampled.clone(), "Observation:"),
            json!({"messages": [{"role": "user", "content": "2+2"}], "stop": ["Observation:"]}),
        )
        .await;
    assert_eq!(data["choices"][0]["message"]["content"], "Answer: 4\n");
    assert_eq!(proxy.worker.requests()[0]["stop"], json!(["Observation:"]));
    proxy.turn(&uuid, Sample::stop(tok.encode("ok<|im_end|>").unwrap()), json!({"messages": [{"role": "user", "content": "2+2"}, {"role": "assistant", "content": "Answer: 4\n"}, {"role": "user", "content": "sure?"}]})).await;
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1);
    assert!(contains(&ids(&nodes[0]), &sampled));
    assert_eq!(nodes[0]["metadata"]["turns"][0]["stop"], "Observation:");
}

/// Invariant 4: Qwen3 with enable_thinking=false prompts with an empty think block that its
/// history render omits; the node keeps what the model saw and stays one node.
#[tokio::test]
async fn qwen3_generation_prompt_rendered_differently_in_history() {
    let tok = tokenizer("qwen3");
    let proxy = Proxy::start(fixture_model("qwen3"), None, Wire::Sglang);
    let uuid = proxy.session(json!({})).await;
    let kwargs = json!({"enable_thinking": false});
    proxy.turn(&uuid, Sample::stop(tok.encode("Paris.<|im_end|>").unwrap()), json!({"messages": [{"role": "user", "content": "Capital of France?"}], "chat_template_kwargs": kwargs})).await;
    let first_prompt = tok.decode(&proxy.worker.last_prompt());
    assert!(first_prompt.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    proxy
        .turn(
            &uuid,
            Sample::stop(tok.encode("Berlin.<|im_end|>").unwrap()),
            json!({"messages": [
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And Germany?"}], "chat_template_kwargs": kwargs}),
        )
        .await;
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1);
    let text = nodes[0]["full_text"].as_str().unwrap();
    assert!(text.contains("<|im_start|>assistant\n<think>\n\n</think>\n\nParis.<|im_end|>\n<|im_start|>user\nAnd Germany?"), "{text}");
}

/// Invariant 4: Qwen3 drops earlier `<think>` blocks. By default the sampled ids are kept
/// (one node); with history "template" the template is followed and a new node says why.
#[tokio::test]
async fn qwen3_think_stripping_default_and_template_mode() {
    let tok = tokenizer("qwen3");
    for (mode, expected_nodes) in [("sampled", 1), ("template", 2)] {
        let proxy = Proxy::start(fixture_model("qwen3"), None, Wire::Sglang);
        let uuid = proxy.session(json!({"history": mode})).await;
        let first = tok.encode("<think>\nhmm\n</think>\n\n4<|im_end|>").unwrap();
        let (_, data) = proxy
            .turn(
                &uuid,
                Sample::stop(first.clone()),
                json!({"messages": [{"role": "user", "content": "2+2?"}]}),
            )
            .await;
        let content = data["choices"][0]["message"]["content"].clone();
        proxy.turn(&uuid, Sample::stop(tok.encode("6<|im_end|>").unwrap()), json!({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": content}, {"role": "user", "content": "3+3?"}]})).await;
        let nodes = proxy.nodes(&uuid).await;
        assert_eq!(nodes.len(), expected_nodes, "mode {mode}");
        let prompt = proxy.worker.last_prompt();
        if mode == "sampled" {
            assert!(contains(&prompt, &first));
        } else {
            assert!(
                !tok.decode(&prompt).contains("hmm"),
                "the template dropped the old reasoning"
            );
            assert_eq!(
                nodes[1]["metadata"]["divergence"]["reason"],
                "template_rewrites_history"
            );
        }
    }
}

/// Invariants 3 and 5: a tool-calling conversation sent back as returned yields one node on
/// Llama 3.1 and on SmolLM2 with the bundled Hermes template; the call JSON round-trips byte
/// for byte (no key reordering, no `true` → `True`).
#[tokio::test]
async fn tool_conversations_are_one_node_on_real_templates() {
    for (model, template, end) in [
        ("llama3_1", None, "<|eot_id|>"),
        ("smollm2", Some("hermes"), "<|im_end|>"),
        ("qwen3", None, "<|im_end|>"),
    ] {
        let tok = tokenizer(model);
        let proxy = Proxy::start(fixture_model(model), template, Wire::Sglang);
        let uuid = proxy.session(json!({})).await;
        let tools = json!([{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]);
        let call_text = r#"<tool_call>{"name": "lookup", "arguments": {"z": true, "a": 1.50, "s": "x"}}</tool_call>"#;
        let call = tok.encode(&format!("{call_text}{end}")).unwrap();
        proxy.worker.push_sample(Sample::stop(call.clone()));
        let mut messages = vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "look it up"}),
        ];
        let (status, data) = proxy
            .chat(&uuid, json!({"messages": messages, "tools": tools}))
            .await;
        assert_eq!(status, 200, "{model}: {data}");
        let calls = data["choices"][0]["message"]["tool_calls"].clone();
        assert_eq!(
            calls[0]["function"]["arguments"], r#"{"z": true, "a": 1.50, "s": "x"}"#,
            "{model}"
        );
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
        messages.push(json!({"role": "tool", "tool_call_id": calls[0]["id"], "content": "found"}));
        let (status, _) = proxy
            .turn(
                &uuid,
                Sample::stop(tok.encode(&format!("It is found.{end}")).unwrap()),
                json!({"messages": messages, "tools": tools}),
            )
            .await;
        assert_eq!(status, 200);
        messages.push(json!({"role": "assistant", "content": "It is found."}));
        messages.push(json!({"role": "user", "content": "thanks"}));
        proxy
            .turn(
                &uuid,
                Sample::stop(tok.encode(&format!("Welcome.{end}")).unwrap()),
                json!({"messages": messages, "tools": tools}),
            )
            .await;
        let prompt = proxy.worker.last_prompt();
        assert!(
            contains(&prompt, &call),
            "{model}: the call's sampled ids are reused"
        );
        let nodes = proxy.nodes(&uuid).await;
        assert_eq!(
            nodes.len(),
            1,
            "{model}: {:?}",
            nodes.iter().map(|n| &n["metadata"]).collect::<Vec<_>>()
        );
        assert_node_shape(&nodes[0]);
        assert_eq!(nodes[0]["metadata"]["num_turns"], 3);
        assert!(nodes[0]["full_text"].as_str().unwrap().contains(call_text));
    }
}

/// Invariant 6: an edited history starts a new node that records the divergence.
#[tokio::test]
async fn edited_history_starts_a_new_node() {
    let tok = tokenizer("qwen3");
    let proxy = Proxy::start(fixture_model("qwen3"), None, Wire::Sglang);
    let uuid = proxy.session(json!({})).await;
    proxy
        .turn(
            &uuid,
            Sample::stop(tok.encode("A<|im_end|>").unwrap()),
            json!({"messages": [{"role": "user", "content": "q1"}]}),
        )
        .await;
    proxy.turn(&uuid, Sample::stop(tok.encode("B<|im_end|>").unwrap()), json!({"messages": [{"role": "user", "content": "q1 EDITED"}, {"role": "assistant", "content": "A"}, {"role": "user", "content": "q2"}]})).await;
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 2);
    let divergence = &nodes[1]["metadata"]["divergence"];
    assert_eq!(divergence["reason"], "history_edited");
    assert_eq!(divergence["from_node"], 0);
    assert_eq!(divergence["token_position"], 0);
    // An assistant message the proxy never produced is rendered as text, also a new node.
    proxy.turn(&uuid, Sample::stop(tok.encode("C<|im_end|>").unwrap()), json!({"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "not what was said"}, {"role": "user", "content": "q2"}]})).await;
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 3);
    assert_eq!(
        nodes[2]["metadata"]["divergence"]["reason"],
        "unmatched_assistant_message"
    );
}

/// n>1: the first choice extends the node, the others are new nodes; track_tree keeps every
/// completion as its own node with its parent.
#[tokio::test]
async fn n_choices_and_track_tree() {
    let tok = tokenizer("qwen3");
    for track_tree in [false, true] {
        let proxy = Proxy::start(fixture_model("qwen3"), None, Wire::Sglang);
        let uuid = proxy.session(json!({"track_tree": track_tree})).await;
        proxy
            .turn(
                &uuid,
                Sample::stop(tok.encode("A<|im_end|>").unwrap()),
                json!({"messages": [{"role": "user", "content": "q"}]}),
            )
            .await;
        proxy.worker.push(common::mock_worker::Reply::Samples(vec![
            Sample::stop(tok.encode("X<|im_end|>").unwrap()),
            Sample::stop(tok.encode("Y<|im_end|>").unwrap()),
        ]));
        let (_, data) = proxy
            .chat(&uuid, json!({"n": 2, "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "A"}, {"role": "user", "content": "again"}]}))
            .await;
        assert_eq!(data["choices"].as_array().unwrap().len(), 2);
        let nodes = proxy.nodes(&uuid).await;
        assert_eq!(nodes.len(), if track_tree { 3 } else { 2 });
        if track_tree {
            assert_eq!(nodes[1]["metadata"]["parent"], 0);
            assert_eq!(nodes[2]["metadata"]["parent"], 0);
        }
        for node in &nodes {
            assert_node_shape(node);
        }
    }
}

/// Tool calls the proxy never produced (few-shot examples written by the client) go through
/// the template like transformers renders them: JSON-string arguments become mappings.
#[tokio::test]
async fn client_written_tool_calls_are_rendered_by_the_template() {
    let tok = tokenizer("qwen3");
    let proxy = Proxy::start(fixture_model("qwen3"), None, Wire::Sglang);
    let uuid = proxy.session(json!({})).await;
    let messages = json!([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "example_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"metric\": true}"}}]},
        {"role": "tool", "tool_call_id": "example_1", "content": "20C"},
        {"role": "user", "content": "and now?"}
    ]);
    let data = proxy.render(&uuid, json!({"messages": messages})).await;
    let text = data["prompt_text"].as_str().unwrap();
    assert!(
        text.contains("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"metric\": true}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n20C\n</tool_response><|im_end|>"),
        "{text}"
    );
    assert_eq!(data["token_ids"], json!(tok.encode(text).unwrap()));
}

/// `/render`'s `prompt_text` is the template's output byte for byte, also where the tokenizer
/// normalises text (Qwen3's NFC composes `e\u{301}`, so its ids decode to `é`), and also once
/// the prompt extends a node: then it is the render with the sampled turn as its text.
#[tokio::test]
async fn render_text_is_the_template_output_byte_for_byte() {
    let tok = tokenizer("qwen3");
    let proxy = Proxy::start(fixture_model("qwen3"), None, Wire::Sglang);
    let uuid = proxy.session(json!({})).await;
    let mut messages = vec![json!({"role": "user", "content": "Cafe\u{301} \u{2014} ça?"})];
    let first = proxy.render(&uuid, json!({"messages": messages})).await;
    let text = "<|im_start|>user\nCafe\u{301} \u{2014} ça?<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(first["prompt_text"], text);
    let ids = tok.encode(text).unwrap();
    assert_eq!(first["token_ids"], json!(ids));
    assert_ne!(tok.decode(&ids), text, "the tokenizer composes the accent");

    proxy
        .turn(
            &uuid,
            Sample::stop(tok.encode("Oui.<|im_end|>").unwrap()),
            json!({"messages": messages}),
        )
        .await;
    messages.push(json!({"role": "assistant", "content": "Oui."}));
    messages.push(json!({"role": "user", "content": "E\u{301}te\u{301}?"}));
    let second = proxy.render(&uuid, json!({"messages": messages})).await;
    assert_eq!(second["extends_node"], 0, "{second}");
    let fresh = proxy.session(json!({})).await;
    let template_output = proxy.render(&fresh, json!({"messages": messages})).await;
    assert_eq!(second["prompt_text"], template_output["prompt_text"]);
    assert!(
        second["prompt_text"]
            .as_str()
            .unwrap()
            .ends_with("Oui.<|im_end|>\n<|im_start|>user\nE\u{301}te\u{301}?<|im_end|>\n<|im_start|>assistant\n"),
        "{second}"
    );
}
