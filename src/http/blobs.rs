//! `GET /blobs/{sha256}` (operator) and `GET /{uuid}/blobs/{sha256}` (a session's own): the
//! bytes of an image a node records, by the hash in its `images`, for a trainer to rebuild the
//! pixel values (and the viewer to show them).

use super::{ApiError, AppState};
use crate::session::Session;
use crate::session::blobs::is_sha256;
use actix_web::{HttpResponse, web};

/// An image kept by any session.
pub async fn blob(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let sha256 = path.into_inner();
    checked(&sha256)?;
    // A fleet keeps images with their sessions: the bytes come from a session that holds it.
    let holder = match state.journal.as_ref().filter(|log| log.keeps_images()) {
        Some(log) => {
            log.refresh_all(&state.sessions)
                .await
                .map_err(unavailable)?;
            let mut holder = None;
            for session in state.sessions.list() {
                if holds(&session, &sha256).await {
                    holder = Some(session.id);
                    break;
                }
            }
            Some(holder.ok_or_else(|| not_kept(&sha256))?)
        }
        None => None,
    };
    image(&state, holder, &sha256).await
}

/// An image session `uuid` holds.
pub async fn session_blob(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (uuid, sha256) = path.into_inner();
    checked(&sha256)?;
    let session = state.session(&uuid).await?;
    if !holds(&session, &sha256).await {
        return Err(ApiError::not_found(format!(
            "session {uuid} holds no image {sha256}"
        )));
    }
    image(&state, Some(session.id), &sha256).await
}

fn checked(sha256: &str) -> Result<(), ApiError> {
    match is_sha256(sha256) {
        true => Ok(()),
        false => Err(ApiError::bad_request(
            "an image is named by its SHA-256 in lowercase hex (64 characters)",
        )),
    }
}

/// Whether a node of `session` holds image `sha256`.
async fn holds(session: &Session, sha256: &str) -> bool {
    let state = session.state.lock().await;
    let mut images = state.nodes.iter().flat_map(|node| node.images());
    images.any(|image| *image.sha256 == *sha256)
}

fn not_kept(sha256: &str) -> ApiError {
    ApiError::not_found(format!("no image {sha256} is kept"))
}

fn unavailable(error: crate::session::LogError) -> ApiError {
    ApiError::new(
        actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
        "unavailable_error",
        format!("the session store cannot be read: {error}"),
    )
}

/// The bytes of image `sha256`: from the log, with `holder`, where the log keeps images (a
/// fleet's store), else from this proxy's own.
async fn image(
    state: &AppState,
    holder: Option<uuid::Uuid>,
    sha256: &str,
) -> Result<HttpResponse, ApiError> {
    let from_log = state.journal.as_ref().filter(|log| log.keeps_images());
    let bytes = match (from_log, holder) {
        (Some(log), Some(holder)) => log.image(holder, sha256).await.map_err(unavailable)?,
        _ => state.pipeline.blobs.get(sha256),
    };
    let bytes = bytes.ok_or_else(|| not_kept(sha256))?;
    // The format as read from the bytes: never what a client said it was.
    let media_type = crate::vision::probe(&bytes, u64::MAX)
        .map_or("application/octet-stream", |facts| facts.media_type);
    Ok(HttpResponse::Ok()
        .content_type(media_type)
        .insert_header(("Cache-Control", "private, max-age=31536000, immutable"))
        .body(bytes.to_vec()))
}
