//! The body of `POST /{uuid}/v1/chat/completions` (and its `/render`) as OpenAI documents it,
//! validated into the turn it asks for and the options of the reply it wants.

use crate::chat::wire::WireMessage;
use crate::chat::{CallRules, ChatMessage, ChatRequest, RequestError, ResponseFormat, ToolChoice};
use crate::generation::{MAX_TOP_LOGPROBS, SamplingParams};
use crate::http::ApiError;
use crate::http::body::parse_json;
use crate::session::Api;
use crate::session::Session;
use crate::tools::DeclaredTools;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::sync::Arc;

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
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// How the client wants its reply written; the turn itself never sees these.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReplyOptions {
    /// Each sampled token's logprob (`logprobs`).
    pub logprobs: bool,
    /// Server-sent events, token by token (`stream`).
    pub stream: bool,
    /// With `stream`: a last chunk with the usage (`stream_options.include_usage`).
    pub include_usage: bool,
    /// The prompt's ids as `prompt_token_ids` (`return_token_ids`, vLLM's extra).
    pub return_token_ids: bool,
}

/// A chat body, validated: the turn it asks for and how to write its reply.
#[derive(Debug, Clone)]
pub struct ChatCall {
    /// The turn.
    pub turn: ChatRequest,
    /// How its reply is written.
    pub reply: ReplyOptions,
}

/// Reads a chat body sent to `session`. A body that resends the conversation the session was
/// last sent is parsed only from its first new message on; the messages before are shared
/// with the last body's (`chat::resent`). Either way the session keeps this body's
/// conversation for the next.
pub fn read_chat(
    session: &Session,
    body: &[u8],
    default_max_tokens: Option<u32>,
) -> Result<ChatCall, ApiError> {
    session.read_resending(body, "messages", |bytes, known| {
        let call = parse_json::<ChatCompletionBody>(bytes)?;
        let call = call.validate_after(known, default_max_tokens)?;
        let messages = call.turn.messages.clone();
        Ok::<_, ApiError>((call, messages))
    })
}

impl ChatCompletionBody {
    /// Validates the body. `default_max_tokens` applies when the client sets no limit.
    pub fn validate(self, default_max_tokens: Option<u32>) -> Result<ChatCall, RequestError> {
        self.validate_after(&[], default_max_tokens)
    }

    /// Validates the body, whose messages follow `known` ones.
    fn validate_after(
        self,
        known: &[Arc<ChatMessage>],
        default_max_tokens: Option<u32>,
    ) -> Result<ChatCall, RequestError> {
        if self.messages.is_empty() {
            return Err(RequestError::EmptyMessages);
        }
        let mut messages = Vec::with_capacity(known.len() + self.messages.len());
        messages.extend_from_slice(known);
        for (i, message) in self.messages.into_iter().enumerate() {
            messages.push(Arc::new(ChatMessage::parse(known.len() + i, message)?));
        }
        let tools = match &self.tools {
            Some(raw) => DeclaredTools::from_raw(raw)?,
            None => None,
        };
        let logprobs = self.logprobs.unwrap_or(false);
        if self.top_logprobs.is_some_and(|k| k > MAX_TOP_LOGPROBS) {
            return Err(RequestError::Invalid(format!(
                "'top_logprobs' must be at most {MAX_TOP_LOGPROBS}"
            )));
        }
        let turn = ChatRequest {
            api: Api::ChatCompletions,
            messages,
            tools,
            tools_left_out: Vec::new(),
            tool_choice: tool_choice(self.tool_choice.as_ref())?,
            calls: CallRules {
                parallel: self.parallel_tool_calls.unwrap_or(true),
                heal: self.auto_heal_tool_calls.unwrap_or(true),
                // Opting out of healing turns the nudge off too.
                nudge: self.nudge_tool_calls.unwrap_or(false)
                    && self.auto_heal_tool_calls != Some(false),
            },
            response_format: response_format(self.response_format.as_ref())?,
            template_kwargs: self.chat_template_kwargs.unwrap_or_default(),
            add_generation_prompt: self.add_generation_prompt.unwrap_or(true),
            params: SamplingParams {
                max_tokens: self
                    .max_completion_tokens
                    .or(self.max_tokens)
                    .or(default_max_tokens),
                temperature: self.temperature,
                top_p: self.top_p,
                top_k: self.top_k,
                min_p: self.min_p,
                seed: self.seed,
                stop: StopField::list(self.stop),
                top_logprobs: logprobs.then(|| self.top_logprobs.unwrap_or(0)),
                // Set per turn: a forced call's grammar depends on the session's format.
                constraint: None,
            },
            n: self.n.unwrap_or(1),
            key: None,
        };
        turn.check()?;
        let reply = ReplyOptions {
            logprobs,
            stream: self.stream.unwrap_or(false),
            include_usage: self.stream_options.unwrap_or_default().include_usage,
            return_token_ids: self.return_token_ids.unwrap_or(false),
        };
        Ok(ChatCall { turn, reply })
    }
}

/// Reads OpenAI's `response_format` (`{"type": "json_schema", "json_schema": {"schema"}}`),
/// which text completions take too.
pub fn response_format(value: Option<&Value>) -> Result<ResponseFormat, RequestError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(ResponseFormat::Text);
    };
    match value.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject),
        Some("json_schema") => match value.pointer("/json_schema/schema") {
            Some(schema) if schema.is_object() => Ok(ResponseFormat::JsonSchema(schema.clone())),
            _ => Err(RequestError::Invalid(
                "'response_format.json_schema.schema' must be a JSON schema object".into(),
            )),
        },
        _ => Err(RequestError::Invalid(
            "'response_format.type' must be 'text', 'json_object' or 'json_schema'".into(),
        )),
    }
}

fn tool_choice(choice: Option<&Value>) -> Result<ToolChoice, RequestError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::resent::KEPT_FROM_BYTES;
    use crate::chat::resent::testing::{check_turn, extras};
    use serde_json::json;

    /// What a body reads as on `session`: the turn and reply options, or the error.
    fn outcome(session: &Session, body: &[u8]) -> String {
        match read_chat(session, body, Some(16)) {
            Ok(call) => format!("{:?} {:?}", call.turn, call.reply),
            Err(error) => format!("error: {}", error.message),
        }
    }

    #[test]
    fn a_resent_conversation_reads_exactly_as_a_fresh_one() {
        let mut messages = vec![
            // Long enough to be kept.
            json!({"role": "system", "content": format!("be \"brief\" ]}} \\ é {}", "x".repeat(KEPT_FROM_BYTES))}),
            json!({"role": "user", "content": [{"type": "text", "text": "[{"}]}),
        ];
        let body = |messages: &[Value], extra: &str| {
            let messages = serde_json::to_string(messages).unwrap();
            format!(r#"{{"model": "m", "messages": {messages}{extra}}}"#).into_bytes()
        };
        let tools = r#", "tools": [{"type": "function", "function": {"name": "f"}}]"#;
        for turn in 0..24 {
            let before = body(&messages, tools);
            messages.push(
                json!({"role": "assistant", "content": format!("x{turn} \"}}"),
                "tool_calls": [{"id": format!("c{turn}"), "type": "function",
                    "function": {"name": "f", "arguments": "{\"a\": [1]}"}}]}),
            );
            messages
                .push(json!({"role": "tool", "tool_call_id": format!("c{turn}"), "content": "ok"}));
            let after = body(&messages, extras(tools, turn));
            let known = messages.len() - 2;
            let resent = |session: &Session, body: &[u8]| {
                let sent = session.sent::<Arc<ChatMessage>>();
                let resent = sent.as_deref().and_then(|sent| sent.resent_in(body));
                resent.is_some_and(|resent| resent.known().len() == known)
            };
            check_turn((&before, &after), turn as u64, outcome, resent);
        }
    }
}
