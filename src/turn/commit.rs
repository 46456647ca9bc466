//! Writing a sampled turn into the session: extend or create nodes, record completions.

use super::matching::recognisers;
use super::{Base, ChoiceOutput, Plan};
use crate::session::{CompletionRecord, HistoryEntry, Node, SessionState, TurnRecord};

/// What a node's turn record says of how the turn was asked.
#[derive(Debug, Clone, Default)]
pub struct TurnLabels {
    /// The API the turn came in by.
    pub api: &'static str,
    /// Declared tools the prompt leaves out.
    pub tools_left_out: Vec<String>,
    /// How a nudge retry went for this attempt (`kept`, ...), if there was one.
    pub nudge: Option<&'static str>,
}

/// Records `choices` sampled for `plan`; returns the node index of each choice.
///
/// The first choice extends the base node in place (unless `track_tree`); every other choice,
/// and every choice under `track_tree`, becomes its own node (with `parent` under `track_tree`).
pub fn commit(
    state: &mut SessionState,
    plan: &Plan,
    choices: &[ChoiceOutput],
    labels: &TurnLabels,
    track_tree: bool,
) -> Vec<usize> {
    let new_prompt = &plan.prompt_ids[plan.base_len..];
    let base_copy = match plan.base {
        Base::Extend { node } if track_tree || choices.len() > 1 => Some(state.nodes[node].clone()),
        _ => None,
    };
    let mut placed = Vec::with_capacity(choices.len());
    for (i, choice) in choices.iter().enumerate() {
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
        let generation = &choice.generation;
        let (tool_calls, fingerprints) = recognisers(&choice.reply);
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
            backend: choice.backend.clone(),
            cached_tokens: generation.cached_tokens,
            approximate: generation.approximate,
            nudge: labels.nudge,
            api: labels.api,
            tools_left_out: labels.tools_left_out.clone(),
        });
        state.issued_calls += tool_calls.len();
        state.completions.push(CompletionRecord {
            node: index,
            span,
            previous: plan.history.last().map(|h| h.completion),
            end_token_text: choice.reply.end_token_text.clone(),
            tool_calls,
        });
        for fingerprint in fingerprints {
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
