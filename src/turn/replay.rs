//! A retried keyed turn whose first reply never arrived whole (the client hung up, the proxy
//! was killed after journaling the turn): its recorded sample stands in for the backend, so
//! the reply is shaped again from exactly the ids the node holds, and nothing is sampled or
//! recorded twice.

use crate::backend::EventStream;
use crate::generation::StreamEvent;
use crate::session::Session;
use crate::session::replies::{CommittedTurn, TurnKey};
use std::sync::Arc;

/// The recorded turn asked under `key` on `session`, if it was recorded.
pub(super) fn recorded(session: &Session, key: Option<&TurnKey>) -> Option<Arc<CommittedTurn>> {
    session.replies.committed(&key?.key)
}

/// The recorded samples as backend streams, one per choice: a token per event as a backend
/// streams them (`per_token`, so a streaming client sees the stream the first reply was), else
/// each sample in one piece.
pub(super) fn streams(turn: &CommittedTurn, per_token: bool) -> Vec<(EventStream, Arc<str>)> {
    turn.choices
        .iter()
        .map(|choice| {
            let mut events = choice.generation().into_events();
            if per_token
                && let StreamEvent::Tokens {
                    token_ids,
                    logprobs,
                    ..
                } = events.remove(0)
            {
                let singles =
                    token_ids
                        .into_iter()
                        .zip(logprobs)
                        .map(|(id, logprob)| StreamEvent::Tokens {
                            token_ids: vec![id],
                            logprobs: vec![logprob],
                            top_logprobs: None,
                        });
                events.splice(0..0, singles);
            }
            let stream: EventStream = Box::pin(futures::stream::iter(events.into_iter().map(Ok)));
            (stream, choice.backend.clone())
        })
        .collect()
}
