//! An Anthropic Messages request read into the turn's [`ChatRequest`].
//!
//! `system` (a string or text blocks) and any `system`-role message become the first system
//! message; a user turn's `tool_result` blocks become tool messages ahead of its text; an
//! assistant turn's `tool_use` blocks become its tool calls and its `thinking` blocks its
//! reasoning, so a reply sent back is matched to the tokens that were sampled for it.

use super::wire::{Block, Content, Turn, Turns};
use crate::chat::{
    CallRules, ChatMessage, ChatRequest, Image, Part, ResponseFormat, Role, ToolCall, ToolChoice,
};
use crate::generation::SamplingParams;
use crate::http::ApiError;
use crate::http::body::parse_json;
use crate::http::error::BadRequest;
use crate::session::Api;
use crate::session::Session;
use crate::tools::{DeclaredTools, ToolDialect};
use base64::Engine;
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
    system: Option<Content>,
    /// A list of messages, read so that a wrong shape gets an error naming the field.
    messages: Turns,
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

/// What one element of `messages` reads as: text for the system prompt (a `system`-role
/// message's), or chat messages.
#[derive(Debug, Default)]
pub struct ReadMessage {
    system: String,
    messages: Vec<Arc<ChatMessage>>,
}

/// Reads a Messages body sent to `session`. `count_only`: `max_tokens` may be left out (token
/// counting). A body that resends the conversation the session was last sent is parsed only
/// from its first new message on (`chat::resent`); either way the session keeps this body's
/// conversation for the next.
pub fn read_messages(
    session: &Session,
    body: &[u8],
    default_max_tokens: Option<u32>,
    count_only: bool,
) -> Result<(ChatRequest, Reply), ApiError> {
    session.read_resending(body, "messages", |bytes, known| {
        let body = parse_json::<MessagesBody>(bytes)?;
        let (request, reply, read) =
            body.into_request_after(known, default_max_tokens, count_only)?;
        Ok::<_, ApiError>(((request, reply), read))
    })
}

/// What a Messages body asks of its reply.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The model asked for (the reply names it).
    pub model: Option<String>,
    /// Reply as server-sent events.
    pub stream: bool,
}

impl MessagesBody {
    /// The turn this body asks for. `count_only`: `max_tokens` may be left out (token counting).
    pub fn into_request(
        self,
        default_max_tokens: Option<u32>,
        count_only: bool,
    ) -> Result<ChatRequest, BadRequest> {
        let (request, _, _) = self.into_request_after(&[], default_max_tokens, count_only)?;
        Ok(request)
    }

    /// The turn this body asks for, its messages following `known` ones; with how to reply
    /// and what each message read as.
    fn into_request_after(
        self,
        known: &[Arc<ReadMessage>],
        default_max_tokens: Option<u32>,
        count_only: bool,
    ) -> Result<(ChatRequest, Reply, Vec<Arc<ReadMessage>>), BadRequest> {
        let max_tokens = match self.max_tokens {
            Some(0) => return Err(invalid("max_tokens: must be at least 1")),
            Some(n) => Some(n),
            None if count_only => default_max_tokens,
            None => return Err(invalid("max_tokens: Field required")),
        };
        let turns = match self.messages {
            Turns::List(turns) if !turns.is_empty() => turns,
            Turns::List(_) => return Err(invalid("messages: at least one message is required")),
            Turns::Other => return Err(invalid("messages: must be a list of messages")),
        };
        if let Some(t) = self.temperature.filter(|t| !(0.0..=1.0).contains(t)) {
            return Err(invalid(format!("temperature: {t} is not in [0, 1]")));
        }
        if let Some(p) = self.top_p.filter(|p| !(0.0..=1.0).contains(p)) {
            return Err(invalid(format!("top_p: {p} is not in [0, 1]")));
        }
        let mut system = match self.system {
            None | Some(Content::Null) => String::new(),
            Some(system) => text_of(system, At::System)?,
        };
        let mut read = Vec::with_capacity(known.len() + turns.len());
        read.extend_from_slice(known);
        for (i, turn) in turns.into_iter().enumerate() {
            read.push(Arc::new(read_message(known.len() + i, turn)?));
        }
        let count = read.iter().map(|r| r.messages.len()).sum::<usize>();
        let mut messages = Vec::with_capacity(1 + count);
        for message in &read {
            if !system.is_empty() && !message.system.is_empty() {
                system.push('\n');
            }
            system.push_str(&message.system);
            messages.extend(message.messages.iter().cloned());
        }
        if !system.is_empty() {
            messages.insert(0, Arc::new(ChatMessage::text(Role::System, system)));
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
        let reply = Reply {
            model: self.model,
            stream: self.stream,
        };
        let request = ChatRequest {
            api: Api::Messages,
            messages,
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
        Ok((request, reply, read))
    }
}

fn invalid(message: impl Into<String>) -> BadRequest {
    BadRequest::new(message)
}

/// Where in the body a value is, written out only when an error names it.
#[derive(Clone, Copy)]
enum At<'a> {
    System,
    Message(usize),
    /// `{parent}.content[{j}]`.
    Block(&'a At<'a>, usize),
    /// `{parent}.content`.
    Content(&'a At<'a>),
}

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            At::System => f.write_str("system"),
            At::Message(i) => write!(f, "messages[{i}]"),
            At::Block(parent, j) => write!(f, "{parent}.content[{j}]"),
            At::Content(parent) => write!(f, "{parent}.content"),
        }
    }
}

/// What `messages[i]` reads as: a `system`-role message's text goes to the system prompt
/// (templates want it first), others become chat messages.
fn read_message(i: usize, turn: Turn) -> Result<ReadMessage, BadRequest> {
    let mut read = ReadMessage::default();
    let mut out = Vec::new();
    let at = At::Message(i);
    let role = turn
        .role
        .ok_or_else(|| invalid(format!("{at}.role: Field required")))?;
    let content = turn
        .content
        .ok_or_else(|| invalid(format!("{at}.content: Field required")))?;
    match role.as_str() {
        "system" => read.system = text_of(content, at)?,
        "user" => read_user(at, content, &mut out)?,
        "assistant" => out.push(read_assistant(at, content)?),
        other => {
            return Err(invalid(format!(
                "{at}.role: '{other}' is not one of 'user', 'assistant'"
            )));
        }
    }
    read.messages = out.into_iter().map(Arc::new).collect();
    Ok(read)
}

/// The content blocks of a message, each with its type (a string is one text block).
fn blocks(at: At, content: Content) -> Result<Vec<(String, Block)>, BadRequest> {
    match content {
        Content::Text(text) => {
            let block = Block {
                text: Some(text),
                ..Block::default()
            };
            Ok(vec![("text".to_string(), block)])
        }
        Content::Blocks(blocks) => blocks
            .into_iter()
            .enumerate()
            .map(|(j, mut block)| {
                let kind = block.kind.take().ok_or_else(|| {
                    invalid(format!("{}.type: Field required", At::Block(&at, j)))
                })?;
                Ok((kind, block))
            })
            .collect(),
        Content::Null | Content::Other => Err(invalid(format!(
            "{}: must be a string or a list of content blocks",
            At::Content(&at)
        ))),
    }
}

/// A text block's `text`.
fn block_text(at: At, block: Block) -> Result<String, BadRequest> {
    block
        .text
        .ok_or_else(|| invalid(format!("{at}: a text block needs a string 'text'")))
}

/// An `image` block's image: its `source` is base64 data (`media_type` must be the format
/// the data holds, as Anthropic requires) or a URL (fetched before the turn renders).
fn image_of(at: At, block: &Block) -> Result<Part, BadRequest> {
    let source = block.source.as_ref();
    let field = |name: &str| source.and_then(|s| s.get(name)).and_then(Value::as_str);
    let image = match field("type") {
        Some("base64") => {
            let data = field("data")
                .ok_or_else(|| invalid(format!("{at}.source.data: Field required")))?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|e| invalid(format!("{at}.source.data: invalid base64: {e}")))?;
            let image = Image::read(bytes).map_err(|e| invalid(format!("{at}: {e}")))?;
            let declared = field("media_type");
            if declared != Some(image.facts.media_type) {
                return Err(invalid(format!(
                    "{at}.source.media_type: the image is {}, not {}",
                    image.facts.media_type,
                    declared.unwrap_or("(none)")
                )));
            }
            Part::Image(image)
        }
        Some("url") => {
            let url =
                field("url").ok_or_else(|| invalid(format!("{at}.source.url: Field required")))?;
            Part::image_url(url).map_err(|e| invalid(format!("{at}.source: {e}")))?
        }
        _ => {
            return Err(invalid(format!(
                "{at}.source.type: must be 'base64' or 'url'"
            )));
        }
    };
    Ok(image)
}

/// A text or an image block as a content part; another kind is refused.
fn part(at: At, kind: &str, block: Block) -> Result<Part, BadRequest> {
    match kind {
        "text" => Ok(Part::Text(block_text(at, block)?)),
        "image" => image_of(at, &block),
        other => Err(unsupported(at, other)),
    }
}

/// The text and images of a string or of a list of text and image blocks, in order.
fn parts_of(content: Content, at: At) -> Result<Vec<Part>, BadRequest> {
    let blocks = blocks(at, content)?.into_iter().enumerate();
    (blocks.map(|(j, (kind, block))| part(At::Block(&at, j), &kind, block))).collect()
}

/// The text of a string or of a list of text blocks, joined by newlines.
fn text_of(content: Content, at: At) -> Result<String, BadRequest> {
    let mut texts = Vec::new();
    for (j, (kind, block)) in blocks(at, content)?.into_iter().enumerate() {
        match kind.as_str() {
            "text" => texts.push(block_text(at, block)?),
            other => return Err(unsupported(At::Block(&at, j), other)),
        }
    }
    Ok(texts.join("\n"))
}

fn unsupported(at: At, kind: &str) -> BadRequest {
    match kind {
        "image" => invalid(format!("{at}: image blocks are not taken here")),
        "document" => invalid(format!(
            "{at}: document blocks are not supported: send their text or their pages as images"
        )),
        other => invalid(format!("{at}: block type '{other}' is not supported here")),
    }
}

/// A user turn: its `tool_result` blocks as tool messages, then its text and images as a
/// user message.
fn read_user(at: At, content: Content, out: &mut Vec<ChatMessage>) -> Result<(), BadRequest> {
    let mut parts = Vec::new();
    for (j, (kind, block)) in blocks(at, content)?.into_iter().enumerate() {
        let at = At::Block(&at, j);
        match kind.as_str() {
            "tool_result" => out.push(tool_result(at, block)?),
            kind => parts.push(part(at, kind, block)?),
        }
    }
    if !parts.is_empty() {
        out.push(ChatMessage::with_parts(Role::User, parts));
    }
    Ok(())
}

/// A `tool_result` block as the template's tool message.
fn tool_result(at: At, block: Block) -> Result<ChatMessage, BadRequest> {
    let id = block
        .tool_use_id
        .ok_or_else(|| invalid(format!("{at}.tool_use_id: Field required")))?;
    let parts = match block.content {
        None | Some(Content::Null) => Vec::new(),
        Some(content) => parts_of(content, At::Content(&at))?,
    };
    let mut result = ChatMessage::with_parts(Role::Tool, parts);
    result.extra.insert("tool_call_id".into(), id.into());
    if block.is_error == Some(true) {
        result.extra.insert("is_error".into(), true.into());
    }
    Ok(result)
}

/// An assistant turn: its text, its `tool_use` blocks as calls, its `thinking` as reasoning.
fn read_assistant(at: At, content: Content) -> Result<ChatMessage, BadRequest> {
    let mut texts = Vec::new();
    let mut thinking = Vec::new();
    let mut calls = Vec::new();
    for (j, (kind, block)) in blocks(at, content)?.into_iter().enumerate() {
        let at = At::Block(&at, j);
        match kind.as_str() {
            "text" => texts.push(block_text(at, block)?),
            "thinking" => thinking.extend(block.thinking),
            // Encrypted reasoning of another model: nothing this model could read.
            "redacted_thinking" => {}
            "tool_use" => {
                let required = |name: &str| invalid(format!("{at}.{name}: Field required"));
                let id = block.id.ok_or_else(|| required("id"))?;
                let name = block.name.ok_or_else(|| required("name"))?;
                let name = name.ok_or_else(|| invalid(format!("{at}.name: must be a string")))?;
                let arguments = block.input.ok_or_else(|| required("input"))?;
                calls.push(ToolCall {
                    id: id.unwrap_or_default(),
                    name,
                    arguments,
                });
            }
            other => return Err(unsupported(at, other)),
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
    use crate::chat::resent::KEPT_FROM_BYTES;
    use crate::chat::resent::testing::{check_turn, extras};
    use serde_json::json;

    #[test]
    fn a_resent_conversation_reads_exactly_as_a_fresh_one() {
        let outcome =
            |session: &Session, body: &[u8]| match read_messages(session, body, None, false) {
                Ok((request, reply)) => format!("{request:?} {reply:?}"),
                Err(error) => format!("error: {}", error.message),
            };
        let mut messages = vec![json!({"role": "user", "content": "fix \"it\" ]}"})];
        let body = |messages: &[Value], extra: &str| {
            let messages = serde_json::to_string(messages).unwrap();
            // A system prompt long enough for the body to be kept.
            let system = "S".repeat(KEPT_FROM_BYTES);
            format!(r#"{{"model": "m", "max_tokens": 64, "system": "{system}", "messages": {messages}{extra}}}"#)
                .into_bytes()
        };
        let tools = r#", "tools": [{"name": "f", "input_schema": {"type": "object"}}]"#;
        for turn in 0..24 {
            let before = body(&messages, tools);
            messages.push(json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": ""},
                {"type": "text", "text": format!("x{turn}")},
                {"type": "tool_use", "id": format!("toolu_{turn}"), "name": "f", "input": {"a": [1]}}]}));
            let result = json!({"type": "tool_result", "tool_use_id": format!("toolu_{turn}"), "content": "ok"});
            messages.push(json!({"role": "user", "content": [result]}));
            if turn % 5 == 0 {
                messages.push(json!({"role": "system", "content": format!("note {turn}")}));
            }
            let after = body(&messages, extras(tools, turn));
            let resent = |session: &Session, body: &[u8]| {
                let sent = session.sent::<Arc<ReadMessage>>();
                sent.is_some_and(|sent| sent.resent_in(body).is_some())
            };
            check_turn((&before, &after), turn as u64, outcome, resent);
        }
    }

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
                    {"type": "image", "source": {"type": "url", "url": "ftp://x"}}]}]}),
                "messages[0].content[1].source: an image URL must be a data: URL",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                        "data": crate::chat::images::tests::png_base64(4, 4)}}]}]}),
                "messages[0].content[0].source.media_type: the image is image/png, not image/jpeg",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGVsbG8="}}]}]}),
                "messages[0].content[0]: the image cannot be decoded",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": [
                    {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}),
                "messages[0].content[0].source.type: must be 'base64' or 'url'",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "maybe"}}),
                "tool_choice.type",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "robot", "content": "hi"}]}),
                "messages[0].role",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": 5, "content": "hi"}]}),
                "messages[0].role: Field required",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": null}]}),
                "messages[0].content: must be a string or a list of content blocks",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": ["bare"]}]}),
                "messages[0].content[0].type: Field required",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t", "name": 5, "input": {}}]}]}),
                "messages[0].content[0].name: must be a string",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t", "name": "f"}]}]}),
                "messages[0].content[0].input: Field required",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document"}]}]}]}),
                "messages[0].content[0].content.content[0]: document blocks are not supported",
            ),
            (
                json!({"max_tokens": 5, "system": 5, "messages": [{"role": "user", "content": "hi"}]}),
                "system.content: must be a string or a list of content blocks",
            ),
        ];
        for (body, expected) in cases {
            let error = read(body).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
    }
}
