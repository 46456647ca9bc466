//! Rendering with placeholders: each sampled assistant turn is replaced by a unique marker, so
//! the rendered text splits into the pieces *between* sampled turns. Only those pieces are
//! tokenized; the sampled turns keep their exact ids.

use crate::session::SegmentCheck;
use crate::session::completion::text_hash;
use std::sync::Arc;

/// Makes and finds placeholders. The nonce makes a collision with real text practically
/// impossible; private-use characters keep templates' string methods from touching it.
#[derive(Debug, Clone)]
pub struct Placeholders {
    nonce: String,
}

impl Placeholders {
    pub fn new() -> Self {
        Self {
            nonce: uuid::Uuid::new_v4().simple().to_string(),
        }
    }

    /// The marker for the `index`-th sampled turn of a render.
    pub fn marker(&self, index: usize) -> String {
        format!("\u{E000}{}:{index}\u{E001}", self.nonce)
    }

    /// Splits `text` at markers `0..count`; `None` unless each appears exactly once, in order
    /// (a template that drops or duplicates a turn cannot be extended token-exactly).
    pub fn split<'t>(&self, text: &'t str, count: usize) -> Option<Vec<&'t str>> {
        let mut pieces = Vec::with_capacity(count + 1);
        let mut rest = text;
        for index in 0..count {
            let marker = self.marker(index);
            let at = rest.find(&marker)?;
            pieces.push(&rest[..at]);
            rest = &rest[at + marker.len()..];
        }
        if rest.contains(&format!("\u{E000}{}", self.nonce))
            || pieces.iter().any(|p| p.contains(&self.nonce))
        {
            return None;
        }
        pieces.push(rest);
        Some(pieces)
    }
}

impl Default for Placeholders {
    fn default() -> Self {
        Self::new()
    }
}

/// An exact check: the piece must render the same again.
pub fn exact_check(piece: &str) -> SegmentCheck {
    SegmentCheck {
        prefix_len: piece.len() as u32,
        prefix_hash: text_hash(piece),
        generation_prompt: None,
    }
}

/// The check for the piece before a turn about to be sampled: the history part must render the
/// same later; the generation prompt may be rendered differently in history.
pub fn generation_check(history_piece: &str, prompt_piece: &str) -> SegmentCheck {
    match prompt_piece.strip_prefix(history_piece) {
        Some(generation_prompt) => SegmentCheck {
            prefix_len: history_piece.len() as u32,
            prefix_hash: text_hash(history_piece),
            generation_prompt: Some(Arc::from(generation_prompt)),
        },
        // The template's generation prompt is not an extension of its history render; only the
        // header relation can be checked.
        None => SegmentCheck {
            prefix_len: 0,
            prefix_hash: text_hash(""),
            generation_prompt: Some(Arc::from(prompt_piece)),
        },
    }
}

/// Whether `piece`, from a new render, is what `check` recorded.
pub fn verify(check: &SegmentCheck, piece: &str) -> bool {
    let len = check.prefix_len as usize;
    if piece.len() < len
        || !piece.is_char_boundary(len)
        || text_hash(&piece[..len]) != check.prefix_hash
    {
        return false;
    }
    let header = &piece[len..];
    match &check.generation_prompt {
        None => header.is_empty(),
        Some(prompt) => prompt.starts_with(header) || header.starts_with(&**prompt),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_requires_each_marker_once_in_order() {
        let p = Placeholders::new();
        let text = format!("a{}b{}c", p.marker(0), p.marker(1));
        assert_eq!(p.split(&text, 2), Some(vec!["a", "b", "c"]));
        assert_eq!(p.split(&text, 1), None, "an unexpected extra marker");
        let swapped = format!("a{}b{}c", p.marker(1), p.marker(0));
        assert_eq!(p.split(&swapped, 2), None);
        assert_eq!(p.split("plain", 0), Some(vec!["plain"]));
    }

    #[test]
    fn generation_prompt_may_render_differently_in_history() {
        let history = "<|im_start|>user\nhi<|im_end|>\n";
        let prompt =
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
        let check = generation_check(history, prompt);
        assert!(verify(
            &check,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        ));
        assert!(verify(&check, prompt));
        // A message inserted before the turn is an edit, not a header difference.
        assert!(!verify(
            &check,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
        ));
        assert!(!verify(
            &check,
            "<|im_start|>user\nHI<|im_end|>\n<|im_start|>assistant\n"
        ));
    }

    #[test]
    fn exact_checks_need_identical_text() {
        let check = exact_check("abc");
        assert!(verify(&check, "abc"));
        assert!(!verify(&check, "abcd"));
        assert!(!verify(&check, "abd"));
    }
}
