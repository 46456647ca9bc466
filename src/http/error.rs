//! Every error the API returns, in OpenAI's shape: `{"error": {"message", "type", "code"}}`.
//! Module errors are mapped to HTTP statuses here, once.

use crate::backend::BackendError;
use crate::chat::RequestError;
use crate::template::TemplateError;
use crate::tokenizer::TokenizerError;
use crate::turn::TurnError;
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

/// An error response.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// OpenAI's error `type` (`invalid_request_error`, ...).
    pub kind: &'static str,
    /// What went wrong, for the client.
    pub message: String,
    /// Seconds the client should wait before retrying (`Retry-After`), when it is known.
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// An error with this status, type and message.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The same error, telling the client to retry after `seconds`.
    pub fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// A reply builder with the status and, when set, `Retry-After`.
    pub fn reply(&self) -> actix_web::HttpResponseBuilder {
        let mut reply = HttpResponse::build(self.status);
        if let Some(seconds) = self.retry_after {
            reply.insert_header(("Retry-After", seconds.to_string()));
        }
        reply
    }

    /// 400 for a request the client must fix.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 404 for an unknown session or route.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    /// 404 for an unknown session id.
    pub fn no_session(id: &str) -> Self {
        Self::not_found(format!("session {id} not found"))
    }

    /// The OpenAI error body, as a reply or as an event of a stream that already began.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "code": self.status.as_u16(),
            }
        })
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        self.reply().json(self.body())
    }
}

/// A request an adapter cannot read into a turn: a 400 with this message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(String);

impl BadRequest {
    /// A 400 saying `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl From<BadRequest> for ApiError {
    fn from(error: BadRequest) -> Self {
        Self::bad_request(error.0)
    }
}

impl From<RequestError> for ApiError {
    fn from(error: RequestError) -> Self {
        Self::bad_request(error.to_string())
    }
}

impl From<TemplateError> for ApiError {
    fn from(error: TemplateError) -> Self {
        match error {
            // The conversation is invalid for this model's template (raise_exception), or the
            // template cannot render what was sent: both are the request's fault.
            TemplateError::Raised(_) | TemplateError::Render(_) => {
                Self::bad_request(error.to_string())
            }
            TemplateError::Syntax(_) | TemplateError::Load(_) => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                error.to_string(),
            ),
        }
    }
}

impl From<TokenizerError> for ApiError {
    fn from(error: TokenizerError) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            error.to_string(),
        )
    }
}

/// Seconds a turn refused by a pause is told to wait (a weight update takes a while).
const PAUSED_RETRY_AFTER: u32 = 5;

impl From<TurnError> for ApiError {
    fn from(error: TurnError) -> Self {
        match error {
            TurnError::Template(e) => e.into(),
            TurnError::Tokenizer(e) => e.into(),
            TurnError::Backend(e) => e.into(),
            TurnError::Journal(_) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable_error",
                error.to_string(),
            ),
            TurnError::SessionClosed => Self::not_found(error.to_string()),
            TurnError::Paused { .. } => Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                error.to_string(),
            )
            .retry_after(PAUSED_RETRY_AFTER),
            TurnError::Aborted => {
                Self::new(StatusCode::CONFLICT, "aborted_error", error.to_string())
            }
            TurnError::EmptyPrompt
            | TurnError::Images(_)
            | TurnError::Fetch { .. }
            | TurnError::Constraint(_)
            | TurnError::PromptTooLong { .. }
            | TurnError::UnknownToken { .. }
            | TurnError::SessionFull { .. } => Self::bad_request(error.to_string()),
        }
    }
}

impl From<BackendError> for ApiError {
    fn from(error: BackendError) -> Self {
        let message = error.to_string();
        match error {
            BackendError::Timeout { .. } => {
                Self::new(StatusCode::GATEWAY_TIMEOUT, "timeout_error", message)
            }
            BackendError::NoBackend(_) | BackendError::Busy { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable_error",
                message,
            ),
            BackendError::Saturated { .. } => {
                Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
            }
            BackendError::Status { status: 503, .. } | BackendError::Aborted { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable_error",
                message,
            ),
            // The backend refused the proxy itself (its key is wrong or missing): the
            // operator's to fix, not the client's.
            BackendError::Status {
                status: 401 | 403, ..
            } => Self::new(
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                format!("the backend refused the proxy's credentials: {message}"),
            ),
            BackendError::Unsupported { .. } | BackendError::NoImages { .. } => {
                Self::bad_request(message)
            }
            // The backend rejected the request itself (e.g. the prompt exceeds its context).
            BackendError::Status { status, .. }
                if (400..500).contains(&status) && status != 429 =>
            {
                Self::bad_request(message)
            }
            BackendError::Status { .. }
            | BackendError::Unreachable { .. }
            | BackendError::Protocol { .. }
            | BackendError::ImagesDiffer { .. } => {
                Self::new(StatusCode::BAD_GATEWAY, "upstream_error", message)
            }
        }
    }
}
