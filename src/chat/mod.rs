//! The conversation a turn is asked for, in no API's vocabulary: messages (normalised from the
//! OpenAI-shaped messages every adapter writes them as), tools, tool choice, sampling.

pub(crate) mod images;
pub(crate) mod messages;
pub(crate) mod request;
pub(crate) mod resent;
pub(crate) mod wire;

pub use images::{Image, ImageLink, MAX_IMAGES, Part};
pub use messages::{ChatMessage, Role, ToolCall};
pub use request::{CallRules, ChatRequest, MAX_N, RequestError, ResponseFormat, ToolChoice};
pub use resent::SentConversation;
