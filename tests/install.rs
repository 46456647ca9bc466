//! The installed command as users meet it from a wheel, the image or `cargo install`:
//! `--version`, `fetch-default-model` (what the image's build runs), and the environment
//! variables the image sets instead of flags.

mod common;

use std::process::Command;

fn proxy_command() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rollout-proxy"))
}

/// `--version` names the version, the commit it was built from and the in-process engine.
#[test]
fn version_names_the_commit_and_the_engine() {
    let output = proxy_command().arg("--version").output().unwrap();
    assert!(output.status.success());
    let printed = String::from_utf8(output.stdout).unwrap();
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8(o.stdout).unwrap().trim().to_string());
    let commit = std::env::var("ROLLOUT_PROXY_COMMIT")
        .ok()
        .or(head)
        .unwrap_or_else(|| "unknown".into());
    assert_eq!(
        printed.trim(),
        format!(
            "rollout-proxy {} (commit {commit}, in-process engine: llama.cpp)",
            env!("CARGO_PKG_VERSION")
        )
    );
}

/// A cached default model is checked and its path printed; one whose bytes differ is refused
/// with the reason, and nothing is fetched over it.
#[test]
fn fetch_default_model_prints_a_checked_path_and_refuses_a_corrupt_file() {
    const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
    let good = common::scratch_dir("fetch-default-model-good");
    std::os::unix::fs::symlink(
        common::fixture_model("smollm2").join("model.gguf"),
        good.join(FILE),
    )
    .unwrap();
    let output = proxy_command()
        .arg("fetch-default-model")
        .env("ROLLOUT_PROXY_CACHE", &good)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8(output.stdout).unwrap().trim(),
        good.join(FILE).display().to_string()
    );

    let corrupt = common::scratch_dir("fetch-default-model-corrupt");
    std::fs::write(corrupt.join(FILE), b"not a model").unwrap();
    let output = proxy_command()
        .arg("fetch-default-model")
        .env("ROLLOUT_PROXY_CACHE", &corrupt)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(output.stdout.is_empty());
    let said = String::from_utf8(output.stderr).unwrap();
    assert!(said.contains("sha256"), "{said}");
    assert_eq!(std::fs::read(corrupt.join(FILE)).unwrap(), b"not a model");
}

/// `ROLLOUT_PROXY_HOST` and `ROLLOUT_PROXY_PORT` stand for `--host` and `--port` (the image
/// listens on 0.0.0.0, and its health check reads the port from the same variable).
#[tokio::test]
async fn host_and_port_come_from_the_environment() {
    let cache = common::scratch_dir("env-listen-cache");
    std::os::unix::fs::symlink(
        common::fixture_model("smollm2").join("model.gguf"),
        cache.join("SmolLM2-135M-Instruct.Q4_1.gguf"),
    )
    .unwrap();
    let port = common::free_port();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_rollout-proxy"))
        .args(["serve", "--engine-threads", "1"])
        .env("ROLLOUT_PROXY_HOST", "127.0.0.1")
        .env("ROLLOUT_PROXY_PORT", port.to_string())
        .env("ROLLOUT_PROXY_CACHE", &cache)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let health = common::wait_for_health(&reqwest::Client::new(), &base).await;
    assert_eq!(health["model"], "SmolLM2-135M-Instruct.Q4_1", "{health}");
    drop(child);
}
