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

fn serve(asset: Asset) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(asset.content_type)
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
    let session = state.sessions.get(&id).ok_or_else(|| state.missing(&id))?;
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
