//! The conversation a session was last sent, kept so the next request is read only where it
//! is new. An agent resends its whole conversation every turn: at turn 128 of a long rollout
//! that is ~300 KB of JSON, of which the last message or two are new. When a body starts with
//! the bytes the session's last body had up to the end of its last message, those messages
//! are the ones read then; only the body without them is parsed, and the messages are shared
//! (with what was derived from them: digests, fingerprints, template values).
//!
//! This is a cache, never a source of truth: the bytes are compared by XXH3-128 of the whole
//! known prefix, the messages counted as they are scanned, and anything unexpected (another
//! shape, an error in the shortened body) reads the body whole, as without it.

use super::messages::ChatMessage;
use std::sync::Arc;
use xxhash_rust::xxh3::Xxh3;

/// A body's conversation, as last read on a session.
#[derive(Debug)]
pub struct SentConversation {
    /// The body's bytes before its first message (its `"messages": [` included).
    start: usize,
    /// Where its last message ends.
    end: usize,
    /// XXH3-128 of the body's first `end` bytes.
    digest: u128,
    /// The messages read from it.
    messages: Vec<Arc<ChatMessage>>,
}

/// A body that starts with a known conversation and adds messages to it.
pub struct Resent<'s> {
    sent: &'s SentConversation,
    /// The hash state after the known bytes (continued for the next memo).
    hasher: Xxh3,
    /// Where the body's new messages begin.
    new_from: usize,
    /// The body with the known messages left out: what is left to read.
    pub rest: Vec<u8>,
}

impl SentConversation {
    /// What `body` resends of this conversation: `None` unless it starts with the same bytes
    /// up to the end of the last message, and then adds at least one message.
    pub fn resent_in(&self, body: &[u8]) -> Option<Resent<'_>> {
        if body.len() <= self.end {
            return None;
        }
        let mut hasher = Xxh3::new();
        hasher.update(&body[..self.end]);
        if hasher.digest128() != self.digest {
            return None;
        }
        let comma = skip_whitespace(body, self.end);
        if body.get(comma) != Some(&b',') {
            return None;
        }
        let mut rest = Vec::with_capacity(self.start + body.len() - comma);
        rest.extend_from_slice(&body[..self.start]);
        rest.extend_from_slice(&body[comma + 1..]);
        Some(Resent {
            sent: self,
            hasher,
            new_from: comma + 1,
            rest,
        })
    }

    /// The conversation of `body`, whose `messages` were read from it; `None` when its
    /// messages cannot be located (another shape: nothing is kept).
    pub fn read(body: &[u8], messages: Vec<Arc<ChatMessage>>) -> Option<Self> {
        let start = messages_array(body)?;
        let (end, count) = elements(body, start)?;
        if count != messages.len() {
            return None;
        }
        Some(Self {
            start,
            end,
            digest: xxhash_rust::xxh3::xxh3_128(&body[..end]),
            messages,
        })
    }

    /// How many messages it holds.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// Whether it holds none (never: an empty conversation is not kept).
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }
}

impl Resent<'_> {
    /// The messages the body resends, read before.
    pub fn known(&self) -> &[Arc<ChatMessage>] {
        &self.sent.messages
    }

    /// The conversation of the whole `body` once its new messages are read: `messages` are
    /// all of them, the known ones first.
    pub fn remember(
        mut self,
        body: &[u8],
        messages: Vec<Arc<ChatMessage>>,
    ) -> Option<SentConversation> {
        let (end, count) = elements(body, self.new_from)?;
        if self.sent.messages.len() + count != messages.len() {
            return None;
        }
        self.hasher.update(&body[self.sent.end..end]);
        Some(SentConversation {
            start: self.sent.start,
            end,
            digest: self.hasher.digest128(),
            messages,
        })
    }
}

fn skip_whitespace(body: &[u8], mut at: usize) -> usize {
    while body
        .get(at)
        .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        at += 1;
    }
    at
}

/// Where the elements of the top-level `"messages"` array begin (just after its `[`).
fn messages_array(body: &[u8]) -> Option<usize> {
    let mut at = skip_whitespace(body, 0);
    if body.get(at) != Some(&b'{') {
        return None;
    }
    loop {
        at = skip_whitespace(body, at + 1);
        let key_end = skip_string(body, at)?;
        let key = &body[at..key_end];
        at = skip_whitespace(body, key_end);
        if body.get(at) != Some(&b':') {
            return None;
        }
        at = skip_whitespace(body, at + 1);
        if key == b"\"messages\"" {
            return (body.get(at) == Some(&b'[')).then_some(at + 1);
        }
        at = skip_whitespace(body, skip_value(body, at)?);
        if body.get(at) != Some(&b',') {
            return None;
        }
    }
}

/// The end of the last of the array elements that begin at `at`, and how many there are, up
/// to the array's `]`.
fn elements(body: &[u8], mut at: usize) -> Option<(usize, usize)> {
    let mut count = 0;
    loop {
        at = skip_whitespace(body, at);
        let end = skip_value(body, at)?;
        count += 1;
        at = skip_whitespace(body, end);
        match body.get(at)? {
            b',' => at += 1,
            b']' => return Some((end, count)),
            _ => return None,
        }
    }
}

/// The end of the string that begins at `at` (its closing quote included).
fn skip_string(body: &[u8], at: usize) -> Option<usize> {
    if body.get(at) != Some(&b'"') {
        return None;
    }
    let mut at = at + 1;
    loop {
        at += memchr::memchr2(b'"', b'\\', body.get(at..)?)?;
        match body[at] {
            b'"' => return Some(at + 1),
            _ => at += 2,
        }
    }
}

/// The end of the JSON value that begins at `at`. Its syntax is not checked beyond what
/// finding its end needs: the body is parsed in full anyway.
fn skip_value(body: &[u8], at: usize) -> Option<usize> {
    match body.get(at)? {
        b'"' => skip_string(body, at),
        b'{' | b'[' => {
            let (mut depth, mut at) = (0usize, at);
            loop {
                match body.get(at)? {
                    b'"' => {
                        at = skip_string(body, at)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(at + 1);
                        }
                    }
                    _ => {}
                }
                at += 1;
            }
        }
        _ => {
            let len = body[at..]
                .iter()
                .position(|b| matches!(b, b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(body.len() - at);
            (len > 0).then_some(at + len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(count: usize) -> Vec<Arc<ChatMessage>> {
        (0..count)
            .map(|i| Arc::new(ChatMessage::text(super::super::Role::User, i.to_string())))
            .collect()
    }

    #[test]
    fn a_body_that_resends_the_conversation_is_read_from_its_new_messages() {
        let first = br#"{"model": "m", "messages": [{"role":"user","content":"a \"]\\"}, {"role":"assistant","content":"{[b"}], "tools": []}"#;
        let sent = SentConversation::read(first, messages(2)).unwrap();
        let next = br#"{"model": "m", "messages": [{"role":"user","content":"a \"]\\"}, {"role":"assistant","content":"{[b"}],
            {"role":"user","content":"c"}], "tools": [], "n": 1}"#;
        // The array closes after the known messages: nothing new is resent.
        assert!(sent.resent_in(next).is_none());
        let next = br#"{"model": "m", "messages": [{"role":"user","content":"A \"]\\"}, {"role":"assistant","content":"{[b"} , {"role":"user","content":"c"}], "tools": [], "n": 1}"#;
        assert!(sent.resent_in(next).is_none(), "the bytes differ");
        let next = br#"{"model": "m", "messages": [{"role":"user","content":"a \"]\\"}, {"role":"assistant","content":"{[b"} , {"role":"user","content":"c"}, {"role":"tool","content":"d","tool_call_id":"x"}], "tools": [], "n": 1}"#;
        let resent = sent.resent_in(next).unwrap();
        assert_eq!(resent.known().len(), 2);
        assert_eq!(
            std::str::from_utf8(&resent.rest).unwrap(),
            r#"{"model": "m", "messages": [ {"role":"user","content":"c"}, {"role":"tool","content":"d","tool_call_id":"x"}], "tools": [], "n": 1}"#
        );
        let remembered = resent.remember(next, messages(4)).unwrap();
        let whole = SentConversation::read(next, messages(4)).unwrap();
        assert_eq!(
            (remembered.start, remembered.end, remembered.digest),
            (whole.start, whole.end, whole.digest)
        );
        // The wrong count of messages read: nothing is kept.
        assert!(SentConversation::read(next, messages(3)).is_none());
        assert!(
            sent.resent_in(next)
                .unwrap()
                .remember(next, messages(3))
                .is_none()
        );
    }

    #[test]
    fn only_the_top_level_messages_array_is_taken() {
        let body = br#"{"metadata": {"messages": [1, 2]}, "stop": ["]"], "n": -1.5e3, "messages": [{"a": [true, null]}]}"#;
        let sent = SentConversation::read(body, messages(1)).unwrap();
        assert_eq!(
            &body[..sent.start],
            br#"{"metadata": {"messages": [1, 2]}, "stop": ["]"], "n": -1.5e3, "messages": ["#
        );
        assert_eq!(&body[sent.end..], b"]}");
        for other in [
            &br#"{"messages": "x"}"#[..],
            br#"{"messages": []}"#,
            br#"["messages"]"#,
            br#"{"messages": [{"a": 1}"#,
            br#"{"model": "m" "messages": [1]}"#,
            br#"{"messages": ["\"#,
            br#"{"messages": ["a\\"#,
            br#"{"messages": [{"#,
            br#"{"messages": [1"#,
        ] {
            assert!(SentConversation::read(other, messages(1)).is_none());
        }
    }
}
