//! Llama 3 JSON format: `{"name": NAME, "parameters": {...}}`, bare or after `<|python_tag|>`;
//! several calls are separated by `;`. The separator belongs to the call before it, so the spans
//! of a run of calls tile it.

use super::scan::{balanced, leading_space};
use super::{FoundCall, JsonCall, ToolParser, python_json};
use serde_json::Value;

const TAG: &str = "<|python_tag|>";
const BARE: &str = "{\"name\"";

/// Parser for Llama 3 JSON calls.
#[derive(Debug, Default, Clone, Copy)]
pub struct Llama3JsonParser;

impl ToolParser for Llama3JsonParser {
    fn name(&self) -> &'static str {
        "llama3_json"
    }

    fn signals(&self) -> &'static [&'static str] {
        &[TAG, BARE]
    }

    fn markers(&self) -> &'static [&'static str] {
        &[TAG]
    }

    fn block_len(&self, held: &str) -> Option<usize> {
        read_run(held, 0, true).map(|(_, end)| end)
    }

    fn find_calls(&self, text: &str, _heal: bool) -> Vec<FoundCall> {
        let mut found = Vec::new();
        let mut from = 0;
        while let Some(at) = [TAG, BARE]
            .iter()
            .filter_map(|s| text[from..].find(s))
            .min()
            .map(|at| from + at)
        {
            let (calls, end) = read_run(text, at, false).unwrap_or_default();
            found.extend(calls);
            from = end.max(at + 1);
        }
        found
    }

    fn write_calls(&self, calls: &[(&str, &Value)]) -> String {
        let calls: Vec<String> = calls
            .iter()
            .map(|(name, arguments)| {
                python_json(&serde_json::json!({"name": name, "parameters": arguments}))
            })
            .collect();
        calls.join("; ")
    }
}

/// The calls of the run of `;`-separated objects at `start` (a tag or `{`) and where the run
/// ends (past every object it read, calls or not). With `lookahead`, `None` while the text
/// ends where the run could still go on.
fn read_run(text: &str, start: usize, lookahead: bool) -> Option<(Vec<FoundCall>, usize)> {
    let mut pos = start;
    if text[pos..].starts_with(TAG) {
        pos += TAG.len();
        pos += leading_space(&text[pos..]);
        if pos == text.len() {
            return if lookahead {
                None
            } else {
                Some((Vec::new(), pos))
            };
        }
    }
    let mut calls = Vec::new();
    let mut span_start = start;
    let mut end = pos;
    while text[pos..].starts_with('{') {
        let Some(object_end) = balanced(text, pos) else {
            return if lookahead { None } else { Some((calls, end)) };
        };
        let call = serde_json::from_str::<JsonCall>(&text[pos..object_end]).ok();
        end = object_end;
        let mut next = object_end + leading_space(&text[object_end..]);
        if lookahead && next == text.len() {
            return None;
        }
        let separated = text[next..].starts_with(';');
        if separated {
            next += 1;
            next += leading_space(&text[next..]);
            if lookahead && next == text.len() {
                return None;
            }
        }
        let continues = separated && text[next..].starts_with('{');
        let span_end = if continues { next } else { object_end };
        if let Some(call) = call {
            calls.push(FoundCall {
                span: span_start..span_end,
                name: call.name,
                arguments: call.arguments.map_or("{}", |a| a.get()).to_string(),
            });
        }
        if !continues {
            break;
        }
        span_start = next;
        pos = next;
    }
    Some((calls, end.max(start + 1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::test_support::promoter;

    #[test]
    fn tagged_bare_and_separated_calls() {
        let p = promoter(&["a", "b"]);
        let text = r#"<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}"#;
        let out = Llama3JsonParser.parse(text, &p);
        assert_eq!(out.calls.len(), 2);
        assert_eq!(out.calls[0].arguments, r#"{"x": 1}"#);
        assert_eq!(out.content, None);
        let bare = r#"{"name": "b", "parameters": {"q": "}"}} and then"#;
        let out = Llama3JsonParser.parse(bare, &p);
        assert_eq!(out.calls[0].arguments, r#"{"q": "}"}"#);
        assert_eq!(out.content.as_deref(), Some(" and then"));
    }

    #[test]
    fn the_stream_waits_for_what_follows_a_call() {
        let one = r#"{"name": "a", "parameters": {}}"#;
        assert_eq!(Llama3JsonParser.block_len(one), None);
        assert_eq!(Llama3JsonParser.block_len(&format!("{one};")), None);
        assert_eq!(
            Llama3JsonParser.block_len(&format!("{one} done")),
            Some(one.len())
        );
        assert_eq!(Llama3JsonParser.block_len("<|python_tag|>"), None);
        assert_eq!(
            Llama3JsonParser.block_len("<|python_tag|>print(1)"),
            Some(TAG.len())
        );
        let not_a_call = r#"{"name": 1} x"#;
        assert_eq!(Llama3JsonParser.block_len(not_a_call), Some(11));
    }

    #[test]
    fn written_calls_read_back() {
        let args = serde_json::json!({"q": "x"});
        let text = Llama3JsonParser.write_calls(&[("a", &args), ("b", &args)]);
        assert_eq!(
            text,
            r#"{"name": "a", "parameters": {"q": "x"}}; {"name": "b", "parameters": {"q": "x"}}"#
        );
        let found = Llama3JsonParser.find_calls(&text, false);
        assert_eq!((found.len(), found[1].span.end), (2, text.len()));
    }
}
