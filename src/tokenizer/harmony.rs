//! Prompts in OpenAI's Harmony format (gpt-oss): message content is encoded apart from its
//! markup, so special-token text written in a message (`<|end|>` in a user's question) stays
//! plain text, as OpenAI's Harmony library encodes it. The markup — `<|start|>`, a header,
//! `<|message|>`, and the content's end (`<|end|>`, `<|call|>`, `<|return|>`) — is read as
//! special tokens.

use super::{Tokenizer, TokenizerError};

/// Opens a message.
pub const START: &str = "<|start|>";
/// Ends a message's header: its content follows.
pub const MESSAGE: &str = "<|message|>";
/// Names the channel in a header.
pub const CHANNEL: &str = "<|channel|>";
/// What ends a message's content: a message, a tool call, the assistant's last message.
pub const ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];
/// Every special token of Harmony's markup.
pub const MARKERS: &[&str] = &[
    START,
    CHANNEL,
    MESSAGE,
    "<|constrain|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
];

/// Whether the tokenizer's vocabulary is Harmony's (gpt-oss): its markup is special tokens.
pub fn speaks(tokenizer: &Tokenizer) -> bool {
    MARKERS.iter().all(|marker| {
        tokenizer
            .token_id(marker)
            .is_some_and(|id| tokenizer.is_special(id))
    })
}

/// The length of the end marker `text` starts with, when a sample that ended on `sampled_end`
/// (itself an end marker) stands before it: a template renders a past message's end as
/// `<|end|>` where the model sampled `<|return|>` (the library's rule for a past final
/// answer), or writes its own end after a call it renders as a message.
pub fn rendered_end_len(sampled_end: &str, text: &str) -> Option<usize> {
    if !ENDS.contains(&sampled_end) {
        return None;
    }
    ENDS.iter()
        .find(|end| text.starts_with(*end))
        .map(|end| end.len())
}

/// The ids of a rendered Harmony prompt (or a piece of one that starts at a message boundary).
pub fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, TokenizerError> {
    let mut ids = Vec::with_capacity(text.len() / 3);
    let mut rest = text;
    while let Some(at) = rest.find(MESSAGE) {
        let (markup, after) = rest.split_at(at + MESSAGE.len());
        ids.extend(tokenizer.encode(markup)?);
        let end = content_end(after);
        ids.extend(tokenizer.encode_ordinary(&after[..end])?);
        rest = &after[end..];
    }
    ids.extend(tokenizer.encode(rest)?);
    Ok(ids)
}

/// An assistant's rendered reply as the model samples it: a final answer the template ends
/// with `<|end|>` (as the library renders a past one) ends the turn with `<|return|>`.
pub fn as_sampled(reply: &str) -> std::borrow::Cow<'_, str> {
    let is_final = reply
        .rsplit(START)
        .next()
        .is_some_and(|last| last.contains("<|channel|>final"));
    match reply.strip_suffix("<|end|>") {
        Some(body) if is_final => format!("{body}<|return|>").into(),
        _ => reply.into(),
    }
}

/// The first end marker in `text`: where, and its length.
pub fn first_end(text: &str) -> Option<(usize, usize)> {
    ENDS.iter()
        .filter_map(|end| Some((text.find(end)?, end.len())))
        .min()
}

/// Where a message's content ends: at the first end marker that the next message's start, or
/// the end of the text, follows (an end marker inside the content is followed by more content).
fn content_end(text: &str) -> usize {
    let mut from = 0;
    loop {
        let Some((at, len)) = first_end(&text[from..]).map(|(at, len)| (from + at, len)) else {
            // An unfinished message: its content runs to the end.
            return text.len();
        };
        let after = &text[at + len..];
        if after.is_empty() || after.starts_with(START) {
            return at;
        }
        from = at + len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ends_at_the_marker_before_the_next_message() {
        assert_eq!(content_end("hi<|end|><|start|>assistant"), 2);
        assert_eq!(content_end("a <|end|> b<|end|>"), 11);
        assert_eq!(content_end("{}<|call|>"), 2);
        assert_eq!(content_end("unfinished"), 10);
    }
}
