//! URLs the proxy fetches on a client's behalf: the images a conversation names by `http(s)`
//! URL (vLLM and OpenAI take those as well as data URLs).
//!
//! A client's URL must not reach what only the proxy can reach (server-side request forgery):
//! every hop's URL is checked (scheme, [`FetchSettings::hosts`], an address written as the
//! host) and every name is resolved by [`reach::GuardedResolver`], which drops addresses out
//! of [`Reach`] before a connection is tried. Redirects are followed here, a few at most, each
//! hop checked the same way; no proxy from the environment is used (it would resolve the name
//! instead). A body is read up to [`FetchSettings::max_bytes`], the whole fetch within
//! [`FetchSettings::timeout`].

mod reach;

pub use reach::{Reach, is_public};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::header;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use reach::GuardedResolver;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use url::Url;

/// Most redirects one fetch follows.
pub const MAX_REDIRECTS: usize = 3;

/// What the proxy fetches, from where, and how much.
#[derive(Debug, Clone, PartialEq)]
pub struct FetchSettings {
    /// Which addresses a URL may lead to (`--image-fetch`).
    pub reach: Reach,
    /// When not empty, the only hosts fetched from: a name matches itself, and `.example.com`
    /// matches every name under `example.com` (`--image-fetch-host`).
    pub hosts: Vec<String>,
    /// Longest a fetch may take, redirects included (`--image-fetch-timeout`).
    pub timeout: Duration,
    /// Largest body taken, in bytes (`--image-fetch-max-mib`).
    pub max_bytes: usize,
    /// Certificates (PEM) trusted besides the system's roots (`--image-fetch-ca`).
    pub extra_roots: Option<PathBuf>,
}

impl Default for FetchSettings {
    /// Public addresses, any host, 10 s, 20 MiB.
    fn default() -> Self {
        Self {
            reach: Reach::Public,
            hosts: Vec::new(),
            timeout: Duration::from_secs(10),
            max_bytes: 20 * 1024 * 1024,
            extra_roots: None,
        }
    }
}

/// Why a URL was not fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Fetching is off.
    #[error(
        "this proxy fetches no image URLs (--image-fetch off): send the image as a data URL \
         (data:image/png;base64,...)"
    )]
    Off,
    /// Not a URL this fetcher takes.
    #[error("{0}")]
    Url(String),
    /// The host is not among `--image-fetch-host`.
    #[error("'{0}' is not among the hosts images are fetched from (--image-fetch-host)")]
    HostNotAllowed(String),
    /// The host, or every address it resolves to, is out of reach.
    #[error(
        "{}, which is not a public address; images are fetched from public addresses only \
         (--image-fetch any allows others)",
        leads_to(host, address)
    )]
    OutOfReach {
        /// The host as the URL names it.
        host: String,
        /// An address it leads to.
        address: IpAddr,
    },
    /// The name could not be resolved.
    #[error("'{host}' could not be resolved: {reason}")]
    Resolve {
        /// The host.
        host: String,
        /// Why.
        reason: String,
    },
    /// More redirects than [`MAX_REDIRECTS`].
    #[error("more than {MAX_REDIRECTS} redirects")]
    TooManyRedirects,
    /// The server did not answer 200.
    #[error("the server answered {0}")]
    Status(u16),
    /// The body is over [`FetchSettings::max_bytes`].
    #[error("the image is over {limit} bytes (--image-fetch-max-mib)")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// The fetch took longer than [`FetchSettings::timeout`].
    #[error("no answer within {0:?} (--image-fetch-timeout)")]
    TimedOut(Duration),
    /// The connection or the exchange failed.
    #[error("{0}")]
    Failed(String),
    /// The extra roots cannot be read (at start-up).
    #[error("cannot read the certificates of --image-fetch-ca {path}: {reason}")]
    Roots {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// `address`, or `host` and the address it leads to when the host is a name.
fn leads_to(host: &str, address: &IpAddr) -> String {
    match host.parse::<IpAddr>() {
        Ok(_) => address.to_string(),
        Err(_) => format!("'{host}' leads to {address}"),
    }
}

type FetchClient = Client<HttpsConnector<HttpConnector<GuardedResolver>>, Empty<Bytes>>;

/// Fetches URLs within its [`FetchSettings`].
#[derive(Debug)]
pub struct Fetcher {
    settings: FetchSettings,
    client: FetchClient,
    /// Why no certificate can be verified, when none can (https URLs are then refused).
    no_roots: Option<String>,
}

impl Fetcher {
    /// A fetcher; fails when the extra roots cannot be read.
    pub fn new(mut settings: FetchSettings) -> Result<Self, FetchError> {
        settings
            .hosts
            .iter_mut()
            .for_each(|h| h.make_ascii_lowercase());
        // rustls deprecates ring's provider for its lack of post-quantum key exchange. What is
        // fetched here are images a client named, recorded by hash: nothing a recorded
        // exchange would give away later; and ring builds in a fraction of aws-lc's time.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let extra_roots = match &settings.extra_roots {
            Some(path) => read_roots(path)?,
            None => Vec::new(),
        };
        let tls = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| FetchError::Failed(format!("TLS: {e}")))?;
        // A machine without root certificates (a slim container) still fetches http URLs;
        // https ones are refused saying why.
        let (tls, no_roots) =
            match rustls_platform_verifier::Verifier::new_with_extra_roots(extra_roots, provider) {
                Ok(verifier) => (
                    tls.dangerous()
                        .with_custom_certificate_verifier(Arc::new(verifier)),
                    None,
                ),
                Err(error) => {
                    if settings.reach != Reach::Off {
                        tracing::warn!(%error, "https image URLs will be refused");
                    }
                    let none = rustls::RootCertStore::empty();
                    (tls.with_root_certificates(none), Some(error.to_string()))
                }
            };
        let tls = tls.with_no_client_auth();
        let mut http = HttpConnector::new_with_resolver(GuardedResolver {
            reach: settings.reach,
        });
        http.enforce_http(false);
        http.set_connect_timeout(Some(settings.timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self {
            settings,
            client,
            no_roots,
        })
    }

    /// A fetcher that fetches nothing (`--image-fetch off`).
    pub fn off() -> Self {
        let settings = FetchSettings {
            reach: Reach::Off,
            ..FetchSettings::default()
        };
        Self::new(settings).expect("no file to read, so nothing to fail")
    }

    /// Whether URLs are fetched at all.
    pub fn is_on(&self) -> bool {
        self.settings.reach != Reach::Off
    }

    /// The body at `url`, following redirects, within the limits.
    pub async fn fetch(&self, url: &str) -> Result<Vec<u8>, FetchError> {
        if !self.is_on() {
            return Err(FetchError::Off);
        }
        let url = Url::parse(url).map_err(|e| FetchError::Url(format!("not a URL: {e}")))?;
        tokio::time::timeout(self.settings.timeout, self.follow(url))
            .await
            .map_err(|_| FetchError::TimedOut(self.settings.timeout))?
    }

    async fn follow(&self, mut url: Url) -> Result<Vec<u8>, FetchError> {
        for _ in 0..=MAX_REDIRECTS {
            self.check(&url)?;
            let uri: hyper::Uri = url
                .as_str()
                .parse()
                .map_err(|e| FetchError::Url(format!("not a URL: {e}")))?;
            let request = hyper::Request::get(uri)
                .header(
                    header::USER_AGENT,
                    concat!("rollout-proxy/", env!("CARGO_PKG_VERSION")),
                )
                .body(Empty::new())
                .map_err(|e| FetchError::Failed(e.to_string()))?;
            let response = self.client.request(request).await.map_err(failure)?;
            let status = response.status();
            if matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308) {
                let location = response
                    .headers()
                    .get(header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .ok_or(FetchError::Status(status.as_u16()))?;
                url = url
                    .join(location)
                    .map_err(|e| FetchError::Url(format!("a redirect to a bad URL: {e}")))?;
                continue;
            }
            if !status.is_success() {
                return Err(FetchError::Status(status.as_u16()));
            }
            return self.read(response.into_body()).await;
        }
        Err(FetchError::TooManyRedirects)
    }

    /// Refuses a URL this fetcher does not take: not `http(s)`, with credentials, a host not
    /// allowed, an address written as the host that is out of reach (such a host is never
    /// resolved, so the resolver cannot check it).
    fn check(&self, url: &Url) -> Result<(), FetchError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(FetchError::Url(format!(
                "'{}:' URLs are not fetched (http and https are)",
                url.scheme()
            )));
        }
        if let (Some(why), "https") = (&self.no_roots, url.scheme()) {
            return Err(FetchError::Url(format!(
                "https URLs cannot be fetched here: {why} (install the system's root \
                 certificates, or give --image-fetch-ca)"
            )));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(FetchError::Url(
                "URLs with credentials are not fetched".into(),
            ));
        }
        let host = url
            .host_str()
            .ok_or_else(|| FetchError::Url("the URL names no host".into()))?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if !self.host_allowed(bare) {
            return Err(FetchError::HostNotAllowed(bare.to_string()));
        }
        match bare.parse::<IpAddr>() {
            Ok(address) if !self.settings.reach.allows(address) => Err(FetchError::OutOfReach {
                host: bare.to_string(),
                address,
            }),
            _ => Ok(()),
        }
    }

    fn host_allowed(&self, host: &str) -> bool {
        let hosts = &self.settings.hosts;
        hosts.is_empty()
            || hosts.iter().any(|allowed| match allowed.strip_prefix('.') {
                Some(domain) => host
                    .strip_suffix(domain)
                    .is_some_and(|sub| sub.ends_with('.')),
                None => host.eq_ignore_ascii_case(allowed),
            })
    }

    /// The body, refused once it passes the limit (a declared length past it is refused
    /// before anything is read).
    async fn read(&self, mut body: hyper::body::Incoming) -> Result<Vec<u8>, FetchError> {
        use hyper::body::Body;
        let limit = self.settings.max_bytes;
        let too_large = FetchError::TooLarge { limit };
        let declared = body.size_hint().exact().unwrap_or(0);
        if declared > limit as u64 {
            return Err(too_large);
        }
        let mut bytes = Vec::with_capacity(declared as usize);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| FetchError::Failed(e.to_string()))?;
            if let Ok(data) = frame.into_data() {
                if bytes.len() + data.len() > limit {
                    return Err(too_large);
                }
                bytes.extend_from_slice(&data);
            }
        }
        Ok(bytes)
    }
}

/// A client error as a [`FetchError`]: the resolver's own when it refused, else the
/// innermost cause's text.
fn failure(error: hyper_util::client::legacy::Error) -> FetchError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    let mut last = error.to_string();
    while let Some(current) = cause {
        if let Some(refused) = current.downcast_ref::<FetchError>() {
            return match refused {
                FetchError::OutOfReach { host, address } => FetchError::OutOfReach {
                    host: host.clone(),
                    address: *address,
                },
                other => FetchError::Failed(other.to_string()),
            };
        }
        last = current.to_string();
        cause = current.source();
    }
    if last.contains("certificate") {
        last.push_str(" (--image-fetch-ca trusts another certificate authority)");
    }
    FetchError::Failed(last)
}

fn read_roots(path: &PathBuf) -> Result<Vec<CertificateDer<'static>>, FetchError> {
    let fail = |reason: String| FetchError::Roots {
        path: path.clone(),
        reason,
    };
    let roots = CertificateDer::pem_file_iter(path)
        .map_err(|e| fail(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(e.to_string()))?;
    if roots.is_empty() {
        return Err(fail("no certificate in it".into()));
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetcher(reach: Reach, hosts: &[&str]) -> Fetcher {
        Fetcher::new(FetchSettings {
            reach,
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            ..FetchSettings::default()
        })
        .unwrap()
    }

    fn check(fetcher: &Fetcher, url: &str) -> Result<(), String> {
        fetcher
            .check(&Url::parse(url).unwrap())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn each_hop_is_checked_before_it_is_fetched() {
        let public = fetcher(Reach::Public, &[]);
        assert_eq!(check(&public, "https://images.example.org/a.png"), Ok(()));
        for (url, why) in [
            ("ftp://example.org/a.png", "'ftp:' URLs are not fetched"),
            ("file:///etc/passwd", "'file:' URLs are not fetched"),
            ("http://user:pw@example.org/a.png", "credentials"),
            ("http://127.0.0.1:8000/a.png", "127.0.0.1"),
            // Other spellings of an address are read as the address.
            ("http://2130706433/a.png", "127.0.0.1"),
            ("http://0x7f.1/a.png", "127.0.0.1"),
            (
                "http://169.254.169.254/latest/meta-data/",
                "169.254.169.254",
            ),
            ("http://[::1]:8000/a.png", "::1"),
            ("http://[::ffff:10.0.0.1]/a.png", "10.0.0.1"),
        ] {
            let error = check(&public, url).unwrap_err();
            assert!(error.contains(why), "{url}: {error}");
        }
        let any = fetcher(Reach::Any, &[]);
        assert_eq!(check(&any, "http://127.0.0.1:8000/a.png"), Ok(()));
    }

    #[test]
    fn without_root_certificates_https_is_refused_saying_why_and_http_still_fetched() {
        let mut bare = fetcher(Reach::Any, &[]);
        bare.no_roots = Some("No CA certificates were loaded from the system".into());
        let error = check(&bare, "https://127.0.0.1/a.png").unwrap_err();
        assert!(error.contains("No CA certificates"), "{error}");
        assert!(error.contains("--image-fetch-ca"), "{error}");
        assert_eq!(check(&bare, "http://127.0.0.1/a.png"), Ok(()));
    }

    #[test]
    fn only_the_listed_hosts_are_fetched_from_when_hosts_are_listed() {
        let listed = fetcher(Reach::Any, &["cdn.example.org", ".images.example.com"]);
        for allowed in [
            "https://cdn.example.org/a.png",
            "https://CDN.example.org/a.png",
            "https://a.images.example.com/a.png",
            "https://b.a.images.example.com/a.png",
        ] {
            assert_eq!(check(&listed, allowed), Ok(()), "{allowed}");
        }
        for refused in [
            "https://example.org/a.png",
            "https://evil-cdn.example.org.attacker.test/a.png",
            "https://images.example.com/a.png",
            "https://xx-images.example.com/a.png",
            "http://127.0.0.1/a.png",
        ] {
            let error = check(&listed, refused).unwrap_err();
            assert!(error.contains("--image-fetch-host"), "{refused}: {error}");
        }
    }

    #[tokio::test]
    async fn nothing_is_fetched_when_fetching_is_off() {
        let off = fetcher(Reach::Off, &[]);
        let error = off.fetch("https://example.org/a.png").await.unwrap_err();
        assert!(matches!(error, FetchError::Off), "{error}");
    }

    #[test]
    fn extra_roots_must_hold_a_certificate() {
        let path = std::env::temp_dir().join(format!("no-roots-{}.pem", std::process::id()));
        std::fs::write(&path, "not a certificate").unwrap();
        let settings = FetchSettings {
            extra_roots: Some(path.clone()),
            ..FetchSettings::default()
        };
        let error = Fetcher::new(settings).unwrap_err();
        assert!(error.to_string().contains("no certificate"), "{error}");
        std::fs::remove_file(path).unwrap();
    }
}
