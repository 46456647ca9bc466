//! What a backend is asked for and what it gives back: sampling parameters, a generation
//! request, the sampled continuation with its finish reason, and the events of a streamed one.
//!
//! These types sit apart from [`crate::backend`] so the request, session and turn modules can
//! speak of samples without depending on the clients that produce them.

use serde::Serialize;

/// Sampling settings of one request, in OpenAI terms; each client maps them to its wire names.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SamplingParams {
    /// Most tokens to sample.
    pub max_tokens: Option<u32>,
    /// Sampling temperature (0: greedy).
    pub temperature: Option<f64>,
    /// Nucleus sampling threshold.
    pub top_p: Option<f64>,
    /// Sample among this many most likely tokens.
    pub top_k: Option<i64>,
    /// Drop tokens below this fraction of the top probability.
    pub min_p: Option<f64>,
    /// Seed for reproducible sampling.
    pub seed: Option<i64>,
    /// Strings that end the sample.
    pub stop: Vec<String>,
    /// Number of alternatives to return per position (OpenAI `top_logprobs`), if any.
    pub top_logprobs: Option<u32>,
    /// What the sample must be (constrained decoding), if anything.
    #[serde(skip)]
    pub constraint: Option<Constraint>,
}

/// Highest temperature accepted (OpenAI's is 2, Anthropic's 1; vLLM and SGLang take more, up
/// to a point).
pub const MAX_TEMPERATURE: f64 = 100.0;
/// Most alternatives per position (OpenAI's limit, and vLLM's default `max_logprobs`).
pub const MAX_TOP_LOGPROBS: u32 = 20;
/// Most stop strings per request, and the longest one (each sampled token is checked against
/// them all).
pub const MAX_STOP: usize = 64;
/// The longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 4096;

impl SamplingParams {
    /// Refuses what no backend accepts (the ranges OpenAI, Anthropic, vLLM and SGLang
    /// document, taken together): a 400 naming the field. Each API's adapter narrows its own
    /// fields further where its API does (Anthropic's temperature is at most 1).
    pub fn check(&self) -> Result<(), String> {
        let unit = |name: &str, value: Option<f64>| match value {
            Some(v) if !(0.0..=1.0).contains(&v) => {
                Err(format!("'{name}' must be in [0, 1], not {v}"))
            }
            _ => Ok(()),
        };
        if let Some(t) = self.temperature
            && !(0.0..=MAX_TEMPERATURE).contains(&t)
        {
            return Err(format!(
                "'temperature' must be between 0 and {MAX_TEMPERATURE}, not {t}"
            ));
        }
        unit("top_p", self.top_p)?;
        unit("min_p", self.min_p)?;
        if let Some(k) = self.top_k
            && !(-1..=i64::from(i32::MAX)).contains(&k)
        {
            return Err(format!(
                "'top_k' must be -1 or 0 (no limit) or a positive count, not {k}"
            ));
        }
        if self.max_tokens == Some(0) {
            return Err("'max_tokens' must be at least 1".into());
        }
        if self.top_logprobs.is_some_and(|k| k > MAX_TOP_LOGPROBS) {
            return Err(format!("'top_logprobs' must be at most {MAX_TOP_LOGPROBS}"));
        }
        if self.stop.len() > MAX_STOP {
            return Err(format!("at most {MAX_STOP} stop strings are accepted"));
        }
        if self.stop.iter().any(|s| s.len() > MAX_STOP_BYTES) {
            return Err(format!(
                "a stop string may be at most {MAX_STOP_BYTES} bytes"
            ));
        }
        Ok(())
    }
}

/// What a sample must be, enforced by the backend's constrained decoding
/// ([`crate::grammar`] builds it from the request).
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// A GBNF grammar (a forced tool call).
    Grammar(String),
    /// A JSON schema the sample's text must satisfy (`response_format`).
    JsonSchema(serde_json::Value),
}

impl Constraint {
    /// The request option that asked for it, as errors name it.
    pub fn option(&self) -> &'static str {
        match self {
            Self::Grammar(_) => "tool_choice",
            Self::JsonSchema(_) => "response_format",
        }
    }
}

/// One generation request: `n` samples continuing `prompt`.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// The prompt's token ids, shared with the turn that planned them (never copied per
    /// request or choice).
    pub prompt: std::sync::Arc<Vec<u32>>,
    /// How to sample.
    pub params: SamplingParams,
    /// How many samples.
    pub n: u32,
    /// The session the request continues: its id goes in the headers routers hash for
    /// session affinity (vLLM's `X-Session-ID`, the SGLang gateway's `X-SMG-Routing-Key`).
    pub session: Option<std::sync::Arc<str>>,
    /// The LoRA adapter to sample with, by the name the server serves it under (the session's
    /// `adapter`).
    pub adapter: Option<std::sync::Arc<str>>,
    /// Ask for the experts each position was routed to, from this position on (the rows the
    /// node being extended lacks); `None`: do not ask.
    pub routed_experts_from: Option<u32>,
    /// The images of the prompt, in order, each with the run of placeholders it fills in
    /// `prompt` (empty for a text prompt). Only a backend that expands placeholders as the
    /// proxy did takes them ([`crate::backend`]).
    pub images: std::sync::Arc<[PromptImage]>,
}

/// An image in a node: the run of placeholder tokens (`<|image_pad|>`) it fills, and the
/// image's hash and patch grid, from which a trainer rebuilds its pixel values and M-RoPE
/// positions (the bytes are served by `GET /blobs/{sha256}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageSpan {
    /// SHA-256 of the image's bytes, lowercase hex.
    pub sha256: std::sync::Arc<str>,
    /// The bytes' media type (`image/png`, ...).
    pub media_type: std::sync::Arc<str>,
    /// Position of the run's first placeholder.
    pub offset: usize,
    /// Placeholders in the run.
    pub length: usize,
    /// The processor's patch grid `[t, h, w]` (`image_grid_thw`).
    pub grid_thw: [u32; 3],
}

/// An image of a prompt, with its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptImage {
    /// Where it stands in the prompt.
    pub span: ImageSpan,
    /// The image as the client sent it.
    pub bytes: std::sync::Arc<[u8]>,
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

/// The weights a stretch of a sample was drawn from, when a sample spans a weight update (a
/// server paused in place, its weights swapped, then resumed): tokens `start..end` of the
/// sample came from `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WeightSpan {
    /// The weight version the server reported.
    pub version: String,
    /// The first sampled token drawn from it.
    pub start: u32,
    /// One past the last.
    pub end: u32,
}

/// The experts a mixture-of-experts model routed positions to, as the server reported them
/// (for routing replay in training): one row of `width` expert ids (`layers` × top-k) per
/// position from `from` on, through the sample's last fed position (the final sampled token
/// is never fed, so it has none until the next turn feeds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedExperts {
    /// The first position the rows cover, in the request's prompt and sample.
    pub from: u32,
    /// Expert ids per row.
    pub width: u32,
    /// MoE layers per row, when the server says (vLLM does; SGLang writes flat rows).
    pub layers: Option<u32>,
    /// The rows, `width` ids each.
    pub ids: Vec<u16>,
}

impl RoutedExperts {
    /// Rows held.
    pub fn rows(&self) -> usize {
        self.ids.len() / (self.width.max(1) as usize)
    }
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
    /// Why the sample ended.
    pub finish_reason: FinishReason,
    /// What stopped it, when the backend says.
    pub stop: Option<StopMatch>,
    /// Policy/weight version the backend reports (SGLang `weight_version`, vLLM's when set):
    /// the one the sample ended on.
    pub weight_version: Option<String>,
    /// Every version the sample was drawn from, when it spanned more than one.
    pub weight_spans: Vec<WeightSpan>,
    /// The experts the prompt and sample were routed to, when asked for and reported.
    pub routed_experts: Option<RoutedExperts>,
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
            weight_spans: Vec::new(),
            routed_experts: None,
            cached_tokens: None,
            approximate: false,
        }
    }
}

impl Generation {
    /// Takes the weight versions a server reports as spans of the sample
    /// (`[{"version", "start", "end"}]`, vLLM's and SGLang's `weight_versions`): the version it
    /// ended on, and every span when there are several. Anything else leaves both as they are.
    pub fn set_weight_spans(&mut self, spans: &serde_json::Value) {
        let Some(list) = spans.as_array() else {
            return;
        };
        let mut spans: Vec<WeightSpan> = list
            .iter()
            .filter_map(|span| {
                Some(WeightSpan {
                    version: span["version"].as_str()?.to_string(),
                    start: u32::try_from(span["start"].as_u64()?).ok()?,
                    end: u32::try_from(span["end"].as_u64()?).ok()?,
                })
            })
            .collect();
        spans.sort_by_key(|span| span.start);
        let Some(last) = spans.last() else {
            return;
        };
        self.weight_version = Some(last.version.clone());
        if spans.len() > 1 {
            self.weight_spans = spans;
        }
    }
}

/// A piece of one streamed sample.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// Tokens sampled since the previous event, with the backend's logprobs.
    Tokens {
        /// The ids sampled since the previous event.
        token_ids: Vec<u32>,
        /// Their logprobs.
        logprobs: Vec<f32>,
        /// Their top alternatives, when requested.
        top_logprobs: Option<Vec<Vec<(u32, f32)>>>,
    },
    /// The sample ended (the fields of a [`Generation`] other than its tokens).
    Finished {
        /// Why the sample ended.
        finish_reason: FinishReason,
        /// What stopped it, when the backend says.
        stop: Option<StopMatch>,
        /// The weight version the backend reports.
        weight_version: Option<String>,
        /// Every version the sample was drawn from, when it spanned more than one.
        weight_spans: Vec<WeightSpan>,
        /// The experts the prompt and sample were routed to, when reported.
        routed_experts: Option<RoutedExperts>,
        /// Prompt tokens served from the prefix cache.
        cached_tokens: Option<u32>,
        /// The ids were recovered from text, not sampled as ids ([`Generation::approximate`]).
        approximate: bool,
    },
}

impl Generation {
    /// Adds a streamed event to a sample being assembled.
    pub fn apply(&mut self, event: StreamEvent) {
        match event {
            StreamEvent::Tokens {
                token_ids,
                logprobs,
                top_logprobs,
            } => {
                // A whole sample arrives as one event: taken, not copied.
                match self.token_ids.is_empty() {
                    true => (self.token_ids, self.logprobs) = (token_ids, logprobs),
                    false => {
                        self.token_ids.extend(token_ids);
                        self.logprobs.extend(logprobs);
                    }
                }
                if let Some(top) = top_logprobs {
                    self.top_logprobs.get_or_insert_with(Vec::new).extend(top);
                }
            }
            StreamEvent::Finished {
                finish_reason,
                stop,
                weight_version,
                weight_spans,
                routed_experts,
                cached_tokens,
                approximate,
            } => {
                self.approximate = approximate;
                self.finish_reason = finish_reason;
                self.stop = stop;
                self.weight_version = weight_version;
                self.weight_spans = weight_spans;
                self.routed_experts = routed_experts;
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
                weight_spans: self.weight_spans,
                routed_experts: self.routed_experts,
                cached_tokens: self.cached_tokens,
                approximate: self.approximate,
            },
        ]
    }
}
