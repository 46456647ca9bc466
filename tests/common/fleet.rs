//! The fleet's parts for the tests that start them: replicas (`serve --store`) on ports of
//! their own, which a test kills and restarts in place, and HAProxy (Debian's package,
//! `scripts/install-fleet-parts.sh`) balancing them round-robin with no stickiness.

use super::client::Client;
use super::{KillOnDrop, char_model_dir, free_port};
use std::path::Path;
use std::time::{Duration, Instant};

/// A replica process before upstreams (SGLang's wire), on a port it keeps across restarts.
pub struct Replica {
    pub port: u16,
    store: String,
    upstreams: Vec<String>,
    flags: Vec<String>,
    /// The model folder and the upstreams' wire (the char model before SGLang's by default).
    model: (std::path::PathBuf, &'static str),
    process: Option<KillOnDrop>,
}

impl Replica {
    /// A replica of the fleet on `store` before `upstream`, started and healthy.
    pub async fn start(store: &str, upstream: &str) -> Self {
        Self::before(store, &[upstream]).await
    }

    /// A replica of the fleet on `store` before every one of `upstreams`.
    pub async fn before(store: &str, upstreams: &[&str]) -> Self {
        Self::with_flags(store, upstreams, &[]).await
    }

    /// A replica of the fleet on `store` before `upstreams`, with `flags` added.
    pub async fn with_flags(store: &str, upstreams: &[&str], flags: &[&str]) -> Self {
        Self::serving(store, upstreams, flags, (char_model_dir(), "sglang")).await
    }

    /// A replica of the fleet on `store` for the model folder `model.0` before `upstreams`
    /// of backend type `model.1`, with `flags` added.
    pub async fn serving(
        store: &str,
        upstreams: &[&str],
        flags: &[&str],
        model: (std::path::PathBuf, &'static str),
    ) -> Self {
        let mut replica = Self {
            port: free_port(),
            store: store.to_string(),
            upstreams: upstreams.iter().map(|u| u.to_string()).collect(),
            flags: flags.iter().map(|f| f.to_string()).collect(),
            model,
            process: None,
        };
        replica.restart().await;
        replica
    }

    /// A client of this replica.
    pub fn client(&self) -> Client {
        Client::on(self.port)
    }

    /// The process, while it runs.
    pub fn process(&self) -> &KillOnDrop {
        self.process.as_ref().expect("the replica runs")
    }

    /// Kills the replica at once (SIGKILL: nothing is flushed or closed).
    pub fn kill(&mut self) {
        drop(self.process.take());
    }

    /// Kills the replica if it runs, and starts it again on the same port.
    pub async fn restart(&mut self) {
        self.kill();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rollout-proxy"));
        command
            .args(["serve", "--port", &self.port.to_string(), "--workers", "1"])
            .arg("--tokenizer")
            .arg(&self.model.0);
        for upstream in &self.upstreams {
            command.args(["--backend", upstream]);
        }
        let child = command
            .args(["--backend-type", self.model.1])
            .args(["--store", &self.store])
            .args(&self.flags)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        self.process = Some(KillOnDrop(child));
        let client = self.client();
        super::wait_for_health(&client.http, &client.base).await;
    }
}

/// How HAProxy spreads requests over the replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Balance {
    /// In turn, with no stickiness.
    RoundRobin,
    /// By a hash of the path's first segment (a session's id), so that a session's requests
    /// go to one replica while it is up.
    BySession,
}

/// HAProxy in front of replicas, checking each replica's `/health`.
pub struct Haproxy {
    pub port: u16,
    pub process: KillOnDrop,
}

impl Haproxy {
    /// Starts HAProxy before the replicas on `ports`, with its configuration in `dir`.
    pub fn start(dir: &Path, ports: &[u16], balance: Balance) -> Self {
        let balance = match balance {
            Balance::RoundRobin => "roundrobin",
            Balance::BySession => "uri depth 1\n  hash-type consistent",
        };
        let port = free_port();
        let servers: String = ports
            .iter()
            .enumerate()
            .map(|(i, replica)| {
                format!("  server r{i} 127.0.0.1:{replica} check inter 200ms fall 1 rise 1\n")
            })
            .collect();
        let config = format!(
            "global\n  maxconn 4096\n\
             defaults\n  mode http\n  timeout connect 1s\n  timeout client 60s\n  \
             timeout server 60s\n  retries 3\n  option redispatch\n\
             frontend fleet\n  bind 127.0.0.1:{port}\n  default_backend replicas\n\
             backend replicas\n  balance {balance}\n  option httpchk GET /health\n{servers}"
        );
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, config).unwrap();
        let child = std::process::Command::new("haproxy")
            .arg("-q")
            .arg("-f")
            .arg(&path)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("haproxy: scripts/install-fleet-parts.sh installs it");
        // Every replica up: health answered in a row as often as round-robin takes to pass
        // each twice.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut in_a_row = 0;
        while in_a_row < 2 * ports.len() {
            assert!(
                Instant::now() < deadline,
                "haproxy did not see every replica up"
            );
            match super::answers_ok(port, "/health") {
                true => in_a_row += 1,
                false => {
                    in_a_row = 0;
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        Self {
            port,
            process: KillOnDrop(child),
        }
    }

    /// A client of the fleet, through HAProxy.
    pub fn client(&self) -> Client {
        Client::on(self.port)
    }
}
