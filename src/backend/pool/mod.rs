//! The backend pool: routing, session affinity, failover, backpressure and health checks.
//!
//! A request is routed to the backend its session is pinned to (by the client at create) or
//! prefers (the one it started on, for prefix-cache reuse), else to the healthy backend with
//! the lowest load relative to its `num_max_requests_at_once`. When every backend is at its
//! limit the request waits in a bounded queue. A failure before the backend produced anything
//! is retried with jittered backoff, first on the same backend, then on another.
//!
//! Failures open a backend's circuit (no traffic until its probes pass again or a trial
//! request succeeds). Request failures alone never take out every backend, though: when no
//! backend may take traffic, one whose latest probe passed gets the request anyway (a burst of
//! 5xx or timeouts on a live server should slow a run down, not stop it).

mod member;

pub use member::Member;
use member::Reserve;

use super::{
    BackendConfig, BackendError, BackendKind, Control, EventStream, PoolSettings, Probe, ServerInfo,
};
use crate::generation::{GenerateRequest, Generation};
use crate::metrics::{Metrics, Stage};
use futures::StreamExt;
use member::is_retryable;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::Notify;

/// Where a request may go.
#[derive(Debug, Clone, Copy)]
pub enum Route<'a> {
    /// Only this backend (the client pinned `base_url`).
    Pinned(&'a str),
    /// This backend when it can take the request, else any.
    Prefer(Option<&'a str>),
}

/// Samples and the backend that produced each.
#[derive(Debug)]
pub struct Sampled {
    /// The samples, in the order asked for.
    pub generations: Vec<Generation>,
    /// The backend that produced each sample.
    pub backends: Vec<Arc<str>>,
}

/// Makes a client for a backend entry (kept outside the pool so tests and the engine can plug
/// in their own).
pub type ClientFactory = Box<dyn Fn(&BackendConfig) -> Box<dyn super::Backend> + Send + Sync>;

/// All configured backends.
pub struct Pool {
    settings: PoolSettings,
    factory: ClientFactory,
    members: RwLock<Arc<Vec<Arc<Member>>>>,
    waiting: AtomicUsize,
    freed: Arc<Notify>,
    turns_with_history: AtomicU64,
    turns_on_same_backend: AtomicU64,
    /// Where the time requests wait for a slot is reported.
    metrics: Option<Arc<Metrics>>,
    /// The text every backend must tokenize as the proxy does.
    probe: Option<Probe>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("settings", &self.settings)
            .finish()
    }
}

/// A reserved request slot on one backend, given back when dropped (also when the request's
/// future is dropped because the client went away).
struct Lease {
    member: Arc<Member>,
    freed: Arc<Notify>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.member.release();
        self.freed.notify_waiters();
    }
}

impl Pool {
    /// A pool of `servers`, each client made by `factory`.
    pub fn new(
        settings: PoolSettings,
        factory: ClientFactory,
        configs: Vec<BackendConfig>,
    ) -> Self {
        let pool = Self {
            settings,
            factory,
            members: RwLock::new(Arc::new(Vec::new())),
            waiting: AtomicUsize::new(0),
            freed: Arc::new(Notify::new()),
            turns_with_history: AtomicU64::new(0),
            turns_on_same_backend: AtomicU64::new(0),
            metrics: None,
            probe: None,
        };
        pool.replace(configs);
        pool
    }

    /// Reports the time each request waits for a backend slot (`Stage::Queue`) to `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Refuses backends whose tokenizer gives other ids for the probe text than `probe`.
    pub fn with_probe(mut self, probe: Probe) -> Self {
        self.probe = Some(probe);
        self
    }

    /// Asks every backend that has not answered yet about itself (and checks its tokenizer),
    /// waiting at most `within`.
    pub async fn describe_all(&self, within: Duration) {
        let members = self.members();
        let asked = members.iter().map(|m| m.describe(self.probe.as_ref()));
        let _ = tokio::time::timeout(within, futures::future::join_all(asked)).await;
    }

    /// Asks every backend's own scheduler to `action`; per backend, whether it did (`true`),
    /// has no such control (`false`), or failed (the error).
    pub async fn control(&self, action: &Control) -> Vec<serde_json::Value> {
        let members = self.members();
        let asked = members.iter().map(|m| async move {
            let done = m.client.control(action).await;
            let mut entry = serde_json::json!({"base_url": m.base_url()});
            match done {
                Ok(done) => entry[action.name()] = done.into(),
                Err(error) => {
                    tracing::warn!(backend = %m.base_url(), %error, action = action.name(), "backend control failed");
                    entry["error"] = error.to_string().into();
                }
            }
            entry
        });
        futures::future::join_all(asked).await
    }

    /// The first base model a backend reported serving.
    pub fn reported_model(&self) -> Option<String> {
        let members = self.members();
        members.iter().find_map(|m| m.info()?.model.clone())
    }

    /// The smallest context window the backends reported (a prompt must fit any of them).
    pub fn context_length(&self) -> Option<usize> {
        let members = self.members();
        members
            .iter()
            .filter_map(|m| m.info().and_then(|i: &ServerInfo| i.context_length))
            .min()
            .map(|n| n as usize)
    }

    /// Its routing, health, retry and queue settings.
    pub fn settings(&self) -> &PoolSettings {
        &self.settings
    }

    /// Replaces every backend (requests in flight finish on the old ones).
    pub fn replace(&self, configs: Vec<BackendConfig>) {
        let members = configs
            .into_iter()
            .map(|c| {
                let client = (self.factory)(&c);
                Arc::new(Member::new(c, client))
            })
            .collect();
        *self.members.write().expect("backend list lock") = Arc::new(members);
        self.freed.notify_waiters();
    }

    /// A snapshot of the current backends.
    pub fn members(&self) -> Arc<Vec<Arc<Member>>> {
        self.members.read().expect("backend list lock").clone()
    }

    /// Whether a backend with this base URL is configured.
    pub fn contains(&self, base_url: &str) -> bool {
        self.members()
            .iter()
            .any(|m| same_url(m.base_url(), base_url))
    }

    /// Why a session with a LoRA adapter cannot be served on `route` (its pinned backend, else
    /// any), if it cannot: llama-server and the in-process engine load no adapters by name.
    pub fn adapter_refusal(&self, route: Option<&str>) -> Option<String> {
        let members = self.members();
        let refused = members
            .iter()
            .filter(|m| route.is_none_or(|url| same_url(m.base_url(), url)))
            .find(|m| {
                matches!(
                    m.config.server_type,
                    BackendKind::Llamacpp | BackendKind::Embedded
                )
            })?;
        Some(format!(
            "backend {} ({:?}) serves no LoRA adapters by name: a session with an adapter needs \
             vLLM, SGLang or an OpenAI-compatible server",
            refused.base_url(),
            refused.config.server_type
        ))
    }

    /// Generates `request.n` samples, splitting large `n` across calls; all or nothing.
    pub async fn generate(
        &self,
        request: &GenerateRequest,
        route: Route<'_>,
    ) -> Result<Sampled, BackendError> {
        let chunk = self.settings.max_n_completions.max(1);
        let calls: Vec<GenerateRequest> = (0..request.n)
            .step_by(chunk as usize)
            .map(|start| GenerateRequest {
                n: chunk.min(request.n - start),
                ..request.clone()
            })
            .collect();
        let results =
            futures::future::join_all(calls.iter().map(|call| self.generate_once(call, route)))
                .await;
        let mut sampled = Sampled {
            generations: Vec::with_capacity(request.n as usize),
            backends: Vec::with_capacity(request.n as usize),
        };
        for result in results {
            let (generations, backend) = result?;
            sampled
                .backends
                .extend(std::iter::repeat_n(backend, generations.len()));
            sampled.generations.extend(generations);
        }
        Ok(sampled)
    }

    /// One backend call with failover.
    async fn generate_once(
        &self,
        request: &GenerateRequest,
        route: Route<'_>,
    ) -> Result<(Vec<Generation>, Arc<str>), BackendError> {
        let (generations, lease) = self
            .with_failover(route, |member| async move {
                takes_images(&member, request)?;
                member.client.generate(request).await
            })
            .await?;
        if generations.len() != request.n as usize {
            return Err(BackendError::Protocol {
                url: lease.member.base_url().to_string(),
                reason: format!("asked for {} samples, got {}", request.n, generations.len()),
            });
        }
        Ok((generations, Arc::from(lease.member.base_url())))
    }

    /// Streams one sample. Failover applies until the stream is open; once the backend has
    /// started sending, a failure ends the stream with an error. The backend's slot is held
    /// until the stream is finished or dropped.
    pub async fn generate_stream(
        &self,
        request: &GenerateRequest,
        route: Route<'_>,
    ) -> Result<(EventStream, Arc<str>), BackendError> {
        let (events, lease) = self
            .with_failover(route, |member| async move {
                takes_images(&member, request)?;
                member.client.generate_stream(request).await
            })
            .await?;
        let backend = Arc::from(lease.member.base_url());
        let settings = self.settings.clone();
        let events = events.inspect(move |event| {
            if let Err(error) = event {
                lease.member.record(&Err(error), &settings);
            }
        });
        Ok((Box::pin(events), backend))
    }

    /// Runs `call` on a backend the route allows, retrying failures that happened before the
    /// backend produced anything: first on the same backend, then elsewhere.
    async fn with_failover<T, F, Fut>(
        &self,
        route: Route<'_>,
        call: F,
    ) -> Result<(T, Lease), BackendError>
    where
        F: Fn(Arc<Member>) -> Fut,
        Fut: std::future::Future<Output = Result<T, BackendError>>,
    {
        let mut avoid: Option<Arc<Member>> = None;
        let mut attempt = 0;
        let mut last_failure: Option<BackendError> = None;
        loop {
            // A retry that finds no backend left (its own failures may just have opened the
            // circuit) reports the failure that made it retry, not the empty pool.
            let lease = match self.acquire(route, avoid.as_ref()).await {
                Ok(lease) => lease,
                Err(error) => return Err(last_failure.unwrap_or(error)),
            };
            let result = call(lease.member.clone()).await;
            lease
                .member
                .record(&result.as_ref().map(|_| ()), &self.settings);
            match result {
                Ok(value) => return Ok((value, lease)),
                Err(error) if is_retryable(&error) && attempt < self.settings.max_retries => {
                    attempt += 1;
                    lease.member.count_retry();
                    tracing::warn!(backend = %lease.member.base_url(), attempt, %error, "retrying request");
                    if attempt >= 2 {
                        avoid = Some(lease.member.clone());
                    }
                    drop(lease);
                    last_failure = Some(error);
                    tokio::time::sleep(self.backoff(attempt)).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Exponential backoff with full jitter.
    fn backoff(&self, attempt: u32) -> Duration {
        let ceiling = (self.settings.retry_backoff * 2f64.powi(attempt as i32 - 1)).min(2.0);
        let jitter = (uuid::Uuid::new_v4().as_u128() % 1_000_000) as f64 / 1_000_000.0;
        Duration::from_secs_f64(ceiling * jitter)
    }

    /// Waits (boundedly) for a slot on a backend the route allows.
    async fn acquire(
        &self,
        route: Route<'_>,
        avoid: Option<&Arc<Member>>,
    ) -> Result<Lease, BackendError> {
        let _wait = self.metrics.as_ref().map(|m| m.timed(Stage::Queue));
        let deadline =
            tokio::time::Instant::now() + Duration::from_secs_f64(self.settings.queue_timeout);
        loop {
            // Register interest before looking, so a slot freed in between is not missed.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match self.try_acquire(route, avoid)? {
                Some(member) => {
                    return Ok(Lease {
                        member,
                        freed: self.freed.clone(),
                    });
                }
                None => {
                    let queued = self.waiting.fetch_add(1, Ordering::AcqRel);
                    let _queued = Queued(&self.waiting);
                    if queued >= self.settings.max_queued_requests {
                        return Err(BackendError::Saturated {
                            queued,
                            limit: self.settings.max_queued_requests,
                        });
                    }
                    // Also wake up periodically: an unhealthy backend's cooldown may end.
                    let wake = tokio::time::Instant::now() + Duration::from_millis(250);
                    if tokio::time::timeout_at(deadline.min(wake), freed)
                        .await
                        .is_err()
                        && tokio::time::Instant::now() >= deadline
                    {
                        return Err(BackendError::Busy {
                            waited: Duration::from_secs_f64(self.settings.queue_timeout),
                        });
                    }
                }
            }
        }
    }

    /// A backend with a free slot, if any; an error when the route can never be served.
    fn try_acquire(
        &self,
        route: Route<'_>,
        avoid: Option<&Arc<Member>>,
    ) -> Result<Option<Arc<Member>>, BackendError> {
        let members = self.members();
        if members.is_empty() {
            return Err(BackendError::NoBackend("no backend is configured".into()));
        }
        let (candidates, preferred): (Vec<&Arc<Member>>, Option<&str>) = match route {
            Route::Pinned(url) => {
                let pinned: Vec<_> = members
                    .iter()
                    .filter(|m| same_url(m.base_url(), url))
                    .collect();
                if pinned.is_empty() {
                    return Err(BackendError::NoBackend(format!(
                        "no backend with base_url {url}"
                    )));
                }
                (pinned, None)
            }
            Route::Prefer(url) => {
                let others: Vec<_> = members
                    .iter()
                    .filter(|m| avoid.is_none_or(|a| !Arc::ptr_eq(a, m)))
                    .collect();
                // With a single backend, "another" is the same one again.
                (
                    if others.is_empty() {
                        members.iter().collect()
                    } else {
                        others
                    },
                    url,
                )
            }
        };
        let mut order: Vec<&Arc<Member>> = candidates;
        order.sort_by(|a, b| a.load().total_cmp(&b.load()));
        if let Some(url) = preferred
            && let Some(at) = order.iter().position(|m| same_url(m.base_url(), url))
        {
            let member = order.remove(at);
            order.insert(0, member);
        }
        let mut any_full = false;
        for member in &order {
            match member.try_reserve(&self.settings) {
                Reserve::Taken => return Ok(Some((*member).clone())),
                Reserve::Full => any_full = true,
                Reserve::Unavailable => {}
            }
        }
        if !any_full {
            for member in &order {
                match member.try_reserve_answering() {
                    Reserve::Taken => return Ok(Some((*member).clone())),
                    Reserve::Full => any_full = true,
                    Reserve::Unavailable => {}
                }
            }
        }
        if any_full {
            return Ok(None);
        }
        let refusal = order.iter().find_map(|m| m.refused());
        Err(BackendError::NoBackend(refusal.map_or_else(
            || "no healthy backend (every candidate's circuit is open)".into(),
            str::to_string,
        )))
    }

    /// Counts, for a session's turn after its first, whether it ran where the session's previous
    /// turn ran (prefix-cache reuse).
    pub fn record_affinity(&self, previous: Option<&str>, used: &str) {
        if let Some(previous) = previous {
            self.turns_with_history.fetch_add(1, Ordering::Relaxed);
            if same_url(previous, used) {
                self.turns_on_same_backend.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// What `GET /servers` shows.
    pub fn status(&self) -> serde_json::Value {
        let turns = self.turns_with_history.load(Ordering::Relaxed);
        let same = self.turns_on_same_backend.load(Ordering::Relaxed);
        serde_json::json!({
            "servers": self.members().iter().map(|m| m.status()).collect::<Vec<_>>(),
            "queued": self.waiting.load(Ordering::Relaxed),
            "affinity": {
                "turns": turns,
                "same_backend": same,
                "ratio": if turns == 0 { serde_json::Value::Null } else { (same as f64 / turns as f64).into() },
            },
        })
    }

    /// Probes every backend's health endpoint forever, every `health_check_interval`.
    pub async fn run_health_checks(self: Arc<Self>) {
        let interval = Duration::from_secs_f64(self.settings.health_check_interval.max(0.05));
        loop {
            let members = self.members();
            let settings = &self.settings;
            let probe = self.probe.as_ref();
            let probes = members
                .iter()
                .filter(|m| m.config.health_check)
                .map(|m| async move {
                    let ok = m.client.health().await.is_ok();
                    m.record_probe(ok, settings);
                    if ok {
                        m.describe(probe).await;
                    }
                });
            futures::future::join_all(probes).await;
            self.freed.notify_waiters();
            tokio::time::sleep(interval).await;
        }
    }
}

/// Counts a request waiting in the queue for as long as it waits.
struct Queued<'a>(&'a AtomicUsize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Refuses a prompt with images on a backend that cannot take them token-exactly.
fn takes_images(member: &Member, request: &GenerateRequest) -> Result<(), BackendError> {
    match (request.images.is_empty(), member.client.refuses_images()) {
        (false, Some(reason)) => Err(BackendError::NoImages {
            url: member.base_url().to_string(),
            reason,
        }),
        _ => Ok(()),
    }
}

fn same_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

#[cfg(test)]
mod tests;
