//! A sampled turn as the session records it ([`CommitRecord`]), and [`apply`], which writes
//! it into the session. The turn pipeline builds the record; a [`SessionLog`] (the journal,
//! with `--data-dir`) keeps it before it is applied, so a restart applies the very same
//! records and gets the very same session.

use super::node::HealedCall;
use super::replies::{CommittedTurn, TurnKey};
use super::{
    CompletionRecord, ConversationDigest, Divergence, HistoryEntry, IssuedToolCall, Node,
    SegmentCheck, Session, SessionState, TurnRecord,
};
use crate::generation::{
    FinishReason, Generation, ImageSpan, PromptImage, RoutedExperts, StopMatch, WeightSpan,
};
use std::sync::Arc;

/// Where a turn's prompt started from.
#[derive(Debug, Clone, PartialEq)]
pub enum Start {
    /// The prompt began with every token of this node.
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

/// The API a turn came in by; a rollout may switch between them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Api {
    /// OpenAI's chat completions.
    #[default]
    ChatCompletions,
    /// OpenAI's text completions.
    Completions,
    /// Anthropic's Messages.
    Messages,
    /// OpenAI's Responses.
    Responses,
}

impl Api {
    /// Every API.
    pub const ALL: [Api; 4] = [
        Api::ChatCompletions,
        Api::Completions,
        Api::Messages,
        Api::Responses,
    ];

    /// Its name, as nodes, metrics and spans carry it.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::ChatCompletions => "chat.completions",
            Api::Completions => "completions",
            Api::Messages => "messages",
            Api::Responses => "responses",
        }
    }

    /// The API named `name` ([`Api::as_str`]).
    pub fn named(name: &str) -> Option<Api> {
        Api::ALL.into_iter().find(|api| api.as_str() == name)
    }

    /// How the API names a returned tool call: `{prefix}{n}`, `n` counting the session's
    /// calls (Anthropic's ids start `toolu_`, OpenAI's `call_`).
    pub fn call_id_prefix(self) -> &'static str {
        match self {
            Api::Messages => "toolu_",
            Api::ChatCompletions | Api::Completions | Api::Responses => "call_",
        }
    }
}

impl serde::Serialize for Api {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// What a node's turn record says of how the turn was asked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TurnLabels {
    /// The API the turn came in by.
    pub api: Api,
    /// Declared tools the prompt leaves out.
    pub tools_left_out: Vec<String>,
    /// How a nudge retry went for this attempt (`kept`, ...), if there was one.
    pub nudge: Option<&'static str>,
    /// Calls of the turn before handed back changed but recognised.
    pub echoed_calls: Vec<super::EchoChange>,
}

/// A sampled turn, as the session records it.
#[derive(Debug, Clone, PartialEq)]
pub struct CommitRecord {
    /// Where the prompt started from.
    pub start: Start,
    /// The prompt after the base node's ids.
    pub new_prompt: Vec<u32>,
    /// The images `new_prompt` holds, their offsets counted from its start.
    pub images: Vec<ImageSpan>,
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
    /// The `Idempotency-Key` the turn was asked under, if any.
    pub key: Option<TurnKey>,
    /// The conversation the turn was sampled after (chat turns): a later turn that sends the
    /// same conversation on may render only what follows, after a restart too.
    pub conversation: Option<ConversationDigest>,
}

impl CommitRecord {
    /// The images this record adds, each with its bytes from `prompt` (the prompt's images).
    pub fn added_images<'a>(
        &'a self,
        prompt: &'a [PromptImage],
    ) -> impl Iterator<Item = &'a PromptImage> + 'a {
        (self.images.iter())
            .filter_map(|span| prompt.iter().find(|image| image.span.sha256 == span.sha256))
    }
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
    /// Every version the sample was drawn from, when it spanned more than one.
    pub weight_spans: Vec<WeightSpan>,
    /// The experts the prompt and sample were routed to, when the session records them.
    pub routed_experts: Option<RoutedExperts>,
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

impl RecordedChoice {
    /// The sample as the backend produced it (less top logprobs, which are not recorded).
    pub fn generation(&self) -> Generation {
        Generation {
            token_ids: self.token_ids.clone(),
            logprobs: self.logprobs.clone(),
            top_logprobs: None,
            finish_reason: self.finish_reason,
            stop: self.stop.clone(),
            weight_version: self.weight_version.clone(),
            weight_spans: self.weight_spans.clone(),
            routed_experts: self.routed_experts.clone(),
            cached_tokens: self.cached_tokens,
            approximate: self.approximate,
        }
    }
}

impl Session {
    /// Writes `record` into this session, whose state `state` is (locked); returns the node
    /// index of each choice. A keyed turn's commit is noted under its key.
    pub fn apply(&self, state: &mut SessionState, record: &CommitRecord) -> Vec<usize> {
        let issued_before = state.issued_calls;
        let nodes = apply(state, record);
        if let Some(adapter) = &self.options.adapter {
            for &node in &nodes {
                if let Some(turn) = state.nodes[node].turns.last_mut() {
                    turn.adapter = Some(adapter.clone());
                }
            }
        }
        self.set_num_nodes(state.nodes.len());
        // The session's next turn prefers this server (its prefix cache is there), whichever
        // process applies the record: the one that sampled it, a restart, another replica.
        if let Some(first) = record.choices.first() {
            self.set_backend(first.backend.clone());
        }
        if let Some(key) = &record.key {
            let turn = CommittedTurn {
                choices: record.choices.clone(),
                issued_before,
                body_hash: key.body_hash,
            };
            self.replies.note_commit(&key.key, turn);
        }
        nodes
    }
}

/// Whether `record` fits the session whose state is `state`: the node it extends and the
/// completions its history names are there. A record journaled after one of its session's
/// records was lost (damage in the journal) may not, and must not be applied.
pub fn fits(state: &SessionState, record: &CommitRecord) -> bool {
    let base = match record.start {
        Start::Extend { node } => node < state.nodes.len(),
        Start::New { .. } => true,
    };
    let divergence_node = match &record.start {
        Start::New {
            divergence: Some(divergence),
        } => divergence
            .from_node
            .is_none_or(|node| node < state.nodes.len()),
        _ => true,
    };
    base && divergence_node
        && record
            .history
            .iter()
            .all(|entry| entry.completion < state.completions.len())
}

/// Writes `record` into the session; returns the node index of each choice.
///
/// The first choice extends the base node in place (unless `track_tree`); every other choice,
/// and every choice under `track_tree`, becomes its own node (with `parent` under `track_tree`).
pub fn apply(state: &mut SessionState, record: &CommitRecord) -> Vec<usize> {
    let track_tree = record.track_tree;
    let base_copy = match record.start {
        Start::Extend { node } if track_tree || record.choices.len() > 1 => {
            Some(state.nodes[node].clone())
        }
        _ => None,
    };
    if let Start::New {
        divergence: Some(divergence),
    } = &record.start
    {
        let node = state.nodes.len();
        (state.divergences).note(node, divergence, &record.new_prompt, &state.nodes);
    }
    let first_completion = state.completions.len();
    let mut placed = Vec::with_capacity(record.choices.len());
    for (i, choice) in record.choices.iter().enumerate() {
        let (index, mut node) = match (&record.start, &base_copy) {
            (Start::Extend { node }, _) if i == 0 && !track_tree => {
                let index = *node;
                if let Some(last) = state.nodes[index].history.last() {
                    state.tail_of.remove(&last.completion);
                }
                (index, std::mem::take(&mut state.nodes[index]))
            }
            (Start::Extend { node }, Some(copy)) => {
                let mut fresh = copy.clone();
                fresh.parent = track_tree.then_some(*node);
                fresh.divergence = None;
                (state.nodes.len(), fresh)
            }
            (Start::New { divergence }, _) => {
                let mut fresh = Node::default();
                fresh.divergence = divergence.clone();
                (state.nodes.len(), fresh)
            }
            (Start::Extend { .. }, None) => unreachable!("a copy exists for every extra choice"),
        };
        if index == state.nodes.len() {
            state.nodes.push(Node::default());
        }
        let prompt_start = node.len();
        node.reserve_logprobs(choice.logprobs.len());
        node.push_prompt(&record.new_prompt);
        node.push_images(&record.images, prompt_start);
        let span = node.push_sampled(&choice.token_ids, &choice.logprobs);
        if let Some(experts) = &choice.routed_experts {
            node.push_experts(experts);
        }
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
            weight_versions: choice.weight_spans.clone(),
            backend: choice.backend.clone(),
            adapter: None,
            cached_tokens: choice.cached_tokens,
            approximate: choice.approximate,
            nudge: record.labels.nudge,
            api: record.labels.api,
            tools_left_out: record.labels.tools_left_out.clone(),
            healed_calls: choice
                .tool_calls
                .iter()
                .filter_map(|call| {
                    Some(HealedCall {
                        id: call.id.clone(),
                        format: call.healed_from?,
                    })
                })
                .collect(),
            echoed_calls: record.labels.echoed_calls.clone(),
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
    if let Some(conversation) = record.conversation {
        for completion in first_completion..state.completions.len() {
            state.sampled_after.insert(completion, conversation);
        }
    }
    placed
}
