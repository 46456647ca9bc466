//! Rendering with placeholders: each sampled assistant turn is replaced by a unique marker, so
//! the rendered text splits into the pieces *between* sampled turns. Only those pieces are
//! tokenized; the sampled turns keep their exact ids.

use crate::session::SegmentCheck;
use crate::session::completion::text_hash;
use crate::template::{TemplateValue, template_map};
use std::sync::{Arc, RwLock};

/// Around a placeholder's nonce and index: private-use characters.
const MARKER_START: char = '\u{E000}';
const MARKER_END: char = '\u{E001}';

/// Makes and finds placeholders. The nonce makes a collision with real text practically
/// impossible; private-use characters keep templates' string methods from touching it.
#[derive(Debug, Clone)]
pub struct Placeholders {
    nonce: String,
    /// The assistant message for each placeholder index used so far: a long rollout puts one
    /// in every turn's render for each of its sampled turns.
    messages: Arc<RwLock<Vec<TemplateValue>>>,
}

impl Placeholders {
    /// Placeholders no template or conversation is likely to contain.
    pub fn new() -> Self {
        Self {
            nonce: uuid::Uuid::new_v4().simple().to_string(),
            messages: Arc::default(),
        }
    }

    /// The marker for the `index`-th sampled turn of a render.
    pub fn marker(&self, index: usize) -> String {
        format!("{MARKER_START}{}:{index}{MARKER_END}", self.nonce)
    }

    /// The assistant message (its content the marker) standing for the `index`-th sampled turn.
    pub fn message(&self, index: usize) -> TemplateValue {
        if let Some(message) = self
            .messages
            .read()
            .ok()
            .and_then(|m| m.get(index).cloned())
        {
            return message;
        }
        match self.messages.write() {
            Ok(mut messages) => {
                while messages.len() <= index {
                    let next = self.build_message(messages.len());
                    messages.push(next);
                }
                messages[index].clone()
            }
            Err(_) => self.build_message(index),
        }
    }

    fn build_message(&self, index: usize) -> TemplateValue {
        template_map([
            ("role", TemplateValue::from("assistant")),
            ("content", TemplateValue::from(self.marker(index))),
        ])
    }

    /// Splits `text` at markers `0..count`; `None` unless each appears exactly once, in order,
    /// and the nonce nowhere else (a template that drops, duplicates or alters a turn cannot be
    /// extended token-exactly). One pass over the text, whatever `count` is.
    pub fn split<'t>(&self, text: &'t str, count: usize) -> Option<Vec<&'t str>> {
        let mut pieces = Vec::with_capacity(count + 1);
        let mut piece_start = 0;
        for (index, (at, _)) in text.match_indices(self.nonce.as_str()).enumerate() {
            let marker_start = at.checked_sub(MARKER_START.len_utf8())?;
            let rest = &text[at + self.nonce.len()..];
            let number = rest.strip_prefix(':')?;
            let digits = number.bytes().take_while(u8::is_ascii_digit).count();
            if index >= count
                || (digits > 1 && number.starts_with('0'))
                || !text[..at].ends_with(MARKER_START)
                || number[..digits].parse::<usize>().ok()? != index
                || !number[digits..].starts_with(MARKER_END)
            {
                return None;
            }
            pieces.push(&text[piece_start..marker_start]);
            piece_start = text.len() - number.len() + digits + MARKER_END.len_utf8();
        }
        (pieces.len() == count).then(|| {
            pieces.push(&text[piece_start..]);
            pieces
        })
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
        assert_eq!(p.split(&text, 3), None, "a missing marker");
        // The nonce anywhere but in the expected markers: the template altered a turn.
        for altered in [
            format!("a{}b{}c{}", p.marker(0), p.marker(1), p.nonce),
            format!("a{}b{}c", p.marker(0), p.marker(1).replace('\u{E001}', "")),
            format!("a{}b{}c", p.nonce, p.marker(1)),
            format!("{}:0\u{E001}", p.nonce),
            format!("a{}b{}c", p.marker(0), p.marker(1).replace(":1", ":01")),
        ] {
            assert_eq!(p.split(&altered, 2), None, "{altered:?}");
        }
        assert_eq!(p.split(&p.marker(0), 1), Some(vec!["", ""]));
    }

    #[test]
    fn placeholder_messages_are_kept_per_index() {
        let p = Placeholders::new();
        let third = p.message(2);
        assert_eq!(
            third.get_attr("content").unwrap().as_str(),
            Some(p.marker(2).as_str())
        );
        assert_eq!(
            p.message(0).get_attr("role").unwrap().as_str(),
            Some("assistant")
        );
        assert_eq!(p.message(2), third);
        assert_eq!(p.messages.read().unwrap().len(), 3);
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
