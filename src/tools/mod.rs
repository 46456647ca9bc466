//! Tool-call formats: turning the model's raw text into OpenAI `tool_calls`.
//!
//! The node always keeps the raw sampled tokens; parsing only shapes the response. Each format
//! implements [`ToolParser`]; sessions pick one by name at creation from [`registry`].

mod auto;
mod declared;
mod deepseek;
pub mod detect;
pub(crate) mod echo;
mod foreign;
mod gemma4;
mod harmony;
mod hermes;
mod llama3;
mod mistral;
mod promote;
mod pythonic;
mod qwen_xml;
pub mod registry;
mod scan;
pub mod streaming;
#[cfg(test)]
mod test_support;

pub use auto::AutoParser;
pub use declared::{DeclaredTools, ToolDialect, ToolsError};
pub use deepseek::DeepSeekV3Parser;
pub use gemma4::Gemma4Parser;
pub use harmony::HarmonyParser;
pub use hermes::HermesParser;
pub use llama3::Llama3JsonParser;
pub use mistral::MistralParser;
pub use promote::Promoter;
pub use pythonic::PythonicParser;
pub use qwen_xml::QwenXmlParser;
pub use registry::{ToolFormat, UnknownFormat};

/// A call found in the model's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function called.
    pub name: String,
    /// The arguments as a JSON object's text: exactly as the model wrote them when it wrote an
    /// object (so they round-trip byte for byte), else as healing built them.
    pub arguments: String,
    /// The format the call was written in, when it is not the session's (cross-format
    /// healing: `qwen3_coder` for a `<function=…>` call in a Hermes session).
    pub healed_from: Option<&'static str>,
}

/// Model text split into what the user sees and the calls it makes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedOutput {
    /// Text outside the calls, in document order; `None` when nothing but whitespace is left.
    pub content: Option<String>,
    /// The calls promoted, in document order.
    pub calls: Vec<ParsedCall>,
    /// For each call, the byte offset in the content (as if it were kept when only whitespace)
    /// at which its markup stood: text before it came before the call.
    pub call_offsets: Vec<usize>,
    /// How the call markup in the text fared.
    pub outcomes: CallOutcomes,
}

/// How the call markup in a text fared (`GET /metrics` counts it per parser).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallOutcomes {
    /// Calls returned as tool calls, read as written.
    pub promoted: u32,
    /// Calls returned as tool calls only through healing: their closing markup never came, or
    /// their arguments had to be repaired.
    pub healed: u32,
    /// Call markup left in the content: a call the request does not let the model make, or
    /// markup that does not read as a call.
    pub left_as_text: u32,
}

impl std::ops::AddAssign for CallOutcomes {
    fn add_assign(&mut self, other: Self) {
        self.promoted += other.promoted;
        self.healed += other.healed;
        self.left_as_text += other.left_as_text;
    }
}

/// A call written as JSON (`{"name": ..., "arguments": ...}`), as Hermes and Mistral write them;
/// the arguments are kept as the exact text the model wrote.
#[derive(serde::Deserialize)]
pub(crate) struct JsonCall<'a> {
    pub name: String,
    #[serde(borrow, alias = "parameters", alias = "args")]
    pub arguments: Option<&'a serde_json::value::RawValue>,
}

/// A call written in the model's text, before the promotion rules are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundCall {
    /// The bytes of its markup, wrapper included.
    pub span: std::ops::Range<usize>,
    /// The function called.
    pub name: String,
    /// The arguments as JSON text (as written when the format writes JSON).
    pub arguments: String,
}

/// A tool-call text format.
pub trait ToolParser: Send + Sync + std::fmt::Debug {
    /// The name sessions use to select it (`hermes`).
    fn name(&self) -> &'static str;
    /// Texts that open a call: streamed text is held from any of them on.
    fn signals(&self) -> &'static [&'static str];
    /// The format's marker texts. Where a tokenizer has them as special tokens, reply text
    /// keeps them (other special tokens are left out), or the calls could not be seen.
    fn markers(&self) -> &'static [&'static str];
    /// For text that starts with a signal, the length of its first call once the call's
    /// markup is complete.
    fn block_len(&self, held: &str) -> Option<usize>;
    /// Every well-formed call in `text`, in document order; with `heal`, also a call whose
    /// closing markup never came because the text ended.
    fn find_calls(&self, text: &str, heal: bool) -> Vec<FoundCall>;
    /// `(name, arguments)` calls written as this format writes them: the text of an assistant
    /// message's calls the proxy never produced, for templates that cannot render `tool_calls`.
    fn write_calls(&self, calls: &[(&str, &serde_json::Value)]) -> String;

    /// The text split into content and the calls `promoter` accepts. Promoted markup is removed
    /// exactly; everything else (unpromoted calls included) stays, byte-intact and in order.
    /// With healing on, calls written in another tagged format are promoted too.
    fn parse(&self, text: &str, promoter: &Promoter) -> ParsedOutput {
        let heal = promoter.heals();
        let own = self.find_calls(text, heal);
        // Only a call that runs to the end of the text can lack its closing markup.
        let end = text.trim_end().len();
        let strict =
            (heal && own.iter().any(|c| c.span.end >= end)).then(|| self.find_calls(text, false));
        let foreign = match heal {
            true => foreign::calls(self.name(), text, heal, &own),
            false => Vec::new(),
        };
        let found = in_document_order(&own, &foreign);
        let mut parsed = assemble(text, &found, promoter, strict.as_deref());
        parsed.outcomes.left_as_text += unread_markup(self, text, &own);
        parsed
    }
}

/// Every call in `text`, in document order, each with the format it was written in when not
/// `parser`'s: the session format's calls and, with `heal`, those written in another tagged
/// format (what a reply promotes from, before the promotion rules).
pub fn calls_in_any_format(
    parser: &dyn ToolParser,
    text: &str,
    heal: bool,
) -> Vec<(FoundCall, Option<&'static str>)> {
    let own = parser.find_calls(text, heal);
    let foreign = match heal {
        true => foreign::calls(parser.name(), text, heal, &own),
        false => Vec::new(),
    };
    in_document_order(&own, &foreign)
        .into_iter()
        .map(|(call, format)| (call.clone(), format))
        .collect()
}

fn in_document_order<'c>(
    own: &'c [FoundCall],
    foreign: &'c [(FoundCall, &'static str)],
) -> Vec<(&'c FoundCall, Option<&'static str>)> {
    let mut found: Vec<(&FoundCall, Option<&'static str>)> = own
        .iter()
        .map(|call| (call, None))
        .chain(foreign.iter().map(|(call, format)| (call, Some(*format))))
        .collect();
    found.sort_by_key(|(c, _)| (c.span.start, std::cmp::Reverse(c.span.end)));
    found
}

/// How many blocks of call markup in `text` no call in `found` covers.
fn unread_markup<P: ToolParser + ?Sized>(parser: &P, text: &str, found: &[FoundCall]) -> u32 {
    let mut unread = 0;
    let mut from = 0;
    while let Some((at, len)) = parser
        .signals()
        .iter()
        .filter_map(|signal| Some((from + text[from..].find(signal)?, signal.len())))
        .min()
    {
        let next = match found.iter().find(|call| call.span.contains(&at)) {
            Some(call) => call.span.end,
            None => {
                unread += 1;
                at + parser.block_len(&text[at..]).unwrap_or(text.len() - at)
            }
        };
        from = next.max(at + len);
    }
    unread
}

/// Removes the promoted calls' markup from `text`. `found`: the calls in document order, each
/// with the format it was written in when not the session's; `strict`: the session format's
/// calls found without healing, when healing may have found more (a promoted call not among
/// them was healed).
fn assemble(
    text: &str,
    found: &[(&FoundCall, Option<&'static str>)],
    promoter: &Promoter,
    strict: Option<&[FoundCall]>,
) -> ParsedOutput {
    let mut content = String::with_capacity(text.len());
    let mut calls = Vec::new();
    let mut call_offsets = Vec::new();
    let mut outcomes = CallOutcomes::default();
    let mut cursor = 0;
    for &(call, healed_from) in found {
        if call.span.start < cursor {
            continue;
        }
        let Some(arguments) = promoter.arguments(&call.name, &call.arguments) else {
            outcomes.left_as_text += 1;
            continue;
        };
        let unclosed = strict.is_some_and(|strict| strict.iter().all(|s| s.span != call.span));
        match healed_from.is_some() || unclosed || arguments != call.arguments.trim() {
            true => outcomes.healed += 1,
            false => outcomes.promoted += 1,
        }
        content.push_str(&text[cursor..call.span.start]);
        call_offsets.push(content.len());
        calls.push(ParsedCall {
            name: call.name.clone(),
            arguments,
            healed_from,
        });
        cursor = call.span.end;
    }
    content.push_str(&text[cursor..]);
    ParsedOutput {
        content: (!content.trim().is_empty()).then_some(content),
        calls,
        call_offsets,
        outcomes,
    }
}

/// JSON text the way Python's `json.dumps` writes it (as chat templates render arguments).
fn python_json(value: &serde_json::Value) -> String {
    let value = minijinja::Value::from(minijinja::value::Serde(value));
    crate::template::pyjson::dumps(&value, &Default::default()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use test_support::promoter;

    fn outcomes(text: &str) -> CallOutcomes {
        HermesParser.parse(text, &promoter(&["f"])).outcomes
    }

    #[test]
    fn each_call_is_counted_as_promoted_healed_or_left_as_text() {
        let call = |name: &str| {
            format!("<tool_call>{{\"name\": \"{name}\", \"arguments\": {{}}}}</tool_call>")
        };
        let counted = |promoted, healed, left_as_text| CallOutcomes {
            promoted,
            healed,
            left_as_text,
        };
        assert_eq!(outcomes("plain text"), CallOutcomes::default());
        assert_eq!(outcomes(&call("f")), counted(1, 0, 0));
        // Not declared: left in the content.
        assert_eq!(
            outcomes(&format!("{}{}", call("f"), call("g"))),
            counted(1, 0, 1)
        );
        // Markup that is no call at all.
        assert_eq!(
            outcomes("<tool_call>not json</tool_call> and on"),
            counted(0, 0, 1)
        );
        // The closing tag never came.
        assert_eq!(
            outcomes("<tool_call>{\"name\": \"f\", \"arguments\": {}}"),
            counted(0, 1, 0)
        );
        // Arguments as a string holding the object.
        let stringified = r#"<tool_call>{"name": "f", "arguments": "{\"a\": 1}"}</tool_call>"#;
        assert_eq!(outcomes(stringified), counted(0, 1, 0));
    }
}
