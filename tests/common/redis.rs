//! A real redis-server (Debian's package, `scripts/install-fleet-parts.sh`) for the fleet's
//! tests, started by the test on a free port with append-only persistence fsynced on every
//! write (what a fleet that must lose no acknowledged turn runs with), and killed when dropped.

use super::{KillOnDrop, free_port};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A redis-server process and where it keeps its data.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    process: Option<KillOnDrop>,
}

impl RedisServer {
    /// A server keeping its append-only file in `dir`.
    pub fn start(dir: &Path) -> Self {
        let mut server = Self {
            port: free_port(),
            dir: dir.to_path_buf(),
            process: None,
        };
        server.restart();
        server
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> u32 {
        self.process.as_ref().expect("redis-server runs").0.id()
    }

    /// The counters of `INFO stats` (commands processed, bytes in and out) and of `INFO
    /// commandstats` (`cmdstat_NAME`: each command's calls).
    pub fn stats(&self) -> std::collections::HashMap<String, u64> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream.write_all(b"INFO all\r\n").unwrap();
        let mut reply = Vec::new();
        let mut chunk = [0u8; 8192];
        // A bulk string: `$len\r\n` then the text; read until all of it is in.
        loop {
            let n = stream.read(&mut chunk).unwrap();
            reply.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&reply);
            if let Some((head, body)) = text.split_once("\r\n") {
                let len: usize = head.trim_start_matches('$').parse().unwrap();
                if body.len() >= len {
                    return body
                        .lines()
                        .filter_map(|line| {
                            let (name, value) = line.split_once(':')?;
                            // `cmdstat_get:calls=3,usec=…`: the calls.
                            let value = value
                                .strip_prefix("calls=")
                                .map_or(value, |calls| calls.split(',').next().unwrap_or_default());
                            Some((name.to_string(), value.trim().parse().ok()?))
                        })
                        .collect();
                }
            }
        }
    }

    /// Empties the server.
    pub fn flush(&self) {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream.write_all(b"FLUSHALL\r\n").unwrap();
        let mut reply = [0u8; 5];
        stream.read_exact(&mut reply).unwrap();
        assert_eq!(&reply, b"+OK\r\n");
    }

    /// The store's URL, as `serve --store` takes it.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Stops the server at once (SIGKILL).
    pub fn stop(&mut self) {
        drop(self.process.take());
    }

    /// Stops the server at once (SIGKILL) if it runs, and starts it on the same port and data.
    pub fn restart(&mut self) {
        self.stop();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server: scripts/install-fleet-parts.sh installs it");
        self.process = Some(KillOnDrop(child));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.answers() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the server answers PING (it may be loading its file).
    fn answers(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let mut reply = [0u8; 7];
        stream.write_all(b"PING\r\n").is_ok()
            && stream.read_exact(&mut reply).is_ok()
            && &reply == b"+PONG\r\n"
    }
}
