//! An OpenAI Responses request read into the turn's [`ChatRequest`].
//!
//! `instructions` and any `system` or `developer` message become the first system message;
//! the items one model turn produced (`reasoning`, an assistant `message`, `function_call`s)
//! become one assistant message, so a reply sent back is matched to the tokens sampled for it;
//! `function_call_output` becomes the template's tool message. Built-in tools (`web_search`,
//! ...) are left out of the prompt and named in the node's turn.

use crate::chat::SentConversation;
use crate::chat::{
    CallRules, ChatMessage, ChatRequest, ResponseFormat, Role, ToolCall, ToolChoice,
};
use crate::generation::SamplingParams;
use crate::http::ApiError;
use crate::http::body::parse_json;
use crate::http::error::BadRequest;
use crate::session::Api;
use crate::session::Session;
use crate::tools::{DeclaredTools, ToolDialect};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::sync::Arc;
use std::sync::{Mutex, OnceLock, PoisonError};

/// The body of `POST /v1/responses`, as sent. Unknown fields are ignored.
#[derive(Debug, Deserialize)]
pub struct ResponsesBody {
    /// The model asked for; the session serves its own whatever the name.
    #[serde(default)]
    pub model: Option<String>,
    /// A string (one user message) or a list of items, kept as text: each item is read into
    /// the fields the conversation needs ([`input_items`]).
    #[serde(default)]
    pub input: Option<Box<RawValue>>,
    #[serde(default)]
    pub instructions: Option<String>,
    /// Kept as text: each distinct list is read once.
    tools: Option<Box<RawValue>>,
    /// The kind and name of each declared tool, read from `tools` when first asked.
    #[serde(skip)]
    declared: std::sync::OnceLock<Arc<[Declared]>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub reasoning: Option<Value>,
    #[serde(default)]
    text: Option<Value>,
    /// Reply as server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Keep the response on the session (the default).
    #[serde(default)]
    pub store: Option<bool>,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    #[serde(default)]
    pub include: Vec<String>,
}

/// The fields [`ResponsesBody`] reads, and those it knowingly ignores; any other is logged.
pub const KNOWN_FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "temperature",
    "top_p",
    "reasoning",
    "text",
    "stream",
    "store",
    "previous_response_id",
    "include",
    "prompt_cache_key",
    "client_metadata",
    "metadata",
    "service_tier",
    "truncation",
    "user",
    "safety_identifier",
    "stream_options",
    "top_logprobs",
    "background",
];

fn invalid(message: impl Into<String>) -> BadRequest {
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

/// Reads a Responses body sent to `session`: the body, and its input items. A body that
/// resends the input the session was last sent is parsed only from its first new item on
/// (`chat::resent`); either way the session keeps this body's items for the next.
pub fn read_responses(
    session: &Session,
    body: &[u8],
) -> Result<(ResponsesBody, Vec<Arc<SentItem>>), ApiError> {
    let sent = session.sent::<Arc<SentItem>>();
    if let Some(resent) = sent.as_deref().and_then(|sent| sent.resent_in(body))
        && let Ok(mut rest) = parse_json::<ResponsesBody>(&resent.rest)
        && let Ok(new) = input_items(rest.input.take())
    {
        let mut items = resent.known().to_vec();
        items.extend(new);
        session.remember_sent(resent.remember(body, items.clone()));
        return Ok((rest, items));
    }
    let mut whole = parse_json::<ResponsesBody>(body)?;
    let items = input_items(whole.input.take())?;
    session.remember_sent(SentConversation::read(body, "input", items.clone()));
    Ok((whole, items))
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

impl ResponsesBody {
    /// The turn for the conversation `items` (earlier responses' items included).
    pub fn to_request(
        &self,
        items: &[Item],
        default_max_tokens: Option<u32>,
    ) -> Result<ChatRequest, BadRequest> {
        if items.is_empty() {
            return Err(invalid("input: at least one item is required"));
        }
        if let Some(t) = self.temperature.filter(|t| !(0.0..=2.0).contains(t)) {
            return Err(invalid(format!("temperature: {t} is not in [0, 2]")));
        }
        if let Some(p) = self.top_p.filter(|p| !(0.0..=1.0).contains(p)) {
            return Err(invalid(format!("top_p: {p} is not in [0, 1]")));
        }
        let response_format = match self.text.as_ref().and_then(|t| t.get("format")) {
            Some(format) => response_format(format)?,
            None => ResponseFormat::Text,
        };
        let instructions = self.instructions.as_deref().unwrap_or_default();
        let messages = Conversation::read_all(items)?.finish(instructions);
        if messages.is_empty() {
            return Err(invalid("input: no message to answer"));
        }
        let (tools, tools_left_out) = match &self.tools {
            Some(raw) => (
                DeclaredTools::from_raw_in(raw, ToolDialect::Responses)
                    .map_err(|e| invalid(format!("tools: {e}")))?,
                left_out(self.declared()),
            ),
            None => (None, Vec::new()),
        };
        let mut template_kwargs = Map::new();
        let effort = self.reasoning.as_ref().and_then(|r| r.get("effort"));
        if let Some(effort) = effort.and_then(Value::as_str) {
            let thinking = !matches!(effort, "none" | "minimal");
            template_kwargs.insert("enable_thinking".into(), thinking.into());
        }
        let request = ChatRequest {
            api: Api::Responses,
            messages,
            tools,
            tools_left_out,
            tool_choice: match &self.tool_choice {
                Some(choice) => tool_choice(choice)?,
                None => ToolChoice::Auto,
            },
            calls: CallRules {
                parallel: self.parallel_tool_calls.unwrap_or(true),
                ..CallRules::default()
            },
            response_format,
            template_kwargs,
            add_generation_prompt: true,
            params: SamplingParams {
                max_tokens: self.max_output_tokens.or(default_max_tokens),
                temperature: self.temperature,
                top_p: self.top_p,
                ..SamplingParams::default()
            },
            n: 1,
            key: None,
        };
        request.check().map_err(|e| invalid(e.to_string()))?;
        Ok(request)
    }
}

/// `text.format`: Responses writes a schema beside its type (`{"type": "json_schema",
/// "name", "schema"}`), where chat nests it under `json_schema`.
fn response_format(format: &Value) -> Result<ResponseFormat, BadRequest> {
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject),
        Some("json_schema") => match format.get("schema") {
            Some(schema) if schema.is_object() => Ok(ResponseFormat::JsonSchema(schema.clone())),
            _ => Err(invalid("text.format.schema: must be a JSON schema object")),
        },
        _ => Err(invalid(
            "text.format.type: must be 'text', 'json_object' or 'json_schema'",
        )),
    }
}

/// A tool list's text, and what it declares.
type ReadTools = (Box<str>, Arc<[Declared]>);

/// The last tool list read by [`ResponsesBody::declared`].
static LAST_DECLARED: Mutex<Option<ReadTools>> = Mutex::new(None);

/// A declared tool's kind and name, read without its schema.
#[derive(Debug, Deserialize)]
struct Declared {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
}

/// The names of declared tools the prompt leaves out (built-in tools).
fn left_out(declared: &[Declared]) -> Vec<String> {
    declared
        .iter()
        .filter(|tool| !matches!(tool.kind.as_str(), "function" | "namespace"))
        .map(|tool| tool.name.clone().unwrap_or_else(|| tool.kind.clone()))
        .collect()
}

impl ResponsesBody {
    /// The kind and name of each declared tool: read once per request, and once while the
    /// same list comes again (an agent declares the same tools every turn).
    fn declared(&self) -> &[Declared] {
        self.declared.get_or_init(|| {
            let Some(raw) = self.tools.as_deref() else {
                return Arc::from([]);
            };
            let mut last = LAST_DECLARED.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((text, declared)) = &*last
                && **text == *raw.get()
            {
                return declared.clone();
            }
            let declared: Arc<[Declared]> = serde_json::from_str::<Vec<Declared>>(raw.get())
                .unwrap_or_default()
                .into();
            *last = Some((raw.get().into(), declared.clone()));
            declared
        })
    }

    /// The namespaces declared: a call named `{namespace}.{name}` is returned as `name` in
    /// `namespace`.
    pub fn namespaces(&self) -> Vec<String> {
        self.declared()
            .iter()
            .filter(|tool| tool.kind == "namespace")
            .filter_map(|tool| tool.name.clone())
            .collect()
    }
}

fn tool_choice(choice: &Value) -> Result<ToolChoice, BadRequest> {
    Ok(match choice {
        Value::String(mode) => match mode.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(invalid(format!(
                    "tool_choice: '{other}' is not one of 'auto', 'none', 'required'"
                )));
            }
        },
        object => match object.get("name").and_then(Value::as_str) {
            Some(name) => ToolChoice::Function(name.to_string()),
            None => return Err(invalid("tool_choice: an object must name a function")),
        },
    })
}

/// The conversation being read, item by item.
#[derive(Default)]
struct Conversation {
    /// The texts of `system` and `developer` items, which follow `instructions` in the system
    /// prompt.
    system: Vec<String>,
    messages: Vec<Arc<ChatMessage>>,
    /// The model turn being read: its text, reasoning and calls.
    turn: Option<ModelTurn>,
}

/// The conversation as read up to and with an item, kept on it: a body that resends the item
/// (`chat::resent`) goes on reading from there, and its messages are the same (each with what
/// it derived: digest, fingerprint, template value).
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
                let output = text_of(at, "output", item.output.as_deref())?;
                let mut result = ChatMessage::text(Role::Tool, output);
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
        let text = text_of(at, "content", item.content.as_deref())?;
        match role {
            "assistant" => self.turn.get_or_insert_default().texts.push(text),
            "system" | "developer" => self.system.push(text),
            "user" => {
                self.end_turn();
                self.messages
                    .push(Arc::new(ChatMessage::text(Role::User, text)));
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
    fn finish(mut self, instructions: &str) -> Vec<Arc<ChatMessage>> {
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
    fn read_all(items: &[Item]) -> Result<Self, BadRequest> {
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

/// The text of item `at`'s `field`: a string, or content parts (`input_text`, `output_text`,
/// `text`) joined by newlines.
fn text_of(at: At, field: &str, raw: Option<&RawValue>) -> Result<String, BadRequest> {
    let not_text = || invalid(format!("{at}.{field}: must be a string or parts"));
    let raw = raw.ok_or_else(not_text)?;
    if raw.get().starts_with('"') {
        return serde_json::from_str(raw.get()).map_err(|_| not_text());
    }
    let parts: Vec<WirePart> = serde_json::from_str(raw.get()).map_err(|_| not_text())?;
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let kind = part.kind.as_ref().and_then(Value::as_str).unwrap_or("?");
        match (kind, part.text.as_ref().and_then(Value::as_str)) {
            ("input_text" | "output_text" | "text", Some(text)) => texts.push(text),
            ("input_image" | "input_file" | "input_audio", _) => {
                return Err(invalid(format!(
                    "{at}.{field}[{j}]: {kind} parts are not supported: this proxy serves text-only models"
                )));
            }
            (kind, _) => {
                return Err(invalid(format!(
                    "{at}.{field}[{j}]: part type '{kind}' is not supported"
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
    use crate::chat::resent::testing::{check_turn, extras};
    use serde_json::json;

    #[test]
    fn a_resent_conversation_reads_exactly_as_a_fresh_one() {
        let outcome = |session: &Session, body: &[u8]| match read_responses(session, body) {
            Ok((body, items)) => {
                let sent: Vec<&str> = items.iter().map(|item| item.raw().get()).collect();
                let items: Vec<Item> = items.iter().map(|sent| Item::Sent(sent)).collect();
                let request = body.to_request(&items, Some(16));
                format!("{request:?} {sent:?}")
            }
            Err(error) => format!("error: {}", error.message),
        };
        let mut items = vec![json!({"role": "user", "content": "fix \"it\" ]}"})];
        let body = |items: &[Value], extra: &str| {
            let items = serde_json::to_string(items).unwrap();
            format!(r#"{{"model": "m", "instructions": "I", "input": {items}{extra}}}"#)
                .into_bytes()
        };
        let store = r#", "store": false"#;
        for turn in 0..24 {
            let before = body(&items, store);
            items.push(json!({"type": "reasoning", "id": format!("rs_{turn}"),
                "summary": [{"type": "summary_text", "text": "hm"}]}));
            items.push(
                json!({"type": "function_call", "call_id": format!("c{turn}"),
                "name": "f", "arguments": "{}"}),
            );
            items.push(
                json!({"type": "function_call_output", "call_id": format!("c{turn}"),
                "output": [{"type": "input_text", "text": "ok"}]}),
            );
            let after = body(&items, extras(store, turn));
            let resent = |session: &Session, body: &[u8]| {
                let sent = session.sent::<Arc<SentItem>>();
                sent.is_some_and(|sent| sent.resent_in(body).is_some())
            };
            check_turn((&before, &after), turn as u64, outcome, resent);
            let sessions = crate::session::SessionStore::default();
            let session = sessions.create(Default::default()).unwrap();
            // The messages read before are the same ones (with what they derived).
            let request = |body: &[u8]| {
                let (body, items) = read_responses(&session, body).unwrap();
                let items: Vec<Item> = items.iter().map(|sent| Item::Sent(sent)).collect();
                body.to_request(&items, None)
            };
            if let (Ok(first), Ok(second)) = (request(&before), request(&after)) {
                assert!(Arc::ptr_eq(&first.messages[1], &second.messages[1]));
            }
        }
    }

    fn read(body: Value) -> Result<ChatRequest, BadRequest> {
        let body: ResponsesBody = serde_json::from_value(body).unwrap();
        let mut body = body;
        let items = input_items(body.input.take())?;
        let items: Vec<Item> = items.iter().map(|sent| Item::Sent(sent)).collect();
        body.to_request(&items, None)
    }

    #[test]
    fn items_read_alike_sent_or_stored() {
        let items = json!([
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}]},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
            {"type": "function_call", "call_id": "c", "name": "f", "namespace": "n",
                "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "done"},
        ]);
        let sent = read(json!({"input": items})).unwrap();
        let body: ResponsesBody = serde_json::from_value(json!({})).unwrap();
        let stored: Vec<Value> = items.as_array().unwrap().clone();
        let stored: Vec<Item> = stored.iter().map(Item::Stored).collect();
        let stored = body.to_request(&stored, None).unwrap();
        assert_eq!(format!("{sent:?}"), format!("{stored:?}"));
        assert_eq!(sent.messages[1].extra["reasoning_content"], "s");
        assert_eq!(sent.messages[1].tool_calls[0].name, "n.f");
        assert!(read(json!({"input": [3]})).is_err());
        assert!(read(json!({"input": 3})).is_err());
        assert!(read(json!({"input": [{"type": "message", "content": 3}]})).is_err());
    }

    #[test]
    fn a_codex_turn_becomes_the_templates_conversation() {
        let request = read(json!({
            "model": "gpt-5.5-codex", "instructions": "", "stream": true, "store": false,
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be careful."}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is in a.txt?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": encrypt_reasoning("Read it.")},
                {"type": "function_call", "call_id": "call_0", "name": "exec_command", "arguments": "{\"cmd\":\"cat a.txt\"}"},
                {"type": "function_call_output", "call_id": "call_0", "output": "hello"}],
            "tools": [
                {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
                {"type": "namespace", "name": "mcp", "description": "d", "tools": [{"type": "function", "name": "search", "parameters": {}}]},
                {"type": "web_search", "external_web_access": false}],
            "reasoning": {"effort": "medium", "summary": "auto"},
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k", "client_metadata": {}
        }))
        .unwrap();
        let roles: Vec<_> = request.messages.iter().map(|m| m.role_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(request.messages[0].content.as_deref(), Some("Be careful."));
        let assistant = &request.messages[2];
        assert_eq!(assistant.extra["reasoning_content"], "Read it.");
        assert_eq!(assistant.tool_calls[0].id, "call_0");
        assert_eq!(
            assistant.tool_calls[0].arguments_value(),
            json!({"cmd": "cat a.txt"})
        );
        let names: Vec<_> = request.tools.as_ref().unwrap().names().collect();
        assert_eq!(names, ["exec_command", "mcp.search"]);
        assert_eq!(request.tools_left_out, ["web_search"]);
        assert_eq!(request.template_kwargs["enable_thinking"], true);
        assert_eq!(request.api, Api::Responses);
    }

    #[test]
    fn what_cannot_be_served_is_named() {
        let cases = [
            (json!({"input": 5}), "input: must be a string or a list"),
            (json!({"input": []}), "input: at least one item"),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "input[0].content[0]: input_image parts are not supported",
            ),
            (
                json!({"input": "hi", "text": {"format": {"type": "json_schema"}}}),
                "text.format",
            ),
            (
                json!({"input": [{"type": "item_reference", "id": "x"}]}),
                "item_reference",
            ),
        ];
        for (body, expected) in cases {
            let error = read(body).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
        assert_eq!(
            decrypt_reasoning(&encrypt_reasoning("é\n")).as_deref(),
            Some("é\n")
        );
        assert_eq!(decrypt_reasoning("gAAAA-from-elsewhere"), None);
    }
}
