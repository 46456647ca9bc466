//! The one sequence of a turn, whichever API asked and however the reply leaves: plan → gate
//! → open the samples (or the recorded ones, for a retry) → one [`ChoiceStream`] per choice →
//! the choices, ready to record. A whole reply drives it inline and keeps only the result; a
//! streamed one drives it in a task that hands each step to the client as a [`TurnEvent`].
//!
//! The two differ only where they must: a whole reply's backends sample whole (one request,
//! no event per token), a streamed reply's backends stream; the streamed one also sends
//! keep-alives and stops when its client leaves.

use super::choice_stream::ChoiceStream;
use super::events::{SampledTokens, TurnEvent};
use super::reply::CallIds;
use super::{
    ChoiceOutput, Pipeline, Plan, TailRender, TurnError, TurnOutput, TurnRequest, prepare_text,
    replay,
};
use crate::backend::{BackendError, EventStream, Route};
use crate::generation::{GenerateRequest, SamplingParams, StreamEvent};
use crate::metrics::Stage;
use crate::session::{CommitRecord, Session, SessionState, TurnLabels};
use futures::StreamExt;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How often [`TurnEvent::KeepAlive`] is sent while the backend is silent (a long prefill, a
/// wait in the pool's queue): it keeps the client's stream open, and writing is how a client
/// that hung up is noticed, so its backend request is cancelled within about this long.
const KEEP_ALIVE: Duration = Duration::from_millis(400);

/// How long a streamed turn waits for its samples to open before it answers the client.
/// Within it a refusal (429, 503, 502) is an ordinary error; a longer wait (a full pool's
/// queue) happens inside the event stream, with keep-alives, and a refusal then arrives as
/// [`TurnEvent::Failed`].
const OPEN_GRACE: Duration = Duration::from_secs(1);

/// Where a turn's events go.
pub(super) enum Events {
    /// Nowhere: the reply is returned whole.
    Kept,
    /// To the client, as they happen.
    Sent(mpsc::Sender<TurnEvent>),
}

/// The samples of a turn's choices, each with the backend serving it.
pub(super) struct Opened {
    streams: Vec<(EventStream, Arc<str>)>,
}

type Opening = BoxFuture<'static, Result<Opened, TurnError>>;

/// A turn whose prompt is planned and whose samples are open or opening.
pub(super) struct Planned {
    /// The prompt.
    pub plan: Plan,
    samples: Result<Opened, Opening>,
    /// Calls the session returned before this turn (its ids go on from there).
    calls_before: usize,
    /// The turn was recorded before (a keyed retry): its samples are the record's.
    pub replayed: bool,
}

/// Why a turn stopped before its choices were complete.
pub(super) enum Ended {
    /// The turn failed; nothing is recorded.
    Failed(TurnError),
    /// The client left; nothing is recorded.
    Gone,
}

impl From<TurnError> for Ended {
    fn from(error: TurnError) -> Self {
        Self::Failed(error)
    }
}

/// Drives one turn of `request` on `session`.
pub(super) struct Driver<'t> {
    pipeline: &'t Pipeline,
    session: &'t Arc<Session>,
    request: TurnRequest<'t>,
    events: Events,
    /// Changes when the session's turn is aborted (watched from before the samples open).
    aborted: tokio::sync::watch::Receiver<u64>,
    /// When the turn began (its stages are timed from there).
    started: Instant,
}

impl<'t> Driver<'t> {
    /// A driver for a turn that holds its session's lock (an abort from now on ends it).
    pub(super) fn new(
        pipeline: &'t Pipeline,
        session: &'t Arc<Session>,
        request: TurnRequest<'t>,
        events: Events,
    ) -> Self {
        Self {
            aborted: session.abort_signal(),
            started: Instant::now(),
            pipeline,
            session,
            request,
            events,
        }
    }

    fn streamed(&self) -> bool {
        matches!(self.events, Events::Sent(_))
    }

    /// Plans the prompt on `state` and opens its samples: the recorded ones when the turn
    /// is a keyed retry that was recorded, else the backends', through the gate.
    pub(super) async fn open(&self, state: &SessionState) -> Result<Planned, TurnError> {
        if let Some(done) = replay::recorded(self.session, self.request.key()) {
            return Ok(Planned {
                plan: self.plan(state, TailRender::Never)?,
                samples: Ok(Opened {
                    streams: replay::streams(&done, self.streamed()),
                }),
                calls_before: done.issued_before,
                replayed: true,
            });
        }
        let plan = self.plan(state, TailRender::Allowed)?;
        let params = self.sampling(&plan)?;
        let mut opening = self.open_samples(&plan, params);
        let samples = match self.streamed() {
            true => match tokio::time::timeout(OPEN_GRACE, &mut opening).await {
                Ok(opened) => Ok(opened?),
                Err(_) => Err(opening),
            },
            false => Err(opening),
        };
        Ok(Planned {
            plan,
            samples,
            calls_before: state.issued_calls,
            replayed: false,
        })
    }

    fn plan(&self, state: &SessionState, tail: TailRender) -> Result<Plan, TurnError> {
        match self.request {
            TurnRequest::Chat(request) => self.pipeline.plan(self.session, state, request, tail),
            TurnRequest::Text(request) => {
                let context = &self.pipeline.context;
                let plan = prepare_text(context, state, &request.prompt)?;
                super::images::place(context, state, &[], plan)
            }
        }
    }

    /// The request's sampling parameters after `plan`'s prompt, fitted to the room left.
    fn sampling(&self, plan: &Plan) -> Result<SamplingParams, TurnError> {
        let params = match self.request {
            TurnRequest::Chat(request) => {
                let format = self.session.options.tool_parser.parser().name();
                let context = &self.pipeline.context;
                context.sampling(request, format, &plan.prompt_ids)?
            }
            TurnRequest::Text(request) => request.params.clone(),
        };
        self.pipeline.fit(params, plan.prompt_ids.len())
    }

    /// The backend requests of the turn's samples. A seed gives choice `i` the seed `seed + i`
    /// (as vLLM seeds the samples of one request), so a seeded turn samples the same whether
    /// its reply is whole or streamed; whole and unseeded, the samples are one request's.
    fn requests(&self, plan: &Plan, params: SamplingParams) -> Vec<GenerateRequest> {
        let n = self.request.n();
        let one_request = !self.streamed() && (params.seed.is_none() || n == 1);
        let each = GenerateRequest {
            prompt: plan.prompt_ids.clone(),
            n: if one_request { n } else { 1 },
            params,
            session: Some(self.session.id.to_string().into()),
            adapter: self.session.options.adapter.clone(),
            routed_experts_from: routed_experts_from(self.session, plan),
            images: plan.images.clone(),
        };
        if one_request {
            return vec![each];
        }
        let mut requests: Vec<GenerateRequest> = (1..n)
            .map(|i| {
                let mut request = each.clone();
                request.params.seed = each.params.seed.map(|s| s.wrapping_add(i64::from(i)));
                request
            })
            .collect();
        requests.insert(0, each);
        requests
    }

    /// Opens the samples once the gate lets the turn through: whole samples, each then fed as
    /// one event, or streams. The turn is at a backend until they are sampled (whole) or for
    /// as long as the first stream lives (streamed).
    fn open_samples(&self, plan: &Plan, params: SamplingParams) -> Opening {
        let requests = self.requests(plan, params);
        let pipeline = self.pipeline;
        let sampler = Sampler {
            backends: pipeline.backends.clone(),
            metrics: pipeline.metrics.clone(),
            session: self.session.clone(),
        };
        let gate = pipeline.gate.clone();
        let streamed = self.streamed();
        Box::pin(async move {
            let at_backend = gate.pass().await?;
            let mut streams = match streamed {
                true => {
                    let opening = requests.iter().map(|generate| sampler.stream(generate));
                    futures::future::try_join_all(opening).await?
                }
                false => sampler.whole(&requests).await?,
            };
            if let Some((events, _)) = streams.first_mut().filter(|_| streamed) {
                let held = std::mem::replace(events, Box::pin(futures::stream::empty()));
                *events = Box::pin(held.map(move |event| {
                    let _ = &at_backend;
                    event
                }));
            }
            Ok(Opened { streams })
        })
    }

    /// Waits for the samples, then feeds each choice's events to its [`ChoiceStream`] and
    /// hands what they show to the client; returns the choices once every one has finished.
    pub(super) async fn relay(&mut self, planned: Planned) -> Result<TurnOutput, Ended> {
        let Planned {
            plan,
            samples,
            calls_before,
            ..
        } = planned;
        let opened = match samples {
            Ok(opened) => opened,
            Err(opening) => self.wait_for(opening).await?,
        };
        let context = &self.pipeline.context;
        let reasoning = match self.request {
            TurnRequest::Chat(_) => self.pipeline.reasoning_mode(self.session, &plan),
            TurnRequest::Text(_) => None,
        };
        let parser = self.session.options.tool_parser.parser();
        let mut calls = CallIds::after(calls_before, self.request.api().call_id_prefix());
        let mut choices: Vec<ChoiceStream> = Vec::with_capacity(opened.streams.len());
        let mut merged = futures::stream::select_all(opened.streams.into_iter().enumerate().map(
            |(index, (events, backend))| {
                let choice = ChoiceStream::new(
                    &context.tokenizer,
                    parser.clone(),
                    self.request,
                    reasoning,
                    backend,
                );
                choices.push(choice);
                events.map(move |event| (index, event))
            },
        ));
        self.send(TurnEvent::Opened).await?;
        let mut unfinished = choices.len();
        let mut keep_alive = self.keep_alive();
        let mut first_tokens = false;
        while unfinished > 0 {
            // A whole reply's samples are in memory: nothing to wait for or watch.
            let next = match self.streamed() {
                false => merged.next().await,
                true => tokio::select! {
                    event = merged.next() => event,
                    _ = self.aborted.changed() => return Err(TurnError::Aborted.into()),
                    _ = closed(&self.events) => return Err(Ended::Gone),
                    _ = tick(&mut keep_alive) => {
                        self.send(TurnEvent::KeepAlive).await?;
                        continue;
                    }
                },
            };
            let (index, event) = match next {
                Some((index, Ok(event))) => (index, event),
                Some((_, Err(error))) => return Err(TurnError::from(error).into()),
                None => {
                    let url = choices
                        .first()
                        .map_or_else(String::new, |c| c.backend.to_string());
                    let reason = "the stream ended before the sample finished".into();
                    return Err(TurnError::from(BackendError::Protocol { url, reason }).into());
                }
            };
            let choice = &mut choices[index];
            if let StreamEvent::Tokens {
                token_ids,
                logprobs,
                top_logprobs,
            } = &event
            {
                let Events::Sent(sender) = &self.events else {
                    choice.push_whole(token_ids, &mut calls);
                    choice.generation.apply(event);
                    continue;
                };
                let deltas = choice.push_tokens(token_ids, &mut calls);
                {
                    if !first_tokens {
                        first_tokens = true;
                        let metrics = &self.pipeline.metrics;
                        metrics.time(Stage::FirstToken, self.started.elapsed());
                    }
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
                    sender.send(sampled).await.map_err(|_| Ended::Gone)?;
                }
            }
            let finished = matches!(event, StreamEvent::Finished { .. });
            choice.generation.apply(event);
            if finished {
                unfinished -= 1;
                let deltas = choice.finish(&mut calls);
                if self.streamed() {
                    let event = TurnEvent::Finished {
                        choice: index,
                        deltas,
                        finish: choice.reply.finish,
                        stop: choice.generation.stop.clone(),
                    };
                    self.send(event).await?;
                }
            }
        }
        let choices = choices
            .into_iter()
            .map(|c| ChoiceOutput {
                reply: c.reply,
                generation: c.generation,
                backend: c.backend,
            })
            .collect();
        Ok(TurnOutput { plan, choices })
    }

    /// The whole sequence short of recording: the turn's output, and whether it is a
    /// recorded one replayed.
    pub(super) async fn attempt(
        &mut self,
        state: &SessionState,
    ) -> Result<(TurnOutput, bool), TurnError> {
        let planned = self.open(state).await?;
        let replayed = planned.replayed;
        match self.relay(planned).await {
            Ok(output) => Ok((output, replayed)),
            Err(Ended::Failed(error)) => Err(error),
            // A whole reply has no client to lose while it runs.
            Err(Ended::Gone) => Err(TurnError::Aborted),
        }
    }

    /// Records `output` in the session as this turn (`nudge`: how a nudge went for it);
    /// returns the node of each choice.
    pub(super) async fn record(
        &self,
        state: &mut SessionState,
        output: &TurnOutput,
        nudge: Option<&'static str>,
    ) -> Result<Vec<usize>, TurnError> {
        let (session, request, plan) = (self.session, self.request, &output.plan);
        let labels = TurnLabels {
            api: request.api(),
            tools_left_out: match request {
                TurnRequest::Chat(chat) => chat.tools_left_out.clone(),
                TurnRequest::Text(_) => Default::default(),
            },
            nudge,
            echoed_calls: plan.echoed_calls.clone(),
        };
        let track_tree = session.options.track_tree;
        let mut record =
            CommitRecord::new(plan, &output.choices, &labels, track_tree, request.tools());
        record.key = request.key().cloned();
        let nodes = (self.pipeline)
            .write(session, state, record, &plan.images)
            .await?;
        let metrics = &self.pipeline.metrics;
        if let TurnRequest::Chat(_) = request {
            let format = session.options.tool_parser.name();
            for choice in &output.choices {
                metrics.tool_calls(format, choice.reply.tool_outcomes);
            }
        }
        for echoed in &plan.echoed_calls {
            metrics.echoed_call(echoed.change);
        }
        Ok(nodes)
    }

    /// Waits for the samples to open, with keep-alives when streamed.
    async fn wait_for(&mut self, mut opening: Opening) -> Result<Opened, Ended> {
        let mut keep_alive = self.keep_alive();
        loop {
            tokio::select! {
                opened = &mut opening => return Ok(opened?),
                _ = self.aborted.changed() => return Err(TurnError::Aborted.into()),
                _ = closed(&self.events) => return Err(Ended::Gone),
                _ = tick(&mut keep_alive) => self.send(TurnEvent::KeepAlive).await?,
            }
        }
    }

    fn keep_alive(&self) -> Option<tokio::time::Interval> {
        self.streamed().then(|| {
            let start = tokio::time::Instant::now() + KEEP_ALIVE;
            tokio::time::interval_at(start, KEEP_ALIVE)
        })
    }

    /// Hands `event` to the client, when the reply is streamed.
    pub(super) async fn send(&self, event: TurnEvent) -> Result<(), Ended> {
        match &self.events {
            Events::Sent(sender) => sender.send(event).await.map_err(|_| Ended::Gone),
            Events::Kept => Ok(()),
        }
    }

    /// When the turn began.
    pub(super) fn started(&self) -> Instant {
        self.started
    }
}

/// Resolves when the client of a streamed turn has gone; never for a whole one.
async fn closed(events: &Events) {
    match events {
        Events::Sent(sender) => sender.closed().await,
        Events::Kept => std::future::pending().await,
    }
}

/// The next keep-alive, if the turn sends them.
async fn tick(keep_alive: &mut Option<tokio::time::Interval>) {
    match keep_alive {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// What a turn's samples are opened with, held by the future that opens them.
struct Sampler {
    backends: Arc<crate::backend::Pool>,
    metrics: Arc<crate::metrics::Metrics>,
    session: Arc<Session>,
}

impl Sampler {
    /// Samples each of `requests` whole, on the session's pinned backend or the one its
    /// previous turn ran on (its prefix cache is there); each sample as one stream event.
    async fn whole(
        &self,
        requests: &[GenerateRequest],
    ) -> Result<Vec<(EventStream, Arc<str>)>, TurnError> {
        let session = &self.session;
        let previous = session.backend();
        let _timed = self.metrics.timed(Stage::Backend);
        let sampling = requests.iter().map(|request| {
            self.backends
                .generate(request, route(session, previous.as_deref()))
        });
        let sampled = futures::future::try_join_all(sampling).await?;
        if let Some(used) = sampled.first().and_then(|s| s.backends.first()) {
            self.backends.record_affinity(previous.as_deref(), used);
            session.set_backend(used.clone());
        }
        Ok(sampled
            .into_iter()
            .flat_map(|s| s.generations.into_iter().zip(s.backends))
            .map(|(generation, backend)| {
                let events = generation.into_events().into_iter().map(Ok);
                let stream: EventStream = Box::pin(futures::stream::iter(events));
                (stream, backend)
            })
            .collect())
    }

    /// Opens one streamed sample, on the session's pinned backend or the one its previous
    /// turn ran on.
    async fn stream(
        &self,
        request: &GenerateRequest,
    ) -> Result<(EventStream, Arc<str>), TurnError> {
        let session = &self.session;
        let previous = session.backend();
        let (events, used) = self
            .backends
            .generate_stream(request, route(session, previous.as_deref()))
            .await?;
        self.backends.record_affinity(previous.as_deref(), &used);
        session.set_backend(used.clone());
        Ok((events, used))
    }
}

/// Where the experts the turn's positions were routed to are asked from, if the session
/// records them: the positions the node being extended has none for (its last token, never
/// fed until now, and everything after it).
fn routed_experts_from(session: &Session, plan: &Plan) -> Option<u32> {
    let from = plan.base_len.saturating_sub(1);
    session
        .options
        .routed_experts
        .then(|| u32::try_from(from).unwrap_or(u32::MAX))
}

fn route<'a>(session: &'a Session, previous: Option<&'a str>) -> Route<'a> {
    match &session.options.base_url {
        Some(url) => Route::Pinned(url),
        None => Route::Prefer(previous),
    }
}
