//! Sessions kept in Redis or Valkey (`serve --store redis://…`, issue 33): every replica
//! started with the same store serves every session.
//!
//! The store is the record; a replica keeps the sessions it serves in memory. Each session is
//! one list of journal entries, the frames `--data-dir` writes ([`crate::journal::codec`]), so
//! loading a session is replaying them and bringing one up to date is applying the entries
//! other replicas appended since ([`crate::journal::apply`]).
//!
//! - A session unknown here is loaded on first use; one known here is brought up to date
//!   before it is read.
//! - A turn holds its session's lease from before it reads the session until it is recorded
//!   ([`SessionLog::hold`]), renewing it while the backend samples: another replica's turn on
//!   the same session (an `Idempotency-Key` retry sent elsewhere) waits, then finds the first
//!   one's record.
//! - A change is appended only under the lease and at the length this replica has applied:
//!   a replica whose lease ran out (a pause, a partition) or that missed a change writes
//!   nothing and the change is refused (a 503), so a node never diverges. A replica that
//!   cannot reach the store refuses every change.
//! - With `--session-ttl`, a session no replica changes for that long expires in the store
//!   (key expiry); a replica's own idle copy is only let go of.
//!
//! Keys (`{id}` is a session's uuid, braced so that one session's keys share a slot):
//! - `rp:{id}:log`: the session's entries, oldest first.
//! - `rp:{id}:lease`: `holder:token` while a replica holds the session, with an expiry.
//! - `rp:{id}:fence`: the last token handed out for the session (tokens only grow).
//! - `rp:{id}:images`: the bytes of the session's images by SHA-256, each written by the
//!   append of the first turn that holds it; they expire and are deleted with the session.
//! - `rp:sessions`: every session, scored by its creation time.

mod control;
mod held;
mod store;

use crate::generation::PromptImage;
use crate::journal::codec::{self, Entry};
use crate::journal::{Replayed, restore};
use crate::session::replies::KeySlot;
use crate::session::responses::StoredResponse;
use crate::session::{
    CommitRecord, LogError, Reward, Session, SessionHold, SessionLog, SessionState, SessionStore,
};
pub use control::FleetHealth;
use dashmap::DashMap;
use std::sync::Arc;
use std::time::Duration;
pub(crate) use store::StoreError;
use store::{Acquired, Appended, Lease, Store};
use uuid::Uuid;

/// How long a lease lasts unless renewed: how long a dead replica's sessions wait.
const LEASE: Duration = Duration::from_secs(5);
/// How long a change or turn waits for another replica to let go of its session.
const LEASE_WAIT: Duration = Duration::from_secs(120);

/// A replica's view of the store: the connection, and what it applied of each session it
/// keeps.
#[derive(Debug)]
pub struct Fleet {
    store: Store,
    applied: DashMap<Uuid, Arc<Applied>>,
    /// One load at a time: two requests for a session not yet here load it once.
    loading: tokio::sync::Mutex<()>,
    /// One change of the fleet's control at a time, here (see [`control`]).
    control: tokio::sync::Mutex<()>,
}

/// What this replica applied of one session, and the lease a turn of it holds here; locked
/// while a change is appended, after the session's state when both are.
#[derive(Debug, Default)]
struct Applied {
    record: tokio::sync::Mutex<Record>,
}

#[derive(Debug, Default)]
struct Record {
    /// Entries of the session applied here.
    length: u64,
    /// The lease a turn here holds.
    held: Option<Lease>,
}

fn log_error(error: impl std::fmt::Display) -> LogError {
    LogError(error.to_string())
}

impl Fleet {
    /// Connects to the store at `url` as the replica `holder`. Sessions idle for `expiry`
    /// (`--session-ttl`) expire in the store.
    pub async fn open(
        url: &str,
        holder: &str,
        expiry: Option<Duration>,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            store: Store::connect(url, holder, expiry).await?,
            applied: DashMap::new(),
            loading: tokio::sync::Mutex::new(()),
            control: tokio::sync::Mutex::new(()),
        })
    }

    fn applied(&self, id: Uuid) -> Option<Arc<Applied>> {
        self.applied.get(&id).map(|a| a.clone())
    }

    /// Whether session `id` is here: in `sessions`, with what was applied of it.
    fn is_here(&self, sessions: &SessionStore, id: Uuid) -> bool {
        self.applied.contains_key(&id) && sessions.get(&id.to_string()).is_some()
    }

    /// Loads session `id` from the store into `sessions`, unless it is here already (another
    /// request loaded it meanwhile) or the store has no such session.
    async fn load(&self, sessions: &SessionStore, id: Uuid) -> Result<(), LogError> {
        // Read before taking the lock, so that requests for ids the store does not have (or
        // loads of other sessions) do not wait on each other's round trips; a turn appended
        // since is applied when the session is next read or held.
        let entries = self.store.entries(id, 0).await.map_err(log_error)?;
        let _one_at_a_time = self.loading.lock().await;
        if self.is_here(sessions, id) {
            return Ok(());
        }
        // Half here (a leftover of a failed change): started over from the store, and a copy
        // someone may still hold is closed, so that nothing is applied to it unseen.
        self.applied.remove(&id);
        sessions.remove(&id.to_string());
        let Some(entries) = entries else {
            return Ok(());
        };
        let mut replayed = Replayed::default();
        for payload in &entries {
            let entry =
                codec::decode(payload).map_err(|e| log_error(format!("session {id}: {e}")))?;
            if !restore(sessions, entry, &mut replayed) {
                sessions.remove(&id.to_string());
                return Err(log_error(format!(
                    "session {id} in the store does not replay"
                )));
            }
        }
        let record = Record {
            length: entries.len() as u64,
            held: None,
        };
        let applied = Applied {
            record: tokio::sync::Mutex::new(record),
        };
        self.applied.insert(id, Arc::new(applied));
        Ok(())
    }

    /// Applies to `state` the entries of `session` the store has beyond `record`; `false`
    /// when the store has the session no more (it is then closed here).
    async fn catch_up(
        &self,
        session: &Session,
        state: &mut SessionState,
        record: &mut Record,
    ) -> Result<bool, LogError> {
        let id = session.id;
        let entries = self
            .store
            .entries(id, record.length)
            .await
            .map_err(log_error)?;
        let Some(entries) = entries else {
            session.close();
            return Ok(false);
        };
        for payload in entries {
            let entry =
                codec::decode(&payload).map_err(|e| log_error(format!("session {id}: {e}")))?;
            crate::journal::apply(session, state, entry)
                .map_err(|e| log_error(format!("session {id}: {e}")))?;
            record.length += 1;
        }
        Ok(true)
    }

    /// The lease of session `id`, taken while `record` is locked, waiting while another
    /// replica holds it; `None` when the store has no such session.
    async fn acquire(&self, id: Uuid) -> Result<Option<(Lease, u64)>, LogError> {
        let deadline = tokio::time::Instant::now() + LEASE_WAIT;
        loop {
            match self.store.acquire(id, LEASE).await.map_err(log_error)? {
                Acquired::Held(lease, length) => return Ok(Some((lease, length))),
                Acquired::Missing => return Ok(None),
                Acquired::Busy(_) if tokio::time::Instant::now() >= deadline => {
                    return Err(log_error(format!(
                        "session {id} is held by another replica"
                    )));
                }
                Acquired::Busy(wait) => {
                    let pause = wait.clamp(Duration::from_millis(2), Duration::from_millis(20));
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// Appends one encoded change of session `id`, with the images it adds: under the lease a
    /// turn here holds, or under one taken for it; at the length applied here.
    async fn append(
        &self,
        id: Uuid,
        entry: &[u8],
        images: &[(&str, &[u8])],
    ) -> Result<(), LogError> {
        let applied = self
            .applied(id)
            .ok_or_else(|| log_error(format!("session {id} is not kept by this replica")))?;
        let mut record = applied.record.lock().await;
        let (lease, taken) = match &record.held {
            Some(lease) => (lease.clone(), false),
            None => match self.acquire(id).await? {
                Some((lease, _)) => (lease, true),
                None => return Err(log_error(format!("session {id} is not in the store"))),
            },
        };
        let appended = (self.store)
            .append(&lease, record.length, entry, images)
            .await;
        if taken {
            // Not waited for: a lease not given back runs out by itself, and this replica
            // takes its own over at once.
            let store = self.store.clone();
            tokio::spawn(async move { store.release(&lease).await });
        }
        match appended.map_err(log_error)? {
            Appended::At(length) => {
                record.length = length;
                Ok(())
            }
            Appended::Fenced => Err(log_error(format!(
                "session {id}: this replica's hold on it ran out before the change was kept"
            ))),
            Appended::Moved(_) => Err(log_error(format!(
                "session {id} was changed by another replica meanwhile; try again"
            ))),
        }
    }

    async fn append_entry(&self, entry: &Entry) -> Result<(), LogError> {
        let mut out = Vec::new();
        codec::encode(entry, &mut out);
        self.append(entry.session(), &out, &[]).await
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
            .map_err(log_error)?;
        if !created {
            return Err(log_error(format!("session {} exists already", session.id)));
        }
        let record = Record {
            length: 1,
            held: None,
        };
        let applied = Applied {
            record: tokio::sync::Mutex::new(record),
        };
        self.applied.insert(session.id, Arc::new(applied));
        Ok(())
    }

    /// Deletes the session fleet-wide; an error when another replica deleted it first, so
    /// that whoever hands a session out as it deletes it (an export) does so once.
    async fn deleted(&self, session: Uuid) -> Result<(), LogError> {
        let deleted = self.store.delete(session).await.map_err(log_error)?;
        self.applied.remove(&session);
        match deleted {
            true => Ok(()),
            false => Err(log_error(format!(
                "session {session} was deleted by another replica"
            ))),
        }
    }

    async fn expired(&self, session: Uuid) -> Result<(), LogError> {
        self.applied.remove(&session);
        Ok(())
    }

    async fn committed(&self, session: Uuid, record: &CommitRecord) -> Result<(), LogError> {
        self.committed_with_images(session, record, &[]).await
    }

    /// The turn and the bytes of the images it adds, in one append: both kept, or neither.
    async fn committed_with_images(
        &self,
        session: Uuid,
        record: &CommitRecord,
        images: &[PromptImage],
    ) -> Result<(), LogError> {
        let mut out = Vec::new();
        codec::encode_commit(session, record, &mut out);
        let added: Vec<(&str, &[u8])> = (record.added_images(images))
            .map(|image| (&*image.span.sha256, &*image.bytes))
            .collect();
        self.append(session, &out, &added).await
    }

    fn keeps_images(&self) -> bool {
        true
    }

    async fn image(&self, session: Uuid, sha256: &str) -> Result<Option<Arc<[u8]>>, LogError> {
        let bytes = self.store.image(session, sha256).await.map_err(log_error)?;
        Ok(bytes.map(Arc::from))
    }

    async fn relabelled(
        &self,
        session: Uuid,
        node: usize,
        label: &'static str,
    ) -> Result<(), LogError> {
        self.append_entry(&Entry::relabelled(session, node, label))
            .await
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

    async fn refresh(&self, sessions: &SessionStore, id: Uuid) -> Result<(), LogError> {
        let here = self.applied(id).zip(sessions.get(&id.to_string()));
        let Some((applied, session)) = here else {
            return self.load(sessions, id).await;
        };
        let mut state = session.state.lock().await;
        let mut record = applied.record.lock().await;
        if !self.catch_up(&session, &mut state, &mut record).await? {
            drop((record, state));
            self.applied.remove(&id);
            sessions.remove(&id.to_string());
        }
        Ok(())
    }

    async fn refresh_all(&self, sessions: &SessionStore) -> Result<(), LogError> {
        let mut ids: Vec<Uuid> = sessions.list().iter().map(|s| s.id).collect();
        for (id, _) in self.store.sessions().await.map_err(log_error)? {
            ids.push(id);
        }
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            self.refresh(sessions, id).await?;
            if sessions.get(&id.to_string()).is_none() {
                // Expired in the store: its place in the index goes too.
                self.store.delete(id).await.map_err(log_error)?;
            }
        }
        Ok(())
    }

    async fn hold(
        &self,
        session: &Session,
        state: &mut SessionState,
    ) -> Result<Option<SessionHold>, LogError> {
        let id = session.id;
        let applied = self
            .applied(id)
            .ok_or_else(|| log_error(format!("session {id} is not kept by this replica")))?;
        let mut record = applied.record.lock().await;
        let Some((lease, length)) = self.acquire(id).await? else {
            session.close();
            return Ok(None);
        };
        let caught_up = match length.cmp(&record.length) {
            std::cmp::Ordering::Equal => Ok(true),
            std::cmp::Ordering::Greater => self.catch_up(session, state, &mut record).await,
            std::cmp::Ordering::Less => Err(log_error(format!(
                "session {id} has {length} entries in the store, fewer than the {} this \
                 replica applied: the store lost acknowledged changes",
                record.length
            ))),
        };
        match caught_up {
            Ok(true) => {}
            other => {
                let store = self.store.clone();
                tokio::spawn(async move { store.release(&lease).await });
                return other.map(|_| None);
            }
        }
        record.held = Some(lease.clone());
        drop(record);
        Ok(Some(held::keep(self.store.clone(), applied, lease)))
    }
}
