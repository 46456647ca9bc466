//! Durability (`serve --data-dir DIR`): every session creation, committed turn and deletion is
//! appended to a journal before the reply (or a stream's final event) is sent, and a restart
//! replays it into the very same sessions.
//!
//! The journal is one append-only file of frames: the payload's length (u32), its XXH3
//! checksum (u64), the payload (an [`Entry`], [`codec`]). A turn is journaled as the
//! [`crate::session::CommitRecord`] the session applies, so replaying applies exactly what was
//! applied. A write completes into the operating system before the reply, which a `kill -9`
//! cannot undo (only a power loss could; `sync` is called when the proxy drains). A frame cut
//! short by a crash mid-write fails its checksum and is dropped at the next start, with
//! everything after it. Deleted sessions' frames are garbage: the file is compacted at start
//! and whenever garbage outweighs live data, by copying the live frames aside while appends
//! go on, then taking the few frames appended meanwhile under the lock and renaming.

pub mod codec;

pub use codec::Entry;

use crate::session::replies::{KeySlot, RecordedReply};
use crate::session::responses::StoredResponse;
use crate::session::{CommitRecord, LogError, Reward, Session, SessionLog, SessionStore};
use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use uuid::Uuid;

/// The first bytes of a journal file.
const MAGIC: &[u8; 8] = b"RPJRNL01";
/// A frame's header: length and checksum.
const HEADER: usize = 12;
/// Garbage below this is left alone.
const MIN_GARBAGE: u64 = 64 * 1024 * 1024;

/// Journal failures.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The file could not be read or written.
    #[error("journal {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A frame whose checksum held could not be decoded (a journal of another format).
    #[error("journal {path}: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What could not be read.
        source: codec::Corrupt,
    },
}

/// The journal of one data directory.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: Mutex<BufWriter<File>>,
    /// Bytes of live data and of garbage, and the sessions whose frames are garbage.
    space: Mutex<Space>,
    /// Held while compacting (one at a time).
    compacting: Mutex<()>,
}

#[derive(Debug, Default)]
struct Space {
    /// Bytes of each live session's frames.
    live: HashMap<Uuid, u64>,
    live_bytes: u64,
    garbage_bytes: u64,
    /// Sessions deleted since the last compaction.
    dead: HashSet<Uuid>,
}

/// What a start found in the journal.
#[derive(Debug, Clone, Copy, Default)]
pub struct Replayed {
    /// Sessions restored.
    pub sessions: usize,
    /// Turns applied.
    pub turns: usize,
    /// Bytes of a torn last frame dropped.
    pub dropped_bytes: u64,
}

impl Journal {
    /// Opens (or creates) the journal in `dir` and replays it into `store`; compacts it when
    /// it holds more garbage than live data.
    pub fn open(dir: &Path, store: &SessionStore) -> Result<(Self, Replayed), JournalError> {
        std::fs::create_dir_all(dir).map_err(|source| JournalError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join("journal");
        let io = |source| JournalError::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        let mut space = Space::default();
        let mut replayed = Replayed::default();
        let length = file.metadata().map_err(io)?.len();
        let good_end = if length == 0 {
            file.write_all(MAGIC).map_err(io)?;
            MAGIC.len() as u64
        } else {
            replay(&path, &mut file, store, &mut space, &mut replayed)?
        };
        if good_end < file.metadata().map_err(io)?.len() {
            replayed.dropped_bytes = file.metadata().map_err(io)?.len() - good_end;
            tracing::warn!(
                bytes = replayed.dropped_bytes,
                "journal: a torn last frame was dropped"
            );
            file.set_len(good_end).map_err(io)?;
        }
        file.seek(SeekFrom::End(0)).map_err(io)?;
        let journal = Self {
            path: path.clone(),
            file: Mutex::new(BufWriter::new(file)),
            space: Mutex::new(space),
            compacting: Mutex::new(()),
        };
        if journal.worth_compacting(0) {
            journal.compact()?;
        }
        Ok((journal, replayed))
    }

    /// Appends `entry`; the entry is in the operating system's hands when this returns.
    pub fn append(&self, entry: &Entry) -> Result<(), JournalError> {
        let deleted = matches!(entry, Entry::Deleted { .. });
        self.append_with(entry.session(), deleted, |out| codec::encode(entry, out))
    }

    /// Appends the entry `encode` writes, of `session` (`deleted`: it deletes the session).
    fn append_with(
        &self,
        session: Uuid,
        deleted: bool,
        encode: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), JournalError> {
        let mut frame = Vec::with_capacity(1024);
        frame.extend_from_slice(&[0; HEADER]);
        encode(&mut frame);
        let payload_len = frame.len() - HEADER;
        let checksum = xxhash_rust::xxh3::xxh3_64(&frame[HEADER..]);
        frame[..4].copy_from_slice(&(payload_len as u32).to_le_bytes());
        frame[4..HEADER].copy_from_slice(&checksum.to_le_bytes());
        {
            let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
            file.write_all(&frame)
                .and_then(|()| file.flush())
                .map_err(|source| self.io(source))?;
        }
        let mut space = self.space.lock().unwrap_or_else(PoisonError::into_inner);
        space.add(session, frame.len() as u64, deleted);
        Ok(())
    }

    /// Compacts when deletions have made garbage outweigh live data (and pass 64 MiB).
    pub fn compact_if_worthwhile(&self) -> Result<(), JournalError> {
        if self.worth_compacting(MIN_GARBAGE) {
            self.compact()?;
        }
        Ok(())
    }

    /// Forces the journal to disk (when the proxy drains).
    pub fn sync(&self) -> Result<(), JournalError> {
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        file.flush()
            .and_then(|()| file.get_ref().sync_all())
            .map_err(|source| self.io(source))
    }

    /// Size of the journal file in bytes.
    pub fn size(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }

    fn io(&self, source: std::io::Error) -> JournalError {
        JournalError::Io {
            path: self.path.clone(),
            source,
        }
    }

    fn worth_compacting(&self, floor: u64) -> bool {
        let space = self.space.lock().unwrap_or_else(PoisonError::into_inner);
        space.garbage_bytes > floor && space.garbage_bytes >= space.live_bytes
    }

    /// Rewrites the journal with the frames of live sessions only.
    pub fn compact(&self) -> Result<(), JournalError> {
        let _one = self
            .compacting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let io = |source| self.io(source);
        // 1. What is garbage, and where the file ends now.
        let dead: HashSet<Uuid> = {
            let space = self.space.lock().unwrap_or_else(PoisonError::into_inner);
            space.dead.clone()
        };
        let end = {
            let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
            file.flush().map_err(io)?;
            file.get_ref().metadata().map_err(io)?.len()
        };
        // 2. The live frames up to there, copied aside while appends go on.
        let aside = self.path.with_extension("compacting");
        let mut out = BufWriter::new(File::create(&aside).map_err(io)?);
        out.write_all(MAGIC).map_err(io)?;
        let mut source = BufReader::new(File::open(&self.path).map_err(io)?);
        source
            .seek(SeekFrom::Start(MAGIC.len() as u64))
            .map_err(io)?;
        let start = MAGIC.len() as u64;
        let kept = copy_frames(&mut source, &mut out, (start, end), |payload| {
            codec::session_of(payload).is_some_and(|id| !dead.contains(&id))
        })
        .map_err(io)?;
        // 3. Under the lock: the frames appended meanwhile, then the new file in place.
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        file.flush().map_err(io)?;
        let now = file.get_ref().metadata().map_err(io)?.len();
        source.seek(SeekFrom::Start(end)).map_err(io)?;
        copy_frames(&mut source, &mut out, (end, now), |_| true).map_err(io)?;
        out.flush().map_err(io)?;
        out.get_ref().sync_all().map_err(io)?;
        std::fs::rename(&aside, &self.path).map_err(io)?;
        let mut reopened = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(io)?;
        reopened.seek(SeekFrom::End(0)).map_err(io)?;
        *file = BufWriter::new(reopened);
        let mut space = self.space.lock().unwrap_or_else(PoisonError::into_inner);
        space.garbage_bytes = space
            .garbage_bytes
            .saturating_sub(end - MAGIC.len() as u64 - kept);
        space.dead.retain(|id| !dead.contains(id));
        tracing::info!(
            before = end,
            after = kept + MAGIC.len() as u64,
            "journal compacted"
        );
        Ok(())
    }
}

impl SessionLog for Journal {
    fn created(&self, session: &Session) -> Result<(), LogError> {
        let entry = Entry::Created {
            id: session.id,
            options: session.options.clone(),
            created_at: session.created_at,
        };
        self.append(&entry).map_err(log_error)
    }

    fn deleted(&self, session: Uuid) -> Result<(), LogError> {
        self.append(&Entry::Deleted { id: session })
            .map_err(log_error)
    }

    fn committed(&self, session: Uuid, record: &CommitRecord) -> Result<(), LogError> {
        self.append_with(session, false, |out| {
            codec::encode_commit(session, record, out)
        })
        .map_err(log_error)
    }

    fn relabelled(&self, session: Uuid, node: usize, label: &'static str) -> Result<(), LogError> {
        let entry = Entry::Relabelled {
            id: session,
            node,
            label,
        };
        self.append(&entry).map_err(log_error)
    }

    fn replied(&self, session: Uuid, key: &str, slot: &KeySlot) -> Result<(), LogError> {
        let Some(reply) = &slot.reply else {
            return Ok(());
        };
        let entry = Entry::Replied {
            id: session,
            key: key.to_string(),
            body_hash: slot.body_hash,
            status: reply.status,
            content_type: reply.content_type.clone(),
            body: reply.body.to_vec(),
        };
        self.append(&entry).map_err(log_error)
    }

    fn rewarded(&self, session: Uuid, reward: &Reward) -> Result<(), LogError> {
        let entry = Entry::Rewarded {
            id: session,
            reward: reward.reward,
            metadata: serde_json::to_string(&reward.metadata).unwrap_or_default(),
            rewarded_at: reward.rewarded_at,
        };
        self.append(&entry).map_err(log_error)
    }

    fn stored(
        &self,
        session: Uuid,
        response_id: &str,
        response: &StoredResponse,
    ) -> Result<(), LogError> {
        let entry = Entry::Stored {
            id: session,
            response_id: response_id.to_string(),
            items: serde_json::to_string(&response.items).unwrap_or_default(),
            body: response.body.to_string(),
        };
        self.append(&entry).map_err(log_error)
    }

    fn tidy(&self) -> Result<(), LogError> {
        self.compact_if_worthwhile().map_err(log_error)
    }

    fn sync(&self) -> Result<(), LogError> {
        Journal::sync(self).map_err(log_error)
    }

    fn bytes(&self) -> Option<u64> {
        Some(self.size())
    }
}

fn log_error(error: JournalError) -> LogError {
    LogError(error.to_string())
}

impl Space {
    fn add(&mut self, session: Uuid, bytes: u64, deleted: bool) {
        let held = self.live.entry(session).or_default();
        *held += bytes;
        self.live_bytes += bytes;
        if deleted {
            let freed = self.live.remove(&session).unwrap_or(0);
            self.live_bytes -= freed;
            self.garbage_bytes += freed;
            self.dead.insert(session);
        }
    }
}

/// Copies the whole frames of `source` from byte `from` (where it is positioned) to byte `to`
/// that `keep` accepts; returns the bytes written.
fn copy_frames(
    source: &mut impl Read,
    out: &mut impl Write,
    (from, to): (u64, u64),
    keep: impl Fn(&[u8]) -> bool,
) -> std::io::Result<u64> {
    let (mut at, mut kept) = (from, 0u64);
    let mut header = [0u8; HEADER];
    let mut payload = Vec::new();
    while at < to {
        source.read_exact(&mut header)?;
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        payload.resize(len, 0);
        source.read_exact(&mut payload)?;
        at += (HEADER + len) as u64;
        if keep(&payload) {
            out.write_all(&header)?;
            out.write_all(&payload)?;
            kept += (HEADER + len) as u64;
        }
    }
    Ok(kept)
}

/// Reads every frame, applying each to `store`; returns where the last whole frame ends.
fn replay(
    path: &Path,
    file: &mut File,
    store: &SessionStore,
    space: &mut Space,
    replayed: &mut Replayed,
) -> Result<u64, JournalError> {
    let mut reader = BufReader::with_capacity(1 << 20, &mut *file);
    let mut magic = [0u8; MAGIC.len()];
    if reader.read_exact(&mut magic).is_err() || &magic != MAGIC {
        return Err(JournalError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::other("not a rollout-proxy journal"),
        });
    }
    let mut at = MAGIC.len() as u64;
    let mut header = [0u8; HEADER];
    let mut payload = Vec::new();
    loop {
        if reader.read_exact(&mut header).is_err() {
            return Ok(at);
        }
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let checksum = u64::from_le_bytes(header[4..].try_into().expect("8 bytes"));
        payload.resize(len, 0);
        if reader.read_exact(&mut payload).is_err()
            || xxhash_rust::xxh3::xxh3_64(&payload) != checksum
        {
            return Ok(at);
        }
        let entry = codec::decode(&payload).map_err(|source| JournalError::Corrupt {
            path: path.to_path_buf(),
            source,
        })?;
        let frame = (HEADER + len) as u64;
        space.add(entry.session(), frame, codec::is_deletion(&payload));
        restore(store, entry, replayed);
        at += frame;
    }
}

/// Applies one entry to the sessions being restored, counting what it restored in `replayed`
/// (public so that another store of the same entries replays them the same way).
pub fn restore(store: &SessionStore, entry: Entry, replayed: &mut Replayed) {
    match entry {
        Entry::Created {
            id,
            options,
            created_at,
        } => {
            store.restore(id, options, created_at);
            replayed.sessions += 1;
        }
        Entry::Committed { id, record } => {
            if let Some(session) = store.get(&id.to_string()) {
                let mut state = session
                    .state
                    .try_lock()
                    .expect("no turn runs during replay");
                session.apply(&mut state, &record);
                replayed.turns += 1;
            }
        }
        Entry::Relabelled { id, node, label } => {
            if let Some(session) = store.get(&id.to_string()) {
                let mut state = session
                    .state
                    .try_lock()
                    .expect("no turn runs during replay");
                state.relabel(node, label);
            }
        }
        Entry::Deleted { id } => {
            if store.remove(&id.to_string()).is_some() {
                replayed.sessions -= 1;
            }
        }
        Entry::Replied {
            id,
            key,
            body_hash,
            status,
            content_type,
            body,
        } => {
            if let Some(session) = store.get(&id.to_string()) {
                let reply = RecordedReply {
                    status,
                    content_type,
                    body: body.into(),
                };
                let slot = KeySlot {
                    body_hash,
                    reply: Some(reply),
                };
                session.replies.restore(&key, slot);
            }
        }
        Entry::Rewarded {
            id,
            reward,
            metadata,
            rewarded_at,
        } => {
            if let Some(session) = store.get(&id.to_string()) {
                session.set_reward(Reward {
                    reward,
                    metadata: serde_json::from_str(&metadata).unwrap_or_default(),
                    rewarded_at,
                });
            }
        }
        Entry::Stored {
            id,
            response_id,
            items,
            body,
        } => {
            let stored = serde_json::from_str(&items)
                .ok()
                .zip(serde_json::from_str(&body).ok());
            if let (Some(session), Some((items, body))) = (store.get(&id.to_string()), stored) {
                let response = StoredResponse { items, body };
                session.responses.insert(response_id, response);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::FinishReason;
    use crate::session::{CommitRecord, RecordedChoice, SessionLog, Start, TurnLabels};
    use crate::session::{SegmentCheck, SessionOptions};

    fn turn(node: Option<usize>, seed: u32) -> CommitRecord {
        CommitRecord {
            start: node.map_or(Start::New { divergence: None }, |node| Start::Extend {
                node,
            }),
            new_prompt: (0..64).map(|i| i + seed).collect(),
            history: Vec::new(),
            next_check: SegmentCheck {
                prefix_len: 1,
                prefix_hash: 2,
                generation_prompt: Some("<think>".into()),
            },
            labels: TurnLabels {
                api: "messages",
                tools_left_out: vec!["web_search".into()],
                nudge: None,
            },
            track_tree: false,
            choices: vec![RecordedChoice {
                token_ids: vec![seed, seed + 1],
                logprobs: vec![-0.25, -0.5],
                finish_reason: FinishReason::Stop,
                stop: Some(crate::generation::StopMatch::Text("###".into())),
                weight_version: Some("v1".into()),
                cached_tokens: Some(3),
                approximate: false,
                end_token_text: Some("<|im_end|>".into()),
                tool_calls: vec![crate::session::IssuedToolCall {
                    id: "toolu_0".into(),
                    call_hash: 9,
                    // From seed 9 on, healed from another format, keyed or not.
                    healed_from: (seed >= 9).then_some("qwen3_coder"),
                }],
                fingerprints: vec![1, 2],
                backend: "b".into(),
            }],
            // Every other turn keyed, so both forms are read back.
            key: seed
                .is_multiple_of(2)
                .then(|| crate::session::replies::TurnKey {
                    key: format!("key-{seed}"),
                    body_hash: u64::from(seed) * 31,
                }),
        }
    }

    /// Every session's nodes, as text, by id: what a restart must reproduce.
    fn snapshot(store: &SessionStore) -> Vec<(Uuid, String)> {
        let mut all: Vec<_> = store
            .list()
            .iter()
            .map(|s| {
                let state = s.state.try_lock().unwrap();
                let nodes: Vec<_> = state
                    .nodes
                    .iter()
                    .map(|n| format!("{:?} {:?}", n.tokens(), n.turns))
                    .collect();
                (s.id, nodes.join("|"))
            })
            .collect();
        all.sort();
        all
    }

    #[test]
    fn entries_read_back_as_written() {
        for seed in [7, 8, 9, 10] {
            let entry = Entry::Committed {
                id: Uuid::new_v4(),
                record: turn(Some(2), seed),
            };
            let mut bytes = Vec::new();
            codec::encode(&entry, &mut bytes);
            assert_eq!(codec::decode(&bytes).unwrap(), entry);
            assert!(codec::decode(&bytes[..bytes.len() - 1]).is_err());
        }
    }

    #[test]
    fn compacting_at_run_time_keeps_every_live_session_and_appends_after_it() {
        // Under the build's folder, like the integration tests' files.
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target/tmp")
            .join(format!("journal-{}", Uuid::new_v4()));
        let store = SessionStore::default();
        let (journal, _) = Journal::open(&dir, &store).unwrap();
        let mut kept = Vec::new();
        for i in 0..40u32 {
            let session = store.create(SessionOptions::default()).unwrap();
            journal
                .append(&Entry::Created {
                    id: session.id,
                    options: session.options.clone(),
                    created_at: session.created_at,
                })
                .unwrap();
            for t in 0..3 {
                let record = turn((t > 0).then_some(0), i * 10 + t);
                journal.committed(session.id, &record).unwrap();
                session.apply(&mut session.state.try_lock().unwrap(), &record);
            }
            if i % 4 == 0 {
                kept.push(session.id);
            } else {
                journal.append(&Entry::Deleted { id: session.id }).unwrap();
                store.remove(&session.id.to_string());
            }
        }
        let before = journal.size();
        journal.compact().unwrap();
        assert!(journal.size() * 3 < before, "{before} → {}", journal.size());
        // Appends go on into the compacted file.
        let last = store.get(&kept[0].to_string()).unwrap();
        let record = turn(Some(0), 999);
        journal.committed(last.id, &record).unwrap();
        last.apply(&mut last.state.try_lock().unwrap(), &record);
        drop(journal);

        let restored = SessionStore::default();
        let (_, replayed) = Journal::open(&dir, &restored).unwrap();
        assert_eq!(replayed.sessions, kept.len());
        assert_eq!(snapshot(&restored), snapshot(&store));
        // Keyed turns come back under their keys.
        let committed = |store: &SessionStore, key: &str| {
            let session = store.get(&kept[0].to_string()).unwrap();
            session.replies.committed(key)
        };
        for key in ["key-0", "key-2"] {
            assert!(committed(&restored, key).is_some(), "{key}");
            assert_eq!(committed(&restored, key), committed(&store, key));
        }
        assert!(
            committed(&restored, "key-1").is_none(),
            "unkeyed turns have no key"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
