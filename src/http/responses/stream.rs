//! A streamed turn as Responses events, each with its `sequence_number`:
//! `response.created` and `response.in_progress` at once; then per output item
//! `response.output_item.added`, its deltas (`response.reasoning_text.delta`,
//! `response.output_text.delta` inside a `response.content_part`, or for a call, once its
//! markup is complete, `response.function_call_arguments.delta` and `.done`) and
//! `response.output_item.done`; last `response.completed` (or `response.incomplete`). A
//! failure after the stream began is an `error` event.

use super::reply::{Shell, item_id, message_item, output_text, status};
use super::{Finished, keep};
use crate::http::{ApiError, sse};
use crate::turn::{Delta, Finish, TurnEvent, TurnStream};
use actix_web::HttpResponse;
use bytes::Bytes;
use serde_json::{Value, json};

/// The event stream of `turn`; `finished` keeps the response once it is complete.
pub fn respond(shell: Shell, turn: TurnStream, finished: Finished) -> HttpResponse {
    let mut writer = EventWriter {
        shell,
        sequence: 0,
        output: Vec::new(),
        open: None,
        pending: String::new(),
        finish: None,
        finished: Some(finished),
    };
    let mut first = Vec::new();
    let response = json!(writer.shell.response("in_progress", &[], None, None));
    writer.event(
        &mut first,
        "response.created",
        json!({"response": response}),
    );
    writer.event(
        &mut first,
        "response.in_progress",
        json!({"response": response}),
    );
    sse::respond(Bytes::from(first), turn, move |event| writer.write(event))
}

/// The item being written: its id and text so far.
struct OpenItem {
    kind: Kind,
    id: String,
    text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Message,
}

struct EventWriter {
    shell: Shell,
    sequence: u64,
    /// The finished output items.
    output: Vec<Value>,
    open: Option<OpenItem>,
    /// Whitespace not yet written: a message opens only once it has other text.
    pending: String,
    finish: Option<Finish>,
    finished: Option<Finished>,
}

impl EventWriter {
    /// Appends event `name` with `fields` and the next sequence number.
    fn event(&mut self, out: &mut Vec<u8>, name: &str, mut fields: Value) {
        fields["type"] = name.into();
        fields["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
        sse::data(out, &fields);
    }

    fn write(&mut self, event: TurnEvent) -> Bytes {
        let mut out = Vec::new();
        match event {
            TurnEvent::Opened => {}
            TurnEvent::Sampled { deltas, .. } => self.deltas(&mut out, deltas),
            TurnEvent::Finished { deltas, finish, .. } => {
                self.deltas(&mut out, deltas);
                self.close(&mut out);
                self.finish = Some(finish);
            }
            TurnEvent::KeepAlive => out.extend_from_slice(b": keep-alive\n\n"),
            TurnEvent::Done(usage) => {
                let finish = self.finish.unwrap_or(Finish::Stop);
                let state = status(finish);
                let response = self
                    .shell
                    .response(state, &self.output, Some(finish), Some(&usage));
                if let Some(finished) = self.finished.take() {
                    keep(finished, &self.output, &response);
                }
                let name = match finish {
                    Finish::Length => "response.incomplete",
                    _ => "response.completed",
                };
                self.event(&mut out, name, json!({"response": response}));
            }
            TurnEvent::Failed(error) => {
                let error = ApiError::from(error);
                let fields = json!({"code": error.kind, "message": error.message, "param": null});
                self.event(&mut out, "error", fields);
            }
        }
        Bytes::from(out)
    }

    fn deltas(&mut self, out: &mut Vec<u8>, deltas: Vec<Delta>) {
        for delta in deltas {
            match delta {
                Delta::Reasoning(text) => {
                    let (id, index) = self.open_item(out, Kind::Reasoning);
                    self.append(&text);
                    let fields = json!({"item_id": id, "output_index": index,
                        "content_index": 0, "delta": text});
                    self.event(out, "response.reasoning_text.delta", fields);
                }
                Delta::Text(text) => {
                    let open_message = self.open.as_ref().map(|o| o.kind) == Some(Kind::Message);
                    if !open_message && text.trim().is_empty() {
                        self.pending.push_str(&text);
                        continue;
                    }
                    let (id, index) = self.open_item(out, Kind::Message);
                    let text = std::mem::take(&mut self.pending) + &text;
                    self.append(&text);
                    let fields = json!({"item_id": id, "output_index": index,
                        "content_index": 0, "delta": text, "logprobs": []});
                    self.event(out, "response.output_text.delta", fields);
                }
                Delta::Call { call, .. } => {
                    self.close(out);
                    let id = item_id("fc");
                    let index = self.output.len();
                    let added = self.shell.call_item(&id, &call, "", "in_progress");
                    let fields = json!({"output_index": index, "item": added});
                    self.event(out, "response.output_item.added", fields);
                    let fields = json!({"item_id": id, "output_index": index,
                        "delta": call.arguments});
                    self.event(out, "response.function_call_arguments.delta", fields);
                    let item = self
                        .shell
                        .call_item(&id, &call, &call.arguments, "completed");
                    let fields = json!({"item_id": id, "output_index": index,
                        "name": item["name"], "arguments": call.arguments});
                    self.event(out, "response.function_call_arguments.done", fields);
                    let fields = json!({"output_index": index, "item": item});
                    self.event(out, "response.output_item.done", fields);
                    self.output.push(item);
                }
            }
        }
    }

    /// The open item of `kind` (opening it, and closing another, when needed): its id and
    /// output index.
    fn open_item(&mut self, out: &mut Vec<u8>, kind: Kind) -> (String, usize) {
        if let Some(open) = self.open.as_ref().filter(|open| open.kind == kind) {
            return (open.id.clone(), self.output.len());
        }
        // Closing the other item counts it: the new one's index is taken after.
        self.close(out);
        let index = self.output.len();
        let (id, item, part) = match kind {
            Kind::Reasoning => {
                let id = item_id("rs");
                let item = json!({"id": id, "type": "reasoning", "summary": [], "content": []});
                (id, item, json!({"type": "reasoning_text", "text": ""}))
            }
            Kind::Message => {
                let id = item_id("msg");
                let mut item = message_item(&id, "", "in_progress");
                item["content"] = json!([]);
                (id, item, output_text(""))
            }
        };
        self.event(
            out,
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        let fields =
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part});
        self.event(out, "response.content_part.added", fields);
        self.open = Some(OpenItem {
            kind,
            id: id.clone(),
            text: String::new(),
        });
        (id, index)
    }

    fn append(&mut self, text: &str) {
        if let Some(open) = &mut self.open {
            open.text.push_str(text);
        }
    }

    /// Closes the open item: its `.done` events; whitespace still held is dropped.
    fn close(&mut self, out: &mut Vec<u8>) {
        self.pending.clear();
        let Some(open) = self.open.take() else { return };
        let index = self.output.len();
        let (done, part, item) = match open.kind {
            Kind::Reasoning => (
                "response.reasoning_text.done",
                json!({"type": "reasoning_text", "text": open.text}),
                self.shell.reasoning_item(&open.id, &open.text),
            ),
            Kind::Message => (
                "response.output_text.done",
                output_text(&open.text),
                message_item(&open.id, &open.text, "completed"),
            ),
        };
        let fields = json!({"item_id": open.id, "output_index": index, "content_index": 0,
            "text": open.text});
        self.event(out, done, fields);
        let fields = json!({"item_id": open.id, "output_index": index, "content_index": 0,
            "part": part});
        self.event(out, "response.content_part.done", fields);
        self.event(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.output.push(item);
    }
}
