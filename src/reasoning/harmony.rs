//! Harmony's channels in a gpt-oss reply. After the generation prompt `<|start|>assistant`
//! the model writes messages: a header (`<|channel|>analysis`, `<|channel|>final`, or
//! `<|channel|>commentary to=functions.NAME <|constrain|>json`, the recipient possibly before
//! the channel), `<|message|>`, the content, and an end (`<|end|>`, `<|call|>` ending a call,
//! `<|return|>` ending the turn); the next message opens with `<|start|>assistant`.
//!
//! [`ChannelStream`] routes `analysis` content to reasoning and `final` (and commentary without
//! a recipient, a preamble) to content. A message to a recipient is a tool call: it is passed
//! on whole as markup, `<|start|>assistant` + header + `<|message|>` + arguments + end, for the
//! `harmony` tool parser to read.

use super::{Part, non_empty};
pub use crate::tokenizer::harmony::MARKERS;
use crate::tokenizer::harmony::{CHANNEL, ENDS, MESSAGE, START, first_end};

/// Most bytes of text held while waiting for a header's `<|message|>`: text without a header
/// is content.
const HEADER_LIMIT: usize = 512;

/// What a message's content is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Content,
    Call,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    /// Reading a header, up to `<|message|>`.
    #[default]
    Header,
    /// Inside a message's content.
    Body(Kind),
    /// After a message's end, before the next `<|start|>`.
    Between,
}

/// Splits a streamed Harmony reply into [`Part`]s as soon as each message's channel is known.
#[derive(Debug, Default)]
pub struct ChannelStream {
    buffer: String,
    state: State,
    /// Reasoning was emitted: the next analysis message is set apart by a newline.
    reasoned: bool,
    /// The current analysis message has emitted nothing yet.
    separate: bool,
}

impl ChannelStream {
    /// The parts that `text` (the next streamed piece) completes.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.buffer.push_str(text);
        let mut parts = Vec::new();
        loop {
            match self.state {
                State::Header => {
                    if !self.read_header(&mut parts) {
                        return parts;
                    }
                }
                State::Body(kind) => {
                    let Some((at, len)) = first_end(&self.buffer) else {
                        let keep = partial_end_len(&self.buffer);
                        let emit: String = self.buffer.drain(..self.buffer.len() - keep).collect();
                        self.emit(kind, emit, &mut parts);
                        return parts;
                    };
                    let mut body: String = self.buffer.drain(..at + len).collect();
                    if kind != Kind::Call {
                        body.truncate(at);
                    }
                    self.emit(kind, body, &mut parts);
                    self.state = State::Between;
                }
                State::Between => {
                    if let Some(rest) = self.buffer.strip_prefix(START) {
                        self.buffer = rest.to_string();
                        self.state = State::Header;
                    } else if START.starts_with(self.buffer.as_str()) {
                        return parts;
                    } else {
                        // Text after a message's end that opens no message.
                        self.state = State::Body(Kind::Content);
                    }
                }
            }
        }
    }

    /// Reads a complete header from the buffer; false while it is incomplete.
    fn read_header(&mut self, parts: &mut Vec<Part>) -> bool {
        let message = self.buffer.find(MESSAGE);
        let end = first_end(&self.buffer).map(|(at, _)| at);
        let header = |at: usize| at <= HEADER_LIMIT && end.is_none_or(|end| at < end);
        let Some(at) = message.filter(|&at| header(at)) else {
            // Past the limit, a `<|message|>` would already be whole in the buffer.
            if end.is_some() || self.buffer.len() > HEADER_LIMIT + MESSAGE.len() {
                // No header at all: the model wrote plain text.
                self.state = State::Body(Kind::Content);
                return true;
            }
            return false;
        };
        let header: String = self.buffer.drain(..at + MESSAGE.len()).collect();
        let header = &header[..at];
        let kind = kind_of(header);
        if kind == Kind::Call {
            let header = header.strip_prefix(START).unwrap_or(header);
            let header = header.strip_prefix("assistant").unwrap_or(header);
            parts.push(Part::Content(format!("{START}assistant{header}{MESSAGE}")));
        }
        self.separate = kind == Kind::Reasoning && self.reasoned;
        self.state = State::Body(kind);
        true
    }

    fn emit(&mut self, kind: Kind, mut text: String, parts: &mut Vec<Part>) {
        if text.is_empty() {
            return;
        }
        match kind {
            Kind::Reasoning => {
                if std::mem::take(&mut self.separate) {
                    text.insert(0, '\n');
                }
                self.reasoned = true;
                parts.push(Part::Reasoning(text));
            }
            Kind::Content | Kind::Call => parts.push(Part::Content(text)),
        }
    }

    /// The end of the reply: whatever is still held. An unfinished call is passed on as it
    /// stands (the tool parser heals it when it may); an unfinished header is dropped.
    pub fn finish(&mut self) -> Vec<Part> {
        let rest = std::mem::take(&mut self.buffer);
        match self.state {
            State::Header if is_header_start(&rest) => Vec::new(),
            State::Header | State::Between => non_empty(Part::Content(rest)),
            State::Body(kind) => {
                let mut parts = Vec::new();
                self.emit(kind, rest, &mut parts);
                parts
            }
        }
    }
}

/// What a message with `header` holds: a message to a recipient is a call; the analysis
/// channel is reasoning; anything else is content.
fn kind_of(header: &str) -> Kind {
    if header.contains("to=") {
        return Kind::Call;
    }
    let channel = header
        .split(CHANNEL)
        .nth(1)
        .map(|rest| rest.split([' ', '<']).next().unwrap_or(""));
    match channel {
        Some("analysis") => Kind::Reasoning,
        _ => Kind::Content,
    }
}

/// Whether unfinished text reads as the start of a header (nothing in it is for the user).
fn is_header_start(text: &str) -> bool {
    let text = text.trim_start();
    [START, CHANNEL, "assistant", "to="]
        .iter()
        .any(|start| text.starts_with(start) || (text.starts_with("<|") && start.starts_with(text)))
}

/// How many bytes at the end of `text` could be the start of an end marker.
fn partial_end_len(text: &str) -> usize {
    ENDS.iter()
        .flat_map(|end| (1..end.len()).rev().find(|&n| text.ends_with(&end[..n])))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::super::{ReasoningSyntax, split, streamed};
    use super::HEADER_LIMIT;

    const ANSWER: &str = "<|channel|>analysis<|message|>User asks 2+2.<|end|>\
        <|start|>assistant<|channel|>final<|message|>It is 4.<|return|>";
    const CALL: &str = "<|channel|>analysis<|message|>Need weather.<|end|>\
        <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json\
        <|message|>{\"city\": \"Oslo\"}<|call|>";

    fn harmony(text: &str) -> (Option<String>, String) {
        split(text, ReasoningSyntax::Harmony)
    }

    #[test]
    fn analysis_is_reasoning_and_final_is_content() {
        assert_eq!(
            harmony(ANSWER),
            (Some("User asks 2+2.".into()), "It is 4.".into())
        );
        let two = "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis\
                   <|message|>b<|end|><|start|>assistant<|channel|>final<|message|>c<|return|>";
        assert_eq!(harmony(two), (Some("a\nb".into()), "c".into()));
        assert_eq!(harmony("no header"), (None, "no header".into()));
        let preamble = "<|channel|>commentary<|message|>Checking.<|end|>";
        assert_eq!(harmony(preamble), (None, "Checking.".into()));
    }

    #[test]
    fn a_message_to_a_tool_stays_markup_for_the_tool_parser() {
        assert_eq!(
            harmony(CALL),
            (
                Some("Need weather.".into()),
                "<|start|>assistant<|channel|>commentary to=functions.get_weather \
                 <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>"
                    .into()
            )
        );
        // The recipient first, right after the generation prompt.
        let first = " to=functions.f<|channel|>commentary json<|message|>{}<|call|>";
        assert_eq!(
            harmony(first).1,
            "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>"
        );
        // Cut before its end: passed on as it stands.
        let cut = &CALL[..CALL.len() - "\"}<|call|>".len()];
        assert!(harmony(cut).1.ends_with("{\"city\": \"Oslo"));
        // Cut inside a header: nothing to show.
        assert_eq!(harmony("<|channel|>anal"), (None, String::new()));
    }

    #[test]
    fn streamed_split_matches_the_whole_split() {
        let long = format!("{}<|message|>x", "y".repeat(HEADER_LIMIT + 3));
        let texts = [
            ANSWER,
            CALL,
            "no header",
            "<|channel|>final<|message|>a <| b<|return|>",
            &long,
        ];
        for text in texts {
            for size in 1..7 {
                let streamed = streamed(ReasoningSyntax::Harmony, text, size);
                assert_eq!(streamed, harmony(text), "{text:?} by {size}");
            }
        }
    }
}
