//! Replies kept by `Idempotency-Key`: a client that retries a turn with the same key gets the
//! reply that turn produced, not a second sample (which would fork the node).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

/// Keys remembered per session; the oldest are forgotten first.
const KEPT: usize = 1024;

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

/// What one key holds: the request it was first used with, and its reply once there is one.
#[derive(Debug, Default)]
pub struct KeySlot {
    /// Hash of the request body the key was first used with (0: never used).
    pub body_hash: u64,
    /// The reply, once a turn with this key succeeded.
    pub reply: Option<RecordedReply>,
}

/// A session's keys. A key's slot is locked for the whole turn, so a retry that arrives while
/// the turn runs waits for its reply instead of sampling again.
#[derive(Debug, Default)]
pub struct Replies(Mutex<VecDeque<(String, Arc<tokio::sync::Mutex<KeySlot>>)>>);

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
        let mut keys = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, slot)) = keys.iter().find(|(known, _)| known == key) {
            return slot.clone();
        }
        if keys.len() == KEPT {
            keys.pop_front();
        }
        let slot = Arc::new(tokio::sync::Mutex::new(KeySlot::default()));
        keys.push_back((key.to_string(), slot.clone()));
        slot
    }
}
