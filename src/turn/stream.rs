//! A streamed turn: one backend stream per choice, relayed token by token as [`TurnEvent`]s,
//! the node committed when every choice has finished. A client that disconnects drops the
//! receiver, which ends the task, which drops the backend streams (cancelling the requests)
//! and leaves the session as it was.

use super::choice_stream::{ChoiceStream, Delta};
use super::reply::{CallIds, Finish};
use super::{ChoiceOutput, Pipeline, Plan, TurnError, Usage};
use crate::backend::{BackendError, EventStream};
use crate::chat::ChatRequest;
use crate::generation::{StopMatch, StreamEvent};
use crate::metrics::Stage;
use crate::session::{Session, SessionState};
use futures::StreamExt;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedMutexGuard, mpsc};
use tracing::Instrument;

/// How often [`TurnEvent::KeepAlive`] is sent while the backend is silent (a long prefill, a
/// wait in the pool's queue): it keeps the client's stream open, and writing is how a client
/// that hung up is noticed, so its backend request is cancelled within about this long.
const KEEP_ALIVE: Duration = Duration::from_millis(400);

/// How long [`Pipeline::stream`] waits for the backend streams to open. Within it a refusal
/// (429, 503, 502) is an ordinary error; a longer wait (a full pool's queue) happens inside the
/// event stream, with keep-alives, and a refusal then arrives as [`TurnEvent::Failed`].
const OPEN_GRACE: Duration = Duration::from_secs(1);

/// Tokens one choice sampled since its previous event, with the backend's logprobs.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledTokens {
    /// The ids.
    pub token_ids: Vec<u32>,
    /// Their logprobs.
    pub logprobs: Vec<f32>,
    /// Top alternatives per position, when requested.
    pub top_logprobs: Option<Vec<Vec<(u32, f32)>>>,
}

/// What a streamed turn reports, in order: `Opened`, then `Sampled` and `Finished` events of
/// the choices (interleaved), and last `Done` or `Failed`; `KeepAlive` while nothing happens.
#[derive(Debug)]
pub enum TurnEvent {
    /// The backend streams are open (after any wait in the pool's queue).
    Opened,
    /// A choice sampled tokens; `deltas` is what they let the client be shown (none while
    /// text is held back, e.g. the start of what may be a tool call).
    Sampled {
        /// Which choice.
        choice: usize,
        /// The ids sampled.
        tokens: SampledTokens,
        /// What they let the client be shown.
        deltas: Vec<Delta>,
    },
    /// A choice ended: the last of its text, and why it ended.
    Finished {
        /// Which choice.
        choice: usize,
        /// Text held back until the end.
        deltas: Vec<Delta>,
        /// Why it ended.
        finish: Finish,
        /// What stopped it, when the backend says.
        stop: Option<StopMatch>,
    },
    /// Nothing happened for a while.
    KeepAlive,
    /// Every choice finished and the turn is recorded in the session.
    Done(Usage),
    /// The turn failed after the stream began; nothing was recorded.
    Failed(TurnError),
}

/// A streamed turn under way.
#[derive(Debug)]
pub struct TurnStream {
    /// Length of the prompt sent.
    pub prompt_tokens: usize,
    /// How many choices are sampled.
    pub choices: usize,
    /// The prompt's ids, when the request asked for them (`return_token_ids`).
    pub prompt_ids: Option<Vec<u32>>,
    /// The turn's events; dropping this cancels the turn.
    pub events: mpsc::Receiver<TurnEvent>,
}

/// The backend streams of a turn's choices, each with the backend serving it.
type Opened = Vec<(EventStream, Arc<str>)>;
type Opening = BoxFuture<'static, Result<Opened, TurnError>>;

impl Pipeline {
    /// Starts a streamed turn on `session`. Errors before the backend starts (a bad template,
    /// no backend) are returned; later ones arrive as [`TurnEvent::Failed`].
    pub async fn stream(
        &self,
        session: Arc<Session>,
        request: ChatRequest,
    ) -> Result<TurnStream, TurnError> {
        let api = request.api;
        let span = self.turn_span(&session, api);
        let turn = async {
            let opened = self.stream_turn(session, request).await;
            if let Err(error) = &opened {
                self.failed(api, error);
            }
            opened
        };
        turn.instrument(span).await
    }

    async fn stream_turn(
        &self,
        session: Arc<Session>,
        request: ChatRequest,
    ) -> Result<TurnStream, TurnError> {
        let started = Instant::now();
        let under_way = self.under_way();
        let guard = session.state.clone().lock_owned().await;
        if session.is_closed() {
            return Err(TurnError::SessionClosed);
        }
        // Watched from here: an abort while the backend streams open is seen when they have.
        let aborted = session.abort_signal();
        let plan = self.plan(&session, &guard, &request, super::TailRender::Allowed)?;
        let (opened, calls_before, recorded) =
            match super::replay::recorded(&session, request.key.as_ref()) {
                Some(done) => (Ok(super::replay::streams(&done)), done.issued_before, true),
                None => {
                    let mut opening = self.open_streams(&session, &request, &plan)?;
                    let opened = match tokio::time::timeout(OPEN_GRACE, &mut opening).await {
                        Ok(opened) => Ok(opened?),
                        Err(_) => Err(opening),
                    };
                    (opened, guard.issued_calls, false)
                }
            };
        let (sender, events) = mpsc::channel(64);
        let handle = TurnStream {
            prompt_tokens: plan.prompt_ids.len(),
            choices: request.n as usize,
            prompt_ids: request.return_token_ids.then(|| plan.prompt_ids.clone()),
            events,
        };
        let turn = StreamedTurn {
            aborted,
            started,
            first_tokens: false,
            reasoning: self.reasoning_mode(&session, &plan),
            calls: CallIds::after(calls_before, request.call_id_prefix),
            recorded,
            pipeline: self.clone(),
            session,
            request,
            plan,
            sender,
            _under_way: under_way,
        };
        tokio::spawn(turn.run(guard, opened).in_current_span());
        Ok(handle)
    }

    /// Opens one backend stream per choice. With a seed, choice `i` samples with `seed + i`
    /// (the streams are separate requests, and equal seeds would give equal samples).
    fn open_streams(
        &self,
        session: &Arc<Session>,
        request: &ChatRequest,
        plan: &Plan,
    ) -> Result<Opening, TurnError> {
        let format = session.options.tool_parser.parser().name();
        let params = self.fit(
            self.context.sampling(request, format, &plan.prompt_ids)?,
            plan.prompt_ids.len(),
        )?;
        let id: Arc<str> = session.id.to_string().into();
        let requests: Vec<_> = (0..request.n)
            .map(|i| {
                let mut params = params.clone();
                params.seed = params.seed.map(|seed| seed.wrapping_add(i64::from(i)));
                crate::generation::GenerateRequest {
                    prompt: plan.prompt_ids.clone(),
                    params,
                    n: 1,
                    session: Some(id.clone()),
                    adapter: session.options.adapter.clone(),
                    routed_experts_from: super::pipeline::routed_experts_from(session, plan),
                }
            })
            .collect();
        let (pipeline, session) = (self.clone(), session.clone());
        Ok(Box::pin(async move {
            let at_backend = pipeline.gate.pass().await?;
            let opening = requests
                .iter()
                .map(|generate| pipeline.sample_stream(&session, generate));
            let mut opened = futures::future::try_join_all(opening).await?;
            // The turn is at a backend for as long as its first stream lives.
            if let Some((events, _)) = opened.first_mut() {
                let held = std::mem::replace(events, Box::pin(futures::stream::empty()));
                *events = Box::pin(held.map(move |event| {
                    let _ = &at_backend;
                    event
                }));
            }
            Ok(opened)
        }))
    }
}

/// Everything the task driving one streamed turn needs.
struct StreamedTurn {
    pipeline: Pipeline,
    session: Arc<Session>,
    request: ChatRequest,
    plan: Plan,
    sender: mpsc::Sender<TurnEvent>,
    /// How the reply marks reasoning, when it is returned apart.
    reasoning: Option<crate::reasoning::ReasoningSyntax>,
    calls: CallIds,
    /// The turn was recorded before (a retry): its streams replay the record.
    recorded: bool,
    /// Changes when the session's turn is aborted.
    aborted: tokio::sync::watch::Receiver<u64>,
    /// When the turn began (its stages are timed from there).
    started: Instant,
    /// Whether sampled tokens have arrived yet.
    first_tokens: bool,
    /// Held until the turn ends (a drain waits for it).
    _under_way: super::pipeline::UnderWay,
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
        let recorded = match self.recorded {
            true => Ok(Vec::new()),
            false => self.pipeline.record(
                &self.session,
                &mut guard,
                (&self.plan, &choices[..]),
                &self.request,
                None,
            ),
        };
        let event = match recorded {
            Ok(_) => {
                self.pipeline
                    .metrics
                    .time(Stage::Turn, self.started.elapsed());
                TurnEvent::Done(Usage::of(&self.plan, &choices))
            }
            Err(error) => {
                self.pipeline.failed(self.request.api, &error);
                TurnEvent::Failed(error)
            }
        };
        let _ = self.send(event).await;
    }

    /// Waits for the backend streams to open, with keep-alives; gives up when the client leaves.
    async fn wait_for(&mut self, mut opening: Opening) -> Result<Opened, Gone> {
        let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
        loop {
            tokio::select! {
                opened = &mut opening => return match opened {
                    Ok(opened) => Ok(opened),
                    Err(error) => Err(self.fail(error).await),
                },
                _ = self.aborted.changed() => return Err(self.fail(TurnError::Aborted).await),
                _ = self.sender.closed() => return Err(Gone),
                _ = keep_alive.tick() => self.send(TurnEvent::KeepAlive).await?,
            }
        }
    }

    /// Relays the backends' events; returns the sampled choices once every one has finished,
    /// or `Err` when the client left or a backend failed (nothing to commit).
    async fn relay(&mut self, streams: Opened) -> Result<Vec<ChoiceOutput>, Gone> {
        let tokenizer = self.pipeline.context.tokenizer.clone();
        let parser = self.session.options.tool_parser.parser().clone();
        let mut choices: Vec<ChoiceStream> = Vec::with_capacity(streams.len());
        let mut merged = futures::stream::select_all(streams.into_iter().enumerate().map(
            |(index, (events, backend))| {
                choices.push(ChoiceStream::new(
                    &tokenizer,
                    parser.clone(),
                    &self.request,
                    self.reasoning,
                    backend,
                ));
                events.map(move |event| (index, event))
            },
        ));
        self.send(TurnEvent::Opened).await?;
        let mut unfinished = choices.len();
        let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
        keep_alive.tick().await;
        while unfinished > 0 {
            let (index, event) = tokio::select! {
                event = merged.next() => match event {
                    Some((index, Ok(event))) => (index, event),
                    Some((_, Err(error))) => return Err(self.fail(error.into()).await),
                    None => {
                        let url = choices.first().map_or_else(String::new, |c| c.backend.to_string());
                        let reason = "the stream ended before the sample finished".into();
                        return Err(self.fail(BackendError::Protocol { url, reason }.into()).await);
                    }
                },
                _ = self.aborted.changed() => return Err(self.fail(TurnError::Aborted).await),
                _ = self.sender.closed() => return Err(Gone),
                _ = keep_alive.tick() => {
                    self.send(TurnEvent::KeepAlive).await?;
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
                if !self.first_tokens {
                    self.first_tokens = true;
                    let metrics = &self.pipeline.metrics;
                    metrics.time(Stage::FirstToken, self.started.elapsed());
                }
                let deltas = choice.push_tokens(token_ids, &mut self.calls);
                let tokens = SampledTokens {
                    token_ids: token_ids.clone(),
                    logprobs: logprobs.clone(),
                    top_logprobs: top_logprobs.clone(),
                };
                let sampled = TurnEvent::Sampled {
                    choice: index,
                    tokens,
                    deltas,
                };
                self.send(sampled).await?;
            }
            let finished = matches!(event, StreamEvent::Finished { .. });
            choice.generation.apply(event);
            if finished {
                unfinished -= 1;
                let deltas = choice.finish(&mut self.calls);
                let event = TurnEvent::Finished {
                    choice: index,
                    deltas,
                    finish: choice.reply.finish,
                    stop: choice.generation.stop.clone(),
                };
                self.send(event).await?;
            }
        }
        Ok(choices
            .into_iter()
            .map(|c| ChoiceOutput {
                reply: c.reply,
                generation: c.generation,
                backend: c.backend,
            })
            .collect())
    }

    async fn send(&self, event: TurnEvent) -> Result<(), Gone> {
        self.sender.send(event).await.map_err(|_| Gone)
    }

    /// Reports a failure after the stream started.
    async fn fail(&self, error: TurnError) -> Gone {
        self.pipeline.failed(self.request.api, &error);
        let _ = self.send(TurnEvent::Failed(error)).await;
        Gone
    }
}
