//! Inference backends: token ids in, sampled token ids + logprobs out.
//!
//! Every backend (vLLM, SGLang, llama.cpp, and later the embedded engine) implements
//! [`Backend`]. The proxy sends token ids: the prompt is the exact id sequence of the node
//! being extended, so what the model sees is what the trainer gets. (The OpenAI text backend
//! is the one exception, and marks its turns approximate.) [`pool`] routes requests to them.

mod config;
mod error;
mod http;
mod llamacpp;
mod openai;
pub mod pool;
mod sglang;
mod vllm;

pub use config::{BackendConfig, BackendKind, PoolSettings};
pub use error::BackendError;
pub use llamacpp::LlamaCppBackend;
pub use openai::OpenAiTextBackend;
pub use pool::{ClientFactory, Pool, Route};
pub use sglang::SglangBackend;
pub use vllm::VllmBackend;

use crate::tokenizer::Tokenizer;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

/// Sampling settings of one request, in OpenAI terms; each client maps them to its wire names.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SamplingParams {
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Vec<String>,
    /// Number of alternatives to return per position (OpenAI `top_logprobs`), if any.
    pub top_logprobs: Option<u32>,
}

/// One generation request: `n` samples continuing `prompt`.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub n: u32,
}

/// Why a sample ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-sequence token, a stop token or a stop string.
    Stop,
    /// `max_tokens` (or the context) ran out.
    Length,
    /// The backend aborted the request.
    Abort,
}

impl FinishReason {
    /// The OpenAI spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
        }
    }
}

/// What stopped a sample, when the backend says.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum StopMatch {
    /// A stop or EOS token id.
    Token(u32),
    /// A stop string; its tokens are part of the sampled ids, the text is cut before it.
    Text(String),
}

/// One sampled continuation, exactly as the backend produced it.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Every sampled id, including EOS and the tokens of a matched stop string.
    pub token_ids: Vec<u32>,
    /// The backend's logprob of each sampled id (same length as `token_ids`).
    pub logprobs: Vec<f32>,
    /// Top alternatives per position, when requested.
    pub top_logprobs: Option<Vec<Vec<(u32, f32)>>>,
    pub finish_reason: FinishReason,
    pub stop: Option<StopMatch>,
    /// Policy/weight version the backend reports (SGLang `weight_version`, vLLM's when set).
    pub weight_version: Option<String>,
    /// Prompt tokens the backend served from its prefix cache, when it says.
    pub cached_tokens: Option<u32>,
    /// The ids were not returned by the backend but re-tokenized from its text.
    pub approximate: bool,
}

impl Generation {
    /// A sample with ids and logprobs and nothing else reported.
    pub fn new(token_ids: Vec<u32>, logprobs: Vec<f32>, finish_reason: FinishReason) -> Self {
        Self {
            token_ids,
            logprobs,
            top_logprobs: None,
            finish_reason,
            stop: None,
            weight_version: None,
            cached_tokens: None,
            approximate: false,
        }
    }
}

/// A piece of one streamed sample.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// Tokens sampled since the previous event, with the backend's logprobs.
    Tokens {
        token_ids: Vec<u32>,
        logprobs: Vec<f32>,
        top_logprobs: Option<Vec<Vec<(u32, f32)>>>,
    },
    /// The sample ended (the fields of a [`Generation`] other than its tokens).
    Finished {
        finish_reason: FinishReason,
        stop: Option<StopMatch>,
        weight_version: Option<String>,
        cached_tokens: Option<u32>,
    },
}

/// Events of one streamed sample; dropping it cancels the backend request.
pub type EventStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<StreamEvent, BackendError>> + Send>>;

impl Generation {
    /// Adds a streamed event to a sample being assembled.
    pub fn apply(&mut self, event: StreamEvent) {
        match event {
            StreamEvent::Tokens {
                token_ids,
                logprobs,
                top_logprobs,
            } => {
                self.token_ids.extend(token_ids);
                self.logprobs.extend(logprobs);
                if let Some(top) = top_logprobs {
                    self.top_logprobs.get_or_insert_with(Vec::new).extend(top);
                }
            }
            StreamEvent::Finished {
                finish_reason,
                stop,
                weight_version,
                cached_tokens,
            } => {
                self.finish_reason = finish_reason;
                self.stop = stop;
                self.weight_version = weight_version;
                self.cached_tokens = cached_tokens;
            }
        }
    }

    /// The sample as stream events: its tokens, then its finish.
    pub fn into_events(self) -> Vec<StreamEvent> {
        vec![
            StreamEvent::Tokens {
                token_ids: self.token_ids,
                logprobs: self.logprobs,
                top_logprobs: self.top_logprobs,
            },
            StreamEvent::Finished {
                finish_reason: self.finish_reason,
                stop: self.stop,
                weight_version: self.weight_version,
                cached_tokens: self.cached_tokens,
            },
        ]
    }
}

/// A client for one inference server.
#[async_trait]
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// The server's base URL as configured.
    fn base_url(&self) -> &str;
    /// Generates `request.n` samples; all or nothing.
    async fn generate(&self, request: &GenerateRequest) -> Result<Vec<Generation>, BackendError>;
    /// Streams one sample (`request.n` is 1) token by token as the backend produces it.
    /// Servers that cannot stream ids (the OpenAI text backend) keep this default, which
    /// delivers the whole sample at once.
    async fn generate_stream(
        &self,
        request: &GenerateRequest,
    ) -> Result<EventStream, BackendError> {
        let mut generations = self.generate(request).await?;
        let generation = generations.pop().ok_or_else(|| BackendError::Protocol {
            url: self.base_url().to_string(),
            reason: "no sample returned".into(),
        })?;
        Ok(Box::pin(futures::stream::iter(
            generation.into_events().into_iter().map(Ok),
        )))
    }
    /// Checks that the server answers its health endpoint.
    async fn health(&self) -> Result<(), BackendError>;
    /// Counters of its own that `GET /servers` shows (the in-process engine's), if any.
    fn stats(&self) -> Option<serde_json::Value> {
        None
    }
}

/// Assembles a streamed sample; an error if the stream ends before the sample finished.
pub async fn collect(url: &str, mut events: EventStream) -> Result<Generation, BackendError> {
    use futures::StreamExt;
    let mut generation = Generation::new(Vec::new(), Vec::new(), FinishReason::Length);
    while let Some(event) = events.next().await {
        let finished = matches!(event, Ok(StreamEvent::Finished { .. }));
        generation.apply(event?);
        if finished {
            return Ok(generation);
        }
    }
    Err(BackendError::Protocol {
        url: url.to_string(),
        reason: "the stream ended before the sample finished".into(),
    })
}

/// The standard clients: one per [`BackendKind`].
pub fn default_factory(
    model_name: &str,
    tokenizer: Arc<Tokenizer>,
    engine: Option<Arc<crate::engine::Engine>>,
) -> ClientFactory {
    let model_name = model_name.to_string();
    Box::new(move |config: &BackendConfig| -> Box<dyn Backend> {
        let timeout = Duration::from_secs_f64(config.timeout.max(0.001));
        let model = config.model_name.as_deref().unwrap_or(&model_name);
        let key = config.api_key.clone();
        let url = config.base_url.as_str();
        match config.server_type {
            BackendKind::Vllm => Box::new(VllmBackend::new(url, model, key, timeout)),
            BackendKind::Sglang => Box::new(SglangBackend::new(url, key, timeout)),
            BackendKind::Llamacpp => Box::new(LlamaCppBackend::new(url, key, timeout)),
            BackendKind::Openai => Box::new(OpenAiTextBackend::new(
                url,
                model,
                key,
                timeout,
                tokenizer.clone(),
            )),
            BackendKind::Embedded => Box::new(crate::engine::EngineBackend(
                engine
                    .clone()
                    .expect("embedded entries are only added with a running engine"),
            )),
        }
    })
}
