//! Who may call: with `--api-key`, every route but the public ones (`GET /health` and the
//! token viewer's page and assets, which carry no data) needs the key, sent as
//! `Authorization: Bearer KEY` or (as Anthropic clients send it) `x-api-key: KEY`; with
//! `--admin-key`, the operator routes need that key instead, which also opens every other
//! route. Which class a route is of is the route table's to say ([`super::routes`]), and the
//! guard asks for the route that matched. Keys are kept as SHA-256 digests and compared in
//! constant time, and never logged.

use super::ApiError;
use super::routes::Access;
use actix_web::dev::ServiceRequest;
use actix_web::http::StatusCode;
use sha2::{Digest, Sha256};

/// The keys the proxy was started with.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    api: Option<[u8; 32]>,
    admin: Option<[u8; 32]>,
}

impl Keys {
    /// Keys from the flags (`None`: that check is off).
    pub fn new(api: Option<&str>, admin: Option<&str>) -> Self {
        Self {
            api: api.map(digest),
            admin: admin.map(digest),
        }
    }

    /// Whether a request to a route of `access` presenting `presented` may go on.
    pub fn allows(&self, access: Access, presented: Option<&str>) -> bool {
        let presented = presented.map(digest);
        let matches = |key: Option<[u8; 32]>| match (key, presented) {
            (Some(key), Some(presented)) => equal(&key, &presented),
            _ => false,
        };
        match access {
            Access::Public => true,
            Access::Client if self.api.is_none() => true,
            Access::Client => matches(self.api) || matches(self.admin),
            Access::Operator => match self.admin {
                Some(_) => matches(self.admin),
                None => self.api.is_none() || matches(self.api),
            },
        }
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
pub fn presented(request: &ServiceRequest) -> Option<&str> {
    let headers = request.headers();
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
}

/// The 401 of a request without the key its route needs.
pub fn refusal() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "authentication_error",
        "a valid API key is required (Authorization: Bearer KEY, or x-api-key: KEY)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use Access::{Client, Operator, Public};

    #[test]
    fn keys_open_what_they_should() {
        let none = Keys::default();
        assert!(none.allows(Operator, None));
        let api = Keys::new(Some("k"), None);
        assert!(api.allows(Public, None));
        assert!(!api.allows(Client, None));
        assert!(!api.allows(Client, Some("K")));
        assert!(api.allows(Client, Some("k")));
        assert!(api.allows(Operator, Some("k")), "no admin key: the API key");
        let both = Keys::new(Some("k"), Some("root"));
        assert!(!both.allows(Operator, Some("k")));
        assert!(both.allows(Operator, Some("root")));
        assert!(both.allows(Client, Some("k")));
        assert!(
            both.allows(Client, Some("root")),
            "the admin key opens every route"
        );
        let admin_only = Keys::new(None, Some("root"));
        assert!(admin_only.allows(Client, None));
        assert!(!admin_only.allows(Operator, None));
        assert!(!admin_only.allows(Operator, Some("k")));
    }
}
