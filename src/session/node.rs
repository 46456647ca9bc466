//! A training node: the exact token ids of one rollout and which of them the model sampled.
//!
//! Storage is compact: ids in 18 bits each ([`TokenIds`]), logprobs only for sampled
//! positions (prompt positions are implicitly 1.0), sized exactly to their content.
//! `masked_tokens` and `full_text` are derived when a trainer asks.

use super::completion::CompletionId;
use super::ids::{Span, TokenIds};
use crate::generation::{ImageSpan, RoutedExperts};
use serde::Serialize;
use std::ops::Range;
use std::sync::Arc;

/// How to recognise, on a later turn, the rendered text that came before a sampled turn.
///
/// `prefix_len`/`prefix_hash` cover the text between the previous sampled turn and the
/// generation prompt. When `generation_prompt` is `None` the check is exact (the text must be
/// the same, header included); otherwise the header the template now renders before the turn
/// and the generation prompt the model was given must be one a prefix of the other (Qwen3 with
/// `enable_thinking=false` prompts with an empty think block it never renders in history).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentCheck {
    /// Length of the text between the previous sampled turn and the generation prompt.
    pub prefix_len: u32,
    /// Hash of that text.
    pub prefix_hash: u64,
    /// The generation prompt the model was given (`None`: the check is exact).
    pub generation_prompt: Option<Arc<str>>,
}

/// One sampled completion whose ids appear in a node, with the check for the text before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// The completion.
    pub completion: CompletionId,
    /// How the text before it rendered.
    pub before: SegmentCheck,
}

/// Where a request stopped matching the node it could have extended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Divergence {
    /// Machine-readable cause (`history_edited`, `template_rewrites_history`, ...).
    pub reason: &'static str,
    /// Human explanation.
    pub detail: String,
    /// The node that was not extended, if one was a candidate.
    pub from_node: Option<usize>,
    /// Token position in that node where the request stopped matching.
    pub token_position: Option<usize>,
}

/// Per-turn facts a trainer may want.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnRecord {
    /// Position of the turn's first prompt token in the node.
    pub prompt_start: usize,
    /// Position of the first sampled token.
    pub completion_start: usize,
    /// How many ids were sampled.
    pub completion_tokens: usize,
    /// Why the sample ended (`stop`, `length`, `abort`).
    pub finish_reason: &'static str,
    /// What stopped it, when the backend says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop: Option<crate::generation::StopMatch>,
    /// The weight version the backend reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<String>,
    /// Every weight version the turn's sample was drawn from, with the sampled tokens each
    /// produced (offsets from `completion_start`), when it spanned a weight update.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub weight_versions: Vec<crate::generation::WeightSpan>,
    /// The backend that sampled this turn (shared with the pool: one string per backend).
    pub backend: Arc<str>,
    /// The LoRA adapter it was sampled with (the session's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter: Option<Arc<str>>,
    /// Prompt tokens the backend served from its prefix cache, when it says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u32>,
    /// The ids were re-tokenized from text (a text-only backend), not returned by the backend.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub approximate: bool,
    /// With `nudge_tool_calls`: whether this attempt was kept or discarded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nudge: Option<&'static str>,
    /// The API the turn came in by (`chat.completions`, `completions`, `messages`,
    /// `responses`): a rollout may switch.
    pub api: super::Api,
    /// Tools the request declared that the prompt leaves out (the Responses API's built-in
    /// tools, such as `web_search`, that only OpenAI's servers run).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools_left_out: Vec<String>,
    /// The calls returned although written in another format than the session's
    /// (cross-format healing), each with that format.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub healed_calls: Vec<HealedCall>,
    /// Calls of the turn before that the client handed back changed, each still recognised
    /// as the call the model made (its sampled ids stand), with what changed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub echoed_calls: Vec<EchoChange>,
}

/// A change a client made to a call it handed back that leaves it the call the model made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EchoChange {
    /// The call's id.
    pub id: String,
    /// `formatting` (the same arguments written otherwise: spacing, key order, escapes,
    /// number spelling) or `defaults` (keys at their declared default added or left out).
    pub change: &'static str,
    /// With `defaults`: the keys added (`+replace_all`) or left out (`-replace_all`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
}

/// A call promoted from another tool-call format than its session's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HealedCall {
    /// The id it was returned under.
    pub id: String,
    /// The format it was written in (`qwen3_coder`, `mistral`, ...).
    pub format: &'static str,
}

/// A training sequence.
#[derive(Debug, Clone, Default)]
pub struct Node {
    tokens: TokenIds,
    sampled: Vec<Span>,
    sampled_logprobs: Vec<f32>,
    pub(crate) history: Vec<HistoryEntry>,
    pub(crate) turns: Vec<TurnRecord>,
    pub(crate) divergence: Option<Divergence>,
    pub(crate) parent: Option<usize>,
    /// The experts each position was routed to, rows from position 0 (sessions that record
    /// them).
    experts: Option<RoutedExperts>,
    /// The images of the prompt, in order, each with its run of placeholders.
    images: Vec<ImageSpan>,
}

impl Node {
    /// Every id, in order.
    pub fn tokens(&self) -> Vec<u32> {
        self.tokens.to_vec(0..self.len())
    }

    /// Appends every id to `out` (a prompt that extends this node).
    pub fn copy_tokens_into(&self, out: &mut Vec<u32>) {
        self.tokens.copy_into(0..self.len(), out);
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether it holds no token.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The sampled spans, in order.
    pub fn sampled_spans(&self) -> &[Span] {
        &self.sampled
    }

    /// Makes room for exactly one more turn's logprobs: nodes are held for the whole rollout,
    /// and the doubling a `Vec` grows by would cost up to half their memory again.
    pub fn reserve_logprobs(&mut self, sampled: usize) {
        self.sampled_logprobs.reserve_exact(sampled);
    }

    /// Appends prompt tokens (masked, logprob 1.0).
    pub fn push_prompt(&mut self, ids: &[u32]) {
        self.tokens.extend(ids);
    }

    /// Appends sampled tokens with the backend's logprobs; returns their span.
    pub fn push_sampled(&mut self, ids: &[u32], logprobs: &[f32]) -> Span {
        debug_assert_eq!(ids.len(), logprobs.len());
        let start = self.tokens.len() as u32;
        self.tokens.extend(ids);
        self.sampled_logprobs.extend_from_slice(logprobs);
        let span = Span {
            start,
            end: self.tokens.len() as u32,
        };
        self.sampled.push(span);
        span
    }

    /// Adds the expert rows a turn reported. They start at `experts.from`, which must not lie
    /// past the rows held: a gap (a turn whose server reported none) would misalign every
    /// later row, so the node then keeps none.
    pub fn push_experts(&mut self, experts: &RoutedExperts) {
        let from = experts.from as usize;
        match &mut self.experts {
            Some(mine) if mine.width == experts.width && from <= mine.rows() => {
                mine.ids.truncate(from * mine.width as usize);
                mine.ids.extend_from_slice(&experts.ids);
            }
            None if from == 0 => self.experts = Some(experts.clone()),
            _ => {
                tracing::warn!(
                    from,
                    held = self.experts.as_ref().map(RoutedExperts::rows),
                    "routed experts do not continue the node's rows: the node keeps none"
                );
                self.experts = None;
            }
        }
    }

    /// Adds the images of a prompt appended at `prompt_start` (their offsets count from it).
    pub fn push_images(&mut self, images: &[ImageSpan], prompt_start: usize) {
        self.images.extend(images.iter().map(|image| ImageSpan {
            offset: image.offset + prompt_start,
            ..image.clone()
        }));
    }

    /// The images of the node's prompts, in order, each with its run of placeholders.
    pub fn images(&self) -> &[ImageSpan] {
        &self.images
    }

    /// The experts each position was routed to, rows from position 0, when recorded.
    pub fn routed_experts(&self) -> Option<&RoutedExperts> {
        self.experts.as_ref()
    }

    /// The ids in `span`.
    pub fn slice(&self, span: Span) -> Vec<u32> {
        self.tokens.to_vec(span.start as usize..span.end as usize)
    }

    /// Appends the ids in `span` to `out`.
    pub fn copy_span_into(&self, span: Span, out: &mut Vec<u32>) {
        self.tokens
            .copy_into(span.start as usize..span.end as usize, out);
    }

    /// The node as consecutive runs of positions, in order: a prompt run (`None`: masked,
    /// logprob 1.0 for trainers) or a sampled run with the backend's logprobs. Index
    /// [`Node::tokens`] with the ranges for the ids.
    pub fn runs(&self) -> impl Iterator<Item = (Range<usize>, Option<&[f32]>)> + '_ {
        let mut at = 0;
        let mut logprobs = self.sampled_logprobs.as_slice();
        let mut spans = self.sampled.iter().peekable();
        std::iter::from_fn(move || {
            let next = match spans.peek() {
                Some(span) if span.start as usize == at => {
                    let range = span.start as usize..span.end as usize;
                    // Equal by construction (`push_sampled`); never a panic if not.
                    let (sampled, rest) = logprobs.split_at(range.len().min(logprobs.len()));
                    logprobs = rest;
                    spans.next();
                    (range, Some(sampled))
                }
                Some(span) => (at..span.start as usize, None),
                None if at < self.tokens.len() => (at..self.tokens.len(), None),
                None => return None,
            };
            at = next.0.end;
            Some(next)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_logprobs_follow_sampled_spans() {
        let mut node = Node::default();
        node.push_prompt(&[1, 2, 3]);
        node.push_sampled(&[4, 5], &[-0.5, -0.25]);
        node.push_prompt(&[6]);
        node.push_sampled(&[7], &[-1.0]);
        assert_eq!(node.tokens(), vec![1, 2, 3, 4, 5, 6, 7]);
        let runs: Vec<_> = node.runs().collect();
        assert_eq!(
            runs,
            [
                (0..3, None),
                (3..5, Some(&[-0.5, -0.25][..])),
                (5..6, None),
                (6..7, Some(&[-1.0][..])),
            ]
        );
        let mut sampled_first = Node::default();
        sampled_first.push_sampled(&[4], &[-0.5]);
        assert_eq!(
            sampled_first.runs().collect::<Vec<_>>(),
            [(0..1, Some(&[-0.5][..]))]
        );
        assert_eq!(Node::default().runs().count(), 0);
        assert_eq!(node.slice(node.sampled_spans()[0]), vec![4, 5]);
    }
}
