//! `<think>…</think>` reasoning blocks (Qwen3, DeepSeek-R1, …).

use super::{Part, non_empty};

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Whether a prompt ends inside an open reasoning block (templates such as DeepSeek-R1's put
/// `<think>` in the generation prompt), so the reply starts with reasoning.
pub fn opened_by(prompt_tail: &str) -> bool {
    prompt_tail.trim_end().ends_with(OPEN)
}

/// Whether a prompt ends with a closed reasoning block (a template that turns thinking off
/// writes an empty one), so the reply holds none.
pub fn closed_by(prompt_tail: &str) -> bool {
    prompt_tail.trim_end().ends_with(CLOSE)
}

/// Splits a reply into reasoning and content: a block opened by the reply (or by the prompt,
/// `opened`) runs to `</think>`, or to the end if it never closed.
pub fn split(text: &str, opened: bool) -> (Option<String>, String) {
    let body = match text.trim_start().strip_prefix(OPEN) {
        Some(body) => body,
        None if opened => text,
        None => return (None, text.to_string()),
    };
    match body.find(CLOSE) {
        Some(at) => (
            Some(body[..at].trim_matches('\n').to_string()),
            body[at + CLOSE.len()..]
                .trim_start_matches('\n')
                .to_string(),
        ),
        None => (Some(body.trim_matches('\n').to_string()), String::new()),
    }
}

/// [`split`] for a stream: text is routed as soon as its part is known.
#[derive(Debug, Default)]
pub struct ThinkStream {
    buffer: String,
    /// `None` until the start of the reply showed whether it opens a block.
    in_reasoning: Option<bool>,
    /// The block is closed (or there is none): everything now is content.
    done: bool,
    /// Newlines right after `<think>` and right after `</think>` are not part of either text.
    started: bool,
    /// The prompt opened the block.
    opened: bool,
}

impl ThinkStream {
    /// A splitter for a reply whose prompt did (`opened`) or did not open a block.
    pub fn new(opened: bool) -> Self {
        Self {
            opened,
            ..Self::default()
        }
    }

    /// The parts that `text` (the next streamed piece) completes.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        if self.done {
            return self.content(text);
        }
        self.buffer.push_str(text);
        if self.in_reasoning.is_none() {
            let start = self.buffer.trim_start();
            if let Some(body) = start.strip_prefix(OPEN) {
                self.buffer = body.trim_start_matches('\n').to_string();
                self.in_reasoning = Some(true);
            } else if start.is_empty() || OPEN.starts_with(start) {
                return Vec::new();
            } else {
                self.in_reasoning = Some(self.opened);
            }
        }
        if self.in_reasoning == Some(false) {
            self.done = true;
            self.started = true;
            return non_empty(Part::Content(std::mem::take(&mut self.buffer)));
        }
        if !self.started {
            let trimmed = self.buffer.trim_start_matches('\n');
            if trimmed.is_empty() {
                self.buffer.clear();
                return Vec::new();
            }
            self.buffer = trimmed.to_string();
            self.started = true;
        }
        if let Some(at) = self.buffer.find(CLOSE) {
            let reasoning = self.buffer[..at].trim_end_matches('\n').to_string();
            let after = self.buffer[at + CLOSE.len()..].to_string();
            self.buffer.clear();
            self.done = true;
            self.started = false;
            let mut parts = non_empty(Part::Reasoning(reasoning));
            parts.extend(self.content(&after));
            return parts;
        }
        // Hold back what could be the start of the closer (or trailing newlines before it).
        let keep = (1..CLOSE.len().min(self.buffer.len() + 1))
            .rev()
            .find(|&n| self.buffer.ends_with(&CLOSE[..n]))
            .unwrap_or(0);
        let keep = keep + self.buffer[..self.buffer.len() - keep].len()
            - self.buffer[..self.buffer.len() - keep]
                .trim_end_matches('\n')
                .len();
        let emit: String = self.buffer.drain(..self.buffer.len() - keep).collect();
        non_empty(Part::Reasoning(emit))
    }

    /// Content after the block, without the newlines that follow `</think>`.
    fn content(&mut self, text: &str) -> Vec<Part> {
        let text = if self.started {
            text
        } else {
            text.trim_start_matches('\n')
        };
        self.started |= !text.is_empty();
        non_empty(Part::Content(text.to_string()))
    }

    /// Whether the reply has a reasoning block (opened by it or by the prompt), empty or not:
    /// what [`split`] reports as reasoning `Some`.
    pub fn has_block(&self) -> bool {
        self.in_reasoning.unwrap_or(self.opened)
    }

    /// The end of the reply: whatever is still held.
    pub fn finish(&mut self) -> Vec<Part> {
        let rest = std::mem::take(&mut self.buffer);
        match self.in_reasoning {
            Some(true) if !self.done => {
                non_empty(Part::Reasoning(rest.trim_end_matches('\n').to_string()))
            }
            // Still undecided (the reply was only the start of a `<think>` tag): the prompt
            // decides.
            None if self.opened => non_empty(Part::Reasoning(rest.trim_matches('\n').to_string())),
            _ => non_empty(Part::Content(rest)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ReasoningSyntax;
    use super::*;

    #[test]
    fn splits_think_blocks() {
        assert_eq!(
            split("<think>\nhmm\n</think>\n\n4", false),
            (Some("hmm".into()), "4".into())
        );
        assert_eq!(
            split("hmm</think>4", true),
            (Some("hmm".into()), "4".into()),
            "opened by the prompt"
        );
        assert_eq!(split("hmm</think>4", false), (None, "hmm</think>4".into()));
        assert_eq!(
            split("<think>still going", false),
            (Some("still going".into()), String::new())
        );
        assert_eq!(split("plain", false), (None, "plain".into()));
        assert!(opened_by("<|Assistant|><think>\n"));
    }

    #[test]
    fn streamed_split_matches_the_whole_split() {
        let texts = [
            "<think>\nhmm, 2+2\n</think>\n\nIt is 4.",
            "plain answer",
            "<think>unfinished",
            "a < b",
            "x</think>\ny",
        ];
        for opened in [false, true] {
            for text in texts {
                for size in 1..5 {
                    let (reasoning, content) = split(text, opened);
                    let streamed =
                        super::super::streamed(ReasoningSyntax::Think { opened }, text, size);
                    assert_eq!(
                        streamed,
                        (reasoning, content),
                        "{text:?} in chunks of {size}, opened {opened}"
                    );
                }
            }
        }
    }
}
