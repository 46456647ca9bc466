//! The images sessions hold, kept once each by the SHA-256 of their bytes, so that a trainer
//! can fetch the bytes of an image its node records (`GET /blobs/{sha256}`): in memory, or
//! with `--data-dir` as files in its `blobs/` folder, each written and synced before the
//! journal frame of the first turn that holds it. Images no session refers to any more are
//! dropped ([`Blobs::sweep`]).

use dashmap::DashMap;
use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// Where images are kept.
#[derive(Debug, Default)]
pub struct Blobs {
    memory: DashMap<String, Arc<[u8]>>,
    /// With `--data-dir`: the folder of image files (nothing is kept in memory then).
    dir: Option<PathBuf>,
    /// Images kept since the sweep under way began ([`Blobs::begin_sweep`]): a turn of a
    /// session the sweep did not see may hold them.
    recent: std::sync::Mutex<HashSet<String>>,
}

/// Whether `name` is a SHA-256 in lowercase hex (the only names read or written: a request's
/// name never reaches the file system otherwise).
pub fn is_sha256(name: &str) -> bool {
    name.len() == 64
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Blobs {
    /// Images kept in files in `dir` (made if missing).
    pub fn on_disk(dir: PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Ok(Self {
            dir: Some(dir),
            ..Self::default()
        })
    }

    /// Keeps `bytes` under `sha256` unless kept already; on disk, the file is synced (and its
    /// folder) before this returns.
    pub fn keep(&self, sha256: &str, bytes: &Arc<[u8]>) -> std::io::Result<()> {
        if !is_sha256(sha256) {
            return Err(std::io::Error::other(format!(
                "{sha256:?} is not a SHA-256"
            )));
        }
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.insert(sha256.to_string());
        drop(recent);
        let Some(dir) = &self.dir else {
            self.memory
                .entry(sha256.to_string())
                .or_insert_with(|| bytes.clone());
            return Ok(());
        };
        let path = dir.join(sha256);
        if path.exists() {
            return Ok(());
        }
        let partial = dir.join(format!("{sha256}.partial"));
        let mut file = std::fs::File::create(&partial)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&partial, &path)?;
        std::fs::File::open(dir)?.sync_all()
    }

    /// The bytes kept under `sha256`.
    pub fn get(&self, sha256: &str) -> Option<Arc<[u8]>> {
        if !is_sha256(sha256) {
            return None;
        }
        match &self.dir {
            None => self.memory.get(sha256).map(|bytes| bytes.clone()),
            Some(dir) => std::fs::read(dir.join(sha256)).ok().map(Arc::from),
        }
    }

    /// Starts a sweep: call before reading which images the sessions hold.
    pub fn begin_sweep(&self) {
        self.recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Drops every image not in `referenced` nor kept since [`Blobs::begin_sweep`] (and a file
    /// left half-written by a crash); returns how many.
    pub fn sweep(&self, referenced: &HashSet<&str>) -> std::io::Result<usize> {
        let recent = self
            .recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let keeps = |sha: &str| referenced.contains(sha) || recent.contains(sha);
        let Some(dir) = &self.dir else {
            let before = self.memory.len();
            self.memory.retain(|sha, _| keeps(sha));
            return Ok(before - self.memory.len());
        };
        let mut dropped = 0;
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !keeps(name.as_ref()) {
                std::fs::remove_file(entry.path())?;
                dropped += 1;
            }
        }
        Ok(dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn kept(blobs: &Blobs) {
        blobs.keep(A, &Arc::from(&b"one"[..])).unwrap();
        blobs.keep(B, &Arc::from(&b"two"[..])).unwrap();
        assert_eq!(&*blobs.get(A).unwrap(), b"one");
        assert!(blobs.get("../etc/passwd").is_none());
        assert!(blobs.keep("../x", &Arc::from(&b""[..])).is_err());
        // Kept since the sweep began: kept whatever the sessions hold.
        assert_eq!(blobs.sweep(&HashSet::new()).unwrap(), 0);
        blobs.begin_sweep();
        assert_eq!(blobs.sweep(&HashSet::from([B])).unwrap(), 1);
        assert!(blobs.get(A).is_none());
        assert_eq!(&*blobs.get(B).unwrap(), b"two");
    }

    #[test]
    fn keeps_and_sweeps_in_memory_and_on_disk() {
        kept(&Blobs::default());
        let dir = std::env::temp_dir().join(format!("blobs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        kept(&Blobs::on_disk(dir.clone()).unwrap());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
