//! Trajectories out for the trainer: the nodes of the selected sessions, with each session's
//! reward and metadata, as JSON lines ([`jsonl`]), as padded NumPy arrays ([`npz`]) or as
//! agent trajectories in Harbor's format ([`atif`]).
//!
//! A [`Selection`] picks sessions by id, by whether their rollout is finished (has a reward)
//! and by when they were last used; an export may also remove what it exported, in the same
//! step (the HTTP route holds each session's lock from reading it to removing it, so a turn
//! is either in the export or refused, never lost between two exports).

pub(crate) mod atif;
pub(crate) mod jsonl;
pub(crate) mod messages;
pub(crate) mod npz;

use crate::session::{Node, Reward, Session, SessionStore};
use std::sync::Arc;

/// An export that cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A query parameter is malformed.
    #[error("{0}")]
    Query(String),
    /// A node is longer than `pad_to`.
    #[error("a node holds {len} tokens, more than pad_to={pad_to}")]
    TooLong {
        /// The node's length.
        len: usize,
        /// The requested width.
        pad_to: usize,
    },
    /// The arrays could not be written.
    #[error("writing the export failed: {0}")]
    Write(String),
}

/// Which sessions an export takes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selection {
    /// Only these (by id); all when `None`.
    pub sessions: Option<Vec<String>>,
    /// Only finished rollouts (a reward was given) when `Some(true)`, only unfinished ones
    /// when `Some(false)`.
    pub finished: Option<bool>,
    /// Only sessions used at or after this time (seconds since the epoch).
    pub since: Option<f64>,
}

impl Selection {
    /// The selected sessions, ordered by id (so that exports lock them in one order).
    pub fn apply(&self, store: &SessionStore) -> Vec<Arc<Session>> {
        let mut chosen: Vec<Arc<Session>> = match &self.sessions {
            Some(ids) => ids.iter().filter_map(|id| store.get(id)).collect(),
            None => store.list(),
        };
        chosen.retain(|s| {
            self.finished.is_none_or(|f| s.reward().is_some() == f)
                && self.since.is_none_or(|t| s.last_accessed() >= t)
        });
        chosen.sort_by_key(|s| s.id);
        chosen.dedup_by_key(|s| s.id);
        chosen
    }
}

/// Reads `since`: seconds since the epoch, or an RFC 3339 time.
pub fn parse_time(text: &str) -> Result<f64, ExportError> {
    if let Ok(seconds) = text.parse::<f64>()
        && seconds.is_finite()
    {
        return Ok(seconds);
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_micros() as f64 / 1e6)
        .map_err(|_| {
            ExportError::Query(format!(
                "'since' must be seconds since the epoch or an RFC 3339 time, not '{text}'"
            ))
        })
}

/// One exported session: its id, what is known of it, and its nodes.
#[derive(Debug)]
pub struct SessionExport<'a> {
    /// The session.
    pub session: &'a Session,
    /// Its nodes, in order.
    pub nodes: &'a [Node],
    /// Its sampled completions (the tool-call ids each was returned with).
    pub completions: &'a [crate::session::CompletionRecord],
    /// Its reward, if given.
    pub reward: Option<Reward>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::SessionOptions;

    #[test]
    fn since_reads_seconds_and_rfc3339() {
        assert_eq!(parse_time("1700000000.5").unwrap(), 1_700_000_000.5);
        assert_eq!(parse_time("2023-11-14T22:13:20Z").unwrap(), 1_700_000_000.0);
        assert!(parse_time("yesterday").is_err());
        assert!(parse_time("NaN").is_err());
    }

    #[test]
    fn a_selection_filters_and_orders_by_id() {
        let store = SessionStore::default();
        let made: Vec<_> = (0..4)
            .map(|_| store.create(SessionOptions::default()).unwrap())
            .collect();
        made[1].set_reward(Reward {
            reward: 1.0,
            metadata: Default::default(),
            rewarded_at: 0.0,
        });
        let all = Selection::default().apply(&store);
        assert_eq!(all.len(), 4);
        assert!(all.windows(2).all(|w| w[0].id < w[1].id));
        let finished = Selection {
            finished: Some(true),
            ..Selection::default()
        };
        assert_eq!(finished.apply(&store)[0].id, made[1].id);
        let named = Selection {
            sessions: Some(vec![
                made[2].id.to_string(),
                "nope".into(),
                made[2].id.to_string(),
            ]),
            ..Selection::default()
        };
        assert_eq!(named.apply(&store).len(), 1);
        let later = Selection {
            since: Some(f64::MAX),
            ..Selection::default()
        };
        assert!(later.apply(&store).is_empty());
    }
}
