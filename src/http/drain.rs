//! Draining (`SIGTERM`): new turns and sessions are refused (503 with `Retry-After`), turns
//! under way — streams included — finish, the journal is forced to disk, and the server
//! stops. A second signal, or `--drain-timeout`, cuts the wait short.

use super::{ApiError, AppState};
use actix_web::dev::ServerHandle;
use actix_web::http::StatusCode;
use std::sync::Arc;
use std::time::Duration;

/// Seconds a refused client is told to wait before retrying (another replica, or this one
/// after its restart).
const RETRY_AFTER: u32 = 5;

/// The 503 of a request that would start work while the proxy drains.
pub fn refusal() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable_error",
        "the proxy is shutting down; retry shortly",
    )
    .retry_after(RETRY_AFTER)
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
    if let Some(log) = &state.journal
        && let Err(error) = log.sync()
    {
        tracing::error!(%error, "syncing the session log failed");
    }
    server.stop(true).await;
}
