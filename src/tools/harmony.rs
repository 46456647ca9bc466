//! gpt-oss's Harmony format: a call is a message to a recipient in the `commentary` channel:
//! `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`,
//! the arguments, `<|call|>` (the recipient may come before the channel). The reply's channels
//! are split first ([`crate::reasoning::harmony`]), which passes each call on in this form.

use super::{FoundCall, ToolParser};
use crate::tokenizer::harmony::{CHANNEL, MARKERS, MESSAGE, START, first_end};
use serde_json::Value;

/// The namespace of the functions a request declares.
const FUNCTIONS: &str = "functions.";

/// Parser for Harmony's tool-call messages.
#[derive(Debug, Default, Clone, Copy)]
pub struct HarmonyParser;

impl ToolParser for HarmonyParser {
    fn name(&self) -> &'static str {
        "harmony"
    }

    fn signals(&self) -> &'static [&'static str] {
        &[START]
    }

    fn markers(&self) -> &'static [&'static str] {
        MARKERS
    }

    fn write_calls(&self, calls: &[(&str, &Value)]) -> String {
        calls
            .iter()
            .map(|(name, arguments)| {
                format!(
                    "{START}assistant to={FUNCTIONS}{name}<|channel|>commentary <|constrain|>json\
                     {MESSAGE}{arguments}<|call|>"
                )
            })
            .collect()
    }

    fn block_len(&self, held: &str) -> Option<usize> {
        let body = held.find(MESSAGE)? + MESSAGE.len();
        let (at, len) = first_end(&held[body..])?;
        Some(body + at + len)
    }

    fn find_calls(&self, text: &str, heal: bool) -> Vec<FoundCall> {
        let mut calls = Vec::new();
        // A sampled turn's first message has no `<|start|>`: the generation prompt wrote it.
        if let Some(call) = [CHANNEL, " to=", "to="]
            .iter()
            .any(|header| text.starts_with(header))
            .then(|| read_call(text, 0, heal))
            .flatten()
        {
            calls.push(call);
        }
        let mut from = calls.last().map_or(0, |call| call.span.end);
        while let Some(start) = text[from..].find(START).map(|at| from + at) {
            let Some(call) = read_call(text, start, heal) else {
                from = start + START.len();
                continue;
            };
            from = call.span.end;
            calls.push(call);
        }
        calls
    }
}

/// The call whose message opens at `start`, if it is one: a header naming a function, then the
/// arguments up to an end marker (with `heal`, or up to the end of the text).
fn read_call(text: &str, start: usize, heal: bool) -> Option<FoundCall> {
    let header_end = start + text[start..].find(MESSAGE)?;
    let header = &text[start..header_end];
    let header = header.strip_prefix(START).unwrap_or(header);
    if header.contains(START) {
        return None;
    }
    let name = recipient(header)?.strip_prefix(FUNCTIONS)?;
    let body = header_end + MESSAGE.len();
    let (arguments, end) = match first_end(&text[body..]) {
        Some((at, len)) => (&text[body..body + at], body + at + len),
        None if heal => (&text[body..], text.len()),
        None => return None,
    };
    Some(FoundCall {
        span: start..end,
        name: name.to_string(),
        arguments: arguments.trim().to_string(),
    })
}

/// The recipient a header names (`to=functions.get_weather`).
fn recipient(header: &str) -> Option<&str> {
    let after = &header[header.find("to=")? + "to=".len()..];
    let end = after.find([' ', '<', '\n']).unwrap_or(after.len());
    Some(&after[..end]).filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::test_support::promoter;

    const CALL: &str = "<|start|>assistant<|channel|>commentary to=functions.f \
        <|constrain|>json<|message|>{\"a\": 1}<|call|>";

    #[test]
    fn reads_calls_with_the_recipient_before_or_after_the_channel() {
        let out = HarmonyParser.parse(&format!("Checking.{CALL}"), &promoter(&["f"]));
        assert_eq!(out.content.as_deref(), Some("Checking."));
        assert_eq!(
            (out.calls[0].name.as_str(), out.calls[0].arguments.as_str()),
            ("f", "{\"a\": 1}")
        );
        let first =
            "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>";
        assert_eq!(HarmonyParser.find_calls(first, false)[0].name, "f");
        let written = HarmonyParser.write_calls(&[("f", &serde_json::json!({"a": 1}))]);
        assert_eq!(
            HarmonyParser.find_calls(&written, false)[0].arguments,
            "{\"a\":1}"
        );
    }

    #[test]
    fn an_unfinished_call_is_read_only_when_healing() {
        let cut = &CALL[..CALL.len() - "<|call|>".len()];
        assert!(HarmonyParser.find_calls(cut, false).is_empty());
        let healed = HarmonyParser.parse(cut, &promoter(&["f"]));
        assert_eq!(healed.calls[0].arguments, "{\"a\": 1}");
        assert_eq!(healed.outcomes.healed, 1);
        assert_eq!(HarmonyParser.block_len(cut), None);
        assert_eq!(
            HarmonyParser.block_len(&format!("{CALL} after")),
            Some(CALL.len())
        );
    }

    #[test]
    fn a_recipient_outside_the_functions_namespace_is_no_call() {
        let browse =
            "<|start|>assistant<|channel|>commentary to=browser.search<|message|>{}<|call|>";
        let out = HarmonyParser.parse(browse, &promoter(&["f"]));
        assert!(out.calls.is_empty());
        assert_eq!(out.outcomes.left_as_text, 1);
        let undeclared = HarmonyParser.parse(CALL, &promoter(&["g"]));
        assert!(undeclared.calls.is_empty() && undeclared.content.as_deref() == Some(CALL));
    }
}
