//! Cross-format healing: a model sometimes writes a call in another tagged format than its
//! session's (a Hermes session's model writing Qwen3-Coder's `<function=NAME>`). With healing
//! on, such a call to a declared tool is promoted too — counted as healed, and naming the
//! format it was written in — wherever the healing spec's signals appear. The node keeps the
//! raw tokens either way.

use super::{
    DeepSeekV3Parser, FoundCall, Gemma4Parser, HermesParser, MistralParser, QwenXmlParser,
    ToolParser,
};

/// The tagged formats looked for whatever the session's format.
const TAGGED: &[&dyn ToolParser] = &[
    &HermesParser,
    &QwenXmlParser,
    &Gemma4Parser,
    &DeepSeekV3Parser,
];

/// The other formats a session in the `primary` format also heals calls from: none for `auto`,
/// which reads them all itself.
fn others(primary: &str) -> impl Iterator<Item = &'static dyn ToolParser> + '_ {
    let all = primary != "auto";
    TAGGED
        .iter()
        .copied()
        .filter(move |format| all && format.name() != primary)
}

/// Calls in `text` written in another format than `primary`'s, each with its format's name,
/// in document order; none overlaps a call of `own` (the primary format's). Mistral's bracket
/// forms are looked for only when no tagged call was found (bracket text is more often prose).
pub fn calls(
    primary: &str,
    text: &str,
    heal: bool,
    own: &[FoundCall],
) -> Vec<(FoundCall, &'static str)> {
    let apart = |call: &FoundCall| {
        own.iter()
            .all(|o| o.span.end <= call.span.start || call.span.end <= o.span.start)
    };
    let mut found: Vec<(FoundCall, &'static str)> = others(primary)
        .flat_map(|format| {
            let name = format.name();
            format
                .find_calls(text, heal)
                .into_iter()
                .map(move |c| (c, name))
        })
        .filter(|(call, _)| apart(call))
        .collect();
    let mistral = MistralParser.name();
    if found.is_empty() && own.is_empty() && primary != mistral && primary != "auto" {
        found = MistralParser
            .find_calls(text, heal)
            .into_iter()
            .map(|call| (call, mistral))
            .collect();
    }
    found.sort_by_key(|(c, _)| (c.span.start, std::cmp::Reverse(c.span.end)));
    found
}

/// The texts that open a call in a format other than `primary`'s (a stream holds text from
/// them on, as from its own format's).
pub fn signals(primary: &str) -> impl Iterator<Item = &'static str> + '_ {
    let mistral = (primary != MistralParser.name() && primary != "auto")
        .then(|| MistralParser.signals().iter().copied())
        .into_iter()
        .flatten();
    others(primary)
        .flat_map(|format| format.signals().iter().copied())
        .chain(mistral)
}

/// For held text that starts with another format's signal, the length of its first call once
/// the call's markup is complete.
pub fn block_len(primary: &str, held: &str) -> Option<usize> {
    let mistral: &dyn ToolParser = &MistralParser;
    others(primary)
        .chain((primary != mistral.name()).then_some(mistral))
        .filter(|format| format.signals().iter().any(|s| held.starts_with(s)))
        .filter_map(|format| format.block_len(held))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    const XML: &str = "<function=Bash><parameter=command>ls</parameter></function>";

    #[test]
    fn another_formats_calls_are_found_apart_from_the_sessions_own() {
        let found = calls("hermes", &format!("run {XML}"), true, &[]);
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].0.name.as_str(), found[0].1),
            ("Bash", "qwen3_coder")
        );
        // `auto` reads every format itself.
        assert!(calls("auto", XML, true, &[]).is_empty());
        // A session's own format is not foreign.
        assert!(calls("qwen3_coder", XML, true, &[]).is_empty());
        let own = HermesParser.find_calls(XML, true);
        assert!(own.is_empty());
        let mistral = r#"[TOOL_CALLS][{"name": "Bash", "arguments": {}}]"#;
        assert_eq!(calls("hermes", mistral, true, &[])[0].1, "mistral");
    }

    #[test]
    fn streams_hold_other_formats_signals() {
        let held: Vec<&str> = signals("hermes").collect();
        assert!(held.contains(&"<function=") && held.contains(&"[TOOL_CALLS]"));
        assert_eq!(
            block_len("hermes", &format!("{XML} after")),
            Some(XML.len())
        );
        assert_eq!(block_len("hermes", "<function=Bash><parameter="), None);
    }
}
