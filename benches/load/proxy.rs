//! The proxy under load as a process of its own, so that its CPU is its own: started from
//! this build, another build (`LOAD_PROXY_BIN`) or another proxy altogether
//! (`LOAD_PROXY_CMD`), and read for its CPU time and resident memory.
#![allow(dead_code)]

use super::common::{fixture_model, free_port};
use std::time::{Duration, Instant};

/// The proxy process: its CPU time (all threads, ns) and resident memory.
pub struct ProxyProcess {
    pub child: std::process::Child,
    pub url: String,
    /// Each thread's CPU when last read: a thread that has exited since (the runtime's
    /// blocking pool lets idle ones go) keeps counting, so the total never goes back.
    threads_cpu_ns: std::sync::Mutex<std::collections::HashMap<String, u64>>,
}

impl ProxyProcess {
    /// The proxy the load measures: another one altogether (`LOAD_PROXY_CMD`, a shell command
    /// with `{port}` and `{upstream}` placeholders, run with `exec` so that its PID is the
    /// measured one), or rollout-proxy with `LOAD_PROXY_ARGS` added to its flags.
    pub fn start(upstream: &str) -> Self {
        let port = free_port();
        match std::env::var("LOAD_PROXY_CMD") {
            Ok(template) => {
                let command = template
                    .replace("{port}", &port.to_string())
                    .replace("{upstream}", upstream);
                let mut shell = std::process::Command::new("sh");
                shell.arg("-c").arg(format!("exec {command}"));
                Self::spawn(shell, port)
            }
            Err(_) => {
                let extra = std::env::var("LOAD_PROXY_ARGS").unwrap_or_default();
                let extra: Vec<&str> = extra.split_whitespace().collect();
                Self::rollout_proxy(upstream, port, &extra)
            }
        }
    }

    /// rollout-proxy on `port` before `upstream`, serving the Qwen3 fixture's tokenizer, with
    /// `extra` flags: this build, or `LOAD_PROXY_BIN` (e.g. the previous commit's, for a
    /// side-by-side run).
    pub fn rollout_proxy(upstream: &str, port: u16, extra: &[&str]) -> Self {
        let binary = std::env::var("LOAD_PROXY_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_rollout-proxy").to_string());
        let mut command = std::process::Command::new(binary);
        command
            .args(["serve", "--port", &port.to_string(), "--tokenizer"])
            .arg(fixture_model("qwen3"))
            .args(["--backend", upstream, "--backend-type", "sglang"])
            .args(extra);
        Self::spawn(command, port)
    }

    fn spawn(mut command: std::process::Command, port: u16) -> Self {
        let child = command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(120);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the proxy did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            url,
            threads_cpu_ns: Default::default(),
        }
    }

    pub fn cpu_ns(&self) -> u64 {
        let mut threads = self.threads_cpu_ns.lock().unwrap();
        threads_cpu_ns(self.child.id(), &mut threads)
    }

    pub fn rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The CPU time of process `pid`'s threads, in ns (from their schedstat): `seen` keeps each
/// thread's last reading, so that a thread that exited since still counts.
pub fn threads_cpu_ns(pid: u32, seen: &mut std::collections::HashMap<String, u64>) -> u64 {
    let tasks = format!("/proc/{pid}/task");
    for task in std::fs::read_dir(tasks).into_iter().flatten().flatten() {
        let schedstat = std::fs::read_to_string(task.path().join("schedstat"));
        let cpu = schedstat
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok());
        if let Some(cpu) = cpu {
            seen.insert(task.file_name().to_string_lossy().into_owned(), cpu);
        }
    }
    seen.values().sum()
}
