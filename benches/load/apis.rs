//! The workload's conversation in each API a session serves (`LOAD_API`): OpenAI chat,
//! Anthropic Messages or OpenAI Responses. Each keeps the conversation in its own wire format,
//! sends it whole every turn (as the agents do), and appends the reply exactly as returned.
#![allow(dead_code)]

use serde::Serialize;
use serde_json::{Value, json};

/// Which API the load generator speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Messages,
    Responses,
}

impl Api {
    /// `LOAD_API` (`chat`, the default; `messages`; `responses`).
    pub fn from_env() -> Self {
        match std::env::var("LOAD_API").as_deref() {
            Ok("messages") => Self::Messages,
            Ok("responses") => Self::Responses,
            Ok("chat") | Err(_) => Self::Chat,
            Ok(other) => panic!("LOAD_API={other}: chat, messages or responses"),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Messages => "messages",
            Self::Responses => "responses",
        }
    }

    /// The turn route of session `uuid`.
    pub fn url(self, base: &str, uuid: &str) -> String {
        match self {
            Self::Chat => format!("{base}/{uuid}/v1/chat/completions"),
            Self::Messages => format!("{base}/{uuid}/v1/messages"),
            Self::Responses => format!("{base}/{uuid}/v1/responses"),
        }
    }

    /// Text that first appears in a stream with the first sampled tokens' event.
    pub fn first_token_marker(self) -> &'static [u8] {
        match self {
            Self::Chat => b"\"token_ids\"",
            Self::Messages => b"content_block_start",
            Self::Responses => b"response.output_item.added",
        }
    }

    /// The workload's tools (OpenAI chat's shape) in this API's shape.
    pub fn tools(self, chat_tools: &Value) -> Value {
        let functions = chat_tools
            .as_array()
            .unwrap()
            .iter()
            .map(|t| &t["function"]);
        match self {
            Self::Chat => chat_tools.clone(),
            Self::Messages => functions
                .map(|f| {
                    json!({"name": f["name"], "description": f["description"],
                    "input_schema": f["parameters"]})
                })
                .collect(),
            Self::Responses => functions
                .map(|f| {
                    json!({"type": "function", "name": f["name"],
                    "description": f["description"], "parameters": f["parameters"]})
                })
                .collect(),
        }
    }
}

/// A chat request written from the rollout's messages as they are (not copied into a new
/// JSON value every turn).
#[derive(Serialize)]
struct ChatBody<'a> {
    messages: &'a [Value],
    tools: &'a Value,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
}

#[derive(Serialize)]
struct MessagesBody<'a> {
    model: &'static str,
    system: &'a str,
    messages: &'a [Value],
    tools: &'a Value,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
}

#[derive(Serialize)]
struct ResponsesBody<'a> {
    model: &'static str,
    instructions: &'a str,
    input: &'a [Value],
    tools: &'a Value,
    max_output_tokens: u32,
    store: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
}

/// One rollout's conversation in its API's wire format.
pub struct Conversation {
    api: Api,
    system: &'static str,
    /// Chat messages (the system message first), Messages messages, or Responses items.
    items: Vec<Value>,
}

impl Conversation {
    pub fn new(api: Api, system: &'static str, question: &str) -> Self {
        let items = match api {
            Api::Chat => vec![
                json!({"role": "system", "content": system}),
                json!({"role": "user", "content": question}),
            ],
            Api::Messages | Api::Responses => {
                vec![json!({"role": "user", "content": question})]
            }
        };
        Self { api, system, items }
    }

    /// The next request's body (`tools` in this API's shape).
    pub fn body(&self, tools: &Value, temperature: Option<f64>, stream: bool) -> Vec<u8> {
        let (items, system) = (&self.items, self.system);
        match self.api {
            Api::Chat => serde_json::to_vec(&ChatBody {
                messages: items,
                tools,
                max_tokens: 256,
                temperature,
                stream,
            }),
            Api::Messages => serde_json::to_vec(&MessagesBody {
                model: "claude-load",
                system,
                messages: items,
                tools,
                max_tokens: 256,
                temperature,
                stream,
            }),
            Api::Responses => serde_json::to_vec(&ResponsesBody {
                model: "gpt-load",
                instructions: system,
                input: items,
                tools,
                max_output_tokens: 256,
                store: false,
                temperature,
                stream,
            }),
        }
        .unwrap()
    }

    /// Appends the reply exactly as returned, then the environment's result for each of its
    /// calls (`tool_result` gets each call in OpenAI chat's shape) or, without calls, the next
    /// user turn (then returns `true`).
    pub fn answer(
        &mut self,
        reply: &Value,
        next_user: &str,
        mut tool_result: impl FnMut(&Value) -> String,
    ) -> bool {
        let calls = match self.api {
            Api::Chat => {
                let message = reply["choices"][0]["message"].clone();
                let calls: Vec<Value> = message["tool_calls"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                self.items.push(message);
                for call in &calls {
                    self.items
                        .push(json!({"role": "tool", "tool_call_id": call["id"],
                        "content": tool_result(call)}));
                }
                calls.len()
            }
            Api::Messages => {
                let content = reply["content"].as_array().cloned().unwrap_or_default();
                let results: Vec<Value> = content
                    .iter()
                    .filter(|block| block["type"] == "tool_use")
                    .map(|block| {
                        let call = json!({"function": {"name": block["name"],
                            "arguments": block["input"].to_string()}});
                        json!({"type": "tool_result", "tool_use_id": block["id"],
                            "content": tool_result(&call)})
                    })
                    .collect();
                self.items
                    .push(json!({"role": "assistant", "content": content}));
                let calls = results.len();
                if calls > 0 {
                    self.items.push(json!({"role": "user", "content": results}));
                }
                calls
            }
            Api::Responses => {
                // The turn's items first, then the calls' outputs: one model turn.
                let output = reply["output"].as_array().cloned().unwrap_or_default();
                let results: Vec<Value> = output
                    .iter()
                    .filter(|item| item["type"] == "function_call")
                    .map(|item| {
                        let call = json!({"function": {"name": item["name"],
                            "arguments": item["arguments"]}});
                        json!({"type": "function_call_output", "call_id": item["call_id"],
                            "output": tool_result(&call)})
                    })
                    .collect();
                let calls = results.len();
                self.items.extend(output);
                self.items.extend(results);
                calls
            }
        };
        if calls == 0 {
            self.items
                .push(json!({"role": "user", "content": next_user}));
        }
        calls == 0
    }
}
