//! A planned prompt: the ids a turn sends, the node they extend (or that they start), and
//! what to record once the reply is sampled. [`super::plan`] builds one, rendering the whole
//! conversation or, through [`super::tail`] and [`super::template_history`], only its end.

use super::TurnContext;
use super::segments::exact_check;
use crate::chat::ChatRequest;
use crate::generation::PromptImage;
use crate::metrics::Metrics;
use crate::session::{
    CompletionId, ConversationDigest, Divergence, HistoryEntry, HistoryMode, SegmentCheck,
    SessionState,
};
use crate::tools::ToolParser;
use std::sync::Arc;

/// What a chat turn's prompt is planned from: the model's pieces, the session as it stands,
/// the request, how the session keeps history and the tool-call format it reads. Planning
/// reads these and writes nothing ([`super::plan`]); rendering and tokenizing are timed in
/// `metrics`.
#[derive(Clone, Copy)]
pub struct Planner<'a> {
    /// The template, tokenizer and placeholders.
    pub ctx: &'a TurnContext,
    /// The session's state.
    pub state: &'a SessionState,
    /// The request.
    pub request: &'a ChatRequest,
    /// The session's history policy.
    pub history: HistoryMode,
    /// The session's tool-call format.
    pub parser: &'a dyn ToolParser,
    /// Where rendering and tokenizing are timed.
    pub metrics: &'a Metrics,
}

/// A render split at its sampled turns: the pieces between them (each without the end token
/// its turn already holds) and the check of the last one for the next turn.
pub(super) struct Split<'r> {
    pub pieces: Vec<&'r str>,
    pub next_check: SegmentCheck,
}

/// Where the prompt starts from.
#[derive(Debug, Clone, PartialEq)]
pub enum Base {
    /// The prompt begins with every token of this node.
    Extend {
        /// The node's index in the session.
        node: usize,
    },
    /// A new node; `divergence` says why an existing one could not be extended.
    New {
        /// Why an existing node could not be extended, when one might have been.
        divergence: Option<Divergence>,
    },
}

/// A prepared turn: the prompt to send and what to record once it is sampled.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The ids to send.
    pub prompt_ids: Arc<Vec<u32>>,
    /// Where the prompt starts from.
    pub base: Base,
    /// Length of the base node (0 for a new node): `prompt_ids[base_len..]` is new prompt.
    pub base_len: usize,
    /// History entries of the completed turns inside the prompt, for the node being built
    /// (for an extension they replace the base node's, now checked exactly).
    pub history: Vec<HistoryEntry>,
    /// The check for the text before the turn about to be sampled.
    pub next_check: SegmentCheck,
    /// The template's output the prompt was built from (`None` for a prompt sent as text or
    /// ids): see [`Plan::prompt_text`].
    pub rendered: Option<RenderedPrompt>,
    /// The conversation the prompt was rendered from (chat turns), remembered with the
    /// completions it gets so the next turn can tell it is unchanged.
    pub conversation: Option<ConversationDigest>,
    /// Calls of the turn before that came back changed but recognised (recorded on the turn).
    pub echoed_calls: Vec<crate::session::EchoChange>,
    /// A tail-only render of this turn disagreed with the full render this plan was built
    /// from: the template's text after a turn depends on more than the conversation's end.
    pub tail_render_disagreed: bool,
    /// The prompt's images, each with its run of placeholders in `prompt_ids`
    /// ([`super::images`]); shared with the backend requests.
    pub images: Arc<[PromptImage]>,
}

/// A chat template's output, each sampled turn in it a placeholder (`sampled` lists them in
/// order; none when the sampled turns were rendered as their text).
#[derive(Debug, Clone)]
pub struct RenderedPrompt {
    pub(super) text: String,
    pub(super) sampled: Vec<CompletionId>,
}

impl RenderedPrompt {
    /// A render whose sampled turns are written in as their text.
    pub(super) fn with_turns_as_text(text: String) -> Self {
        Self {
            text,
            sampled: Vec::new(),
        }
    }
}

impl Plan {
    /// The prompt as text: the template's output byte for byte, with each sampled turn as the
    /// text of its sampled ids. Tokenizing may normalise text (NFC, say), so this is not always
    /// the ids decoded; and where the prompt extends a node, the node's ids for earlier turns
    /// stand as they were sampled (e.g. an earlier generation prompt that history now renders
    /// differently, as Qwen3's empty think block), which the ids show and this text does not.
    pub fn prompt_text(&self, ctx: &TurnContext, state: &SessionState) -> String {
        let Some(rendered) = &self.rendered else {
            return ctx.tokenizer.decode(&self.prompt_ids);
        };
        let Some(pieces) = ctx
            .placeholders
            .split(&rendered.text, rendered.sampled.len())
        else {
            return rendered.text.clone();
        };
        let pieces = strip_end_tokens(state, &rendered.sampled, pieces);
        let mut text = String::with_capacity(rendered.text.len());
        text.push_str(pieces[0]);
        for (&completion, piece) in rendered.sampled.iter().zip(&pieces[1..]) {
            let record = &state.completions[completion];
            text.push_str(
                &ctx.tokenizer
                    .decode(&state.nodes[record.node].slice(record.span)),
            );
            text.push_str(piece);
        }
        text
    }
}

pub(super) fn history_entries(sampled: &[CompletionId], pieces: &[&str]) -> Vec<HistoryEntry> {
    sampled
        .iter()
        .zip(pieces)
        .map(|(&completion, piece)| HistoryEntry {
            completion,
            before: exact_check(piece),
        })
        .collect()
}

/// Removes, at the start of each piece after a sampled turn, the end token the model already
/// sampled (the template renders `<|im_end|>` after the content again).
pub(super) fn strip_end_tokens<'t>(
    state: &SessionState,
    sampled: &[CompletionId],
    mut pieces: Vec<&'t str>,
) -> Vec<&'t str> {
    for (piece, &completion) in pieces.iter_mut().skip(1).zip(sampled) {
        *piece = strip_end_token(state, completion, piece);
    }
    pieces
}

/// `piece` (the text after `completion`) without the end token `completion` already holds,
/// as the template renders it (Harmony renders a sampled `<|return|>` as `<|end|>`).
pub(super) fn strip_end_token<'t>(
    state: &SessionState,
    completion: CompletionId,
    piece: &'t str,
) -> &'t str {
    let Some(end) = state.completions[completion].end_token_text.as_deref() else {
        return piece;
    };
    let rendered = match piece.starts_with(end) {
        true => Some(end.len()),
        false => crate::tokenizer::harmony::rendered_end_len(end, piece),
    };
    rendered.map_or(piece, |len| &piece[len..])
}
/// The node that ends with the last of `chain` and holds exactly these completions.
pub(super) fn chain_candidate(state: &SessionState, chain: &[CompletionId]) -> Option<usize> {
    let n = *state.tail_of.get(chain.last()?)?;
    let history = &state.nodes[n].history;
    (history.len() == chain.len() && history.iter().zip(chain).all(|(h, c)| h.completion == *c))
        .then_some(n)
}
