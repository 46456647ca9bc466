//! The guard every route is wrapped in, given the class of the route that matched (see
//! [`super::routes`]): the key it needs, where requests may come from, the body it takes,
//! draining, and `Idempotency-Key` on turns. A refusal is in the shape of the route's API.
//!
//! In order:
//! 1. **Keys** ([`super::auth`]): a 401 without the key the route's [`Access`] needs.
//! 2. **Host** (DNS rebinding): a proxy listening on a loopback address answers only requests
//!    addressed to a loopback name (`localhost`, `127.0.0.1`, `[::1]`) or an `--allow-host`,
//!    so a page whose own name is made to resolve to 127.0.0.1 cannot read it.
//! 3. **Other sites**: a route that changes state refuses a request whose `Origin` is not the
//!    proxy's own (nor an `--allow-origin`), or which the browser marks as sent from another
//!    site (`Sec-Fetch-Site`): a web page the user visits cannot drive the proxy.
//! 4. **JSON bodies**: a `POST` body must be sent as `application/json` (a cross-site form
//!    can only send `text/plain`, form data or no type at all).
//! 5. **Draining**: a `POST` while the proxy drains is a 503 (see [`super::drain`]).
//! 6. **Turns**: `Idempotency-Key` (see [`super::idempotency`]).

use super::routes::{Access, RouteClass, Verb};
use super::{ApiError, AppState};
use actix_web::body::BoxBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::http::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST, ORIGIN, TRANSFER_ENCODING};
use actix_web::middleware::Next;
use actix_web::web;
use std::sync::atomic::{AtomicBool, Ordering};

/// Where requests may come from, beyond the proxy's own origin and loopback names.
#[derive(Debug, Default)]
pub struct Origins {
    /// Origins allowed to call routes that change state (`--allow-origin`), lowercased.
    allowed: Vec<String>,
    /// `--allow-origin '*'`: any origin.
    any: bool,
    /// Host names a loopback-bound proxy also answers to (`--allow-host`), lowercased.
    hosts: Vec<String>,
    /// The proxy listens on a loopback address only (set when it starts serving).
    loopback: AtomicBool,
}

impl Origins {
    /// The policy of `--allow-origin` (`*` allows any) and `--allow-host`.
    pub fn new(allowed: &[String], hosts: &[String]) -> Self {
        Self {
            allowed: allowed
                .iter()
                .map(|o| o.trim_end_matches('/').to_ascii_lowercase())
                .collect(),
            any: allowed.iter().any(|o| o == "*"),
            hosts: hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
            loopback: AtomicBool::new(false),
        }
    }

    /// Records whether the proxy listens on a loopback address only.
    pub fn listening_on(&self, address: std::net::SocketAddr) {
        self.loopback
            .store(address.ip().is_loopback(), Ordering::Relaxed);
    }

    /// Why a request addressed to `host` is refused, if it is.
    fn refuses_host(&self, host: Option<&str>) -> Option<String> {
        if !self.loopback.load(Ordering::Relaxed) {
            return None;
        }
        let host = host.unwrap_or("");
        let name = host_name(host).to_ascii_lowercase();
        let loopback = name == "localhost"
            || name.ends_with(".localhost")
            || name
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        match loopback || self.hosts.contains(&name) {
            true => None,
            false => Some(format!(
                "the proxy listens on a loopback address and answers only requests addressed to \
                 a loopback name, not to host '{host}' (a guard against DNS rebinding); start it \
                 with --allow-host {name} to allow it"
            )),
        }
    }

    /// Why a request from `origin` (with `Sec-Fetch-Site: fetch_site`) to `host` is refused
    /// on a route that changes state, if it is.
    fn refuses_origin(
        &self,
        origin: Option<&str>,
        fetch_site: Option<&str>,
        host: Option<&str>,
    ) -> Option<String> {
        if self.any {
            return None;
        }
        if let Some(origin) = origin {
            let origin = origin.trim_end_matches('/').to_ascii_lowercase();
            let own = origin.split_once("://").is_some_and(|(_, authority)| {
                Some(authority) == host.map(|h| h.to_ascii_lowercase()).as_deref()
            });
            return match own || self.allowed.contains(&origin) {
                true => None,
                false => Some(format!(
                    "requests from origin '{origin}' may not change the proxy's state; start it \
                     with --allow-origin {origin} to allow that site"
                )),
            };
        }
        match fetch_site {
            Some("cross-site" | "same-site") => Some(
                "the browser marks this request as sent from another site (Sec-Fetch-Site); \
                 such requests may not change the proxy's state"
                    .to_string(),
            ),
            _ => None,
        }
    }
}

/// The name of a `Host` header's value (without its port).
fn host_name(host: &str) -> &str {
    match host.strip_prefix('[') {
        // `[::1]:9000`
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    }
}

/// Why a `POST` body is refused for its type, if it is: it must be JSON, and a request with no
/// type must have no body.
fn refuses_body(request: &ServiceRequest) -> Option<String> {
    let headers = request.headers();
    let Some(content_type) = headers.get(CONTENT_TYPE) else {
        let has_body = headers.contains_key(TRANSFER_ENCODING)
            || headers
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|length| length.trim() != "0");
        return has_body.then(|| {
            "a request body must be sent with Content-Type: application/json".to_string()
        });
    };
    let essence = content_type
        .to_str()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let json = essence == "application/json"
        || essence.starts_with("application/") && essence.ends_with("+json");
    match json {
        true => None,
        false => Some(format!(
            "a request body must be JSON (Content-Type: application/json), not '{essence}'"
        )),
    }
}

/// The middleware of the route of class `class`.
pub async fn check(
    class: RouteClass,
    request: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let Some(state) = request.app_data::<web::Data<AppState>>().cloned() else {
        return next.call(request).await;
    };
    let refusal = refusal(&state, class, &request);
    if let Some(error) = refusal {
        let response = class.shape.refuse(error);
        return Ok(request.into_response(response));
    }
    if class.turn {
        let session = request.match_info().get("uuid").map(str::to_string);
        return super::idempotency::once_per_key(&state, class.shape, session, request, next).await;
    }
    next.call(request).await
}

/// Why the request is refused, if it is (steps 1 to 5 of the module's list).
fn refusal(state: &AppState, class: RouteClass, request: &ServiceRequest) -> Option<ApiError> {
    if class.access == Access::Public {
        return None;
    }
    let forbidden =
        |message: String| ApiError::new(StatusCode::FORBIDDEN, "permission_error", message);
    if !state
        .keys
        .allows(class.access, super::auth::presented(request))
    {
        return Some(super::auth::refusal());
    }
    let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
    let host = header(HOST.as_str());
    if let Some(why) = state.origins.refuses_host(host) {
        return Some(forbidden(why));
    }
    if class.changes_state
        && let Some(why) =
            state
                .origins
                .refuses_origin(header(ORIGIN.as_str()), header("sec-fetch-site"), host)
    {
        return Some(forbidden(why));
    }
    if class.verb == Verb::Post {
        if let Some(why) = refuses_body(request) {
            return Some(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                why,
            ));
        }
        if state.draining() {
            return Some(super::drain::refusal());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_proxies_answer_loopback_names_only() {
        let origins = Origins::new(&[], &["proxy.internal".into()]);
        assert_eq!(
            origins.refuses_host(Some("evil.example:9000")),
            None,
            "not yet bound"
        );
        origins.listening_on("127.0.0.1:9000".parse().unwrap());
        for host in [
            "127.0.0.1:9000",
            "localhost:9000",
            "[::1]:9000",
            "LOCALHOST",
            "a.localhost:1",
            "127.8.0.1",
            "proxy.internal:9000",
        ] {
            assert_eq!(origins.refuses_host(Some(host)), None, "{host}");
        }
        for host in [
            "evil.example:9000",
            "127.0.0.1.evil.example",
            "",
            "[::2]:9000",
        ] {
            assert!(origins.refuses_host(Some(host)).is_some(), "{host}");
        }
        origins.listening_on("0.0.0.0:9000".parse().unwrap());
        assert_eq!(origins.refuses_host(Some("evil.example:9000")), None);
    }

    #[test]
    fn only_the_proxys_own_or_allowed_origins_change_state() {
        let origins = Origins::new(&["https://trainer.example".into()], &[]);
        let host = Some("127.0.0.1:9000");
        assert_eq!(
            origins.refuses_origin(None, None, host),
            None,
            "not a browser"
        );
        assert_eq!(
            origins.refuses_origin(Some("http://127.0.0.1:9000"), Some("same-origin"), host),
            None
        );
        assert_eq!(
            origins.refuses_origin(Some("https://trainer.example/"), Some("cross-site"), host),
            None
        );
        for origin in [
            "http://evil.example",
            "null",
            "http://127.0.0.1:9001",
            "http://localhost:9000",
        ] {
            assert!(
                origins.refuses_origin(Some(origin), None, host).is_some(),
                "{origin}"
            );
        }
        assert!(
            origins
                .refuses_origin(None, Some("cross-site"), host)
                .is_some(),
            "an <img> GET"
        );
        assert!(
            origins
                .refuses_origin(None, Some("same-site"), host)
                .is_some(),
            "another port"
        );
        assert_eq!(
            origins.refuses_origin(None, Some("none"), host),
            None,
            "typed by the user"
        );
        let any = Origins::new(&["*".into()], &[]);
        assert_eq!(
            any.refuses_origin(Some("http://evil.example"), None, host),
            None
        );
    }
}
