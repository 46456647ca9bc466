//! OpenTelemetry export (`--otlp-endpoint`): every turn's `turn` span leaves the process as an
//! OpenTelemetry span that follows the GenAI semantic conventions — named `chat MODEL` (or
//! `text_completion MODEL`), kind client, with `gen_ai.operation.name`,
//! `gen_ai.request.model`, `gen_ai.conversation.id` (the session), `gen_ai.usage.input_tokens`,
//! `gen_ai.usage.output_tokens`, `gen_ai.usage.cache_read.input_tokens`,
//! `gen_ai.response.finish_reasons`, `server.address` / `server.port` (the backend), and
//! `error.type` with an error status when the turn failed — sent in batches over OTLP/HTTP
//! (protobuf) by the OpenTelemetry SDK.
//!
//! Without an endpoint nothing here costs more than a flag check per turn: the span keeps its
//! two log fields (`session`, `api`), and the attribute setters find no OpenTelemetry layer.

use opentelemetry::trace::{Status, TracerProvider as _};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

/// The name of the span every turn runs in.
pub const TURN_SPAN: &str = "turn";

/// Set once the exporter is installed: turn spans then get their OpenTelemetry name and kind
/// (tracing fields, which the log lines would show otherwise).
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// The exporter cannot be set up.
#[derive(Debug, thiserror::Error)]
#[error("--otlp-endpoint {endpoint}: {reason}")]
pub struct TelemetryError {
    endpoint: String,
    reason: String,
}

/// The running exporter; [`OtlpExport::shutdown`] sends what is still batched.
#[derive(Debug)]
pub struct OtlpExport {
    provider: SdkTracerProvider,
}

impl OtlpExport {
    /// Sends the spans still batched and stops the exporter.
    pub fn shutdown(&self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "the OTLP exporter did not shut down cleanly");
        }
    }
}

/// A layer that exports turn spans to the OTLP/HTTP collector at `endpoint` (a base URL such as
/// `http://localhost:4318`, to which `/v1/traces` is added, or the full traces URL), and the
/// exporter's handle. Other spans and events are not exported.
pub fn otlp_layer<S>(endpoint: &str) -> Result<(impl Layer<S> + use<S>, OtlpExport), TelemetryError>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    use opentelemetry_otlp::WithExportConfig;
    let error = |reason: String| TelemetryError {
        endpoint: endpoint.to_string(),
        reason,
    };
    let url = traces_url(endpoint).map_err(error)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(url)
        .build()
        .map_err(|e| error(e.to_string()))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name("rollout-proxy")
                .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                .build(),
        )
        .build();
    let tracer = provider.tracer("rollout-proxy");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_level(false)
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
            meta.is_span() && meta.name() == TURN_SPAN
        }));
    EXPORTING.store(true, Ordering::Relaxed);
    Ok((layer, OtlpExport { provider }))
}

/// `endpoint` with the traces path added to a bare base URL.
fn traces_url(endpoint: &str) -> Result<String, String> {
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .ok_or("give an http:// or https:// URL")?;
    match rest.split_once('/') {
        None | Some((_, "")) => Ok(format!("{}/v1/traces", endpoint.trim_end_matches('/'))),
        Some(_) => Ok(endpoint.to_string()),
    }
}

/// The span a turn of `api` on `session` runs in, for the served `model`.
pub fn turn_span(session: &uuid::Uuid, api: &'static str, model: &str) -> tracing::Span {
    let span = tracing::info_span!(
        TURN_SPAN,
        session = %session,
        api,
        otel.name = Empty,
        otel.kind = Empty
    );
    if EXPORTING.load(Ordering::Relaxed) {
        let operation = match api {
            "completions" => "text_completion",
            _ => "chat",
        };
        span.record("otel.name", format!("{operation} {model}"));
        span.record("otel.kind", "client");
        span.set_attribute("gen_ai.operation.name", operation);
        span.set_attribute("gen_ai.request.model", model.to_string());
        span.set_attribute("gen_ai.conversation.id", session.to_string());
        span.set_attribute("rollout.api", api);
    }
    span
}

/// What a recorded turn used and how it ended.
#[derive(Debug, Clone, Copy)]
pub struct TurnUsage<'a> {
    /// Prompt tokens (the whole node the turn extends, and its new prompt).
    pub input_tokens: u64,
    /// Sampled tokens, over every choice.
    pub output_tokens: u64,
    /// Prompt tokens the backend served from its prefix cache.
    pub cached_tokens: u64,
    /// The backend's base URL.
    pub backend: &'a str,
}

/// Sets a recorded turn's usage, finish reasons and backend on the current turn span.
pub fn record_usage(usage: TurnUsage, finish_reasons: impl Iterator<Item = &'static str>) {
    if !EXPORTING.load(Ordering::Relaxed) {
        return;
    }
    let span = tracing::Span::current();
    span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens as i64);
    span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens as i64);
    span.set_attribute(
        "gen_ai.usage.cache_read.input_tokens",
        usage.cached_tokens as i64,
    );
    let reasons: Vec<opentelemetry::StringValue> = finish_reasons.map(Into::into).collect();
    span.set_attribute(
        "gen_ai.response.finish_reasons",
        Value::Array(reasons.into()),
    );
    span.set_attribute("rollout.backend", usage.backend.to_string());
    if let Some((host, port)) = host_and_port(usage.backend) {
        span.set_attribute("server.address", host.to_string());
        if let Some(port) = port {
            span.set_attribute("server.port", i64::from(port));
        }
    }
}

/// Marks the current turn span as failed with `cause` (a short machine-readable name).
pub fn record_failure(cause: &'static str, message: &dyn std::fmt::Display) {
    if !EXPORTING.load(Ordering::Relaxed) {
        return;
    }
    let span = tracing::Span::current();
    span.set_attribute("error.type", cause);
    span.set_status(Status::error(message.to_string()));
}

/// The host and port of a base URL (`http://10.0.0.5:8000/v1` → `10.0.0.5`, 8000).
fn host_and_port(url: &str) -> Option<(&str, Option<u16>)> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().filter(|a| !a.is_empty())?;
    // A colon inside an IPv6 literal's brackets is not a port's.
    Some(match authority.rfind(':') {
        Some(at) if !authority[at..].contains(']') => {
            (&authority[..at], authority[at + 1..].parse().ok())
        }
        _ => (authority, None),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_gets_the_traces_path() {
        assert_eq!(
            traces_url("http://localhost:4318").unwrap(),
            "http://localhost:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://localhost:4318/").unwrap(),
            "http://localhost:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://c.example/otlp/v1/traces").unwrap(),
            "https://c.example/otlp/v1/traces"
        );
        assert!(traces_url("localhost:4318").is_err());
    }

    #[test]
    fn backends_are_split_into_host_and_port() {
        assert_eq!(
            host_and_port("http://10.0.0.5:8000/v1"),
            Some(("10.0.0.5", Some(8000)))
        );
        assert_eq!(
            host_and_port("https://api.example"),
            Some(("api.example", None))
        );
        assert_eq!(
            host_and_port("http://[::1]:9000"),
            Some(("[::1]", Some(9000)))
        );
    }
}
