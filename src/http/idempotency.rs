//! `Idempotency-Key` on a turn: the first request with a key runs and its reply (a stream's
//! every event included) is kept on the session; a retry with the same key and the same body
//! gets that reply again — without sampling again or forking the node — and a retry that
//! arrives while the first still runs waits for it. Once a turn with the key was recorded,
//! the same key with another body is a 422; a request that was refused or failed binds
//! nothing, so its corrected retry runs.
//!
//! The key travels with the turn into its commit record (and the journal, with `--data-dir`),
//! so a turn that was recorded but whose reply never arrived whole — the client hung up, the
//! proxy was killed — is answered from the record on retry, shaped again from the very ids
//! the node holds. A turn that failed recorded nothing, keeps nothing, and its retry runs
//! anew.

use super::routes::Shape;
use super::{ApiError, AppState};
use crate::session::replies::{KeySlot, RecordedReply, TurnKey};
use crate::session::{Session, SessionLog};
use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::http::StatusCode;
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{HttpMessage, HttpResponse, web};
use bytes::Bytes;
use futures::StreamExt;
use std::sync::Arc;
use tokio::sync::OwnedMutexGuard;

/// Marks a reply sent again: the recorded one, or one shaped again from the turn's record.
const REPLAYED: &str = "idempotent-replayed";

/// The middleware of turn routes (`session`: the route's session id).
pub async fn once_per_key(
    state: &web::Data<AppState>,
    shape: Shape,
    session: Option<String>,
    mut request: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let key = request
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (Some(key), Some(session)) = (key, session) else {
        return next.call(request).await;
    };
    let session = match state.known_session(&session).await {
        Ok(session) => session,
        // The handler answers for a session that is not there, in its API's words.
        Err(error) if error.status == StatusCode::NOT_FOUND => return next.call(request).await,
        // A record that cannot be read now (a fleet's store restarting) may hold this key's
        // turn: running it without its key could sample and record it twice.
        Err(error) => return Ok(request.into_response(shape.refuse(error))),
    };
    // The body, read to hash it, then put back for the handler.
    let mut payload = request.take_payload();
    let mut body = Vec::new();
    while let Some(chunk) = payload.next().await {
        body.extend_from_slice(&chunk?);
        if body.len() > state.max_body_bytes {
            let error = super::body::too_large(state.max_body_bytes);
            return Ok(request.into_response(shape.refuse(error)));
        }
    }
    let body = Bytes::from(body);
    let body_hash = xxhash_rust::xxh3::xxh3_64(&body).max(1);
    let replay = futures::stream::once(async move { Ok::<_, PayloadError>(body) });
    let replay: std::pin::Pin<Box<dyn futures::Stream<Item = Result<Bytes, PayloadError>>>> =
        Box::pin(replay);
    request.set_payload(Payload::from(replay));

    let slot = session.replies.slot(&key).lock_owned().await;
    // Only a recorded turn binds the key (its reply, or its commit when the reply never went
    // out whole): a refused or failed request leaves it free.
    let committed = session.replies.committed(&key);
    let bound_to = match slot.body_hash {
        0 => committed.as_ref().map(|turn| turn.body_hash),
        hash => Some(hash),
    };
    if bound_to.is_some_and(|bound| bound != body_hash) {
        let error = ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request_error",
            format!("Idempotency-Key '{key}' was used with another request body"),
        );
        return Ok(request.into_response(shape.refuse(error)));
    }
    if let Some(reply) = &slot.reply {
        let response =
            HttpResponse::build(StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK))
                .content_type(reply.content_type.as_str())
                .insert_header((REPLAYED, "true"))
                .body(reply.body.clone());
        return Ok(request.into_response(response));
    }
    request.extensions_mut().insert(TurnKey {
        key: key.clone(),
        body_hash,
    });
    // A turn recorded before is answered from its record (never sampled again).
    let answered_from_record = committed.is_some();
    let mut response = next.call(request).await?;
    if !response.status().is_success() {
        return Ok(response);
    }
    if answered_from_record {
        response.headers_mut().insert(
            HeaderName::from_static(REPLAYED),
            HeaderValue::from_static("true"),
        );
    }
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let status = response.status().as_u16();
    let log = state.journal.clone();
    Ok(response.map_body(move |_, body| {
        BoxBody::new(Recording {
            body,
            body_hash,
            seen: Vec::new(),
            slot: Some(slot),
            status,
            content_type,
            log,
            session,
            key,
            keeping: None,
        })
    }))
}

/// A reply body passed through as it is sent, and kept in the key's slot once it is whole.
struct Recording {
    body: BoxBody,
    /// Hash of the request body, which the key is bound to once the turn is recorded.
    body_hash: u64,
    seen: Vec<u8>,
    /// Held until the reply is whole: a retry waits for it.
    slot: Option<OwnedMutexGuard<KeySlot>>,
    status: u16,
    content_type: String,
    /// Where the kept reply is journaled too, so a retry after a restart gets it.
    log: Option<Arc<dyn SessionLog>>,
    session: Arc<Session>,
    key: String,
    /// The kept reply being journaled: the body ends once it is (and the slot is let go).
    keeping: Option<futures::future::BoxFuture<'static, ()>>,
}

impl MessageBody for Recording {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Bytes, Self::Error>>> {
        let this = &mut *self;
        if let Some(keeping) = &mut this.keeping {
            std::task::ready!(keeping.as_mut().poll(cx));
            this.keeping = None;
            return std::task::Poll::Ready(None);
        }
        let next = std::pin::Pin::new(&mut this.body).poll_next(cx);
        match &next {
            std::task::Poll::Ready(Some(Ok(chunk))) => this.seen.extend_from_slice(chunk),
            std::task::Poll::Ready(None) => {
                // Only a turn that was recorded succeeded (a stream's failure event comes
                // with a 200 too).
                let recorded = this.session.replies.committed(&this.key).is_some();
                if let Some(mut slot) = this.slot.take()
                    && recorded
                {
                    slot.body_hash = this.body_hash;
                    slot.reply = Some(RecordedReply {
                        status: this.status,
                        content_type: std::mem::take(&mut this.content_type),
                        body: Bytes::from(std::mem::take(&mut this.seen)),
                    });
                    if let Some(log) = this.log.clone() {
                        let (id, key) = (this.session.id, this.key.clone());
                        this.keeping = Some(Box::pin(async move {
                            if let Err(error) = log.replied(id, &key, &slot).await {
                                tracing::error!(%error, "journaling an idempotent reply failed");
                            }
                        }));
                        return self.poll_next(cx);
                    }
                }
            }
            _ => {}
        }
        next
    }
}
