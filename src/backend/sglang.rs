//! SGLang through its native `POST /generate` with `input_ids` and `return_logprob`.

use super::http::{IdsBody, JsonClient, event_stream, server_root, set_present};
use super::{
    Backend, BackendError, EventStream, FinishReason, GenerateRequest, Generation, StopMatch,
    StreamEvent,
};
use async_trait::async_trait;
use serde_json::{Value, json};
use std::time::Duration;

/// An SGLang server.
#[derive(Debug)]
pub struct SglangBackend {
    http: JsonClient,
    root: String,
}

impl SglangBackend {
    pub fn new(base_url: &str, api_key: Option<String>, timeout: Duration) -> Self {
        Self {
            http: JsonClient::new(base_url, api_key, timeout),
            root: server_root(base_url),
        }
    }

    fn body(request: &GenerateRequest) -> IdsBody<'_> {
        let p = &request.params;
        let mut sampling = json!({ "n": request.n });
        set_present(
            &mut sampling,
            [
                ("max_new_tokens", p.max_tokens.map(Value::from)),
                ("temperature", p.temperature.map(Value::from)),
                ("top_p", p.top_p.map(Value::from)),
                ("top_k", p.top_k.map(Value::from)),
                ("min_p", p.min_p.map(Value::from)),
                ("sampling_seed", p.seed.map(Value::from)),
                ("stop", (!p.stop.is_empty()).then(|| json!(p.stop))),
            ],
        );
        let rest = json!({
            "sampling_params": sampling,
            "return_logprob": true,
            "logprob_start_len": -1,
            "top_logprobs_num": p.top_logprobs.unwrap_or(0),
            "return_text_in_logprobs": false,
            "stream": false,
        });
        IdsBody::new("input_ids", &request.prompt, rest)
    }

    fn parse_output(
        http: &JsonClient,
        output: &Value,
        want_top: bool,
    ) -> Result<Generation, BackendError> {
        let meta = &output["meta_info"];
        let finish = &meta["finish_reason"];
        let finish_reason = match finish["type"].as_str() {
            Some("length") => FinishReason::Length,
            Some("abort") => {
                return Err(BackendError::Aborted {
                    url: http.base_url.clone(),
                    message: finish["message"].as_str().unwrap_or("aborted").to_string(),
                });
            }
            _ => FinishReason::Stop,
        };
        let stop = match &finish["matched"] {
            Value::String(s) => Some(StopMatch::Text(s.clone())),
            Value::Number(n) => n.as_u64().map(|id| StopMatch::Token(id as u32)),
            _ => None,
        };
        let pairs = meta["output_token_logprobs"]
            .as_array()
            .ok_or_else(|| http.protocol("meta_info has no output_token_logprobs"))?;
        let mut token_ids = Vec::with_capacity(pairs.len());
        let mut logprobs = Vec::with_capacity(pairs.len());
        for pair in pairs {
            let (Some(lp), Some(id)) = (pair[0].as_f64(), pair[1].as_u64()) else {
                return Err(http.protocol("output_token_logprobs entry is not [logprob, id, text]"));
            };
            logprobs.push(lp as f32);
            token_ids.push(id as u32);
        }
        if let Some(ids) = output["output_ids"].as_array()
            && (ids.len() != token_ids.len()
                || ids
                    .iter()
                    .zip(&token_ids)
                    .any(|(a, b)| a.as_u64() != Some(u64::from(*b))))
        {
            return Err(http.protocol("output_ids disagree with output_token_logprobs"));
        }
        let top_logprobs = want_top.then(|| {
            meta["output_top_logprobs"]
                .as_array()
                .map(|positions| {
                    positions
                        .iter()
                        .map(|alts| {
                            alts.as_array()
                                .map(|alts| {
                                    alts.iter()
                                        .filter_map(|a| {
                                            Some((a[1].as_u64()? as u32, a[0].as_f64()? as f32))
                                        })
                                        .collect()
                                })
                                .unwrap_or_default()
                        })
                        .collect()
                })
                .unwrap_or_default()
        });
        let mut generation = Generation::new(token_ids, logprobs, finish_reason);
        generation.top_logprobs = top_logprobs;
        generation.stop = stop;
        generation.weight_version = meta["weight_version"].as_str().map(str::to_string);
        generation.cached_tokens = meta["cached_tokens"].as_u64().map(|n| n as u32);
        Ok(generation)
    }
}

#[async_trait]
impl Backend for SglangBackend {
    fn base_url(&self) -> &str {
        &self.http.base_url
    }

    async fn generate(&self, request: &GenerateRequest) -> Result<Vec<Generation>, BackendError> {
        let reply = self
            .http
            .post(&self.root, "/generate", &Self::body(request))
            .await?;
        let outputs = match reply {
            Value::Array(items) => items,
            single => vec![single],
        };
        let want_top = request.params.top_logprobs.is_some();
        outputs
            .iter()
            .map(|o| Self::parse_output(&self.http, o, want_top))
            .collect()
    }

    async fn generate_stream(
        &self,
        request: &GenerateRequest,
    ) -> Result<EventStream, BackendError> {
        let mut body = Self::body(request);
        body["stream"] = json!(true);
        let bytes = self
            .http
            .post_stream(&self.root, "/generate", &body)
            .await?;
        let http = self.http.clone();
        let want_top = request.params.top_logprobs.is_some();
        let mut seen = 0usize;
        Ok(event_stream(self.http.clone(), bytes, move |chunk| {
            let so_far = Self::parse_output(&http, chunk, want_top)?;
            // Chunks are cumulative by default and deltas with --incremental-streaming-output;
            // completion_tokens (the total so far) tells how many of them are new either way.
            let total = chunk["meta_info"]["completion_tokens"]
                .as_u64()
                .map_or(so_far.token_ids.len(), |n| n as usize);
            let fresh = total.saturating_sub(seen);
            let start = so_far
                .token_ids
                .len()
                .checked_sub(fresh)
                .ok_or_else(|| http.protocol("stream chunk has fewer tokens than it counts"))?;
            seen = total;
            let mut events = Vec::new();
            if fresh > 0 {
                events.push(StreamEvent::Tokens {
                    token_ids: so_far.token_ids[start..].to_vec(),
                    logprobs: so_far.logprobs[start..].to_vec(),
                    top_logprobs: so_far
                        .top_logprobs
                        .as_ref()
                        .map(|t| t.get(start..).unwrap_or_default().to_vec()),
                });
            }
            if !chunk["meta_info"]["finish_reason"].is_null() {
                events.push(so_far.into_events().pop().expect("a finish event"));
            }
            Ok(events)
        }))
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.http.get_ok(&self.root, "/health").await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend() -> SglangBackend {
        SglangBackend::new("http://h:30000", None, Duration::from_secs(1))
    }

    #[test]
    fn reads_output_logprobs_finish_and_weight_version() {
        let output = json!({"output_ids": [3, 4], "meta_info": {
            "finish_reason": {"type": "stop", "matched": 4}, "weight_version": "v7",
            "output_token_logprobs": [[-0.5, 3, null], [-0.1, 4, null]],
            "output_top_logprobs": [[[-0.5, 3, null], [-2.0, 8, null]], [[-0.1, 4, null]]]}});
        let g = SglangBackend::parse_output(&backend().http, &output, true).unwrap();
        assert_eq!(g.token_ids, vec![3, 4]);
        assert_eq!(g.logprobs, vec![-0.5, -0.1]);
        assert_eq!(g.stop, Some(StopMatch::Token(4)));
        assert_eq!(g.weight_version.as_deref(), Some("v7"));
        assert_eq!(g.top_logprobs.unwrap()[0], vec![(3, -0.5), (8, -2.0)]);
    }

    #[test]
    fn abort_with_status_200_is_an_error_and_mismatched_ids_are_rejected() {
        let aborted = json!({"meta_info": {"finish_reason": {"type": "abort", "message": "paused"},
            "output_token_logprobs": []}});
        assert!(matches!(
            SglangBackend::parse_output(&backend().http, &aborted, false),
            Err(BackendError::Aborted { .. })
        ));
        let mismatched = json!({"output_ids": [9], "meta_info": {"finish_reason": {"type": "length", "length": 1},
            "output_token_logprobs": [[-0.5, 3, null]]}});
        assert!(SglangBackend::parse_output(&backend().http, &mismatched, false).is_err());
    }
}
