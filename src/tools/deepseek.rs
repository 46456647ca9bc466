//! DeepSeek V3 format:
//! `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{…}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>`,
//! and the V3.1 form `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>`. The calls
//! block's opening and closing markers belong to its first and last call.

use super::{FoundCall, ToolParser, python_json};
use serde_json::Value;

const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";
const FENCE: &str = "```";

/// Parser for DeepSeek V3 / V3.1 calls.
#[derive(Debug, Default, Clone, Copy)]
pub struct DeepSeekV3Parser;

impl ToolParser for DeepSeekV3Parser {
    fn name(&self) -> &'static str {
        "deepseek_v3"
    }

    fn signals(&self) -> &'static [&'static str] {
        &[CALLS_BEGIN, CALL_BEGIN]
    }

    fn markers(&self) -> &'static [&'static str] {
        &[CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP]
    }

    fn block_len(&self, held: &str) -> Option<usize> {
        let close = if held.starts_with(CALLS_BEGIN) {
            CALLS_END
        } else {
            CALL_END
        };
        held.find(close).map(|at| at + close.len())
    }

    fn find_calls(&self, text: &str, heal: bool) -> Vec<FoundCall> {
        let mut found = Vec::new();
        let mut from = 0;
        while let Some(begin) = text[from..].find(CALL_BEGIN).map(|at| from + at) {
            let body_start = begin + CALL_BEGIN.len();
            let (body_end, mut end) = match text[body_start..].find(CALL_END) {
                Some(at) => (body_start + at, body_start + at + CALL_END.len()),
                None if heal => {
                    let body = &text[body_start..];
                    let body = body.trim_end().strip_suffix(CALLS_END).unwrap_or(body);
                    (body_start + body.len(), text.len())
                }
                None => break,
            };
            let mut start = begin;
            if let Some(open) = text[..begin].trim_end().strip_suffix(CALLS_BEGIN) {
                start = open.len();
            }
            let after = &text[end..];
            if let Some(rest) = after.trim_start().strip_prefix(CALLS_END) {
                end = text.len() - rest.len();
            }
            if let Some((name, arguments)) = read_body(&text[body_start..body_end]) {
                found.push(FoundCall {
                    span: start..end,
                    name,
                    arguments,
                });
            }
            from = end;
        }
        found
    }

    fn write_calls(&self, calls: &[(&str, &Value)]) -> String {
        let calls: String = calls
            .iter()
            .map(|(name, arguments)| {
                format!(
                    "{CALL_BEGIN}function{SEP}{name}\n{FENCE}json\n{}\n{FENCE}{CALL_END}",
                    python_json(arguments)
                )
            })
            .collect();
        format!("{CALLS_BEGIN}{calls}{CALLS_END}")
    }
}

/// Name and arguments of `function<sep>NAME\n```json\n{…}\n```` or `NAME<sep>{…}`.
fn read_body(body: &str) -> Option<(String, String)> {
    let (head, rest) = body.split_once(SEP)?;
    let rest = rest.trim();
    let (name, arguments) = match rest.split_once(FENCE) {
        Some((name, fenced)) => {
            let fenced = fenced.strip_prefix("json").unwrap_or(fenced);
            let arguments = fenced.trim_end().strip_suffix(FENCE).unwrap_or(fenced);
            (name.trim(), arguments.trim())
        }
        None => (head.trim(), rest),
    };
    let arguments = if arguments.is_empty() {
        "{}"
    } else {
        arguments
    };
    (!name.is_empty() && !name.contains(char::is_whitespace))
        .then(|| (name.to_string(), arguments.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::test_support::promoter;

    #[test]
    fn v3_and_v3_1_forms() {
        let p = promoter(&["weather", "time"]);
        let text = "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let out = DeepSeekV3Parser.parse(text, &p);
        assert_eq!(out.calls.len(), 2);
        assert_eq!(out.calls[0].arguments, r#"{"city": "Paris"}"#);
        assert_eq!(out.calls[1].name, "time");
        assert_eq!(out.content.as_deref(), Some("Sure.\n"));
    }

    #[test]
    fn unclosed_calls_are_healed_only_when_asked() {
        let text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>weather\n```json\n{\"city\": \"Paris\"}\n```";
        assert!(DeepSeekV3Parser.find_calls(text, false).is_empty());
        let healed = DeepSeekV3Parser.find_calls(text, true);
        assert_eq!(healed[0].arguments, r#"{"city": "Paris"}"#);
        assert_eq!(healed[0].span, 0..text.len());
    }

    #[test]
    fn written_calls_read_back() {
        let args = serde_json::json!({"city": "Paris"});
        let text = DeepSeekV3Parser.write_calls(&[("weather", &args), ("time", &args)]);
        let found = DeepSeekV3Parser.find_calls(&text, false);
        assert_eq!(found.len(), 2);
        assert_eq!((found[0].span.start, found[1].span.end), (0, text.len()));
        assert_eq!(found[1].arguments, r#"{"city": "Paris"}"#);
    }
}
