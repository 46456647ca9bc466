//! Reading JSON bodies with OpenAI-shaped errors (actix's extractors answer in plain text).

use super::ApiError;
use actix_web::http::StatusCode;
use actix_web::web;
use futures::StreamExt;
use serde::de::DeserializeOwned;

/// Reads the whole body (at most `limit` bytes) and parses it as `T`.
pub async fn read_json<T: DeserializeOwned>(
    mut payload: web::Payload,
    limit: usize,
) -> Result<T, ApiError> {
    // Chunks are kept as they came and joined once, at their total size: a body usually comes
    // in one chunk, which is then parsed where it lies.
    let mut chunks: Vec<web::Bytes> = Vec::new();
    let mut len = 0;
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| match e {
            actix_web::error::PayloadError::Overflow => too_large(limit),
            other => ApiError::bad_request(format!("cannot read request body: {other}")),
        })?;
        len += chunk.len();
        if len > limit {
            return Err(too_large(limit));
        }
        chunks.push(chunk);
    }
    let joined;
    let body: &[u8] = match chunks.as_slice() {
        _ if len == 0 => b"{}",
        [one] => one,
        many => {
            joined = many.concat();
            &joined
        }
    };
    serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            ApiError::bad_request(format!("invalid request: {e}"))
        } else {
            ApiError::bad_request(format!("malformed JSON body: {e}"))
        }
    })
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        format!("request body exceeds {limit} bytes"),
    )
}
