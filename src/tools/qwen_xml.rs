//! Qwen3-Coder XML format: `<function=NAME><parameter=KEY>value</parameter>…</function>`,
//! optionally wrapped in `<tool_call>…</tool_call>` (the wrapper belongs to the call's span).
//! Every value is a string; one wrapping newline is trimmed at each end, indentation is kept.

use super::{FoundCall, ToolParser};
use serde_json::{Map, Value};

const WRAP_OPEN: &str = "<tool_call>";
const WRAP_CLOSE: &str = "</tool_call>";
const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAMETER: &str = "<parameter=";
const PARAMETER_END: &str = "</parameter>";

/// Parser for Qwen3-Coder XML calls.
#[derive(Debug, Default, Clone, Copy)]
pub struct QwenXmlParser;

impl ToolParser for QwenXmlParser {
    fn name(&self) -> &'static str {
        "qwen3_coder"
    }

    fn signals(&self) -> &'static [&'static str] {
        &[WRAP_OPEN, FUNCTION]
    }

    fn markers(&self) -> &'static [&'static str] {
        &[WRAP_OPEN, WRAP_CLOSE]
    }

    fn write_calls(&self, calls: &[(&str, &Value)]) -> String {
        let calls: Vec<String> = calls
            .iter()
            .map(|(name, arguments)| {
                let parameters: String = arguments
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(key, value)| {
                        let value = match value {
                            Value::String(text) => text.clone(),
                            other => other.to_string(),
                        };
                        format!("{PARAMETER}{key}>\n{value}\n{PARAMETER_END}\n")
                    })
                    .collect();
                format!("{WRAP_OPEN}\n{FUNCTION}{name}>\n{parameters}{FUNCTION_END}\n{WRAP_CLOSE}")
            })
            .collect();
        calls.join("\n")
    }

    fn block_len(&self, held: &str) -> Option<usize> {
        let close = if held.starts_with(WRAP_OPEN) {
            WRAP_CLOSE
        } else {
            FUNCTION_END
        };
        held.find(close).map(|at| at + close.len())
    }

    fn find_calls(&self, text: &str, heal: bool) -> Vec<FoundCall> {
        let mut found = Vec::new();
        let mut from = 0;
        while let Some(start) = text[from..].find(FUNCTION).map(|at| from + at) {
            let name_start = start + FUNCTION.len();
            let Some(name_len) = text[name_start..].find('>') else {
                break;
            };
            let name = text[name_start..name_start + name_len].trim().to_string();
            let body_start = name_start + name_len + 1;
            let (body_end, mut end) = match text[body_start..].find(FUNCTION_END) {
                Some(at) => (body_start + at, body_start + at + FUNCTION_END.len()),
                None if heal => (text.len(), text.len()),
                None => break,
            };
            let mut span_start = start;
            // A <tool_call> wrapper around the function is part of the call.
            let before = text[..start].trim_end();
            if let Some(open) = before.strip_suffix(WRAP_OPEN) {
                let after = &text[end..];
                if let Some(close) = after
                    .trim_start()
                    .strip_prefix(WRAP_CLOSE)
                    .map(|_| after.len() - after.trim_start().len() + WRAP_CLOSE.len())
                {
                    span_start = open.len();
                    end += close;
                } else if heal && after.trim().is_empty() {
                    span_start = open.len();
                    end = text.len();
                }
            }
            if !name.is_empty() {
                found.push(FoundCall {
                    span: span_start..end,
                    name,
                    arguments: Value::Object(parameters(&text[body_start..body_end])).to_string(),
                });
            }
            from = end;
        }
        found
    }
}

/// The `<parameter=K>v</parameter>` pairs of a function body.
fn parameters(body: &str) -> Map<String, Value> {
    let mut arguments = Map::new();
    let mut rest = body;
    while let Some(start) = rest.find(PARAMETER) {
        let key_start = start + PARAMETER.len();
        let Some(key_len) = rest[key_start..].find('>') else {
            break;
        };
        let key = rest[key_start..key_start + key_len].trim().to_string();
        let value_start = key_start + key_len + 1;
        let Some(value_len) = rest[value_start..].find(PARAMETER_END) else {
            break;
        };
        let value = &rest[value_start..value_start + value_len];
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        arguments.insert(key, Value::String(value.to_string()));
        rest = &rest[value_start + value_len + PARAMETER_END.len()..];
    }
    arguments
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::Promoter;

    fn promoter(heal: bool) -> Promoter {
        let tools = serde_json::json!([{"type": "function", "function": {"name": "Bash"}}]);
        Promoter::new(
            Some(&crate::tools::test_support::declared(tools)),
            &["Bash".to_string()],
            heal,
        )
    }

    #[test]
    fn parses_wrapped_and_bare_calls_with_string_values() {
        let text = "Run it.\n<tool_call>\n<function=Bash>\n<parameter=command>\n  ls -la\n</parameter>\n<parameter=n>3</parameter>\n</function>\n</tool_call>";
        let out = QwenXmlParser.parse(text, &promoter(false));
        assert_eq!(out.content.as_deref(), Some("Run it.\n"));
        let args: Value = serde_json::from_str(&out.calls[0].arguments).unwrap();
        assert_eq!(args, serde_json::json!({"command": "  ls -la", "n": "3"}));
        let bare = "<function=Bash><parameter=command>pwd</parameter></function> done";
        let out = QwenXmlParser.parse(bare, &promoter(false));
        assert_eq!(out.calls.len(), 1);
        assert_eq!(out.content.as_deref(), Some(" done"));
    }

    #[test]
    fn an_unclosed_function_is_healed_only_when_healing() {
        let text = "<function=Bash><parameter=command>ls</parameter>";
        assert!(QwenXmlParser.parse(text, &promoter(false)).calls.is_empty());
        let out = QwenXmlParser.parse(text, &promoter(true));
        assert_eq!(out.calls[0].arguments, r#"{"command":"ls"}"#);
        assert_eq!(out.content, None);
    }

    #[test]
    fn undeclared_functions_stay_text() {
        let text = "<function=Nuke></function>";
        assert_eq!(
            QwenXmlParser
                .parse(text, &promoter(true))
                .content
                .as_deref(),
            Some(text)
        );
    }
}
