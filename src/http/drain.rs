//! Draining (`SIGTERM`): new turns and sessions are refused (503 with `Retry-After`), turns
//! under way — streams included — finish, the journal is forced to disk, and the server
//! stops. A second signal, or `--drain-timeout`, cuts the wait short.

use super::{ApiError, AppState};
use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServerHandle, ServiceRequest, ServiceResponse};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::{HttpResponse, web};
use std::sync::Arc;
use std::time::Duration;

/// Seconds a refused client is told to wait before retrying (another replica, or this one
/// after its restart).
const RETRY_AFTER: &str = "5";

/// The middleware: while draining, a request that would start work is a 503.
pub async fn refuse_while_draining(
    request: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let draining = request
        .app_data::<web::Data<AppState>>()
        .is_some_and(|state| state.draining());
    if !(draining && request.method() == Method::POST) {
        return Ok(next.call(request).await?.map_into_boxed_body());
    }
    let error = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable_error",
        "the proxy is shutting down; retry shortly",
    );
    let response = HttpResponse::ServiceUnavailable()
        .insert_header(("Retry-After", RETRY_AFTER))
        .json(error.body());
    Ok(request.into_response(response))
}

/// Drains the server: refuses new work, waits (up to `timeout`) for the turns under way to
/// finish, syncs the journal and stops the server.
pub async fn drain(state: Arc<AppState>, server: ServerHandle, timeout: Duration) {
    state.start_draining();
    tracing::info!(turns = state.pipeline.turns_under_way(), "draining");
    let deadline = tokio::time::Instant::now() + timeout;
    while state.pipeline.turns_under_way() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left = state.pipeline.turns_under_way();
    if left > 0 {
        tracing::warn!(left, "drain timeout: stopping with turns under way");
    }
    if let Err(error) = state.keep(|log| log.sync()) {
        tracing::error!(%error, "syncing the session log failed");
    }
    server.stop(true).await;
}
