//! What a turn asks for, in no API's vocabulary: a conversation to render (chat, Messages,
//! Responses) or a text prompt to extend (`/v1/completions`).

use super::TextPrompt;
use crate::chat::ChatRequest;
use crate::generation::SamplingParams;
use crate::session::Api;
use crate::session::replies::TurnKey;
use crate::tools::DeclaredTools;

/// A text completion's request.
#[derive(Debug, Clone)]
pub struct TextRequest {
    /// The prompt: text, or ids, that extends the node it starts with.
    pub prompt: TextPrompt,
    /// How to sample.
    pub params: SamplingParams,
    /// Samples asked for.
    pub n: u32,
    /// The idempotency key it came with.
    pub key: Option<TurnKey>,
}

/// One turn's request, borrowed from the adapter that parsed it.
#[derive(Debug, Clone, Copy)]
pub enum TurnRequest<'r> {
    /// A conversation, rendered with the chat template; replies are parsed for tool calls.
    Chat(&'r ChatRequest),
    /// A text prompt; replies are the visible text.
    Text(&'r TextRequest),
}

impl<'r> TurnRequest<'r> {
    /// The API it came in by, as metrics and the node's turns name it.
    pub fn api(self) -> Api {
        match self {
            Self::Chat(request) => request.api,
            Self::Text(_) => Api::Completions,
        }
    }

    /// Samples asked for.
    pub fn n(self) -> u32 {
        match self {
            Self::Chat(request) => request.n,
            Self::Text(request) => request.n,
        }
    }

    /// The idempotency key it came with.
    pub fn key(self) -> Option<&'r TurnKey> {
        match self {
            Self::Chat(request) => request.key.as_ref(),
            Self::Text(request) => request.key.as_ref(),
        }
    }

    /// The tools it declared.
    pub fn tools(self) -> Option<&'r DeclaredTools> {
        match self {
            Self::Chat(request) => request.tools.as_deref(),
            Self::Text(_) => None,
        }
    }
}
