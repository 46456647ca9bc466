//! A turn's reply as a Responses `response` object: output items in document order
//! (`reasoning`, `message` with `output_text`, `function_call`), status and usage.

use super::items::encrypt_reasoning;
use crate::turn::{Finish, Reply, ReplyPart, ReturnedCall, Usage};
use serde::Serialize;
use serde_json::{Value, json};

/// What every `response` object of one turn repeats: its id, the request's settings.
#[derive(Debug, Clone)]
pub struct Shell {
    /// `resp_…`.
    pub id: String,
    pub created_at: u64,
    pub model: String,
    /// Echoed request settings: instructions, tool_choice, tools, temperature, ...
    pub echo: Echo,
    /// Return reasoning items with their `encrypted_content`.
    pub encrypted_reasoning: bool,
    /// Declared namespaces (a call `{namespace}.{name}` is returned in its namespace).
    pub namespaces: Vec<String>,
}

/// A fresh item id with `prefix` (`msg`, `fc`, `rs`).
pub fn item_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

impl Shell {
    /// The `response` object with `status` and `output` (and usage when finished).
    pub fn response<'a>(
        &'a self,
        status: &'a str,
        output: &'a [OutputItem],
        finish: Option<Finish>,
        usage: Option<&Usage>,
    ) -> ResponseObject<'a> {
        ResponseObject {
            id: &self.id,
            object: "response",
            created_at: self.created_at,
            status,
            error: None,
            incomplete_details: match finish {
                Some(Finish::Length) => Some(Incomplete {
                    reason: "max_output_tokens",
                }),
                _ => None,
            },
            model: &self.model,
            output,
            usage: usage.map(ResponseUsage::from),
            echo: &self.echo,
        }
    }

    /// The output items of a finished reply, in document order.
    pub fn output(&self, reply: &Reply) -> Vec<OutputItem> {
        let mut items = Vec::with_capacity(2 + reply.tool_calls.len());
        if let Some(reasoning) = &reply.reasoning {
            items.push(self.reasoning_item(item_id("rs"), reasoning));
        }
        items.extend(reply.parts().into_iter().map(|part| match part {
            ReplyPart::Text(text) => OutputItem::message(item_id("msg"), text, "completed"),
            ReplyPart::Call(call) => {
                self.call_item(item_id("fc"), call, &call.arguments, "completed")
            }
        }));
        items
    }

    /// A `reasoning` item.
    pub fn reasoning_item(&self, id: String, text: &str) -> OutputItem {
        OutputItem::Reasoning {
            id,
            summary: [],
            content: vec![Part::ReasoningText { text: text.into() }],
            encrypted_content: self.encrypted_reasoning.then(|| encrypt_reasoning(text)),
        }
    }

    /// A `function_call` item (its name split from its namespace, when it has one).
    pub fn call_item(
        &self,
        id: String,
        call: &ReturnedCall,
        arguments: &str,
        status: &'static str,
    ) -> OutputItem {
        let namespaced = self.namespaces.iter().find_map(|namespace| {
            let name = call
                .name
                .strip_prefix(namespace.as_str())?
                .strip_prefix('.')?;
            Some((namespace, name))
        });
        let (name, namespace) = match namespaced {
            Some((namespace, name)) => (name.to_string(), Some(namespace.clone())),
            None => (call.name.clone(), None),
        };
        OutputItem::FunctionCall {
            id,
            status,
            call_id: call.id.clone(),
            name,
            arguments: arguments.into(),
            namespace,
        }
    }
}

/// An output item of a response.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The model's reasoning.
    Reasoning {
        id: String,
        summary: [(); 0],
        content: Vec<Part>,
        #[serde(skip_serializing_if = "Option::is_none")]
        encrypted_content: Option<String>,
    },
    /// The model's text.
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<Part>,
    },
    /// A call of a declared function.
    FunctionCall {
        id: String,
        status: &'static str,
        call_id: String,
        name: String,
        arguments: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
    },
}

impl OutputItem {
    /// A `message` item holding one `output_text` part.
    pub fn message(id: String, text: &str, status: &'static str) -> Self {
        Self::Message {
            id,
            status,
            role: "assistant",
            content: vec![Part::output_text(text)],
        }
    }

    /// The name of the function a call item calls.
    pub fn function_name(&self) -> Option<&str> {
        match self {
            Self::FunctionCall { name, .. } => Some(name),
            Self::Reasoning { .. } | Self::Message { .. } => None,
        }
    }
}

/// A content part of an item.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// Text the model wrote.
    OutputText {
        text: String,
        annotations: [(); 0],
        logprobs: [(); 0],
    },
    /// Reasoning the model wrote.
    ReasoningText { text: String },
}

impl Part {
    /// An `output_text` part.
    pub fn output_text(text: &str) -> Self {
        Self::OutputText {
            text: text.into(),
            annotations: [],
            logprobs: [],
        }
    }
}

/// A `response` object.
#[derive(Debug, Serialize)]
pub struct ResponseObject<'a> {
    pub id: &'a str,
    object: &'static str,
    created_at: u64,
    status: &'a str,
    /// Always null: a failed turn is an HTTP error (or an `error` event), never a response.
    error: Option<()>,
    incomplete_details: Option<Incomplete>,
    model: &'a str,
    output: &'a [OutputItem],
    usage: Option<ResponseUsage>,
    /// The request settings a response repeats.
    #[serde(flatten)]
    echo: &'a Echo,
}

/// The request settings a `response` object repeats, in OpenAI's order.
#[derive(Debug, Clone, Serialize)]
pub struct Echo {
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: ReasoningEcho,
    pub store: bool,
    pub temperature: Option<f64>,
    /// Always plain text: a format asked for is enforced, not echoed.
    #[serde(serialize_with = "plain_text")]
    pub text: (),
    pub tool_choice: Value,
    /// Never echoed.
    pub tools: [(); 0],
    pub top_p: Option<f64>,
    pub truncation: &'static str,
    /// Never echoed.
    pub metadata: Empty,
}

/// `reasoning` as echoed.
#[derive(Debug, Clone, Serialize)]
pub struct ReasoningEcho {
    pub effort: Option<Value>,
    pub summary: Option<Value>,
}

/// An empty object.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Empty {}

fn plain_text<S: serde::Serializer>(_: &(), serializer: S) -> Result<S::Ok, S::Error> {
    json!({"format": {"type": "text"}}).serialize(serializer)
}

/// Why a response is incomplete.
#[derive(Debug, Serialize)]
struct Incomplete {
    reason: &'static str,
}

/// `usage`, the prompt's cached part in `input_tokens_details`.
#[derive(Debug, Serialize)]
struct ResponseUsage {
    input_tokens: usize,
    input_tokens_details: CachedTokens,
    output_tokens: usize,
    output_tokens_details: ReasoningTokens,
    total_tokens: usize,
}

#[derive(Debug, Serialize)]
struct CachedTokens {
    cached_tokens: u32,
}

#[derive(Debug, Serialize)]
struct ReasoningTokens {
    reasoning_tokens: u32,
}

impl From<&Usage> for ResponseUsage {
    fn from(usage: &Usage) -> Self {
        Self {
            input_tokens: usage.prompt_tokens,
            input_tokens_details: CachedTokens {
                cached_tokens: usage.cached_tokens.unwrap_or(0),
            },
            output_tokens: usage.completion_tokens,
            output_tokens_details: ReasoningTokens {
                reasoning_tokens: 0,
            },
            total_tokens: usage.prompt_tokens + usage.completion_tokens,
        }
    }
}

/// `completed`, or `incomplete` when the token limit cut the reply.
pub fn status(finish: Finish) -> &'static str {
    match finish {
        Finish::Length => "incomplete",
        _ => "completed",
    }
}
