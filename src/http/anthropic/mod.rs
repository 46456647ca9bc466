//! Anthropic's Messages API on a session: `POST /{uuid}/v1/messages` (Claude Code's API;
//! streamed or not), `/v1/messages/count_tokens` and `/v1/messages/render`. The body is read
//! into the turn's request ([`request`]), the turn runs on the pipeline, and its output is
//! written as a `message` ([`reply`]) or as Messages events ([`stream`]). Errors are in
//! Anthropic's shape.

mod reply;
mod request;
mod stream;
mod wire;

use super::body::read_body_noting_unknown;
use super::{ApiError, AppState};
use crate::chat::ChatRequest;
use crate::metrics::Stage;
use crate::session::Session;
use crate::session::replies::TurnKey;
use crate::turn::RenderedTurn;
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError, web};
use request::KNOWN_FIELDS;
pub use request::MessagesBody;
use request::{Reply, read_messages};
use serde_json::{Value, json};
use std::sync::Arc;

/// The `type` of a message object.
const MESSAGE: &str = "message";

/// An error in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct AnthropicError(ApiError);

impl<E: Into<ApiError>> From<E> for AnthropicError {
    fn from(error: E) -> Self {
        Self(error.into())
    }
}

impl AnthropicError {
    /// Anthropic's error type for the status.
    fn kind(&self) -> &'static str {
        match self.0.status.as_u16() {
            400 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            _ => "api_error",
        }
    }

    /// The error body, as a reply or as an `error` event.
    fn body(&self) -> Value {
        json!({"type": "error", "error": {"type": self.kind(), "message": self.0.message}})
    }
}

impl ResponseError for AnthropicError {
    fn status_code(&self) -> StatusCode {
        self.0.status
    }

    fn error_response(&self) -> HttpResponse {
        self.0.reply().json(self.body())
    }
}

/// The session, and the turn the body asks for with how to reply; unknown fields are logged
/// at debug. `count_only` (a render, or a count): `max_tokens` may be left out.
async fn parse(
    state: &AppState,
    path: web::Path<String>,
    payload: web::Payload,
    count_only: bool,
) -> Result<(Arc<Session>, ChatRequest, Reply), AnthropicError> {
    let id = path.into_inner();
    // A render reads the session as it is now; a turn brings it up to date once it holds it.
    let session = match count_only {
        true => state.session(&id).await?,
        false => state.turn_session(&id).await?,
    };
    let _parse = state.pipeline.metrics.timed(Stage::Parse);
    let body = read_body_noting_unknown(payload, state.max_body_bytes, KNOWN_FIELDS).await?;
    let (request, reply) = read_messages(&session, &body, state.default_max_tokens, count_only)?;
    Ok((session, request, reply))
}

/// One Messages turn: a `message`, or its events with `stream`.
pub async fn messages(
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
    key: Option<web::ReqData<TurnKey>>,
) -> Result<HttpResponse, AnthropicError> {
    let (session, mut request, asked) = parse(&state, path, payload, false).await?;
    let model = asked.model.unwrap_or_else(|| state.model_name.clone());
    request.key = key.map(web::ReqData::into_inner);
    let id = format!("msg_{}", &uuid::Uuid::new_v4().simple().to_string()[..24]);
    if asked.stream {
        let turn = state.pipeline.stream(session, request).await?;
        return Ok(stream::respond(id, model, turn));
    }
    let output = state.pipeline.run(&session, &request).await?;
    let choice = &output.choices[0];
    let (stop_reason, stop_sequence) =
        reply::stop_reason(choice.reply.finish, choice.generation.stop.as_ref());
    Ok(HttpResponse::Ok().json(reply::Message {
        id: &id,
        kind: MESSAGE,
        role: "assistant",
        model: &model,
        content: reply::blocks(&choice.reply),
        stop_reason: Some(stop_reason),
        stop_sequence,
        usage: reply::MessageUsage::from(&output.usage()),
    }))
}

/// The prompt the request would send now (`max_tokens` may be left out); changes nothing.
async fn rendered(
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<RenderedTurn, AnthropicError> {
    let (session, request, _) = parse(&state, path, payload, true).await?;
    Ok(state.pipeline.render(&session, &request).await?)
}

/// `count_tokens`: the length of the prompt the turn would send.
pub async fn count_tokens(
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, AnthropicError> {
    let prompt = rendered(state, path, payload).await?.prompt_ids.len();
    Ok(HttpResponse::Ok().json(json!({"input_tokens": prompt})))
}

/// The exact prompt a Messages turn would send now; changes nothing.
pub async fn render(
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, AnthropicError> {
    Ok(super::render_reply(rendered(state, path, payload).await?))
}
