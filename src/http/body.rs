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
    let mut bytes = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| match e {
            actix_web::error::PayloadError::Overflow => too_large(limit),
            other => ApiError::bad_request(format!("cannot read request body: {other}")),
        })?;
        if bytes.len() + chunk.len() > limit {
            return Err(too_large(limit));
        }
        bytes.extend_from_slice(&chunk);
    }
    let body: &[u8] = if bytes.is_empty() { b"{}" } else { &bytes };
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
