//! Who may call: with `--api-key`, every route but `GET /health` and the token viewer's page
//! and assets (`GET /ui`, `/ui/*`, which carry no data) needs the key, sent as
//! `Authorization: Bearer KEY` or (as Anthropic clients send it) `x-api-key: KEY`; with
//! `--admin-key`, the operator routes (`POST /setup`, `/pause`, `/resume`, `/weight_version`,
//! `GET /servers`, `/sessions`, `/export`, `/metrics`) need that key instead, which also opens every
//! other route. A refusal is a 401 in the shape of
//! the API the request came in by. Keys are kept as SHA-256 digests and compared in constant
//! time, and never logged.

use super::ApiError;
use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::{HttpResponse, ResponseError, web};
use sha2::{Digest, Sha256};

/// The keys the proxy was started with.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    api: Option<[u8; 32]>,
    admin: Option<[u8; 32]>,
}

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Open,
    Client,
    Operator,
}

impl Keys {
    /// Keys from the flags (`None`: that check is off).
    pub fn new(api: Option<&str>, admin: Option<&str>) -> Self {
        Self {
            api: api.map(digest),
            admin: admin.map(digest),
        }
    }

    /// Whether a request to `path` by `method` presenting `presented` may go on.
    fn allows(&self, method: &Method, path: &str, presented: Option<&str>) -> bool {
        let presented = presented.map(digest);
        let matches = |key: Option<[u8; 32]>| match (key, presented) {
            (Some(key), Some(presented)) => equal(&key, &presented),
            _ => false,
        };
        match access(method, path) {
            Access::Open => true,
            Access::Client if self.api.is_none() => true,
            Access::Client => matches(self.api) || matches(self.admin),
            Access::Operator => match self.admin {
                Some(_) => matches(self.admin),
                None => self.api.is_none() || matches(self.api),
            },
        }
    }
}

fn access(method: &Method, path: &str) -> Access {
    match (method, path) {
        (&Method::GET, "/health" | "/ui") => Access::Open,
        (&Method::GET, asset) if asset.starts_with("/ui/") => Access::Open,
        (&Method::POST, "/setup" | "/pause" | "/resume" | "/weight_version")
        | (&Method::GET, "/servers" | "/sessions" | "/export" | "/metrics") => Access::Operator,
        _ => Access::Client,
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Equal digests, compared without an early exit.
fn equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// The key a request presents: its bearer token, else its `x-api-key`.
fn presented(request: &ServiceRequest) -> Option<&str> {
    let headers = request.headers();
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
}

/// The middleware: lets a request through, or answers 401 in its API's shape.
pub async fn check(
    request: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let allowed = request
        .app_data::<web::Data<Keys>>()
        .is_none_or(|keys| keys.allows(request.method(), request.path(), presented(&request)));
    if allowed {
        return Ok(next.call(request).await?.map_into_boxed_body());
    }
    let error = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "authentication_error",
        "a valid API key is required (Authorization: Bearer KEY, or x-api-key: KEY)",
    );
    let response = match request.path().contains("/v1/messages") {
        true => super::anthropic::AnthropicError::from(error).error_response(),
        false => HttpResponse::build(error.status).json(error.body()),
    };
    Ok(request.into_response(response))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_open_what_they_should() {
        let get = Method::GET;
        let post = Method::POST;
        let none = Keys::default();
        assert!(none.allows(&post, "/setup", None));
        let api = Keys::new(Some("k"), None);
        assert!(api.allows(&get, "/health", None));
        assert!(!api.allows(&post, "/x/v1/messages", None));
        assert!(!api.allows(&post, "/x/v1/messages", Some("K")));
        assert!(api.allows(&post, "/x/v1/messages", Some("k")));
        assert!(
            api.allows(&post, "/setup", Some("k")),
            "no admin key: the API key"
        );
        let both = Keys::new(Some("k"), Some("root"));
        assert!(!both.allows(&post, "/setup", Some("k")));
        assert!(both.allows(&post, "/setup", Some("root")));
        assert!(both.allows(&get, "/servers", Some("root")));
        assert!(
            !both.allows(&get, "/export", Some("k")),
            "exports are the operator's"
        );
        assert!(both.allows(&get, "/export", Some("root")));
        assert!(both.allows(&post, "/x/reward", Some("k")));
        assert!(!both.allows(&post, "/pause", Some("k")));
        assert!(both.allows(&post, "/x/abort", Some("k")));
        assert!(both.allows(&post, "/sessions/create", Some("root")));
        let admin_only = Keys::new(None, Some("root"));
        assert!(admin_only.allows(&post, "/sessions/create", None));
        assert!(!admin_only.allows(&get, "/sessions", None));
    }
}
