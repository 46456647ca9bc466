//! A running engine: the handle to its thread, its counters, and the engine as a pool backend.

use super::scheduler::{self, Job};
use super::{ENGINE_URL, EngineError, EngineSettings, SamplingConfig};
use crate::backend::{Backend, BackendError, EventStream};
use crate::generation::{GenerateRequest, Generation};
use async_trait::async_trait;
use llama_cpp_2::model::LlamaModel;
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the engine has done since it started.
#[derive(Debug, Default)]
pub struct EngineCounters {
    /// Generation requests received.
    pub requests: AtomicU64,
    /// Prompt tokens served from a slot's KV cache.
    pub reused_tokens: AtomicU64,
    /// Prompt tokens computed.
    pub prefilled_tokens: AtomicU64,
    /// Tokens sampled.
    pub sampled_tokens: AtomicU64,
    /// Batched decode calls made.
    pub decode_calls: AtomicU64,
    /// Requests cancelled before they finished.
    pub cancelled: AtomicU64,
    /// Requests that took a slot whose cache was not a prefix of their prompt.
    pub evictions: AtomicU64,
}

/// A snapshot of [`EngineCounters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EngineStats {
    /// Generation requests received.
    pub requests: u64,
    /// Prompt tokens served from a slot's KV cache.
    pub reused_tokens: u64,
    /// Prompt tokens computed.
    pub prefilled_tokens: u64,
    /// Tokens sampled.
    pub sampled_tokens: u64,
    /// Batched decode calls made.
    pub decode_calls: u64,
    /// Requests cancelled before they finished.
    pub cancelled: u64,
    /// Requests that took a slot whose cache was not a prefix of their prompt.
    pub evictions: u64,
}

/// A running engine. Dropping the last handle stops its thread.
#[derive(Debug)]
pub struct Engine {
    jobs: std::sync::mpsc::Sender<Job>,
    counters: Arc<EngineCounters>,
    model: Arc<LlamaModel>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("prompt_len", &self.prompt.len())
            .finish()
    }
}

impl Engine {
    /// Starts the engine thread for `model`.
    pub fn start(
        model: Arc<LlamaModel>,
        settings: EngineSettings,
    ) -> Result<Arc<Self>, EngineError> {
        if settings.slots == 0 || settings.slots > settings.batch {
            return Err(EngineError::Load(format!(
                "{} slots with a batch of {} tokens: need 1 ≤ slots ≤ batch",
                settings.slots, settings.batch
            )));
        }
        let (jobs, receiver) = std::sync::mpsc::channel();
        let (ready, started) = std::sync::mpsc::channel();
        let counters = Arc::new(EngineCounters::default());
        let thread_model = model.clone();
        let thread_counters = counters.clone();
        std::thread::Builder::new()
            .name("llama-engine".into())
            .spawn(move || scheduler::run(thread_model, settings, receiver, thread_counters, ready))
            .map_err(|e| EngineError::Load(format!("cannot start the engine thread: {e}")))?;
        started.recv().map_err(|_| EngineError::Stopped)??;
        Ok(Arc::new(Self {
            jobs,
            counters,
            model,
        }))
    }

    /// The model it serves.
    pub fn model(&self) -> &Arc<LlamaModel> {
        &self.model
    }

    /// What the engine has done so far.
    pub fn stats(&self) -> EngineStats {
        let c = &self.counters;
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        EngineStats {
            requests: get(&c.requests),
            reused_tokens: get(&c.reused_tokens),
            prefilled_tokens: get(&c.prefilled_tokens),
            sampled_tokens: get(&c.sampled_tokens),
            decode_calls: get(&c.decode_calls),
            cancelled: get(&c.cancelled),
            evictions: get(&c.evictions),
        }
    }

    /// Streams one sample of `request` (its `n` is ignored); `seed_offset` is added to the seed
    /// so the samples of one request differ.
    pub fn stream(
        &self,
        request: &GenerateRequest,
        seed_offset: u64,
    ) -> Result<EventStream, BackendError> {
        let params = &request.params;
        let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
        let job = Job {
            prompt: request.prompt.clone(),
            sampling: SamplingConfig {
                temperature: params.temperature.unwrap_or(1.0) as f32,
                top_k: params.top_k.filter(|k| *k > 0).unwrap_or(0) as usize,
                top_p: params.top_p.unwrap_or(1.0) as f32,
                min_p: params.min_p.unwrap_or(0.0) as f32,
                seed: params.seed.map(|s| (s as u64).wrapping_add(seed_offset)),
            },
            grammar: params.constraint.as_ref().map(crate::grammar::gbnf),
            max_tokens: params.max_tokens.unwrap_or(u32::MAX) as usize,
            stop: params.stop.clone(),
            top_logprobs: params.top_logprobs.unwrap_or(0) as usize,
            events,
        };
        self.jobs.send(job).map_err(|_| BackendError::Unreachable {
            url: ENGINE_URL.into(),
            reason: "the engine thread stopped".into(),
        })?;
        Ok(Box::pin(futures::stream::unfold(
            receiver,
            |mut receiver| async move { receiver.recv().await.map(|event| (event, receiver)) },
        )))
    }
}

/// The engine as a pool backend.
#[derive(Debug, Clone)]
pub struct EngineBackend(pub Arc<Engine>);

#[async_trait]
impl Backend for EngineBackend {
    fn base_url(&self) -> &str {
        ENGINE_URL
    }

    async fn generate(&self, request: &GenerateRequest) -> Result<Vec<Generation>, BackendError> {
        let streams = (0..u64::from(request.n.max(1)))
            .map(|i| self.0.stream(request, i))
            .collect::<Result<Vec<_>, _>>()?;
        let samples = streams
            .into_iter()
            .map(|events| crate::backend::collect(ENGINE_URL, events));
        futures::future::try_join_all(samples).await
    }

    async fn generate_stream(
        &self,
        request: &GenerateRequest,
    ) -> Result<EventStream, BackendError> {
        self.0.stream(request, 0)
    }

    async fn health(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn stats(&self) -> Option<serde_json::Value> {
        serde_json::to_value(self.0.stats()).ok()
    }
}
