//! [`Pipeline`]: the whole sequence of a turn, once, for every API.

use super::nudge::{deserves_nudge, nudge_request};
use super::reply::{CallIds, Reply, shape, visible_text};
use super::{
    ChoiceOutput, Plan, TailRender, TextPrompt, TurnContext, TurnError, TurnOutput, prepare,
    prepare_text, replay,
};
use crate::backend::{EventStream, Pool, Route};
use crate::chat::ChatRequest;
use crate::generation::{GenerateRequest, Generation, SamplingParams};
use crate::metrics::{Metrics, Stage, TurnTokens};
use crate::reasoning::ReasoningSyntax;
use crate::session::replies::TurnKey;
use crate::session::{CommitRecord, Session, SessionLog, SessionState, Start, TurnLabels};
use crate::telemetry::{self, TurnUsage};
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

/// Runs turns: the model-side pieces and the backend pool. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Pipeline {
    /// The chat template, tokenizer and placeholders every prompt is built with.
    pub context: TurnContext,
    /// Where samples come from.
    pub backends: Arc<Pool>,
    /// The model's context window (prompt and sample) when configured, else the smallest one
    /// the backends report: `max_tokens` is lowered to what a prompt leaves of it.
    pub context_length: Option<usize>,
    /// Most tokens a session's node may hold (`--max-session-tokens`): like the context, it
    /// lowers `max_tokens`, and a prompt that reaches it is refused.
    pub max_session_tokens: Option<usize>,
    /// Where turns are written down before they are applied (`--data-dir`).
    pub log: Option<Arc<dyn SessionLog>>,
    /// Turns under way (a drain waits for them).
    pub under_way: Arc<std::sync::atomic::AtomicUsize>,
    /// Holds new turns while the proxy is paused; the announced weight version.
    pub gate: Arc<super::gate::Gate>,
    /// What `GET /metrics` reports of turns.
    pub metrics: Arc<Metrics>,
    /// The served model's name, as replies and turn spans carry it.
    pub model_name: Arc<str>,
}

/// Counts a turn as under way while it lives.
#[derive(Debug)]
pub(super) struct UnderWay(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for UnderWay {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// The prompt a turn would send now, for `/render`.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedTurn {
    /// The template's output byte for byte, each sampled turn as the text of its ids.
    pub prompt_text: String,
    /// The ids a real call would send.
    pub prompt_ids: Vec<u32>,
    /// The node the prompt extends, if any.
    pub extends_node: Option<usize>,
}

impl Pipeline {
    /// How many turns are under way (streams included).
    pub fn turns_under_way(&self) -> usize {
        self.under_way.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Counts a turn as under way until the guard is dropped.
    pub(super) fn under_way(&self) -> UnderWay {
        self.under_way
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        UnderWay(self.under_way.clone())
    }

    /// The prompt a real call with `request` would send now; changes nothing.
    pub async fn render(
        &self,
        session: &Session,
        request: &ChatRequest,
    ) -> Result<RenderedTurn, TurnError> {
        let guard = session.state.lock().await;
        let plan = self.plan(session, &guard, request, TailRender::Never)?;
        let prompt_text = plan.prompt_text(&self.context, &guard);
        Ok(RenderedTurn {
            prompt_text,
            extends_node: match plan.base {
                super::Base::Extend { node } => Some(node),
                super::Base::New { .. } => None,
            },
            prompt_ids: plan.prompt_ids,
        })
    }

    /// One chat turn, sampled whole and recorded.
    ///
    /// With `nudge_tool_calls`, a first choice that described a call it did not make is
    /// recorded, the turn is asked once more on the same node, and whichever attempt has a
    /// call is returned; the node's turn says which was kept.
    pub async fn run(
        &self,
        session: &Session,
        request: &ChatRequest,
    ) -> Result<TurnOutput, TurnError> {
        let started = Instant::now();
        let turn = async {
            let result = self.run_turn(session, request).await;
            self.measured(request.api, started, result)
        };
        turn.instrument(self.turn_span(session, request.api)).await
    }

    async fn run_turn(
        &self,
        session: &Session,
        request: &ChatRequest,
    ) -> Result<TurnOutput, TurnError> {
        let _under_way = self.under_way();
        let mut guard = lock_open(session).await?;
        if let Some(done) = replay::recorded(session, request.key.as_ref()) {
            let plan = self.plan(session, &guard, request, TailRender::Never)?;
            let sampled = replay::samples(&done);
            return Ok(self.shape(session, plan, request, sampled, done.issued_before));
        }
        let parser = session.options.tool_parser.parser().as_ref();
        let first = self.attempt(session, &guard, request).await?;
        if !deserves_nudge(request, parser, &first.choices[0].reply) {
            self.record(
                session,
                &mut guard,
                (&first.plan, &first.choices[..]),
                request,
                None,
            )?;
            return Ok(first);
        }
        let retry_request = nudge_request(request, &first.choices[0].reply);
        let nodes = self.record(
            session,
            &mut guard,
            (&first.plan, &first.choices[..]),
            request,
            Some("kept"),
        )?;
        let retry = self.attempt(session, &guard, &retry_request).await;
        let label = match retry {
            Ok(retry) if !retry.choices[0].reply.tool_calls.is_empty() => {
                self.relabel(session, &mut guard, nodes[0], "discarded")?;
                self.record(
                    session,
                    &mut guard,
                    (&retry.plan, &retry.choices[..]),
                    request,
                    Some("kept"),
                )?;
                return Ok(retry);
            }
            Ok(_) => "kept_retry_discarded",
            Err(error) => {
                tracing::warn!(%error, "nudge retry failed; keeping the first attempt");
                "kept_retry_discarded"
            }
        };
        self.relabel(session, &mut guard, nodes[0], label)?;
        Ok(first)
    }

    /// A text completion (`/v1/completions`): `prompt` extends the node it starts with; the
    /// reply is the visible text, with no tool parsing.
    pub async fn complete_text(
        &self,
        session: &Session,
        prompt: &TextPrompt,
        params: SamplingParams,
        n: u32,
        key: Option<&TurnKey>,
    ) -> Result<TurnOutput, TurnError> {
        let started = Instant::now();
        let turn = async {
            let result = self
                .complete_text_turn(session, prompt, params, n, key)
                .await;
            self.measured("completions", started, result)
        };
        turn.instrument(self.turn_span(session, "completions"))
            .await
    }

    async fn complete_text_turn(
        &self,
        session: &Session,
        prompt: &TextPrompt,
        params: SamplingParams,
        n: u32,
        key: Option<&TurnKey>,
    ) -> Result<TurnOutput, TurnError> {
        let _under_way = self.under_way();
        let mut guard = lock_open(session).await?;
        let mut plan = prepare_text(&self.context, &guard, prompt)?;
        let recorded = replay::recorded(session, key);
        let sampled = match &recorded {
            Some(done) => replay::samples(done),
            None => self.sample(session, &mut plan, params, n).await?,
        };
        let tokenizer = &self.context.tokenizer;
        let choices: Vec<ChoiceOutput> = sampled
            .into_iter()
            .map(|(generation, backend)| {
                let (text, end_token_text) = visible_text(tokenizer, &generation, &[]);
                ChoiceOutput {
                    reply: Reply::plain(text, end_token_text, generation.finish_reason),
                    generation,
                    backend,
                }
            })
            .collect();
        let labels = TurnLabels {
            api: "completions",
            ..TurnLabels::default()
        };
        if recorded.is_none() {
            let mut record =
                CommitRecord::new(&plan, &choices, &labels, session.options.track_tree, None);
            record.key = key.cloned();
            self.write(session, &mut guard, record)?;
        }
        Ok(TurnOutput { plan, choices })
    }

    /// Times a finished turn, or counts its failure by cause.
    pub(super) fn measured<T>(
        &self,
        api: &'static str,
        started: Instant,
        result: Result<T, TurnError>,
    ) -> Result<T, TurnError> {
        match &result {
            Ok(_) => self.metrics.time(Stage::Turn, started.elapsed()),
            Err(error) => self.failed(api, error),
        }
        result
    }

    /// Logs, counts and traces a turn of `api` that failed (nothing recorded).
    pub(super) fn failed(&self, api: &'static str, error: &TurnError) {
        tracing::debug!(api, cause = error.cause(), %error, "turn failed");
        self.metrics.failure(api, error.cause());
        telemetry::record_failure(error.cause(), error);
    }

    /// The span every event of a turn is logged in (its session and API), exported as a
    /// GenAI span with `--otlp-endpoint`.
    pub(super) fn turn_span(&self, session: &Session, api: &'static str) -> tracing::Span {
        telemetry::turn_span(&session.id, api, &self.model_name)
    }

    /// The prompt of a chat turn on `session` (whose state is `state`).
    pub(super) fn plan(
        &self,
        session: &Session,
        state: &SessionState,
        request: &ChatRequest,
        tail: TailRender,
    ) -> Result<Plan, TurnError> {
        let _timed = self.metrics.timed(Stage::Plan);
        prepare(
            &self.context,
            state,
            request,
            session.options.history,
            session.options.tool_parser.parser().as_ref(),
            &self.metrics,
            tail,
        )
    }

    /// Plans, samples and shapes a chat turn; records nothing.
    async fn attempt(
        &self,
        session: &Session,
        state: &SessionState,
        request: &ChatRequest,
    ) -> Result<TurnOutput, TurnError> {
        let mut plan = self.plan(session, state, request, TailRender::Allowed)?;
        let format = session.options.tool_parser.parser().name();
        let params = self.context.sampling(request, format, &plan.prompt_ids)?;
        let sampled = self.sample(session, &mut plan, params, request.n).await?;
        Ok(self.shape(session, plan, request, sampled, state.issued_calls))
    }

    /// The turn's output: each sample shaped into a reply, its calls numbered on from
    /// `issued_before`.
    fn shape(
        &self,
        session: &Session,
        plan: Plan,
        request: &ChatRequest,
        sampled: Vec<(Generation, Arc<str>)>,
        issued_before: usize,
    ) -> TurnOutput {
        let reasoning = self.reasoning_mode(session, &plan);
        let parser = session.options.tool_parser.parser().as_ref();
        let mut ids = CallIds::after(issued_before, request.call_id_prefix);
        let tokenizer = &self.context.tokenizer;
        let choices = sampled
            .into_iter()
            .map(|(generation, backend)| ChoiceOutput {
                reply: shape(tokenizer, parser, request, &generation, reasoning, &mut ids),
                generation,
                backend,
            })
            .collect();
        TurnOutput { plan, choices }
    }

    /// Records a sampled chat turn in the session; returns the node of each choice.
    pub(super) fn record(
        &self,
        session: &Session,
        state: &mut SessionState,
        (plan, choices): (&Plan, &[ChoiceOutput]),
        request: &ChatRequest,
        nudge: Option<&'static str>,
    ) -> Result<Vec<usize>, TurnError> {
        let labels = TurnLabels {
            api: request.api,
            tools_left_out: request.tools_left_out.clone(),
            nudge,
            echoed_calls: plan.echoed_calls.clone(),
        };
        let tools = request.tools.as_deref();
        let mut record =
            CommitRecord::new(plan, choices, &labels, session.options.track_tree, tools);
        record.key = request.key.clone();
        let nodes = self.write(session, state, record)?;
        super::tail::remember(state, plan, choices.len());
        let format = session.options.tool_parser.name();
        for choice in choices {
            self.metrics.tool_calls(format, choice.reply.tool_outcomes);
        }
        for echoed in &plan.echoed_calls {
            self.metrics.echoed_call(echoed.change);
        }
        Ok(nodes)
    }

    /// Journals `record` (when there is a journal), then applies it. A choice whose backend
    /// reported no weight version gets the one the trainer announced.
    fn write(
        &self,
        session: &Session,
        state: &mut SessionState,
        mut record: CommitRecord,
    ) -> Result<Vec<usize>, TurnError> {
        let _timed = self.metrics.timed(Stage::Commit);
        if let Some(announced) = self.gate.weight_version() {
            for choice in &mut record.choices {
                choice
                    .weight_version
                    .get_or_insert_with(|| announced.clone());
            }
        }
        self.count(state, &record);
        if let Some(log) = &self.log {
            log.committed(session.id, &record)
                .map_err(|e| TurnError::Journal(e.0))?;
        }
        Ok(session.apply(state, &record))
    }

    /// Counts a turn about to be recorded: its tokens, and why it starts a new node.
    fn count(&self, state: &SessionState, record: &CommitRecord) {
        let base = match &record.start {
            Start::Extend { node } => state.nodes.get(*node).map_or(0, |n| n.len()),
            Start::New { divergence } => {
                if let Some(divergence) = divergence {
                    self.metrics.divergence(divergence.reason);
                }
                0
            }
        };
        let Some(first) = record.choices.first() else {
            return;
        };
        let tokens = TurnTokens {
            prompt: (base + record.new_prompt.len()) as u64,
            sampled: record
                .choices
                .iter()
                .map(|c| c.token_ids.len() as u64)
                .sum(),
            cached: u64::from(first.cached_tokens.unwrap_or(0)),
        };
        tracing::debug!(
            prompt = tokens.prompt,
            sampled = tokens.sampled,
            cached = tokens.cached,
            backend = %first.backend,
            "turn recorded"
        );
        self.metrics.turn(record.labels.api, &first.backend, tokens);
        let usage = TurnUsage {
            input_tokens: tokens.prompt,
            output_tokens: tokens.sampled,
            cached_tokens: tokens.cached,
            backend: &first.backend,
        };
        telemetry::record_usage(
            usage,
            record.choices.iter().map(|c| c.finish_reason.as_str()),
        );
    }

    /// Labels the last turn of `node` with how the nudge went.
    fn relabel(
        &self,
        session: &Session,
        state: &mut SessionState,
        node: usize,
        label: &'static str,
    ) -> Result<(), TurnError> {
        if let Some(log) = &self.log {
            log.relabelled(session.id, node, label)
                .map_err(|e| TurnError::Journal(e.0))?;
        }
        state.relabel(node, label);
        Ok(())
    }

    /// Samples `n` continuations of the plan's prompt through the pool: on the session's
    /// pinned backend, else preferring the one its previous turn ran on (its prefix cache is
    /// there). Each sample comes with the backend that produced it.
    async fn sample(
        &self,
        session: &Session,
        plan: &mut Plan,
        params: SamplingParams,
        n: u32,
    ) -> Result<Vec<(crate::generation::Generation, Arc<str>)>, TurnError> {
        let params = self.fit(params, plan.prompt_ids.len())?;
        let _at_backend = self.gate.pass().await?;
        let request = GenerateRequest {
            prompt: std::mem::take(&mut plan.prompt_ids),
            params,
            n,
            session: Some(session.id.to_string().into()),
            adapter: session.options.adapter.clone(),
            routed_experts_from: routed_experts_from(session, plan),
        };
        let previous = session.backend();
        let mut aborted = session.abort_signal();
        let _timed = self.metrics.timed(Stage::Backend);
        // An abort drops the backend call, which cancels the request.
        let sampled = tokio::select! {
            sampled = self.backends.generate(&request, route(session, previous.as_deref())) => {
                Some(sampled)
            }
            _ = aborted.changed() => None,
        };
        plan.prompt_ids = request.prompt;
        let sampled = sampled.ok_or(TurnError::Aborted)??;
        if let Some(used) = sampled.backends.first() {
            self.backends.record_affinity(previous.as_deref(), used);
            session.set_backend(used.clone());
        }
        Ok(sampled
            .generations
            .into_iter()
            .zip(sampled.backends)
            .collect())
    }

    /// Like [`Pipeline::sample`], for one streamed sample.
    pub(super) async fn sample_stream(
        &self,
        session: &Session,
        request: &GenerateRequest,
    ) -> Result<(EventStream, Arc<str>), TurnError> {
        let previous = session.backend();
        let (events, used) = self
            .backends
            .generate_stream(request, route(session, previous.as_deref()))
            .await?;
        self.backends.record_affinity(previous.as_deref(), &used);
        session.set_backend(used.clone());
        Ok((events, used))
    }

    /// `params` with `max_tokens` lowered to what a prompt of `prompt_len` tokens leaves of the
    /// context and of the session's token limit; an error when the prompt fills either.
    pub(super) fn fit(
        &self,
        mut params: SamplingParams,
        prompt_len: usize,
    ) -> Result<SamplingParams, TurnError> {
        if let Some(limit) = self.max_session_tokens
            && prompt_len >= limit
        {
            return Err(TurnError::SessionFull {
                prompt: prompt_len,
                limit,
            });
        }
        let context_length = self
            .context_length
            .or_else(|| self.backends.context_length());
        if let Some(context) = context_length
            && prompt_len >= context
        {
            return Err(TurnError::PromptTooLong {
                prompt: prompt_len,
                context,
            });
        }
        let room = [context_length, self.max_session_tokens]
            .into_iter()
            .flatten()
            .min();
        if let Some(room) = room {
            let left = u32::try_from(room - prompt_len).unwrap_or(u32::MAX);
            params.max_tokens = Some(params.max_tokens.map_or(left, |max| max.min(left)));
        }
        Ok(params)
    }

    /// How the turn's reply marks reasoning, when it is returned apart.
    pub(super) fn reasoning_mode(&self, session: &Session, plan: &Plan) -> Option<ReasoningSyntax> {
        self.context
            .reasoning_syntax(session.options.reasoning, &plan.prompt_ids)
    }
}

/// The session's state, locked for a turn, unless the session was removed meanwhile.
async fn lock_open(
    session: &Session,
) -> Result<tokio::sync::MutexGuard<'_, SessionState>, TurnError> {
    let guard = session.state.lock().await;
    match session.is_closed() {
        true => Err(TurnError::SessionClosed),
        false => Ok(guard),
    }
}

/// Where the experts the turn's positions were routed to are asked from, if the session
/// records them: the positions the node being extended has none for (its last token, never
/// fed until now, and everything after it).
pub(super) fn routed_experts_from(session: &Session, plan: &Plan) -> Option<u32> {
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
