//! `stream: true` chat turns: OpenAI server-sent events, token by token from the backend's own
//! stream, each chunk carrying the token ids it stands for. The node is committed when the
//! stream ends; a client that disconnects drops the task's channel, which drops the backend
//! stream (cancelling the request) and leaves the session as it was.

use super::response::{ChoiceReply, chat_logprobs, sampled_choice};
use super::{ApiError, AppState};
use crate::backend::{FinishReason, GenerateRequest, Generation, StopMatch, StreamEvent};
use crate::chat::ChatRequest;
use crate::reasoning::{Part, ReasoningStream};
use crate::session::{Session, SessionState, now_seconds};
use crate::tools::ToolParser;
use crate::tools::streaming::{CallStream, Piece};
use crate::turn::{self, Plan};
use actix_web::{HttpResponse, web};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedMutexGuard, mpsc};

/// How often a comment line is written while the backend is silent (a long prefill): it keeps
/// the stream open, and writing is how a client that hung up is noticed, so its backend
/// request is cancelled within about this long.
const KEEP_ALIVE: Duration = Duration::from_millis(400);

/// Starts a streamed turn. Errors before the backend starts (bad template, no backend) are
/// ordinary HTTP errors; after that they arrive as an SSE `error` event.
pub async fn respond(
    state: web::Data<AppState>,
    session: Arc<Session>,
    request: ChatRequest,
    parser: Arc<dyn ToolParser>,
) -> Result<HttpResponse, ApiError> {
    let guard = session.state.clone().lock_owned().await;
    let mut plan = turn::prepare(&state.turn, &guard, &request, session.options.history)?;
    let generate = GenerateRequest {
        prompt: std::mem::take(&mut plan.prompt_ids),
        params: request.params.clone(),
        n: 1,
    };
    let (events, backend) = super::sample_stream(&state, &session, &generate).await?;
    plan.prompt_ids = generate.prompt;
    let (sender, receiver) = mpsc::channel::<Bytes>(64);
    let reasoning = super::reasoning_mode(&state, &session, &plan);
    let turn = StreamedTurn {
        state: state.clone().into_inner(),
        session,
        request,
        parser,
        plan,
        backend,
        sender,
        reasoning,
        id: format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
        created: now_seconds() as u64,
    };
    actix_web::rt::spawn(turn.run(guard, events));
    let body = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver
            .recv()
            .await
            .map(|bytes| (Ok::<_, std::convert::Infallible>(bytes), receiver))
    });
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .streaming(body))
}

/// Everything the task driving one streamed turn needs.
struct StreamedTurn {
    state: Arc<AppState>,
    session: Arc<Session>,
    request: ChatRequest,
    parser: Arc<dyn ToolParser>,
    plan: Plan,
    backend: Arc<str>,
    sender: mpsc::Sender<Bytes>,
    /// `Some(opened)` when reasoning is returned separately (see `reasoning_mode`).
    reasoning: Option<bool>,
    id: String,
    created: u64,
}

/// The client went away.
struct Gone;

/// One piece of streamed output.
enum Out {
    Reasoning(String),
    Piece(Piece),
}

/// Routes new text through the reasoning splitter (when the session uses one), then the
/// tool-call splitter.
fn route(thinking: &mut Option<ReasoningStream>, calls: &mut CallStream, text: &str) -> Vec<Out> {
    match thinking {
        Some(thinking) => route_parts(thinking.push(text), calls),
        None => calls.push(text).into_iter().map(Out::Piece).collect(),
    }
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

impl StreamedTurn {
    async fn run(
        self,
        mut guard: OwnedMutexGuard<SessionState>,
        events: crate::backend::EventStream,
    ) {
        if let Ok(reply) = self.relay(events).await {
            let (generation, reply) = reply;
            let choice = sampled_choice(&reply, generation, &self.backend);
            turn::commit(
                &mut guard,
                &self.plan,
                vec![choice],
                self.session.options.track_tree,
            );
            self.session.set_num_nodes(guard.nodes.len());
            let _ = self
                .sender
                .send(Bytes::from_static(b"data: [DONE]\n\n"))
                .await;
        }
    }

    /// Forwards the backend's events as SSE chunks; returns the whole sample and the reply the
    /// client saw, or `Err` when the client left or the backend failed (nothing to commit).
    async fn relay(
        &self,
        mut events: crate::backend::EventStream,
    ) -> Result<(Generation, ChoiceReply), Gone> {
        let tokenizer = self.state.turn.tokenizer.clone();
        let mut text_stream = tokenizer.text_stream();
        let mut calls = CallStream::new(
            self.parser.clone(),
            self.request.promoter(),
            self.request.params.stop.clone(),
        );
        let mut generation = Generation::new(Vec::new(), Vec::new(), FinishReason::Length);
        let mut thinking = self.reasoning.map(ReasoningStream::new);
        let mut reply = ChoiceReply {
            content: None,
            reasoning: None,
            tool_calls: Vec::new(),
            finish_reason: "length",
            text: String::new(),
            end_token_text: None,
        };
        let mut first = self.chunk(json!({"role": "assistant", "content": ""}), None);
        first["prompt_token_ids"] = json!(self.plan.prompt_ids);
        self.send(&first).await?;
        let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
        keep_alive.tick().await;
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                _ = self.sender.closed() => return Err(Gone),
                _ = keep_alive.tick() => {
                    self.send_raw(Bytes::from_static(b": keep-alive\n\n")).await?;
                    continue;
                }
            };
            let event = match event {
                Some(Ok(event)) => event,
                Some(Err(error)) => return Err(self.fail(&ApiError::from(error)).await),
                None => {
                    let error = ApiError::new(
                        actix_web::http::StatusCode::BAD_GATEWAY,
                        "upstream_error",
                        "the backend's stream ended before the sample finished",
                    );
                    return Err(self.fail(&error).await);
                }
            };
            let finished = matches!(event, StreamEvent::Finished { .. });
            if let StreamEvent::Tokens {
                token_ids,
                logprobs,
                top_logprobs,
            } = &event
            {
                let text = text_stream.push(token_ids);
                reply.text.push_str(&text);
                let pieces = route(&mut thinking, &mut calls, &text);
                let delta = Generation {
                    top_logprobs: top_logprobs.clone(),
                    ..Generation::new(token_ids.clone(), logprobs.clone(), FinishReason::Stop)
                };
                self.send_pieces(&mut reply, pieces, Some(&delta)).await?;
            }
            generation.apply(event);
            if finished {
                break;
            }
        }
        let stop = match &generation.stop {
            Some(StopMatch::Text(s)) => Some(s.as_str()),
            _ => None,
        };
        let mut rest = match &mut thinking {
            Some(thinking) => route_parts(thinking.finish(), &mut calls),
            None => Vec::new(),
        };
        rest.extend(calls.finish(stop).into_iter().map(Out::Piece));
        self.send_pieces(&mut reply, rest, None).await?;
        if let Some(stop) = stop
            && let Some(at) = reply.text.rfind(stop)
        {
            reply.text.truncate(at);
        }
        let (_, end_token_text) = super::response::visible_text(&tokenizer, &generation);
        reply.end_token_text = end_token_text;
        reply.finish_reason = match generation.finish_reason {
            FinishReason::Stop if !reply.tool_calls.is_empty() => "tool_calls",
            other => other.as_str(),
        };
        let mut last = self.chunk(json!({}), Some(reply.finish_reason));
        if let Some(stop) = &generation.stop {
            last["choices"][0]["stop_reason"] = json!(stop);
        }
        self.send(&last).await?;
        if self.request.include_usage {
            let prompt = self.plan.prompt_ids.len();
            let completion = generation.token_ids.len();
            let usage = json!({
                "id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.state.model_name, "choices": [],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
            });
            self.send(&usage).await?;
        }
        Ok((generation, reply))
    }

    /// Sends the pieces of one backend event; the first chunk carries the event's token ids
    /// (and logprobs), or an empty delta does when all its text is held back.
    async fn send_pieces(
        &self,
        reply: &mut ChoiceReply,
        pieces: Vec<Out>,
        tokens: Option<&Generation>,
    ) -> Result<(), Gone> {
        let mut tokens = tokens;
        if pieces.is_empty() {
            if let Some(delta) = tokens {
                let chunk = self.with_tokens(self.chunk(json!({}), None), delta);
                self.send(&chunk).await?;
            }
            return Ok(());
        }
        for piece in pieces {
            let delta = match piece {
                Out::Reasoning(text) => {
                    reply
                        .reasoning
                        .get_or_insert_with(String::new)
                        .push_str(&text);
                    json!({"reasoning_content": text})
                }
                Out::Piece(Piece::Text(text)) => {
                    reply
                        .content
                        .get_or_insert_with(String::new)
                        .push_str(&text);
                    json!({"content": text})
                }
                // parallel_tool_calls=false: later calls are dropped (their ids still travel).
                Out::Piece(Piece::Call(_))
                    if !self.request.parallel_tool_calls && !reply.tool_calls.is_empty() =>
                {
                    json!({})
                }
                Out::Piece(Piece::Call(call)) => {
                    let id = super::response::new_call_id();
                    let index = reply.tool_calls.len();
                    let delta = json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments}}]});
                    reply.tool_calls.push((id, call.name, call.arguments));
                    delta
                }
            };
            let mut chunk = self.chunk(delta, None);
            if let Some(delta) = tokens.take() {
                chunk = self.with_tokens(chunk, delta);
            }
            self.send(&chunk).await?;
        }
        Ok(())
    }

    fn with_tokens(&self, mut chunk: Value, delta: &Generation) -> Value {
        chunk["choices"][0]["token_ids"] = json!(delta.token_ids);
        if self.request.logprobs {
            chunk["choices"][0]["logprobs"] = chat_logprobs(&self.state.turn.tokenizer, delta);
        }
        chunk
    }

    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.state.model_name,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}],
        })
    }

    async fn send(&self, chunk: &Value) -> Result<(), Gone> {
        self.send_raw(Bytes::from(format!("data: {chunk}\n\n")))
            .await
    }

    async fn send_raw(&self, bytes: Bytes) -> Result<(), Gone> {
        self.sender.send(bytes).await.map_err(|_| Gone)
    }

    /// Reports a failure after the stream started: an `error` event, then `[DONE]`.
    async fn fail(&self, error: &ApiError) -> Gone {
        let event = json!({"error": {"message": error.message, "type": error.kind, "code": error.status.as_u16()}});
        let _ = self.send(&event).await;
        let _ = self.send_raw(Bytes::from_static(b"data: [DONE]\n\n")).await;
        Gone
    }
}
