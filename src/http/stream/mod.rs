//! `stream: true` chat turns: OpenAI server-sent events, token by token from the backend's own
//! stream, each chunk carrying the token ids it stands for. The node is committed when the
//! stream ends; a client that disconnects drops the task's channel, which drops the backend
//! streams (cancelling the requests) and leaves the session as it was.

mod choice;

use super::response::{CallIds, chat_logprobs, sampled_choice, with_prompt_ids};
use super::{ApiError, AppState};
use crate::backend::{EventStream, GenerateRequest, Generation, StreamEvent};
use crate::chat::ChatRequest;
use crate::session::{Session, SessionState, now_seconds};
use crate::tools::ToolParser;
use crate::turn::{self, Plan};
use actix_web::{HttpResponse, web};
use bytes::Bytes;
use choice::ChoiceStream;
use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedMutexGuard, mpsc};

/// How often a comment line is written while the backend is silent (a long prefill, a wait in
/// the pool's queue): it keeps the stream open, and writing is how a client that hung up is
/// noticed, so its backend request is cancelled within about this long.
const KEEP_ALIVE: Duration = Duration::from_millis(400);

/// How long the HTTP response waits for the backend streams to open. Within it a refusal
/// (429, 503, 502) is an ordinary HTTP error; a longer wait (a full pool's queue) happens
/// inside the event stream, with keep-alives, and a refusal then arrives as an `error` event.
const OPEN_GRACE: Duration = Duration::from_secs(1);

/// The backend streams of a turn's choices, each with the backend serving it.
type Opened = Vec<(EventStream, Arc<str>)>;
type Opening = BoxFuture<'static, Result<Opened, ApiError>>;

/// Starts a streamed turn. Errors before the backend starts (bad template, no backend) are
/// ordinary HTTP errors; after that they arrive as an SSE `error` event.
pub async fn respond(
    state: web::Data<AppState>,
    session: Arc<Session>,
    request: ChatRequest,
    parser: Arc<dyn ToolParser>,
) -> Result<HttpResponse, ApiError> {
    let guard = session.state.clone().lock_owned().await;
    let plan = super::plan_turn(&state, &session, &guard, &request, parser.as_ref())?;
    let mut opening = open_streams(&state, &session, &request, &plan);
    let opened = match tokio::time::timeout(OPEN_GRACE, &mut opening).await {
        Ok(opened) => Some(opened?),
        Err(_) => None,
    };
    let (sender, receiver) = mpsc::channel::<Bytes>(64);
    let turn = StreamedTurn {
        reasoning: super::reasoning_mode(&state, &session, &plan),
        calls: CallIds::after(guard.issued_calls),
        state: state.clone().into_inner(),
        session,
        request,
        parser,
        plan,
        sender,
        id: format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
        created: now_seconds() as u64,
    };
    actix_web::rt::spawn(turn.run(guard, opened.ok_or(opening)));
    let body = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver
            .recv()
            .await
            .map(|bytes| (Ok::<_, std::convert::Infallible>(bytes), receiver))
    });
    // The charset is explicit: without one, clients such as Python `requests` decode an
    // event stream as Latin-1.
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream; charset=utf-8")
        .insert_header(("Cache-Control", "no-cache"))
        .streaming(body))
}

/// Opens one backend stream per choice. With a seed, choice `i` samples with `seed + i` (the
/// streams are separate requests, and equal seeds would give equal samples).
fn open_streams(
    state: &web::Data<AppState>,
    session: &Arc<Session>,
    request: &ChatRequest,
    plan: &Plan,
) -> Opening {
    let requests: Vec<GenerateRequest> = (0..request.n)
        .map(|i| {
            let mut params = request.params.clone();
            params.seed = params.seed.map(|seed| seed + i64::from(i));
            GenerateRequest {
                prompt: plan.prompt_ids.clone(),
                params,
                n: 1,
            }
        })
        .collect();
    let (state, session) = (state.clone(), session.clone());
    Box::pin(async move {
        let opening = requests
            .iter()
            .map(|generate| super::sample_stream(&state, &session, generate));
        futures::future::try_join_all(opening).await
    })
}

/// Everything the task driving one streamed turn needs.
struct StreamedTurn {
    state: Arc<AppState>,
    session: Arc<Session>,
    request: ChatRequest,
    parser: Arc<dyn ToolParser>,
    plan: Plan,
    sender: mpsc::Sender<Bytes>,
    /// `Some(opened)` when reasoning is returned separately (see `reasoning_mode`).
    reasoning: Option<bool>,
    calls: CallIds,
    id: String,
    created: u64,
}

/// The client went away, or the turn failed and the client was told.
struct Gone;

impl StreamedTurn {
    async fn run(
        mut self,
        mut guard: OwnedMutexGuard<SessionState>,
        opened: Result<Opened, Opening>,
    ) {
        let opened = match opened {
            Ok(opened) => Ok(opened),
            Err(opening) => self.wait_for(opening).await,
        };
        let Ok(streams) = opened else { return };
        let Ok(choices) = self.relay(streams).await else {
            return;
        };
        turn::commit(
            &mut guard,
            &self.plan,
            choices,
            self.session.options.track_tree,
        );
        self.session.set_num_nodes(guard.nodes.len());
        let _ = self.send_raw(Bytes::from_static(b"data: [DONE]\n\n")).await;
    }

    /// Waits for the backend streams to open, with keep-alives; gives up when the client leaves.
    async fn wait_for(&self, mut opening: Opening) -> Result<Opened, Gone> {
        let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
        loop {
            tokio::select! {
                opened = &mut opening => return match opened {
                    Ok(opened) => Ok(opened),
                    Err(error) => Err(self.fail(&error).await),
                },
                _ = self.sender.closed() => return Err(Gone),
                _ = keep_alive.tick() => self.keep_alive().await?,
            }
        }
    }

    /// Forwards the backends' events as SSE chunks; returns the sampled choices once every
    /// one has finished, or `Err` when the client left or a backend failed (nothing to commit).
    async fn relay(&mut self, streams: Opened) -> Result<Vec<turn::SampledChoice>, Gone> {
        let tokenizer = self.state.turn.tokenizer.clone();
        let mut choices: Vec<ChoiceStream> = Vec::with_capacity(streams.len());
        let mut merged = futures::stream::select_all(streams.into_iter().enumerate().map(
            |(index, (events, backend))| {
                choices.push(ChoiceStream::new(
                    &tokenizer,
                    self.parser.clone(),
                    &self.request,
                    self.reasoning,
                    backend,
                ));
                events.map(move |event| (index, event))
            },
        ));
        for index in 0..choices.len() {
            let role = self.chunk(index, json!({"role": "assistant", "content": ""}), None);
            if index == 0 {
                let role = with_prompt_ids(&role, &self.request, &self.plan.prompt_ids);
                let mut event = b"data: ".to_vec();
                event.extend(role);
                event.extend(b"\n\n");
                self.send_raw(Bytes::from(event)).await?;
            } else {
                self.send(&role).await?;
            }
        }
        let mut unfinished = choices.len();
        let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
        keep_alive.tick().await;
        while unfinished > 0 {
            let (index, event) = tokio::select! {
                event = merged.next() => match event {
                    Some((index, Ok(event))) => (index, event),
                    Some((_, Err(error))) => return Err(self.fail(&ApiError::from(error)).await),
                    None => return Err(self.fail(&ApiError::new(
                        actix_web::http::StatusCode::BAD_GATEWAY,
                        "upstream_error",
                        "the backend's stream ended before the sample finished",
                    )).await),
                },
                _ = self.sender.closed() => return Err(Gone),
                _ = keep_alive.tick() => {
                    self.keep_alive().await?;
                    continue;
                }
            };
            let choice = &mut choices[index];
            if let StreamEvent::Tokens {
                token_ids,
                logprobs,
                top_logprobs,
            } = &event
            {
                let deltas = choice.push_tokens(token_ids, &mut self.calls);
                let sampled = Generation {
                    top_logprobs: top_logprobs.clone(),
                    ..Generation::new(
                        token_ids.clone(),
                        logprobs.clone(),
                        crate::backend::FinishReason::Stop,
                    )
                };
                self.send_deltas(index, deltas, Some(&sampled)).await?;
            }
            let finished = matches!(event, StreamEvent::Finished { .. });
            choices[index].generation.apply(event);
            if finished {
                unfinished -= 1;
                let choice = &mut choices[index];
                let deltas = choice.finish(&mut self.calls);
                self.send_deltas(index, deltas, None).await?;
                let mut last = self.chunk(index, json!({}), Some(choice.reply.finish_reason));
                if let Some(stop) = &choice.generation.stop {
                    last["choices"][0]["stop_reason"] = json!(stop);
                }
                self.send(&last).await?;
            }
        }
        if self.request.include_usage {
            let prompt = self.plan.prompt_ids.len();
            let completion: usize = choices.iter().map(|c| c.generation.token_ids.len()).sum();
            let usage = json!({
                "id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.state.model_name, "choices": [],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
            });
            self.send(&usage).await?;
        }
        Ok(choices
            .into_iter()
            .map(|c| sampled_choice(&c.reply, c.generation, &c.backend))
            .collect())
    }

    /// Sends a choice's deltas; the first carries the sampled token ids (and logprobs), or an
    /// empty delta does when all their text is held back.
    async fn send_deltas(
        &self,
        index: usize,
        deltas: Vec<Value>,
        sampled: Option<&Generation>,
    ) -> Result<(), Gone> {
        let mut sampled = sampled;
        if deltas.is_empty() {
            if let Some(tokens) = sampled {
                let chunk = self.with_tokens(self.chunk(index, json!({}), None), tokens);
                self.send(&chunk).await?;
            }
            return Ok(());
        }
        for delta in deltas {
            let mut chunk = self.chunk(index, delta, None);
            if let Some(tokens) = sampled.take() {
                chunk = self.with_tokens(chunk, tokens);
            }
            self.send(&chunk).await?;
        }
        Ok(())
    }

    fn with_tokens(&self, mut chunk: Value, sampled: &Generation) -> Value {
        chunk["choices"][0]["token_ids"] = json!(sampled.token_ids);
        if self.request.logprobs {
            let logprobs = chat_logprobs(&self.state.turn.tokenizer, sampled);
            chunk["choices"][0]["logprobs"] = serde_json::to_value(logprobs).unwrap_or(Value::Null);
        }
        chunk
    }

    fn chunk(&self, index: usize, delta: Value, finish_reason: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.state.model_name,
            "choices": [{"index": index, "delta": delta, "logprobs": null, "finish_reason": finish_reason}],
        })
    }

    async fn send(&self, chunk: &Value) -> Result<(), Gone> {
        self.send_raw(Bytes::from(format!("data: {chunk}\n\n")))
            .await
    }

    async fn keep_alive(&self) -> Result<(), Gone> {
        self.send_raw(Bytes::from_static(b": keep-alive\n\n")).await
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
