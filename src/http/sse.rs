//! Server-sent events: a streamed turn's events written as an HTTP event stream by an
//! API's encoder. The body pulls events from the turn as the client reads; when the client
//! hangs up, the body is dropped, and with it the turn's receiver, which cancels the turn.

use crate::turn::{TurnEvent, TurnStream};
use actix_web::HttpResponse;
use bytes::Bytes;
use futures::StreamExt;

/// An event stream whose bytes are `first` (written at once), then each turn event as
/// `encode` writes it (events it writes nothing for are skipped).
pub fn respond(
    first: Bytes,
    turn: TurnStream,
    mut encode: impl FnMut(TurnEvent) -> Bytes + 'static,
) -> HttpResponse {
    let first = (!first.is_empty()).then_some(Ok::<_, std::convert::Infallible>(first));
    let events = futures::stream::unfold(turn.events, |mut events| async move {
        events.recv().await.map(|event| (event, events))
    });
    let events = events.filter_map(move |event| {
        let bytes = encode(event);
        std::future::ready((!bytes.is_empty()).then_some(Ok(bytes)))
    });
    let body = futures::stream::iter(first).chain(events);
    // The charset is explicit: without one, clients such as Python `requests` decode an
    // event stream as Latin-1.
    HttpResponse::Ok()
        .content_type("text/event-stream; charset=utf-8")
        .insert_header(("Cache-Control", "no-cache"))
        .streaming(body)
}

/// `data: {json}\n\n` appended to `out`.
pub fn data(out: &mut Vec<u8>, payload: &impl serde::Serialize) {
    out.extend_from_slice(b"data: ");
    let _ = serde_json::to_writer(&mut *out, payload);
    out.extend_from_slice(b"\n\n");
}
