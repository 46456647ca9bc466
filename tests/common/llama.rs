//! A real llama.cpp `llama-server` on 127.0.0.1 serving SmolLM2-135M-Instruct, built by
//! `scripts/build-llama-server.sh` and fetched by `scripts/fetch-fixtures.sh`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The llama-server binary: `$LLAMA_SERVER_BIN`, else where the build script caches it.
pub fn binary() -> PathBuf {
    let path = std::env::var_os("LLAMA_SERVER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("LLAMA_SERVER_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var("HOME").unwrap())
                        .join(".cache/rollout-proxy/llama-server")
                });
            cache.join("0.3.36/bin/llama-server")
        });
    assert!(
        path.is_file(),
        "llama-server not found at {}: run scripts/build-llama-server.sh",
        path.display()
    );
    path
}

/// A running llama-server, killed when dropped.
pub struct LlamaServer {
    pub port: u16,
    child: Child,
}

impl LlamaServer {
    /// Starts a server on a free port.
    pub fn start() -> Self {
        let port = super::free_port();
        Self::start_on(port)
    }

    /// Starts a server on `port` and waits until it has loaded the model.
    pub fn start_on(port: u16) -> Self {
        Self::start_with(port, &["-c", "4096", "--parallel", "2", "-t", "1"])
    }

    /// Starts a server on `port` with these sizing arguments (`-c`, `--parallel`, `-t`, …).
    pub fn start_with(port: u16, sizing: &[&str]) -> Self {
        let model = super::fixture_model("smollm2").join("model.gguf");
        let child = Command::new(binary())
            .args([
                "-m",
                model.to_str().unwrap(),
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
            ])
            .args(sizing)
            .arg("--no-webui")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = Self { port, child };
        server.wait_ready();
        server
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if super::answers_ok(self.port, "/health") {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("llama-server on port {} did not become ready", self.port);
    }

    /// Kills the server (as a crash would).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        self.kill();
    }
}
