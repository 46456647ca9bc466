//! A streamed turn as Anthropic Messages events: `message_start` at once, then content blocks
//! opened as the model writes them (`content_block_start`, `content_block_delta` with
//! `thinking_delta`, `text_delta` or, once a call's markup is complete, its whole
//! `input_json_delta`, `content_block_stop`), `ping` while the backend is silent, and
//! `message_delta` with the stop reason and usage, then `message_stop`. A failure after the
//! stream began is an `error` event.

use super::reply::{Block, Message, MessageUsage, call_input, stop_reason};
use super::{AnthropicError, MESSAGE};
use crate::generation::StopMatch;
use crate::http::ApiError;
use crate::http::sse;
use crate::turn::{Delta, Finish, TurnEvent, TurnStream, Usage};
use actix_web::HttpResponse;
use bytes::Bytes;
use serde::Serialize;

/// One Messages stream event; its `type` is also the event's name.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event<'a> {
    MessageStart {
        message: Message<'a>,
    },
    ContentBlockStart {
        index: usize,
        content_block: Block<'a>,
    },
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta<'a>,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: StopDelta<'a>,
        usage: MessageUsage,
    },
    MessageStop,
    Ping,
}

impl Event<'_> {
    fn name(&self) -> &'static str {
        match self {
            Event::MessageStart { .. } => "message_start",
            Event::ContentBlockStart { .. } => "content_block_start",
            Event::ContentBlockDelta { .. } => "content_block_delta",
            Event::ContentBlockStop { .. } => "content_block_stop",
            Event::MessageDelta { .. } => "message_delta",
            Event::MessageStop => "message_stop",
            Event::Ping => "ping",
        }
    }
}

/// What a `content_block_delta` adds to its block.
#[derive(Serialize)]
#[serde(tag = "type")]
enum BlockDelta<'a> {
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: &'a str },
    #[serde(rename = "text_delta")]
    Text { text: &'a str },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: String },
}

/// How the message ended, in `message_delta`.
#[derive(Serialize)]
struct StopDelta<'a> {
    stop_reason: &'static str,
    stop_sequence: Option<&'a str>,
}

/// The event stream of `turn`, for a message `id` naming `model`.
pub fn respond(id: String, model: String, turn: TurnStream) -> HttpResponse {
    let mut first = Vec::new();
    let usage = MessageUsage::from(&Usage {
        prompt_tokens: turn.prompt_ids.len(),
        completion_tokens: 0,
        cached_tokens: None,
    });
    let message = Message {
        id: &id,
        kind: MESSAGE,
        role: "assistant",
        model: &model,
        content: Vec::new(),
        stop_reason: None,
        stop_sequence: None,
        usage,
    };
    write(&mut first, &Event::MessageStart { message });
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

/// `event` appended to `out` under its name.
fn write(out: &mut Vec<u8>, event: &Event) {
    named(out, event.name(), event);
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
            TurnEvent::KeepAlive => write(&mut out, &Event::Ping),
            TurnEvent::Done(usage) => {
                let (finish, stop) = self.finish.take().unwrap_or((Finish::Stop, None));
                let (reason, sequence) = stop_reason(finish, stop.as_ref());
                let delta = Event::MessageDelta {
                    delta: StopDelta {
                        stop_reason: reason,
                        stop_sequence: sequence,
                    },
                    usage: MessageUsage::from(&usage),
                };
                write(&mut out, &delta);
                write(&mut out, &Event::MessageStop);
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
                    self.delta(out, BlockDelta::Thinking { thinking: &text });
                }
                Delta::Text(text) => {
                    if self.open != Some(Open::Text) && text.trim().is_empty() {
                        self.pending.push_str(&text);
                        continue;
                    }
                    self.open_block(out, Open::Text);
                    let text = std::mem::take(&mut self.pending) + &text;
                    self.delta(out, BlockDelta::Text { text: &text });
                }
                Delta::Call { call, .. } => {
                    self.close(out);
                    let index = self.next;
                    self.next += 1;
                    let content_block = Block::ToolUse {
                        id: &call.id,
                        name: &call.name,
                        input: serde_json::Value::Object(Default::default()),
                    };
                    write(
                        out,
                        &Event::ContentBlockStart {
                            index,
                            content_block,
                        },
                    );
                    let partial_json = call_input(&call).to_string();
                    let delta = BlockDelta::InputJson { partial_json };
                    write(out, &Event::ContentBlockDelta { index, delta });
                    write(out, &Event::ContentBlockStop { index });
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
        let content_block = match kind {
            Open::Thinking => Block::Thinking {
                thinking: "",
                signature: "",
            },
            Open::Text => Block::Text { text: "" },
        };
        let index = self.next;
        write(
            out,
            &Event::ContentBlockStart {
                index,
                content_block,
            },
        );
        self.open = Some(kind);
        self.next += 1;
    }

    fn delta(&self, out: &mut Vec<u8>, delta: BlockDelta) {
        let index = self.next - 1;
        write(out, &Event::ContentBlockDelta { index, delta });
    }

    /// Closes the open block, if any; whitespace still held is dropped.
    fn close(&mut self, out: &mut Vec<u8>) {
        self.pending.clear();
        if self.open.take().is_some() {
            let index = self.next - 1;
            write(out, &Event::ContentBlockStop { index });
        }
    }
}
