//! Durability (`serve --data-dir DIR`): every session creation, committed turn and deletion is
//! appended to a journal before the reply (or a stream's final event) is sent, and a restart
//! replays it into the very same sessions.
//!
//! The journal is one append-only file of frames: the payload's length (u32), its XXH3
//! checksum (u64), the payload (an [`Entry`], [`codec`]). A turn is journaled as the
//! [`crate::session::CommitRecord`] the session applies, so replaying applies exactly what was
//! applied. A write completes into the operating system before the reply, which a `kill -9`
//! cannot undo (only a power loss could; `sync` is called when the proxy drains). A write
//! that fails (a full disk) is cut off again before the turn is refused: a record is either
//! wholly in the file and acknowledged, or not there at all. A frame cut short by a crash
//! mid-write is dropped at the next start; damage mid-file is skipped over without losing the
//! frames after it (see [`replay`]). Deleted sessions' frames are garbage: the file is
//! compacted at start and whenever garbage outweighs live data, by copying the live frames
//! aside while appends go on, then taking the few frames appended meanwhile under the lock and
//! renaming. One process at a time opens a data directory ([`lock`]).

pub mod codec;
mod lock;
mod replay;

pub use codec::Entry;
pub use replay::{Damage, Replayed, restore};

use crate::session::replies::KeySlot;
use crate::session::responses::StoredResponse;
use crate::session::{CommitRecord, LogError, Reward, Session, SessionLog, SessionStore};
use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use uuid::Uuid;

/// The first bytes of a journal file.
const MAGIC: &[u8; 8] = b"RPJRNL01";
/// A frame's header: length and checksum.
const HEADER: usize = 12;
/// Garbage below this is left alone.
const MIN_GARBAGE: u64 = 64 * 1024 * 1024;
/// The largest payload a frame may have (a turn of a million-token prompt is 4 MiB).
const MAX_FRAME: usize = 1 << 30;

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
    /// Another process has the data directory open.
    #[error("data directory {dir} is in use by {holder}")]
    Locked {
        /// The directory.
        dir: PathBuf,
        /// Who holds it, as its lock file says.
        holder: String,
    },
    /// An entry too large for a frame.
    #[error("journal entry of {bytes} bytes exceeds the largest frame ({MAX_FRAME} bytes)")]
    TooLarge {
        /// Its size.
        bytes: usize,
    },
}

/// The journal of one data directory.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: Mutex<Appender>,
    /// Bytes of live data and of garbage, and the sessions whose frames are garbage.
    space: Mutex<Space>,
    /// Held while compacting (one at a time).
    compacting: Mutex<()>,
    /// Damage repaired at start-up (reported by `/health`).
    damage: Option<Damage>,
    /// The data directory's lock, held while the journal is open.
    _lock: lock::DirLock,
}

/// The journal file, written at the end of its last whole frame.
#[derive(Debug)]
struct Appender {
    file: File,
    /// Where the last whole frame ends: the next is written here.
    end: u64,
}

impl Appender {
    /// Writes `frame` after the last whole frame; a write that fails is cut off again, so a
    /// refused record leaves no byte (were the cut to fail too, the next frame is written
    /// over it all the same: every write starts at `end`).
    fn append(&mut self, frame: &[u8]) -> std::io::Result<()> {
        match self.file.write_all_at(frame, self.end) {
            Ok(()) => {
                self.end += frame.len() as u64;
                Ok(())
            }
            Err(error) => {
                if let Err(cut) = self.file.set_len(self.end) {
                    tracing::error!(%cut, "journal: cutting off a failed write failed");
                }
                Err(error)
            }
        }
    }
}

#[derive(Debug, Default)]
struct Space {
    /// Bytes of each live session's frames.
    live: HashMap<Uuid, u64>,
    live_bytes: u64,
    garbage_bytes: u64,
    /// Sessions deleted since the last compaction, with the bytes their frames took.
    dead: HashMap<Uuid, u64>,
}

impl Journal {
    /// Opens (or creates) the journal in `dir`, locking the directory, and replays it into
    /// `store`; repairs damage, and compacts it when it holds more garbage than live data.
    pub fn open(dir: &Path, store: &SessionStore) -> Result<(Self, Replayed), JournalError> {
        std::fs::create_dir_all(dir).map_err(|source| JournalError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let lock = lock::DirLock::acquire(dir)?;
        let path = dir.join("journal");
        let io = |source| JournalError::Io {
            path: path.clone(),
            source,
        };
        let mut file = open_or_create(&path)?;
        let mut space = Space::default();
        let mut replayed = Replayed::default();
        let length = file.metadata().map_err(io)?.len();
        let end = if length == 0 {
            file.write_all(MAGIC).map_err(io)?;
            MAGIC.len() as u64
        } else {
            let frames =
                replay::replay(&path, &mut file, length, store, &mut space, &mut replayed)?;
            if frames.needs_repair() {
                let mut cut: Vec<Uuid> = replayed.cut.iter().copied().collect();
                cut.sort();
                let damage = repair(&path, &frames, cut)?;
                tracing::error!(
                    regions = damage.regions.len(),
                    bytes = damage.bytes,
                    copy = %damage.copy.display(),
                    "journal: damage mid-file skipped over; the whole frames after it were \
                     kept, and the file as it was is kept aside"
                );
                replayed.damage = Some(damage);
                file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(io)?;
            } else if replayed.dropped_bytes > 0 {
                tracing::warn!(
                    bytes = replayed.dropped_bytes,
                    "journal: a torn last frame was dropped"
                );
                file.set_len(frames.end()).map_err(io)?;
            }
            match &replayed.damage {
                Some(_) => file.metadata().map_err(io)?.len(),
                None => frames.end(),
            }
        };
        let journal = Self {
            path: path.clone(),
            file: Mutex::new(Appender { file, end }),
            space: Mutex::new(space),
            compacting: Mutex::new(()),
            damage: replayed.damage.clone(),
            _lock: lock,
        };
        if journal.worth_compacting(0) {
            journal.compact()?;
        }
        Ok((journal, replayed))
    }

    /// Damage repaired when the journal was opened.
    pub fn damage(&self) -> Option<&Damage> {
        self.damage.as_ref()
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
        if payload_len > MAX_FRAME {
            return Err(JournalError::TooLarge { bytes: payload_len });
        }
        let checksum = xxhash_rust::xxh3::xxh3_64(&frame[HEADER..]);
        frame[..4].copy_from_slice(&(payload_len as u32).to_le_bytes());
        frame[4..HEADER].copy_from_slice(&checksum.to_le_bytes());
        self.file
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .append(&frame)
            .map_err(|source| self.io(source))?;
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
        let file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        file.file.sync_all().map_err(|source| self.io(source))
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
            space.dead.keys().copied().collect()
        };
        let end = self.file.lock().unwrap_or_else(PoisonError::into_inner).end;
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
        let now = file.end;
        source.seek(SeekFrom::Start(end)).map_err(io)?;
        copy_frames(&mut source, &mut out, (end, now), |_| true).map_err(io)?;
        out.flush().map_err(io)?;
        out.get_ref().sync_all().map_err(io)?;
        std::fs::rename(&aside, &self.path).map_err(io)?;
        let reopened = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.path)
            .map_err(io)?;
        let end = reopened.metadata().map_err(io)?.len();
        *file = Appender {
            file: reopened,
            end,
        };
        let mut space = self.space.lock().unwrap_or_else(PoisonError::into_inner);
        space.garbage_bytes = space
            .garbage_bytes
            .saturating_sub(end - MAGIC.len() as u64 - kept);
        space.dead.retain(|id, _| !dead.contains(id));
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
        let previous = response.previous.as_ref();
        let entry = Entry::Stored {
            id: session,
            response_id: response_id.to_string(),
            previous: previous.and_then(|p| p.body["id"].as_str().map(str::to_string)),
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

    fn recovered(&self) -> Option<serde_json::Value> {
        self.damage
            .as_ref()
            .and_then(|d| serde_json::to_value(d).ok())
    }
}

/// The file at `path`, for reading and writing, created when missing.
fn open_or_create(path: &Path) -> Result<File, JournalError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|source| JournalError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// Keeps the damaged file aside and rewrites the journal from the frames applied only.
fn repair(
    path: &Path,
    frames: &replay::Frames,
    sessions_cut: Vec<Uuid>,
) -> Result<Damage, JournalError> {
    let io = |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    };
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ");
    let copy = path.with_file_name(format!("journal.damaged-{stamp}"));
    std::fs::copy(path, &copy).map_err(io)?;
    let aside = path.with_extension("repairing");
    let mut out = BufWriter::new(File::create(&aside).map_err(io)?);
    out.write_all(MAGIC).map_err(io)?;
    let mut source = BufReader::new(File::open(path).map_err(io)?);
    for &(start, end) in &frames.runs {
        source.seek(SeekFrom::Start(start)).map_err(io)?;
        std::io::copy(&mut (&mut source).take(end - start), &mut out).map_err(io)?;
    }
    out.flush().map_err(io)?;
    out.get_ref().sync_all().map_err(io)?;
    std::fs::rename(&aside, path).map_err(io)?;
    Ok(Damage {
        bytes: frames.damaged.iter().map(|(_, bytes)| bytes).sum(),
        regions: frames.damaged.clone(),
        frames_not_applied: frames.not_applied,
        sessions_cut,
        copy,
    })
}

fn log_error(error: JournalError) -> LogError {
    LogError(error.to_string())
}

impl Space {
    fn add(&mut self, session: Uuid, bytes: u64, deleted: bool) {
        // A session deleted and then written again (only a damaged or doctored journal does
        // that: ids are random) lives again, its earlier frames with it: compaction keeps what
        // replay applies.
        if let Some(revived) = self.dead.remove(&session) {
            self.garbage_bytes = self.garbage_bytes.saturating_sub(revived);
            self.live.insert(session, revived);
            self.live_bytes += revived;
        }
        let held = self.live.entry(session).or_default();
        *held += bytes;
        self.live_bytes += bytes;
        if deleted {
            let freed = self.live.remove(&session).unwrap_or(0);
            self.live_bytes -= freed;
            self.garbage_bytes += freed;
            self.dead.insert(session, freed);
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
        if len > MAX_FRAME || at + (HEADER + len) as u64 > to {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "a frame overruns the stretch being copied",
            ));
        }
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
                // From seed 10 on, a call of the turn before came back changed.
                echoed_calls: match seed >= 10 {
                    true => vec![crate::session::EchoChange {
                        id: "toolu_0".into(),
                        change: "defaults",
                        keys: vec!["+replace_all".into()],
                    }],
                    false => Vec::new(),
                },
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
                    // Seed 8 and 11 on: recognisable when handed back changed.
                    echo: (seed == 8 || seed >= 11).then(|| crate::session::EchoKey {
                        canonical_hash: 5,
                        text_hash: 6,
                        default_keys: vec!["opts.verbose".into()],
                    }),
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
        for seed in [7, 8, 9, 10, 11, 12] {
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

    /// A scratch folder under the build's.
    fn scratch(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target/tmp")
            .join(format!("{name}-{}", Uuid::new_v4()))
    }

    /// A journal of a few sessions with turns, one deleted: its bytes and its entries.
    fn written_journal() -> (Vec<u8>, Vec<Entry>) {
        let dir = scratch("journal-source");
        let store = SessionStore::default();
        let (journal, _) = Journal::open(&dir, &store).unwrap();
        let mut entries = Vec::new();
        for i in 0..6u32 {
            let id = Uuid::new_v4();
            entries.push(Entry::Created {
                id,
                options: SessionOptions::default(),
                created_at: f64::from(i),
            });
            for t in 0..3 {
                let record = turn((t > 0).then_some(0), i * 10 + t);
                entries.push(Entry::Committed { id, record });
            }
            if i == 2 {
                entries.push(Entry::Deleted { id });
            }
        }
        for entry in &entries {
            journal.append(entry).unwrap();
        }
        drop(journal);
        let bytes = std::fs::read(dir.join("journal")).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        (bytes, entries)
    }

    /// Each frame's byte range in a whole journal.
    fn frame_ranges(bytes: &[u8]) -> Vec<(usize, usize)> {
        let mut at = MAGIC.len();
        let mut ranges = Vec::new();
        while at < bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            ranges.push((at, at + HEADER + len));
            at += HEADER + len;
        }
        ranges
    }

    /// One session's nodes as text (`None`: not there).
    fn session_text(store: &SessionStore, id: Uuid) -> Option<String> {
        snapshot(store)
            .into_iter()
            .find(|(known, _)| *known == id)
            .map(|(_, text)| text)
    }

    /// The session's nodes after each prefix of its own entries: `[0]` before any, then after
    /// each one.
    fn states_of(entries: &[Entry], id: Uuid) -> Vec<Option<String>> {
        let store = SessionStore::default();
        let mut replayed = Replayed::default();
        let mut states = vec![None];
        for entry in entries.iter().filter(|e| e.session() == id) {
            restore(&store, entry.clone(), &mut replayed);
            states.push(session_text(&store, id));
        }
        states
    }

    /// Random cuts and flipped bytes: every record before the damage is kept; every session no
    /// damage touched comes back whole (records after the damage included); a session whose
    /// record was lost comes back as it stood just before that record (its deletion, when
    /// whole, still applies), never as a state it never had.
    #[test]
    fn replay_keeps_every_whole_frame_and_invents_none() {
        use rand::{Rng, SeedableRng};
        let (bytes, entries) = written_journal();
        let ranges = frame_ranges(&bytes);
        assert_eq!(ranges.len(), entries.len());
        let mut ids: Vec<Uuid> = entries.iter().map(Entry::session).collect();
        ids.dedup();
        let states: Vec<Vec<Option<String>>> =
            ids.iter().map(|&id| states_of(&entries, id)).collect();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(30);
        for case in 0..300 {
            let mut damaged = bytes.clone();
            // Which frames the damage leaves whole.
            let intact: Vec<bool> = match case % 3 {
                // A crash mid-write: the file cut anywhere after its magic.
                0 => {
                    let cut = rng.random_range(MAGIC.len()..bytes.len());
                    damaged.truncate(cut);
                    ranges.iter().map(|&(_, end)| end <= cut).collect()
                }
                // One flipped byte, or a few in a row, anywhere in the frames.
                _ => {
                    let at = rng.random_range(MAGIC.len()..bytes.len());
                    let span = match case % 3 {
                        1 => 1,
                        _ => rng.random_range(1..=24).min(bytes.len() - at),
                    };
                    for byte in &mut damaged[at..at + span] {
                        *byte ^= rng.random_range(1..=255u8);
                    }
                    ranges
                        .iter()
                        .map(|&(start, end)| end <= at || start >= at + span)
                        .collect()
                }
            };
            let dir = scratch("journal-damaged");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("journal"), &damaged).unwrap();
            let restored = SessionStore::default();
            let (journal, replayed) = Journal::open(&dir, &restored).unwrap();
            for (id, states) in ids.iter().zip(&states) {
                let own: Vec<(&Entry, bool)> = entries
                    .iter()
                    .zip(&intact)
                    .filter(|(entry, _)| entry.session() == *id)
                    .map(|(entry, whole)| (entry, *whole))
                    .collect();
                let expected = match own.iter().position(|(_, whole)| !whole) {
                    None => states.last().unwrap().clone(),
                    Some(_)
                        if own
                            .iter()
                            .any(|(e, whole)| *whole && matches!(e, Entry::Deleted { .. })) =>
                    {
                        None
                    }
                    Some(lost) => states[lost].clone(),
                };
                assert_eq!(
                    session_text(&restored, *id),
                    expected,
                    "case {case}, session {id}"
                );
            }
            assert_eq!(restored.len(), snapshot(&restored).len());
            // Damage with whole frames after it is kept aside, never deleted; a cut is a torn
            // tail, dropped.
            let after_damage = intact
                .iter()
                .skip_while(|whole| **whole)
                .any(|whole| *whole);
            if after_damage {
                assert!(replayed.damage.is_some(), "case {case}");
            }
            if case % 3 == 0 {
                assert!(replayed.damage.is_none(), "case {case}");
            }
            // A cut between two frames leaves a shorter journal, nothing to notice.
            let cut_between = case % 3 == 0 && ranges.iter().any(|&(_, end)| end == damaged.len());
            let lost = intact.iter().any(|whole| !whole) && !cut_between;
            assert_eq!(
                replayed.damage.is_some() || replayed.dropped_bytes > 0,
                lost,
                "case {case}"
            );
            if let Some(damage) = &replayed.damage {
                assert_eq!(std::fs::read(&damage.copy).unwrap(), damaged, "case {case}");
            }
            // Appends go on after the repair, and a second start finds the journal clean.
            let session = restored.create(SessionOptions::default()).unwrap();
            journal.created(&session).unwrap();
            drop(journal);
            let again = SessionStore::default();
            let (_, replayed) = Journal::open(&dir, &again).unwrap();
            assert!(
                replayed.damage.is_none() && replayed.dropped_bytes == 0,
                "case {case}"
            );
            assert_eq!(snapshot(&again), snapshot(&restored), "case {case}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn a_length_beyond_the_file_allocates_nothing() {
        let dir = scratch("journal-lengths");
        std::fs::create_dir_all(&dir).unwrap();
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[0xFF; 16]);
        std::fs::write(dir.join("journal"), &bytes).unwrap();
        let store = SessionStore::default();
        let (_, replayed) = Journal::open(&dir, &store).unwrap();
        assert_eq!(
            replayed.dropped_bytes, 16,
            "a torn tail: nothing follows it"
        );
        assert_eq!(store.len(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Found by fuzzing: a session deleted and then created again (a damaged journal can say
    /// so) must come back from the compacted journal as replay restored it.
    #[test]
    fn a_session_written_again_after_its_deletion_survives_compaction() {
        let dir = scratch("journal-revived");
        let store = SessionStore::default();
        let (journal, _) = Journal::open(&dir, &store).unwrap();
        let id = Uuid::new_v4();
        let created = Entry::Created {
            id,
            options: SessionOptions::default(),
            created_at: 1.0,
        };
        for entry in [
            created.clone(),
            Entry::Deleted { id },
            created,
            Entry::Committed {
                id,
                record: turn(None, 3),
            },
        ] {
            journal.append(&entry).unwrap();
        }
        drop(journal);
        let restored = SessionStore::default();
        let (journal, _) = Journal::open(&dir, &restored).unwrap();
        journal.compact().unwrap();
        drop(journal);
        let again = SessionStore::default();
        Journal::open(&dir, &again).unwrap();
        assert_eq!(restored.len(), 1);
        assert_eq!(snapshot(&again), snapshot(&restored));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
