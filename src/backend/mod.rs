//! Inference backends: token ids in, sampled token ids + logprobs out.
//!
//! Every backend (vLLM, SGLang, llama.cpp, the embedded engine in [`crate::engine`]) implements
//! [`Backend`]. The proxy sends token ids: the prompt is the exact id sequence of the node
//! being extended, so what the model sees is what the trainer gets. (The OpenAI text backend
//! is the one exception, and marks its turns approximate.) [`pool`] routes requests to them.

mod config;
mod describe;
mod error;
mod experts;
mod http;
mod llamacpp;
mod openai;
pub(crate) mod pool;
mod sglang;
mod vllm;

pub use config::{BackendConfig, BackendKind, InvalidSetting, PoolSettings};
pub use describe::{PROBE_TEXT, Probe, ServerInfo};
pub use error::BackendError;
pub use llamacpp::LlamaCppBackend;
pub use openai::OpenAiTextBackend;
pub use pool::{ClientFactory, Pool, Route};
pub use sglang::SglangBackend;
pub use vllm::VllmBackend;

use crate::generation::{FinishReason, GenerateRequest, Generation, StreamEvent};
use async_trait::async_trait;

/// What the RL control plane asks of a server's own scheduler around a weight update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Freeze: requests in flight stop where they are, keeping their KV cache, and new ones
    /// queue (vLLM's `POST /pause?mode=keep&clear_cache=false`).
    Hold,
    /// Go on after a hold (`POST /resume`).
    Release,
    /// Stamp this weight version on what is sampled from now on (`POST /update_weight_version`).
    WeightVersion(String),
}

impl Control {
    /// What the action is called in replies (`held`, `released`, `weight_version`).
    pub fn name(&self) -> &'static str {
        match self {
            Control::Hold => "held",
            Control::Release => "released",
            Control::WeightVersion(_) => "weight_version",
        }
    }
}

/// Events of one streamed sample; dropping it cancels the backend request.
pub type EventStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<StreamEvent, BackendError>> + Send>>;

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
    /// Why the server cannot take a prompt's images token-exactly (with the proxy's
    /// expansion of each image's placeholders), or `None` when it can: only vLLM's tokens-in
    /// route takes token ids with images and says how it expanded them.
    fn refuses_images(&self) -> Option<&'static str> {
        Some("only vLLM's tokens-in route (/inference/v1/generate) takes token ids with images")
    }
    /// Checks that the server answers its health endpoint.
    async fn health(&self) -> Result<(), BackendError>;
    /// What the server reports about itself (model, context window); servers that report
    /// nothing keep this default.
    async fn describe(&self) -> Result<ServerInfo, BackendError> {
        Ok(ServerInfo::default())
    }
    /// How the server tokenizes `text` (special-token text read as special tokens, nothing
    /// added), when it has a route that says.
    async fn tokenize(&self, _text: &str) -> Result<Option<Vec<u32>>, BackendError> {
        Ok(None)
    }
    /// Acts on the server's own scheduler for the RL control plane (`/pause`, `/resume`,
    /// `/weight_version`); `Ok(false)` when the server has no such control (the default).
    async fn control(&self, _action: &Control) -> Result<bool, BackendError> {
        Ok(false)
    }
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
