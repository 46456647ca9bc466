//! Turning sampled ids into OpenAI replies: visible text, tool calls, logprobs.

use crate::backend::{FinishReason, Generation, StopMatch};
use crate::chat::ChatRequest;
use crate::session::IssuedToolCall;
use crate::session::completion::{message_fingerprint, tool_call_hash};
use crate::tokenizer::Tokenizer;
use crate::tools::ToolParser;
use crate::turn::SampledChoice;
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::Value;

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

/// OpenAI chat `logprobs` of a generation: `{"content": [...]}`, one entry per sampled token.
/// Serialised straight from the ids: a reply carries one entry per token, which as JSON
/// values cost a map and a number per byte of each token.
#[derive(Debug)]
pub struct ChatLogprobs<'a> {
    tokenizer: &'a Tokenizer,
    generation: &'a Generation,
}

/// The `logprobs` of a chat choice.
pub fn chat_logprobs<'a>(tokenizer: &'a Tokenizer, generation: &'a Generation) -> ChatLogprobs<'a> {
    ChatLogprobs {
        tokenizer,
        generation,
    }
}

impl Serialize for ChatLogprobs<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let generation = self.generation;
        let entries = generation
            .token_ids
            .iter()
            .zip(&generation.logprobs)
            .enumerate()
            .map(|(i, (&id, &logprob))| {
                let alternatives = generation
                    .top_logprobs
                    .as_ref()
                    .and_then(|t| t.get(i))
                    .map_or(&[][..], Vec::as_slice);
                TokenLogprob {
                    tokenizer: self.tokenizer,
                    id,
                    logprob,
                    alternatives: Some(alternatives),
                }
            });
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry("content", &SerializeIter::new(entries))?;
        map.end()
    }
}

/// One `logprobs.content` entry: `token`, `logprob`, `bytes`, and `top_logprobs` (absent in
/// the entries of `top_logprobs` themselves).
struct TokenLogprob<'a> {
    tokenizer: &'a Tokenizer,
    id: u32,
    logprob: f32,
    alternatives: Option<&'a [(u32, f32)]>,
}

impl Serialize for TokenLogprob<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let token = self.tokenizer.decode(&[self.id]);
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("token", &token)?;
        // As f64, the form replies have always had (the float widened, not re-rounded).
        map.serialize_entry("logprob", &f64::from(self.logprob))?;
        map.serialize_entry("bytes", &SerializeIter::new(token.bytes()))?;
        if let Some(alternatives) = self.alternatives {
            let entries = alternatives.iter().map(|&(id, logprob)| TokenLogprob {
                tokenizer: self.tokenizer,
                id,
                logprob,
                alternatives: None,
            });
            map.serialize_entry("top_logprobs", &SerializeIter::new(entries))?;
        }
        map.end()
    }
}

/// An iterator serialised as a JSON array (once).
struct SerializeIter<I>(std::cell::Cell<Option<I>>);

impl<I> SerializeIter<I> {
    fn new(items: I) -> Self {
        Self(std::cell::Cell::new(Some(items)))
    }
}

impl<I: Iterator> Serialize for SerializeIter<I>
where
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0.take() {
            Some(items) => serializer.collect_seq(items),
            None => serializer.collect_seq(std::iter::empty::<I::Item>()),
        }
    }
}

/// The reply around `choices`: id, object, created, model and usage.
#[derive(Debug, Serialize)]
pub struct Envelope<'a, C> {
    id: String,
    object: &'a str,
    created: u64,
    model: &'a str,
    choices: Vec<C>,
    usage: Usage,
}

/// Token counts of a reply.
#[derive(Debug, Serialize)]
struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
}

/// The reply around `choices`, with a fresh id `{id_prefix}-…`.
pub fn envelope<'a, C>(
    object: &'a str,
    id_prefix: &str,
    model: &'a str,
    choices: Vec<C>,
    prompt_tokens: usize,
    completion_tokens: usize,
) -> Envelope<'a, C> {
    Envelope {
        id: format!("{id_prefix}-{}", uuid::Uuid::new_v4().simple()),
        object,
        created: crate::session::now_seconds() as u64,
        model,
        choices,
        usage: Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        },
    }
}

/// `body` serialised, with the prompt's ids as `prompt_token_ids` when the client asked for
/// them (`return_token_ids`, as in vLLM): a long prompt's ids are most of a reply's bytes.
pub fn with_prompt_ids(
    body: &impl Serialize,
    request: &ChatRequest,
    prompt_ids: &[u32],
) -> Vec<u8> {
    if request.return_token_ids {
        json_with_ids(body, "prompt_token_ids", prompt_ids)
    } else {
        serde_json::to_vec(body).unwrap_or_default()
    }
}

/// `body` (a JSON object) serialised with `key: ids` added last, the ids written straight
/// from the slice: a long prompt costs no JSON value per token.
pub fn json_with_ids(body: &impl Serialize, key: &str, ids: &[u32]) -> Vec<u8> {
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

/// One choice of a chat reply.
#[derive(Debug, Serialize)]
pub struct ChatChoice<'a> {
    pub index: usize,
    pub message: ChatReplyMessage<'a>,
    pub finish_reason: &'a str,
    pub logprobs: Option<ChatLogprobs<'a>>,
    pub token_ids: &'a [u32],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<&'a StopMatch>,
}

/// The `message` object of a chat choice.
#[derive(Debug, Serialize)]
pub struct ChatReplyMessage<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tool_calls: Vec<ToolCallOut<'a>>,
}

/// A returned tool call, OpenAI-shaped.
#[derive(Debug, Serialize)]
struct ToolCallOut<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionOut<'a>,
}

#[derive(Debug, Serialize)]
struct FunctionOut<'a> {
    name: &'a str,
    arguments: &'a str,
}

/// The `message` of the choice shown for `reply`.
pub fn chat_message(reply: &ChoiceReply) -> ChatReplyMessage<'_> {
    ChatReplyMessage {
        role: "assistant",
        content: reply.content.as_deref(),
        reasoning_content: reply.reasoning.as_deref(),
        tool_calls: reply
            .tool_calls
            .iter()
            .map(|(id, name, arguments)| ToolCallOut {
                id,
                kind: "function",
                function: FunctionOut { name, arguments },
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_chat_choice_is_written_in_openai_field_order() {
        let tokenizer = Tokenizer::from_tokenizer(crate::tokenizer::fixture_tokenizer("qwen3"));
        let (hi, there) = (
            tokenizer.encode("Hi").unwrap()[0],
            tokenizer.encode(" there").unwrap()[0],
        );
        let mut generation = Generation::new(vec![hi], vec![-0.1], FinishReason::Stop);
        generation.top_logprobs = Some(vec![vec![(hi, -0.1), (there, -2.5)]]);
        generation.stop = Some(StopMatch::Token(7));
        let reply = ChoiceReply {
            content: None,
            reasoning: Some("hmm".into()),
            tool_calls: vec![("call_0".into(), "f".into(), "{\"a\":1}".into())],
            finish_reason: "tool_calls",
            text: String::new(),
            end_token_text: None,
        };
        let choice = ChatChoice {
            index: 0,
            message: chat_message(&reply),
            finish_reason: reply.finish_reason,
            logprobs: Some(chat_logprobs(&tokenizer, &generation)),
            token_ids: &generation.token_ids,
            stop_reason: generation.stop.as_ref(),
        };
        // The logprob is the f32 widened to f64, as replies have always shown it.
        let expected = format!(
            r#"{{"index":0,"message":{{"role":"assistant","content":null,"reasoning_content":"hmm","tool_calls":[{{"id":"call_0","type":"function","function":{{"name":"f","arguments":"{{\"a\":1}}"}}}}]}},"finish_reason":"tool_calls","logprobs":{{"content":[{{"token":"Hi","logprob":-0.10000000149011612,"bytes":[72,105],"top_logprobs":[{{"token":"Hi","logprob":-0.10000000149011612,"bytes":[72,105]}},{{"token":" there","logprob":-2.5,"bytes":[32,116,104,101,114,101]}}]}}]}},"token_ids":[{hi}],"stop_reason":7}}"#
        );
        assert_eq!(serde_json::to_string(&choice).unwrap(), expected);

        let plain = ChoiceReply {
            content: Some("ok".into()),
            reasoning: None,
            tool_calls: Vec::new(),
            ..reply
        };
        assert_eq!(
            serde_json::to_value(chat_message(&plain)).unwrap(),
            json!({"role": "assistant", "content": "ok"})
        );
        let no_top = Generation::new(vec![hi], vec![-0.5], FinishReason::Length);
        assert_eq!(
            serde_json::to_value(chat_logprobs(&tokenizer, &no_top)).unwrap(),
            json!({"content": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": []}]})
        );
    }

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
