//! An image host for the proxy to fetch from: an HTTP/1.1 server (plain, or TLS with a
//! certificate from its own CA) that answers each path as told — an image, an error status,
//! a redirect, a slow or an endless body — and counts what it was asked.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the host answers a path.
#[derive(Clone)]
pub enum Answer {
    /// 200 with this body and `Content-Length`.
    Image(Vec<u8>),
    /// This status, and a short text body.
    Status(u16),
    /// A redirect (302) to this URL, or path on the same host.
    Redirect(String),
    /// This body after this long.
    Slow(Duration, Vec<u8>),
    /// A body of this many bytes with no `Content-Length` (read until the host closes).
    Unsized(usize),
}

/// A running image host.
pub struct ImageHost {
    /// `http://127.0.0.1:PORT` or `https://localhost:PORT`.
    pub base: String,
    /// The CA that signed the host's certificate, as PEM (TLS only).
    pub ca: Option<PathBuf>,
    hits: Arc<Mutex<HashMap<String, usize>>>,
}

impl ImageHost {
    /// A plain HTTP host answering `routes` (any other path: 404).
    pub fn start(routes: Vec<(&str, Answer)>) -> Self {
        Self::serve(routes, None)
    }

    /// An HTTPS host, its certificate (for `localhost`) signed by a CA of its own.
    pub fn start_tls(routes: Vec<(&str, Answer)>) -> Self {
        Self::serve(routes, Some(tls_identity()))
    }

    fn serve(
        routes: Vec<(&str, Answer)>,
        tls: Option<(Arc<rustls::ServerConfig>, String)>,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let routes: Arc<HashMap<String, Answer>> = Arc::new(
            routes
                .into_iter()
                .map(|(p, a)| (p.to_string(), a))
                .collect(),
        );
        let hits = Arc::new(Mutex::new(HashMap::new()));
        let (base, ca) = match &tls {
            Some((_, pem)) => {
                let path = super::scratch_dir("image-host-ca").join(format!("{port}.pem"));
                std::fs::write(&path, pem).unwrap();
                (format!("https://localhost:{port}"), Some(path))
            }
            None => (format!("http://127.0.0.1:{port}"), None),
        };
        let config = tls.map(|(config, _)| config);
        let counted = hits.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (routes, hits, config) = (routes.clone(), counted.clone(), config.clone());
                std::thread::spawn(move || {
                    let _ = match config {
                        Some(config) => {
                            let Ok(session) = rustls::ServerConnection::new(config) else {
                                return;
                            };
                            answer(rustls::StreamOwned::new(session, stream), &routes, &hits)
                        }
                        None => answer(stream, &routes, &hits),
                    };
                });
            }
        });
        Self { base, ca, hits }
    }

    /// The URL of `path` on this host.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// How often `path` was asked for.
    pub fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

/// Reads one request and answers it; the connection is closed after.
fn answer<S: Read + Write>(
    mut stream: S,
    routes: &HashMap<String, Answer>,
    hits: &Mutex<HashMap<String, usize>>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte)? == 0 || head.len() > 16 * 1024 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    let path = head.split(' ').nth(1).unwrap_or("/").to_string();
    *hits.lock().unwrap().entry(path.clone()).or_default() += 1;
    let sized = |status: &str, kind: &str, body: &[u8]| {
        let mut out = format!(
            "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(body);
        out
    };
    let reply = match routes.get(&path) {
        Some(Answer::Image(body)) => sized("200 OK", "image/png", body),
        Some(Answer::Status(code)) => sized(&format!("{code} Nope"), "text/plain", b"nope"),
        Some(Answer::Redirect(to)) => format!(
            "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .into_bytes(),
        Some(Answer::Slow(delay, body)) => {
            std::thread::sleep(*delay);
            sized("200 OK", "image/png", body)
        }
        Some(Answer::Unsized(length)) => {
            stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nConnection: close\r\n\r\n",
            )?;
            let chunk = vec![0u8; 64 * 1024];
            let mut left = *length;
            while left > 0 {
                let n = left.min(chunk.len());
                stream.write_all(&chunk[..n])?;
                left -= n;
            }
            Vec::new()
        }
        None => sized("404 Not Found", "text/plain", b"no such image"),
    };
    stream.write_all(&reply)?;
    stream.flush()
}

/// A server config whose certificate (for `localhost` and 127.0.0.1) a fresh CA signed, and
/// that CA's certificate as PEM.
fn tls_identity() -> (Arc<rustls::ServerConfig>, String) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let chain = vec![CertificateDer::from(leaf.der().to_vec())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    // The proxy's own choice of provider (src/fetch); the test's host needs no other.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    (Arc::new(config), ca.pem())
}
