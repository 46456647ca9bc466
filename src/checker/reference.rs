//! Renders the same prompts with Hugging Face `transformers` (`apply_chat_template`, in a
//! Python the user names with `--reference-python`), to show that our engine renders the
//! template as transformers does.

use super::simulate::Rendered;
use crate::template::ChatTemplate;
use serde_json::{Value, json};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Reads one case per line: the template, its special tokens, the messages, tools, kwargs;
/// writes `{"text"}` or `{"error"}` per line.
const SCRIPT: &str = r#"
import json, sys
from transformers import PreTrainedTokenizerFast
keys = ("bos_token", "eos_token", "unk_token", "pad_token")
tokenizer = None
for line in sys.stdin:
    case = json.loads(line)
    if tokenizer is None:
        special = {k: v for k, v in case["special_tokens"].items() if k in keys}
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=sys.argv[1], **special)
    try:
        text = tokenizer.apply_chat_template(
            case["messages"], tools=case["tools"], chat_template=case["template"],
            add_generation_prompt=case["add_generation_prompt"], tokenize=False,
            **case["kwargs"])
        out = {"text": text}
    except Exception as e:
        out = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out), flush=True)
"#;

/// Why the reference could not be run.
#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    /// The Python could not be started or failed.
    #[error("the reference Python failed: {0}")]
    Python(String),
    /// The model folder has no `tokenizer.json` for transformers to load.
    #[error("transformers needs a tokenizer.json: {0} has none")]
    NoTokenizerJson(String),
}

/// For each render, `None` when transformers renders the same text, else what differs.
pub fn compare(
    python: &Path,
    tokenizer_dir: &Path,
    template: &ChatTemplate,
    renders: &[&Rendered],
) -> Result<Vec<Option<String>>, ReferenceError> {
    let tokenizer_json = match tokenizer_dir.is_dir() {
        true => tokenizer_dir.join("tokenizer.json"),
        false => tokenizer_dir.to_path_buf(),
    };
    if !tokenizer_json.is_file() {
        return Err(ReferenceError::NoTokenizerJson(
            tokenizer_dir.display().to_string(),
        ));
    }
    let mut input = Vec::new();
    for render in renders {
        let case = json!({"template": template.source(), "special_tokens": template.special_tokens(),
            "messages": render.messages, "tools": render.tools, "kwargs": render.kwargs,
            "add_generation_prompt": render.add_generation_prompt});
        serde_json::to_writer(&mut input, &case)
            .map_err(|e| ReferenceError::Python(e.to_string()))?;
        input.push(b'\n');
    }
    let failed = |e: std::io::Error| ReferenceError::Python(format!("{}: {e}", python.display()));
    let mut child = Command::new(python)
        .arg("-c")
        .arg(SCRIPT)
        .arg(&tokenizer_json)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(failed)?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let output = child.wait_with_output().map_err(failed)?;
    let _ = writer.join();
    if !output.status.success() {
        return Err(ReferenceError::Python(
            String::from_utf8_lossy(&output.stderr).trim().to_string(),
        ));
    }
    let lines: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or(Value::Null))
        .collect();
    if lines.len() != renders.len() {
        return Err(ReferenceError::Python(format!(
            "{} answers for {} prompts",
            lines.len(),
            renders.len()
        )));
    }
    Ok(renders
        .iter()
        .zip(lines)
        .map(
            |(render, answer)| match (answer["text"].as_str(), &render.text) {
                (Some(theirs), Ok(ours)) if theirs == ours => None,
                // Both raise: the template refuses the conversation under either engine.
                (None, Err(_)) => None,
                (Some(theirs), Ok(ours)) => {
                    let at = crate::template::common_prefix_len(theirs, ours);
                    Some(format!(
                        "differs at character {at}: transformers {:?}, ours {:?}",
                        theirs[at..].chars().take(40).collect::<String>(),
                        ours[at..].chars().take(40).collect::<String>()
                    ))
                }
                (Some(_), Err(error)) => {
                    Some(format!("transformers renders it; ours raised {error}"))
                }
                (None, Ok(_)) => Some(format!(
                    "transformers raised {}",
                    answer["error"].as_str().unwrap_or("an error")
                )),
            },
        )
        .collect())
}
