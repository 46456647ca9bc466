//! Synthetic commit records, as the session log and the store see a rollout's turns: for the
//! journal's bench, the storage comparison and the churn test (no tokenizer or backend needed).

use rollout_proxy::generation::FinishReason;
use rollout_proxy::session::{CommitRecord, RecordedChoice, SegmentCheck, Start, TurnLabels};

/// A turn that adds `prompt` prompt tokens and `sampled` sampled ones to node `node` (a new
/// node when `None`); `seed` varies the ids.
pub fn synthetic_turn(
    node: Option<usize>,
    prompt: usize,
    sampled: usize,
    seed: u32,
) -> CommitRecord {
    CommitRecord {
        start: match node {
            Some(node) => Start::Extend { node },
            None => Start::New { divergence: None },
        },
        new_prompt: (0..prompt as u32)
            .map(|i| (i * 7 + seed) % 150_000)
            .collect(),
        images: Vec::new(),
        history: Vec::new(),
        next_check: SegmentCheck {
            prefix_len: 40,
            prefix_hash: u64::from(seed),
            generation_prompt: None,
        },
        labels: TurnLabels {
            api: rollout_proxy::session::Api::ChatCompletions,
            ..TurnLabels::default()
        },
        track_tree: false,
        choices: vec![RecordedChoice {
            token_ids: (0..sampled as u32)
                .map(|i| (i * 13 + seed) % 150_000)
                .collect(),
            logprobs: (0..sampled).map(|i| -0.01 * i as f32).collect(),
            finish_reason: FinishReason::Stop,
            stop: None,
            weight_version: None,
            weight_spans: Vec::new(),
            routed_experts: None,
            cached_tokens: Some(prompt as u32),
            approximate: false,
            end_token_text: Some("<|im_end|>".into()),
            tool_calls: Vec::new(),
            fingerprints: vec![u64::from(seed)],
            backend: "http://gpu1:30000".into(),
        }],
        key: None,
        conversation: None,
    }
}
