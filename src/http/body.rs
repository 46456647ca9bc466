//! JSON bodies in and out: reading them with errors in the API's shape (actix's extractors
//! answer in plain text), and writing replies whose long id lists skip `serde_json::Value`.

use super::ApiError;
use actix_web::http::StatusCode;
use actix_web::web;
use futures::StreamExt;
use serde::de::DeserializeOwned;

/// Reads the whole body (at most `limit` bytes) and parses it as `T`.
pub async fn read_json<T: DeserializeOwned>(
    payload: web::Payload,
    limit: usize,
) -> Result<T, ApiError> {
    parse_json(&read_body(payload, limit).await?)
}

/// Reads the whole body, at most `limit` bytes (an empty body reads as `{}`).
pub async fn read_body(mut payload: web::Payload, limit: usize) -> Result<web::Bytes, ApiError> {
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
    Ok(match chunks.len() {
        _ if len == 0 => web::Bytes::from_static(b"{}"),
        1 => chunks.pop().unwrap_or_default(),
        _ => web::Bytes::from(chunks.concat()),
    })
}

/// Reads the whole body; its top-level fields not in `known` are logged at debug (clients
/// add fields every month: they are ignored, never refused).
pub async fn read_body_noting_unknown(
    payload: web::Payload,
    limit: usize,
    known: &[&str],
) -> Result<web::Bytes, ApiError> {
    let bytes = read_body(payload, limit).await?;
    if tracing::enabled!(tracing::Level::DEBUG)
        && let Ok(fields) = parse_json::<serde_json::Map<String, serde_json::Value>>(&bytes)
    {
        let unknown: Vec<_> = fields
            .keys()
            .filter(|key| !known.contains(&key.as_str()))
            .collect();
        if !unknown.is_empty() {
            tracing::debug!(?unknown, "request fields ignored");
        }
    }
    Ok(bytes)
}

/// Parses a body, which must be a JSON object, as `T` (serde would read a struct from an
/// array of its fields too).
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|&b| b != b'{') {
        return Err(ApiError::bad_request(
            "invalid request: the body must be a JSON object",
        ));
    }
    serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            ApiError::bad_request(format!("invalid request: {e}"))
        } else {
            ApiError::bad_request(format!("malformed JSON body: {e}"))
        }
    })
}

pub fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        format!("request body exceeds {limit} bytes"),
    )
}

/// A 200 reply carrying already serialised JSON.
pub fn json_response(body: Vec<u8>) -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok()
        .content_type("application/json")
        .body(body)
}

/// `body` (a JSON object) serialised with `key: ids` added last, the ids written straight
/// from the slice: a long prompt costs no JSON value per token.
pub fn json_with_ids(body: &impl serde::Serialize, key: &str, ids: &[u32]) -> Vec<u8> {
    let mut out = serde_json::to_vec(body).unwrap_or_default();
    if out.last() == Some(&b'}') {
        out.pop();
        if out.len() > 1 {
            out.push(b',');
        }
        let _ = serde_json::to_writer(&mut out, key);
        out.push(b':');
        let _ = serde_json::to_writer(&mut out, ids);
        out.push(b'}');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn ids_are_written_last_into_the_object() {
        let out = json_with_ids(&json!({"a": 1}), "ids", &[3, 4]);
        assert_eq!(
            serde_json::from_slice::<Value>(&out).unwrap(),
            json!({"a": 1, "ids": [3, 4]})
        );
        let out = json_with_ids(&json!({}), "ids", &[]);
        assert_eq!(std::str::from_utf8(&out).unwrap(), r#"{"ids":[]}"#);
    }
}
