//! Inference backends: token ids in, sampled token ids + logprobs out.
//!
//! Every backend (vLLM, SGLang, and later llama.cpp or the embedded engine) implements
//! [`Backend`]. The proxy never sends text: the prompt is the exact id sequence of the node
//! being extended, so what the model sees is what the trainer gets.

mod error;
mod http;
pub mod set;
mod sglang;
mod vllm;

pub use error::BackendError;
pub use set::{BackendConfig, BackendKind, BackendSet};
pub use sglang::SglangBackend;
pub use vllm::VllmBackend;

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
    /// Policy/weight version the backend reports (SGLang `weight_version`).
    pub weight_version: Option<String>,
}

/// A client for one inference server.
#[async_trait]
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// The server's base URL as configured.
    fn base_url(&self) -> &str;
    /// Generates `request.n` samples; all or nothing.
    async fn generate(&self, request: &GenerateRequest) -> Result<Vec<Generation>, BackendError>;
    /// Checks that the server answers its health endpoint.
    async fn health(&self) -> Result<(), BackendError>;
}
