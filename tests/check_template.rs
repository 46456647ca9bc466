//! `rollout-proxy check-template` over every template in `fixtures/` (the five families of the
//! conformance corpus and the bundled gpt-oss template), as a user runs it: the table and JSON,
//! the verdicts and exit codes, the rewrites it names, the tool-call format it detects (which
//! sessions created without `tool_parser` then take), docs/templates.md's tables kept to its
//! output, and every prompt rendered the same by transformers (`--reference-python`).

mod common;

use common::mock_worker::Wire;
use common::{Proxy, fixture_model, installed, scratch_dir};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

const FAMILIES: [&str; 5] = ["qwen3", "llama3_1", "deepseek_v3", "gemma3", "smollm2"];

/// The family's corpus template as a file (as a user passes `--chat-template FILE`), in the
/// scratch folder of the test `test`.
fn corpus_template(test: &str, family: &str) -> PathBuf {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/chat_templates")
        .join(format!("{family}.json"));
    let corpus: Value = serde_json::from_slice(&std::fs::read(corpus).unwrap()).unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("check-template-{test}"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{family}.jinja"));
    std::fs::write(&path, corpus["template"].as_str().unwrap()).unwrap();
    path
}

/// `check-template` on `family`'s tokenizer: exit code, standard output.
fn check(family: &str, template: &Path, extra: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_rollout-proxy"))
        .arg("check-template")
        .arg("--tokenizer")
        .arg(fixture_model(family))
        .arg("--chat-template")
        .arg(template)
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    (output.status.code().unwrap(), format!("{stdout}{stderr}"))
}

fn report(family: &str, template: &Path) -> Value {
    let (code, out) = check(family, template, &["--json"]);
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(code, i32::from(report["verdict"] == "fail"), "{out}");
    report
}

fn shape<'r>(report: &'r Value, name: &str) -> &'r Value {
    report["shapes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap()
}

/// The kinds of rewrite a shape's transitions name, in order.
fn rewrites(report: &Value, name: &str) -> Vec<String> {
    shape(report, name)["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["rewrite"]["kind"].as_str().map(str::to_string))
        .collect()
}

fn keeps_one_node_everywhere_it_renders(report: &Value) {
    for shape in report["shapes"].as_array().unwrap() {
        for transition in shape["transitions"].as_array().unwrap() {
            assert_eq!(transition["keeps_node"], true, "{}", shape["name"]);
        }
    }
}

#[test]
fn every_fixture_template_is_checked() {
    let qwen3 = report("qwen3", &corpus_template("all", "qwen3"));
    assert_eq!(qwen3["verdict"], "pass", "{qwen3}");
    assert_eq!(qwen3["tool_format_written"], "hermes");
    keeps_one_node_everywhere_it_renders(&qwen3);
    // Qwen3 drops a past turn's (even empty) think block, and its generation prompt with
    // thinking off is not how history renders the turn.
    assert_eq!(
        rewrites(&qwen3, "reasoning"),
        ["reasoning_dropped", "reasoning_dropped"]
    );
    assert_eq!(
        rewrites(&qwen3, "reasoning_off"),
        ["generation_prompt_rewritten", "generation_prompt_rewritten"]
    );
    let dropped = &shape(&qwen3, "reasoning")["transitions"][0]["rewrite"];
    assert_eq!(dropped["message"], 1);
    assert!(dropped["sampled"].as_str().unwrap().starts_with("<think>"));

    let deepseek = report("deepseek_v3", &corpus_template("all", "deepseek_v3"));
    assert_eq!(deepseek["verdict"], "pass", "{deepseek}");
    assert_eq!(deepseek["tool_format_written"], "deepseek_v3");
    assert_eq!(deepseek["default_tool_parser"], "deepseek_v3");
    keeps_one_node_everywhere_it_renders(&deepseek);
    assert_eq!(rewrites(&deepseek, "tool_call"), ["tool_call_reformatted"]);
    assert!(rewrites(&deepseek, "system_multi_turn").is_empty());

    // Gemma 3's template refuses tool messages: a warning, not a failure.
    let gemma = report("gemma3", &corpus_template("all", "gemma3"));
    assert_eq!(gemma["verdict"], "warn", "{gemma}");
    assert!(
        shape(&gemma, "tool_call")["error"]
            .as_str()
            .unwrap()
            .contains("alternate")
    );
    assert!(shape(&gemma, "single_turn")["error"].is_null());

    // The corpus's Llama 3.1 and SmolLM2 templates write no tool calls at all.
    for family in ["llama3_1", "smollm2"] {
        let report = report(family, &corpus_template("all", family));
        assert_eq!(report["verdict"], "warn", "{report}");
        assert!(report["tool_format_written"].is_null());
        assert_eq!(shape(&report, "tool_call")["calls_unread"], 1);
        keeps_one_node_everywhere_it_renders(&report);
    }

    let gpt_oss = report("gpt_oss", Path::new("gpt_oss"));
    assert_eq!(gpt_oss["verdict"], "pass", "{gpt_oss}");
    assert_eq!(gpt_oss["tool_format_written"], "harmony");
    keeps_one_node_everywhere_it_renders(&gpt_oss);
    // The model samples `<|return|>`; the library renders a past answer with `<|end|>`.
    assert_eq!(rewrites(&gpt_oss, "single_turn"), ["end_token_rewritten"]);
    assert_eq!(
        rewrites(&gpt_oss, "tool_call_with_reasoning")[0],
        "reasoning_dropped"
    );
}

#[test]
fn the_templates_page_shows_each_familys_table() {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/templates.md");
    let page = std::fs::read_to_string(page).unwrap();
    let families = FAMILIES.map(|f| (f, corpus_template("docs", f)));
    let bundled = [("gpt_oss", PathBuf::from("gpt_oss"))];
    for (family, template) in families.iter().chain(&bundled) {
        let (_, table) = check(family, template, &[]);
        // From the tool-call line on: the template line names a scratch file.
        let body = &table[table.find("tool calls").unwrap()..];
        assert!(
            page.contains(body.trim_end()),
            "docs/templates.md lacks {family}'s check-template table:\n{body}"
        );
    }
}

#[test]
fn exit_codes_follow_the_verdict() {
    let gemma = corpus_template("exit", "gemma3");
    assert_eq!(check("gemma3", &gemma, &[]).0, 0, "warn");
    assert_eq!(check("gemma3", &gemma, &["--strict"]).0, 1, "warn, strict");
    // A template that alters what the model sampled: no node can be extended.
    let altering = scratch_dir("check-template-upper").join("upper.jinja");
    std::fs::write(
        &altering,
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}\
         {{ m.content | upper }}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    .unwrap();
    let (code, table) = check("smollm2", &altering, &[]);
    assert_eq!(code, 1, "{table}");
    assert!(table.contains("verdict: fail"), "{table}");
    let report = report("smollm2", &altering);
    let transition = &shape(&report, "system_multi_turn")["transitions"][0];
    assert_eq!(transition["keeps_node"], false);
    assert_eq!(transition["divergence"], "template_altered_sampled_turn");

    let (code, out) = check("smollm2", Path::new("/no/such/template.jinja"), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("error:"), "{out}");
}

#[test]
fn transformers_renders_every_prompt_the_same() {
    let [python] = <[_; 1]>::try_from(installed(
        "install-transformers-reference.sh",
        &["TRANSFORMERS_PYTHON"],
    ))
    .unwrap();
    let python = python.to_str().unwrap().to_string();
    for family in FAMILIES {
        let (code, out) = check(
            family,
            &corpus_template("reference", family),
            &["--json", "--reference-python", &python],
        );
        let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert_ne!(code, 1, "{out}");
        for shape in report["shapes"].as_array().unwrap() {
            assert_eq!(shape["matches_reference"], true, "{family}: {shape}");
        }
    }
    // A Python without transformers is an error, not a verdict.
    let (code, out) = check(
        "qwen3",
        &corpus_template("reference", "qwen3"),
        &["--reference-python", "python3-no-such"],
    );
    assert_eq!(code, 2, "{out}");
}

#[tokio::test]
async fn sessions_take_the_format_the_template_writes() {
    let deepseek = corpus_template("sessions", "deepseek_v3");
    let proxy = Proxy::start(
        fixture_model("deepseek_v3"),
        deepseek.to_str(),
        Wire::Sglang,
    );
    let (_, created) = proxy.post("/sessions/create", json!({})).await;
    assert_eq!(created["tool_parser"], "deepseek_v3", "{created}");
    let (_, chosen) = proxy
        .post("/sessions/create", json!({"tool_parser": "hermes"}))
        .await;
    assert_eq!(chosen["tool_parser"], "hermes");

    let qwen3 = Proxy::start(
        fixture_model("qwen3"),
        corpus_template("sessions", "qwen3").to_str(),
        Wire::Sglang,
    );
    let (_, created) = qwen3.post("/sessions/create", json!({})).await;
    assert_eq!(created["tool_parser"], "hermes");
}
