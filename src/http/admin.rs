//! Service-level routes: health, models, the backend list.

use super::body::read_json;
use super::{ApiError, AppState};
use crate::backend::BackendConfig;
use crate::metrics::{BackendReading, Live};
use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

/// `GET /health`: `ok` (200) while a backend is healthy, else `degraded` with a 503, the
/// status load balancers read to stop routing here.
pub async fn health(state: web::Data<AppState>) -> HttpResponse {
    let members = state.pipeline.backends.members();
    let healthy = members.iter().filter(|m| m.is_healthy()).count();
    let (status, mut reply) = match healthy {
        0 => ("degraded", HttpResponse::ServiceUnavailable()),
        _ => ("ok", HttpResponse::Ok()),
    };
    reply.json(json!({
        "status": status,
        "model": state.model_name,
        "sessions": state.sessions.len(),
        "servers": members.len(),
        "healthy_servers": healthy,
        "turns_under_way": state.pipeline.turns_under_way(),
        "turns_at_backend": state.pipeline.gate.turns_at_backend(),
        "paused": state.pipeline.gate.paused(),
        "weight_version": state.pipeline.gate.weight_version(),
        "fleet": super::control::fleet_health(&state).await,
        "journal": state.journal.as_ref().map(|log| json!({
            "bytes": log.bytes(),
            "recovered": log.recovered(),
        })),
    }))
}

/// `GET /v1/models`: the served model, as OpenAI lists models.
pub async fn models(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(json!({"object": "list", "data": [model_card(&state)]}))
}

/// `GET /v1/models/{model}`: the served model by its id (ids may hold `/`), else a 404.
pub async fn model(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    if id != state.model_name {
        return Err(ApiError::not_found(format!(
            "the model `{id}` does not exist; this proxy serves `{}`",
            state.model_name
        )));
    }
    Ok(HttpResponse::Ok().json(model_card(&state)))
}

/// `GET /{uuid}/v1/models`: the same list for clients whose base URL is a session's
/// (`/{uuid}/v1`: the OpenAI SDK, LiteLLM, agent frameworks); 404 for an unknown session.
pub async fn session_models(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    state.known_session(&path).await?;
    Ok(models(state).await)
}

/// `GET /{uuid}/v1/models/{model}`.
pub async fn session_model(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (session, id) = path.into_inner();
    state.known_session(&session).await?;
    model(state, web::Path::from(id)).await
}

fn model_card(state: &AppState) -> serde_json::Value {
    json!({
        "id": state.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "rollout-proxy",
    })
}

/// `GET /metrics`: Prometheus' text format.
pub async fn metrics(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let backends = state
        .pipeline
        .backends
        .members()
        .iter()
        .map(|member| {
            let (requests, errors, retries) = member.counts();
            BackendReading {
                url: member.base_url().to_string(),
                healthy: member.is_healthy(),
                in_flight: member.in_flight() as u64,
                requests,
                errors,
                retries,
            }
        })
        .collect();
    let live = Live {
        backends,
        sessions: state.sessions.len() as u64,
        turns_under_way: state.pipeline.turns_under_way() as u64,
        turns_at_backend: state.pipeline.gate.turns_at_backend() as u64,
        journal_bytes: state.journal.as_ref().and_then(|log| log.bytes()),
        paused: state.pipeline.gate.paused().is_some(),
    };
    let text = state.pipeline.metrics.encode(&live).map_err(|e| {
        ApiError::new(
            actix_web::http::StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            e.to_string(),
        )
    })?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(text))
}

pub async fn servers(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(state.pipeline.backends.status())
}

/// `POST /setup`: the same JSON as the config file (`servers` is what is used).
#[derive(Debug, Deserialize)]
pub struct SetupBody {
    servers: Vec<BackendConfig>,
}

pub async fn setup(
    state: web::Data<AppState>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body: SetupBody = read_json(payload, state.max_body_bytes).await?;
    for server in &body.servers {
        server
            .check()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    let count = body.servers.len();
    state.pipeline.backends.replace(body.servers);
    tracing::info!(servers = count, "backend list replaced");
    Ok(HttpResponse::Ok().json(json!({"status": "ok", "servers": count})))
}
