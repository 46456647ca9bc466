//! The storages compared, behind one interface: write one entry durably, delete a session,
//! compact, and (on open) read every entry back into a `SessionStore`.
//!
//! Every store is given the same bytes: the project's codec's encoding of the entry. Ours
//! frames them in its own file; the others key them by (session id, sequence number).

use crate::workload::key;
use rollout_proxy::journal::{Entry, Journal, codec};
use rollout_proxy::journal::{Replayed, restore};
use rollout_proxy::session::{CommitRecord, SessionLog, SessionStore};
use std::error::Error;
use std::path::Path;
use uuid::Uuid;

pub type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// A storage, with the durability it is run at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Ours: `src/journal`, one append-only file of checksummed frames.
    Journal,
    /// SQLite (rusqlite, bundled) in WAL mode, one row per entry.
    Sqlite,
    /// fjall, an LSM tree, one key per entry.
    Fjall,
    /// redb, a copy-on-write B-tree, one key per entry, one transaction per write.
    Redb,
    /// redb with `Durability::None`: its cheap commit, which a crash rolls back (a reference
    /// row: it does not meet the journal's guarantee).
    RedbNone,
}

impl Backend {
    pub const ALL: [Self; 5] = [
        Self::Journal,
        Self::Sqlite,
        Self::Fjall,
        Self::Redb,
        Self::RedbNone,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Journal => "journal",
            Self::Sqlite => "sqlite",
            Self::Fjall => "fjall",
            Self::Redb => "redb",
            Self::RedbNone => "redb-none",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.name() == name)
    }

    /// Opens (or creates) the store in `dir` and reads every entry back into `sessions`, as a
    /// restart does. `sync`: every write is also forced to disk (fsync or fdatasync).
    pub fn open(
        self,
        dir: &Path,
        sync: bool,
        sessions: &SessionStore,
    ) -> Result<(Box<dyn Store>, Replayed)> {
        std::fs::create_dir_all(dir)?;
        let mut restored = Replayed::default();
        let store: Box<dyn Store> = match self {
            Self::Journal => {
                let (journal, replayed) = Journal::open(dir, sessions)?;
                restored.sessions = replayed.sessions;
                restored.turns = replayed.turns;
                Box::new(Ours { journal, sync })
            }
            Self::Sqlite => Box::new(Sqlite::open(dir, sync, sessions, &mut restored)?),
            Self::Fjall => Box::new(Fjall::open(dir, sync, sessions, &mut restored)?),
            Self::Redb | Self::RedbNone => {
                // redb has no commit that survives a crash without an fsync: `Immediate`
                // (one fsync per commit) is its cheapest crash-safe mode, at either level.
                let durability = match self {
                    Self::RedbNone => redb::Durability::None,
                    _ => redb::Durability::Immediate,
                };
                Box::new(Redb::open(dir, durability, sessions, &mut restored)?)
            }
        };
        Ok((store, restored))
    }
}

/// One entry to write.
pub enum Write<'a> {
    Created(&'a Entry),
    Turn(Uuid, &'a CommitRecord),
}

impl Write<'_> {
    fn session(&self) -> Uuid {
        match self {
            Self::Created(entry) => entry.session(),
            Self::Turn(id, _) => *id,
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        match self {
            Self::Created(entry) => codec::encode(entry, out),
            Self::Turn(id, record) => codec::encode_commit(*id, record, out),
        }
    }
}

pub trait Store {
    /// Writes entry `seq` of its session (0: the creation); it is durable (at the store's
    /// level) when this returns.
    fn write(&mut self, seq: u32, write: Write) -> Result<()>;
    /// Deletes the session `id` and its `entries` entries, durably.
    fn delete(&mut self, id: Uuid, entries: u32) -> Result<()>;
    /// Reclaims the space of deleted entries, as far as the store offers.
    fn compact(&mut self) -> Result<()>;
}

/// Decodes `payload` and applies it to `sessions`.
fn load(payload: &[u8], sessions: &SessionStore, restored: &mut Replayed) -> Result<()> {
    restore(sessions, codec::decode(payload)?, restored);
    Ok(())
}

struct Ours {
    journal: Journal,
    sync: bool,
}

impl Store for Ours {
    fn write(&mut self, _seq: u32, write: Write) -> Result<()> {
        match write {
            Write::Created(entry) => self.journal.append(entry)?,
            Write::Turn(id, record) => futures::executor::block_on(self.journal.committed(id, record))?,
        }
        if self.sync {
            // The journal's own sync (flush, then fsync): the only one it exposes.
            self.journal.sync()?;
        }
        Ok(())
    }

    fn delete(&mut self, id: Uuid, _entries: u32) -> Result<()> {
        Ok(self.journal.append(&Entry::Deleted { id })?)
    }

    fn compact(&mut self) -> Result<()> {
        Ok(self.journal.compact()?)
    }
}

struct Sqlite {
    conn: rusqlite::Connection,
    payload: Vec<u8>,
}

impl Sqlite {
    fn open(
        dir: &Path,
        sync: bool,
        sessions: &SessionStore,
        restored: &mut Replayed,
    ) -> Result<Self> {
        let conn = rusqlite::Connection::open(dir.join("entries.sqlite"))?;
        // WAL: a commit appends its pages to the log with write(). synchronous=OFF: no fsync
        // (a kill -9 loses nothing written, a power loss may); FULL: an fsync per commit.
        // A rowid table (rows in insertion order, an index by key): its inserts took 35% less
        // time than a WITHOUT ROWID table's, which SQLite advises against for rows this large
        // (about 4.7 KB, over its 4 KiB pages), and made a 3% smaller file.
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = {};
             CREATE TABLE IF NOT EXISTS entries (
                 session BLOB NOT NULL, seq INTEGER NOT NULL, payload BLOB NOT NULL,
                 PRIMARY KEY (session, seq));",
            if sync { "FULL" } else { "OFF" }
        ))?;
        {
            let mut rows = conn.prepare("SELECT payload FROM entries ORDER BY session, seq")?;
            let mut rows = rows.query([])?;
            while let Some(row) = rows.next()? {
                load(row.get_ref(0)?.as_blob()?, sessions, restored)?;
            }
        }
        Ok(Self {
            conn,
            payload: Vec::new(),
        })
    }
}

impl Store for Sqlite {
    fn write(&mut self, seq: u32, write: Write) -> Result<()> {
        write.encode(&mut self.payload);
        // Autocommit: each statement is a transaction of its own.
        self.conn
            .prepare_cached("INSERT INTO entries (session, seq, payload) VALUES (?1, ?2, ?3)")?
            .execute((write.session().as_bytes(), seq, &self.payload))?;
        Ok(())
    }

    fn delete(&mut self, id: Uuid, _entries: u32) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM entries WHERE session = ?1")?
            .execute([id.as_bytes()])?;
        Ok(())
    }

    fn compact(&mut self) -> Result<()> {
        // VACUUM rebuilds the file without free pages; the checkpoint then empties the log.
        Ok(self
            .conn
            .execute_batch("VACUUM; PRAGMA wal_checkpoint(TRUNCATE);")?)
    }
}

struct Fjall {
    db: fjall::Database,
    entries: fjall::Keyspace,
    sync: bool,
    payload: Vec<u8>,
}

impl Fjall {
    fn open(
        dir: &Path,
        sync: bool,
        sessions: &SessionStore,
        restored: &mut Replayed,
    ) -> Result<Self> {
        // The defaults: each write is appended to fjall's journal and flushed to the operating
        // system (`PersistMode::Buffer`) before it returns, which survives a kill -9.
        let db = fjall::Database::builder(dir).open()?;
        let entries = db.keyspace("entries", fjall::KeyspaceCreateOptions::default)?;
        for guard in entries.iter() {
            let (_, payload) = guard.into_inner()?;
            load(&payload, sessions, restored)?;
        }
        Ok(Self {
            db,
            entries,
            sync,
            payload: Vec::new(),
        })
    }
}

impl Store for Fjall {
    fn write(&mut self, seq: u32, write: Write) -> Result<()> {
        write.encode(&mut self.payload);
        self.entries
            .insert(key(write.session(), seq), self.payload.as_slice())?;
        if self.sync {
            self.db.persist(fjall::PersistMode::SyncData)?;
        }
        Ok(())
    }

    fn delete(&mut self, id: Uuid, entries: u32) -> Result<()> {
        // One batch: one journal write, like one deletion frame.
        let mut batch = self.db.batch();
        for seq in 0..entries {
            batch.remove(&self.entries, key(id, seq));
        }
        Ok(batch.commit()?)
    }

    fn compact(&mut self) -> Result<()> {
        // Flush the memtable (its tombstones) into a table, then merge every table into one,
        // which drops the deleted keys. `major_compact` is public but hidden from fjall's docs;
        // left alone, fjall compacts in the background when its levels fill.
        self.entries.rotate_memtable_and_wait()?;
        Ok(self.entries.major_compact()?)
    }
}

const TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("entries");

struct Redb {
    db: redb::Database,
    durability: redb::Durability,
    payload: Vec<u8>,
}

impl Redb {
    fn open(
        dir: &Path,
        durability: redb::Durability,
        sessions: &SessionStore,
        restored: &mut Replayed,
    ) -> Result<Self> {
        use redb::{ReadableDatabase, ReadableTable};
        let db = redb::Database::create(dir.join("entries.redb"))?;
        // The table exists from the start, so that reading a new database finds it.
        let txn = db.begin_write()?;
        txn.open_table(TABLE)?;
        txn.commit()?;
        let txn = db.begin_read()?;
        for row in txn.open_table(TABLE)?.iter()? {
            load(row?.1.value(), sessions, restored)?;
        }
        Ok(Self {
            db,
            durability,
            payload: Vec::new(),
        })
    }

    /// Runs `f` on the table in one transaction, committed at the store's durability.
    fn transaction(
        &self,
        f: impl FnOnce(&mut redb::Table<&[u8], &[u8]>) -> Result<()>,
    ) -> Result<()> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(self.durability)?;
        f(&mut txn.open_table(TABLE)?)?;
        Ok(txn.commit()?)
    }
}

impl Store for Redb {
    fn write(&mut self, seq: u32, write: Write) -> Result<()> {
        write.encode(&mut self.payload);
        let key = key(write.session(), seq);
        let payload = &self.payload;
        self.transaction(|table| {
            table.insert(key.as_slice(), payload.as_slice())?;
            Ok(())
        })
    }

    fn delete(&mut self, id: Uuid, entries: u32) -> Result<()> {
        self.transaction(|table| {
            for seq in 0..entries {
                table.remove(key(id, seq).as_slice())?;
            }
            Ok(())
        })
    }

    fn compact(&mut self) -> Result<()> {
        // Only a durable commit frees pages; then pack them, until nothing more moves.
        self.db.begin_write()?.commit()?;
        while self.db.compact(redb::CompactionMode::Maximum)? {}
        Ok(())
    }
}

impl Drop for Redb {
    /// Makes `Durability::None` commits durable at a clean close, as a user of it must
    /// (unless a crash came first).
    fn drop(&mut self) {
        if matches!(self.durability, redb::Durability::None) {
            let commit = self.db.begin_write().map(redb::WriteTransaction::commit);
            assert!(matches!(commit, Ok(Ok(()))), "redb's final commit failed");
        }
    }
}
