//! Writing a sampled turn into the session: extend or create nodes, record completions.

use super::{Base, Plan};
use crate::backend::Generation;
use crate::session::{
    CompletionRecord, HistoryEntry, IssuedToolCall, Node, SessionState, TurnRecord,
};

/// One sampled choice, ready to be recorded.
#[derive(Debug, Clone)]
pub struct SampledChoice {
    pub generation: Generation,
    /// Text of the special token the sample ended on, if it ended on one.
    pub end_token_text: Option<String>,
    /// The tool calls returned to the client for it.
    pub tool_calls: Vec<IssuedToolCall>,
    /// Fingerprints under which a later assistant message matches it.
    pub fingerprints: Vec<u64>,
    /// The backend that sampled it.
    pub backend: std::sync::Arc<str>,
    /// How a nudge retry went for this attempt (`kept`, `discarded`, ...), if there was one.
    pub nudge: Option<&'static str>,
}

/// Records `choices` sampled for `plan`; returns the node index of each choice.
///
/// The first choice extends the base node in place (unless `track_tree`); every other choice,
/// and every choice under `track_tree`, becomes its own node (with `parent` under `track_tree`).
pub fn commit(
    state: &mut SessionState,
    plan: &Plan,
    choices: Vec<SampledChoice>,
    track_tree: bool,
) -> Vec<usize> {
    let new_prompt = &plan.prompt_ids[plan.base_len..];
    let base_copy = match plan.base {
        Base::Extend { node } if track_tree || choices.len() > 1 => Some(state.nodes[node].clone()),
        _ => None,
    };
    let mut placed = Vec::with_capacity(choices.len());
    for (i, choice) in choices.into_iter().enumerate() {
        let (index, mut node) = match (&plan.base, &base_copy) {
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
        let generation = choice.generation;
        node.reserve_logprobs(generation.logprobs.len());
        node.push_prompt(new_prompt);
        let span = node.push_sampled(&generation.token_ids, &generation.logprobs);
        node.history = plan.history.clone();
        let completion = state.completions.len();
        node.history.push(HistoryEntry {
            completion,
            before: plan.next_check.clone(),
        });
        node.turns.push(TurnRecord {
            prompt_start,
            completion_start: span.start as usize,
            completion_tokens: generation.token_ids.len(),
            finish_reason: generation.finish_reason.as_str(),
            stop: generation.stop.clone(),
            weight_version: generation.weight_version.clone(),
            backend: choice.backend,
            cached_tokens: generation.cached_tokens,
            approximate: generation.approximate,
            nudge: choice.nudge,
        });
        state.issued_calls += choice.tool_calls.len();
        state.completions.push(CompletionRecord {
            node: index,
            span,
            previous: plan.history.last().map(|h| h.completion),
            end_token_text: choice.end_token_text,
            tool_calls: choice.tool_calls,
        });
        for fingerprint in choice.fingerprints {
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
