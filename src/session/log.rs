//! Where sessions are kept beyond the process: the [`SessionLog`] every change goes through
//! before it is answered.

use super::replies::KeySlot;
use super::responses::StoredResponse;
use super::{CommitRecord, Reward, Session, SessionState, SessionStore};
use crate::generation::PromptImage;
use std::sync::Arc;
use tokio::sync::OwnedMutexGuard;
use uuid::Uuid;

/// A store that keeps what happens to sessions, so they outlive the process: the journal of
/// `--data-dir`, or the store a fleet of replicas shares (`--store`, [`crate::fleet`]). Every
/// call happens before the change is answered; an error means the change must not be made.
#[async_trait::async_trait]
pub trait SessionLog: Send + Sync + std::fmt::Debug {
    /// A session was created.
    async fn created(&self, session: &Session) -> Result<(), LogError>;
    /// A session was deleted (or, unless [`SessionLog::expired`] says otherwise, expired).
    async fn deleted(&self, session: Uuid) -> Result<(), LogError>;
    /// A turn of `session` is about to be applied.
    async fn committed(&self, session: Uuid, record: &CommitRecord) -> Result<(), LogError>;
    /// A turn of `session` is about to be applied, with the bytes of the images it adds
    /// (`images` are its prompt's). A log that keeps images ([`SessionLog::keeps_images`])
    /// keeps them with the turn, or neither; the others keep the turn alone (the proxy keeps
    /// the images apart, before).
    async fn committed_with_images(
        &self,
        session: Uuid,
        record: &CommitRecord,
        _images: &[PromptImage],
    ) -> Result<(), LogError> {
        self.committed(session, record).await
    }
    /// Whether this log keeps the images of its turns itself (the fleet's store does).
    fn keeps_images(&self) -> bool {
        false
    }
    /// The bytes of image `sha256` of `session`, from a log that keeps images.
    async fn image(&self, _session: Uuid, _sha256: &str) -> Result<Option<Arc<[u8]>>, LogError> {
        Ok(None)
    }
    /// `node`'s last turn gets a new nudge label.
    async fn relabelled(
        &self,
        session: Uuid,
        node: usize,
        label: &'static str,
    ) -> Result<(), LogError>;
    /// A turn's reply was kept under an `Idempotency-Key` of `session`.
    async fn replied(&self, session: Uuid, key: &str, slot: &KeySlot) -> Result<(), LogError>;
    /// `session`'s rollout got its reward.
    async fn rewarded(&self, session: Uuid, reward: &Reward) -> Result<(), LogError>;
    /// A Responses API reply was stored on `session`.
    async fn stored(
        &self,
        session: Uuid,
        response_id: &str,
        response: &StoredResponse,
    ) -> Result<(), LogError>;
    /// Housekeeping after deletions (the journal compacts); called at most once a second, off
    /// the async workers.
    fn tidy(&self) -> Result<(), LogError>;
    /// Bytes the log takes, when it can say (for `GET /metrics`).
    fn bytes(&self) -> Option<u64> {
        None
    }
    /// Forces everything to durable storage (when the proxy drains).
    fn sync(&self) -> Result<(), LogError>;
    /// Damage the log found and repaired when it was opened, for `GET /health`.
    fn recovered(&self) -> Option<serde_json::Value> {
        None
    }
    /// A session idle past `--session-ttl` was let go of in this process. Where the log is
    /// the only copy, that deletes it; a log other processes share keeps it for them (and
    /// expires it by itself).
    async fn expired(&self, session: Uuid) -> Result<(), LogError> {
        self.deleted(session).await
    }

    // Where other processes change the same sessions (a fleet on one store), a session here
    // may be behind the record, or not here at all. The single-process logs keep no session
    // this process does not hold, so these do nothing for them.

    /// Brings session `id` up to date with the record, loading it into `sessions` when this
    /// process has not seen it, and removing it when the record has it no more.
    async fn refresh(&self, _sessions: &SessionStore, _id: Uuid) -> Result<(), LogError> {
        Ok(())
    }
    /// Loads every session the record has into `sessions`, each up to date (for listings).
    async fn refresh_all(&self, _sessions: &SessionStore) -> Result<(), LogError> {
        Ok(())
    }
    /// Holds `session` for a turn, first bringing its locked `state` up to date: no other
    /// process changes it until the hold is dropped. A session the record has no more is
    /// closed.
    async fn hold(
        &self,
        _session: &Session,
        _state: &mut SessionState,
    ) -> Result<Option<SessionHold>, LogError> {
        Ok(None)
    }
}

/// A session held for one turn across processes ([`SessionLog::hold`]); dropping it lets go.
#[derive(Debug)]
pub struct SessionHold {
    _let_go: tokio::sync::oneshot::Sender<()>,
}

impl SessionHold {
    /// A hold that is let go of when `let_go`'s receiver hears it dropped.
    pub fn new(let_go: tokio::sync::oneshot::Sender<()>) -> Self {
        Self { _let_go: let_go }
    }
}

/// A [`SessionLog`] could not keep a change.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LogError(pub String);

/// A session's state locked for a change, and held across processes while it is.
#[derive(Debug)]
pub struct LockedSession {
    state: OwnedMutexGuard<SessionState>,
    _hold: Option<SessionHold>,
}

impl std::ops::Deref for LockedSession {
    type Target = SessionState;

    fn deref(&self) -> &SessionState {
        &self.state
    }
}

impl std::ops::DerefMut for LockedSession {
    fn deref_mut(&mut self) -> &mut SessionState {
        &mut self.state
    }
}

impl Session {
    /// Locks the session's state for a change and, where `log` is shared with other
    /// processes, holds the session across them, up to date; `None` when the session was
    /// removed meanwhile (here, or from the record).
    pub async fn lock_for_change(
        self: &Arc<Self>,
        log: Option<&dyn SessionLog>,
    ) -> Result<Option<LockedSession>, LogError> {
        let mut state = self.state.clone().lock_owned().await;
        let hold = match (log, self.is_closed()) {
            (_, true) => return Ok(None),
            (None, false) => None,
            (Some(log), false) => log.hold(self, &mut state).await?,
        };
        Ok((!self.is_closed()).then_some(LockedSession { state, _hold: hold }))
    }
}
