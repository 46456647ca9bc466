//! Our journal against embedded stores (SQLite, fjall, redb) on the workload of
//! `benches/journal.rs`; prints the tables of RESULTS.md. See README.md.
//!
//! Each measurement runs in a child process of its own (this binary, `child ...`), so that
//! each peak RSS is that measurement's alone, and each restart starts from a cold process, as
//! a real one does (the page cache stays warm).

mod stores;
mod workload;

use rollout_proxy::session::SessionStore;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use stores::{Backend, Result, Write};
use workload::Workload;

fn env_or(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The workload's shape, from the same variables as `benches/journal.rs`.
fn workload(sessions: usize) -> Workload {
    Workload {
        sessions,
        tokens: env_or("JOURNAL_TOKENS", 4096),
        turns: env_or("JOURNAL_TURNS", 4),
    }
}

/// What one child measured.
#[derive(Debug, Clone, Copy)]
struct Report {
    seconds: f64,
    /// Bytes the store's files take on disk (allocated blocks) when the child is done.
    bytes: u64,
    peak_rss_kib: u64,
    sessions: usize,
    turns: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Writes the workload into a new store.
    Write,
    /// Opens the store and reads every entry back into a `SessionStore`.
    Restart,
    /// Deletes every other session, then compacts.
    Delete,
    /// Writes the workload, says so, and waits to be killed (kill -9).
    Crash,
}

impl Phase {
    const ALL: [Self; 4] = [Self::Write, Self::Restart, Self::Delete, Self::Crash];

    fn name(self) -> &'static str {
        match self {
            Self::Write => "write",
            Self::Restart => "restart",
            Self::Delete => "delete",
            Self::Crash => "crash",
        }
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => compare(),
        [child, phase, backend, sync, dir, sessions] if child == "child" => {
            let phase = Phase::ALL
                .into_iter()
                .find(|p| p.name() == phase)
                .ok_or("unknown phase")?;
            let backend = Backend::parse(backend).ok_or("unknown backend")?;
            let work = workload(sessions.parse()?);
            let r = run(phase, backend, sync == "sync", Path::new(dir), work)?;
            println!(
                "{} {} {} {} {}",
                r.seconds, r.bytes, r.peak_rss_kib, r.sessions, r.turns
            );
            Ok(())
        }
        _ => Err("usage: storage-compare (no arguments; see README.md)".into()),
    }
}

/// One measurement, in this (child) process.
fn run(phase: Phase, backend: Backend, sync: bool, dir: &Path, work: Workload) -> Result<Report> {
    if matches!(phase, Phase::Write | Phase::Crash) {
        let _ = std::fs::remove_dir_all(dir);
    }
    let sessions = SessionStore::default();
    let start = Instant::now();
    let (mut store, restored) = backend.open(dir, sync, &sessions)?;
    let opened = start.elapsed();
    let seconds = match phase {
        Phase::Write | Phase::Crash => {
            // Only the stores' calls are timed: building the records is the same for all.
            let mut spent = Duration::ZERO;
            for s in 0..work.sessions {
                let created = Workload::created(s);
                let started = Instant::now();
                store.write(0, Write::Created(&created))?;
                spent += started.elapsed();
                for t in 0..work.turns {
                    let record = work.turn(s, t);
                    let started = Instant::now();
                    store.write(t as u32 + 1, Write::Turn(Workload::id(s), &record))?;
                    spent += started.elapsed();
                }
            }
            if phase == Phase::Crash {
                println!("written");
                std::io::stdout().flush()?;
                loop {
                    std::thread::park();
                }
            }
            spent
        }
        Phase::Restart => opened,
        Phase::Delete => {
            let start = Instant::now();
            for s in (0..work.sessions).step_by(2) {
                store.delete(Workload::id(s), work.turns as u32 + 1)?;
            }
            store.compact()?;
            start.elapsed()
        }
    };
    drop(store);
    Ok(Report {
        seconds: seconds.as_secs_f64(),
        bytes: disk_usage(dir)?,
        peak_rss_kib: peak_rss_kib()?,
        sessions: restored.sessions,
        turns: restored.turns,
    })
}

/// Bytes allocated on disk to the files under `dir` (what `du` counts: preallocated space
/// included, holes excluded).
fn disk_usage(dir: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            disk_usage(&entry.path())?
        } else {
            meta.blocks() * 512
        };
    }
    Ok(total)
}

/// This process's peak resident set (VmHWM), in KiB.
fn peak_rss_kib() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .ok_or("no VmHWM")?;
    Ok(line
        .trim_start_matches("VmHWM:")
        .trim_end_matches("kB")
        .trim()
        .parse()?)
}

/// Runs one measurement in a child process.
fn child(
    phase: Phase,
    backend: Backend,
    sync: bool,
    dir: &Path,
    sessions: usize,
) -> Result<Report> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["child", phase.name(), backend.name()])
        .arg(if sync { "sync" } else { "os" })
        .arg(dir)
        .arg(sessions.to_string())
        .stdout(Stdio::piped());
    let mut process = command.spawn()?;
    let mut line = String::new();
    BufReader::new(process.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
    if phase == Phase::Crash {
        // Everything is written: SIGKILL, with no chance to flush or close anything.
        process.kill()?;
        process.wait()?;
        return child(Phase::Restart, backend, sync, dir, sessions);
    }
    if !process.wait()?.success() {
        return Err(format!("{} {} failed", phase.name(), backend.name()).into());
    }
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [seconds, bytes, rss, restored_sessions, turns] = fields[..] else {
        return Err(format!("unexpected report: {line:?}").into());
    };
    Ok(Report {
        seconds: seconds.parse()?,
        bytes: bytes.parse()?,
        peak_rss_kib: rss.parse()?,
        sessions: restored_sessions.parse()?,
        turns: turns.parse()?,
    })
}

/// The durability each backend is run at: `sync` false is the journal's guarantee (the write
/// is in the operating system's hands: it survives kill -9, not a power loss), true adds a
/// flush to the disk per write.
fn setting(backend: Backend, sync: bool) -> &'static str {
    match (backend, sync) {
        (Backend::Journal, false) => "write() per entry, no fsync",
        (Backend::Journal, true) => "write() + fsync per entry (`Journal::sync`)",
        (Backend::Sqlite, false) => "WAL, `synchronous=OFF`",
        (Backend::Sqlite, true) => "WAL, `synchronous=FULL`",
        (Backend::Fjall, false) => "`PersistMode::Buffer` per write (default)",
        (Backend::Fjall, true) => "+ `persist(SyncData)` per write",
        (Backend::Redb, _) => "`Durability::Immediate` (1 fsync per commit)",
        (Backend::RedbNone, _) => "`Durability::None`: NOT crash-safe",
    }
}

/// Bytes on disk per held token over the repetitions: one value, or the range when they
/// differ (fjall's size at close depends on how far its background flushes have got).
fn per_token(reports: &[Report], held: f64) -> String {
    let bytes = reports.iter().map(|r| r.bytes);
    let (min, max) = (bytes.clone().min(), bytes.max());
    let (min, max) = (
        min.unwrap_or(0) as f64 / held,
        max.unwrap_or(0) as f64 / held,
    );
    if format!("{min:.2}") == format!("{max:.2}") {
        format!("{min:.2}")
    } else {
        format!("{min:.2}–{max:.2}")
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Runs every measurement and prints the tables as Markdown.
fn compare() -> Result<()> {
    let sessions = env_or("JOURNAL_SESSIONS", 10_000);
    let sync_sessions = env_or("COMPARE_SYNC_SESSIONS", sessions);
    let crash_sessions = env_or("COMPARE_CRASH_SESSIONS", 200);
    let reps = env_or("COMPARE_REPS", 3);
    let base = std::env::var_os("COMPARE_DIR")
        .map_or_else(std::env::temp_dir, PathBuf::from)
        .join("storage-compare");
    let work = workload(sessions);
    let turns = (sessions * work.turns) as f64;
    let dir = |backend: Backend, sync: bool| base.join(format!("{}-{sync}", backend.name()));
    let started = Instant::now();
    let progress = |what: &str| eprintln!("[{:6.1} s] {what}", started.elapsed().as_secs_f64());

    // Repetitions interleave the backends, so that a slow spell of the machine hits them all.
    let mut writes = vec![Vec::new(); Backend::ALL.len()];
    let mut restarts = vec![Vec::new(); Backend::ALL.len()];
    for rep in 0..reps {
        for (i, &b) in Backend::ALL.iter().enumerate() {
            progress(&format!("write {} (rep {})", b.name(), rep + 1));
            writes[i].push(child(Phase::Write, b, false, &dir(b, false), sessions)?);
        }
    }
    for rep in 0..reps {
        for (i, &b) in Backend::ALL.iter().enumerate() {
            progress(&format!("restart {} (rep {})", b.name(), rep + 1));
            let r = child(Phase::Restart, b, false, &dir(b, false), sessions)?;
            assert_eq!((r.sessions, r.turns), (sessions, sessions * work.turns));
            restarts[i].push(r);
        }
    }
    let mut deletes = Vec::new();
    let mut crashes = Vec::new();
    for &b in &Backend::ALL {
        progress(&format!("delete half of {}, compact", b.name()));
        deletes.push(child(Phase::Delete, b, false, &dir(b, false), sessions)?);
        progress(&format!("kill -9 check of {}", b.name()));
        crashes.push(child(
            Phase::Crash,
            b,
            false,
            &dir(b, false),
            crash_sessions,
        )?);
        std::fs::remove_dir_all(dir(b, false))?;
    }
    let synced: Vec<Backend> = Backend::ALL
        .into_iter()
        .filter(|&b| b != Backend::RedbNone)
        .collect();
    let mut sync_writes = vec![Vec::new(); synced.len()];
    for rep in 0..reps {
        for (i, &b) in synced.iter().enumerate() {
            progress(&format!("write {} + fsync (rep {})", b.name(), rep + 1));
            sync_writes[i].push(child(Phase::Write, b, true, &dir(b, true), sync_sessions)?);
        }
    }
    std::fs::remove_dir_all(&base)?;
    progress("done");

    let held = work.held_tokens() as f64;
    let ours_write = median(writes[0].iter().map(|r| r.seconds).collect());
    let ours_restart = median(restarts[0].iter().map(|r| r.seconds).collect());
    println!(
        "## Write, size, restart: {sessions} sessions x {} tokens ({} turns each), median of {reps}\n",
        work.tokens, work.turns
    );
    println!(
        "| backend | durability | turns/s | µs/turn | write vs ours | B/held token | after deleting half + compaction, B/held token (compaction s) | restart s | restart vs ours | peak RSS write / restart MiB | kill -9 after {crash_sessions} sessions: turns back |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, &b) in Backend::ALL.iter().enumerate() {
        let write = median(writes[i].iter().map(|r| r.seconds).collect());
        let restart = median(restarts[i].iter().map(|r| r.seconds).collect());
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.2}x | {} | {:.2} ({:.1}) | {:.2} | {:.2}x | {:.0} / {:.0} | {} of {} |",
            b.name(),
            setting(b, false),
            turns / write,
            write / turns * 1e6,
            write / ours_write,
            per_token(&writes[i], held),
            deletes[i].bytes as f64 / (held / 2.0),
            deletes[i].seconds,
            restart,
            restart / ours_restart,
            writes[i].iter().map(|r| r.peak_rss_kib).max().unwrap_or(0) as f64 / 1024.0,
            restarts[i]
                .iter()
                .map(|r| r.peak_rss_kib)
                .max()
                .unwrap_or(0) as f64
                / 1024.0,
            crashes[i].turns,
            crash_sessions * work.turns,
        );
    }
    let sync_turns = (sync_sessions * work.turns) as f64;
    let sync_held = workload(sync_sessions).held_tokens() as f64;
    let ours_sync = median(sync_writes[0].iter().map(|r| r.seconds).collect());
    println!(
        "\n## Every write forced to disk: {sync_sessions} sessions x {} tokens, median of {reps}\n",
        work.tokens
    );
    println!("| backend | durability | turns/s | µs/turn | write vs ours | B/held token |");
    println!("|---|---|---|---|---|---|");
    for (i, &b) in synced.iter().enumerate() {
        let write = median(sync_writes[i].iter().map(|r| r.seconds).collect());
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.2}x | {} |",
            b.name(),
            setting(b, true),
            sync_turns / write,
            write / sync_turns * 1e6,
            write / ours_sync,
            per_token(&sync_writes[i], sync_held),
        );
    }
    Ok(())
}
