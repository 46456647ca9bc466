//! Backend and pool configuration, in the Atropos `APIServerConfig` shape plus pool settings.

use serde::{Deserialize, Serialize};

/// Which wire protocol a server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// vLLM: `/inference/v1/generate` when the server has it, else `/v1/completions` with
    /// token-id prompts.
    Vllm,
    /// SGLang native `/generate`.
    Sglang,
    /// llama.cpp `llama-server` `/completion`.
    #[serde(alias = "llama.cpp", alias = "llama_cpp", alias = "llama-cpp")]
    Llamacpp,
    /// Any OpenAI-compatible text completions API: no token ids come back, so turns are
    /// re-tokenized by the proxy and marked approximate.
    Openai,
    /// The in-process llama.cpp engine (started by `--model` or by default; never named in a
    /// config file).
    #[serde(skip_deserializing)]
    Embedded,
}

impl BackendKind {
    /// Parses a command-line spelling.
    pub fn parse(value: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::from(value)).ok()
    }
}

fn default_kind() -> BackendKind {
    BackendKind::Vllm
}
fn default_limit() -> usize {
    512
}
fn default_timeout() -> f64 {
    1200.0
}
fn yes() -> bool {
    true
}

/// One server entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendConfig {
    /// The server's base URL (`http://host:port`).
    pub base_url: String,
    /// Which wire format the server speaks.
    #[serde(default = "default_kind")]
    pub server_type: BackendKind,
    /// Sent as a bearer token, when set.
    #[serde(default)]
    pub api_key: Option<String>,
    /// Requests this server may have in flight at once.
    #[serde(default = "default_limit")]
    pub num_max_requests_at_once: usize,
    /// Per-request timeout in seconds.
    #[serde(default = "default_timeout")]
    pub timeout: f64,
    /// Served model name sent to vLLM and OpenAI-style servers; defaults to the proxy's.
    #[serde(default)]
    pub model_name: Option<String>,
    /// Probe the server's health endpoint in the background.
    #[serde(default = "yes")]
    pub health_check: bool,
}

/// Longest duration a setting may give, in seconds (a week): `Duration` cannot hold every
/// float, and a longer wait is a mistake.
const MAX_SECONDS: f64 = 7.0 * 24.0 * 3600.0;

/// A setting out of range.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSetting(String);

/// Checks that `value` (seconds, named `name`) is a duration a setting may give.
fn check_seconds(name: &str, value: f64, allow_zero: bool) -> Result<(), InvalidSetting> {
    let low_ok = if allow_zero {
        value >= 0.0
    } else {
        value > 0.0
    };
    if value.is_finite() && low_ok && value <= MAX_SECONDS {
        return Ok(());
    }
    let low = if allow_zero { "0" } else { "above 0" };
    Err(InvalidSetting(format!(
        "'{name}' must be {low} and at most {MAX_SECONDS} seconds, not {value}"
    )))
}

impl BackendConfig {
    /// Checks the entry's values (a timeout `Duration` can hold, at least one slot).
    pub fn check(&self) -> Result<(), InvalidSetting> {
        if self.base_url.trim().is_empty() {
            return Err(InvalidSetting("'base_url' must not be empty".into()));
        }
        if self.num_max_requests_at_once == 0 {
            return Err(InvalidSetting(format!(
                "{}: 'num_max_requests_at_once' must be at least 1",
                self.base_url
            )));
        }
        check_seconds("timeout", self.timeout, false)
    }

    /// A server with every setting at its default.
    pub fn new(base_url: &str, server_type: BackendKind) -> Self {
        Self {
            base_url: base_url.to_string(),
            server_type,
            api_key: None,
            num_max_requests_at_once: default_limit(),
            timeout: default_timeout(),
            model_name: None,
            health_check: true,
        }
    }
}

/// How the pool routes, retries and protects backends (`"pool"` in the config file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PoolSettings {
    /// Seconds between health probes of each backend.
    pub health_check_interval: f64,
    /// Consecutive failures (probes or requests) after which a backend is taken out.
    pub unhealthy_after: u32,
    /// Consecutive successful probes after which it is put back.
    pub healthy_after: u32,
    /// Extra attempts for a request that failed before producing anything: the first on the
    /// same backend, the next ones on others.
    pub max_retries: u32,
    /// Base of the exponential retry backoff, in seconds (full jitter, capped at 2 s).
    pub retry_backoff: f64,
    /// Seconds an unhealthy backend waits before one trial request is let through.
    pub breaker_cooldown: f64,
    /// Requests allowed to wait when every backend is at its limit; more get 429.
    pub max_queued_requests: usize,
    /// Seconds a request may wait for a free backend before it gets 503.
    pub queue_timeout: f64,
    /// Largest `n` sent in one backend call; larger requests are split.
    pub max_n_completions: u32,
}

impl PoolSettings {
    /// Checks every duration is one a `Duration` can hold.
    pub fn check(&self) -> Result<(), InvalidSetting> {
        check_seconds("health_check_interval", self.health_check_interval, false)?;
        check_seconds("retry_backoff", self.retry_backoff, true)?;
        check_seconds("breaker_cooldown", self.breaker_cooldown, true)?;
        check_seconds("queue_timeout", self.queue_timeout, true)
    }
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            health_check_interval: 5.0,
            unhealthy_after: 3,
            healthy_after: 2,
            max_retries: 2,
            retry_backoff: 0.1,
            breaker_cooldown: 10.0,
            max_queued_requests: 1024,
            queue_timeout: 60.0,
            max_n_completions: 8,
        }
    }
}
