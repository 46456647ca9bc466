//! Turning sampled ids into OpenAI replies: visible text, tool calls, logprobs.

use crate::backend::{FinishReason, Generation, StopMatch};
use crate::chat::ChatRequest;
use crate::session::IssuedToolCall;
use crate::session::completion::{message_fingerprint, tool_call_hash};
use crate::tokenizer::Tokenizer;
use crate::tools::ToolParser;
use crate::turn::SampledChoice;
use serde_json::{Value, json};

/// What the client is shown for one sampled choice.
#[derive(Debug, Clone)]
pub struct ChoiceReply {
    pub content: Option<String>,
    /// The `<think>` block, when the session returns reasoning separately.
    pub reasoning: Option<String>,
    /// `(id, name, arguments)` of each returned call.
    pub tool_calls: Vec<(String, String, String)>,
    pub finish_reason: &'static str,
    /// The visible text before tool parsing (what a client may send back as content).
    pub text: String,
    pub end_token_text: Option<String>,
}

/// The visible text of a generation (special tokens left out but those in `shown`) and the
/// special token it ended on, if any.
pub fn visible_text(
    tokenizer: &Tokenizer,
    generation: &Generation,
    shown: &[u32],
) -> (String, Option<String>) {
    let end_token_text = match (generation.finish_reason, generation.token_ids.last()) {
        (FinishReason::Stop, Some(&last)) => tokenizer.special_token_text(last).map(str::to_string),
        _ => None,
    };
    let mut text = tokenizer.decode_visible(&generation.token_ids, shown);
    // The ids include a matched stop string; the text the client sees ends before it.
    if let Some(StopMatch::Text(stop)) = &generation.stop
        && let Some(at) = text.rfind(stop.as_str())
    {
        text.truncate(at);
    }
    (text, end_token_text)
}

/// Shapes one choice: parses tool calls when tools are callable.
///
/// `reasoning`: `Some(opened)` when the session returns `<think>` blocks as
/// `reasoning_content` (`opened`: the prompt opened the block); tool calls are only looked for
/// in the content after it.
pub fn shape_choice(
    tokenizer: &Tokenizer,
    parser: &dyn ToolParser,
    request: &ChatRequest,
    generation: &Generation,
    reasoning: Option<bool>,
    ids: &mut CallIds,
) -> ChoiceReply {
    let shown = tokenizer.special_ids(parser.markers());
    let (text, end_token_text) = visible_text(tokenizer, generation, &shown);
    let (reasoning, answer) = match reasoning {
        Some(opened) => crate::reasoning::split(&text, opened),
        None => (None, text.clone()),
    };
    let promoter = request.promoter();
    let parsed = promoter
        .is_active()
        .then(|| parser.parse(&answer, &promoter))
        .filter(|p| !p.calls.is_empty());
    let (content, tool_calls) = match parsed {
        Some(parsed) => {
            let keep = if request.parallel_tool_calls {
                usize::MAX
            } else {
                1
            };
            let calls = parsed
                .calls
                .into_iter()
                .take(keep)
                .map(|c| (ids.issue(), c.name, c.arguments))
                .collect();
            (parsed.content, calls)
        }
        None => (Some(answer), Vec::new()),
    };
    let finish_reason = match generation.finish_reason {
        // A sample cut by the length limit is never reported as a finished tool call.
        FinishReason::Stop if !tool_calls.is_empty() => "tool_calls",
        other => other.as_str(),
    };
    ChoiceReply {
        content,
        reasoning,
        tool_calls,
        finish_reason,
        text,
        end_token_text,
    }
}

/// Tool-call ids `call_0`, `call_1`, … numbered across the session (continuing from the calls
/// it already returned), so an id names one call of the conversation when it comes back.
#[derive(Debug, Clone, Copy)]
pub struct CallIds {
    next: usize,
}

impl CallIds {
    /// Ids for a turn of a session that has returned `issued` calls.
    pub fn after(issued: usize) -> Self {
        Self { next: issued }
    }

    /// The next id.
    pub fn issue(&mut self) -> String {
        self.next += 1;
        format!("call_{}", self.next - 1)
    }
}

/// What the session records for a choice, so the reply can be recognised when it comes back.
pub fn sampled_choice(
    reply: &ChoiceReply,
    generation: Generation,
    backend: &std::sync::Arc<str>,
) -> SampledChoice {
    let tool_calls: Vec<IssuedToolCall> = reply
        .tool_calls
        .iter()
        .map(|(id, name, arguments)| IssuedToolCall {
            id: id.clone(),
            call_hash: tool_call_hash(
                name,
                &serde_json::from_str(arguments)
                    .unwrap_or_else(|_| Value::String(arguments.clone())),
            ),
        })
        .collect();
    let content = reply.content.as_deref().unwrap_or("");
    let mut fingerprints = vec![message_fingerprint(
        content,
        tool_calls.iter().map(|c| c.id.as_str()),
    )];
    if !tool_calls.is_empty() || reply.reasoning.is_some() {
        // A client may also send the raw text back instead of structured calls.
        fingerprints.push(message_fingerprint(&reply.text, std::iter::empty()));
    }
    SampledChoice {
        generation,
        end_token_text: reply.end_token_text.clone(),
        tool_calls,
        fingerprints,
        backend: backend.clone(),
        nudge: None,
    }
}

/// OpenAI chat `logprobs.content` from the backend's values.
pub fn chat_logprobs(tokenizer: &Tokenizer, generation: &Generation) -> Value {
    let entry = |id: u32, logprob: f32| {
        let token = tokenizer.decode(&[id]);
        json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()})
    };
    let content: Vec<Value> = generation
        .token_ids
        .iter()
        .zip(&generation.logprobs)
        .enumerate()
        .map(|(i, (&id, &logprob))| {
            let mut item = entry(id, logprob);
            let top = generation
                .top_logprobs
                .as_ref()
                .and_then(|t| t.get(i))
                .map(|alts| {
                    alts.iter()
                        .map(|&(id, lp)| entry(id, lp))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            item["top_logprobs"] = Value::Array(top);
            item
        })
        .collect();
    json!({ "content": content })
}

/// The reply around `choices`: id, object, created, model and usage.
pub fn envelope(
    object: &str,
    id_prefix: &str,
    model: &str,
    choices: Vec<Value>,
    prompt_tokens: usize,
    completion_tokens: usize,
) -> Value {
    json!({
        "id": format!("{id_prefix}-{}", uuid::Uuid::new_v4().simple()),
        "object": object,
        "created": crate::session::now_seconds() as u64,
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    })
}

/// `body` serialised, with the prompt's ids as `prompt_token_ids` when the client asked for
/// them (`return_token_ids`, as in vLLM): a long prompt's ids are most of a reply's bytes.
pub fn with_prompt_ids(body: &Value, request: &ChatRequest, prompt_ids: &[u32]) -> Vec<u8> {
    if request.return_token_ids {
        json_with_ids(body, "prompt_token_ids", prompt_ids)
    } else {
        serde_json::to_vec(body).unwrap_or_default()
    }
}

/// `body` (a JSON object) serialised with `key: ids` added last, the ids written straight
/// from the slice: a long prompt costs no JSON value per token.
pub fn json_with_ids(body: &Value, key: &str, ids: &[u32]) -> Vec<u8> {
    let mut out = serde_json::to_vec(body).unwrap_or_default();
    if out.last() == Some(&b'}') {
        out.pop();
        if out.len() > 1 {
            out.push(b',');
        }
        let _ = serde_json::to_writer(&mut out, key);
        out.push(b':');
        let _ = serde_json::to_writer(&mut out, ids);
        out.push(b'}');
    }
    out
}

/// A 200 reply carrying already serialised JSON.
pub fn json_response(body: Vec<u8>) -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok()
        .content_type("application/json")
        .body(body)
}

/// The `message` object of a chat choice.
pub fn chat_message(reply: &ChoiceReply) -> Value {
    let mut message = json!({"role": "assistant", "content": reply.content});
    if let Some(reasoning) = &reply.reasoning {
        message["reasoning_content"] = json!(reasoning);
    }
    if !reply.tool_calls.is_empty() {
        message["tool_calls"] = reply
            .tool_calls
            .iter()
            .map(|(id, name, arguments)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
            })
            .collect();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_written_last_into_the_object() {
        let out = json_with_ids(&json!({"a": 1}), "ids", &[3, 4]);
        assert_eq!(
            serde_json::from_slice::<Value>(&out).unwrap(),
            json!({"a": 1, "ids": [3, 4]})
        );
        let out = json_with_ids(&json!({}), "ids", &[]);
        assert_eq!(std::str::from_utf8(&out).unwrap(), r#"{"ids":[]}"#);
    }
}
