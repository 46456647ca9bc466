//! Mistral format: `[TOOL_CALLS]` followed by a JSON array of `{"name", "arguments"}` objects
//! (commas between them optional), or `NAME{json}`, or `NAME[CALL_ID]id[ARGS]{json}`; an
//! optional `[/TOOL_CALLS]` closes it. Array elements each get their own span, so an undeclared
//! element in the middle stays text while its neighbours are promoted. Arguments that are null
//! or not an object become `{}`.

use super::scan::balanced;
use super::{FoundCall, JsonCall, ToolParser, python_json};
use serde_json::Value;
use serde_json::value::RawValue;

const OPEN: &str = "[TOOL_CALLS]";
const CLOSE: &str = "[/TOOL_CALLS]";
const CALL_ID: &str = "[CALL_ID]";
const ARGS: &str = "[ARGS]";

/// Parser for Mistral `[TOOL_CALLS]` calls.
#[derive(Debug, Default, Clone, Copy)]
pub struct MistralParser;

impl ToolParser for MistralParser {
    fn name(&self) -> &'static str {
        "mistral"
    }

    fn signals(&self) -> &'static [&'static str] {
        &[OPEN]
    }

    fn markers(&self) -> &'static [&'static str] {
        &[OPEN, CLOSE, CALL_ID, ARGS]
    }

    fn write_calls(&self, calls: &[(&str, &Value)]) -> String {
        let calls: Vec<Value> = calls
            .iter()
            .map(|(name, arguments)| serde_json::json!({"name": name, "arguments": arguments}))
            .collect();
        format!("{OPEN}{}", python_json(&Value::Array(calls)))
    }

    fn block_len(&self, held: &str) -> Option<usize> {
        let body = held.strip_prefix(OPEN)?;
        let start = body.len() - body.trim_start().len();
        let end = if body[start..].starts_with('[') {
            balanced(body, start)?
        } else {
            let brace = start + body[start..].find('{')?;
            balanced(body, brace)?
        };
        Some(OPEN.len() + with_closer(body, end))
    }

    fn find_calls(&self, text: &str, heal: bool) -> Vec<FoundCall> {
        let mut found = Vec::new();
        let mut from = 0;
        while let Some(open) = text[from..].find(OPEN).map(|at| from + at) {
            let body = open + OPEN.len();
            let start = body + (text[body..].len() - text[body..].trim_start().len());
            let next = if text[start..].starts_with('[') {
                array_calls(text, open, start, heal, &mut found)
            } else {
                named_call(text, open, start, heal, &mut found)
            };
            match next {
                Some(end) => from = end,
                None => break,
            }
        }
        found
    }
}

/// Elements of `[TOOL_CALLS][{..}, {..}]`; returns where scanning goes on.
fn array_calls(
    text: &str,
    open: usize,
    start: usize,
    heal: bool,
    found: &mut Vec<FoundCall>,
) -> Option<usize> {
    let end = match balanced(text, start) {
        Some(end) => end,
        None if heal => text.len(),
        None => return None,
    };
    let array_end = with_closer(text, end);
    let mut cursor = start + 1;
    let mut first = true;
    while let Some(brace) = text[cursor..end].find('{').map(|at| cursor + at) {
        let Some(close) = balanced(text, brace).filter(|c| *c <= end) else {
            break;
        };
        // Element spans tile the array: the first starts at [TOOL_CALLS], the last ends at `]`.
        let span_start = if first { open } else { cursor };
        let after = text[close..end].trim_start_matches([',', ' ', '\n']);
        let is_last = !after.contains('{');
        let span_end = if is_last {
            array_end
        } else {
            end - after.len()
        };
        if let Ok(element) = serde_json::from_str::<JsonCall>(&text[brace..close]) {
            found.push(FoundCall {
                span: span_start..span_end,
                name: element.name,
                arguments: object_or_empty(element.arguments),
            });
        }
        first = false;
        cursor = span_end.min(end);
    }
    Some(array_end)
}

/// `[TOOL_CALLS]NAME{json}` or `[TOOL_CALLS]NAME[CALL_ID]id[ARGS]{json}`.
fn named_call(
    text: &str,
    open: usize,
    start: usize,
    heal: bool,
    found: &mut Vec<FoundCall>,
) -> Option<usize> {
    let rest = &text[start..];
    let name_len = rest.find(['{', '['])?;
    let name = rest[..name_len].trim().to_string();
    let mut brace = start + name_len;
    if text[brace..].starts_with(CALL_ID) {
        brace = brace + text[brace..].find(ARGS)? + ARGS.len();
    }
    if !text[brace..].starts_with('{') {
        return Some(brace);
    }
    let end = match balanced(text, brace) {
        Some(end) => end,
        None if heal => text.len(),
        None => return None,
    };
    let arguments = serde_json::from_str::<&RawValue>(&text[brace..end]).ok();
    if !name.is_empty() && (arguments.is_some() || heal) {
        found.push(FoundCall {
            span: open..with_closer(text, end),
            name,
            arguments: object_or_empty(arguments),
        });
    }
    Some(with_closer(text, end))
}

fn object_or_empty(arguments: Option<&RawValue>) -> String {
    match arguments.map(RawValue::get) {
        Some(raw) if raw.trim_start().starts_with('{') => raw.to_string(),
        _ => "{}".to_string(),
    }
}

/// Extends `end` over a following `[/TOOL_CALLS]`.
fn with_closer(text: &str, end: usize) -> usize {
    let after = &text[end..];
    match after.trim_start().strip_prefix(CLOSE) {
        Some(rest) => text.len() - rest.len(),
        None => end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::streaming::{CallStream, Piece};
    use crate::tools::test_support::promoter;
    use std::sync::Arc;

    #[test]
    fn arrays_named_calls_and_call_ids() {
        let p = promoter(&["a", "b"]);
        let out = MistralParser.parse(r#"ok [TOOL_CALLS][{"name": "a", "arguments": {"x": 1}} {"name": "b", "arguments": null}]"#, &p);
        assert_eq!(out.calls.len(), 2);
        assert_eq!(out.calls[0].arguments, r#"{"x": 1}"#);
        assert_eq!(out.calls[1].arguments, "{}");
        assert_eq!(out.content.as_deref(), Some("ok "));
        let out = MistralParser.parse(r#"[TOOL_CALLS]a{"x": "y"}[/TOOL_CALLS] after"#, &p);
        assert_eq!(
            (out.calls[0].name.as_str(), out.content.as_deref()),
            ("a", Some(" after"))
        );
        let out = MistralParser.parse(r#"[TOOL_CALLS]b[CALL_ID]abc123[ARGS]{"q": "}"}"#, &p);
        assert_eq!(out.calls[0].arguments, r#"{"q": "}"}"#);
    }

    #[test]
    fn an_undeclared_middle_element_stays_text() {
        let p = promoter(&["a", "c"]);
        let text = r#"[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "nuke", "arguments": {}}, {"name": "c", "arguments": {}}]"#;
        let out = MistralParser.parse(text, &p);
        let names: Vec<&str> = out.calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["a", "c"]);
        assert_eq!(
            out.content.as_deref(),
            Some(r#"{"name": "nuke", "arguments": {}}, "#)
        );
    }

    #[test]
    fn streamed_char_by_char_the_array_is_held_until_it_closes() {
        let text = r#"[TOOL_CALLS][{"name": "a", "arguments": {"s": "]"}}, {"name": "b", "arguments": {}}] done"#;
        let mut stream =
            CallStream::new(Arc::new(MistralParser), promoter(&["a", "b"]), Vec::new());
        let mut pieces = Vec::new();
        for c in text.chars() {
            pieces.extend(stream.push(&c.to_string()));
        }
        pieces.extend(stream.finish(None));
        let calls: Vec<&str> = pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Call(c) => Some(c.name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(calls, vec!["a", "b"]);
        let text_out: String = pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(text_out, " done");
    }
}
