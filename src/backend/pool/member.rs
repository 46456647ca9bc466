//! One backend in the pool: its client, its request limit, its health and its counters.

use super::super::{
    Backend, BackendConfig, BackendError, PROBE_TEXT, PoolSettings, Probe, ServerInfo,
};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Health as a small state machine that doubles as the circuit breaker: `unhealthy_after`
/// consecutive failures open it (no traffic); `healthy_after` consecutive good probes close it;
/// after `breaker_cooldown` one trial request may go through (half-open).
#[derive(Debug)]
struct Health {
    healthy: bool,
    failures: u32,
    successes: u32,
    opened_at: Option<Instant>,
    trial_in_flight: bool,
    /// How the latest health probe went (none yet: unknown).
    probe_passed: Option<bool>,
}

/// The answer to a request for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reserve {
    Taken,
    /// At its request limit: worth waiting for.
    Full,
    /// Unhealthy (circuit open): not worth waiting for.
    Unavailable,
}

/// A backend with its limits, health and counters.
#[derive(Debug)]
pub struct Member {
    /// The entry as configured.
    pub config: BackendConfig,
    pub(super) client: Box<dyn Backend>,
    in_flight: AtomicUsize,
    requests: AtomicU64,
    errors: AtomicU64,
    retries: AtomicU64,
    health: Mutex<Health>,
    /// What the server said about itself, once it answered.
    described: OnceLock<Described>,
}

/// A server's account of itself, and whether it may serve.
#[derive(Debug)]
struct Described {
    info: ServerInfo,
    /// Why it must not serve (its tokenizer differs from the proxy's).
    refused: Option<String>,
}

impl Member {
    pub(super) fn new(config: BackendConfig, client: Box<dyn Backend>) -> Self {
        Self {
            config,
            client,
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            health: Mutex::new(Health {
                healthy: true,
                failures: 0,
                successes: 0,
                opened_at: None,
                trial_in_flight: false,
                probe_passed: None,
            }),
            described: OnceLock::new(),
        }
    }

    /// Asks the server about itself and checks it tokenizes `probe` as the proxy does, unless
    /// it answered already; a server that cannot answer yet is asked again next time.
    pub(super) async fn describe(&self, probe: Option<&Probe>) {
        if self.described.get().is_some() {
            return;
        }
        let info = match self.client.describe().await {
            Ok(info) => info,
            Err(error) => {
                tracing::debug!(backend = %self.base_url(), %error, "cannot describe the backend yet");
                return;
            }
        };
        let refused = match probe {
            None => None,
            Some(probe) => match self.client.tokenize(PROBE_TEXT).await {
                Ok(Some(ids)) => probe.mismatch(self.base_url(), &ids),
                // No tokenize route, or one that takes other requests: nothing to compare.
                Ok(None) => None,
                Err(BackendError::Status { status, .. })
                    if (400..500).contains(&status) || status == 501 =>
                {
                    None
                }
                Err(error) => {
                    tracing::debug!(backend = %self.base_url(), %error, "cannot tokenize the probe yet");
                    return;
                }
            },
        };
        match &refused {
            Some(reason) => tracing::error!(backend = %self.base_url(), %reason, "backend refused"),
            None => tracing::info!(backend = %self.base_url(), model = ?info.model,
                context_length = ?info.context_length, "backend described"),
        }
        let _ = self.described.set(Described { info, refused });
    }

    /// What the server said about itself, once it answered.
    pub fn info(&self) -> Option<&ServerInfo> {
        self.described.get().map(|d| &d.info)
    }

    /// Why the server must not serve, if it must not.
    pub fn refused(&self) -> Option<&str> {
        self.described.get()?.refused.as_deref()
    }

    /// The backend's base URL.
    pub fn base_url(&self) -> &str {
        &self.config.base_url
    }

    /// Requests it is serving now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Requests sent to it, those that failed, and retries, so far.
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.requests.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
            self.retries.load(Ordering::Relaxed),
        )
    }

    /// Whether its last health check passed.
    pub fn is_healthy(&self) -> bool {
        self.health.lock().expect("health lock").healthy
    }

    /// Load as a fraction of the backend's limit (what least-loaded routing compares).
    pub(super) fn load(&self) -> f64 {
        self.in_flight() as f64 / self.config.num_max_requests_at_once.max(1) as f64
    }

    /// Takes one request slot if the backend is under its limit and may take traffic.
    pub(super) fn try_reserve(&self, settings: &PoolSettings) -> Reserve {
        if self.refused().is_some() {
            return Reserve::Unavailable;
        }
        {
            let mut health = self.health.lock().expect("health lock");
            if !health.healthy {
                let cooled = health.opened_at.is_some_and(|t| {
                    t.elapsed() >= Duration::from_secs_f64(settings.breaker_cooldown)
                });
                if !cooled || health.trial_in_flight {
                    return Reserve::Unavailable;
                }
                health.trial_in_flight = true;
            }
        }
        let reserved = self.reserve_slot();
        if reserved == Reserve::Full {
            self.health.lock().expect("health lock").trial_in_flight = false;
        }
        reserved
    }

    /// Takes one request slot, its circuit open or not, if the backend is under its limit and
    /// its latest health probe passed: the last resort when no backend may take traffic, so
    /// that failed requests alone (a burst of 5xx, timeouts) never take out every backend
    /// whose server still answers.
    pub(super) fn try_reserve_answering(&self) -> Reserve {
        if self.refused().is_some() {
            return Reserve::Unavailable;
        }
        if self.health.lock().expect("health lock").probe_passed != Some(true) {
            return Reserve::Unavailable;
        }
        self.reserve_slot()
    }

    fn reserve_slot(&self) -> Reserve {
        let limit = self.config.num_max_requests_at_once.max(1);
        let reserved = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok();
        if !reserved {
            return Reserve::Full;
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        Reserve::Taken
    }

    /// Gives back a slot taken by [`try_reserve`](Self::try_reserve).
    pub(super) fn release(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.health.lock().expect("health lock").trial_in_flight = false;
    }

    /// Records how a request ended, for health and counters.
    pub(super) fn record(&self, result: &Result<(), &BackendError>, settings: &PoolSettings) {
        match result {
            Ok(()) => self.record_health(true, true, settings),
            Err(error) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                if is_backend_fault(error) {
                    self.record_health(false, true, settings);
                }
            }
        }
    }

    /// Records a health probe.
    pub(super) fn record_probe(&self, ok: bool, settings: &PoolSettings) {
        self.record_health(ok, false, settings);
    }

    pub(super) fn count_retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    fn record_health(&self, ok: bool, from_request: bool, settings: &PoolSettings) {
        let mut health = self.health.lock().expect("health lock");
        if !from_request {
            health.probe_passed = Some(ok);
        }
        if ok {
            health.failures = 0;
            health.successes += 1;
            // A real request that succeeds (the half-open trial) closes the breaker at once.
            if !health.healthy && (from_request || health.successes >= settings.healthy_after) {
                health.healthy = true;
                health.opened_at = None;
                tracing::info!(backend = %self.config.base_url, "backend healthy again");
            }
        } else {
            health.successes = 0;
            health.failures += 1;
            if health.healthy && health.failures >= settings.unhealthy_after {
                health.healthy = false;
                tracing::warn!(backend = %self.config.base_url, failures = health.failures, "backend marked unhealthy");
            }
            if !health.healthy {
                health.opened_at = Some(Instant::now());
            }
        }
    }

    /// What `GET /servers` shows for this backend.
    pub fn status(&self) -> serde_json::Value {
        let health = self.health.lock().expect("health lock");
        let mut status = serde_json::json!({
            "base_url": self.config.base_url,
            "server_type": self.config.server_type,
            "healthy": health.healthy,
            "consecutive_failures": health.failures,
            "in_flight": self.in_flight(),
            "num_max_requests_at_once": self.config.num_max_requests_at_once,
            "requests": self.requests.load(Ordering::Relaxed),
            "errors": self.errors.load(Ordering::Relaxed),
            "retries": self.retries.load(Ordering::Relaxed),
        });
        if let Some(described) = self.described.get() {
            status["model"] = described.info.model.clone().into();
            status["context_length"] = described.info.context_length.into();
            status["refused"] = described.refused.clone().into();
        }
        if let Some(stats) = self.client.stats() {
            status["engine"] = stats;
        }
        status
    }
}

/// Failures that say something about the backend's health (not the request's).
fn is_backend_fault(error: &BackendError) -> bool {
    match error {
        BackendError::Status { status, .. } => *status >= 500,
        BackendError::Unreachable { .. }
        | BackendError::Timeout { .. }
        | BackendError::Protocol { .. } => true,
        _ => false,
    }
}

/// Failures that happened before the backend produced anything, so the request can be sent
/// again without changing its meaning.
pub(super) fn is_retryable(error: &BackendError) -> bool {
    match error {
        BackendError::Unreachable { .. } | BackendError::Aborted { .. } => true,
        BackendError::Status { status, .. } => matches!(status, 429 | 502 | 503),
        _ => false,
    }
}
