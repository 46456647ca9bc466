//! An OpenAI Responses request read into the turn's [`ChatRequest`]: the body's settings here,
//! its input items into the conversation in [`super::items`] (so a reply sent back is matched
//! to the tokens sampled for it). Built-in tools (`web_search`, ...) are left out of the prompt
//! and named in the node's turn.

use super::items::{Conversation, Item, SentItem, input_items, invalid};
use crate::chat::{CallRules, ChatRequest, ResponseFormat, ToolChoice};
use crate::generation::SamplingParams;
use crate::http::ApiError;
use crate::http::body::parse_json;
use crate::http::error::BadRequest;
use crate::session::{Api, Session};
use crate::tools::{DeclaredTools, ToolDialect};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::sync::{Arc, Mutex, PoisonError};

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

/// Reads a Responses body sent to `session`: the body, and its input items. A body that
/// resends the input the session was last sent is parsed only from its first new item on
/// (`chat::resent`); either way the session keeps this body's items for the next.
pub fn read_responses(
    session: &Session,
    body: &[u8],
) -> Result<(ResponsesBody, Vec<Arc<SentItem>>), ApiError> {
    session.read_resending(body, "input", |bytes, known| {
        let mut body = parse_json::<ResponsesBody>(bytes)?;
        let mut items = known.to_vec();
        items.extend(input_items(body.input.take())?);
        let read = items.clone();
        Ok::<_, ApiError>(((body, items), read))
    })
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

#[cfg(test)]
mod tests {
    use super::super::items::encrypt_reasoning;
    use super::*;
    use crate::chat::resent::KEPT_FROM_BYTES;
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
            // Instructions long enough for the body to be kept.
            let instructions = "I".repeat(KEPT_FROM_BYTES);
            format!(
                r#"{{"model": "m", "instructions": "{instructions}", "input": {items}{extra}}}"#
            )
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
                "input[0].content[0]: an image URL must be a data: URL",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}),
                "input[0].content[0].image_url: an input_image needs its image as a URL, data: or \
                 http(s) (file_id is not supported)",
            ),
            (
                json!({"input": [{"role": "assistant", "content": [{"type": "input_image",
                    "image_url": crate::chat::images::tests::png_data_url(2, 2)}]}]}),
                "input[0].content: only user messages and tool outputs hold images",
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
    }
}
