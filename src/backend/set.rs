//! The configured backends, replaceable at run time (`POST /setup`), with per-backend limits.

use super::{Backend, BackendError, GenerateRequest, Generation, SglangBackend, VllmBackend};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::Semaphore;

/// Which wire protocol a server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// vLLM `/v1/completions` with token-id prompts.
    Vllm,
    /// SGLang native `/generate`.
    Sglang,
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

/// One server entry, in the Atropos `APIServerConfig` shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendConfig {
    pub base_url: String,
    #[serde(default = "default_kind")]
    pub server_type: BackendKind,
    #[serde(default)]
    pub api_key: Option<String>,
    /// Requests this server may have in flight at once.
    #[serde(default = "default_limit")]
    pub num_max_requests_at_once: usize,
    /// Per-request timeout in seconds.
    #[serde(default = "default_timeout")]
    pub timeout: f64,
    /// Served model name sent to vLLM; defaults to the proxy's model name.
    #[serde(default)]
    pub model_name: Option<String>,
}

/// A backend with its limits and counters.
#[derive(Debug)]
pub struct Member {
    pub config: BackendConfig,
    client: Box<dyn Backend>,
    slots: Semaphore,
    in_flight: AtomicUsize,
    requests: AtomicU64,
    errors: AtomicU64,
    healthy: AtomicBool,
}

impl Member {
    fn new(config: BackendConfig, model_name: &str) -> Self {
        let timeout = Duration::from_secs_f64(config.timeout.max(0.001));
        let client: Box<dyn Backend> = match config.server_type {
            BackendKind::Vllm => Box::new(VllmBackend::new(
                &config.base_url,
                config.model_name.as_deref().unwrap_or(model_name),
                config.api_key.clone(),
                timeout,
            )),
            BackendKind::Sglang => Box::new(SglangBackend::new(
                &config.base_url,
                config.api_key.clone(),
                timeout,
            )),
        };
        Self {
            slots: Semaphore::new(config.num_max_requests_at_once.max(1)),
            config,
            client,
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
        }
    }

    /// Sends one request, holding one of the backend's slots while it runs.
    pub async fn generate(
        &self,
        request: &GenerateRequest,
    ) -> Result<Vec<Generation>, BackendError> {
        let _slot = self
            .slots
            .acquire()
            .await
            .expect("semaphore is never closed");
        // A guard, because a client that disconnects drops this future mid-request.
        let _in_flight = InFlight::enter(&self.in_flight);
        self.requests.fetch_add(1, Ordering::Relaxed);
        let result = self.client.generate(request).await;
        match &result {
            Ok(_) => self.healthy.store(true, Ordering::Relaxed),
            Err(error) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                if matches!(
                    error,
                    BackendError::Unreachable { .. } | BackendError::Timeout { .. }
                ) {
                    self.healthy.store(false, Ordering::Relaxed);
                }
            }
        }
        result
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// What `GET /servers` shows for this backend.
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "base_url": self.config.base_url,
            "server_type": self.config.server_type,
            "healthy": self.is_healthy(),
            "in_flight": self.in_flight.load(Ordering::Relaxed),
            "num_max_requests_at_once": self.config.num_max_requests_at_once,
            "requests": self.requests.load(Ordering::Relaxed),
            "errors": self.errors.load(Ordering::Relaxed),
        })
    }
}

/// Counts one request in flight for as long as it lives.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// All configured backends. Cloning the member list is cheap, so a request keeps using the
/// backend it picked even if `/setup` replaces the list meanwhile.
#[derive(Debug)]
pub struct BackendSet {
    model_name: String,
    members: RwLock<Arc<Vec<Arc<Member>>>>,
}

impl BackendSet {
    pub fn new(model_name: &str, configs: Vec<BackendConfig>) -> Self {
        let set = Self {
            model_name: model_name.to_string(),
            members: RwLock::new(Arc::new(Vec::new())),
        };
        set.replace(configs);
        set
    }

    /// Replaces every backend (in-flight requests finish on the old ones).
    pub fn replace(&self, configs: Vec<BackendConfig>) {
        let members = configs
            .into_iter()
            .map(|c| Arc::new(Member::new(c, &self.model_name)))
            .collect();
        *self.members.write().expect("backend list lock") = Arc::new(members);
    }

    /// A snapshot of the current backends.
    pub fn members(&self) -> Arc<Vec<Arc<Member>>> {
        self.members.read().expect("backend list lock").clone()
    }

    /// The backend for a request: the one at `pinned` if given, else the healthy one with the
    /// fewest requests in flight.
    pub fn pick(&self, pinned: Option<&str>) -> Result<Arc<Member>, BackendError> {
        let members = self.members();
        if members.is_empty() {
            return Err(BackendError::NoBackend("no backend is configured".into()));
        }
        if let Some(url) = pinned {
            let wanted = url.trim_end_matches('/');
            return members
                .iter()
                .find(|m| m.config.base_url.trim_end_matches('/') == wanted)
                .cloned()
                .ok_or_else(|| BackendError::NoBackend(format!("no backend with base_url {url}")));
        }
        let load = |m: &Arc<Member>| (!m.is_healthy(), m.in_flight.load(Ordering::Relaxed));
        Ok(members
            .iter()
            .min_by_key(|m| load(m))
            .cloned()
            .expect("non-empty"))
    }
}
