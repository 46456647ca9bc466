//! llama.cpp `llama-server` through its native `POST /completion` with a token-id prompt.
//!
//! llama-server's sampler defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05,
//! repetition penalty) are overridden with plain sampling unless the request sets them, so it
//! samples like vLLM and SGLang do. Its logprobs are the full-vocabulary log-softmax of the raw
//! logits. A request with stop strings is streamed and cut by the proxy as soon as a stop
//! string appears: llama-server drops the logprobs of a stop word's tokens, and the node needs
//! one for every sampled token.

use super::describe::{context, token_ids};
use super::http::{IdsBody, JsonClient, event_stream, server_root};
use super::{Backend, BackendError, EventStream, ServerInfo};
use crate::generation::{
    Constraint, FinishReason, GenerateRequest, Generation, StopMatch, StreamEvent,
};
use async_trait::async_trait;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// One `completion_probabilities` entry: the sampled id, its logprob, the top alternatives.
struct Probability {
    id: u32,
    logprob: f32,
    alternatives: Vec<(u32, f32)>,
}

/// A llama-server.
#[derive(Debug)]
pub struct LlamaCppBackend {
    http: JsonClient,
    root: String,
    /// Set once the server showed it ignores `n_cmpl`.
    ignores_n_cmpl: AtomicBool,
    slots: tokio::sync::OnceCell<u32>,
}

impl LlamaCppBackend {
    /// A client for the llama-server at `base_url`.
    pub fn new(base_url: &str, api_key: Option<String>, timeout: Duration) -> Self {
        Self {
            http: JsonClient::new(base_url, api_key, timeout),
            root: server_root(base_url),
            ignores_n_cmpl: AtomicBool::new(false),
            slots: tokio::sync::OnceCell::new(),
        }
    }

    fn body(request: &GenerateRequest, stream: bool) -> IdsBody<'_> {
        let p = &request.params;
        let mut body = json!({
            "n_predict": p.max_tokens.map_or(-1, i64::from),
            "temperature": p.temperature.unwrap_or(1.0),
            "top_k": p.top_k.filter(|k| *k > 0).unwrap_or(0),
            "top_p": p.top_p.unwrap_or(1.0),
            "min_p": p.min_p.unwrap_or(0.0),
            "typical_p": 1.0,
            "repeat_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "n_probs": p.top_logprobs.unwrap_or(0).max(1),
            "post_sampling_probs": false,
            "return_tokens": true,
            "cache_prompt": true,
            "stream": stream,
        });
        if let Some(seed) = p.seed {
            body["seed"] = json!(seed);
        }
        match &p.constraint {
            Some(Constraint::Grammar(grammar)) => body["grammar"] = json!(grammar),
            Some(Constraint::JsonSchema(schema)) => body["json_schema"] = schema.clone(),
            None => {}
        }
        IdsBody::new("prompt", &request.prompt, body)
    }

    /// One sample, whole (no stop strings to watch for).
    /// All `n` samples in one request with `n_cmpl`; `None` when the server ignores `n_cmpl`
    /// (older builds answer with a single object), so the caller falls back.
    async fn complete_batch(
        &self,
        request: &GenerateRequest,
    ) -> Result<Option<Vec<Generation>>, BackendError> {
        let mut body = Self::body(request, false);
        body["n_cmpl"] = json!(request.n);
        let reply: Value = self
            .http
            .post(&self.root, "/completion", &body, request.session.as_deref())
            .await?;
        let Some(results) = reply.as_array().filter(|r| r.len() == request.n as usize) else {
            return Ok(None);
        };
        let mut results = results.clone();
        results.sort_by_key(|r| r["index"].as_u64().unwrap_or(0));
        results
            .iter()
            .map(|r| self.parse_reply(r, request))
            .collect::<Result<_, _>>()
            .map(Some)
    }

    async fn complete(&self, request: &GenerateRequest) -> Result<Generation, BackendError> {
        let reply = self
            .http
            .post(
                &self.root,
                "/completion",
                &Self::body(request, false),
                request.session.as_deref(),
            )
            .await?;
        self.parse_reply(&reply, request)
    }

    /// One non-streamed result object.
    fn parse_reply(
        &self,
        reply: &Value,
        request: &GenerateRequest,
    ) -> Result<Generation, BackendError> {
        let token_ids: Vec<u32> = serde_json::from_value(reply["tokens"].clone()).map_err(|e| {
            self.http
                .protocol(format!("tokens: {e} (is return_tokens supported?)"))
        })?;
        let probabilities = reply["completion_probabilities"]
            .as_array()
            .ok_or_else(|| self.http.protocol("reply has no completion_probabilities"))?;
        let mut logprobs = Vec::with_capacity(token_ids.len());
        let mut top = Vec::with_capacity(token_ids.len());
        for (id, entry) in token_ids.iter().zip(probabilities) {
            let probability = probability(&self.http, entry)?;
            if probability.id != *id {
                return Err(self
                    .http
                    .protocol("completion_probabilities do not follow tokens"));
            }
            logprobs.push(probability.logprob);
            top.push(probability.alternatives);
        }
        if logprobs.len() != token_ids.len() {
            return Err(self.http.protocol(format!(
                "{} tokens but {} probabilities",
                token_ids.len(),
                logprobs.len()
            )));
        }
        let last = token_ids.last().copied();
        let mut generation = Generation::new(token_ids, logprobs, finish_reason(reply));
        generation.stop = stop_match(reply, last);
        generation.top_logprobs = request.params.top_logprobs.map(|_| top);
        generation.cached_tokens = reply["tokens_cached"].as_u64().map(|n| n as u32);
        Ok(generation)
    }

    /// One sample streamed token by token, ended by the proxy at the first stop string in
    /// its text (llama-server gets no stop words, so every token keeps its probability).
    async fn stream_one(&self, request: &GenerateRequest) -> Result<EventStream, BackendError> {
        let bytes = self
            .http
            .post_stream(
                &self.root,
                "/completion",
                &Self::body(request, true),
                request.session.as_deref(),
            )
            .await?;
        let http = self.http.clone();
        let stops = request.params.stop.clone();
        let want_top = request.params.top_logprobs.is_some();
        let mut text = String::new();
        let mut last_token = None;
        Ok(event_stream(self.http.clone(), bytes, move |chunk| {
            // Every sampled token, the end-of-generation one included, comes with its
            // probability in its own chunk.
            let mut tokens = (Vec::new(), Vec::new(), Vec::new());
            for entry in chunk["completion_probabilities"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let probability = probability(&http, entry)?;
                tokens.0.push(probability.id);
                tokens.1.push(probability.logprob);
                tokens.2.push(probability.alternatives);
            }
            last_token = tokens.0.last().copied().or(last_token);
            let mut events = Vec::new();
            if !tokens.0.is_empty() {
                events.push(StreamEvent::Tokens {
                    token_ids: tokens.0,
                    logprobs: tokens.1,
                    top_logprobs: want_top.then_some(tokens.2),
                });
            }
            let piece = chunk["content"].as_str().unwrap_or("");
            text.push_str(piece);
            if let Some(stop) = completed_stop(&text, piece.len(), &stops) {
                events.push(StreamEvent::Finished {
                    finish_reason: FinishReason::Stop,
                    stop: Some(StopMatch::Text(stop.clone())),
                    weight_version: None,
                    weight_spans: Vec::new(),
                    routed_experts: None,
                    cached_tokens: None,
                    approximate: false,
                });
            } else if chunk["stop"].as_bool() == Some(true) {
                events.push(StreamEvent::Finished {
                    finish_reason: finish_reason(chunk),
                    stop: stop_match(chunk, last_token),
                    weight_version: None,
                    weight_spans: Vec::new(),
                    routed_experts: None,
                    cached_tokens: chunk["tokens_cached"].as_u64().map(|n| n as u32),
                    approximate: false,
                });
            }
            Ok(events)
        }))
    }

    /// The server's slot count (`total_slots` in `GET /props`; 1 when it does not say).
    async fn slots(&self) -> u32 {
        let probe = self
            .slots
            .get_or_try_init(|| async {
                let props = self.http.get_json(&self.root, "/props").await?;
                Ok::<_, BackendError>(props["total_slots"].as_u64().unwrap_or(1) as u32)
            })
            .await;
        probe.copied().unwrap_or(1)
    }

    /// The server's chat template (`GET /props`), if it has one.
    pub async fn chat_template(&self) -> Result<Option<String>, BackendError> {
        let props = self.http.get_json(&self.root, "/props").await?;
        Ok(props["chat_template"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(str::to_string))
    }
}

fn finish_reason(reply: &Value) -> FinishReason {
    match reply["stop_type"].as_str() {
        Some("eos") | Some("word") => FinishReason::Stop,
        _ => FinishReason::Length,
    }
}

/// What stopped the sample: the stop word, or the end-of-generation token it ended on.
fn stop_match(reply: &Value, last_token: Option<u32>) -> Option<StopMatch> {
    match reply["stop_type"].as_str() {
        Some("word") => reply["stopping_word"]
            .as_str()
            .map(|w| StopMatch::Text(w.to_string())),
        Some("eos") => last_token.map(StopMatch::Token),
        _ => None,
    }
}

/// The stop string the latest `piece` completed in `text`, if any (only the tail that could
/// hold a new match is searched).
fn completed_stop<'s>(text: &str, piece_len: usize, stops: &'s [String]) -> Option<&'s String> {
    stops.iter().find(|stop| {
        let mut from = text.len().saturating_sub(piece_len + stop.len());
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        text[from..].contains(stop.as_str())
    })
}

#[async_trait]
impl Backend for LlamaCppBackend {
    fn base_url(&self) -> &str {
        &self.http.base_url
    }

    /// n samples: one `n_cmpl` request where the server supports it (not with stop strings,
    /// which are watched per stream), else n parallel requests, each on its own server slot.
    async fn generate(&self, request: &GenerateRequest) -> Result<Vec<Generation>, BackendError> {
        if request.n > 1
            && request.params.stop.is_empty()
            && !self.ignores_n_cmpl.load(Ordering::Relaxed)
        {
            // n_cmpl may not exceed the server's slots: one batch per `slots` samples.
            let slots = self.slots().await.max(1);
            let batches = (0..request.n).step_by(slots as usize).map(|start| {
                let mut batch = GenerateRequest {
                    n: slots.min(request.n - start),
                    ..request.clone()
                };
                batch.params.seed = request
                    .params
                    .seed
                    .map(|s| s.wrapping_add(i64::from(start)));
                batch
            });
            let batches: Vec<GenerateRequest> = batches.collect();
            let results =
                futures::future::try_join_all(batches.iter().map(|b| self.complete_batch(b)))
                    .await?;
            if let Some(all) = results.into_iter().collect::<Option<Vec<_>>>() {
                return Ok(all.into_iter().flatten().collect());
            }
            tracing::info!(backend = %self.http.base_url, "llama-server ignores n_cmpl; sending parallel requests");
            self.ignores_n_cmpl.store(true, Ordering::Relaxed);
        }
        let samples = (0..request.n).map(|i| async move {
            let mut single = GenerateRequest {
                n: 1,
                ..request.clone()
            };
            // Distinct seeds, or every parallel sample would be the same.
            single.params.seed = request.params.seed.map(|s| s.wrapping_add(i64::from(i)));
            if single.params.stop.is_empty() {
                self.complete(&single).await
            } else {
                super::collect(&self.http.base_url, self.stream_one(&single).await?).await
            }
        });
        futures::future::try_join_all(samples).await
    }

    async fn generate_stream(
        &self,
        request: &GenerateRequest,
    ) -> Result<EventStream, BackendError> {
        self.stream_one(request).await
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.http.get_ok(&self.root, "/health").await
    }

    /// `GET /props`: `model_alias`, and `default_generation_settings.n_ctx` (one slot's
    /// context: the server's `-c` divided among its slots).
    async fn describe(&self) -> Result<ServerInfo, BackendError> {
        let props = self.http.get_json(&self.root, "/props").await?;
        Ok(ServerInfo {
            model: props["model_alias"].as_str().map(str::to_string),
            context_length: context(&props["default_generation_settings"]["n_ctx"]),
        })
    }

    async fn tokenize(&self, text: &str) -> Result<Option<Vec<u32>>, BackendError> {
        let body = json!({"content": text, "add_special": false, "parse_special": true});
        let reply: Value = self.http.post(&self.root, "/tokenize", &body, None).await?;
        token_ids(&self.http, &reply, "tokens").map(Some)
    }
}

/// One `completion_probabilities` entry.
fn probability(http: &JsonClient, entry: &Value) -> Result<Probability, BackendError> {
    let (Some(id), Some(logprob)) = (entry["id"].as_u64(), entry["logprob"].as_f64()) else {
        return Err(http.protocol("a probability entry lacks id or logprob"));
    };
    let alternatives = entry["top_logprobs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| Some((a["id"].as_u64()? as u32, a["logprob"].as_f64()? as f32)))
        .collect();
    Ok(Probability {
        id: id as u32,
        logprob: logprob as f32,
        alternatives,
    })
}
