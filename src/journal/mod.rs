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
mod compact;
mod lock;
mod replay;

pub use codec::Entry;
pub use replay::{Applied, Damage, DoesNotFit, Replayed, apply, restore};

use crate::session::replies::KeySlot;
use crate::session::responses::StoredResponse;
use crate::session::{CommitRecord, LogError, Reward, Session, SessionLog, SessionStore};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
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
            let frames = replay::replay(&path, &mut file, store, &mut space, &mut replayed)?;
            if frames.needs_repair() {
                let mut cut: Vec<Uuid> = replayed.cut.iter().copied().collect();
                cut.sort();
                let damage = replay::repair(&path, &frames, cut)?;
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
}

#[async_trait::async_trait]
impl SessionLog for Journal {
    async fn created(&self, session: &Session) -> Result<(), LogError> {
        let entry = Entry::created(session);
        self.append(&entry).map_err(log_error)
    }

    async fn deleted(&self, session: Uuid) -> Result<(), LogError> {
        self.append(&Entry::Deleted { id: session })
            .map_err(log_error)
    }

    async fn committed(&self, session: Uuid, record: &CommitRecord) -> Result<(), LogError> {
        self.append_with(session, false, |out| {
            codec::encode_commit(session, record, out)
        })
        .map_err(log_error)
    }

    async fn relabelled(
        &self,
        session: Uuid,
        node: usize,
        label: &'static str,
    ) -> Result<(), LogError> {
        let entry = Entry::relabelled(session, node, label);
        self.append(&entry).map_err(log_error)
    }

    async fn replied(&self, session: Uuid, key: &str, slot: &KeySlot) -> Result<(), LogError> {
        match Entry::replied(session, key, slot) {
            Some(entry) => self.append(&entry).map_err(log_error),
            None => Ok(()),
        }
    }

    async fn rewarded(&self, session: Uuid, reward: &Reward) -> Result<(), LogError> {
        self.append(&Entry::rewarded(session, reward))
            .map_err(log_error)
    }

    async fn stored(
        &self,
        session: Uuid,
        response_id: &str,
        response: &StoredResponse,
    ) -> Result<(), LogError> {
        self.append(&Entry::stored(session, response_id, response))
            .map_err(log_error)
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

#[cfg(test)]
mod tests;
