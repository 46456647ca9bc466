//! The RL control plane: pause and resume new turns around a weight update, announce the
//! weight version, and abort a session's turn.

use super::body::{parse_json, read_body};
use super::{ApiError, AppState};
use crate::backend::Control;
use crate::turn::gate::{InFlight, Pause, PauseMode};
use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

/// `POST /pause`'s body; every field optional (an empty body pauses in `wait` mode).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    mode: Option<PauseMode>,
    in_flight: Option<InFlight>,
    reason: Option<String>,
}

/// `POST /pause`: new turns wait (or, with `"mode": "reject"`, get a 429 with `Retry-After`);
/// turns already at a backend finish, or with `"in_flight": "keep"` are frozen in place by
/// every backend that can (vLLM's dev-mode pause). The reply says how many are at a backend,
/// so a trainer can wait for zero before it swaps weights (held turns are under way, not at a
/// backend), and what each backend did.
pub async fn pause(
    state: web::Data<AppState>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, state.max_body_bytes).await?;
    let body: PauseBody = match body.iter().all(u8::is_ascii_whitespace) {
        true => PauseBody::default(),
        false => parse_json(&body)?,
    };
    let pause = Pause {
        mode: body.mode.unwrap_or(PauseMode::Wait),
        in_flight: body.in_flight.unwrap_or_default(),
        reason: body.reason,
        since: crate::session::now_seconds(),
    };
    tracing::info!(mode = ?pause.mode, in_flight = ?pause.in_flight, reason = ?pause.reason, "paused");
    let gate = &state.pipeline.gate;
    let before = match &state.fleet {
        Some(fleet) => fleet
            .pause(gate, pause.clone())
            .await
            .map_err(store_unavailable)?,
        None => gate.pause(pause.clone()),
    };
    let held = before.is_some_and(|p| p.in_flight == InFlight::Keep);
    let backends = match (pause.in_flight, held) {
        (InFlight::Keep, _) => state.pipeline.backends.control(&Control::Hold).await,
        // A pause that lets turns at a backend finish, in place of one that froze them.
        (InFlight::Finish, true) => state.pipeline.backends.control(&Control::Release).await,
        (InFlight::Finish, false) => Vec::new(),
    };
    Ok(HttpResponse::Ok().json(json!({
        "paused": pause,
        "turns_under_way": state.pipeline.turns_under_way(),
        "turns_at_backend": state.pipeline.gate.turns_at_backend(),
        "fleet": fleet_health(&state).await,
        "backends": backends,
    })))
}

/// The fleet's numbers (`--store`), or `null` when they cannot be read (or there is no fleet).
pub(super) async fn fleet_health(state: &AppState) -> Option<crate::fleet::FleetHealth> {
    let fleet = state.fleet.as_ref()?;
    match fleet.health().await {
        Ok(health) => Some(health),
        Err(error) => {
            tracing::warn!(%error, "the fleet's numbers could not be read");
            None
        }
    }
}

/// The 503 of a control change the fleet's store did not take: nothing changed anywhere.
fn store_unavailable(error: crate::fleet::StoreError) -> ApiError {
    ApiError::new(
        actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
        "unavailable_error",
        format!("the fleet's control could not be changed: {error}"),
    )
}

/// `POST /resume`: waiting turns go on, and backends a pause froze go on too.
pub async fn resume(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let gate = &state.pipeline.gate;
    let was = match &state.fleet {
        Some(fleet) => fleet.resume(gate).await.map_err(store_unavailable)?,
        None => gate.resume(),
    };
    tracing::info!(was_paused = was.is_some(), "resumed");
    let held = was.as_ref().is_some_and(|p| p.in_flight == InFlight::Keep);
    let backends = match held {
        true => state.pipeline.backends.control(&Control::Release).await,
        false => Vec::new(),
    };
    Ok(
        HttpResponse::Ok()
            .json(json!({"resumed": was.is_some(), "was": was, "backends": backends})),
    )
}

/// `POST /weight_version`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WeightVersionBody {
    weight_version: Option<String>,
}

/// `POST /weight_version`: `{"weight_version": "v7"}` is recorded on the turns sampled from now
/// on whose backend reports no version (`null` stops it), and passed to every backend that
/// stamps versions on what it samples (vLLM's dev-mode `/update_weight_version`).
pub async fn weight_version(
    state: web::Data<AppState>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(payload, state.max_body_bytes).await?;
    let body: WeightVersionBody = parse_json(&body)?;
    let gate = &state.pipeline.gate;
    match &state.fleet {
        Some(fleet) => fleet
            .set_weight_version(gate, body.weight_version.clone())
            .await
            .map_err(store_unavailable)?,
        None => gate.set_weight_version(body.weight_version.clone()),
    }
    let backends = match &body.weight_version {
        Some(version) => {
            let action = Control::WeightVersion(version.clone());
            state.pipeline.backends.control(&action).await
        }
        None => Vec::new(),
    };
    Ok(HttpResponse::Ok()
        .json(json!({"weight_version": body.weight_version, "backends": backends})))
}

/// `POST /{uuid}/abort`: the session's turn at the backend (if any) is cancelled: its request
/// is dropped, its client gets a 409 (or an error event), and the session is left as it was.
pub async fn abort(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let session = state.session(&path.into_inner()).await?;
    let aborted = session.abort();
    Ok(HttpResponse::Ok().json(json!({"uuid": session.id, "aborted": aborted})))
}
