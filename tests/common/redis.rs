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
