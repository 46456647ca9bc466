//! From a sampled turn to the record the session applies ([`CommitRecord`], in
//! [`crate::session::record`]).

use super::matching::recognisers;
use super::{Base, ChoiceOutput, Plan};
use crate::generation::ImageSpan;
use crate::session::{CommitRecord, RecordedChoice, Start, TurnLabels};
use crate::tools::DeclaredTools;

impl CommitRecord {
    /// The record of `choices` sampled for `plan` (unkeyed); `tools` were the request's.
    pub fn new(
        plan: &Plan,
        choices: &[ChoiceOutput],
        labels: &TurnLabels,
        track_tree: bool,
        tools: Option<&DeclaredTools>,
    ) -> Self {
        let choices = choices
            .iter()
            .map(|choice| {
                let generation = &choice.generation;
                let (tool_calls, fingerprints) = recognisers(&choice.reply, tools);
                RecordedChoice {
                    token_ids: generation.token_ids.clone(),
                    logprobs: generation.logprobs.clone(),
                    finish_reason: generation.finish_reason,
                    stop: generation.stop.clone(),
                    weight_version: generation.weight_version.clone(),
                    weight_spans: generation.weight_spans.clone(),
                    routed_experts: generation.routed_experts.clone(),
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
            start: match &plan.base {
                Base::Extend { node } => Start::Extend { node: *node },
                Base::New { divergence } => Start::New {
                    divergence: divergence.clone(),
                },
            },
            new_prompt: plan.prompt_ids[plan.base_len..].to_vec(),
            images: (plan.images.iter())
                .filter(|image| image.span.offset >= plan.base_len)
                .map(|image| ImageSpan {
                    offset: image.span.offset - plan.base_len,
                    ..image.span.clone()
                })
                .collect(),
            history: plan.history.clone(),
            next_check: plan.next_check.clone(),
            labels: labels.clone(),
            track_tree,
            choices,
            key: None,
            conversation: plan.conversation,
        }
    }
}
