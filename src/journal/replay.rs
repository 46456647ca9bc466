//! Reading a journal back at start-up: every whole frame is applied to the session store, in
//! order; damage is told apart by what follows it.
//!
//! - **A torn tail**: the last frame runs past the end of the file, and nothing valid follows
//!   where it starts. A crash cut the last write short; its bytes were never acknowledged, and
//!   they are cut off.
//! - **Damage**: any other bad frame (a flipped byte, a bad length), mid-file or last. The
//!   frames after it were acknowledged: replay resynchronises on the next frame whose checksum
//!   holds and goes on. The session of the lost frame (when its id can still be read) stops
//!   there: its later records build on the lost one, and are not applied; nor is any record
//!   that does not fit its session as restored so far ([`crate::session::fits`]). The file as
//!   it was is kept aside (`journal.damaged-TIME`), the journal is rewritten from the frames
//!   applied, and the damage is logged and reported by `/health`.
//!
//! A frame's length is checked against what is left of the file and [`MAX_FRAME`] before
//! anything is read or allocated for it.

use super::codec::{self, Entry};
use super::{HEADER, JournalError, MAGIC, MAX_FRAME, Space};
use crate::session::replies::{KeySlot, RecordedReply};
use crate::session::responses::StoredResponse;
use crate::session::{Reward, Session, SessionState, SessionStore};
use serde::Serialize;
use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read as _, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use uuid::Uuid;

/// What a start found in the journal.
#[derive(Debug, Clone, Default)]
pub struct Replayed {
    /// Sessions restored.
    pub sessions: usize,
    /// Turns applied.
    pub turns: usize,
    /// Bytes of a torn last frame dropped.
    pub dropped_bytes: u64,
    /// Damage found mid-file, if any.
    pub damage: Option<Damage>,
    /// Sessions cut short at damage: their later records are not applied.
    pub cut: HashSet<uuid::Uuid>,
}

/// Damage found at start-up: unreadable stretches skipped over to reach the whole frames
/// after them, and the sessions cut short there.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Damage {
    /// Unreadable stretches of the file, each as (offset, bytes).
    pub regions: Vec<(u64, u64)>,
    /// Their bytes in all.
    pub bytes: u64,
    /// Whole frames not applied: records of sessions cut short.
    pub frames_not_applied: usize,
    /// The sessions cut short (their records from the damage on are in the copy only).
    pub sessions_cut: Vec<uuid::Uuid>,
    /// Where the file as it was before the repair is kept.
    pub copy: PathBuf,
}

/// What replay found in a journal file: where the frames it applied lie, in order.
#[derive(Debug, Default)]
pub(super) struct Frames {
    /// Runs of consecutive frames applied, each as (start, end).
    pub runs: Vec<(u64, u64)>,
    /// Bad stretches followed by whole frames, each as (offset, bytes).
    pub damaged: Vec<(u64, u64)>,
    /// Whole frames not applied (their session was cut short).
    pub not_applied: usize,
}

impl Frames {
    /// Whether the file holds more than the frames applied (it is then rewritten).
    pub fn needs_repair(&self) -> bool {
        !self.damaged.is_empty() || self.not_applied > 0
    }

    fn keep(&mut self, start: u64, end: u64) {
        match self.runs.last_mut() {
            Some(run) if run.1 == start => run.1 = end,
            _ => self.runs.push((start, end)),
        }
    }

    /// Where the last frame applied ends.
    pub fn end(&self) -> u64 {
        self.runs.last().map_or(MAGIC.len() as u64, |run| run.1)
    }
}

/// Reads every whole frame of `file`, applying each to `store`.
pub(super) fn replay(
    path: &Path,
    file: &mut File,
    store: &SessionStore,
    space: &mut Space,
    replayed: &mut Replayed,
) -> Result<Frames, JournalError> {
    let io = |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    };
    let length = file.metadata().map_err(io)?.len();
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut reader = BufReader::with_capacity(1 << 20, &mut *file);
    let mut magic = [0u8; MAGIC.len()];
    if reader.read_exact(&mut magic).is_err() || &magic != MAGIC {
        return Err(io(std::io::Error::other("not a rollout-proxy journal")));
    }
    let mut frames = Frames::default();
    let mut at = MAGIC.len() as u64;
    let mut header = [0u8; HEADER];
    let mut payload = Vec::new();
    while at < length {
        let read = read_frame(&mut reader, at, length, &mut header, &mut payload).map_err(io)?;
        if read != Read::Whole {
            drop(reader);
            let next = next_frame(file, at + 1, length).map_err(io)?;
            if next.is_none() && read == Read::Short {
                replayed.dropped_bytes = length - at;
                return Ok(frames);
            }
            let next = next.unwrap_or(length);
            frames.damaged.push((at, next - at));
            if let Some(session) = session_at(file, at, next).map_err(io)?
                && store.get(&session.to_string()).is_some()
            {
                replayed.cut.insert(session);
            }
            at = next;
            file.seek(SeekFrom::Start(at)).map_err(io)?;
            reader = BufReader::with_capacity(1 << 20, &mut *file);
            continue;
        }
        let entry = codec::decode(&payload).map_err(|source| JournalError::Corrupt {
            path: path.to_path_buf(),
            source,
        })?;
        let end = at + (HEADER + payload.len()) as u64;
        let session = entry.session();
        match restore(store, entry, replayed) {
            true => {
                space.add(session, end - at, codec::is_deletion(&payload));
                frames.keep(at, end);
            }
            false => frames.not_applied += 1,
        }
        at = end;
    }
    Ok(frames)
}

/// How a frame reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Its length fits in what is left and its checksum holds.
    Whole,
    /// It runs past the end of the file.
    Short,
    /// It fits but its checksum fails, or its length is beyond any frame's.
    Bad,
}

/// Reads the frame at `at` into `header` and `payload`.
fn read_frame(
    reader: &mut impl std::io::Read,
    at: u64,
    length: u64,
    header: &mut [u8; HEADER],
    payload: &mut Vec<u8>,
) -> std::io::Result<Read> {
    if length - at < HEADER as u64 {
        return Ok(Read::Short);
    }
    reader.read_exact(header)?;
    let (len, checksum) = frame_header(header);
    if at + (HEADER + len) as u64 > length {
        return Ok(Read::Short);
    }
    if len > MAX_FRAME {
        return Ok(Read::Bad);
    }
    payload.resize(len, 0);
    reader.read_exact(payload)?;
    Ok(match xxhash_rust::xxh3::xxh3_64(payload) == checksum {
        true => Read::Whole,
        false => Read::Bad,
    })
}

/// A frame header's payload length and checksum.
fn frame_header(header: &[u8; HEADER]) -> (usize, u64) {
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let checksum = u64::from_le_bytes(header[4..].try_into().expect("8 bytes"));
    (len, checksum)
}

/// The session a damaged stretch `[at, end)` names, if its frame's session id lies in it
/// (the byte after the header is the entry's kind, the next sixteen its session).
fn session_at(file: &File, at: u64, end: u64) -> std::io::Result<Option<uuid::Uuid>> {
    let id_at = at + HEADER as u64 + 1;
    if id_at + 16 > end {
        return Ok(None);
    }
    let mut id = [0u8; 16];
    file.read_exact_at(&mut id, id_at)?;
    Ok(Some(uuid::Uuid::from_bytes(id)))
}

/// Bytes of the file looked at per read while resynchronising.
const WINDOW: usize = 1 << 20;

/// Where the first whole, readable frame at or after `from` starts, if one does.
fn next_frame(file: &File, from: u64, length: u64) -> std::io::Result<Option<u64>> {
    let mut window = vec![0u8; WINDOW];
    let mut payload = Vec::new();
    let mut start = from;
    while start + HEADER as u64 <= length {
        let n = (length - start).min(WINDOW as u64) as usize;
        file.read_exact_at(&mut window[..n], start)?;
        // Each offset whose header lies in the window.
        let candidates = n - HEADER + 1;
        for offset in 0..candidates {
            let at = start + offset as u64;
            let header: &[u8; HEADER] = window[offset..offset + HEADER]
                .try_into()
                .expect("HEADER bytes");
            let (len, checksum) = frame_header(header);
            if len > MAX_FRAME || at + (HEADER + len) as u64 > length {
                continue;
            }
            let body = offset + HEADER;
            let bytes = match body + len <= n {
                true => &window[body..body + len],
                false => {
                    payload.resize(len, 0);
                    file.read_exact_at(&mut payload, at + HEADER as u64)?;
                    &payload[..]
                }
            };
            if xxhash_rust::xxh3::xxh3_64(bytes) == checksum && codec::decode(bytes).is_ok() {
                return Ok(Some(at));
            }
        }
        start += candidates as u64;
    }
    Ok(None)
}

/// Applies one entry to the sessions being restored, counting what it restored in `replayed`
/// (public so that another store of the same entries replays them the same way). Returns
/// whether it was applied: an entry of a session cut short is not, nor a turn that does not
/// fit its session (which cuts it short); a deletion always is.
pub fn restore(store: &SessionStore, entry: Entry, replayed: &mut Replayed) -> bool {
    let id = entry.session();
    if replayed.cut.contains(&id) && !matches!(entry, Entry::Deleted { .. }) {
        return false;
    }
    match entry {
        Entry::Created {
            id,
            options,
            created_at,
        } => {
            store.restore(id, options, created_at);
            replayed.sessions += 1;
        }
        Entry::Deleted { id } => {
            if store.remove(&id.to_string()).is_some() {
                replayed.sessions = replayed.sessions.saturating_sub(1);
            }
        }
        entry => {
            let Some(session) = store.get(&id.to_string()) else {
                return true;
            };
            let mut state = session
                .state
                .try_lock()
                .expect("no turn runs during replay");
            match apply(&session, &mut state, entry) {
                Ok(Applied::Turn) => replayed.turns += 1,
                Ok(Applied::Other) => {}
                Err(DoesNotFit) => {
                    tracing::error!(session = %id, "journal: a turn that does not fit its session (an earlier record of it was lost); the session is cut short there");
                    replayed.cut.insert(id);
                    return false;
                }
            }
        }
    }
    true
}

/// What [`apply`] applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// A turn.
    Turn,
    /// Anything else (a label, a kept reply, a reward, a stored response), or nothing (a
    /// creation or deletion, which are the session store's to apply).
    Other,
}

/// A recorded turn does not fit the session it is applied to: a record before it is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a recorded turn does not fit its session")]
pub struct DoesNotFit;

/// Applies one entry of `session` to its locked `state`: a replay, or a session brought up to
/// date with changes made elsewhere (a fleet's other replicas).
pub fn apply(
    session: &Session,
    state: &mut SessionState,
    entry: Entry,
) -> Result<Applied, DoesNotFit> {
    match entry {
        Entry::Created { .. } | Entry::Deleted { .. } => {}
        Entry::Committed { record, .. } => {
            if !crate::session::fits(state, &record) {
                return Err(DoesNotFit);
            }
            session.apply(state, &record);
            return Ok(Applied::Turn);
        }
        Entry::Relabelled { node, label, .. } => state.relabel(node, label),
        Entry::Replied {
            key,
            body_hash,
            status,
            content_type,
            body,
            ..
        } => {
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
        Entry::Rewarded {
            reward,
            metadata,
            rewarded_at,
            ..
        } => session.set_reward(Reward {
            reward,
            metadata: serde_json::from_str(&metadata).unwrap_or_default(),
            rewarded_at,
        }),
        Entry::Stored {
            response_id,
            previous,
            items,
            body,
            ..
        } => restore_stored(session, response_id, previous, &items, &body),
    }
    Ok(Applied::Other)
}

/// Puts back a stored Responses reply, unless what it needs is gone.
fn restore_stored(
    session: &Session,
    response_id: String,
    previous: Option<String>,
    items: &str,
    body: &str,
) {
    let stored = serde_json::from_str(items)
        .ok()
        .zip(serde_json::from_str(body).ok());
    let Some((items, body)) = stored else {
        return;
    };
    // The response it continued was stored before it (and findable then, as it was when the
    // response was made).
    let previous = match previous {
        Some(previous) => match session.responses.get(&previous) {
            Some(found) => Some(found),
            None => {
                tracing::warn!(%response_id, %previous, "journal: a stored response's previous one is gone; it is not restored");
                return;
            }
        },
        None => None,
    };
    let response = StoredResponse {
        previous,
        items,
        body,
    };
    session
        .responses
        .insert(response_id, std::sync::Arc::new(response));
}

/// Keeps the damaged file aside and rewrites the journal from the frames applied only.
pub(super) fn repair(
    path: &Path,
    frames: &Frames,
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
