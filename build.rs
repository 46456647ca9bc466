//! Writes what `rollout-proxy --version` prints: the version, the commit the build was made
//! from (`$ROLLOUT_PROXY_COMMIT` when set, as builds from a copy without `.git` do, else the
//! clone's `HEAD`, else "unknown"), and whether the in-process engine is in the build.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    (output.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=ROLLOUT_PROXY_COMMIT");
    let from_env = std::env::var("ROLLOUT_PROXY_COMMIT")
        .ok()
        .filter(|c| !c.is_empty());
    let commit = from_env.or_else(|| {
        let git_dir = git(&["rev-parse", "--absolute-git-dir"])?;
        // A new commit moves HEAD or the branch it names: either reruns this script. Only
        // files that exist are named (cargo reruns the script every build for a missing one).
        let git_dir = Path::new(&git_dir);
        let mut watched = vec![git_dir.join("HEAD"), git_dir.join("packed-refs")];
        watched.extend(git(&["symbolic-ref", "-q", "HEAD"]).map(|branch| git_dir.join(branch)));
        for path in watched.iter().filter(|path| path.exists()) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
        git(&["rev-parse", "--short=12", "HEAD"])
    });
    let commit = commit.unwrap_or_else(|| "unknown".into());
    let engine = match std::env::var_os("CARGO_FEATURE_ENGINE") {
        Some(_) => "in-process engine: llama.cpp",
        None => "no in-process engine",
    };
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!("cargo:rustc-env=ROLLOUT_PROXY_VERSION={version} (commit {commit}, {engine})");
}
