//! vLLM: the tokens-in `POST /inference/v1/generate` when the server has it (probed once via
//! `/openapi.json`), else `POST /v1/completions` with a token-id prompt and `return_token_ids`.

use super::describe::{self, ServedModel};
use super::experts::{self, Encoding};
use super::http::{IdsBody, JsonClient, event_stream, server_root, set_present};
use super::{Backend, BackendError, Control, EventStream, ServerInfo};
use crate::generation::{
    Constraint, FinishReason, GenerateRequest, Generation, StopMatch, StreamEvent,
};
use async_trait::async_trait;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::OnceCell;

mod images;

const GENERATE_PATH: &str = "/inference/v1/generate";
/// Why images cannot go to a server whose tokens-in route is off.
const NO_GENERATE_ROUTE: &str =
    "its tokens-in route (/inference/v1/generate) is off: start vLLM with --enable-scale-out";
const COMPLETIONS_PATH: &str = "/v1/completions";

/// Which vLLM endpoint a server offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Generate,
    Completions,
}

/// A vLLM server.
#[derive(Debug)]
pub struct VllmBackend {
    http: JsonClient,
    root: String,
    model: ServedModel,
    endpoint: OnceCell<Endpoint>,
    /// Set once the server refused the tokens-in endpoint it lists (vLLM lists it in
    /// `/openapi.json` but answers 403 unless started with `--enable-scale-out`).
    generate_refused: AtomicBool,
    /// The images the server took, which later requests name without their bytes.
    sent_images: Arc<images::Sent>,
}

impl VllmBackend {
    /// A client for the vLLM server at `base_url`. Requests name `model` when given, else the
    /// model the server lists first (`GET /v1/models`), else `fallback`.
    pub fn new(
        base_url: &str,
        model: Option<&str>,
        fallback: &str,
        api_key: Option<String>,
        timeout: Duration,
    ) -> Self {
        Self {
            http: JsonClient::new(base_url, api_key, timeout),
            root: server_root(base_url),
            model: ServedModel::new(model, fallback),
            endpoint: OnceCell::new(),
            generate_refused: AtomicBool::new(false),
            sent_images: Default::default(),
        }
    }

    /// The endpoint to use; the probe's answer is kept, a failed probe is tried again later.
    async fn endpoint(&self) -> Endpoint {
        if self.generate_refused.load(Ordering::Relaxed) {
            return Endpoint::Completions;
        }
        let probe = self
            .endpoint
            .get_or_try_init(|| async {
                match self.http.get_json(&self.root, "/openapi.json").await {
                    Ok(spec) if spec["paths"].get(GENERATE_PATH).is_some() => {
                        Ok(Endpoint::Generate)
                    }
                    Ok(_) | Err(BackendError::Status { .. }) => Ok(Endpoint::Completions),
                    Err(error) => Err(error),
                }
            })
            .await;
        probe.copied().unwrap_or(Endpoint::Completions)
    }

    /// Whether `error` is the server refusing the tokens-in endpoint (403, or 404 from a
    /// server that lists it but does not route it); remembered, so the next requests go to
    /// `/v1/completions` at once.
    fn refuses_generate(&self, endpoint: Endpoint, error: &BackendError) -> bool {
        let refused = endpoint == Endpoint::Generate
            && matches!(
                error,
                BackendError::Status {
                    status: 403 | 404,
                    ..
                }
            );
        if refused && !self.generate_refused.swap(true, Ordering::Relaxed) {
            tracing::info!(backend = %self.http.base_url, %error,
                "the tokens-in endpoint is refused: using /v1/completions with token-id prompts");
        }
        refused
    }

    /// Whether a refused request is sent again, and how: to `/v1/completions` when the
    /// tokens-in endpoint is refused, with every image's bytes when the server missed an image
    /// it was sent by name.
    fn send_again(
        &self,
        endpoint: &mut Endpoint,
        every_image: &mut bool,
        error: &BackendError,
    ) -> bool {
        if self.refuses_generate(*endpoint, error) {
            *endpoint = Endpoint::Completions;
            return true;
        }
        if !*every_image && self.sent_images.missed(error) {
            *every_image = true;
            return true;
        }
        false
    }

    /// Refuses images where the endpoint cannot take them.
    fn images_allowed(
        &self,
        endpoint: Endpoint,
        request: &GenerateRequest,
    ) -> Result<(), BackendError> {
        match endpoint == Endpoint::Completions && !request.images.is_empty() {
            true => Err(BackendError::NoImages {
                url: self.http.base_url.clone(),
                reason: NO_GENERATE_ROUTE,
            }),
            false => Ok(()),
        }
    }

    /// The model requests name.
    async fn model_name(&self) -> String {
        self.model.name(&self.http, &self.root).await
    }

    /// The model `request` names: its LoRA adapter, else the served model.
    async fn model_name_for(&self, request: &GenerateRequest) -> String {
        match &request.adapter {
            Some(adapter) => adapter.to_string(),
            None => self.model_name().await,
        }
    }

    /// Sampling fields shared by both endpoints (vLLM's `SamplingParams` names).
    fn sampling(request: &GenerateRequest, target: &mut Value) {
        let p = &request.params;
        set_present(
            target,
            [
                ("max_tokens", p.max_tokens.map(Value::from)),
                ("temperature", p.temperature.map(Value::from)),
                ("top_p", p.top_p.map(Value::from)),
                ("top_k", p.top_k.map(Value::from)),
                ("min_p", p.min_p.map(Value::from)),
                ("seed", p.seed.map(Value::from)),
                ("stop", (!p.stop.is_empty()).then(|| json!(p.stop))),
                (
                    "structured_outputs",
                    p.constraint.as_ref().map(|constraint| match constraint {
                        Constraint::Grammar(grammar) => json!({"grammar": grammar}),
                        Constraint::JsonSchema(schema) => json!({"json": schema}),
                    }),
                ),
            ],
        );
    }

    fn completions_body<'r>(model: &str, request: &'r GenerateRequest) -> IdsBody<'r> {
        let mut body = json!({
            "model": model,
            "n": request.n,
            "logprobs": request.params.top_logprobs.unwrap_or(0),
            "return_tokens_as_token_ids": true,
            "return_token_ids": true,
            "skip_special_tokens": false,
        });
        Self::sampling(request, &mut body);
        if let Some(from) = request.routed_experts_from {
            body["routed_experts_prompt_start"] = json!(from);
        }
        IdsBody::new("prompt", &request.prompt, body)
    }

    /// The tokens-in body; `ids` are the prompt as sent ([`images::collapsed`]), its images
    /// named alone where the server took them before, unless `every_image`.
    fn generate_body<'r>(
        &self,
        request: &GenerateRequest,
        ids: &'r [u32],
        every_image: bool,
    ) -> IdsBody<'r> {
        let mut sampling = json!({
            "n": request.n,
            "logprobs": request.params.top_logprobs.unwrap_or(0),
            "skip_special_tokens": false,
        });
        Self::sampling(request, &mut sampling);
        if let Some(from) = request.routed_experts_from {
            sampling["routed_experts_prompt_start"] = json!(from);
        }
        let mut rest = json!({"sampling_params": sampling, "stream": false});
        // A LoRA adapter is chosen by naming it as the model.
        if let Some(adapter) = &request.adapter {
            rest["model"] = json!(adapter);
        }
        if !request.images.is_empty() {
            rest["content_parts"] = self.sent_images.content_parts(request, every_image);
            // The expanded prompt comes back, to be checked against the proxy's.
            rest["return_token_ids"] = json!(true);
        }
        IdsBody::new("token_ids", ids, rest)
    }

    /// A `/v1/completions` choice (legacy logprobs: parallel arrays, `token_id:N` keys).
    fn parse_choice(
        http: &JsonClient,
        choice: &Value,
        want_top: bool,
    ) -> Result<Generation, BackendError> {
        let logprobs = &choice["logprobs"];
        let token_ids: Vec<u32> = match choice.get("token_ids").filter(|v| !v.is_null()) {
            Some(ids) => serde_json::from_value(ids.clone())
                .map_err(|e| http.protocol(format!("token_ids: {e}")))?,
            // Servers before return_token_ids still name each token "token_id:N".
            None => logprobs["tokens"]
                .as_array()
                .ok_or_else(|| http.protocol("choice has neither token_ids nor logprobs.tokens"))?
                .iter()
                .map(|t| parse_token_key(t.as_str().unwrap_or("")))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| http.protocol("logprobs.tokens are not token_id:N"))?,
        };
        let values: Vec<f32> = logprobs["token_logprobs"]
            .as_array()
            .ok_or_else(|| http.protocol("choice has no logprobs.token_logprobs"))?
            .iter()
            .map(|v| v.as_f64().unwrap_or(-9999.0) as f32)
            .collect();
        let top_logprobs = want_top.then(|| {
            logprobs["top_logprobs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|entry| {
                    entry
                        .as_object()
                        .into_iter()
                        .flatten()
                        .filter_map(|(k, v)| Some((parse_token_key(k)?, v.as_f64()? as f32)))
                        .collect()
                })
                .collect()
        });
        Self::finish(http, choice, token_ids, values, top_logprobs)
    }

    /// A `/inference/v1/generate` choice: `logprobs.content` entries carry `token_id`,
    /// `logprob` and `top_logprobs` of the same shape; `weight_versions` spans the sample
    /// (on its last chunk when streamed).
    fn parse_generate_choice(
        http: &JsonClient,
        choice: &Value,
        want_top: bool,
    ) -> Result<Generation, BackendError> {
        let token_ids: Vec<u32> = serde_json::from_value(choice["token_ids"].clone())
            .map_err(|e| http.protocol(format!("token_ids: {e}")))?;
        let content = choice["logprobs"]["content"]
            .as_array()
            .ok_or_else(|| http.protocol("choice has no logprobs.content"))?;
        let values = content
            .iter()
            .map(|c| c["logprob"].as_f64().unwrap_or(-9999.0) as f32)
            .collect();
        let top_logprobs = want_top.then(|| {
            content
                .iter()
                .map(|c| {
                    c["top_logprobs"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|t| {
                            let id = u32::try_from(t["token_id"].as_u64()?).ok()?;
                            Some((id, t["logprob"].as_f64()? as f32))
                        })
                        .collect()
                })
                .collect()
        });
        let mut generation = Self::finish(http, choice, token_ids, values, top_logprobs)?;
        generation.set_weight_spans(&choice["weight_versions"]);
        Ok(generation)
    }

    fn finish(
        http: &JsonClient,
        choice: &Value,
        token_ids: Vec<u32>,
        logprobs: Vec<f32>,
        top_logprobs: Option<Vec<Vec<(u32, f32)>>>,
    ) -> Result<Generation, BackendError> {
        if logprobs.len() != token_ids.len() {
            return Err(http.protocol(format!(
                "{} token ids but {} logprobs",
                token_ids.len(),
                logprobs.len()
            )));
        }
        let finish_reason = match choice["finish_reason"].as_str() {
            Some("length") => FinishReason::Length,
            Some("abort") => FinishReason::Abort,
            _ => FinishReason::Stop,
        };
        let mut generation = Generation::new(token_ids, logprobs, finish_reason);
        generation.top_logprobs = top_logprobs;
        generation.stop = match &choice["stop_reason"] {
            Value::String(s) => Some(StopMatch::Text(s.clone())),
            Value::Number(n) => n.as_u64().map(|id| StopMatch::Token(id as u32)),
            _ => None,
        };
        generation.weight_version = choice["weight_version"].as_str().map(str::to_string);
        Ok(generation)
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

    fn refuses_images(&self) -> Option<&'static str> {
        None
    }

    async fn generate(&self, request: &GenerateRequest) -> Result<Vec<Generation>, BackendError> {
        let mut endpoint = self.endpoint().await;
        let session = request.session.as_deref();
        let ids = images::collapsed(request);
        let mut every_image = false;
        let reply: Value = loop {
            self.images_allowed(endpoint, request)?;
            let sent = match endpoint {
                Endpoint::Generate => {
                    let body = self.generate_body(request, &ids, every_image);
                    self.http
                        .post(&self.root, GENERATE_PATH, &body, session)
                        .await
                }
                Endpoint::Completions => {
                    let body = Self::completions_body(&self.model_name_for(request).await, request);
                    self.http
                        .post(&self.root, COMPLETIONS_PATH, &body, session)
                        .await
                }
            };
            match sent {
                Err(error) if self.send_again(&mut endpoint, &mut every_image, &error) => {}
                sent => break sent?,
            }
        };
        if !request.images.is_empty() {
            images::check(&self.http.base_url, request, &reply)?;
            self.sent_images.took(request);
            self.sent_images.hit();
        }
        let mut choices = reply["choices"]
            .as_array()
            .ok_or_else(|| self.http.protocol("reply has no choices"))?
            .clone();
        choices.sort_by_key(|c| c["index"].as_u64().unwrap_or(0));
        let want_top = request.params.top_logprobs.is_some();
        let version = reply["weight_version"].as_str();
        choices
            .iter()
            .map(|c| {
                let mut generation = match endpoint {
                    Endpoint::Generate => Self::parse_generate_choice(&self.http, c, want_top),
                    Endpoint::Completions => Self::parse_choice(&self.http, c, want_top),
                }?;
                if generation.weight_version.is_none() {
                    generation.weight_version = version.map(str::to_string);
                }
                let tokens = request.prompt.len() + generation.token_ids.len();
                generation.routed_experts = experts::reported(
                    &c["routed_experts"],
                    request.routed_experts_from,
                    tokens,
                    Encoding::Npy,
                );
                generation.cached_tokens = reply
                    .pointer("/usage/prompt_tokens_details/cached_tokens")
                    .and_then(Value::as_u64)
                    .map(|n| n as u32);
                Ok(generation)
            })
            .collect()
    }

    async fn generate_stream(
        &self,
        request: &GenerateRequest,
    ) -> Result<EventStream, BackendError> {
        let mut endpoint = self.endpoint().await;
        let session = request.session.as_deref();
        let ids = images::collapsed(request);
        let mut every_image = false;
        let bytes = loop {
            self.images_allowed(endpoint, request)?;
            let (path, mut body) = match endpoint {
                Endpoint::Generate => (
                    GENERATE_PATH,
                    self.generate_body(request, &ids, every_image),
                ),
                Endpoint::Completions => (
                    COMPLETIONS_PATH,
                    Self::completions_body(&self.model_name_for(request).await, request),
                ),
            };
            body["stream"] = json!(true);
            match self
                .http
                .post_stream(&self.root, path, &body, session)
                .await
            {
                Err(error) if self.send_again(&mut endpoint, &mut every_image, &error) => {}
                sent => break sent?,
            }
        };
        let http = self.http.clone();
        let sent_images = self.sent_images.clone();
        let want_top = request.params.top_logprobs.is_some();
        let experts_from = request.routed_experts_from;
        // Prompt and sample so far: the finishing chunk's routed experts cover them.
        let mut tokens = request.prompt.len();
        // The first chunk reports the expanded prompt; checked before any token is passed on.
        let mut unchecked = (!request.images.is_empty()).then(|| request.clone());
        Ok(event_stream(self.http.clone(), bytes, move |chunk| {
            if let Some(request) = unchecked.take() {
                images::check(&http.base_url, &request, chunk)?;
                sent_images.took(&request);
                sent_images.hit();
            }
            // A usage-only chunk has no choices.
            let Some(choice) = chunk["choices"].as_array().and_then(|c| c.first()) else {
                return Ok(Vec::new());
            };
            let mut delta = match endpoint {
                Endpoint::Generate => Self::parse_generate_choice(&http, choice, want_top),
                Endpoint::Completions => Self::parse_choice(&http, choice, want_top),
            }?;
            tokens += delta.token_ids.len();
            let reported = &choice["routed_experts"];
            delta.routed_experts = experts::reported(reported, experts_from, tokens, Encoding::Npy);
            let has_tokens = !delta.token_ids.is_empty();
            let finished = !choice["finish_reason"].is_null();
            let [tokens, finish] =
                <[StreamEvent; 2]>::try_from(delta.into_events()).expect("tokens and finish");
            Ok(has_tokens
                .then_some(tokens)
                .into_iter()
                .chain(finished.then_some(finish))
                .collect())
        }))
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.http.get_ok(&self.root, "/health").await
    }

    /// vLLM's dev-mode routes (`VLLM_SERVER_DEV_MODE=1`); a server without them answers 404.
    async fn control(&self, action: &Control) -> Result<bool, BackendError> {
        let (path, body) = match action {
            // `clear_cache=false`: a hold that dropped the KV cache would recompute every
            // frozen request's prompt on resume.
            Control::Hold => ("/pause?mode=keep&clear_cache=false", json!({})),
            Control::Release => ("/resume", json!({})),
            Control::WeightVersion(version) => {
                ("/update_weight_version", json!({"new_version": version}))
            }
        };
        match self.http.post::<Value>(&self.root, path, &body, None).await {
            Ok(_) => Ok(true),
            Err(BackendError::Status { status: 404, .. }) => Ok(false),
            Err(error) => Err(error),
        }
    }

    async fn describe(&self) -> Result<ServerInfo, BackendError> {
        self.model.describe(&self.http, &self.root).await
    }

    /// `POST /tokenize` (vLLM parses special-token text by default).
    async fn tokenize(&self, text: &str) -> Result<Option<Vec<u32>>, BackendError> {
        let model = self.model_name().await;
        describe::tokenize(&self.http, &self.root, Some(&model), text).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::http::JsonBody;

    fn backend() -> VllmBackend {
        VllmBackend::new(
            "http://h:8000/v1",
            Some("m"),
            "m",
            None,
            Duration::from_secs(1),
        )
    }

    #[test]
    fn reads_ids_logprobs_alternatives_and_stop_reason() {
        let choice = json!({"index": 0, "finish_reason": "stop", "stop_reason": "###",
            "token_ids": [5, 7],
            "logprobs": {"token_logprobs": [-0.5, -0.25], "tokens": ["token_id:5", "token_id:7"],
                "top_logprobs": [{"token_id:5": -0.5, "token_id:9": -1.5}, {"token_id:7": -0.25}]}});
        let g = VllmBackend::parse_choice(&backend().http, &choice, true).unwrap();
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
        let g = VllmBackend::parse_choice(&backend().http, &choice, false).unwrap();
        assert_eq!(g.token_ids, vec![42]);
        assert_eq!(g.finish_reason, FinishReason::Length);
        let broken =
            json!({"logprobs": {"token_logprobs": [-0.1, -0.2], "tokens": ["token_id:1"]}});
        assert!(VllmBackend::parse_choice(&backend().http, &broken, false).is_err());
    }

    #[test]
    fn request_maps_sampling_fields() {
        let request = GenerateRequest {
            prompt: vec![1, 2].into(),
            params: crate::generation::SamplingParams {
                max_tokens: Some(8),
                top_k: Some(5),
                stop: vec!["x".into()],
                ..Default::default()
            },
            n: 2,
            session: None,
            adapter: None,
            routed_experts_from: None,
            images: Default::default(),
        };
        let body: Value =
            serde_json::from_slice(&VllmBackend::completions_body("m", &request).to_json())
                .unwrap();
        assert_eq!(body["prompt"], json!([1, 2]));
        assert_eq!(body["max_tokens"], 8);
        assert_eq!(body["top_k"], 5);
        assert_eq!(body["stop"], json!(["x"]));
        assert!(
            body.get("temperature").is_none(),
            "unset fields keep the server default"
        );
        assert_eq!(body["return_token_ids"], true);
        let generate: Value = serde_json::from_slice(
            &backend()
                .generate_body(&request, &request.prompt, false)
                .to_json(),
        )
        .unwrap();
        assert_eq!(generate["token_ids"], json!([1, 2]));
        assert_eq!(generate["sampling_params"]["max_tokens"], 8);
        assert_eq!(generate["sampling_params"]["n"], 2);
        assert!(body.get("structured_outputs").is_none());
    }

    #[test]
    fn constraints_go_in_structured_outputs() {
        let mut request = GenerateRequest {
            prompt: vec![1].into(),
            params: crate::generation::SamplingParams {
                constraint: Some(Constraint::Grammar("root ::= \"a\"".into())),
                ..Default::default()
            },
            n: 1,
            session: None,
            adapter: None,
            routed_experts_from: None,
            images: Default::default(),
        };
        let body: Value =
            serde_json::from_slice(&VllmBackend::completions_body("m", &request).to_json())
                .unwrap();
        assert_eq!(
            body["structured_outputs"],
            json!({"grammar": "root ::= \"a\""})
        );
        request.params.constraint = Some(Constraint::JsonSchema(json!({"type": "object"})));
        let generate: Value = serde_json::from_slice(
            &backend()
                .generate_body(&request, &request.prompt, false)
                .to_json(),
        )
        .unwrap();
        assert_eq!(
            generate["sampling_params"]["structured_outputs"],
            json!({"json": {"type": "object"}})
        );
    }

    /// A choice as vLLM 0.32 writes it (from a real server's reply), its sample drawn from two
    /// weight versions (paused in place, weights updated, resumed).
    #[test]
    fn reads_generate_endpoint_choices() {
        let choice = json!({"index": 0, "finish_reason": "length", "stop_reason": null,
            "token_ids": [12095, 151645], "routed_experts": null, "sampling_mask": null,
            "weight_versions": [{"version": "v2", "start": 1, "end": 2}, {"version": "default", "start": 0, "end": 1}],
            "logprobs": {"content": [
                {"token_id": 12095, "logprob": -0.12, "rank": 1,
                 "top_logprobs": [{"token_id": 12095, "logprob": -0.12, "rank": 1}]},
                {"token_id": 151645, "logprob": -0.01, "rank": 1, "top_logprobs": []}]}});
        let g = VllmBackend::parse_generate_choice(&backend().http, &choice, true).unwrap();
        assert_eq!(g.token_ids, vec![12095, 151645]);
        assert_eq!(g.logprobs, vec![-0.12, -0.01]);
        assert_eq!(g.finish_reason, FinishReason::Length);
        assert_eq!(g.top_logprobs.unwrap()[0], vec![(12095, -0.12)]);
        assert_eq!(
            g.weight_version.as_deref(),
            Some("v2"),
            "the version it ended on"
        );
        let spans: Vec<_> = g
            .weight_spans
            .iter()
            .map(|s| (s.version.as_str(), s.start, s.end))
            .collect();
        assert_eq!(spans, vec![("default", 0, 1), ("v2", 1, 2)]);
    }
}
