//! One choice of a streamed turn: its token ids become text, the text is split into reasoning,
//! content and tool calls, and each piece becomes an OpenAI delta.

use crate::backend::{FinishReason, Generation, StopMatch};
use crate::chat::ChatRequest;
use crate::http::response::{CallIds, ChoiceReply, visible_text};
use crate::reasoning::{Part, ReasoningStream};
use crate::tokenizer::{TextStream, Tokenizer};
use crate::tools::ToolParser;
use crate::tools::streaming::{CallStream, Piece};
use serde_json::{Value, json};
use std::sync::Arc;

/// The streaming state of one choice.
pub struct ChoiceStream<'t> {
    tokenizer: &'t Tokenizer,
    text: TextStream<'t>,
    calls: CallStream,
    /// Present when the session returns reasoning separately.
    thinking: Option<ReasoningStream>,
    parallel_tool_calls: bool,
    /// Everything sampled so far.
    pub generation: Generation,
    /// What the client has been sent so far.
    pub reply: ChoiceReply,
    pub backend: Arc<str>,
}

/// One piece of streamed output.
enum Out {
    Reasoning(String),
    Piece(Piece),
}

impl<'t> ChoiceStream<'t> {
    /// `reasoning`: see `reasoning_mode`.
    pub fn new(
        tokenizer: &'t Tokenizer,
        parser: Arc<dyn ToolParser>,
        request: &ChatRequest,
        reasoning: Option<bool>,
        backend: Arc<str>,
    ) -> Self {
        let shown = tokenizer.special_ids(parser.markers());
        Self {
            tokenizer,
            text: tokenizer.text_stream(shown),
            calls: CallStream::new(parser, request.promoter(), request.params.stop.clone()),
            thinking: reasoning.map(ReasoningStream::new),
            parallel_tool_calls: request.parallel_tool_calls,
            generation: Generation::new(Vec::new(), Vec::new(), FinishReason::Length),
            reply: ChoiceReply {
                content: None,
                reasoning: None,
                tool_calls: Vec::new(),
                finish_reason: "length",
                text: String::new(),
                end_token_text: None,
            },
            backend,
        }
    }

    /// The deltas that newly sampled `token_ids` allow to be sent (possibly none: held text).
    pub fn push_tokens(&mut self, token_ids: &[u32], ids: &mut CallIds) -> Vec<Value> {
        let text = self.text.push(token_ids);
        self.reply.text.push_str(&text);
        let pieces = match &mut self.thinking {
            Some(thinking) => route_parts(thinking.push(&text), &mut self.calls),
            None => self.calls.push(&text).into_iter().map(Out::Piece).collect(),
        };
        self.deltas(pieces, ids)
    }

    /// The deltas of everything still held once the sample is complete; fixes the reply's
    /// finish reason.
    pub fn finish(&mut self, ids: &mut CallIds) -> Vec<Value> {
        let stop = match &self.generation.stop {
            Some(StopMatch::Text(s)) => Some(s.clone()),
            _ => None,
        };
        let mut rest = match &mut self.thinking {
            Some(thinking) => route_parts(thinking.finish(), &mut self.calls),
            None => Vec::new(),
        };
        rest.extend(
            self.calls
                .finish(stop.as_deref())
                .into_iter()
                .map(Out::Piece),
        );
        let deltas = self.deltas(rest, ids);
        if let Some(stop) = stop
            && let Some(at) = self.reply.text.rfind(&stop)
        {
            self.reply.text.truncate(at);
        }
        self.reply.end_token_text = visible_text(self.tokenizer, &self.generation, &[]).1;
        self.reply.finish_reason = match self.generation.finish_reason {
            // A sample cut by the length limit is never reported as a finished tool call.
            FinishReason::Stop if !self.reply.tool_calls.is_empty() => "tool_calls",
            other => other.as_str(),
        };
        deltas
    }

    fn deltas(&mut self, pieces: Vec<Out>, ids: &mut CallIds) -> Vec<Value> {
        let reply = &mut self.reply;
        pieces
            .into_iter()
            .map(|piece| match piece {
                Out::Reasoning(text) => {
                    append(&mut reply.reasoning, &text);
                    json!({"reasoning_content": text})
                }
                Out::Piece(Piece::Text(text)) => {
                    append(&mut reply.content, &text);
                    json!({"content": text})
                }
                // parallel_tool_calls=false: later calls are dropped (their tokens still travel).
                Out::Piece(Piece::Call(_))
                    if !self.parallel_tool_calls && !reply.tool_calls.is_empty() =>
                {
                    json!({})
                }
                Out::Piece(Piece::Call(call)) => {
                    let id = ids.issue();
                    let index = reply.tool_calls.len();
                    let delta = json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments}}]});
                    reply.tool_calls.push((id, call.name, call.arguments));
                    delta
                }
            })
            .collect()
    }
}

fn append(field: &mut Option<String>, text: &str) {
    field.get_or_insert_with(String::new).push_str(text);
}

fn route_parts(parts: Vec<Part>, calls: &mut CallStream) -> Vec<Out> {
    parts
        .into_iter()
        .flat_map(|part| match part {
            Part::Reasoning(text) => vec![Out::Reasoning(text)],
            Part::Content(text) => calls.push(&text).into_iter().map(Out::Piece).collect(),
        })
        .collect()
}
