//! Sessions: one per rollout, each holding its training nodes and sampled completions.
//!
//! Requests on one session are serialised by an async mutex held for the whole turn, so two
//! concurrent calls never interleave their node updates; a turn that fails changes nothing
//! because state is only written after the backend answered.

pub mod blobs;
pub(crate) mod completion;
pub(crate) mod divergences;
mod fetched;
mod ids;
mod log;
pub(crate) mod node;
pub(crate) mod record;
pub(crate) mod replies;
pub(crate) mod responses;
mod reward;

pub use blobs::Blobs;
pub use completion::{
    CompletionId, CompletionRecord, ConversationDigest, EchoKey, IssuedToolCall,
    message_fingerprint,
};
pub use fetched::{FETCHED_BYTES, FetchedImages};
pub use ids::Span;
pub use log::{LockedSession, LogError, SessionHold, SessionLog};
pub use node::{Divergence, EchoChange, HealedCall, HistoryEntry, Node, SegmentCheck, TurnRecord};
pub use record::{Api, CommitRecord, RecordedChoice, Start, TurnLabels, apply, fits};
pub use reward::Reward;

use crate::chat::SentConversation;
use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use uuid::Uuid;

/// How earlier assistant turns are put into the next prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HistoryMode {
    /// Reuse exactly the ids the model sampled (one node per rollout). The default.
    #[default]
    Sampled,
    /// Follow the chat template: when it re-renders an earlier turn differently from what was
    /// sampled (Qwen3 drops old `<think>` blocks), start a new node and record why.
    Template,
}

/// Options chosen at `POST /sessions/create`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionOptions {
    /// How the model writes tool calls (resolved once, when the session is created).
    pub tool_parser: crate::tools::ToolFormat,
    /// Keep every completion as its own node with a reference to its parent.
    pub track_tree: bool,
    /// Send every turn to this backend.
    pub base_url: Option<String>,
    /// How earlier assistant turns are put into the next prompt.
    pub history: HistoryMode,
    /// Return `<think>` blocks as `reasoning_content`.
    pub reasoning: bool,
    /// Sample with this LoRA adapter (the name the servers serve it under).
    #[serde(default)]
    pub adapter: Option<Arc<str>>,
    /// Record the experts each position was routed to (mixture-of-experts models on servers
    /// started to report them), for routing replay in training.
    #[serde(default)]
    pub routed_experts: bool,
}

/// The mutable part of a session, behind its mutex.
#[derive(Debug, Default)]
pub struct SessionState {
    /// The training nodes, in order of creation.
    pub nodes: Vec<Node>,
    /// Every sampled completion, by [`CompletionId`].
    pub completions: Vec<CompletionRecord>,
    /// Assistant-message fingerprint → completions that answer to it.
    pub by_fingerprint: HashMap<u64, Vec<CompletionId>>,
    /// Completion → the node that ends with it (the node a request continuing it extends).
    pub tail_of: HashMap<CompletionId, usize>,
    /// Tool calls returned so far: the next call's id is `call_{issued_calls}`.
    pub issued_calls: usize,
    /// Turns that could not extend a node, and where they parted from the closest one.
    pub divergences: divergences::Divergences,
    /// The conversation each completion was sampled after (in memory only: after a restart
    /// the next turn renders in full once).
    pub sampled_after: HashMap<CompletionId, ConversationDigest>,
    /// Tail-only renders so far (every sixteenth is checked against a full render).
    pub tail_renders: AtomicU64,
}

impl SessionState {
    /// Sets the nudge label of `node`'s last turn (how a nudge retry went).
    pub fn relabel(&mut self, node: usize, label: &'static str) {
        if let Some(turn) = self.nodes.get_mut(node).and_then(|n| n.turns.last_mut()) {
            turn.nudge = Some(label);
        }
    }
}

/// One rollout's session.
#[derive(Debug)]
pub struct Session {
    /// The id in the session's URL.
    pub id: Uuid,
    /// What was chosen at creation.
    pub options: SessionOptions,
    /// Creation time, seconds since the epoch.
    pub created_at: f64,
    last_accessed_ms: AtomicU64,
    num_nodes: AtomicUsize,
    /// The backend the session's last turn ran on (its prefix cache is there).
    backend: std::sync::Mutex<Option<Arc<str>>>,
    /// Shared so a streamed turn can hold the lock in the task that drives it.
    pub state: Arc<tokio::sync::Mutex<SessionState>>,
    /// Responses API replies kept for `previous_response_id`.
    pub responses: responses::ResponseStore,
    /// Replies kept by `Idempotency-Key`.
    pub replies: replies::Replies,
    /// The rollout's reward, once given.
    reward: std::sync::Mutex<Option<Reward>>,
    /// Removed from the store (deleted, expired, exported): a turn that was waiting for the
    /// lock must not write into it.
    closed: AtomicBool,
    /// Bumped by `POST /{uuid}/abort`; a turn at the backend watches it.
    aborts: tokio::sync::watch::Sender<u64>,
    /// The conversation of the last body a turn's API read on the session (a
    /// `SentConversation` of what that API reads from each element): the next one, which
    /// resends it, is read only from where it is new.
    sent: std::sync::Mutex<Option<Arc<dyn std::any::Any + Send + Sync>>>,
    /// The images fetched for its conversation, by URL.
    pub fetched: std::sync::Mutex<FetchedImages>,
}

impl Session {
    /// The conversation of the last body read on the session, if it was kept and was read
    /// into `T`s (by the same API).
    pub fn sent<T: Send + Sync + 'static>(&self) -> Option<Arc<SentConversation<T>>> {
        let sent = self.sent.lock().ok()?.clone()?;
        sent.downcast().ok()
    }

    /// Keeps `conversation` as the last one read (or forgets the last one).
    fn remember_sent<T: Send + Sync + 'static>(&self, conversation: Option<SentConversation<T>>) {
        if let Ok(mut sent) = self.sent.lock() {
            *sent = conversation.map(|c| Arc::new(c) as Arc<dyn std::any::Any + Send + Sync>);
        }
    }

    /// Reads `body`, whose conversation is the array under its top-level `key`, with `read`:
    /// given bytes and the elements already read (`T` each), `read` parses the bytes and
    /// returns its outcome with every element's reading, the known ones first. When the body
    /// resends the conversation this session kept, `read` gets the body without the known
    /// elements; when that fails, or the body resends nothing, the whole body. Either way the
    /// session keeps this body's conversation for the next (`chat::resent`).
    pub fn read_resending<T, R, E>(
        &self,
        body: &[u8],
        key: &str,
        read: impl Fn(&[u8], &[T]) -> Result<(R, Vec<T>), E>,
    ) -> Result<R, E>
    where
        T: Send + Sync + 'static,
    {
        let sent = self.sent::<T>();
        if let Some(resent) = sent.as_deref().and_then(|sent| sent.resent_in(body))
            && let Ok((outcome, elements)) = read(&resent.rest, resent.known())
        {
            self.remember_sent(resent.remember(body, elements));
            return Ok(outcome);
        }
        let (outcome, elements) = read(body, &[])?;
        self.remember_sent(SentConversation::keep(body, key, elements));
        Ok(outcome)
    }

    fn new(options: SessionOptions) -> Self {
        let now = now_seconds();
        Self {
            id: Uuid::new_v4(),
            options,
            created_at: now,
            last_accessed_ms: AtomicU64::new((now * 1000.0) as u64),
            num_nodes: AtomicUsize::new(0),
            backend: std::sync::Mutex::new(None),
            state: Arc::new(tokio::sync::Mutex::new(SessionState::default())),
            responses: Default::default(),
            replies: Default::default(),
            reward: std::sync::Mutex::new(None),
            closed: AtomicBool::new(false),
            sent: std::sync::Mutex::new(None),
            fetched: Default::default(),
            aborts: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Marks the session as used now.
    pub fn touch(&self) {
        self.last_accessed_ms
            .store((now_seconds() * 1000.0) as u64, Ordering::Relaxed);
    }

    /// When it was last used, seconds since the epoch.
    pub fn last_accessed(&self) -> f64 {
        self.last_accessed_ms.load(Ordering::Relaxed) as f64 / 1000.0
    }

    /// Node count as of the last committed turn (readable without the lock).
    pub fn num_nodes(&self) -> usize {
        self.num_nodes.load(Ordering::Relaxed)
    }

    /// The backend of the session's last turn.
    pub fn backend(&self) -> Option<Arc<str>> {
        self.backend.lock().expect("session backend lock").clone()
    }

    /// Remembers the backend a turn ran on.
    pub fn set_backend(&self, base_url: Arc<str>) {
        *self.backend.lock().expect("session backend lock") = Some(base_url);
    }

    /// Records the node count after a commit.
    pub fn set_num_nodes(&self, n: usize) {
        self.num_nodes.store(n, Ordering::Relaxed);
    }

    /// The rollout's reward, once given.
    pub fn reward(&self) -> Option<Reward> {
        self.reward.lock().expect("session reward lock").clone()
    }

    /// Keeps the rollout's reward (a later one replaces it).
    pub fn set_reward(&self, reward: Reward) {
        *self.reward.lock().expect("session reward lock") = Some(reward);
    }

    /// What a turn at the backend watches: it changes when the session's turn is aborted.
    pub fn abort_signal(&self) -> tokio::sync::watch::Receiver<u64> {
        self.aborts.subscribe()
    }

    /// Aborts the turn at the backend, if there is one; returns whether there was.
    pub fn abort(&self) -> bool {
        let watched = self.aborts.receiver_count() > 0;
        self.aborts.send_modify(|n| *n += 1);
        watched
    }

    /// Closes the session: a turn waiting for it writes nothing (the record it is kept in
    /// has it no more).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Whether the session was removed from its store.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// Seconds since the Unix epoch.
pub fn now_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Bounds on the sessions a store holds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SessionLimits {
    /// Most live sessions; creating one more is refused.
    pub max_sessions: Option<usize>,
    /// A session idle this long is expired.
    pub ttl: Option<std::time::Duration>,
}

/// Ids of expired sessions remembered, so their routes can say why they are gone.
const EXPIRED_KEPT: usize = 65_536;

/// Why a session cannot be created.
#[derive(Debug, thiserror::Error)]
#[error("the proxy holds its limit of {max} sessions (--max-sessions); delete finished ones")]
pub struct StoreFull {
    /// The limit.
    pub max: usize,
}

/// All live sessions.
#[derive(Debug, Default)]
pub struct SessionStore {
    sessions: DashMap<Uuid, Arc<Session>>,
    limits: SessionLimits,
    /// Live sessions, counted exactly (the limit holds under concurrent creates).
    live: AtomicUsize,
    /// Sessions expired lately, oldest first.
    expired: std::sync::Mutex<std::collections::VecDeque<Uuid>>,
}

impl SessionStore {
    /// An empty store with these limits.
    pub fn new(limits: SessionLimits) -> Self {
        Self {
            limits,
            ..Self::default()
        }
    }

    /// Its limits.
    pub fn limits(&self) -> SessionLimits {
        self.limits
    }

    /// A new session with `options`, unless the store is full.
    pub fn create(&self, options: SessionOptions) -> Result<Arc<Session>, StoreFull> {
        let max = self.limits.max_sessions.unwrap_or(usize::MAX);
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |live| {
                (live < max).then_some(live + 1)
            })
            .map_err(|_| StoreFull { max })?;
        let session = Arc::new(Session::new(options));
        self.sessions.insert(session.id, session.clone());
        Ok(session)
    }

    /// Puts back a session the journal holds, under its own id and creation time.
    pub fn restore(&self, id: Uuid, options: SessionOptions, created_at: f64) -> Arc<Session> {
        let mut session = Session::new(options);
        session.id = id;
        session.created_at = created_at;
        let session = Arc::new(session);
        if self.sessions.insert(id, session.clone()).is_none() {
            self.live.fetch_add(1, Ordering::AcqRel);
        }
        session
    }

    /// Removes every session idle for longer than the store's time to live whose turn is not
    /// under way; returns their ids.
    pub fn expire_idle(&self) -> Vec<Uuid> {
        let Some(ttl) = self.limits.ttl else {
            return Vec::new();
        };
        let before = now_seconds() - ttl.as_secs_f64();
        let idle: Vec<Uuid> = self
            .sessions
            .iter()
            .filter(|s| s.last_accessed() < before && s.state.try_lock().is_ok())
            .map(|s| s.id)
            .collect();
        let mut expired = Vec::new();
        for id in idle {
            if let Some((_, session)) = self.sessions.remove(&id) {
                session.closed.store(true, Ordering::Release);
                self.live.fetch_sub(1, Ordering::AcqRel);
                let mut remembered = self.expired.lock().unwrap_or_else(|e| e.into_inner());
                if remembered.len() == EXPIRED_KEPT {
                    remembered.pop_front();
                }
                remembered.push_back(id);
                expired.push(id);
            }
        }
        expired
    }

    /// Whether the session `id` was expired for idling (lately: the last 65,536 are known).
    pub fn was_expired(&self, id: &str) -> bool {
        let Ok(id) = Uuid::parse_str(id) else {
            return false;
        };
        let remembered = self.expired.lock().unwrap_or_else(|e| e.into_inner());
        remembered.iter().rev().any(|known| *known == id)
    }

    /// The session with this id; `None` for unknown or malformed ids.
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        let id = Uuid::parse_str(id).ok()?;
        self.sessions.get(&id).map(|s| s.clone())
    }

    /// Removes the session `id`, if there is one, and closes it: a turn still waiting for its
    /// lock finds it closed and writes nothing.
    pub fn remove(&self, id: &str) -> Option<Arc<Session>> {
        let id = Uuid::parse_str(id).ok()?;
        let (_, session) = self.sessions.remove(&id)?;
        session.closed.store(true, Ordering::Release);
        self.live.fetch_sub(1, Ordering::AcqRel);
        Some(session)
    }

    /// How many sessions are live.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Every session, oldest first.
    pub fn list(&self) -> Vec<Arc<Session>> {
        let mut all: Vec<Arc<Session>> = self.sessions.iter().map(|e| e.value().clone()).collect();
        all.sort_by(|a, b| a.created_at.total_cmp(&b.created_at));
        all
    }
}
