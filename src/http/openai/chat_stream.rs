//! A streamed chat turn as OpenAI `chat.completion.chunk` events: a role chunk per choice, one
//! chunk per delta (the first of a backend event's chunks carries its token ids, and logprobs
//! when asked), a last chunk per choice with its finish reason, an optional usage chunk, then
//! `data: [DONE]`. Failures after the stream began arrive as an `error` event.

use super::request::ReplyOptions;
use super::{ChatLogprobs, ToolCallOut, Usage, chat_logprobs};
use crate::generation::StopMatch;
use crate::http::body::json_with_ids;
use crate::http::{ApiError, AppState, sse};
use crate::tokenizer::Tokenizer;
use crate::turn::{Delta, SampledTokens, TurnEvent, TurnStream};
use actix_web::HttpResponse;
use bytes::Bytes;
use serde::Serialize;
use std::sync::Arc;

/// The event stream of `turn`.
pub fn respond(state: &AppState, options: ReplyOptions, turn: TurnStream) -> HttpResponse {
    let mut writer = ChunkWriter {
        id: format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
        created: crate::session::now_seconds() as u64,
        model: state.model_name.clone(),
        tokenizer: state.pipeline.context.tokenizer.clone(),
        options,
        choices: turn.choices,
        prompt_ids: options.return_token_ids.then(|| turn.prompt_ids.clone()),
    };
    sse::respond(Bytes::new(), turn, move |event| writer.write(event))
}

/// Writes a turn's events as chunks.
struct ChunkWriter {
    id: String,
    created: u64,
    model: String,
    tokenizer: Arc<Tokenizer>,
    options: ReplyOptions,
    choices: usize,
    /// Written into the first role chunk, when the client asked for them.
    prompt_ids: Option<Arc<Vec<u32>>>,
}

/// One `chat.completion.chunk`.
#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: &'a [ChunkChoice<'a>],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: usize,
    delta: DeltaOut<'a>,
    logprobs: Option<ChatLogprobs<'a>>,
    finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_ids: Option<&'a [u32]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_reason: Option<&'a StopMatch>,
}

#[derive(Serialize, Default)]
struct DeltaOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[CallDelta<'a>; 1]>,
}

#[derive(Serialize)]
struct CallDelta<'a> {
    index: usize,
    #[serde(flatten)]
    call: ToolCallOut<'a>,
}

impl<'a> DeltaOut<'a> {
    fn of(delta: &'a Delta) -> Self {
        match delta {
            Delta::Reasoning(text) => Self {
                reasoning_content: Some(text),
                ..Self::default()
            },
            Delta::Text(text) => Self {
                content: Some(text),
                ..Self::default()
            },
            Delta::Call { index, call } => Self {
                tool_calls: Some([CallDelta {
                    index: *index,
                    call: ToolCallOut::of(call),
                }]),
                ..Self::default()
            },
        }
    }
}

impl ChunkWriter {
    fn write(&mut self, event: TurnEvent) -> Bytes {
        let mut out = Vec::new();
        match event {
            TurnEvent::Opened => {
                let prompt_ids = self.prompt_ids.take();
                for index in 0..self.choices {
                    let role = DeltaOut {
                        role: Some("assistant"),
                        content: Some(""),
                        ..DeltaOut::default()
                    };
                    let choices = [self.choice(index, role, None)];
                    let chunk = self.chunk(&choices, None);
                    match prompt_ids.as_deref().filter(|_| index == 0) {
                        Some(ids) => {
                            out.extend_from_slice(b"data: ");
                            out.extend(json_with_ids(&chunk, "prompt_token_ids", ids));
                            out.extend_from_slice(b"\n\n");
                        }
                        None => sse::data(&mut out, &chunk),
                    }
                }
            }
            TurnEvent::Sampled {
                choice,
                tokens,
                deltas,
            } => self.write_deltas(&mut out, choice, &deltas, Some(&tokens)),
            TurnEvent::Finished {
                choice,
                deltas,
                finish,
                stop,
            } => {
                self.write_deltas(&mut out, choice, &deltas, None);
                let mut last = self.choice(choice, DeltaOut::default(), None);
                last.finish_reason = Some(finish.as_openai());
                last.stop_reason = stop.as_ref();
                sse::data(&mut out, &self.chunk(&[last], None));
            }
            TurnEvent::KeepAlive => out.extend_from_slice(b": keep-alive\n\n"),
            TurnEvent::Done(usage) => {
                if self.options.include_usage {
                    sse::data(&mut out, &self.chunk(&[], Some(Usage::from(&usage))));
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
            TurnEvent::Failed(error) => {
                sse::data(&mut out, &ApiError::from(error).body());
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
        }
        Bytes::from(out)
    }

    /// A choice's deltas; the first carries the sampled token ids (and logprobs), or an empty
    /// delta does when all their text is held back.
    fn write_deltas(
        &self,
        out: &mut Vec<u8>,
        index: usize,
        deltas: &[Delta],
        mut tokens: Option<&SampledTokens>,
    ) {
        if deltas.is_empty() {
            if let Some(tokens) = tokens {
                let choice = self.choice(index, DeltaOut::default(), Some(tokens));
                sse::data(out, &self.chunk(&[choice], None));
            }
            return;
        }
        for delta in deltas {
            let choice = self.choice(index, DeltaOut::of(delta), tokens.take());
            sse::data(out, &self.chunk(&[choice], None));
        }
    }

    fn choice<'a>(
        &'a self,
        index: usize,
        delta: DeltaOut<'a>,
        tokens: Option<&'a SampledTokens>,
    ) -> ChunkChoice<'a> {
        ChunkChoice {
            index,
            delta,
            logprobs: tokens
                .filter(|_| self.options.logprobs)
                .map(|tokens| chat_logprobs(&self.tokenizer, tokens)),
            finish_reason: None,
            token_ids: tokens.map(|tokens| tokens.token_ids.as_slice()),
            stop_reason: None,
        }
    }

    fn chunk<'a>(&'a self, choices: &'a [ChunkChoice<'a>], usage: Option<Usage>) -> Chunk<'a> {
        Chunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            choices,
            usage,
        }
    }
}
