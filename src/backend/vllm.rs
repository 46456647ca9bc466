//! vLLM through `POST /v1/completions` with a token-id prompt and `return_token_ids`.

use super::http::{JsonClient, server_root};
use super::{Backend, BackendError, FinishReason, GenerateRequest, Generation, StopMatch};
use async_trait::async_trait;
use serde_json::{Value, json};
use std::time::Duration;

/// A vLLM OpenAI-compatible server.
#[derive(Debug)]
pub struct VllmBackend {
    http: JsonClient,
    root: String,
    model: String,
}

impl VllmBackend {
    pub fn new(base_url: &str, model: &str, api_key: Option<String>, timeout: Duration) -> Self {
        Self {
            http: JsonClient::new(base_url, api_key, timeout),
            root: server_root(base_url),
            model: model.to_string(),
        }
    }

    fn body(&self, request: &GenerateRequest) -> Value {
        let p = &request.params;
        let mut body = json!({
            "model": self.model,
            "prompt": request.prompt,
            "n": request.n,
            "logprobs": p.top_logprobs.unwrap_or(0),
            "return_tokens_as_token_ids": true,
            "return_token_ids": true,
            "skip_special_tokens": false,
        });
        let fields = [
            ("max_tokens", p.max_tokens.map(Value::from)),
            ("temperature", p.temperature.map(Value::from)),
            ("top_p", p.top_p.map(Value::from)),
            ("top_k", p.top_k.map(Value::from)),
            ("min_p", p.min_p.map(Value::from)),
            ("seed", p.seed.map(Value::from)),
        ];
        for (key, value) in fields {
            if let Some(value) = value {
                body[key] = value;
            }
        }
        if !p.stop.is_empty() {
            body["stop"] = json!(p.stop);
        }
        body
    }

    fn parse_choice(&self, choice: &Value, want_top: bool) -> Result<Generation, BackendError> {
        let logprobs = &choice["logprobs"];
        let token_ids: Vec<u32> = match choice.get("token_ids").filter(|v| !v.is_null()) {
            Some(ids) => serde_json::from_value(ids.clone())
                .map_err(|e| self.http.protocol(format!("token_ids: {e}")))?,
            // Servers before return_token_ids still name each token "token_id:N".
            None => logprobs["tokens"]
                .as_array()
                .ok_or_else(|| {
                    self.http
                        .protocol("choice has neither token_ids nor logprobs.tokens")
                })?
                .iter()
                .map(|t| parse_token_key(t.as_str().unwrap_or("")))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| self.http.protocol("logprobs.tokens are not token_id:N"))?,
        };
        let values: Vec<f32> = logprobs["token_logprobs"]
            .as_array()
            .ok_or_else(|| self.http.protocol("choice has no logprobs.token_logprobs"))?
            .iter()
            .map(|v| v.as_f64().unwrap_or(-9999.0) as f32)
            .collect();
        if values.len() != token_ids.len() {
            return Err(self.http.protocol(format!(
                "{} token ids but {} logprobs",
                token_ids.len(),
                values.len()
            )));
        }
        let top_logprobs = if want_top {
            let entries = logprobs["top_logprobs"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            Some(
                entries
                    .iter()
                    .map(|entry| {
                        entry
                            .as_object()
                            .map(|map| {
                                map.iter()
                                    .filter_map(|(k, v)| {
                                        Some((parse_token_key(k)?, v.as_f64()? as f32))
                                    })
                                    .collect()
                            })
                            .unwrap_or_default()
                    })
                    .collect(),
            )
        } else {
            None
        };
        let finish_reason = match choice["finish_reason"].as_str() {
            Some("length") => FinishReason::Length,
            Some("abort") => FinishReason::Abort,
            _ => FinishReason::Stop,
        };
        let stop = match &choice["stop_reason"] {
            Value::String(s) => Some(StopMatch::Text(s.clone())),
            Value::Number(n) => n.as_u64().map(|id| StopMatch::Token(id as u32)),
            _ => None,
        };
        Ok(Generation {
            token_ids,
            logprobs: values,
            top_logprobs,
            finish_reason,
            stop,
            weight_version: None,
        })
    }
}

/// `"token_id:123"` → 123.
fn parse_token_key(key: &str) -> Option<u32> {
    key.strip_prefix("token_id:")?.parse().ok()
}

#[async_trait]
impl Backend for VllmBackend {
    fn base_url(&self) -> &str {
        &self.http.base_url
    }

    async fn generate(&self, request: &GenerateRequest) -> Result<Vec<Generation>, BackendError> {
        let reply = self
            .http
            .post(&self.root, "/v1/completions", &self.body(request))
            .await?;
        let mut choices = reply["choices"]
            .as_array()
            .ok_or_else(|| self.http.protocol("reply has no choices"))?
            .clone();
        choices.sort_by_key(|c| c["index"].as_u64().unwrap_or(0));
        let want_top = request.params.top_logprobs.is_some();
        choices
            .iter()
            .map(|c| self.parse_choice(c, want_top))
            .collect()
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.http.get_ok(&self.root, "/health").await
    }
}
