//! The token viewer's routes: the page and its assets (`GET /ui`, `/ui/{name}`: open, they
//! carry no data) and a session's view (`GET /{uuid}/view`, as `GET /{uuid}/nodes` is
//! guarded), which the page draws.

use super::{ApiError, AppState};
use crate::viewer::assets::{self, Asset};
use actix_web::{HttpResponse, web};

/// `GET /ui`.
pub async fn page() -> HttpResponse {
    serve(assets::PAGE)
}

/// `GET /ui/{name}`.
pub async fn asset(name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    assets::named(&name)
        .map(serve)
        .ok_or_else(|| ApiError::not_found(format!("the viewer has no file '{name}'")))
}

/// What the viewer's page may do: run and style itself from its own files, fetch its data
/// from the proxy (images too, shown from the `blob:` URLs of what it fetched), and nothing else (no inline script, no other host, no framing, no form
/// sent anywhere). The other security headers are every reply's (see `security_headers`).
const PAGE_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data: blob:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

fn serve(asset: Asset) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(asset.content_type)
        .insert_header(("Content-Security-Policy", PAGE_POLICY))
        // The assets change only with the binary; a reload after an upgrade must not mix them.
        .insert_header(("Cache-Control", "no-cache"))
        .body(asset.body)
}

/// `GET /{uuid}/view`: the session token by token (see [`crate::viewer::SessionView`]).
pub async fn view(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    // Looking is not using: the session's idle time (`--session-ttl`, `since=`) is left alone,
    // and the viewer's polls do not see their own reads as activity.
    let session = state.known_session(&id).await?;
    // Nodes are compact and cheap to copy: the lock is not held while the view is built.
    let (nodes, divergences) = {
        let guard = session.state.lock().await;
        (
            guard.nodes.clone(),
            guard.divergences.iter().cloned().collect(),
        )
    };
    let tokenizer = &state.pipeline.context.tokenizer;
    let view = crate::viewer::session_view(&session, &nodes, divergences, tokenizer);
    Ok(HttpResponse::Ok().json(view))
}
