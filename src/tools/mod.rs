//! Tool-call formats: turning the model's raw text into OpenAI `tool_calls`.
//!
//! The node always keeps the raw sampled tokens; parsing only shapes the response. Each format
//! implements [`ToolParser`]; sessions pick one by name at creation from [`registry`].

mod auto;
mod declared;
mod deepseek;
mod gemma4;
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
    fn parse(&self, text: &str, promoter: &Promoter) -> ParsedOutput {
        assemble(text, &self.find_calls(text, promoter.heals()), promoter)
    }
}

/// Removes the promoted calls' markup from `text`.
pub fn assemble(text: &str, found: &[FoundCall], promoter: &Promoter) -> ParsedOutput {
    let mut content = String::with_capacity(text.len());
    let mut calls = Vec::new();
    let mut call_offsets = Vec::new();
    let mut cursor = 0;
    for call in found {
        if call.span.start < cursor {
            continue;
        }
        if let Some(arguments) = promoter.arguments(&call.name, &call.arguments) {
            content.push_str(&text[cursor..call.span.start]);
            call_offsets.push(content.len());
            calls.push(ParsedCall {
                name: call.name.clone(),
                arguments,
            });
            cursor = call.span.end;
        }
    }
    content.push_str(&text[cursor..]);
    ParsedOutput {
        content: (!content.trim().is_empty()).then_some(content),
        calls,
        call_offsets,
    }
}

/// JSON text the way Python's `json.dumps` writes it (as chat templates render arguments).
fn python_json(value: &serde_json::Value) -> String {
    let value = minijinja::Value::from(minijinja::value::Serde(value));
    crate::template::pyjson::dumps(&value, &Default::default()).unwrap_or_default()
}
