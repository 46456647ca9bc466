//! The OpenAI chat API surface: request validation and message normalisation.

pub mod messages;
pub mod request;
pub mod wire;

pub use messages::{ChatMessage, Role, ToolCall};
pub use request::{ChatCompletionBody, ChatRequest, RequestError, ResponseFormat, ToolChoice};
