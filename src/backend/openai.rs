//! Any OpenAI-compatible text completions API (a hosted provider, a server without token-id
//! support). The prompt goes as text and only text comes back, so the proxy tokenizes the
//! reply itself: such turns are marked `approximate` in node metadata, and their logprobs are
//! the provider's only when its tokens line up one to one with the proxy's, else 0.0.

use super::http::{JsonClient, server_root, set_present};
use super::{Backend, BackendError};
use crate::generation::{FinishReason, GenerateRequest, Generation, StopMatch};
use crate::tokenizer::Tokenizer;
use async_trait::async_trait;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// A text-only OpenAI-compatible server.
#[derive(Debug)]
pub struct OpenAiTextBackend {
    http: JsonClient,
    root: String,
    model: String,
    tokenizer: Arc<Tokenizer>,
}

impl OpenAiTextBackend {
    /// A client for the OpenAI-compatible text server at `base_url`, serving `model`; `tokenizer` re-tokenizes its text.
    pub fn new(
        base_url: &str,
        model: &str,
        api_key: Option<String>,
        timeout: Duration,
        tokenizer: Arc<Tokenizer>,
    ) -> Self {
        Self {
            http: JsonClient::new(base_url, api_key, timeout),
            root: server_root(base_url),
            model: model.to_string(),
            tokenizer,
        }
    }

    fn body(&self, request: &GenerateRequest) -> Value {
        let p = &request.params;
        let mut body = json!({
            // A LoRA adapter (or a fine-tune) is chosen by naming it as the model.
            "model": request.adapter.as_deref().unwrap_or(&self.model),
            "prompt": self.tokenizer.decode(&request.prompt),
            "n": request.n,
        });
        set_present(
            &mut body,
            [
                ("max_tokens", p.max_tokens.map(Value::from)),
                ("temperature", p.temperature.map(Value::from)),
                ("top_p", p.top_p.map(Value::from)),
                ("seed", p.seed.map(Value::from)),
                ("stop", (!p.stop.is_empty()).then(|| json!(p.stop))),
                (
                    "logprobs",
                    Some(Value::from(p.top_logprobs.unwrap_or(0).max(1))),
                ),
            ],
        );
        body
    }

    fn parse_choice(&self, choice: &Value) -> Result<Generation, BackendError> {
        let text = choice["text"]
            .as_str()
            .ok_or_else(|| self.http.protocol("choice has no text"))?;
        let token_ids = self
            .tokenizer
            .encode(text)
            .map_err(|e| self.http.protocol(e.to_string()))?;
        let provided: Vec<f32> = choice["logprobs"]["token_logprobs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| v.as_f64().unwrap_or(0.0) as f32)
            .collect();
        let logprobs = if provided.len() == token_ids.len() {
            provided
        } else {
            vec![0.0; token_ids.len()]
        };
        let finish_reason = match choice["finish_reason"].as_str() {
            Some("length") => FinishReason::Length,
            _ => FinishReason::Stop,
        };
        let mut generation = Generation::new(token_ids, logprobs, finish_reason);
        generation.stop = choice["stop_reason"]
            .as_str()
            .map(|s| StopMatch::Text(s.to_string()));
        generation.approximate = true;
        Ok(generation)
    }
}

#[async_trait]
impl Backend for OpenAiTextBackend {
    fn base_url(&self) -> &str {
        &self.http.base_url
    }

    async fn generate(&self, request: &GenerateRequest) -> Result<Vec<Generation>, BackendError> {
        if let Some(constraint) = &request.params.constraint {
            // An OpenAI-compatible text server's structured-output options vary by vendor.
            return Err(BackendError::Unsupported {
                url: self.http.base_url.clone(),
                option: constraint.option(),
            });
        }
        // A hosted provider is told no session ids.
        let reply: Value = self
            .http
            .post(&self.root, "/v1/completions", &self.body(request), None)
            .await?;
        let mut choices = reply["choices"]
            .as_array()
            .ok_or_else(|| self.http.protocol("reply has no choices"))?
            .clone();
        choices.sort_by_key(|c| c["index"].as_u64().unwrap_or(0));
        choices.iter().map(|c| self.parse_choice(c)).collect()
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.http.get_ok(&self.root, "/v1/models").await
    }
}
