//! Hermes / Qwen format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

use super::{FoundCall, JsonCall, ToolParser, python_json};
use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Parser for `<tool_call>` JSON blocks.
#[derive(Debug, Default, Clone, Copy)]
pub struct HermesParser;

impl ToolParser for HermesParser {
    fn name(&self) -> &'static str {
        "hermes"
    }

    fn signals(&self) -> &'static [&'static str] {
        &[OPEN]
    }

    fn markers(&self) -> &'static [&'static str] {
        &[OPEN, CLOSE]
    }

    fn write_calls(&self, calls: &[(&str, &Value)]) -> String {
        let calls: Vec<String> = calls
            .iter()
            .map(|(name, arguments)| {
                let call = serde_json::json!({"name": name, "arguments": arguments});
                format!("{OPEN}\n{}\n{CLOSE}", python_json(&call))
            })
            .collect();
        calls.join("\n")
    }

    fn block_len(&self, held: &str) -> Option<usize> {
        held.find(CLOSE).map(|at| at + CLOSE.len())
    }

    fn find_calls(&self, text: &str, heal: bool) -> Vec<FoundCall> {
        let mut found = Vec::new();
        let mut from = 0;
        while let Some(open) = text[from..].find(OPEN).map(|at| from + at) {
            let body_start = open + OPEN.len();
            // An unclosed call runs to the end of the text; only healing reads it.
            let (body_end, end) = match text[body_start..].find(CLOSE) {
                Some(close) => (body_start + close, body_start + close + CLOSE.len()),
                None if heal => (text.len(), text.len()),
                None => break,
            };
            if let Ok(call) = serde_json::from_str::<JsonCall>(text[body_start..body_end].trim()) {
                found.push(FoundCall {
                    span: open..end,
                    name: call.name,
                    arguments: call.arguments.map_or("{}", |a| a.get()).to_string(),
                });
            }
            from = end;
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::Promoter;

    fn allowed() -> Promoter {
        let tools = serde_json::json!([{"type": "function", "function": {"name": "search",
            "parameters": {"properties": {"q": {"type": "string"}}, "required": ["q"]}}}]);
        Promoter::new(
            Some(&crate::tools::test_support::declared(tools)),
            &["search".to_string()],
            false,
        )
    }

    fn healing() -> Promoter {
        let tools = serde_json::json!([{"type": "function", "function": {"name": "search",
            "parameters": {"properties": {"q": {"type": "string"}}, "required": ["q"]}}}]);
        Promoter::new(
            Some(&crate::tools::test_support::declared(tools)),
            &["search".to_string()],
            true,
        )
    }

    #[test]
    fn healing_promotes_an_unclosed_call_and_bare_string_arguments() {
        let text = "Sure. <tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}";
        let out = HermesParser.parse(text, &healing());
        assert_eq!(out.calls.len(), 1);
        assert_eq!(out.content.as_deref(), Some("Sure. "));
        assert!(
            HermesParser.parse(text, &allowed()).calls.is_empty(),
            "not without healing"
        );
        let bare = "<tool_call>{\"name\": \"search\", \"arguments\": \"cats\"}</tool_call>";
        assert_eq!(
            HermesParser.parse(bare, &healing()).calls[0].arguments,
            r#"{"q":"cats"}"#
        );
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
            let healed = HermesParser.parse(text, &healing());
            assert!(healed.calls.is_empty(), "{text}");
            assert_eq!(healed.content.as_deref(), Some(text));
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
