//! A streamed turn as Anthropic Messages events: `message_start` at once, then content blocks
//! opened as the model writes them (`content_block_start`, `content_block_delta` with
//! `thinking_delta`, `text_delta` or, once a call's markup is complete, its whole
//! `input_json_delta`, `content_block_stop`), `ping` while the backend is silent, and
//! `message_delta` with the stop reason and usage, then `message_stop`. A failure after the
//! stream began is an `error` event.

use super::reply::{MessageUsage, call_input, stop_reason};
use super::{AnthropicError, MESSAGE};
use crate::generation::StopMatch;
use crate::http::ApiError;
use crate::http::sse;
use crate::turn::{Delta, Finish, TurnEvent, TurnStream, Usage};
use actix_web::HttpResponse;
use bytes::Bytes;
use serde_json::json;

/// The event stream of `turn`, for a message `id` naming `model`.
pub fn respond(id: String, model: String, turn: TurnStream) -> HttpResponse {
    let mut first = Vec::new();
    let usage = MessageUsage::from(&Usage {
        prompt_tokens: turn.prompt_tokens,
        completion_tokens: 0,
        cached_tokens: None,
    });
    let start = json!({"type": "message_start", "message": {
        "id": id, "type": MESSAGE, "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null, "usage": usage}});
    named(&mut first, "message_start", &start);
    let mut writer = EventWriter::default();
    sse::respond(Bytes::from(first), turn, move |event| writer.write(event))
}

/// `event: {name}\ndata: {json}\n\n` appended to `out`.
fn named(out: &mut Vec<u8>, name: &str, payload: &impl serde::Serialize) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.push(b'\n');
    sse::data(out, payload);
}

/// The block being written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
}

/// Writes a turn's events, keeping which block is open.
#[derive(Default)]
struct EventWriter {
    /// The index the next block gets.
    next: usize,
    open: Option<Open>,
    /// Whitespace not yet written: a text block opens only once it has other text.
    pending: String,
    finish: Option<(Finish, Option<StopMatch>)>,
}

impl EventWriter {
    fn write(&mut self, event: TurnEvent) -> Bytes {
        let mut out = Vec::new();
        match event {
            TurnEvent::Opened => {}
            TurnEvent::Sampled { deltas, .. } => self.deltas(&mut out, deltas),
            TurnEvent::Finished {
                deltas,
                finish,
                stop,
                ..
            } => {
                self.deltas(&mut out, deltas);
                self.close(&mut out);
                self.finish = Some((finish, stop));
            }
            TurnEvent::KeepAlive => named(&mut out, "ping", &json!({"type": "ping"})),
            TurnEvent::Done(usage) => {
                let (finish, stop) = self.finish.take().unwrap_or((Finish::Stop, None));
                let (reason, sequence) = stop_reason(finish, stop.as_ref());
                let delta = json!({"type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": MessageUsage::from(&usage)});
                named(&mut out, "message_delta", &delta);
                named(&mut out, "message_stop", &json!({"type": "message_stop"}));
            }
            TurnEvent::Failed(error) => {
                let error = AnthropicError::from(ApiError::from(error));
                named(&mut out, "error", &error.body());
            }
        }
        Bytes::from(out)
    }

    fn deltas(&mut self, out: &mut Vec<u8>, deltas: Vec<Delta>) {
        for delta in deltas {
            match delta {
                Delta::Reasoning(text) => {
                    self.open_block(out, Open::Thinking);
                    let delta = json!({"type": "thinking_delta", "thinking": text});
                    self.delta(out, &delta);
                }
                Delta::Text(text) => {
                    if self.open != Some(Open::Text) && text.trim().is_empty() {
                        self.pending.push_str(&text);
                        continue;
                    }
                    self.open_block(out, Open::Text);
                    let text = std::mem::take(&mut self.pending) + &text;
                    self.delta(out, &json!({"type": "text_delta", "text": text}));
                }
                Delta::Call { call, .. } => {
                    self.close(out);
                    let index = self.next;
                    self.next += 1;
                    let start = json!({"type": "content_block_start", "index": index,
                        "content_block": {"type": "tool_use", "id": call.id, "name": call.name,
                        "input": {}}});
                    named(out, "content_block_start", &start);
                    let input = call_input(&call).to_string();
                    let delta = json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": input}});
                    named(out, "content_block_delta", &delta);
                    let stop = json!({"type": "content_block_stop", "index": index});
                    named(out, "content_block_stop", &stop);
                }
            }
        }
    }

    /// Opens a block of `kind` unless one is open (closing a block of another kind).
    fn open_block(&mut self, out: &mut Vec<u8>, kind: Open) {
        if self.open == Some(kind) {
            return;
        }
        self.close(out);
        let block = match kind {
            Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Open::Text => json!({"type": "text", "text": ""}),
        };
        let start =
            json!({"type": "content_block_start", "index": self.next, "content_block": block});
        named(out, "content_block_start", &start);
        self.open = Some(kind);
        self.next += 1;
    }

    fn delta(&self, out: &mut Vec<u8>, delta: &serde_json::Value) {
        let event = json!({"type": "content_block_delta", "index": self.next - 1, "delta": delta});
        named(out, "content_block_delta", &event);
    }

    /// Closes the open block, if any; whitespace still held is dropped.
    fn close(&mut self, out: &mut Vec<u8>) {
        self.pending.clear();
        if self.open.take().is_some() {
            let stop = json!({"type": "content_block_stop", "index": self.next - 1});
            named(out, "content_block_stop", &stop);
        }
    }
}
