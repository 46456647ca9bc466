//! Hermes / Qwen format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

use super::{ParsedCall, ParsedOutput, ToolParser};
use serde::Deserialize;
use serde_json::value::RawValue;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Parser for `<tool_call>` JSON blocks.
#[derive(Debug, Default, Clone, Copy)]
pub struct HermesParser;

#[derive(Deserialize)]
struct CallBody<'a> {
    name: String,
    #[serde(borrow, alias = "parameters")]
    arguments: Option<&'a RawValue>,
}

impl ToolParser for HermesParser {
    fn name(&self) -> &'static str {
        "hermes"
    }

    fn call_start(&self) -> &'static str {
        OPEN
    }

    fn call_end(&self) -> &'static str {
        CLOSE
    }

    fn parse(&self, text: &str, allowed: &[String]) -> ParsedOutput {
        let mut calls = Vec::new();
        let mut content = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(open) = rest.find(OPEN) {
            let body_start = open + OPEN.len();
            let Some(close) = rest[body_start..].find(CLOSE) else {
                break;
            };
            let body = rest[body_start..body_start + close].trim();
            match serde_json::from_str::<CallBody>(body) {
                Ok(call) if allowed.contains(&call.name) => {
                    content.push_str(&rest[..open]);
                    calls.push(ParsedCall {
                        name: call.name,
                        arguments: call
                            .arguments
                            .map_or_else(|| "{}".to_string(), |a| a.get().to_string()),
                    });
                }
                _ => content.push_str(&rest[..body_start + close + CLOSE.len()]),
            }
            rest = &rest[body_start + close + CLOSE.len()..];
        }
        content.push_str(rest);
        ParsedOutput {
            content: (!content.trim().is_empty()).then_some(content),
            calls,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed() -> Vec<String> {
        vec!["search".to_string()]
    }

    #[test]
    fn extracts_calls_with_raw_arguments() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"b\": true, \"a\": 1.50}}\n</tool_call>";
        let out = HermesParser.parse(text, &allowed());
        assert_eq!(out.content.as_deref(), Some("Let me look.\n"));
        assert_eq!(out.calls[0].name, "search");
        assert_eq!(out.calls[0].arguments, r#"{"b": true, "a": 1.50}"#);
    }

    #[test]
    fn leaves_unknown_tools_and_bad_json_as_text() {
        for text in [
            "<tool_call>{\"name\": \"other\", \"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"search\", \"arguments\": {</tool_call>",
            "<tool_call>{\"name\": \"search\"",
        ] {
            let out = HermesParser.parse(text, &allowed());
            assert!(out.calls.is_empty());
            assert_eq!(out.content.as_deref(), Some(text));
        }
    }

    #[test]
    fn several_calls_and_no_content() {
        let text = "<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": 1}}</tool_call>\n<tool_call>{\"name\": \"search\"}</tool_call>";
        let out = HermesParser.parse(text, &allowed());
        assert_eq!(out.calls.len(), 2);
        assert_eq!(out.calls[1].arguments, "{}");
        assert_eq!(out.content, None);
    }
}
