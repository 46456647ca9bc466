//! A turn's reply as an Anthropic `message`: content blocks in document order (`thinking`,
//! then `text` and `tool_use` as the model wrote them), the stop reason and the usage.

use crate::generation::StopMatch;
use crate::turn::{Finish, Reply, ReplyPart, ReturnedCall, Usage};
use serde::Serialize;
use serde_json::Value;

/// A `message` object.
#[derive(Debug, Serialize)]
pub struct Message<'a> {
    pub id: &'a str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: &'a str,
    pub content: Vec<Block<'a>>,
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<&'a str>,
    pub usage: MessageUsage,
}

/// One content block.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block<'a> {
    /// Reasoning. The signature is empty: this proxy signs nothing.
    Thinking {
        thinking: &'a str,
        signature: &'static str,
    },
    /// Visible text.
    Text { text: &'a str },
    /// A tool call; `input` is its arguments as parsed JSON.
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Value,
    },
}

/// `usage`: token counts, the prompt's cached part as `cache_read_input_tokens`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MessageUsage {
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub cache_creation_input_tokens: usize,
    pub cache_read_input_tokens: usize,
}

impl From<&Usage> for MessageUsage {
    fn from(usage: &Usage) -> Self {
        Self {
            input_tokens: usage.prompt_tokens,
            output_tokens: usage.completion_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: usage.cached_tokens.unwrap_or(0) as usize,
        }
    }
}

/// `stop_reason` and `stop_sequence` of a reply that ended so.
pub fn stop_reason(finish: Finish, stop: Option<&StopMatch>) -> (&'static str, Option<&str>) {
    match (finish, stop) {
        (Finish::Length, _) => ("max_tokens", None),
        (Finish::ToolCalls, _) => ("tool_use", None),
        (_, Some(StopMatch::Text(sequence))) => ("stop_sequence", Some(sequence)),
        _ => ("end_turn", None),
    }
}

/// A call's `input`: its arguments as JSON (an object when they do not parse).
pub fn call_input(call: &ReturnedCall) -> Value {
    serde_json::from_str(&call.arguments).unwrap_or_else(|_| Value::Object(Default::default()))
}

/// The content blocks of `reply`: thinking first, then text and calls in document order.
pub fn blocks<'a>(reply: &'a Reply) -> Vec<Block<'a>> {
    let mut blocks = Vec::with_capacity(2 + reply.tool_calls.len());
    if let Some(thinking) = &reply.reasoning {
        blocks.push(Block::Thinking {
            thinking,
            signature: "",
        });
    }
    blocks.extend(reply.parts().into_iter().map(|part| match part {
        ReplyPart::Text(text) => Block::Text { text },
        ReplyPart::Call(call) => Block::ToolUse {
            id: &call.id,
            name: &call.name,
            input: call_input(call),
        },
    }));
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn blocks_follow_the_document_order() {
        let reply = Reply {
            content: Some("Let me look. \n then done.".into()),
            reasoning: Some("hmm".into()),
            tool_calls: vec![ReturnedCall {
                id: "toolu_0".into(),
                name: "Read".into(),
                arguments: r#"{"path":"a"}"#.into(),
                offset: 13,
                healed_from: None,
            }],
            finish: Finish::ToolCalls,
            text: String::new(),
            end_token_text: None,
            tool_outcomes: Default::default(),
        };
        assert_eq!(
            serde_json::to_value(blocks(&reply)).unwrap(),
            json!([
                {"type": "thinking", "thinking": "hmm", "signature": ""},
                {"type": "text", "text": "Let me look. "},
                {"type": "tool_use", "id": "toolu_0", "name": "Read", "input": {"path": "a"}},
                {"type": "text", "text": "\n then done."},
            ])
        );
        assert_eq!(stop_reason(Finish::Length, None), ("max_tokens", None));
        let stop = StopMatch::Text("###".into());
        assert_eq!(
            stop_reason(Finish::Stop, Some(&stop)),
            ("stop_sequence", Some("###"))
        );
    }
}
