//! Tool-call formats: turning the model's raw text into OpenAI `tool_calls`.
//!
//! The node always keeps the raw sampled tokens; parsing only shapes the response. Each format
//! implements [`ToolParser`]; sessions pick one by name at creation.

mod hermes;
mod promote;
pub mod streaming;

pub use hermes::HermesParser;
pub use promote::Promoter;

use std::sync::Arc;

/// A call found in the model's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
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
    pub calls: Vec<ParsedCall>,
}

/// A tool-call text format.
pub trait ToolParser: Send + Sync + std::fmt::Debug {
    /// The name sessions use to select it (`hermes`).
    fn name(&self) -> &'static str;
    /// Extracts the calls `promoter` accepts; everything else stays content, byte-intact. With
    /// healing on, a call whose closing markup never came (the text ended) is promoted too.
    fn parse(&self, text: &str, promoter: &Promoter) -> ParsedOutput;
    /// The text that opens a call (`<tool_call>`): streamed text is held from here on.
    fn call_start(&self) -> &'static str;
    /// The text that closes a call (`</tool_call>`).
    fn call_end(&self) -> &'static str;
}

/// Names accepted by `POST /sessions/create`'s `tool_parser`.
pub const PARSER_NAMES: &[&str] = &["hermes", "qwen"];

/// The parser registered under `name`.
pub fn parser_for(name: &str) -> Option<Arc<dyn ToolParser>> {
    match name {
        "hermes" | "qwen" => Some(Arc::new(HermesParser)),
        _ => None,
    }
}
