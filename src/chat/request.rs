//! The body of `POST /{uuid}/v1/chat/completions` (and `/render`), validated.

use super::messages::{ChatMessage, MessageError};
use super::wire::WireMessage;
use crate::generation::SamplingParams;
use crate::session::Api;
use crate::session::replies::TurnKey;
use crate::tools::{DeclaredTools, ToolsError};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::sync::Arc;

pub use crate::generation::MAX_TOP_LOGPROBS;

/// Most samples one request may ask for.
pub const MAX_N: u32 = 128;

/// `stop` as a string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    /// A single stop string.
    One(String),
    /// Several stop strings.
    Many(Vec<String>),
}

impl StopField {
    /// The stop strings of an optional `stop` field.
    pub fn list(field: Option<Self>) -> Vec<String> {
        match field {
            None => Vec::new(),
            Some(Self::One(s)) => vec![s],
            Some(Self::Many(list)) => list,
        }
    }
}

/// The JSON body as sent, fields as OpenAI documents them (and vLLM's extras); unknown fields
/// (`model` among them: the session serves its model) are ignored like OpenAI-compatible
/// servers do.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionBody {
    messages: Vec<WireMessage>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    seed: Option<i64>,
    n: Option<u32>,
    stop: Option<StopField>,
    /// Kept as text: [`DeclaredTools::from_raw`] reads each distinct list once.
    tools: Option<Box<RawValue>>,
    tool_choice: Option<Value>,
    chat_template_kwargs: Option<Map<String, Value>>,
    logprobs: Option<bool>,
    top_logprobs: Option<u32>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    add_generation_prompt: Option<bool>,
    parallel_tool_calls: Option<bool>,
    auto_heal_tool_calls: Option<bool>,
    nudge_tool_calls: Option<bool>,
    return_token_ids: Option<bool>,
    response_format: Option<Value>,
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

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

impl ResponseFormat {
    /// Reads OpenAI's `response_format` (`{"type": "json_schema", "json_schema": {"schema"}}`).
    pub fn parse(value: Option<&Value>) -> Result<Self, RequestError> {
        let Some(value) = value.filter(|v| !v.is_null()) else {
            return Ok(Self::Text);
        };
        match value.get("type").and_then(Value::as_str) {
            Some("text") => Ok(Self::Text),
            Some("json_object") => Ok(Self::JsonObject),
            Some("json_schema") => match value.pointer("/json_schema/schema") {
                Some(schema) if schema.is_object() => Ok(Self::JsonSchema(schema.clone())),
                _ => Err(RequestError::Invalid(
                    "'response_format.json_schema.schema' must be a JSON schema object".into(),
                )),
            },
            _ => Err(RequestError::Invalid(
                "'response_format.type' must be 'text', 'json_object' or 'json_schema'".into(),
            )),
        }
    }
}

/// A validated chat request.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The conversation so far.
    pub messages: Vec<ChatMessage>,
    /// The tools declared, if any.
    pub tools: Option<Arc<DeclaredTools>>,
    /// Which tools the model may call.
    pub tool_choice: ToolChoice,
    /// What the reply's text must be (`response_format`).
    pub response_format: ResponseFormat,
    /// Extra variables for the chat template (`enable_thinking`, ...).
    pub template_kwargs: Map<String, Value>,
    /// End the prompt with the assistant's header (default on).
    pub add_generation_prompt: bool,
    /// How to sample.
    pub params: SamplingParams,
    /// How many choices to sample.
    pub n: u32,
    /// Return each sampled token's logprob.
    pub logprobs: bool,
    /// Reply as server-sent events, token by token.
    pub stream: bool,
    /// With `stream`: a final chunk carries the usage.
    pub include_usage: bool,
    /// `false`: at most one tool call per reply.
    pub parallel_tool_calls: bool,
    /// Heal unclosed or loosely formed tool calls (default on).
    pub heal_tool_calls: bool,
    /// Retry once when the model described a call it did not make (default off).
    pub nudge_tool_calls: bool,
    /// Add the prompt's ids to the reply as `prompt_token_ids` (default off, as in vLLM).
    pub return_token_ids: bool,
    /// Returned tool calls are named `{call_id_prefix}{n}` (`call_` in OpenAI's APIs).
    pub call_id_prefix: &'static str,
    /// The API the request came in by, as the node's turn records it.
    pub api: Api,
    /// Declared tools left out of the prompt (recorded in the node's turn).
    pub tools_left_out: Vec<String>,
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
    /// A request for `messages` with every option at its default: one choice, no tools,
    /// healing on, no stream, calls named `call_{n}`. Other APIs' adapters start from this.
    pub fn conversation(messages: Vec<ChatMessage>, params: SamplingParams) -> Self {
        Self {
            messages,
            tools: None,
            tool_choice: ToolChoice::Auto,
            response_format: ResponseFormat::Text,
            template_kwargs: Map::new(),
            add_generation_prompt: true,
            params,
            n: 1,
            logprobs: false,
            stream: false,
            include_usage: false,
            parallel_tool_calls: true,
            heal_tool_calls: true,
            nudge_tool_calls: false,
            return_token_ids: false,
            call_id_prefix: "call_",
            api: Api::ChatCompletions,
            tools_left_out: Vec::new(),
            key: None,
        }
    }

    /// Validates a parsed body. `default_max_tokens` applies when the client sets no limit.
    pub fn from_body(
        body: ChatCompletionBody,
        default_max_tokens: Option<u32>,
    ) -> Result<Self, RequestError> {
        if body.messages.is_empty() {
            return Err(RequestError::EmptyMessages);
        }
        let stream = body.stream.unwrap_or(false);
        let messages = body
            .messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| ChatMessage::parse(i, m))
            .collect::<Result<Vec<_>, _>>()?;
        let n = body.n.unwrap_or(1);
        if n == 0 || n > MAX_N {
            return Err(RequestError::Invalid(format!(
                "'n' must be between 1 and {MAX_N}"
            )));
        }
        let tools = match &body.tools {
            Some(raw) => DeclaredTools::from_raw(raw)?,
            None => None,
        };
        let tool_choice = parse_tool_choice(body.tool_choice.as_ref())?;
        let response_format = ResponseFormat::parse(body.response_format.as_ref())?;
        let logprobs = body.logprobs.unwrap_or(false);
        if body.top_logprobs.is_some_and(|k| k > MAX_TOP_LOGPROBS) {
            return Err(RequestError::Invalid(format!(
                "'top_logprobs' must be at most {MAX_TOP_LOGPROBS}"
            )));
        }
        let stop = StopField::list(body.stop);
        let request = Self {
            messages,
            tools,
            tool_choice,
            response_format,
            template_kwargs: body.chat_template_kwargs.unwrap_or_default(),
            add_generation_prompt: body.add_generation_prompt.unwrap_or(true),
            params: SamplingParams {
                max_tokens: body
                    .max_completion_tokens
                    .or(body.max_tokens)
                    .or(default_max_tokens),
                temperature: body.temperature,
                top_p: body.top_p,
                top_k: body.top_k,
                min_p: body.min_p,
                seed: body.seed,
                stop,
                top_logprobs: logprobs.then(|| body.top_logprobs.unwrap_or(0)),
                // Set per turn: a forced call's grammar depends on the session's format.
                constraint: None,
            },
            n,
            logprobs,
            stream,
            include_usage: body.stream_options.unwrap_or_default().include_usage,
            parallel_tool_calls: body.parallel_tool_calls.unwrap_or(true),
            heal_tool_calls: body.auto_heal_tool_calls.unwrap_or(true),
            // Opting out of healing turns the nudge off too.
            nudge_tool_calls: body.nudge_tool_calls.unwrap_or(false)
                && body.auto_heal_tool_calls != Some(false),
            return_token_ids: body.return_token_ids.unwrap_or(false),
            call_id_prefix: "call_",
            api: Api::ChatCompletions,
            tools_left_out: Vec::new(),
            key: None,
        };
        request.check()?;
        Ok(request)
    }

    /// Refuses a request no backend could serve as asked, whichever API it came in by: its
    /// sampling parameters out of range, or a `tool_choice` that forces a call to a tool it
    /// does not declare.
    pub fn check(&self) -> Result<(), RequestError> {
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
        crate::tools::Promoter::new(
            self.tools.as_ref(),
            &self.callable_tools(),
            self.heal_tool_calls,
        )
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

fn parse_tool_choice(choice: Option<&Value>) -> Result<ToolChoice, RequestError> {
    Ok(match choice {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(RequestError::Invalid(format!(
                    "'tool_choice' must be none, auto, required or a function, not '{other}'"
                )));
            }
        },
        Some(object) => match object.pointer("/function/name").and_then(Value::as_str) {
            Some(name) => ToolChoice::Function(name.to_string()),
            None => {
                return Err(RequestError::Invalid(
                    "'tool_choice' object must name a function".into(),
                ));
            }
        },
    })
}
