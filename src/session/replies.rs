//! Replies kept by `Idempotency-Key`: a client that retries a turn with the same key gets the
//! reply that turn produced, not a second sample (which would fork the node).
//!
//! Two things are kept per key: the reply as sent, once it was sent whole, and the turn's
//! commit ([`CommittedTurn`]), from the moment it is recorded. A retry whose first reply never
//! arrived whole (the client hung up, the proxy was killed) is answered from the commit: the
//! recorded sample is shaped again, and nothing is sampled or recorded twice.

use super::RecordedChoice;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

/// Keys remembered per session; the oldest are forgotten first.
const KEPT: usize = 1024;

/// The `Idempotency-Key` a turn was asked under. Its commit record carries it, so the journal
/// keeps it with the turn in one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnKey {
    /// The key.
    pub key: String,
    /// Hash of the request body the key was first used with.
    pub body_hash: u64,
}

/// A keyed turn that was recorded: what its reply is shaped again from.
#[derive(Debug, Clone, PartialEq)]
pub struct CommittedTurn {
    /// The choices, as recorded.
    pub choices: Vec<RecordedChoice>,
    /// Tool calls the session had returned before this turn (its calls' ids follow on).
    pub issued_before: usize,
    /// Hash of the request body the turn was asked with: the key is bound to it.
    pub body_hash: u64,
}

/// A recorded reply, as sent.
#[derive(Debug, Clone)]
pub struct RecordedReply {
    /// The HTTP status.
    pub status: u16,
    /// Its content type.
    pub content_type: String,
    /// The whole body (a stream's every event).
    pub body: bytes::Bytes,
}

/// What one key holds: its reply once there is one, and the request that reply answered.
#[derive(Debug, Default)]
pub struct KeySlot {
    /// Hash of the request body of the recorded reply (0: none yet). Only a recorded turn
    /// binds a key: a refused or failed request leaves it free for a corrected retry.
    pub body_hash: u64,
    /// The reply, once a turn with this key was recorded and its reply sent whole.
    pub reply: Option<RecordedReply>,
}

#[derive(Debug)]
struct Keyed {
    key: String,
    /// Locked for the whole turn, so a retry that arrives meanwhile waits for its reply.
    slot: Arc<tokio::sync::Mutex<KeySlot>>,
    /// Set when the turn is recorded (while `slot` is held by the turn's request).
    committed: Option<Arc<CommittedTurn>>,
}

/// A session's keys.
#[derive(Debug, Default)]
pub struct Replies(Mutex<VecDeque<Keyed>>);

impl Replies {
    /// Puts back a key's recorded reply (a restart replaying the journal).
    pub fn restore(&self, key: &str, slot: KeySlot) {
        let restored = self.slot(key);
        if let Ok(mut held) = restored.try_lock() {
            *held = slot;
        }
    }

    /// The slot of `key` (a new one the first time).
    pub fn slot(&self, key: &str) -> Arc<tokio::sync::Mutex<KeySlot>> {
        self.with(key, |keyed| keyed.slot.clone())
    }

    /// Notes that the turn asked under `key` was recorded.
    pub fn note_commit(&self, key: &str, turn: CommittedTurn) {
        self.with(key, |keyed| keyed.committed = Some(Arc::new(turn)));
    }

    /// The recorded turn asked under `key`, if there is one.
    pub fn committed(&self, key: &str) -> Option<Arc<CommittedTurn>> {
        let keys = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        keys.iter()
            .find(|keyed| keyed.key == key)
            .and_then(|keyed| keyed.committed.clone())
    }

    fn with<T>(&self, key: &str, f: impl FnOnce(&mut Keyed) -> T) -> T {
        let mut keys = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(keyed) = keys.iter_mut().find(|keyed| keyed.key == key) {
            return f(keyed);
        }
        if keys.len() == KEPT {
            keys.pop_front();
        }
        keys.push_back(Keyed {
            key: key.to_string(),
            slot: Arc::default(),
            committed: None,
        });
        f(keys.back_mut().expect("just pushed"))
    }
}
