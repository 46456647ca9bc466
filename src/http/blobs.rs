//! `GET /blobs/{sha256}` (operator) and `GET /{uuid}/blobs/{sha256}` (a session's own): the
//! bytes of an image a node records, by the hash in its `images`, for a trainer to rebuild the
//! pixel values (and the viewer to show them).

use super::{ApiError, AppState};
use crate::session::blobs::is_sha256;
use actix_web::{HttpResponse, web};

/// An image kept by any session.
pub async fn blob(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    image(&state, &path.into_inner())
}

/// An image session `uuid` holds.
pub async fn session_blob(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (uuid, sha256) = path.into_inner();
    let session = state.session(&uuid).await?;
    let held = session.state.lock().await.nodes.iter().any(|node| {
        let mut images = node.images().iter();
        images.any(|image| *image.sha256 == sha256)
    });
    if !held {
        return Err(ApiError::not_found(format!(
            "session {uuid} holds no image {sha256}"
        )));
    }
    image(&state, &sha256)
}

fn image(state: &AppState, sha256: &str) -> Result<HttpResponse, ApiError> {
    if !is_sha256(sha256) {
        return Err(ApiError::bad_request(
            "an image is named by its SHA-256 in lowercase hex (64 characters)",
        ));
    }
    let bytes = state
        .pipeline
        .blobs
        .get(sha256)
        .ok_or_else(|| ApiError::not_found(format!("no image {sha256} is kept")))?;
    // The format as read from the bytes: never what a client said it was.
    let media_type = crate::vision::probe(&bytes, u64::MAX)
        .map_or("application/octet-stream", |facts| facts.media_type);
    Ok(HttpResponse::Ok()
        .content_type(media_type)
        .insert_header(("Cache-Control", "private, max-age=31536000, immutable"))
        .body(bytes.to_vec()))
}
