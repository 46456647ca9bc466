//! The conversation a session was last sent, kept so the next request is read only where it
//! is new. An agent resends its whole conversation every turn: at turn 128 of a long rollout
//! that is ~300 KB of JSON, of which the last message or two are new. When a body starts with
//! the bytes the session's last body had up to the end of its conversation's last element
//! (chat's and Messages' `messages`, Responses' `input`), those elements are the ones read
//! then; only the body without them is parsed, and what was read from them is shared (for
//! chat, the messages with what each derived: digest, fingerprint, call hashes).
//!
//! This is a cache, never a source of truth: the bytes are compared by XXH3-128 of the whole
//! known prefix, the messages counted as they are scanned, and anything unexpected (another
//! shape, an error in the shortened body) reads the body whole, as without it.

use xxhash_rust::xxh3::Xxh3;

/// Bodies shorter than this are not kept: reading one whole costs tens of microseconds, and a
/// kept conversation holds its messages' text beside the node (about 6 bytes per history
/// token), which short rollouts, the many, would pay for nothing.
pub const KEPT_FROM_BYTES: usize = 32 * 1024;

/// A body's conversation, as last read on a session: what was read from each element of its
/// conversation's array (`T`, one per element).
#[derive(Debug)]
pub struct SentConversation<T> {
    /// The body's bytes before its first element (its `"messages": [` included).
    start: usize,
    /// Where its last element ends.
    end: usize,
    /// XXH3-128 of the body's first `end` bytes.
    digest: u128,
    /// What was read from the elements.
    elements: Vec<T>,
}

/// A body that starts with a known conversation and adds elements to it.
pub struct Resent<'s, T> {
    sent: &'s SentConversation<T>,
    /// The hash state after the known bytes (continued for the next memo).
    hasher: Xxh3,
    /// Where the body's new elements begin.
    new_from: usize,
    /// The body with the known elements left out: what is left to read.
    pub rest: Vec<u8>,
}

impl<T> SentConversation<T> {
    /// What `body` resends of this conversation: `None` unless it starts with the same bytes
    /// up to the end of the last element, and then adds at least one.
    pub fn resent_in(&self, body: &[u8]) -> Option<Resent<'_, T>> {
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

    /// [`SentConversation::read`], for a body of at least [`KEPT_FROM_BYTES`].
    pub fn keep(body: &[u8], key: &str, elements: Vec<T>) -> Option<Self> {
        (body.len() >= KEPT_FROM_BYTES).then(|| Self::read(body, key, elements))?
    }

    /// The conversation of `body`, the array under its top-level `key`, whose elements read
    /// as `elements`; `None` when the array cannot be located or its elements are not as many
    /// (another shape: nothing is kept).
    pub fn read(body: &[u8], key: &str, elements: Vec<T>) -> Option<Self> {
        let start = array_of(body, key)?;
        let (end, count) = array_elements(body, start)?;
        if count != elements.len() {
            return None;
        }
        Some(Self {
            start,
            end,
            digest: xxhash_rust::xxh3::xxh3_128(&body[..end]),
            elements,
        })
    }
}

impl<T> Resent<'_, T> {
    /// What was read from the elements the body resends.
    pub fn known(&self) -> &[T] {
        &self.sent.elements
    }

    /// The conversation of the whole `body` once its new elements are read: `elements` are
    /// all of them, the known ones first.
    pub fn remember(mut self, body: &[u8], elements: Vec<T>) -> Option<SentConversation<T>> {
        let (end, count) = array_elements(body, self.new_from)?;
        if self.sent.elements.len() + count != elements.len() {
            return None;
        }
        self.hasher.update(&body[self.sent.end..end]);
        Some(SentConversation {
            start: self.sent.start,
            end,
            digest: self.hasher.digest128(),
            elements,
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

/// Where the elements of the array under the top-level `key` begin (just after its `[`).
fn array_of(body: &[u8], key: &str) -> Option<usize> {
    let mut at = skip_whitespace(body, 0);
    if body.get(at) != Some(&b'{') {
        return None;
    }
    loop {
        at = skip_whitespace(body, at + 1);
        let name_end = skip_string(body, at)?;
        // The name as written, quotes left out (an escaped spelling is not recognised).
        let name = &body[at + 1..name_end - 1];
        at = skip_whitespace(body, name_end);
        if body.get(at) != Some(&b':') {
            return None;
        }
        at = skip_whitespace(body, at + 1);
        if name == key.as_bytes() {
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
fn array_elements(body: &[u8], mut at: usize) -> Option<(usize, usize)> {
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

/// What the adapters' tests share: bodies damaged every way a resent body could be.
#[cfg(test)]
pub(crate) mod testing {
    /// `count` damaged copies of `body`: a flipped bit, a cut, or a comma put in, each at a
    /// place drawn from `seed` (the same on every run).
    pub fn damaged(body: &[u8], seed: u64, count: usize) -> Vec<Vec<u8>> {
        let mut seed = seed | 1;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        (0..count)
            .map(|_| {
                let mut damaged = body.to_vec();
                let at = next() as usize % damaged.len();
                match next() % 3 {
                    0 => damaged[at] ^= 1 << (next() % 7),
                    1 => damaged.truncate(at),
                    _ => damaged.insert(at, b','),
                }
                damaged
            })
            .collect()
    }

    /// The extra fields of a rollout's bodies, turn by turn: a field kept, a sampling change, a
    /// value out of range, none.
    pub fn extras(kept: &'static str, turn: usize) -> &'static str {
        [kept, r#", "temperature": 0.5"#, r#", "temperature": 7"#, ""][turn % 4]
    }

    /// Checks one turn of a rollout: `after` resends `before`'s conversation (`resent` says
    /// whether a session that read `before` keeps it so), and it and damaged copies of it
    /// read alike after `before` and alone.
    pub fn check_turn(
        (before, after): (&[u8], &[u8]),
        seed: u64,
        read: impl Fn(&crate::session::Session, &[u8]) -> String,
        resent: impl Fn(&crate::session::Session, &[u8]) -> bool,
    ) {
        reads_alike(before, after, &read);
        let store = crate::session::SessionStore::default();
        let session = store.create(Default::default()).unwrap();
        read(&session, before);
        assert!(resent(&session, after), "the body resends the conversation");
        for damaged in damaged(after, seed, 8) {
            reads_alike(before, &damaged, &read);
        }
    }

    /// Asserts that `read` gives the same outcome for `body` on a session that read `before`
    /// as on a fresh one; `read(fresh, body)` gives a printable outcome.
    pub fn reads_alike(
        before: &[u8],
        body: &[u8],
        read: &impl Fn(&crate::session::Session, &[u8]) -> String,
    ) {
        use crate::session::{SessionOptions, SessionStore};
        let store = SessionStore::default();
        let session = store.create(SessionOptions::default()).unwrap();
        read(&session, before);
        let after_before = read(&session, body);
        let fresh = store.create(SessionOptions::default()).unwrap();
        assert_eq!(
            after_before,
            read(&fresh, body),
            "{}\nafter\n{}",
            String::from_utf8_lossy(body),
            String::from_utf8_lossy(before)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(count: usize) -> Vec<usize> {
        (0..count).collect()
    }

    #[test]
    fn a_body_that_resends_the_conversation_is_read_from_its_new_messages() {
        let first = br#"{"model": "m", "messages": [{"role":"user","content":"a \"]\\"}, {"role":"assistant","content":"{[b"}], "tools": []}"#;
        let sent = SentConversation::read(first, "messages", messages(2)).unwrap();
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
        let whole = SentConversation::read(next, "messages", messages(4)).unwrap();
        assert_eq!(
            (remembered.start, remembered.end, remembered.digest),
            (whole.start, whole.end, whole.digest)
        );
        // The wrong count of messages read: nothing is kept.
        assert!(SentConversation::read(next, "messages", messages(3)).is_none());
        assert!(
            sent.resent_in(next)
                .unwrap()
                .remember(next, messages(3))
                .is_none()
        );
    }

    #[test]
    fn only_long_bodies_are_kept() {
        let short = br#"{"messages": [{"role": "user", "content": "hi"}]}"#;
        assert!(SentConversation::keep(short, "messages", messages(1)).is_none());
        let text = "x".repeat(KEPT_FROM_BYTES);
        let long = format!(r#"{{"messages": [{{"role": "user", "content": "{text}"}}]}}"#);
        assert!(SentConversation::keep(long.as_bytes(), "messages", messages(1)).is_some());
    }

    #[test]
    fn only_the_top_level_messages_array_is_taken() {
        let body = br#"{"metadata": {"messages": [1, 2]}, "stop": ["]"], "n": -1.5e3, "messages": [{"a": [true, null]}]}"#;
        let sent = SentConversation::read(body, "messages", messages(1)).unwrap();
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
            assert!(SentConversation::read(other, "messages", messages(1)).is_none());
        }
    }
}
