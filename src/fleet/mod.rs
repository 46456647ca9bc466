//! Sessions kept in Redis or Valkey (`serve --store redis://…`, issue 33).
//!
//! The store is the record; a replica keeps the sessions it serves in memory. Each session is
//! one list of journal entries, the frames `--data-dir` writes ([`crate::journal::codec`]), so
//! loading a session is replaying them ([`crate::journal::restore`]). A change is appended
//! only under the session's lease, and only at the length this replica last saw: the lease
//! keeps two replicas from writing a session at once, and the expected length with the
//! lease's fencing token keeps a replica that missed a change, or whose lease ran out (a
//! pause, a partition), from writing after another: it is refused (a 503) and writes nothing,
//! so a node never diverges.
//!
//! What is served today: a replica loads every session at start and keeps each change in the
//! store before it answers, so a replica that dies (`kill -9`) loses nothing and another
//! started on the same store serves its sessions exactly. A session changed by another replica
//! since this one loaded it is refused here. Next (issue 33): a session loaded on first use and
//! brought up to date before each turn, so every replica serves every session at once.
//!
//! Keys (`{id}` is a session's uuid, braced so that one session's keys share a slot):
//! - `rp:{id}:log`: the session's entries, oldest first.
//! - `rp:{id}:lease`: `holder:token` while a replica holds the session, with an expiry.
//! - `rp:{id}:fence`: the last token handed out for the session (tokens only grow).
//! - `rp:sessions`: every session, scored by its creation time.

mod store;

use crate::journal::codec::{self, Entry};
use crate::journal::{Replayed, restore};
use crate::session::replies::KeySlot;
use crate::session::responses::StoredResponse;
use crate::session::{CommitRecord, LogError, Reward, Session, SessionLog, SessionStore};
use dashmap::DashMap;
use std::time::Duration;
pub(crate) use store::StoreError;
use store::{Acquired, Appended, Store};
use uuid::Uuid;

/// How long a replica holds a session to write one change, unless it lets go first.
const LEASE: Duration = Duration::from_secs(5);
/// How long a change waits for another replica to let go of its session.
const LEASE_WAIT: Duration = Duration::from_secs(10);

/// A replica's view of the store: the connection, and how many entries each session it holds
/// has there.
#[derive(Debug)]
pub struct Fleet {
    store: Store,
    lengths: DashMap<Uuid, u64>,
}

impl Fleet {
    /// Connects to the store at `url` as the replica `holder`, and loads every session it
    /// keeps into `sessions`.
    pub async fn open(
        url: &str,
        holder: &str,
        sessions: &SessionStore,
    ) -> Result<(Self, Replayed), StoreError> {
        let store = Store::connect(url, holder).await?;
        let lengths = DashMap::new();
        let mut replayed = Replayed::default();
        for (id, _) in store.sessions().await? {
            let Some(entries) = store.entries(id, 0).await? else {
                continue;
            };
            lengths.insert(id, entries.len() as u64);
            for payload in entries {
                let entry = codec::decode(&payload)
                    .map_err(|e| StoreError::new(format!("session {id}: {e}")))?;
                restore(sessions, entry, &mut replayed);
            }
        }
        Ok((Self { store, lengths }, replayed))
    }

    /// Appends one encoded change of session `id`, under its lease, at the length last seen.
    async fn append(&self, id: Uuid, entry: &[u8]) -> Result<(), LogError> {
        let lease = self.lease(id).await?;
        // Read under the lease: a change of this replica's that held it just before is counted.
        let expected = self.lengths.get(&id).map(|length| *length);
        let Some(expected) = expected else {
            let _ = self.store.release(&lease).await;
            return Err(LogError(format!(
                "session {id} is not held by this replica"
            )));
        };
        let appended = self.store.append(&lease, expected, entry).await;
        if let Ok(Appended::At(length)) = appended {
            self.lengths.insert(id, length);
        }
        // A lease not given back runs out by itself.
        let _ = self.store.release(&lease).await;
        match appended.map_err(|e| LogError(e.to_string()))? {
            Appended::At(_) => Ok(()),
            Appended::Fenced => Err(LogError(format!(
                "session {id}: this replica's hold on it ran out before the change was kept"
            ))),
            Appended::Moved(_) => Err(LogError(format!(
                "session {id} was changed by another replica: this one no longer serves it"
            ))),
        }
    }

    /// The lease of session `id`, waiting while another replica holds it.
    async fn lease(&self, id: Uuid) -> Result<store::Lease, LogError> {
        let deadline = tokio::time::Instant::now() + LEASE_WAIT;
        loop {
            match self.store.acquire(id, LEASE).await {
                Ok(Acquired::Held(lease, _)) => return Ok(lease),
                Ok(Acquired::Missing) => {
                    return Err(LogError(format!("session {id} is not in the store")));
                }
                Ok(Acquired::Busy(wait)) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(
                        wait.clamp(Duration::from_millis(5), Duration::from_millis(50)),
                    )
                    .await;
                }
                Ok(Acquired::Busy(_)) => {
                    return Err(LogError(format!("session {id} is held by another replica")));
                }
                Err(error) => return Err(LogError(error.to_string())),
            }
        }
    }

    async fn append_entry(&self, entry: &Entry) -> Result<(), LogError> {
        let mut out = Vec::new();
        codec::encode(entry, &mut out);
        self.append(entry.session(), &out).await
    }
}

#[async_trait::async_trait]
impl SessionLog for Fleet {
    async fn created(&self, session: &Session) -> Result<(), LogError> {
        let entry = Entry::created(session);
        let mut out = Vec::new();
        codec::encode(&entry, &mut out);
        let created = self
            .store
            .create(session.id, session.created_at, &out)
            .await
            .map_err(|e| LogError(e.to_string()))?;
        if !created {
            return Err(LogError(format!("session {} exists already", session.id)));
        }
        self.lengths.insert(session.id, 1);
        Ok(())
    }

    async fn deleted(&self, session: Uuid) -> Result<(), LogError> {
        self.store
            .delete(session)
            .await
            .map_err(|e| LogError(e.to_string()))?;
        self.lengths.remove(&session);
        Ok(())
    }

    async fn committed(&self, session: Uuid, record: &CommitRecord) -> Result<(), LogError> {
        let mut out = Vec::new();
        codec::encode_commit(session, record, &mut out);
        self.append(session, &out).await
    }

    async fn relabelled(
        &self,
        session: Uuid,
        node: usize,
        label: &'static str,
    ) -> Result<(), LogError> {
        let entry = Entry::relabelled(session, node, label);
        self.append_entry(&entry).await
    }

    async fn replied(&self, session: Uuid, key: &str, slot: &KeySlot) -> Result<(), LogError> {
        match Entry::replied(session, key, slot) {
            Some(entry) => self.append_entry(&entry).await,
            None => Ok(()),
        }
    }

    async fn rewarded(&self, session: Uuid, reward: &Reward) -> Result<(), LogError> {
        self.append_entry(&Entry::rewarded(session, reward)).await
    }

    async fn stored(
        &self,
        session: Uuid,
        response_id: &str,
        response: &StoredResponse,
    ) -> Result<(), LogError> {
        self.append_entry(&Entry::stored(session, response_id, response))
            .await
    }

    fn tidy(&self) -> Result<(), LogError> {
        Ok(())
    }

    /// The store's own persistence (AOF) makes it durable; nothing is buffered here.
    fn sync(&self) -> Result<(), LogError> {
        Ok(())
    }
}
