//! The proxy as a process that can be killed with SIGKILL and restarted on its port and data
//! directory, and the two upstreams' fault schedule.

use super::common::fixture_model;
use super::common::mock_worker::{Fault, FaultInjector};
use rollout_proxy::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The backend timeout the proxy is configured with; a hang lasts longer.
pub const BACKEND_TIMEOUT_S: f64 = 1.0;

/// Text that makes every upstream request of its prompt fail (a rollout meant to fail).
pub const DOOM: &str = "DOOMED-ROLLOUT";

/// `rollout-proxy serve --data-dir`, on a fixed port.
pub struct ProxyProcess {
    child: std::process::Child,
    port: u16,
    config: PathBuf,
    data_dir: PathBuf,
    pub url: String,
}

impl ProxyProcess {
    /// Writes the config (both upstreams, a short backend timeout, quick retries) and starts.
    pub fn start(upstreams: [&str; 2], dir: &Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let servers: Vec<_> = upstreams
            .iter()
            .map(|url| {
                serde_json::json!({"base_url": url, "server_type": "sglang",
                    "timeout": BACKEND_TIMEOUT_S, "num_max_requests_at_once": 64})
            })
            .collect();
        let config = serde_json::json!({"servers": servers, "pool": {
            "health_check_interval": 0.5, "unhealthy_after": 5, "breaker_cooldown": 1.0,
            "retry_backoff": 0.01, "max_retries": 2}});
        let config_path = dir.join("config.json");
        std::fs::write(&config_path, config.to_string()).unwrap();
        let mut proxy = Self {
            child: Self::spawn(port, &config_path, &dir.join("data")),
            port,
            config: config_path,
            data_dir: dir.join("data"),
            url: format!("http://127.0.0.1:{port}"),
        };
        proxy.wait_listening();
        proxy
    }

    fn spawn(port: u16, config: &Path, data_dir: &Path) -> std::process::Child {
        let binary = std::env::var("LOAD_PROXY_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_rollout-proxy").to_string());
        std::process::Command::new(binary)
            .args(["serve", "--port", &port.to_string(), "--tokenizer"])
            .arg(fixture_model("qwen3"))
            .arg("--config")
            .arg(config)
            .arg("--data-dir")
            .arg(data_dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    }

    /// SIGKILL, then a new process on the same port and data directory (it binds the port
    /// first, so connections made meanwhile wait for it rather than fail).
    pub fn kill_9_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::spawn(self.port, &self.config, &self.data_dir);
        self.wait_listening();
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "the proxy did not start");
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the proxy exited: {status}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Counts of the faults injected, by kind.
#[derive(Default)]
pub struct Injected {
    pub requests: AtomicU64,
    pub status: AtomicU64,
    pub resets: AtomicU64,
    pub hangs: AtomicU64,
    pub cuts: AtomicU64,
    pub doomed: AtomicU64,
}

/// Fails `per_mille` of the requests (5xx, reset, a hang past the backend timeout, a stream
/// cut after a few tokens, in turn by a hash of the request's number), and every request whose
/// prompt ends with [`DOOM`].
pub fn injector(per_mille: u64, tokenizer: Arc<Tokenizer>, counts: Arc<Injected>) -> FaultInjector {
    Arc::new(move |prompt: &[u32]| {
        let n = counts.requests.fetch_add(1, Ordering::Relaxed);
        let tail = &prompt[prompt.len().saturating_sub(24)..];
        if tokenizer.decode(tail).contains(DOOM) {
            counts.doomed.fetch_add(1, Ordering::Relaxed);
            return Some(Fault::Status(503));
        }
        let hash = xxhash_rust::xxh3::xxh3_64(&n.to_le_bytes());
        if hash % 1000 >= per_mille {
            return None;
        }
        let (count, fault) = match (hash >> 32) % 4 {
            0 => (&counts.status, Fault::Status(500 + (hash >> 40) as u16 % 4)),
            1 => (&counts.resets, Fault::Reset),
            2 => (
                &counts.hangs,
                Fault::Hang((BACKEND_TIMEOUT_S * 1000.0) as u64 + 500),
            ),
            _ => (&counts.cuts, Fault::Cut(1 + (hash >> 40) as usize % 8)),
        };
        count.fetch_add(1, Ordering::Relaxed);
        Some(fault)
    })
}
