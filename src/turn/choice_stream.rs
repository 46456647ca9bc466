//! One choice of a turn: its token ids become text, the text is split into reasoning, content
//! and tool calls, and each piece becomes a [`Delta`]. This is the one place a reply is shaped:
//! a streamed choice is fed as its tokens arrive, a whole one in one piece ([`shape`]).

use super::TurnRequest;
use super::reply::{
    CallIds, Finish, Reply, ReturnedCall, cut_at_stop, end_token_text, shown_markers,
};
use crate::generation::{FinishReason, Generation, StopMatch, StreamEvent};
use crate::reasoning::{Part, ReasoningStream, ReasoningSyntax};
use crate::tokenizer::{TextStream, Tokenizer};
use crate::tools::streaming::{CallStream, Piece};
use crate::tools::{Promoter, ToolParser};
use std::sync::Arc;

/// A piece of a choice's reply, in document order.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    /// Reasoning text (only when the session returns reasoning separately).
    Reasoning(String),
    /// Visible text.
    Text(String),
    /// A tool call, complete: sent once its markup is. `index` counts the choice's calls.
    Call {
        /// Position among the choice's calls.
        index: usize,
        /// The call.
        call: ReturnedCall,
    },
}

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
    pub reply: Reply,
    /// The backend sampling it.
    pub backend: Arc<str>,
}

/// One piece of streamed output.
enum Out {
    Reasoning(String),
    Piece(Piece),
}

impl<'t> ChoiceStream<'t> {
    /// `reasoning`: how the reply marks reasoning when it is returned apart. A conversation's
    /// reply is read for tool calls in `parser`'s format; a text prompt's is its visible text.
    pub fn new(
        tokenizer: &'t Tokenizer,
        parser: Arc<dyn ToolParser>,
        request: TurnRequest<'_>,
        reasoning: Option<ReasoningSyntax>,
        backend: Arc<str>,
    ) -> Self {
        let (shown, promoter, stops, parallel_tool_calls) = match request {
            TurnRequest::Chat(request) => (
                shown_markers(tokenizer, parser.as_ref(), reasoning),
                request.promoter(),
                request.params.stop.clone(),
                request.calls.parallel,
            ),
            TurnRequest::Text(request) => (
                Vec::new(),
                Promoter::new(None, &[], false),
                request.params.stop.clone(),
                true,
            ),
        };
        Self {
            tokenizer,
            text: tokenizer.text_stream(shown),
            calls: CallStream::new(parser, promoter, stops),
            thinking: reasoning.map(ReasoningStream::new),
            parallel_tool_calls,
            generation: Generation::new(Vec::new(), Vec::new(), FinishReason::Length),
            reply: Reply {
                content: None,
                reasoning: None,
                tool_calls: Vec::new(),
                finish: Finish::Length,
                text: String::new(),
                end_token_text: None,
                tool_outcomes: Default::default(),
            },
            backend,
        }
    }

    /// The deltas that newly sampled `token_ids` allow to be sent (possibly none: held text).
    pub fn push_tokens(&mut self, token_ids: &[u32], ids: &mut CallIds) -> Vec<Delta> {
        let text = self.text.push(token_ids);
        self.reply.text.push_str(&text);
        let pieces = match &mut self.thinking {
            Some(thinking) => route_parts(thinking.push(&text), &mut self.calls),
            None => self.calls.push(&text).into_iter().map(Out::Piece).collect(),
        };
        self.deltas(pieces, ids)
    }

    /// Takes a whole sample's ids in one piece: the text is split from its reasoning now and
    /// read for calls once, when the choice finishes.
    pub fn push_whole(&mut self, token_ids: &[u32], ids: &mut CallIds) -> Vec<Delta> {
        let text = self.text.push(token_ids);
        self.reply.text.push_str(&text);
        let Some(thinking) = &mut self.thinking else {
            self.calls.hold(&text);
            return Vec::new();
        };
        let mut reasoning = Vec::new();
        for part in thinking.push(&text) {
            match part {
                Part::Reasoning(text) => reasoning.push(Out::Reasoning(text)),
                Part::Content(text) => self.calls.hold(&text),
            }
        }
        self.deltas(reasoning, ids)
    }

    /// The deltas of everything still held once the sample is complete; fixes the reply's
    /// finish.
    pub fn finish(&mut self, ids: &mut CallIds) -> Vec<Delta> {
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
        let reply = &mut self.reply;
        if self.thinking.as_ref().is_some_and(|t| t.has_empty_block()) {
            reply.reasoning.get_or_insert_default();
        }
        // A reply without calls is all content, however little; around calls, whitespace
        // alone is none.
        match reply.tool_calls.is_empty() {
            true => {
                reply.content.get_or_insert_default();
            }
            false
                if reply
                    .content
                    .as_deref()
                    .is_some_and(|c| c.trim().is_empty()) =>
            {
                reply.content = None
            }
            false => {}
        }
        cut_at_stop(&mut self.reply.text, self.generation.stop.as_ref());
        self.reply.end_token_text = end_token_text(self.tokenizer, &self.generation);
        self.reply.tool_outcomes = self.calls.outcomes();
        self.reply.finish = Finish::of(
            self.generation.finish_reason,
            !self.reply.tool_calls.is_empty(),
        );
        deltas
    }

    /// The reply to a whole sample, fed in one piece.
    pub fn whole(mut self, generation: Generation, ids: &mut CallIds) -> Reply {
        for event in generation.into_events() {
            if let StreamEvent::Tokens { token_ids, .. } = &event {
                self.push_whole(token_ids, ids);
            }
            self.generation.apply(event);
        }
        self.finish(ids);
        self.reply
    }

    fn deltas(&mut self, pieces: Vec<Out>, ids: &mut CallIds) -> Vec<Delta> {
        let reply = &mut self.reply;
        pieces
            .into_iter()
            .filter_map(|piece| match piece {
                Out::Reasoning(text) => {
                    append(&mut reply.reasoning, &text);
                    Some(Delta::Reasoning(text))
                }
                Out::Piece(Piece::Text(text)) => {
                    append(&mut reply.content, &text);
                    Some(Delta::Text(text))
                }
                // parallel_tool_calls=false: later calls are dropped (their tokens still travel).
                Out::Piece(Piece::Call(_))
                    if !self.parallel_tool_calls && !reply.tool_calls.is_empty() =>
                {
                    None
                }
                Out::Piece(Piece::Call(call)) => {
                    let call = ReturnedCall {
                        id: ids.issue(),
                        name: call.name,
                        arguments: call.arguments,
                        offset: reply.content.as_ref().map_or(0, String::len),
                        healed_from: call.healed_from,
                    };
                    let index = reply.tool_calls.len();
                    reply.tool_calls.push(call.clone());
                    Some(Delta::Call { index, call })
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
