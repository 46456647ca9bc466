//! A retried keyed turn whose first reply never arrived whole (the client hung up, the proxy
//! was killed after journaling the turn): its recorded sample stands in for the backend, so
//! the reply is shaped again from exactly the ids the node holds, and nothing is sampled or
//! recorded twice.

use crate::backend::EventStream;
use crate::generation::{Generation, StreamEvent};
use crate::session::Session;
use crate::session::replies::{CommittedTurn, TurnKey};
use std::sync::Arc;

/// The recorded turn asked under `key` on `session`, if it was recorded.
pub(super) fn recorded(session: &Session, key: Option<&TurnKey>) -> Option<Arc<CommittedTurn>> {
    session.replies.committed(&key?.key)
}

/// The recorded samples, each with the backend that produced it.
pub(super) fn samples(turn: &CommittedTurn) -> Vec<(Generation, Arc<str>)> {
    turn.choices
        .iter()
        .map(|choice| (choice.generation(), choice.backend.clone()))
        .collect()
}

/// The recorded samples as backend streams, one per choice, a token per event as a backend
/// streams them (so the client sees the stream the first reply was).
pub(super) fn streams(turn: &CommittedTurn) -> Vec<(EventStream, Arc<str>)> {
    samples(turn)
        .into_iter()
        .map(|(generation, backend)| {
            let finished = StreamEvent::Finished {
                finish_reason: generation.finish_reason,
                stop: generation.stop,
                weight_version: generation.weight_version,
                weight_spans: generation.weight_spans,
                routed_experts: generation.routed_experts,
                cached_tokens: generation.cached_tokens,
            };
            let tokens = generation.token_ids.into_iter().zip(generation.logprobs);
            let events = tokens
                .map(|(id, logprob)| StreamEvent::Tokens {
                    token_ids: vec![id],
                    logprobs: vec![logprob],
                    top_logprobs: None,
                })
                .chain([finished])
                .map(Ok);
            let stream: EventStream = Box::pin(futures::stream::iter(events));
            (stream, backend)
        })
        .collect()
}
