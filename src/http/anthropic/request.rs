//! An Anthropic Messages request read into the turn's [`ChatRequest`].
//!
//! `system` (a string or text blocks) and any `system`-role message become the first system
//! message; a user turn's `tool_result` blocks become tool messages ahead of its text; an
//! assistant turn's `tool_use` blocks become its tool calls and its `thinking` blocks its
//! reasoning, so a reply sent back is matched to the tokens that were sampled for it.

use crate::chat::{
    CallRules, ChatMessage, ChatRequest, ResponseFormat, Role, ToolCall, ToolChoice,
};
use crate::generation::SamplingParams;
use crate::http::error::BadRequest;
use crate::session::Api;
use crate::tools::{DeclaredTools, ToolDialect};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::sync::Arc;

/// The body of `POST /v1/messages` (and `count_tokens`), as sent. Unknown fields are ignored:
/// clients add fields every month.
#[derive(Debug, Deserialize)]
pub struct MessagesBody {
    /// The model asked for; the session serves its own whatever the name.
    #[serde(default)]
    pub model: Option<String>,
    max_tokens: Option<u32>,
    #[serde(default)]
    system: Option<Value>,
    /// A list of messages; read by hand so a wrong shape gets an error naming the field.
    messages: Value,
    /// Kept as text: each distinct list is read once.
    tools: Option<Box<RawValue>>,
    tool_choice: Option<Value>,
    stop_sequences: Option<Vec<String>>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    thinking: Option<Value>,
    /// Reply as server-sent events.
    #[serde(default)]
    pub stream: bool,
}

/// The fields [`MessagesBody`] reads, and those it knowingly ignores; any other is logged.
pub const KNOWN_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "system",
    "messages",
    "tools",
    "tool_choice",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "thinking",
    "stream",
    "metadata",
    "service_tier",
    "output_config",
    "context_management",
    "container",
    "mcp_servers",
];

impl MessagesBody {
    /// The turn this body asks for. `count_only`: `max_tokens` may be left out (token counting).
    pub fn into_request(
        self,
        default_max_tokens: Option<u32>,
        count_only: bool,
    ) -> Result<ChatRequest, BadRequest> {
        let max_tokens = match self.max_tokens {
            Some(0) => return Err(invalid("max_tokens: must be at least 1")),
            Some(n) => Some(n),
            None if count_only => default_max_tokens,
            None => return Err(invalid("max_tokens: Field required")),
        };
        let turns = match &self.messages {
            Value::Array(turns) if !turns.is_empty() => turns,
            Value::Array(_) => return Err(invalid("messages: at least one message is required")),
            _ => return Err(invalid("messages: must be a list of messages")),
        };
        if let Some(t) = self.temperature.filter(|t| !(0.0..=1.0).contains(t)) {
            return Err(invalid(format!("temperature: {t} is not in [0, 1]")));
        }
        if let Some(p) = self.top_p.filter(|p| !(0.0..=1.0).contains(p)) {
            return Err(invalid(format!("top_p: {p} is not in [0, 1]")));
        }
        let mut system = match &self.system {
            None | Some(Value::Null) => String::new(),
            Some(system) => text_of(system, "system")?,
        };
        let mut messages = Vec::with_capacity(turns.len() + 1);
        for (i, message) in turns.iter().enumerate() {
            read_message(i, message, &mut system, &mut messages)?;
        }
        if !system.is_empty() {
            messages.insert(0, ChatMessage::text(Role::System, system));
        }
        let params = SamplingParams {
            max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stop: self.stop_sequences.unwrap_or_default(),
            ..SamplingParams::default()
        };
        let tools = match &self.tools {
            Some(raw) => DeclaredTools::from_raw_in(raw, ToolDialect::Anthropic)
                .map_err(|e| invalid(format!("tools: {e}")))?,
            None => None,
        };
        let (tool_choice, parallel) = match &self.tool_choice {
            Some(choice) => tool_choice(choice)?,
            None => (ToolChoice::Auto, true),
        };
        let mut template_kwargs = Map::new();
        if let Some(enabled) = self.thinking.as_ref().map(thinking_enabled).transpose()? {
            template_kwargs.insert("enable_thinking".into(), enabled.into());
        }
        let request = ChatRequest {
            api: Api::Messages,
            messages: messages.into_iter().map(Arc::new).collect(),
            tools,
            tools_left_out: Vec::new(),
            tool_choice,
            calls: CallRules {
                parallel,
                ..CallRules::default()
            },
            response_format: ResponseFormat::Text,
            template_kwargs,
            add_generation_prompt: true,
            params,
            n: 1,
            key: None,
        };
        request.check().map_err(|e| invalid(e.to_string()))?;
        Ok(request)
    }
}

fn invalid(message: impl Into<String>) -> BadRequest {
    BadRequest::new(message)
}

/// Appends the chat messages of `messages[i]`; a `system`-role message's text is added to
/// `system` (templates want the system prompt first).
fn read_message(
    i: usize,
    raw: &Value,
    system: &mut String,
    out: &mut Vec<ChatMessage>,
) -> Result<(), BadRequest> {
    let at = format!("messages[{i}]");
    let role = raw
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("{at}.role: Field required")))?;
    let content = raw
        .get("content")
        .ok_or_else(|| invalid(format!("{at}.content: Field required")))?;
    match role {
        "system" => {
            let text = text_of(content, &at)?;
            if !system.is_empty() && !text.is_empty() {
                system.push('\n');
            }
            system.push_str(&text);
        }
        "user" => read_user(&at, content, out)?,
        "assistant" => out.push(read_assistant(&at, content)?),
        other => {
            return Err(invalid(format!(
                "{at}.role: '{other}' is not one of 'user', 'assistant'"
            )));
        }
    }
    Ok(())
}

/// The content blocks of a message (a string is one text block).
fn blocks<'v>(at: &str, content: &'v Value) -> Result<Vec<(&'v str, &'v Value)>, BadRequest> {
    match content {
        Value::String(_) => Ok(vec![("text", content)]),
        Value::Array(blocks) => blocks
            .iter()
            .enumerate()
            .map(|(j, block)| {
                let kind = block
                    .get("type")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(format!("{at}.content[{j}].type: Field required")))?;
                Ok((kind, block))
            })
            .collect(),
        _ => Err(invalid(format!(
            "{at}.content: must be a string or a list of content blocks"
        ))),
    }
}

/// A block's `text` (a bare string is its own text).
fn block_text<'v>(at: &str, block: &'v Value) -> Result<&'v str, BadRequest> {
    match block {
        Value::String(text) => Ok(text),
        _ => block
            .get("text")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("{at}: a text block needs a string 'text'"))),
    }
}

/// The text of a string or of a list of text blocks, joined by newlines.
fn text_of(content: &Value, at: &str) -> Result<String, BadRequest> {
    let mut texts = Vec::new();
    for (j, (kind, block)) in blocks(at, content)?.into_iter().enumerate() {
        match kind {
            "text" => texts.push(block_text(at, block)?),
            other => return Err(unsupported(&format!("{at}.content[{j}]"), other)),
        }
    }
    Ok(texts.join("\n"))
}

fn unsupported(at: &str, kind: &str) -> BadRequest {
    match kind {
        "image" | "document" => invalid(format!(
            "{at}: {kind} blocks are not supported: this proxy serves text-only models"
        )),
        other => invalid(format!("{at}: block type '{other}' is not supported here")),
    }
}

/// A user turn: its `tool_result` blocks as tool messages, then its text as a user message.
fn read_user(at: &str, content: &Value, out: &mut Vec<ChatMessage>) -> Result<(), BadRequest> {
    let mut texts = Vec::new();
    for (j, (kind, block)) in blocks(at, content)?.into_iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        match kind {
            "text" => texts.push(block_text(&at, block)?),
            "tool_result" => out.push(tool_result(&at, block)?),
            other => return Err(unsupported(&at, other)),
        }
    }
    if !texts.is_empty() {
        out.push(ChatMessage::text(Role::User, texts.join("\n")));
    }
    Ok(())
}

/// A `tool_result` block as the template's tool message.
fn tool_result(at: &str, block: &Value) -> Result<ChatMessage, BadRequest> {
    let id = block
        .get("tool_use_id")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("{at}.tool_use_id: Field required")))?;
    let content = match block.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(content) => text_of(content, &format!("{at}.content"))?,
    };
    let mut result = ChatMessage::text(Role::Tool, content);
    result.extra.insert("tool_call_id".into(), id.into());
    if block.get("is_error").and_then(Value::as_bool) == Some(true) {
        result.extra.insert("is_error".into(), true.into());
    }
    Ok(result)
}

/// An assistant turn: its text, its `tool_use` blocks as calls, its `thinking` as reasoning.
fn read_assistant(at: &str, content: &Value) -> Result<ChatMessage, BadRequest> {
    let mut texts = Vec::new();
    let mut thinking = Vec::new();
    let mut calls = Vec::new();
    for (j, (kind, block)) in blocks(at, content)?.into_iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        match kind {
            "text" => texts.push(block_text(&at, block)?),
            "thinking" => {
                if let Some(text) = block.get("thinking").and_then(Value::as_str) {
                    thinking.push(text);
                }
            }
            // Encrypted reasoning of another model: nothing this model could read.
            "redacted_thinking" => {}
            "tool_use" => {
                let field = |name: &str| {
                    block
                        .get(name)
                        .ok_or_else(|| invalid(format!("{at}.{name}: Field required")))
                };
                calls.push(ToolCall {
                    id: field("id")?.as_str().unwrap_or_default().to_string(),
                    name: field("name")?
                        .as_str()
                        .ok_or_else(|| invalid(format!("{at}.name: must be a string")))?
                        .to_string(),
                    arguments: field("input")?.clone(),
                });
            }
            other => return Err(unsupported(&at, other)),
        }
    }
    let mut reply = ChatMessage::text(Role::Assistant, texts.join("\n"));
    reply.tool_calls = calls;
    if !thinking.is_empty() {
        reply
            .extra
            .insert("reasoning_content".into(), thinking.join("\n").into());
    }
    Ok(reply)
}

/// `tool_choice`, and whether more than one call is allowed.
fn tool_choice(choice: &Value) -> Result<(ToolChoice, bool), BadRequest> {
    let parallel = choice
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        != Some(true);
    let kind = choice.get("type").and_then(Value::as_str);
    let choice = match kind {
        Some("auto") => ToolChoice::Auto,
        Some("any") => ToolChoice::Required,
        Some("none") => ToolChoice::None,
        Some("tool") => match choice.get("name").and_then(Value::as_str) {
            Some(name) => ToolChoice::Function(name.to_string()),
            None => return Err(invalid("tool_choice.name: Field required")),
        },
        _ => {
            return Err(invalid(
                "tool_choice.type: must be one of 'auto', 'any', 'tool', 'none'",
            ));
        }
    };
    Ok((choice, parallel))
}

/// `thinking`: whether the template's thinking switch is on.
fn thinking_enabled(thinking: &Value) -> Result<bool, BadRequest> {
    match thinking.get("type").and_then(Value::as_str) {
        Some("enabled" | "adaptive") => Ok(true),
        Some("disabled") => Ok(false),
        _ => Err(invalid(
            "thinking.type: must be one of 'enabled', 'adaptive', 'disabled'",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(body: Value) -> Result<ChatRequest, BadRequest> {
        serde_json::from_value::<MessagesBody>(body)
            .unwrap()
            .into_request(None, false)
    }

    #[test]
    fn a_claude_code_turn_becomes_the_templates_conversation() {
        let request = read(json!({
            "model": "claude-opus-5-5", "max_tokens": 128000,
            "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "read a.txt"}]},
                {"role": "system", "content": "<reminder>"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "I should read it.", "signature": ""},
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "toolu_0", "name": "Read", "input": {"path": "a.txt"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_0", "content": [{"type": "text", "text": "hello"}]},
                    {"type": "text", "text": "thanks"}]}],
            "tools": [{"name": "Read", "input_schema": {"type": "object",
                "properties": {"path": {"type": "string"}}}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "thinking": {"type": "adaptive", "display": "omitted"},
            "context_management": {"edits": []}, "metadata": {"user_id": "u"}
        }))
        .unwrap();
        let roles: Vec<_> = request.messages.iter().map(|m| m.role_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(
            request.messages[0].content.as_deref(),
            Some("You are Claude Code.\n<reminder>")
        );
        let assistant = &request.messages[2];
        assert_eq!(assistant.content.as_deref(), Some("Reading."));
        assert_eq!(assistant.extra["reasoning_content"], "I should read it.");
        assert_eq!(assistant.tool_calls[0].arguments, json!({"path": "a.txt"}));
        assert_eq!(request.messages[3].extra["tool_call_id"], "toolu_0");
        assert_eq!(request.messages[3].content.as_deref(), Some("hello"));
        assert_eq!(request.tool_choice, ToolChoice::Required);
        assert!(!request.calls.parallel);
        assert_eq!(request.template_kwargs["enable_thinking"], true);
        assert_eq!(request.params.max_tokens, Some(128000));
        assert_eq!(request.api.call_id_prefix(), "toolu_");
    }

    #[test]
    fn what_cannot_be_served_is_named() {
        let cases = [
            (
                json!({"messages": [{"role": "user", "content": "hi"}]}),
                "max_tokens: Field required",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image", "source": {"type": "url", "url": "http://x"}}]}]}),
                "messages[0].content[1]: image blocks are not supported",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "maybe"}}),
                "tool_choice.type",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "robot", "content": "hi"}]}),
                "messages[0].role",
            ),
        ];
        for (body, expected) in cases {
            let error = read(body).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
    }
}
