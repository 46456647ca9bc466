//! gpt-oss and its Harmony format: the golden renders in `fixtures/harmony/gpt_oss.json` are
//! OpenAI's own Harmony library's (rendered by `scripts/harmony-golden.py` with
//! `openai-harmony` pinned by `scripts/install-harmony-reference.sh`, reproduced here byte for
//! byte); the pinned gpt-oss tokenizer reads every one back id for id (its markup is the
//! tokenizer's special tokens; message content is encoded with special-token text as plain
//! text, as Harmony encodes it); and the bundled `gpt_oss` template renders every case's chat
//! conversation to the same text and, through the Harmony encoding, the same ids.

mod common;

use common::{fixture_model, installed, scratch_dir};
use rollout_proxy::tokenizer::Tokenizer;
use serde_json::Value;
use std::path::Path;

fn golden_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/harmony/gpt_oss.json")
}

#[test]
fn the_golden_renders_are_the_harmony_librarys_own() {
    let names = ["HARMONY_PYTHON", "TIKTOKEN_ENCODINGS_BASE"];
    let [python, encodings] =
        <[_; 2]>::try_from(installed("install-harmony-reference.sh", &names)).unwrap();
    let rendered = scratch_dir("harmony-golden").join("gpt_oss.json");
    let output = std::process::Command::new(python)
        .env("TIKTOKEN_ENCODINGS_BASE", encodings)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/harmony-golden.py"))
        .arg(&rendered)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        std::fs::read(&rendered).unwrap() == std::fs::read(golden_path()).unwrap(),
        "scripts/harmony-golden.py no longer renders fixtures/harmony/gpt_oss.json"
    );
}

#[test]
fn the_gpt_oss_tokenizer_reads_the_golden_renders_id_for_id() {
    let tokenizer = Tokenizer::from_path(&fixture_model("gpt_oss")).unwrap();
    let golden: Value = serde_json::from_slice(&std::fs::read(golden_path()).unwrap()).unwrap();
    for stop in golden["stop_tokens"].as_array().unwrap() {
        assert!(tokenizer.is_special(stop.as_u64().unwrap() as u32));
    }
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 12);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let ids: Vec<u32> = serde_json::from_value(case["expected_ids"].clone()).unwrap();
        let text = case["expected_text"].as_str().unwrap();
        assert_eq!(tokenizer.decode(&ids), text, "{name}");
        let mut rebuilt = Vec::with_capacity(ids.len());
        for run in ids.chunk_by(|a, b| !tokenizer.is_special(*a) && !tokenizer.is_special(*b)) {
            match run {
                [id] if tokenizer.is_special(*id) => rebuilt.push(*id),
                ordinary => {
                    let piece = tokenizer.decode(ordinary);
                    rebuilt.extend(tokenizer.encode_ordinary(&piece).unwrap());
                }
            }
        }
        assert_eq!(rebuilt, ids, "{name}");
    }
}

#[test]
fn the_bundled_gpt_oss_template_renders_the_golden_cases() {
    use rollout_proxy::template::{RenderRequest, TemplateSpec, json_value, load_template};
    let dir = fixture_model("gpt_oss");
    let template = load_template(Some(&TemplateSpec::parse("gpt_oss")), Some(&dir)).unwrap();
    let tokenizer = Tokenizer::from_path(&dir).unwrap();
    let golden: Value = serde_json::from_slice(&std::fs::read(golden_path()).unwrap()).unwrap();
    let mut failures = Vec::new();
    for case in golden["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let mut kwargs = case["chat_template_kwargs"].as_object().unwrap().clone();
        kwargs.insert("keep_analysis".into(), case["keep_analysis"].clone());
        let tools = Some(case["tools"].clone())
            .filter(|t| !t.as_array().unwrap().is_empty())
            .map(std::sync::Arc::new);
        let text = template
            .render(RenderRequest {
                messages: &json_value(&case["messages"]),
                tools: tools.as_ref(),
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                kwargs: Some(&kwargs),
            })
            .unwrap();
        let expected = case["expected_text"].as_str().unwrap();
        if text != expected {
            failures.push(format!(
                "{name}: text\n  got  {text:?}\n  want {expected:?}"
            ));
            continue;
        }
        let ids = rollout_proxy::tokenizer::harmony::encode(&tokenizer, &text).unwrap();
        let want: Vec<u32> = serde_json::from_value(case["expected_ids"].clone()).unwrap();
        if ids != want {
            failures.push(format!("{name}: ids differ"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
