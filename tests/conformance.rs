//! Chat-template conformance: every golden render made by transformers must match byte for
//! byte, and its token ids must match the real tokenizer's. Needs `scripts/fetch-fixtures.sh`.

mod common;

use rollout_proxy::template::{ChatTemplate, RenderRequest, TemplateError, json_value};
use rollout_proxy::tokenizer::Tokenizer;
use serde_json::Value;
use std::collections::BTreeMap;

const CORPORA: &[&str] = &["qwen3", "llama3_1", "deepseek_v3", "gemma3", "smollm2"];

/// transformers 5 drops top-level null keys and mirrors reasoning fields before rendering.
fn preprocess(messages: &Value) -> Value {
    let mut out = Vec::new();
    for message in messages.as_array().unwrap() {
        let mut map = message.as_object().unwrap().clone();
        map.retain(|_, v| !v.is_null());
        let reasoning = ["reasoning_content", "thinking", "reasoning"]
            .iter()
            .find_map(|k| map.get(*k).cloned());
        if let Some(reasoning) = reasoning {
            map.insert("thinking".into(), reasoning.clone());
            map.insert("reasoning_content".into(), reasoning);
        }
        out.push(Value::Object(map));
    }
    Value::Array(out)
}

#[test]
fn golden_renders_match_byte_for_byte() {
    let dir = common::conformance_dir();
    let mut total = 0;
    let mut passed = 0;
    let mut failures = Vec::new();
    for name in CORPORA {
        let corpus: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap(),
        )
        .unwrap();
        let special: BTreeMap<String, String> = corpus["special_tokens_map"]
            .as_object()
            .unwrap()
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect();
        let template = ChatTemplate::new(
            *name,
            corpus["template"].as_str().unwrap().to_string(),
            special,
        )
        .unwrap();
        let tokenizer = Tokenizer::from_path(&common::fixture_model(name)).unwrap();
        let mut file_passed = 0;
        let cases = corpus["cases"].as_array().unwrap();
        for case in cases {
            total += 1;
            let messages = preprocess(&case["messages"]);
            let tools = case.get("tools").filter(|t| !t.is_null()).cloned();
            let tools = tools.map(std::sync::Arc::new);
            let kwargs = case["kwargs"].as_object();
            let result = template.render(RenderRequest {
                messages: &json_value(&messages),
                tools: tools.as_ref(),
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                kwargs,
            });
            let case_name = format!("{name}/{}", case["name"].as_str().unwrap());
            let verdict = match (&result, case.get("expected_error")) {
                (Ok(text), None) => {
                    let expected = case["expected_text"].as_str().unwrap();
                    if text != expected {
                        Err(format!(
                            "text differs:\n  got  {text:?}\n  want {expected:?}"
                        ))
                    } else {
                        let ids = tokenizer.encode(text).unwrap();
                        let want: Vec<u32> =
                            serde_json::from_value(case["expected_ids"].clone()).unwrap();
                        if ids == want {
                            Ok(())
                        } else {
                            Err("ids differ".to_string())
                        }
                    }
                }
                (Err(err), Some(expected)) => match (case["expected_error_kind"].as_str(), err) {
                    (Some("raise_exception"), TemplateError::Raised(msg))
                        if msg == expected.as_str().unwrap() =>
                    {
                        Ok(())
                    }
                    (Some("raise_exception"), other) => {
                        Err(format!("wrong error {other:?}, want raise {expected}"))
                    }
                    _ => Ok(()),
                },
                (Ok(_), Some(expected)) => Err(format!("rendered, but expected error {expected}")),
                (Err(err), None) => Err(format!("failed: {err}")),
            };
            match verdict {
                Ok(()) => {
                    passed += 1;
                    file_passed += 1;
                }
                Err(why) => failures.push(format!("{case_name}: {why}")),
            }
        }
        println!("{name}: {file_passed}/{} cases pass", cases.len());
    }
    println!("conformance: {passed}/{total} cases pass");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
