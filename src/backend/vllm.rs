//! vLLM through `POST /v1/completions` with a token-id prompt and `return_token_ids`.

use super::http::{JsonClient, server_root, set_present};
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
        set_present(
            &mut body,
            [
                ("max_tokens", p.max_tokens.map(Value::from)),
                ("temperature", p.temperature.map(Value::from)),
                ("top_p", p.top_p.map(Value::from)),
                ("top_k", p.top_k.map(Value::from)),
                ("min_p", p.min_p.map(Value::from)),
                ("seed", p.seed.map(Value::from)),
                ("stop", (!p.stop.is_empty()).then(|| json!(p.stop))),
            ],
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    fn backend() -> VllmBackend {
        VllmBackend::new("http://h:8000/v1", "m", None, Duration::from_secs(1))
    }

    #[test]
    fn reads_ids_logprobs_alternatives_and_stop_reason() {
        let choice = json!({"index": 0, "finish_reason": "stop", "stop_reason": "###",
            "token_ids": [5, 7],
            "logprobs": {"token_logprobs": [-0.5, -0.25], "tokens": ["token_id:5", "token_id:7"],
                "top_logprobs": [{"token_id:5": -0.5, "token_id:9": -1.5}, {"token_id:7": -0.25}]}});
        let g = backend().parse_choice(&choice, true).unwrap();
        assert_eq!(g.token_ids, vec![5, 7]);
        assert_eq!(g.logprobs, vec![-0.5, -0.25]);
        assert_eq!(g.top_logprobs.unwrap()[0], vec![(5, -0.5), (9, -1.5)]);
        assert_eq!(g.stop, Some(StopMatch::Text("###".into())));
        assert_eq!(g.finish_reason, FinishReason::Stop);
    }

    #[test]
    fn servers_without_return_token_ids_are_read_from_token_keys() {
        let choice = json!({"index": 0, "finish_reason": "length", "stop_reason": null,
            "logprobs": {"token_logprobs": [-0.1], "tokens": ["token_id:42"], "top_logprobs": null}});
        let g = backend().parse_choice(&choice, false).unwrap();
        assert_eq!(g.token_ids, vec![42]);
        assert_eq!(g.finish_reason, FinishReason::Length);
        let broken =
            json!({"logprobs": {"token_logprobs": [-0.1, -0.2], "tokens": ["token_id:1"]}});
        assert!(backend().parse_choice(&broken, false).is_err());
    }

    #[test]
    fn request_maps_sampling_fields() {
        let request = GenerateRequest {
            prompt: vec![1, 2],
            params: crate::backend::SamplingParams {
                max_tokens: Some(8),
                top_k: Some(5),
                stop: vec!["x".into()],
                ..Default::default()
            },
            n: 2,
        };
        let body = backend().body(&request);
        assert_eq!(body["prompt"], json!([1, 2]));
        assert_eq!(body["max_tokens"], 8);
        assert_eq!(body["top_k"], 5);
        assert_eq!(body["stop"], json!(["x"]));
        assert!(
            body.get("temperature").is_none(),
            "unset fields keep the server default"
        );
        assert_eq!(body["return_token_ids"], true);
    }
}
