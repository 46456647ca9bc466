//! OpenAI chat messages: validation, and the shape a chat template receives.
//!
//! OpenAI clients send `content: null` on assistant turns that only call tools, content as
//! a list of text parts, and tool-call arguments as JSON strings. Templates expect what
//! transformers hands them, so messages are normalised here before rendering (the template
//! engine itself stays faithful to transformers).

use super::images::{Image, ImageLink, Part};
use super::wire::WireMessage;
use crate::template::{TemplateValue, json_value, template_map};
use serde_json::{Map, Value};
use std::hash::Hasher;
use std::sync::{Arc, OnceLock};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `system`.
    System,
    /// `developer` (OpenAI's newer name for system instructions).
    Developer,
    /// `user`.
    User,
    /// `assistant`: the model's turns.
    Assistant,
    /// `tool`: a tool's result.
    Tool,
}

impl Role {
    fn parse(role: &str) -> Option<Self> {
        Some(match role {
            "system" => Self::System,
            "developer" => Self::Developer,
            "user" => Self::User,
            "assistant" => Self::Assistant,
            "tool" => Self::Tool,
            _ => return None,
        })
    }
}

/// A tool call inside an assistant message.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The id the call is answered by (empty when the client sent none).
    pub id: String,
    /// The function called.
    pub name: String,
    /// Arguments as sent: a JSON string (OpenAI) or an object.
    pub arguments: Value,
}

impl ToolCall {
    /// The arguments as a JSON value (a string that holds JSON is parsed).
    pub fn arguments_value(&self) -> Value {
        match &self.arguments {
            Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| self.arguments.clone()),
            other => other.clone(),
        }
    }
}

/// One validated message.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// Text content; `None` when the client sent `null` or left it out.
    pub content: Option<String>,
    /// The calls of an assistant message.
    pub tool_calls: Vec<ToolCall>,
    /// Every other field, passed to the template untouched (`name`, `tool_call_id`, ...).
    pub extra: Map<String, Value>,
    /// The content in order, when it holds an image (empty otherwise: `content` is all of
    /// it). `content` is then its text parts joined.
    pub parts: Vec<Part>,
    derived: Derived,
}

/// What turns derive from a message, each computed once: a message is not changed once a
/// turn reads it, and a session's next request shares the messages it sends again
/// ([`super::resent`]), so a long conversation's old messages are not read again.
#[derive(Default)]
struct Derived {
    digest: OnceLock<u64>,
    fingerprint: OnceLock<u64>,
    call_hashes: OnceLock<Vec<u64>>,
}

impl Clone for Derived {
    /// Nothing: a clone may be changed.
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for Derived {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for Derived {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("..")
    }
}

/// A message the client sent that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("messages[{index}]: {reason}")]
pub struct MessageError {
    /// Position of the message in `messages`.
    pub index: usize,
    /// What is wrong with it.
    pub reason: String,
}

impl ChatMessage {
    /// A message of `role` with only text (other APIs' adapters build the conversation so).
    pub fn text(role: Role, content: String) -> Self {
        Self {
            role,
            content: Some(content),
            tool_calls: Vec::new(),
            extra: Map::new(),
            parts: Vec::new(),
            derived: Derived::default(),
        }
    }

    /// A message of `role` with text and images in order (other APIs' adapters build the
    /// conversation so): its content is the text parts joined by newlines.
    pub fn with_parts(role: Role, parts: Vec<Part>) -> Self {
        let (content, parts) = join_text_parts(parts);
        Self {
            content,
            parts,
            ..Self::text(role, String::new())
        }
    }

    /// The images the message holds, in order; an image named by URL once it is fetched (a
    /// turn fetches them all before it renders, and refuses a conversation with one left).
    pub fn images(&self) -> impl Iterator<Item = &Arc<Image>> {
        self.parts.iter().filter_map(|part| match part {
            Part::Image(image) => Some(image),
            Part::Link(link) => link.image(),
            Part::Text(_) => None,
        })
    }

    /// The images the message names by URL.
    pub fn links(&self) -> impl Iterator<Item = &Arc<ImageLink>> {
        self.parts.iter().filter_map(|part| match part {
            Part::Link(link) => Some(link),
            Part::Image(_) | Part::Text(_) => None,
        })
    }

    /// Validates one message as sent, taking its strings rather than copying them.
    pub fn parse(index: usize, raw: impl Into<WireMessage>) -> Result<Self, MessageError> {
        let fail = |reason: String| MessageError { index, reason };
        let raw: WireMessage = raw.into();
        if !raw.is_object {
            return Err(fail("a message must be an object".into()));
        }
        let role_text = raw
            .role
            .as_ref()
            .and_then(Value::as_str)
            .ok_or_else(|| fail("'role' must be a string".into()))?;
        let role = Role::parse(role_text).ok_or_else(|| {
            fail(format!(
                "unknown role '{role_text}' (expected system, developer, user, assistant or tool)"
            ))
        })?;
        let (content, parts) = match raw.content {
            None | Some(Value::Null) => (None, Vec::new()),
            Some(Value::String(s)) => (Some(s), Vec::new()),
            Some(Value::Array(parts)) => {
                let parts = content_parts(&parts).map_err(fail)?;
                if role == Role::Assistant && parts.iter().any(Part::is_image) {
                    return Err(fail("an assistant message cannot hold images".into()));
                }
                join_text_parts(parts)
            }
            Some(_) => {
                return Err(fail(
                    "'content' must be a string, null or a list of content parts".into(),
                ));
            }
        };
        let tool_calls = match raw.tool_calls {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(calls)) if role == Role::Assistant => calls
                .iter()
                .enumerate()
                .map(|(i, call)| {
                    parse_tool_call(call).map_err(|r| fail(format!("tool_calls[{i}]: {r}")))
                })
                .collect::<Result<_, _>>()?,
            Some(Value::Array(_)) => {
                return Err(fail("only assistant messages carry tool_calls".into()));
            }
            Some(_) => return Err(fail("'tool_calls' must be a list".into())),
        };
        let mut extra = raw.extra;
        extra.retain(|_, v| !v.is_null());
        if extra.get("name").is_some_and(|name| !name.is_string()) {
            return Err(fail("'name' must be a string".into()));
        }
        if role == Role::Tool && !extra.get("tool_call_id").is_some_and(Value::is_string) {
            return Err(fail(
                "a tool message needs 'tool_call_id', the id of the call it answers".into(),
            ));
        }
        Ok(Self {
            role,
            content,
            tool_calls,
            extra,
            parts,
            derived: Derived::default(),
        })
    }

    /// A digest of every field: equal for equal messages. Conversations are digested message
    /// by message from these ([`crate::turn`]'s tail renders compare them).
    pub fn digest(&self) -> u64 {
        *self.derived.digest.get_or_init(|| {
            let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
            let mut field = |bytes: &[u8]| {
                hasher.write_u64(bytes.len() as u64);
                hasher.write(bytes);
            };
            field(self.role_str().as_bytes());
            field(self.content.as_deref().unwrap_or("\u{0}none").as_bytes());
            for call in &self.tool_calls {
                field(call.id.as_bytes());
                field(call.name.as_bytes());
                field(call.arguments.to_string().as_bytes());
            }
            field(&serde_json::to_vec(&self.extra).unwrap_or_default());
            for part in &self.parts {
                match part {
                    Part::Text(text) => field(text.as_bytes()),
                    Part::Image(image) => field(image.facts.sha256.as_bytes()),
                    Part::Link(link) => match link.image() {
                        Some(image) => field(image.facts.sha256.as_bytes()),
                        None => field(link.url.as_bytes()),
                    },
                }
            }
            hasher.finish()
        })
    }

    /// The fingerprint a completion recorded from this message would have
    /// ([`crate::session::message_fingerprint`]: its text without whitespace, its calls' ids).
    pub fn fingerprint(&self) -> u64 {
        *self.derived.fingerprint.get_or_init(|| {
            let content = self.content.as_deref().unwrap_or("");
            let ids = self.tool_calls.iter().map(|c| c.id.as_str());
            crate::session::message_fingerprint(content, ids)
        })
    }

    /// Each call's hash ([`crate::session::completion::tool_call_hash`]: its name and its
    /// arguments parsed), as the calls the session issued are recorded.
    pub fn call_hashes(&self) -> &[u64] {
        self.derived.call_hashes.get_or_init(|| {
            let hash = |call: &ToolCall| {
                crate::session::completion::tool_call_hash(&call.name, &call.arguments_value())
            };
            self.tool_calls.iter().map(hash).collect()
        })
    }

    /// The message as vLLM passes it to a template: null fields dropped, content a string
    /// (empty for `null`; several text parts joined by newlines) or, for a template that
    /// `reads_parts` ([`crate::template::ChatTemplate::reads_content_parts`]) and a message
    /// of several parts, the parts; a message with an image always gives its parts. Tool-call
    /// arguments are parsed to mappings, and a reasoning field is mirrored to both
    /// `reasoning_content` and `thinking`. Built straight into the template engine's values,
    /// so the content is copied once. Not kept: a session keeps its last conversation's
    /// messages, and a second copy of their text would double that.
    pub fn to_template_value(&self, reads_parts: bool) -> TemplateValue {
        let mut fields: Vec<(&str, TemplateValue)> = Vec::with_capacity(3 + self.extra.len());
        fields.push(("role", TemplateValue::from(self.role_str())));
        let as_parts = reads_parts || self.parts.iter().any(Part::is_image);
        let content = match self.parts.is_empty() || !as_parts {
            true => TemplateValue::from(self.content.as_deref().unwrap_or_default()),
            false => parts_value(&self.parts),
        };
        fields.push(("content", content));
        if !self.tool_calls.is_empty() {
            let calls: Vec<Value> = self
                .tool_calls
                .iter()
                .map(|call| {
                    let arguments = match call.arguments_value() {
                        object @ Value::Object(_) => object,
                        _ => call.arguments.clone(),
                    };
                    serde_json::json!({
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": arguments},
                    })
                })
                .collect();
            fields.push(("tool_calls", json_value(&Value::Array(calls))));
        }
        for (key, value) in &self.extra {
            fields.push((key, json_value(value)));
        }
        let reasoning = ["reasoning_content", "thinking", "reasoning"]
            .iter()
            .find_map(|k| self.extra.get(*k));
        if let Some(reasoning) = reasoning {
            let reasoning = json_value(reasoning);
            // A key already there keeps its place (`template_map` treats repeats like a JSON
            // object insert).
            fields.push(("reasoning_content", reasoning.clone()));
            fields.push(("thinking", reasoning));
        }
        template_map(fields)
    }

    /// The role as the template gets it.
    pub fn role_str(&self) -> &'static str {
        match self.role {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A list of content parts, read: text parts, and `image_url` parts (`{"url": ...}` or the
/// URL alone).
fn content_parts(parts: &[Value]) -> Result<Vec<Part>, String> {
    let mut read = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let kind = part.get("type").and_then(Value::as_str);
        read.push(match kind {
            Some("text") => match part.get("text").and_then(Value::as_str) {
                Some(text) => Part::Text(text.to_string()),
                None => return Err(format!("content[{i}]: a text part needs a string 'text'")),
            },
            Some("image_url") => {
                let url = match part.get("image_url") {
                    Some(Value::String(url)) => Some(url.as_str()),
                    Some(object) => object.get("url").and_then(Value::as_str),
                    None => None,
                };
                let url = url.ok_or_else(|| {
                    format!("content[{i}]: an image_url part needs 'image_url.url'")
                })?;
                Part::image_url(url).map_err(|e| format!("content[{i}]: {e}"))?
            }
            Some(kind) => {
                return Err(format!(
                    "content[{i}]: part type '{kind}' is not supported (text and image_url)"
                ));
            }
            None => return Err(format!("content[{i}]: a content part needs a 'type'")),
        });
    }
    Ok(read)
}

/// The text of `parts` joined by newlines, and the parts themselves when there are several
/// or an image is among them (a template that reads parts gets them as sent).
fn join_text_parts(parts: Vec<Part>) -> (Option<String>, Vec<Part>) {
    let texts: Vec<&str> = parts
        .iter()
        .filter_map(|part| match part {
            Part::Text(text) => Some(text.as_str()),
            Part::Image(_) | Part::Link(_) => None,
        })
        .collect();
    let content = texts.join("\n");
    let kept = texts.len() < parts.len() || parts.len() > 1;
    (Some(content), if kept { parts } else { Vec::new() })
}

/// Content parts as vLLM hands them to a template that reads parts: `{"type": "image"}` and
/// `{"type": "text", "text": ...}`.
fn parts_value(parts: &[Part]) -> TemplateValue {
    let items: Vec<TemplateValue> = parts
        .iter()
        .map(|part| match part {
            Part::Image(_) | Part::Link(_) => {
                template_map(vec![("type", TemplateValue::from("image"))])
            }
            Part::Text(text) => template_map(vec![
                ("type", TemplateValue::from("text")),
                ("text", TemplateValue::from(text.as_str())),
            ]),
        })
        .collect();
    TemplateValue::from(items)
}

fn parse_tool_call(call: &Value) -> Result<ToolCall, String> {
    let function = call.get("function").ok_or("missing 'function'")?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or("'function.name' must be a string")?;
    let arguments = match function.get("arguments") {
        None | Some(Value::Null) => Value::String("{}".into()),
        Some(v @ (Value::String(_) | Value::Object(_))) => v.clone(),
        Some(_) => return Err("'function.arguments' must be a JSON string or an object".into()),
    };
    Ok(ToolCall {
        id: call
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        name: name.to_string(),
        arguments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn normalises_openai_shapes() {
        let raw = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": true}"}}]});
        let message = ChatMessage::parse(0, raw.clone()).unwrap();
        for reads_parts in [false, true] {
            assert_eq!(
                message.to_template_value(reads_parts),
                json_value(&json!({"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"x": true}}}]}))
            );
        }
    }

    /// As vLLM hands content to a template: several text parts joined by newlines for one that
    /// reads a string, the parts for one that reads parts; one text part a string either way.
    #[test]
    fn text_parts_are_joined_or_kept_as_the_template_reads_them() {
        let two = json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]);
        let two = ChatMessage::parse(0, json!({"role": "user", "content": two})).unwrap();
        assert_eq!(two.content.as_deref(), Some("a\nb"));
        assert_eq!(
            two.to_template_value(false),
            json_value(&json!({"role": "user", "content": "a\nb"}))
        );
        assert_eq!(
            two.to_template_value(true),
            json_value(&json!({"role": "user", "content": [
                {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}))
        );
        let one = json!({"role": "user", "content": [{"type": "text", "text": "a"}]});
        let one = ChatMessage::parse(0, one).unwrap();
        for reads_parts in [false, true] {
            assert_eq!(
                one.to_template_value(reads_parts),
                json_value(&json!({"role": "user", "content": "a"}))
            );
        }
    }

    #[test]
    fn rejects_bad_messages() {
        for raw in [
            json!({"role": "wizard", "content": "x"}),
            json!({"role": "user", "content": 5}),
            json!({"content": "x"}),
            json!({"role": "user", "content": [{"type": "image_url"}]}),
            json!({"role": "user", "content": [{"type": "input_audio"}]}),
            json!({"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": super::super::images::tests::png_data_url(2, 2)}}]}),
            json!("hello"),
            json!({"role": "tool", "content": "72F"}),
            json!({"role": "tool", "content": "72F", "tool_call_id": 7}),
            json!({"role": "user", "content": "x", "name": 7}),
            json!({"role": "user", "content": "x", "name": ["a"]}),
        ] {
            assert!(ChatMessage::parse(0, raw.clone()).is_err(), "{raw}");
        }
    }
}
