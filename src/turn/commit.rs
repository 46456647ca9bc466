//! Writing a sampled turn into the session: extend or create nodes, record completions.
//!
//! A turn is first written down as a [`CommitRecord`] — everything the session needs of it,
//! and nothing it can recompute — which [`apply`] then writes into the session. The journal
//! keeps the records, so a restart applies them again and gets the very same session.

use super::matching::recognisers;
use super::{Base, ChoiceOutput, Plan};
use crate::generation::{FinishReason, StopMatch};
use crate::session::{
    CompletionRecord, HistoryEntry, IssuedToolCall, Node, SegmentCheck, SessionState, TurnRecord,
};
use std::sync::Arc;

/// What a node's turn record says of how the turn was asked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TurnLabels {
    /// The API the turn came in by.
    pub api: &'static str,
    /// Declared tools the prompt leaves out.
    pub tools_left_out: Vec<String>,
    /// How a nudge retry went for this attempt (`kept`, ...), if there was one.
    pub nudge: Option<&'static str>,
}

/// A sampled turn, as the session records it.
#[derive(Debug, Clone, PartialEq)]
pub struct CommitRecord {
    /// Where the prompt started from.
    pub base: Base,
    /// The prompt after the base node's ids.
    pub new_prompt: Vec<u32>,
    /// History entries of the completed turns inside the prompt.
    pub history: Vec<HistoryEntry>,
    /// The check for the text before the sampled turn.
    pub next_check: SegmentCheck,
    /// How the turn was asked.
    pub labels: TurnLabels,
    /// Every choice becomes its own node, with its parent.
    pub track_tree: bool,
    /// The choices, in order.
    pub choices: Vec<RecordedChoice>,
}

/// One sampled choice, as the session records it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedChoice {
    /// Every sampled id.
    pub token_ids: Vec<u32>,
    /// The backend's logprob of each.
    pub logprobs: Vec<f32>,
    /// Why the sample ended.
    pub finish_reason: FinishReason,
    /// What stopped it, when the backend said.
    pub stop: Option<StopMatch>,
    /// The weight version the backend reported.
    pub weight_version: Option<String>,
    /// Prompt tokens served from the backend's prefix cache.
    pub cached_tokens: Option<u32>,
    /// The ids were re-tokenized from text.
    pub approximate: bool,
    /// The special token the sample ended on.
    pub end_token_text: Option<String>,
    /// The calls returned for it.
    pub tool_calls: Vec<IssuedToolCall>,
    /// Fingerprints under which a later assistant message matches it.
    pub fingerprints: Vec<u64>,
    /// The backend that sampled it.
    pub backend: Arc<str>,
}

impl CommitRecord {
    /// The record of `choices` sampled for `plan`.
    pub fn new(
        plan: &Plan,
        choices: &[ChoiceOutput],
        labels: &TurnLabels,
        track_tree: bool,
    ) -> Self {
        let choices = choices
            .iter()
            .map(|choice| {
                let generation = &choice.generation;
                let (tool_calls, fingerprints) = recognisers(&choice.reply);
                RecordedChoice {
                    token_ids: generation.token_ids.clone(),
                    logprobs: generation.logprobs.clone(),
                    finish_reason: generation.finish_reason,
                    stop: generation.stop.clone(),
                    weight_version: generation.weight_version.clone(),
                    cached_tokens: generation.cached_tokens,
                    approximate: generation.approximate,
                    end_token_text: choice.reply.end_token_text.clone(),
                    tool_calls,
                    fingerprints,
                    backend: choice.backend.clone(),
                }
            })
            .collect();
        Self {
            base: plan.base.clone(),
            new_prompt: plan.prompt_ids[plan.base_len..].to_vec(),
            history: plan.history.clone(),
            next_check: plan.next_check.clone(),
            labels: labels.clone(),
            track_tree,
            choices,
        }
    }
}

/// Records `choices` sampled for `plan`; returns the node index of each choice.
pub fn commit(
    state: &mut SessionState,
    plan: &Plan,
    choices: &[ChoiceOutput],
    labels: &TurnLabels,
    track_tree: bool,
) -> Vec<usize> {
    apply(state, &CommitRecord::new(plan, choices, labels, track_tree))
}

/// Writes `record` into the session; returns the node index of each choice.
///
/// The first choice extends the base node in place (unless `track_tree`); every other choice,
/// and every choice under `track_tree`, becomes its own node (with `parent` under `track_tree`).
pub fn apply(state: &mut SessionState, record: &CommitRecord) -> Vec<usize> {
    let track_tree = record.track_tree;
    let base_copy = match record.base {
        Base::Extend { node } if track_tree || record.choices.len() > 1 => {
            Some(state.nodes[node].clone())
        }
        _ => None,
    };
    let mut placed = Vec::with_capacity(record.choices.len());
    for (i, choice) in record.choices.iter().enumerate() {
        let (index, mut node) = match (&record.base, &base_copy) {
            (Base::Extend { node }, _) if i == 0 && !track_tree => {
                let index = *node;
                if let Some(last) = state.nodes[index].history.last() {
                    state.tail_of.remove(&last.completion);
                }
                (index, std::mem::take(&mut state.nodes[index]))
            }
            (Base::Extend { node }, Some(copy)) => {
                let mut fresh = copy.clone();
                fresh.parent = track_tree.then_some(*node);
                fresh.divergence = None;
                (state.nodes.len(), fresh)
            }
            (Base::New { divergence }, _) => {
                let mut fresh = Node::default();
                fresh.divergence = divergence.clone();
                (state.nodes.len(), fresh)
            }
            (Base::Extend { .. }, None) => unreachable!("a copy exists for every extra choice"),
        };
        if index == state.nodes.len() {
            state.nodes.push(Node::default());
        }
        let prompt_start = node.len();
        node.reserve_logprobs(choice.logprobs.len());
        node.push_prompt(&record.new_prompt);
        let span = node.push_sampled(&choice.token_ids, &choice.logprobs);
        node.history = record.history.clone();
        let completion = state.completions.len();
        node.history.push(HistoryEntry {
            completion,
            before: record.next_check.clone(),
        });
        node.turns.push(TurnRecord {
            prompt_start,
            completion_start: span.start as usize,
            completion_tokens: choice.token_ids.len(),
            finish_reason: choice.finish_reason.as_str(),
            stop: choice.stop.clone(),
            weight_version: choice.weight_version.clone(),
            backend: choice.backend.clone(),
            cached_tokens: choice.cached_tokens,
            approximate: choice.approximate,
            nudge: record.labels.nudge,
            api: record.labels.api,
            tools_left_out: record.labels.tools_left_out.clone(),
        });
        state.issued_calls += choice.tool_calls.len();
        state.completions.push(CompletionRecord {
            node: index,
            span,
            previous: record.history.last().map(|h| h.completion),
            end_token_text: choice.end_token_text.clone(),
            tool_calls: choice.tool_calls.clone(),
        });
        for &fingerprint in &choice.fingerprints {
            state
                .by_fingerprint
                .entry(fingerprint)
                .or_default()
                .push(completion);
        }
        state.tail_of.insert(completion, index);
        state.nodes[index] = node;
        placed.push(index);
    }
    placed
}
