//! Tool-call formats: turning the model's raw text into OpenAI `tool_calls`.
//!
//! The node always keeps the raw sampled tokens; parsing only shapes the response. Each format
//! implements [`ToolParser`]; sessions pick one by name at creation.

mod hermes;
pub mod streaming;

pub use hermes::HermesParser;

use std::sync::Arc;

/// A call found in the model's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments exactly as the model wrote them (JSON text), so they round-trip byte for
    /// byte.
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
    /// Extracts calls to the `allowed` tool names; everything else stays content, byte-intact.
    fn parse(&self, text: &str, allowed: &[String]) -> ParsedOutput;
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
