//! `auto`: every supported format at once, detected by its signal; calls of different formats
//! are taken in document order. Mistral's bracket forms are only looked for when no tagged call
//! was found (bracket text is more likely to be prose).

use super::{
    DeepSeekV3Parser, FoundCall, Gemma4Parser, HermesParser, MistralParser, QwenXmlParser,
    ToolParser,
};

/// Parser that accepts any supported format.
#[derive(Debug, Default, Clone, Copy)]
pub struct AutoParser;

const FORMATS: &[&dyn ToolParser] = &[
    &HermesParser,
    &QwenXmlParser,
    &Gemma4Parser,
    &DeepSeekV3Parser,
    &MistralParser,
];
const TAGGED: &[&dyn ToolParser] = &[
    &HermesParser,
    &QwenXmlParser,
    &Gemma4Parser,
    &DeepSeekV3Parser,
];

impl ToolParser for AutoParser {
    fn name(&self) -> &'static str {
        "auto"
    }

    fn signals(&self) -> &'static [&'static str] {
        &[
            "<tool_call>",
            "<function=",
            "<|tool_call>",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁call▁begin｜>",
            "[TOOL_CALLS]",
        ]
    }

    fn markers(&self) -> &'static [&'static str] {
        &[
            "<tool_call>",
            "</tool_call>",
            "<|tool_call>",
            "<tool_call|>",
            "<|\"|>",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>",
            "[TOOL_CALLS]",
            "[/TOOL_CALLS]",
            "[CALL_ID]",
            "[ARGS]",
        ]
    }

    /// Calls the proxy never produced are written in the Hermes format.
    fn write_calls(&self, calls: &[(&str, &serde_json::Value)]) -> String {
        HermesParser.write_calls(calls)
    }

    fn block_len(&self, held: &str) -> Option<usize> {
        FORMATS
            .iter()
            .filter(|f| f.signals().iter().any(|s| held.starts_with(s)))
            .filter_map(|f| f.block_len(held))
            .min()
    }

    fn find_calls(&self, text: &str, heal: bool) -> Vec<FoundCall> {
        let mut found: Vec<FoundCall> = TAGGED
            .iter()
            .flat_map(|f| f.find_calls(text, heal))
            .collect();
        if found.is_empty() {
            return MistralParser.find_calls(text, heal);
        }
        found.sort_by_key(|c| (c.span.start, std::cmp::Reverse(c.span.end)));
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::Promoter;

    #[test]
    fn mixed_formats_in_document_order() {
        let tools = serde_json::json!([{"type": "function", "function": {"name": "A"}}, {"type": "function", "function": {"name": "B"}}]);
        let promoter = Promoter::new(
            Some(&crate::tools::test_support::declared(tools)),
            &["A".to_string(), "B".to_string()],
            true,
        );
        let text = "one <function=B><parameter=x>1</parameter></function> two <tool_call>{\"name\": \"A\", \"arguments\": {}}</tool_call> three";
        let out = AutoParser.parse(text, &promoter);
        let names: Vec<&str> = out.calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["B", "A"]);
        assert_eq!(out.content.as_deref(), Some("one  two  three"));
        let mistral = r#"[TOOL_CALLS][{"name": "A", "arguments": {}}]"#;
        assert_eq!(AutoParser.parse(mistral, &promoter).calls.len(), 1);
    }
}
