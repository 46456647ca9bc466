//! A conversation turn's request, validated: what the chat, Messages and Responses adapters
//! each build from their wire bodies (`http::openai::request`, `http::anthropic::request`,
//! `http::responses::request`).

use super::messages::{ChatMessage, MessageError};
use crate::generation::SamplingParams;
use crate::session::Api;
use crate::session::replies::TurnKey;
use crate::tools::{DeclaredTools, ToolsError};
use serde_json::{Map, Value};
use std::sync::Arc;

/// Most samples one request may ask for.
pub const MAX_N: u32 = 128;

/// What `tool_choice` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// `none`: no tool may be called.
    None,
    /// `auto`: the model decides (the default).
    Auto,
    /// `required`: the model should call a tool.
    Required,
    /// This function only.
    Function(String),
}

/// What `response_format` asks for.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum ResponseFormat {
    /// `text`: anything (the default).
    #[default]
    Text,
    /// `json_object`: a JSON object.
    JsonObject,
    /// `json_schema`: JSON satisfying this schema.
    JsonSchema(Value),
}

/// What the model may do with tool calls in its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallRules {
    /// `false`: at most one tool call per reply.
    pub parallel: bool,
    /// Heal unclosed or loosely formed tool calls.
    pub heal: bool,
    /// Retry once when the model described a call it did not make.
    pub nudge: bool,
}

impl Default for CallRules {
    /// Several calls a reply, healed, no nudge.
    fn default() -> Self {
        Self {
            parallel: true,
            heal: true,
            nudge: false,
        }
    }
}

/// One conversation turn, validated, in no API's vocabulary: what every adapter (chat,
/// Messages, Responses) builds from its wire body and the turn pipeline runs. How the reply is
/// written (streamed or not, logprobs, usage, the prompt's ids) stays with the adapter.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The API it came in by: the node's turn records it, and calls are named by its rule.
    pub api: Api,
    /// The conversation so far.
    pub messages: Vec<Arc<ChatMessage>>,
    /// The tools declared, if any.
    pub tools: Option<Arc<DeclaredTools>>,
    /// Declared tools left out of the prompt (recorded in the node's turn).
    pub tools_left_out: Vec<String>,
    /// Which tools the model may call.
    pub tool_choice: ToolChoice,
    /// What the reply's calls may be and how they are read.
    pub calls: CallRules,
    /// What the reply's text must be.
    pub response_format: ResponseFormat,
    /// Extra variables for the chat template (`enable_thinking`, ...).
    pub template_kwargs: Map<String, Value>,
    /// End the prompt with the assistant's header.
    pub add_generation_prompt: bool,
    /// How to sample.
    pub params: SamplingParams,
    /// How many choices to sample.
    pub n: u32,
    /// The request's `Idempotency-Key`, recorded with the turn.
    pub key: Option<TurnKey>,
}

/// Why a request body cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// No messages.
    #[error("'messages' must not be empty")]
    EmptyMessages,
    /// A message cannot be used.
    #[error(transparent)]
    Message(#[from] MessageError),
    /// The tool list cannot be used.
    #[error(transparent)]
    Tools(#[from] ToolsError),
    /// Another field is out of range.
    #[error("{0}")]
    Invalid(String),
}

impl ChatRequest {
    /// Refuses a request no backend could serve as asked, whichever API it came in by: no
    /// messages, `n` out of range, sampling parameters out of range, or a `tool_choice` that forces a call to a tool it
    /// does not declare.
    pub fn check(&self) -> Result<(), RequestError> {
        if self.messages.is_empty() {
            return Err(RequestError::EmptyMessages);
        }
        if self.n == 0 || self.n > MAX_N {
            return Err(RequestError::Invalid(format!(
                "'n' must be between 1 and {MAX_N}"
            )));
        }
        self.params.check().map_err(RequestError::Invalid)?;
        let declared = || self.tools.iter().flat_map(|tools| tools.names());
        match &self.tool_choice {
            ToolChoice::Function(name) if !declared().any(|d| d == name) => {
                Err(RequestError::Invalid(format!(
                    "'tool_choice' names the function '{name}', which 'tools' does not declare"
                )))
            }
            ToolChoice::Required if declared().next().is_none() => Err(RequestError::Invalid(
                "'tool_choice' requires a tool call, but 'tools' declares none".into(),
            )),
            _ => Ok(()),
        }
    }

    /// The rules for turning calls in the model's text into `tool_calls`.
    pub fn promoter(&self) -> crate::tools::Promoter {
        crate::tools::Promoter::new(self.tools.as_ref(), &self.callable_tools(), self.calls.heal)
    }

    /// Names of the declared tools that `tool_choice` allows the model to call.
    pub fn callable_tools(&self) -> Vec<String> {
        let declared = self.tools.iter().flat_map(|tools| tools.names());
        match &self.tool_choice {
            ToolChoice::None => Vec::new(),
            ToolChoice::Function(name) => {
                declared.filter(|n| n == name).map(str::to_string).collect()
            }
            ToolChoice::Auto | ToolChoice::Required => declared.map(str::to_string).collect(),
        }
    }
}
