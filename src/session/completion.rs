//! Records of what the model sampled, so assistant messages sent back can be mapped to the
//! exact ids (inbound reconstruction) instead of being re-rendered and re-tokenized.

use super::ids::Span;
use std::hash::{Hash, Hasher};

/// Index of a completion within its session.
pub type CompletionId = usize;

/// One tool call the proxy returned, as it can be recognised when it comes back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedToolCall {
    /// The id the call was returned under.
    pub id: String,
    /// Hash of the name and the arguments as canonical JSON (key order and spacing ignored).
    pub call_hash: u64,
    /// The format it was written in when not the session's (cross-format healing).
    pub healed_from: Option<&'static str>,
    /// How it is recognised when a client hands it back changed (none in records journaled
    /// before it was kept: such calls match only unchanged).
    pub echo: Option<EchoKey>,
}

/// How an issued call is recognised when a client hands it back re-serialised or with its
/// schema's defaults filled in (see [`crate::tools::echo`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EchoKey {
    /// Hash of the call read canonically: numbers by value, default-valued keys left out.
    pub canonical_hash: u64,
    /// Hash of the arguments' text as returned.
    pub text_hash: u64,
    /// Its keys at their declared default, as the model wrote them.
    pub default_keys: Vec<String>,
}

/// A sampled completion: where its ids live and how to recognise it in a later request.
#[derive(Debug, Clone)]
pub struct CompletionRecord {
    /// The node that sampled it, and where.
    pub node: usize,
    /// Where its sampled ids lie in that node.
    pub span: Span,
    /// The completion before it in its node, if any.
    pub previous: Option<CompletionId>,
    /// Text of the special token it ended on (e.g. `<|im_end|>`), which the template renders
    /// again after the message content and must not be added a second time.
    pub end_token_text: Option<String>,
    /// The calls returned for it.
    pub tool_calls: Vec<IssuedToolCall>,
}

/// What a completion was sampled after: how many messages the request had, and a digest of
/// them with its tools and template kwargs (a later turn that sends the same conversation on
/// may render only what follows; see `turn::tail`). Journaled with the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConversationDigest {
    /// How many messages the request had.
    pub messages: usize,
    /// Their digest, with the tools and template kwargs.
    pub digest: u64,
}

/// Fingerprint of an assistant message: its text and the ids of its tool calls. Every turn
/// fingerprints every assistant message it is sent, so this is XXH3 like [`text_hash`].
///
/// Whitespace is left out of the text: APIs that return a reply as blocks (Anthropic's text
/// blocks around `tool_use`, Responses' output items) drop whitespace-only pieces and clients
/// join the rest as they like, so only the other characters identify the reply.
pub fn message_fingerprint<'a>(content: &str, tool_call_ids: impl Iterator<Item = &'a str>) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
    // The words written one after another, in one write: XXH3's digest depends only on the
    // bytes written, and many small writes cost more than the words themselves.
    hasher.write(&without_whitespace(content));
    hasher.write_u8(0xff);
    for id in tool_call_ids {
        id.hash(&mut hasher);
    }
    hasher.finish()
}

/// `text` without its whitespace (as `char::is_whitespace` has it).
fn without_whitespace(text: &str) -> Vec<u8> {
    if text.is_ascii() {
        // Every byte is written and the end moves past it unless it is whitespace: no branch
        // per byte to mispredict.
        let mut kept = vec![0; text.len()];
        let mut end = 0;
        for &byte in text.as_bytes() {
            kept[end] = byte;
            end += usize::from(!matches!(byte, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' '));
        }
        kept.truncate(end);
        return kept;
    }
    let mut kept = Vec::with_capacity(text.len());
    let mut utf8 = [0; 4];
    for c in text.chars().filter(|c| !c.is_whitespace()) {
        kept.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
    }
    kept
}

/// Hash of a tool call's name and arguments, independent of JSON formatting and key order.
pub fn tool_call_hash(name: &str, arguments: &serde_json::Value) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
    name.hash(&mut hasher);
    hash_json(arguments, &mut hasher);
    hasher.finish()
}

fn hash_json(value: &serde_json::Value, hasher: &mut impl Hasher) {
    use serde_json::Value;
    match value {
        Value::Null => 0u8.hash(hasher),
        Value::Bool(b) => (1u8, b).hash(hasher),
        Value::Number(n) => (2u8, n.to_string()).hash(hasher),
        Value::String(s) => (3u8, s).hash(hasher),
        Value::Array(items) => {
            (4u8, items.len()).hash(hasher);
            items.iter().for_each(|item| hash_json(item, hasher));
        }
        Value::Object(map) => {
            (5u8, map.len()).hash(hasher);
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            for key in keys {
                key.hash(hasher);
                hash_json(&map[key], hasher);
            }
        }
    }
}

/// Hash of rendered text, for the segment checks of a node. Every turn hashes the whole
/// rendered history, so this is XXH3 (tens of GB/s) rather than SipHash.
pub fn text_hash(text: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The fingerprint as it was first written (journals hold fingerprints made this way).
    fn word_by_word(content: &str) -> u64 {
        let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
        for word in content.split_whitespace() {
            hasher.write(word.as_bytes());
        }
        hasher.write_u8(0xff);
        hasher.finish()
    }

    #[test]
    fn fingerprints_are_the_words_hashed_in_order() {
        for text in [
            "",
            "one",
            "  two words \n\t and\x0b\x0cmore\r\n",
            "unicode\u{a0}no-break\u{2003}em\u{3000}ideographic café",
            &"long text ".repeat(500),
        ] {
            assert_eq!(
                message_fingerprint(text, std::iter::empty()),
                word_by_word(text),
                "{text:?}"
            );
        }
        assert_eq!(
            message_fingerprint("a b", std::iter::empty()),
            message_fingerprint("ab", std::iter::empty())
        );
    }

    #[test]
    fn tool_call_hash_ignores_key_order_but_not_values() {
        let a = tool_call_hash("f", &json!({"a": 1, "b": true}));
        let b = tool_call_hash("f", &json!({"b": true, "a": 1}));
        let c = tool_call_hash("f", &json!({"a": 1, "b": "True"}));
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
