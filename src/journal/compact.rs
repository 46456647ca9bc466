//! Compaction: deleted sessions' frames are garbage; once garbage outweighs live data (past
//! 64 MiB, or at any size at start), the live frames are copied aside while appends go on, the
//! few frames appended meanwhile are taken under the lock, and the copy is renamed over the
//! journal.

use super::{Appender, HEADER, Journal, JournalError, MAGIC, MAX_FRAME, MIN_GARBAGE, codec};
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::sync::PoisonError;
use uuid::Uuid;

impl Journal {
    /// Compacts when deletions have made garbage outweigh live data (and pass 64 MiB).
    pub fn compact_if_worthwhile(&self) -> Result<(), JournalError> {
        if self.worth_compacting(MIN_GARBAGE) {
            self.compact()?;
        }
        Ok(())
    }

    pub(super) fn worth_compacting(&self, floor: u64) -> bool {
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
