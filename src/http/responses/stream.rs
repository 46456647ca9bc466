//! A streamed turn as Responses events, each with its `sequence_number`:
//! `response.created` and `response.in_progress` at once; then per output item
//! `response.output_item.added`, its deltas (`response.reasoning_text.delta`,
//! `response.output_text.delta` inside a `response.content_part`, or for a call, once its
//! markup is complete, `response.function_call_arguments.delta` and `.done`) and
//! `response.output_item.done`; last `response.completed` (or `response.incomplete`). A
//! failure after the stream began is an `error` event.

use super::reply::{OutputItem, Part, ResponseObject, Shell, item_id, status};
use super::{Finished, keep};
use crate::http::{ApiError, sse};
use crate::turn::{Delta, Finish, TurnEvent, TurnStream};
use actix_web::HttpResponse;
use bytes::Bytes;
use serde::Serialize;

/// One Responses stream event; its `type` is also the event's name.
#[derive(Serialize)]
#[serde(tag = "type")]
enum Event<'a> {
    #[serde(rename = "response.created")]
    Created { response: &'a ResponseObject<'a> },
    #[serde(rename = "response.in_progress")]
    InProgress { response: &'a ResponseObject<'a> },
    #[serde(rename = "response.completed")]
    Completed { response: &'a ResponseObject<'a> },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: &'a ResponseObject<'a> },
    #[serde(rename = "response.output_item.added")]
    ItemAdded {
        output_index: usize,
        item: &'a OutputItem,
    },
    #[serde(rename = "response.output_item.done")]
    ItemDone {
        output_index: usize,
        item: &'a OutputItem,
    },
    #[serde(rename = "response.content_part.added")]
    PartAdded(InPart<'a>),
    #[serde(rename = "response.content_part.done")]
    PartDone(InPart<'a>),
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningDelta(InPart<'a>),
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningDone(InPart<'a>),
    #[serde(rename = "response.output_text.delta")]
    TextDelta(InPart<'a>),
    #[serde(rename = "response.output_text.done")]
    TextDone(InPart<'a>),
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta {
        item_id: &'a str,
        output_index: usize,
        delta: &'a str,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone {
        item_id: &'a str,
        output_index: usize,
        name: &'a str,
        arguments: &'a str,
    },
    #[serde(rename = "error")]
    Error {
        code: &'a str,
        message: &'a str,
        param: Option<()>,
    },
}

impl Event<'_> {
    fn name(&self) -> &'static str {
        match self {
            Event::Created { .. } => "response.created",
            Event::InProgress { .. } => "response.in_progress",
            Event::Completed { .. } => "response.completed",
            Event::Incomplete { .. } => "response.incomplete",
            Event::ItemAdded { .. } => "response.output_item.added",
            Event::ItemDone { .. } => "response.output_item.done",
            Event::PartAdded(_) => "response.content_part.added",
            Event::PartDone(_) => "response.content_part.done",
            Event::ReasoningDelta(_) => "response.reasoning_text.delta",
            Event::ReasoningDone(_) => "response.reasoning_text.done",
            Event::TextDelta(_) => "response.output_text.delta",
            Event::TextDone(_) => "response.output_text.done",
            Event::ArgumentsDelta { .. } => "response.function_call_arguments.delta",
            Event::ArgumentsDone { .. } => "response.function_call_arguments.done",
            Event::Error { .. } => "error",
        }
    }
}

/// A content event: the item, its place in the output, the part (always the first: an item
/// holds one), and what the event carries.
#[derive(Serialize, Clone, Copy)]
struct InPart<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    part: Option<&'a Part>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    /// Written (empty) with an `output_text` delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<[(); 0]>,
}

impl<'a> InPart<'a> {
    fn of(item_id: &'a str, output_index: usize) -> Self {
        Self {
            item_id,
            output_index,
            content_index: 0,
            part: None,
            delta: None,
            text: None,
            logprobs: None,
        }
    }

    fn part(self, part: &'a Part) -> Self {
        Self {
            part: Some(part),
            ..self
        }
    }

    fn delta(self, delta: &'a str) -> Self {
        Self {
            delta: Some(delta),
            ..self
        }
    }

    fn text(self, text: &'a str) -> Self {
        Self {
            text: Some(text),
            ..self
        }
    }
}

/// The events written so far, which number the next.
struct Sequence(u64);

impl Sequence {
    /// Appends `event` with the next sequence number.
    fn write(&mut self, out: &mut Vec<u8>, event: Event<'_>) {
        let numbered = Numbered {
            event: &event,
            sequence_number: self.0,
        };
        self.0 += 1;
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(event.name().as_bytes());
        out.push(b'\n');
        sse::data(out, &numbered);
    }
}

/// An event as written: the event and its place in the stream.
#[derive(Serialize)]
struct Numbered<'e> {
    #[serde(flatten)]
    event: &'e Event<'e>,
    sequence_number: u64,
}

/// The event stream of `turn`; `finished` keeps the response once it is complete.
pub fn respond(shell: Shell, turn: TurnStream, finished: Finished) -> HttpResponse {
    let mut writer = EventWriter {
        shell,
        events: Sequence(0),
        output: Vec::new(),
        open: None,
        pending: String::new(),
        finish: None,
        finished: Some(finished),
    };
    let mut first = Vec::new();
    let response = writer.shell.response("in_progress", &[], None, None);
    writer.events.write(
        &mut first,
        Event::Created {
            response: &response,
        },
    );
    writer.events.write(
        &mut first,
        Event::InProgress {
            response: &response,
        },
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
    events: Sequence,
    /// The finished output items.
    output: Vec<OutputItem>,
    open: Option<OpenItem>,
    /// Whitespace not yet written: a message opens only once it has other text.
    pending: String,
    finish: Option<Finish>,
    finished: Option<Finished>,
}

impl EventWriter {
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
                // Written right after this event: the encoder of an event stream is not async.
                if let Some(journaled) = self
                    .finished
                    .take()
                    .and_then(|finished| keep(finished, &self.output, &response))
                {
                    tokio::spawn(journaled);
                }
                let response = &response;
                let event = match finish {
                    Finish::Length => Event::Incomplete { response },
                    _ => Event::Completed { response },
                };
                self.events.write(&mut out, event);
            }
            TurnEvent::Failed(error) => {
                let error = ApiError::from(error);
                let (code, message) = (error.kind, error.message.as_str());
                let param = None;
                self.events.write(
                    &mut out,
                    Event::Error {
                        code,
                        message,
                        param,
                    },
                );
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
                    let delta = InPart::of(&id, index).delta(&text);
                    self.events.write(out, Event::ReasoningDelta(delta));
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
                    let delta = InPart {
                        logprobs: Some([]),
                        ..InPart::of(&id, index).delta(&text)
                    };
                    self.events.write(out, Event::TextDelta(delta));
                }
                Delta::Call { call, .. } => {
                    self.close(out);
                    let id = item_id("fc");
                    let index = self.output.len();
                    let added = self.shell.call_item(id.clone(), &call, "", "in_progress");
                    let (item_id, output_index) = (id.as_str(), index);
                    let item = &added;
                    self.events
                        .write(out, Event::ItemAdded { output_index, item });
                    let delta = call.arguments.as_str();
                    let event = Event::ArgumentsDelta {
                        item_id,
                        output_index,
                        delta,
                    };
                    self.events.write(out, event);
                    let item =
                        self.shell
                            .call_item(id.clone(), &call, &call.arguments, "completed");
                    let event = Event::ArgumentsDone {
                        item_id,
                        output_index,
                        name: item.function_name().unwrap_or_default(),
                        arguments: &call.arguments,
                    };
                    self.events.write(out, event);
                    self.events.write(
                        out,
                        Event::ItemDone {
                            output_index,
                            item: &item,
                        },
                    );
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
                let item = OutputItem::Reasoning {
                    id: id.clone(),
                    summary: [],
                    content: Vec::new(),
                    encrypted_content: None,
                };
                (id, item, Part::ReasoningText { text: "".into() })
            }
            Kind::Message => {
                let id = item_id("msg");
                let item = OutputItem::Message {
                    id: id.clone(),
                    status: "in_progress",
                    role: "assistant",
                    content: Vec::new(),
                };
                (id, item, Part::output_text(""))
            }
        };
        let (output_index, item) = (index, &item);
        self.events
            .write(out, Event::ItemAdded { output_index, item });
        let added = InPart::of(&id, index).part(&part);
        self.events.write(out, Event::PartAdded(added));
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
        let (at, text) = (InPart::of(&open.id, index), open.text.as_str());
        let (done, part, item) = match open.kind {
            Kind::Reasoning => (
                Event::ReasoningDone(at.text(text)),
                Part::ReasoningText { text: text.into() },
                self.shell.reasoning_item(open.id.clone(), text),
            ),
            Kind::Message => (
                Event::TextDone(at.text(text)),
                Part::output_text(text),
                OutputItem::message(open.id.clone(), text, "completed"),
            ),
        };
        self.events.write(out, done);
        self.events.write(out, Event::PartDone(at.part(&part)));
        let (output_index, item_ref) = (index, &item);
        self.events.write(
            out,
            Event::ItemDone {
                output_index,
                item: item_ref,
            },
        );
        self.output.push(item);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(event: Event<'_>, sequence: u64) -> String {
        let mut out = Vec::new();
        Sequence(sequence).write(&mut out, event);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn events_are_named_and_flat_as_responses_writes_them() {
        let text_delta = Event::TextDelta(InPart {
            logprobs: Some([]),
            ..InPart::of("msg_1", 2).delta("hi")
        });
        assert_eq!(
            written(text_delta, 7),
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\
             \"item_id\":\"msg_1\",\"output_index\":2,\"content_index\":0,\"delta\":\"hi\",\
             \"logprobs\":[],\"sequence_number\":7}\n\n"
        );
        let name = "get_weather";
        let done = Event::ArgumentsDone {
            item_id: "fc_1",
            output_index: 0,
            name,
            arguments: "{}",
        };
        assert_eq!(
            written(done, 0),
            "event: response.function_call_arguments.done\ndata: {\"type\":\
             \"response.function_call_arguments.done\",\"item_id\":\"fc_1\",\"output_index\":0,\
             \"name\":\"get_weather\",\"arguments\":\"{}\",\"sequence_number\":0}\n\n"
        );
        let error = Event::Error {
            code: "server_error",
            message: "gone",
            param: None,
        };
        assert_eq!(
            written(error, 1),
            "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\
             \"message\":\"gone\",\"param\":null,\"sequence_number\":1}\n\n"
        );
    }
}
