//! Prompts in OpenAI's Harmony format (gpt-oss): message content is encoded apart from its
//! markup, so special-token text written in a message (`<|end|>` in a user's question) stays
//! plain text, as OpenAI's Harmony library encodes it. The markup — `<|start|>`, a header,
//! `<|message|>`, and the content's end (`<|end|>`, `<|call|>`, `<|return|>`) — is read as
//! special tokens.

use super::{Tokenizer, TokenizerError};

const MESSAGE: &str = "<|message|>";
const START: &str = "<|start|>";
const ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];

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

/// Where a message's content ends: at the first end marker that the next message's start, or
/// the end of the text, follows (an end marker inside the content is followed by more content).
fn content_end(text: &str) -> usize {
    let mut from = 0;
    loop {
        let next = ENDS
            .iter()
            .filter_map(|end| Some((from + text[from..].find(end)?, end.len())))
            .min();
        let Some((at, len)) = next else {
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
