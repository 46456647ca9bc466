//! A Responses request's input items read into the conversation: each item's text is kept (a
//! stored response keeps it as sent) and read once into the fields the conversation needs;
//! the items one model turn produced (`reasoning`, an assistant `message`, `function_call`s)
//! become one assistant message, `function_call_output` the template's tool message, and
//! `system`/`developer` messages join `instructions` in the system prompt.

use crate::chat::{ChatMessage, Part, Role, ToolCall};
use crate::http::error::BadRequest;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

/// A 400 saying `message`.
pub(super) fn invalid(message: impl Into<String>) -> BadRequest {
    BadRequest::new(message)
}

/// The prefix of this proxy's `encrypted_content`: its reasoning text, base64url.
const ENCRYPTED_PREFIX: &str = "rollout-proxy.";

/// The opaque `encrypted_content` of a reasoning item: the reasoning, recovered when sent back.
pub fn encrypt_reasoning(text: &str) -> String {
    format!("{ENCRYPTED_PREFIX}{}", URL_SAFE_NO_PAD.encode(text))
}

fn decrypt_reasoning(content: &str) -> Option<String> {
    let encoded = content.strip_prefix(ENCRYPTED_PREFIX)?;
    String::from_utf8(URL_SAFE_NO_PAD.decode(encoded).ok()?).ok()
}

/// The input as a list of items, each still JSON text (a string is one user message): an
/// agent resends its whole conversation every turn, and only the fields the conversation
/// needs are read from it.
pub fn input_items(input: Option<Box<RawValue>>) -> Result<Vec<Arc<SentItem>>, BadRequest> {
    let Some(input) = input else {
        return Ok(Vec::new());
    };
    let not_items = || invalid("input: must be a string or a list of items");
    let items: Vec<Box<RawValue>> = match input.get().as_bytes().first() {
        Some(b'"') => {
            let text: String = serde_json::from_str(input.get()).map_err(|_| not_items())?;
            let item = serde_json::json!({"type": "message", "role": "user", "content": text});
            vec![serde_json::value::to_raw_value(&item).map_err(|_| not_items())?]
        }
        Some(b'[') => serde_json::from_str(input.get()).map_err(|_| not_items())?,
        Some(b'n') => Vec::new(),
        _ => return Err(not_items()),
    };
    Ok(items
        .into_iter()
        .map(|raw| Arc::new(SentItem::new(raw)))
        .collect())
}

/// An input item as a request sent it: its text (kept as it is when the response is stored)
/// and the fields the conversation reads from it (`None`: not an item object).
#[derive(Debug)]
pub struct SentItem {
    raw: Box<RawValue>,
    wire: Option<WireItem>,
    /// The conversation read up to and with this item, once a request read it whole.
    read_so_far: OnceLock<ReadSoFar>,
}

impl SentItem {
    fn new(raw: Box<RawValue>) -> Self {
        let wire = serde_json::from_str(raw.get()).ok();
        Self {
            raw,
            wire,
            read_so_far: OnceLock::new(),
        }
    }

    /// The item as sent.
    pub fn raw(&self) -> &RawValue {
        &self.raw
    }
}

/// An input item: as the request sent it, or as a stored response kept it.
#[derive(Debug, Clone, Copy)]
pub enum Item<'a> {
    /// Sent with this request.
    Sent(&'a SentItem),
    /// Kept by the response the request continues.
    Stored(&'a Value),
}

/// The fields of an input item the conversation reads; any other is skipped unread.
#[derive(Debug, Clone, Deserialize)]
struct WireItem {
    #[serde(rename = "type")]
    kind: Option<Value>,
    role: Option<Value>,
    /// A string or a list of parts (a message's, a reasoning item's).
    content: Option<Box<RawValue>>,
    call_id: Option<Value>,
    name: Option<Value>,
    namespace: Option<Value>,
    arguments: Option<Value>,
    /// A string or a list of parts (a call's output).
    output: Option<Box<RawValue>>,
    encrypted_content: Option<Value>,
    summary: Option<Box<RawValue>>,
}

/// A content part: its type and text; any other field is skipped unread.
#[derive(Debug, Deserialize)]
struct WirePart {
    #[serde(rename = "type")]
    kind: Option<Value>,
    text: Option<Value>,
    /// An `input_image`'s URL.
    image_url: Option<Value>,
}

impl<'a> Item<'a> {
    fn read(self, at: At) -> Result<Cow<'a, WireItem>, BadRequest> {
        let read = match self {
            Item::Sent(sent) => sent.wire.as_ref().map(Cow::Borrowed),
            Item::Stored(value) => WireItem::deserialize(value).ok().map(Cow::Owned),
        };
        read.ok_or_else(|| invalid(format!("{at}: must be an item object")))
    }
}

/// The conversation being read, item by item.
#[derive(Default)]
pub(super) struct Conversation {
    /// The texts of `system` and `developer` items, which follow `instructions` in the system
    /// prompt.
    system: Vec<String>,
    messages: Vec<Arc<ChatMessage>>,
    /// The model turn being read: its text, reasoning and calls.
    turn: Option<ModelTurn>,
}

/// The conversation as read up to and with an item, kept on it: a body that resends the item
/// (`chat::resent`) goes on reading from there, and its messages are the same (each with what
/// it derived: digest, fingerprint, call hashes).
#[derive(Debug)]
struct ReadSoFar {
    system: Vec<String>,
    messages: Vec<Arc<ChatMessage>>,
}

#[derive(Default)]
struct ModelTurn {
    texts: Vec<String>,
    reasoning: Vec<String>,
    calls: Vec<ToolCall>,
}

impl Conversation {
    fn read(&mut self, i: usize, item: Item) -> Result<(), BadRequest> {
        let at = At(i);
        let item = item.read(at)?;
        let kind = match item.kind.as_ref().and_then(Value::as_str) {
            Some(kind) => kind,
            None if item.role.is_some() => "message",
            None => return Err(invalid(format!("{at}.type: Field required"))),
        };
        match kind {
            "message" => self.message(at, &item),
            "function_call" => {
                let field = |name: &str, value: &Option<Value>| {
                    value
                        .as_ref()
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .ok_or_else(|| invalid(format!("{at}.{name}: must be a string")))
                };
                let name = field("name", &item.name)?;
                let name = match item.namespace.as_ref().and_then(Value::as_str) {
                    Some(namespace) => format!("{namespace}.{name}"),
                    None => name,
                };
                let call = ToolCall {
                    id: field("call_id", &item.call_id)?,
                    name,
                    arguments: Value::String(field("arguments", &item.arguments)?),
                };
                self.turn.get_or_insert_default().calls.push(call);
                Ok(())
            }
            "function_call_output" => {
                self.end_turn();
                let id = item
                    .call_id
                    .as_ref()
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(format!("{at}.call_id: must be a string")))?;
                let output = parts_of(at, "output", item.output.as_deref())?;
                let mut result = ChatMessage::with_parts(Role::Tool, output);
                result.extra.insert("tool_call_id".into(), id.into());
                self.messages.push(Arc::new(result));
                Ok(())
            }
            "reasoning" => {
                let text = reasoning_text(&item);
                self.turn.get_or_insert_default().reasoning.push(text);
                Ok(())
            }
            // Calls of OpenAI's own tools: nothing of them reaches this model.
            "web_search_call" | "file_search_call" | "image_generation_call" => Ok(()),
            "item_reference" => Err(invalid(format!(
                "{at}: item_reference is not supported; send the item, or previous_response_id"
            ))),
            other => Err(invalid(format!(
                "{at}: item type '{other}' is not supported"
            ))),
        }
    }

    fn message(&mut self, at: At, item: &WireItem) -> Result<(), BadRequest> {
        let role = item.role.as_ref().and_then(Value::as_str).unwrap_or("user");
        let content = item.content.as_deref();
        match role {
            "assistant" => {
                let text = text_of(at, "content", content)?;
                self.turn.get_or_insert_default().texts.push(text)
            }
            "system" | "developer" => self.system.push(text_of(at, "content", content)?),
            "user" => {
                let parts = parts_of(at, "content", content)?;
                self.end_turn();
                self.messages
                    .push(Arc::new(ChatMessage::with_parts(Role::User, parts)));
            }
            other => {
                return Err(invalid(format!(
                    "{at}.role: '{other}' is not one of 'user', 'assistant', 'system', 'developer'"
                )));
            }
        }
        Ok(())
    }

    /// Ends the model turn being read: its items become one assistant message.
    fn end_turn(&mut self) {
        let Some(turn) = self.turn.take() else { return };
        let mut reply = ChatMessage::text(Role::Assistant, turn.texts.join("\n"));
        reply.tool_calls = turn.calls;
        let reasoning: Vec<&String> = turn.reasoning.iter().filter(|r| !r.is_empty()).collect();
        if !reasoning.is_empty() {
            let reasoning: Vec<&str> = reasoning.iter().map(|r| r.as_str()).collect();
            reply
                .extra
                .insert("reasoning_content".into(), reasoning.join("\n").into());
        }
        self.messages.push(Arc::new(reply));
    }

    /// The messages, the system prompt (`instructions`, then the system items' texts) first.
    pub(super) fn finish(mut self, instructions: &str) -> Vec<Arc<ChatMessage>> {
        self.end_turn();
        let mut system = instructions.to_string();
        for text in &self.system {
            if !system.is_empty() && !text.is_empty() {
                system.push_str("\n\n");
            }
            system.push_str(text);
        }
        if !system.is_empty() {
            let system = ChatMessage::text(Role::System, system);
            self.messages.insert(0, Arc::new(system));
        }
        self.messages
    }

    /// Reads `items`, going on from the last sent item that kept the conversation read up to
    /// it; the last item keeps it in turn when every item was sent (a stored response's
    /// items come first and are not kept) and no model turn is left open.
    pub(super) fn read_all(items: &[Item]) -> Result<Self, BadRequest> {
        let mut conversation = Self::default();
        let all_sent = items.iter().all(|item| matches!(item, Item::Sent(_)));
        let kept = items
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, item)| match item {
                Item::Sent(sent) if all_sent => sent.read_so_far.get().map(|kept| (i + 1, kept)),
                _ => None,
            });
        let from = match kept {
            Some((from, kept)) => {
                conversation.system.clone_from(&kept.system);
                conversation.messages.clone_from(&kept.messages);
                from
            }
            None => 0,
        };
        for (i, item) in items.iter().enumerate().skip(from) {
            conversation.read(i, *item)?;
        }
        if let (true, None, Some(Item::Sent(last))) = (all_sent, &conversation.turn, items.last()) {
            let _ = last.read_so_far.set(ReadSoFar {
                system: conversation.system.clone(),
                messages: conversation.messages.clone(),
            });
        }
        Ok(conversation)
    }
}

/// Where an input item stands, for errors (written only when one is).
#[derive(Debug, Clone, Copy)]
struct At(usize);

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "input[{}]", self.0)
    }
}

/// The text and images of item `at`'s `field`: a string, or content parts (`input_text`,
/// `output_text`, `text`, and `input_image` with an `image_url`), in order.
fn parts_of(at: At, field: &str, raw: Option<&RawValue>) -> Result<Vec<Part>, BadRequest> {
    let not_text = || invalid(format!("{at}.{field}: must be a string or parts"));
    let raw = raw.ok_or_else(not_text)?;
    if raw.get().starts_with('"') {
        let text = serde_json::from_str(raw.get()).map_err(|_| not_text())?;
        return Ok(vec![Part::Text(text)]);
    }
    let parts: Vec<WirePart> = serde_json::from_str(raw.get()).map_err(|_| not_text())?;
    let mut read = Vec::with_capacity(parts.len());
    for (j, part) in parts.into_iter().enumerate() {
        let kind = part.kind.as_ref().and_then(Value::as_str).unwrap_or("?");
        match (kind, part.text.as_ref().and_then(Value::as_str)) {
            ("input_text" | "output_text" | "text", Some(text)) => {
                read.push(Part::Text(text.to_string()))
            }
            ("input_image", _) => {
                let url = part
                    .image_url
                    .as_ref()
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        invalid(format!(
                            "{at}.{field}[{j}].image_url: an input_image needs its image as a URL, \
                         data: or http(s) (file_id is not supported)"
                        ))
                    })?;
                let image =
                    Part::image_url(url).map_err(|e| invalid(format!("{at}.{field}[{j}]: {e}")))?;
                read.push(image);
            }
            ("input_file" | "input_audio", _) => {
                return Err(invalid(format!(
                    "{at}.{field}[{j}]: {kind} parts are not supported: send text or images"
                )));
            }
            (kind, _) => {
                return Err(invalid(format!(
                    "{at}.{field}[{j}]: part type '{kind}' is not supported"
                )));
            }
        }
    }
    Ok(read)
}

/// The text of item `at`'s `field` ([`parts_of`] without images) joined by newlines.
fn text_of(at: At, field: &str, raw: Option<&RawValue>) -> Result<String, BadRequest> {
    let parts = parts_of(at, field, raw)?;
    let mut texts = Vec::with_capacity(parts.len());
    for part in &parts {
        match part {
            Part::Text(text) => texts.push(text.as_str()),
            Part::Image(_) | Part::Link(_) => {
                return Err(invalid(format!(
                    "{at}.{field}: only user messages and tool outputs hold images"
                )));
            }
        }
    }
    Ok(texts.join("\n"))
}

/// A reasoning item's text: from this proxy's `encrypted_content`, else its reasoning
/// content, else its summary.
fn reasoning_text(item: &WireItem) -> String {
    if let Some(text) = item
        .encrypted_content
        .as_ref()
        .and_then(Value::as_str)
        .and_then(decrypt_reasoning)
    {
        return text;
    }
    // The parts' texts joined, `None` when no part has text.
    let texts = |parts: Option<&RawValue>| -> Option<String> {
        let parts: Vec<WirePart> = serde_json::from_str(parts?.get()).ok()?;
        let texts: Vec<&str> = parts
            .iter()
            .filter_map(|part| part.text.as_ref().and_then(Value::as_str))
            .collect();
        (!texts.is_empty()).then(|| texts.join("\n"))
    };
    texts(item.content.as_deref())
        .or_else(|| texts(item.summary.as_deref()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_proxys_encrypted_reasoning_is_read_back() {
        assert_eq!(
            decrypt_reasoning(&encrypt_reasoning("é\n")).as_deref(),
            Some("é\n")
        );
        assert_eq!(decrypt_reasoning("gAAAA-from-elsewhere"), None);
    }
}
