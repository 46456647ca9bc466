//! SGLang through its native `POST /generate` with `input_ids` and `return_logprob`.

use super::describe;
use super::experts::{self, Encoding};
use super::http::{IdsBody, JsonClient, event_stream, server_root};
use super::{Backend, BackendError, EventStream, ServerInfo};
use crate::generation::{
    Constraint, FinishReason, GenerateRequest, Generation, StopMatch, StreamEvent,
};
use crate::json_shape::{FromShape, deserialize_by_shape};
use async_trait::async_trait;
use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;

/// An SGLang server.
#[derive(Debug)]
pub struct SglangBackend {
    http: JsonClient,
    root: String,
}

impl SglangBackend {
    /// A client for the SGLang server at `base_url`.
    pub fn new(base_url: &str, api_key: Option<String>, timeout: Duration) -> Self {
        Self {
            http: JsonClient::new(base_url, api_key, timeout),
            root: server_root(base_url),
        }
    }

    fn body(request: &GenerateRequest, stream: bool) -> IdsBody<'_, GenerateFields<'_>> {
        let p = &request.params;
        let fields = GenerateFields {
            sampling_params: SamplingFields {
                n: request.n,
                max_new_tokens: p.max_tokens,
                temperature: p.temperature,
                top_p: p.top_p,
                top_k: p.top_k,
                min_p: p.min_p,
                sampling_seed: p.seed,
                stop: &p.stop,
                ebnf: match &p.constraint {
                    Some(Constraint::Grammar(grammar)) => Some(grammar),
                    _ => None,
                },
                // SGLang takes the schema as JSON text.
                json_schema: match &p.constraint {
                    Some(Constraint::JsonSchema(schema)) => Some(schema.to_string()),
                    _ => None,
                },
            },
            return_logprob: true,
            logprob_start_len: -1,
            top_logprobs_num: p.top_logprobs.unwrap_or(0),
            return_text_in_logprobs: false,
            stream,
            lora_path: request.adapter.as_deref(),
            return_routed_experts: request.routed_experts_from.is_some(),
            routed_experts_start_len: request.routed_experts_from,
        };
        IdsBody::new("input_ids", &request.prompt, fields)
    }

    fn parse_output(
        http: &JsonClient,
        output: Output,
        want_top: bool,
    ) -> Result<Generation, BackendError> {
        let meta = output.meta_info;
        let finish = meta.finish_reason.unwrap_or_default();
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
        let pairs = meta
            .output_token_logprobs
            .ok_or_else(|| http.protocol("meta_info has no output_token_logprobs"))?;
        let mut token_ids = Vec::with_capacity(pairs.len());
        let mut logprobs = Vec::with_capacity(pairs.len());
        for pair in pairs {
            let (Some(lp), Some(id)) = (pair.logprob, pair.id) else {
                return Err(http.protocol("output_token_logprobs entry is not [logprob, id, text]"));
            };
            logprobs.push(lp as f32);
            token_ids.push(id as u32);
        }
        if let Some(ids) = output.output_ids
            && (ids.len() != token_ids.len()
                || ids.iter().zip(&token_ids).any(|(a, b)| *a != u64::from(*b)))
        {
            return Err(http.protocol("output_ids disagree with output_token_logprobs"));
        }
        let top_logprobs = want_top.then(|| {
            meta.output_top_logprobs
                .unwrap_or_default()
                .into_iter()
                .map(|alts| {
                    alts.unwrap_or_default()
                        .into_iter()
                        .filter_map(|alt| Some((alt.id? as u32, alt.logprob? as f32)))
                        .collect()
                })
                .collect()
        });
        let mut generation = Generation::new(token_ids, logprobs, finish_reason);
        generation.top_logprobs = top_logprobs;
        generation.stop = stop;
        generation.weight_version = meta.weight_version.as_str().map(str::to_string);
        generation.set_weight_spans(&meta.weight_versions);
        generation.cached_tokens = meta.cached_tokens.as_u64().map(|n| n as u32);
        Ok(generation)
    }
}

/// The fields of a `/generate` request besides `input_ids`, typed because one is written
/// every turn (building them as JSON maps cost about 2% of a short turn).
#[derive(Debug, Serialize)]
struct GenerateFields<'r> {
    sampling_params: SamplingFields<'r>,
    return_logprob: bool,
    logprob_start_len: i32,
    top_logprobs_num: u32,
    return_text_in_logprobs: bool,
    stream: bool,
    /// The LoRA adapter, by the name the server loaded it under.
    #[serde(skip_serializing_if = "Option::is_none")]
    lora_path: Option<&'r str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    return_routed_experts: bool,
    /// The first position whose routing comes back.
    #[serde(skip_serializing_if = "Option::is_none")]
    routed_experts_start_len: Option<u32>,
}

/// SGLang's `SamplingParams`; absent ones keep the server's default.
#[derive(Debug, Serialize)]
struct SamplingFields<'r> {
    n: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_new_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sampling_seed: Option<i64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop: &'r [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    ebnf: Option<&'r String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    json_schema: Option<String>,
}

/// The outputs of `/generate`: one object, or an array of them when `n` > 1.
struct Outputs(Vec<Output>);

impl<'de> Deserialize<'de> for Outputs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OutputsVisitor;
        impl<'de> Visitor<'de> for OutputsVisitor {
            type Value = Outputs;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a /generate output or an array of them")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Outputs, A::Error> {
                let mut outputs = Vec::new();
                while let Some(output) = seq.next_element()? {
                    outputs.push(output);
                }
                Ok(Outputs(outputs))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Outputs, A::Error> {
                let output = Output::deserialize(MapAccessDeserializer::new(map))?;
                Ok(Outputs(vec![output]))
            }
        }
        deserializer.deserialize_any(OutputsVisitor)
    }
}

/// One output of `/generate` (a stream chunk has the same shape), read straight into the fields
/// used: a reply holds a number triple per sampled token, and a JSON value for each cost more
/// than the rest of the backend call. The small fields stay JSON, read as leniently as before.
#[derive(Debug, Deserialize)]
struct Output {
    output_ids: Option<Vec<u64>>,
    #[serde(default)]
    meta_info: Meta,
}

#[derive(Debug, Default, Deserialize)]
struct Meta {
    finish_reason: Option<Value>,
    output_token_logprobs: Option<Vec<TokenLogprob>>,
    output_top_logprobs: Option<Vec<Option<Vec<TokenLogprob>>>>,
    #[serde(default)]
    weight_version: Value,
    /// `[{"version", "start", "end"}]` over the sample (SGLang 0.5.23 on).
    #[serde(default)]
    weight_versions: Value,
    /// Base64 of `int32` expert ids, when asked for (`return_routed_experts`).
    #[serde(default)]
    routed_experts: Value,
    #[serde(default)]
    cached_tokens: Value,
}

/// A JSON number, or `None` for any other value (read past without building it).
#[derive(Debug, Clone, Copy)]
enum Number {
    Float(f64),
    Unsigned(u64),
    Signed(i64),
    Other,
}

impl Number {
    fn as_f64(self) -> Option<f64> {
        match self {
            Number::Float(f) => Some(f),
            Number::Unsigned(n) => Some(n as f64),
            Number::Signed(n) => Some(n as f64),
            Number::Other => None,
        }
    }

    fn as_u64(self) -> Option<u64> {
        match self {
            Number::Unsigned(n) => Some(n),
            Number::Signed(n) => u64::try_from(n).ok(),
            Number::Float(_) | Number::Other => None,
        }
    }
}

impl FromShape for Number {
    fn other() -> Self {
        Number::Other
    }
    fn from_f64(v: f64) -> Self {
        Number::Float(v)
    }
    fn from_u64(v: u64) -> Self {
        Number::Unsigned(v)
    }
    fn from_i64(v: i64) -> Self {
        Number::Signed(v)
    }
}

deserialize_by_shape!(Number);

/// A `[logprob, token_id, text]` entry; a field that is not a number is `None`.
#[derive(Debug)]
struct TokenLogprob {
    logprob: Option<f64>,
    id: Option<u64>,
}

impl<'de> Deserialize<'de> for TokenLogprob {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = TokenLogprob;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a [logprob, token_id, text] entry")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TokenLogprob, A::Error> {
                let logprob = seq.next_element::<Number>()?.and_then(|n| n.as_f64());
                let id = seq.next_element::<Number>()?.and_then(|n| n.as_u64());
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(TokenLogprob { logprob, id })
            }
        }
        deserializer.deserialize_seq(EntryVisitor)
    }
}

#[async_trait]
impl Backend for SglangBackend {
    fn base_url(&self) -> &str {
        &self.http.base_url
    }

    async fn generate(&self, request: &GenerateRequest) -> Result<Vec<Generation>, BackendError> {
        let Outputs(outputs) = self
            .http
            .post(
                &self.root,
                "/generate",
                &Self::body(request, false),
                request.session.as_deref(),
            )
            .await?;
        let want_top = request.params.top_logprobs.is_some();
        outputs
            .into_iter()
            .map(|mut output| {
                let reported = output.meta_info.routed_experts.take();
                let mut generation = Self::parse_output(&self.http, output, want_top)?;
                let tokens = request.prompt.len() + generation.token_ids.len();
                let from = request.routed_experts_from;
                generation.routed_experts =
                    experts::reported(&reported, from, tokens, Encoding::Int32);
                Ok(generation)
            })
            .collect()
    }

    async fn generate_stream(
        &self,
        request: &GenerateRequest,
    ) -> Result<EventStream, BackendError> {
        let bytes = self
            .http
            .post_stream(
                &self.root,
                "/generate",
                &Self::body(request, true),
                request.session.as_deref(),
            )
            .await?;
        let http = self.http.clone();
        let want_top = request.params.top_logprobs.is_some();
        let (prompt, experts_from) = (request.prompt.len(), request.routed_experts_from);
        let mut seen = 0usize;
        Ok(event_stream(self.http.clone(), bytes, move |chunk| {
            let mut output = Output::deserialize(chunk)
                .map_err(|e| http.protocol(format!("invalid stream chunk: {e}")))?;
            let reported = output.meta_info.routed_experts.take();
            let mut so_far = Self::parse_output(&http, output, want_top)?;
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
            so_far.routed_experts =
                experts::reported(&reported, experts_from, prompt + total, Encoding::Int32);
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

    /// `GET /v1/models` (`id`, `max_model_len`), as SGLang 0.5 serves it.
    async fn describe(&self) -> Result<ServerInfo, BackendError> {
        describe::openai_models(&self.http, &self.root, None).await
    }

    async fn tokenize(&self, text: &str) -> Result<Option<Vec<u32>>, BackendError> {
        describe::tokenize(&self.http, &self.root, None, text).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::http::JsonBody;
    use crate::generation::SamplingParams;
    use serde_json::json;

    fn typed(output: Value) -> Output {
        serde_json::from_value(output).unwrap()
    }

    #[test]
    fn a_reply_is_one_output_or_an_array_of_them() {
        let one = r#"{"meta_info": {"output_token_logprobs": [[-0.5, 3, "x", 1]]}}"#;
        let Outputs(outputs) = serde_json::from_str(one).unwrap();
        assert_eq!(outputs.len(), 1);
        let entry = &outputs[0].meta_info.output_token_logprobs.as_ref().unwrap()[0];
        assert_eq!((entry.logprob, entry.id), (Some(-0.5), Some(3)));
        let two = format!("[{one}, {one}]");
        let Outputs(outputs) = serde_json::from_str(&two).unwrap();
        assert_eq!(outputs.len(), 2);
        assert!(serde_json::from_str::<Outputs>("3").is_err());
    }

    #[test]
    fn generate_bodies_send_the_ids_logprob_flags_and_only_the_sampling_fields_given() {
        let mut request = GenerateRequest {
            prompt: vec![1, 2].into(),
            params: SamplingParams::default(),
            n: 1,
            session: None,
            adapter: None,
            routed_experts_from: None,
            images: Default::default(),
        };
        let body = |request: &GenerateRequest, stream| {
            let bytes = SglangBackend::body(request, stream).to_json();
            serde_json::from_slice::<Value>(&bytes).unwrap()
        };
        assert_eq!(
            body(&request, false),
            json!({"input_ids": [1, 2], "sampling_params": {"n": 1}, "return_logprob": true,
                "logprob_start_len": -1, "top_logprobs_num": 0,
                "return_text_in_logprobs": false, "stream": false})
        );
        request.n = 3;
        request.params = SamplingParams {
            max_tokens: Some(8),
            temperature: Some(0.5),
            top_p: Some(0.9),
            top_k: Some(5),
            min_p: Some(0.1),
            seed: Some(-7),
            stop: vec!["x".into()],
            top_logprobs: Some(2),
            constraint: Some(Constraint::Grammar("root ::= \"a\"".into())),
        };
        let streamed = body(&request, true);
        assert_eq!(
            streamed["sampling_params"],
            json!({"n": 3, "max_new_tokens": 8, "temperature": 0.5, "top_p": 0.9, "top_k": 5,
                "min_p": 0.1, "sampling_seed": -7, "stop": ["x"], "ebnf": "root ::= \"a\""})
        );
        request.params.constraint = Some(Constraint::JsonSchema(json!({"type": "object"})));
        assert_eq!(
            body(&request, false)["sampling_params"]["json_schema"],
            "{\"type\":\"object\"}",
            "SGLang takes the schema as text"
        );
        assert_eq!(
            (&streamed["top_logprobs_num"], &streamed["stream"]),
            (&json!(2), &json!(true))
        );
    }

    fn backend() -> SglangBackend {
        SglangBackend::new("http://h:30000", None, Duration::from_secs(1))
    }

    #[test]
    fn reads_output_logprobs_finish_and_weight_version() {
        let output = json!({"output_ids": [3, 4], "meta_info": {
            "finish_reason": {"type": "stop", "matched": 4}, "weight_version": "v7",
            "output_token_logprobs": [[-0.5, 3, null], [-0.1, 4, null]],
            "output_top_logprobs": [[[-0.5, 3, null], [-2.0, 8, null]], [[-0.1, 4, null]]]}});
        let g = SglangBackend::parse_output(&backend().http, typed(output), true).unwrap();
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
            SglangBackend::parse_output(&backend().http, typed(aborted), false),
            Err(BackendError::Aborted { .. })
        ));
        let mismatched = json!({"output_ids": [9], "meta_info": {"finish_reason": {"type": "length", "length": 1},
            "output_token_logprobs": [[-0.5, 3, null]]}});
        assert!(SglangBackend::parse_output(&backend().http, typed(mismatched), false).is_err());
        let bad_entry = json!({"meta_info": {"output_token_logprobs": [[null, 3, null]]}});
        assert!(SglangBackend::parse_output(&backend().http, typed(bad_entry), false).is_err());
        for entry in [
            json!([-0.5, "3"]),
            json!([-0.5, -3]),
            json!([-0.5, 3.5]),
            json!([[1], 3]),
        ] {
            let output = json!({"meta_info": {"output_token_logprobs": [entry]}});
            assert!(SglangBackend::parse_output(&backend().http, typed(output), false).is_err());
        }
        let odd = json!({"meta_info": {"output_token_logprobs": [[-1, 3, {"t": [1]}, "x"]]}});
        let g = SglangBackend::parse_output(&backend().http, typed(odd), false).unwrap();
        assert_eq!((g.token_ids, g.logprobs), (vec![3], vec![-1.0]));
    }
}
