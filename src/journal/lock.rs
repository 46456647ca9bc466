//! One process per data directory: the journal's directory is locked (an advisory lock on
//! `DIR/lock`, released by the operating system when the process ends, however it ends), and
//! the lock file names its holder, so a second proxy started on the same `--data-dir` is
//! refused with that name instead of replaying and appending over the first.

use super::JournalError;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// The held lock of a data directory (released when dropped).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Locks `dir`, or says which process holds it.
    pub fn acquire(dir: &Path) -> Result<Self, JournalError> {
        let path = dir.join("lock");
        let io = |source| JournalError::Io {
            path: path.clone(),
            source,
        };
        let mut file = super::open_or_create(&path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                return Err(JournalError::Locked {
                    dir: dir.to_path_buf(),
                    holder: match holder.trim() {
                        "" => "another process".to_string(),
                        named => named.to_string(),
                    },
                });
            }
            Err(std::fs::TryLockError::Error(source)) => return Err(io(source)),
        }
        let holder = format!(
            "rollout-proxy pid {} (started {})",
            std::process::id(),
            chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)).map(drop))
            .and_then(|()| file.write_all(holder.as_bytes()))
            .map_err(io)?;
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_holder_and_a_dropped_one_frees_the_folder() {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target/tmp")
            .join(format!("lock-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let held = DirLock::acquire(&dir).unwrap();
        let error = DirLock::acquire(&dir).unwrap_err().to_string();
        let pid = format!("pid {}", std::process::id());
        assert!(error.contains(&pid) && error.contains("in use"), "{error}");
        drop(held);
        DirLock::acquire(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
