//! [`Pipeline`]: the whole sequence of a turn, once, for every API.

use super::driver::{Driver, Events};
use super::nudge::{deserves_nudge, nudge_request};
use super::{
    Plan, Planner, TailRender, TextRequest, TurnContext, TurnError, TurnOutput, TurnRequest,
};
use crate::backend::Pool;
use crate::chat::ChatRequest;
use crate::generation::{PromptImage, SamplingParams};
use crate::metrics::{Metrics, Stage, TurnTokens};
use crate::reasoning::ReasoningSyntax;
use crate::session::{Api, CommitRecord, LockedSession, Session, SessionLog, SessionState, Start};
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
    /// Where the images of recorded turns are kept (by hash), for trainers to fetch.
    pub blobs: Arc<crate::session::Blobs>,
    /// Fetches the images conversations name by URL.
    pub fetcher: Arc<crate::fetch::Fetcher>,
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
    /// The prompt's images, each with its run of placeholders in `prompt_ids`.
    pub images: Vec<crate::generation::ImageSpan>,
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
        super::images::fetch_links(&self.context, &self.fetcher, session, request).await?;
        let guard = session.state.lock().await;
        let plan = self.plan(session, &guard, request, TailRender::Never)?;
        let prompt_text = plan.prompt_text(&self.context, &guard);
        Ok(RenderedTurn {
            prompt_text,
            extends_node: match plan.base {
                super::Base::Extend { node } => Some(node),
                super::Base::New { .. } => None,
            },
            images: plan.images.iter().map(|image| image.span.clone()).collect(),
            prompt_ids: Arc::unwrap_or_clone(plan.prompt_ids),
        })
    }

    /// One chat turn, sampled whole and recorded.
    ///
    /// With `nudge_tool_calls`, a first choice that described a call it did not make is
    /// recorded, the turn is asked once more on the same node, and whichever attempt has a
    /// call is returned; the node's turn says which was kept.
    pub async fn run(
        &self,
        session: &Arc<Session>,
        request: &ChatRequest,
    ) -> Result<TurnOutput, TurnError> {
        self.run_whole(session, TurnRequest::Chat(request)).await
    }

    /// A text completion (`/v1/completions`): the prompt extends the node it starts with; the
    /// reply is the visible text, with no tool parsing.
    pub async fn complete_text(
        &self,
        session: &Arc<Session>,
        request: &TextRequest,
    ) -> Result<TurnOutput, TurnError> {
        self.run_whole(session, TurnRequest::Text(request)).await
    }

    async fn run_whole(
        &self,
        session: &Arc<Session>,
        request: TurnRequest<'_>,
    ) -> Result<TurnOutput, TurnError> {
        let started = Instant::now();
        let api = request.api();
        let turn = async {
            let result = self.run_turn(session, request).await;
            self.measured(api, started, result)
        };
        turn.instrument(self.turn_span(session, api)).await
    }

    async fn run_turn(
        &self,
        session: &Arc<Session>,
        request: TurnRequest<'_>,
    ) -> Result<TurnOutput, TurnError> {
        let _under_way = self.under_way();
        if let TurnRequest::Chat(chat) = request {
            super::images::fetch_links(&self.context, &self.fetcher, session, chat).await?;
        }
        let mut guard = lock_open(session, self.log.as_ref()).await?;
        let mut driver = Driver::new(self, session, request, Events::Kept);
        let (first, replayed) = driver.attempt(&guard).await?;
        if replayed {
            return Ok(first);
        }
        let nudge = match request {
            TurnRequest::Chat(chat) => {
                let parser = session.options.tool_parser.parser().as_ref();
                deserves_nudge(chat, parser, &first.choices[0].reply)
                    .then(|| nudge_request(chat, &first.choices[0].reply))
            }
            TurnRequest::Text(_) => None,
        };
        let Some(retry_request) = nudge else {
            driver.record(&mut guard, &first, None).await?;
            return Ok(first);
        };
        let nodes = driver.record(&mut guard, &first, Some("kept")).await?;
        let retry_turn = TurnRequest::Chat(&retry_request);
        let retry = Driver::new(self, session, retry_turn, Events::Kept)
            .attempt(&guard)
            .await;
        let label = match retry {
            Ok((retry, _)) if !retry.choices[0].reply.tool_calls.is_empty() => {
                self.relabel(session, &mut guard, nodes[0], "discarded")
                    .await?;
                driver.record(&mut guard, &retry, Some("kept")).await?;
                return Ok(retry);
            }
            Ok(_) => "kept_retry_discarded",
            Err(error) => {
                tracing::warn!(%error, "nudge retry failed; keeping the first attempt");
                "kept_retry_discarded"
            }
        };
        self.relabel(session, &mut guard, nodes[0], label).await?;
        Ok(first)
    }

    /// Times a finished turn, or counts its failure by cause.
    pub(super) fn measured<T>(
        &self,
        api: Api,
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
    pub(super) fn failed(&self, api: Api, error: &TurnError) {
        tracing::debug!(api = api.as_str(), cause = error.cause(), %error, "turn failed");
        self.metrics.failure(api.as_str(), error.cause());
        telemetry::record_failure(error.cause(), error);
    }

    /// The span every event of a turn is logged in (its session and API), exported as a
    /// GenAI span with `--otlp-endpoint`.
    pub(super) fn turn_span(&self, session: &Session, api: Api) -> tracing::Span {
        telemetry::turn_span(&session.id, api.as_str(), &self.model_name)
    }

    /// The prompt of a chat turn on `session` (whose state is `state`). A tail-only render
    /// that disagreed with the full one turns tail renders off for good.
    pub(super) fn plan(
        &self,
        session: &Session,
        state: &SessionState,
        request: &ChatRequest,
        tail: TailRender,
    ) -> Result<Plan, TurnError> {
        let _timed = self.metrics.timed(Stage::Plan);
        let planner = Planner {
            ctx: &self.context,
            state,
            request,
            history: session.options.history,
            parser: session.options.tool_parser.parser().as_ref(),
            metrics: &self.metrics,
        };
        let plan = planner.prepare(tail)?;
        if plan.tail_render_disagreed && self.context.tail_renders() {
            // The template's text after a turn depends on more than the end of the
            // conversation: every turn renders in full from now on.
            self.context.set_tail_renders(false);
            tracing::warn!(
                "a tail-only render disagreed with the full render; the full one is used, and \
                 every turn renders in full from now on"
            );
        }
        Ok(plan)
    }

    /// Keeps the record's new images (`images` are the prompt's, with their bytes) and
    /// journals `record` (when there is a journal; a fleet's store keeps both at once), then
    /// applies it. A choice whose backend reported no
    /// weight version gets the one the trainer announced.
    pub(super) async fn write(
        &self,
        session: &Session,
        state: &mut SessionState,
        mut record: CommitRecord,
        images: &[PromptImage],
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
        if !self.log.as_ref().is_some_and(|log| log.keeps_images()) {
            self.keep_images(&record, images).await?;
        }
        if let Some(log) = &self.log {
            log.committed_with_images(session.id, &record, images)
                .await
                .map_err(|e| TurnError::Journal(e.0))?;
        }
        Ok(session.apply(state, &record))
    }

    /// Keeps the bytes of each image `record` adds, before the record is journaled.
    async fn keep_images(
        &self,
        record: &CommitRecord,
        images: &[PromptImage],
    ) -> Result<(), TurnError> {
        let new: Vec<PromptImage> = record.added_images(images).cloned().collect();
        if new.is_empty() {
            return Ok(());
        }
        let blobs = self.blobs.clone();
        let kept = tokio::task::spawn_blocking(move || {
            new.iter()
                .try_for_each(|image| blobs.keep(&image.span.sha256, &image.bytes))
        })
        .await;
        match kept {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(TurnError::Journal(format!(
                "an image was not kept: {error}"
            ))),
            Err(error) => Err(TurnError::Journal(format!(
                "an image was not kept: {error}"
            ))),
        }
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
        self.metrics
            .turn(record.labels.api.as_str(), &first.backend, tokens);
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
    async fn relabel(
        &self,
        session: &Session,
        state: &mut SessionState,
        node: usize,
        label: &'static str,
    ) -> Result<(), TurnError> {
        if let Some(log) = &self.log {
            log.relabelled(session.id, node, label)
                .await
                .map_err(|e| TurnError::Journal(e.0))?;
        }
        state.relabel(node, label);
        Ok(())
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

/// The session's state, locked (and held across a fleet) for a turn, unless the session was
/// removed meanwhile.
pub(super) async fn lock_open(
    session: &Arc<Session>,
    log: Option<&Arc<dyn SessionLog>>,
) -> Result<LockedSession, TurnError> {
    session
        .lock_for_change(log.map(|log| log.as_ref()))
        .await
        .map_err(|e| TurnError::Journal(e.0))?
        .ok_or(TurnError::SessionClosed)
}
