//! Service-level routes: health, models, the backend list.

use super::body::read_json;
use super::{ApiError, AppState};
use crate::backend::BackendConfig;
use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

pub async fn health(state: web::Data<AppState>) -> HttpResponse {
    let members = state.backends.members();
    HttpResponse::Ok().json(json!({
        "status": "ok",
        "model": state.model_name,
        "sessions": state.sessions.len(),
        "servers": members.len(),
        "healthy_servers": members.iter().filter(|m| m.is_healthy()).count(),
    }))
}

pub async fn models(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "object": "list",
        "data": [{"id": state.model_name, "object": "model", "owned_by": "rollout-proxy"}],
    }))
}

pub async fn servers(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(state.backends.status())
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
    let count = body.servers.len();
    state.backends.replace(body.servers);
    tracing::info!(servers = count, "backend list replaced");
    Ok(HttpResponse::Ok().json(json!({"status": "ok", "servers": count})))
}
