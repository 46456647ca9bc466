//! `GET /metrics`: what the proxy does, in Prometheus' text format (the `prometheus-client`
//! crate): turns and tokens by API and backend, time per stage of a turn, node divergences by
//! reason, failed turns by cause, tool-call markup by format and outcome, calls handed back
//! changed but recognised; and, read at scrape
//! time, each backend's health, requests in
//! flight, errors and retries, the live sessions, turns under way and at a backend, and the
//! journal's size.

use crate::tools::CallOutcomes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::time::{Duration, Instant};

/// A stage of a turn whose time is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Read the request body and parse it into the turn (at the HTTP edge).
    Parse,
    /// Render and tokenize the prompt that extends the node (the two stages below, and
    /// matching the request to the node).
    Plan,
    /// Render the chat template.
    Render,
    /// Tokenize the rendered text that is new to the node.
    Tokenize,
    /// Wait for a slot on a backend (the pool's queue); zero when one is free.
    Queue,
    /// From asking the backend (the pool's queue included) to the whole sample.
    Backend,
    /// A stream's time to its first sampled tokens.
    FirstToken,
    /// Journal (with `--data-dir`) and apply the turn.
    Commit,
    /// The whole turn in the pipeline.
    Turn,
}

impl Stage {
    fn name(self) -> &'static str {
        match self {
            Self::Parse => "parse",
            Self::Plan => "plan",
            Self::Render => "render",
            Self::Tokenize => "tokenize",
            Self::Queue => "queue",
            Self::Backend => "backend",
            Self::FirstToken => "first_token",
            Self::Commit => "commit",
            Self::Turn => "turn",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TurnLabel {
    api: &'static str,
    backend: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabel {
    api: &'static str,
    backend: String,
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolCallLabel {
    parser: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChangeLabel {
    change: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabel {
    api: &'static str,
    cause: &'static str,
}

/// The turn metrics, updated as turns run.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    turns: Family<TurnLabel, Counter>,
    tokens: Family<TokenLabel, Counter>,
    stages: Family<StageLabel, Histogram>,
    divergences: Family<ReasonLabel, Counter>,
    failures: Family<FailureLabel, Counter>,
    tool_calls: Family<ToolCallLabel, Counter>,
    tail_renders: Family<OutcomeLabel, Counter>,
    echoed_calls: Family<ChangeLabel, Counter>,
}

/// The tokens of one recorded turn.
#[derive(Debug, Clone, Copy, Default)]
pub struct TurnTokens {
    /// Prompt tokens sent.
    pub prompt: u64,
    /// Tokens sampled (every choice).
    pub sampled: u64,
    /// Prompt tokens the backend served from its prefix cache.
    pub cached: u64,
}

impl Default for Metrics {
    fn default() -> Self {
        let turns = Family::default();
        let tokens = Family::default();
        // 100 µs to about 100 s.
        let stages = Family::<StageLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0001, 4.0, 11))
        });
        let divergences = Family::default();
        let failures = Family::default();
        let tool_calls = Family::default();
        let tail_renders = Family::default();
        let echoed_calls = Family::default();
        let mut registry = Registry::with_prefix("rollout");
        registry.register("turns", "Turns recorded", turns.clone());
        registry.register("tokens", "Tokens of recorded turns", tokens.clone());
        registry.register("stage_seconds", "Time per stage of a turn", stages.clone());
        registry.register(
            "node_divergences",
            "Turns that could not extend a node, by reason",
            divergences.clone(),
        );
        registry.register(
            "turn_failures",
            "Turns that failed (nothing recorded), by cause",
            failures.clone(),
        );
        registry.register(
            "tool_calls",
            "Call markup in recorded replies, by tool-call format and outcome",
            tool_calls.clone(),
        );
        registry.register(
            "tail_renders",
            "Turns rendered from the end of their conversation only, by outcome: used, \
             verified (a full render agreed), mismatch (it did not; the full one was used)",
            tail_renders.clone(),
        );
        registry.register(
            "echoed_calls_changed",
            "Tool calls a client handed back changed but recognised (the sampled ids stand), by \
             change: formatting, defaults",
            echoed_calls.clone(),
        );
        Self {
            registry,
            turns,
            tokens,
            stages,
            divergences,
            failures,
            tool_calls,
            tail_renders,
            echoed_calls,
        }
    }
}

impl Metrics {
    /// A recorded turn of `api` on `backend`.
    pub fn turn(&self, api: &'static str, backend: &str, tokens: TurnTokens) {
        let backend = backend.to_string();
        self.turns
            .get_or_create(&TurnLabel {
                api,
                backend: backend.clone(),
            })
            .inc();
        for (kind, count) in [
            ("prompt", tokens.prompt),
            ("sampled", tokens.sampled),
            ("cached", tokens.cached),
        ] {
            let label = TokenLabel {
                api,
                backend: backend.clone(),
                kind,
            };
            self.tokens.get_or_create(&label).inc_by(count);
        }
    }

    /// Times `stage` until the guard is dropped.
    pub fn timed(&self, stage: Stage) -> Timed<'_> {
        Timed {
            metrics: self,
            stage,
            started: Instant::now(),
        }
    }

    /// The time a stage took.
    pub fn time(&self, stage: Stage, took: Duration) {
        let label = StageLabel {
            stage: stage.name(),
        };
        self.stages
            .get_or_create(&label)
            .observe(took.as_secs_f64());
    }

    /// A turn that started a new node for `reason`.
    pub fn divergence(&self, reason: &'static str) {
        self.divergences
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// A turn rendered from the end of its conversation only, and how it went.
    pub fn tail_render(&self, outcome: &'static str) {
        self.tail_renders
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// A call handed back with `change` (see `crate::tools::echo`), still recognised.
    pub fn echoed_call(&self, change: &'static str) {
        self.echoed_calls
            .get_or_create(&ChangeLabel { change })
            .inc();
    }

    /// A turn of `api` that failed with `cause`.
    pub fn failure(&self, api: &'static str, cause: &'static str) {
        self.failures
            .get_or_create(&FailureLabel { api, cause })
            .inc();
    }

    /// The call markup of a recorded reply in the `parser` format, by how it fared.
    pub fn tool_calls(&self, parser: &str, outcomes: CallOutcomes) {
        for (outcome, count) in [
            ("promoted", outcomes.promoted),
            ("healed", outcomes.healed),
            ("left_as_text", outcomes.left_as_text),
        ] {
            if count > 0 {
                let label = ToolCallLabel {
                    parser: parser.to_string(),
                    outcome,
                };
                self.tool_calls
                    .get_or_create(&label)
                    .inc_by(u64::from(count));
            }
        }
    }

    /// The text of every metric: these, then `live`'s.
    pub fn encode(&self, live: &Live) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)?;
        prometheus_client::encoding::prometheus_text::encode(&mut text, &live.registry())?;
        Ok(text)
    }
}

/// Times a stage while it lives (see [`Metrics::timed`]).
#[derive(Debug)]
pub struct Timed<'m> {
    metrics: &'m Metrics,
    stage: Stage,
    started: Instant,
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        self.metrics.time(self.stage, self.started.elapsed());
    }
}

/// One backend as read at scrape time.
#[derive(Debug, Clone)]
pub struct BackendReading {
    /// Its base URL.
    pub url: String,
    /// Whether it may take traffic.
    pub healthy: bool,
    /// Requests it serves now.
    pub in_flight: u64,
    /// Requests, failed requests and retries so far.
    pub requests: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Retries made.
    pub retries: u64,
}

/// What is read from the proxy's state at scrape time.
#[derive(Debug, Clone, Default)]
pub struct Live {
    /// Every backend.
    pub backends: Vec<BackendReading>,
    /// Live sessions.
    pub sessions: u64,
    /// Turns under way.
    pub turns_under_way: u64,
    /// Turns at a backend (past the pause gate).
    pub turns_at_backend: u64,
    /// Bytes of the journal (`--data-dir`).
    pub journal_bytes: Option<u64>,
    /// Whether new turns are held (`POST /pause`).
    pub paused: bool,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabel {
    backend: String,
}

impl Live {
    fn registry(&self) -> Registry {
        let mut registry = Registry::with_prefix("rollout");
        let healthy = Family::<BackendLabel, Gauge>::default();
        let in_flight = Family::<BackendLabel, Gauge>::default();
        let requests = Family::<BackendLabel, Counter>::default();
        let errors = Family::<BackendLabel, Counter>::default();
        let retries = Family::<BackendLabel, Counter>::default();
        for backend in &self.backends {
            let label = BackendLabel {
                backend: backend.url.clone(),
            };
            healthy
                .get_or_create(&label)
                .set(i64::from(backend.healthy));
            in_flight
                .get_or_create(&label)
                .set(backend.in_flight as i64);
            requests.get_or_create(&label).inc_by(backend.requests);
            errors.get_or_create(&label).inc_by(backend.errors);
            retries.get_or_create(&label).inc_by(backend.retries);
        }
        registry.register(
            "backend_healthy",
            "1 while the backend may take traffic",
            healthy,
        );
        registry.register(
            "backend_in_flight",
            "Requests the backend serves now",
            in_flight,
        );
        registry.register("backend_requests", "Requests sent to the backend", requests);
        registry.register(
            "backend_errors",
            "Requests to the backend that failed",
            errors,
        );
        registry.register("backend_retries", "Requests retried", retries);
        let gauge = |value: u64| {
            let gauge = Gauge::<i64>::default();
            gauge.set(value as i64);
            gauge
        };
        registry.register("sessions", "Live sessions", gauge(self.sessions));
        registry.register(
            "turns_at_backend",
            "Turns at a backend",
            gauge(self.turns_at_backend),
        );
        registry.register(
            "turns_under_way",
            "Turns under way",
            gauge(self.turns_under_way),
        );
        registry.register(
            "paused",
            "1 while new turns are held",
            gauge(u64::from(self.paused)),
        );
        if let Some(bytes) = self.journal_bytes {
            registry.register(
                "journal_bytes",
                "Size of the journal (--data-dir)",
                gauge(bytes),
            );
        }
        registry
    }
}
