//! The HTTP plumbing the JSON backends share: requests with timeouts, auth and error mapping,
//! and server-sent-event parsing.

use super::{BackendError, EventStream};
use crate::generation::StreamEvent;
use crate::json_numbers::NumberArray;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;
use thread_local::ThreadLocal;
use tokio::time::Instant;

/// A JSON request body whose token ids are written straight from the prompt (a long prompt
/// costs no JSON value per token); the other fields are those of `rest`, an object: a typed
/// struct where a backend's body is sent every turn, or a JSON value (reachable by index).
#[derive(Debug, Clone)]
pub struct IdsBody<'a, R = Value> {
    pub key: &'static str,
    pub ids: &'a [u32],
    pub rest: R,
}

impl<'a, R: Serialize> IdsBody<'a, R> {
    /// `ids` under `key`, then the fields of the object `rest`.
    pub fn new(key: &'static str, ids: &'a [u32], rest: R) -> Self {
        Self { key, ids, rest }
    }
}

/// A request body as the JSON bytes sent.
pub trait JsonBody {
    fn to_json(&self) -> Vec<u8>;
}

impl JsonBody for Value {
    fn to_json(&self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
}

impl<R: Serialize> JsonBody for IdsBody<'_, R> {
    /// One buffer sized up front, ids written by [`NumberArray`]: a 70k-token prompt is
    /// written every turn.
    fn to_json(&self) -> Vec<u8> {
        // Serialising a struct or a JSON object cannot fail: no map has non-string keys.
        let rest = serde_json::to_vec(&self.rest).unwrap_or_default();
        let mut out = Vec::with_capacity(self.key.len() + 8 * self.ids.len() + rest.len() + 8);
        out.extend_from_slice(b"{\"");
        out.extend_from_slice(self.key.as_bytes());
        out.extend_from_slice(b"\":");
        let mut array = NumberArray::new(&mut out);
        array.ids(self.ids);
        array.finish();
        match rest.strip_prefix(b"{").filter(|r| *r != b"}") {
            Some(fields) => {
                out.push(b',');
                out.extend_from_slice(fields);
            }
            None => out.push(b'}'),
        }
        out
    }
}

impl std::ops::Index<&str> for IdsBody<'_> {
    type Output = Value;
    fn index(&self, key: &str) -> &Value {
        &self.rest[key]
    }
}

impl std::ops::IndexMut<&str> for IdsBody<'_> {
    fn index_mut(&mut self, key: &str) -> &mut Value {
        &mut self.rest[key]
    }
}

/// The headers a request that continues a session carries its id in, for session affinity in
/// the routers before a fleet of servers, and the server's own prefix-cache bookkeeping:
/// vLLM's `X-Session-ID` (read by vLLM itself and by vLLM's router), and the SGLang model
/// gateway's consistent-hash key.
const AFFINITY_HEADERS: [header::HeaderName; 2] = [
    header::HeaderName::from_static("x-session-id"),
    header::HeaderName::from_static("x-smg-routing-key"),
];

/// A POST's JSON body, and the session the request continues.
struct Posted<'a> {
    json: Vec<u8>,
    session: Option<&'a str>,
}

/// Longest wait for a health or metadata probe (`/health`, `/props`, `/openapi.json`).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an idle pooled connection to a backend is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// URLs a thread keeps parsed for one server (its few endpoints).
const URLS_KEPT: usize = 16;

/// The HTTP/1 client: hyper's pooled client without a wrapper. A general-purpose client
/// (reqwest) re-parsed the URL for its redirect policy and again for its reply on every call,
/// about 4% of a short turn; a backend is one plain-HTTP server that needs none of that.
type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// One thread's client for a server, with the URLs it has parsed.
#[derive(Debug)]
struct ThreadClient {
    client: HttpClient,
    urls: RefCell<Vec<(String, Uri)>>,
}

/// A backend's reply, with the deadline its body must arrive by (the request's `timeout`
/// after it was sent).
struct Reply {
    response: hyper::Response<Incoming>,
    deadline: Instant,
    timeout: Duration,
}

/// A JSON-over-HTTP connection to one server.
#[derive(Debug, Clone)]
pub(crate) struct JsonClient {
    pub base_url: String,
    clients: Arc<ThreadLocal<ThreadClient>>,
    /// `Bearer <key>`, or why the key cannot be sent as a header.
    authorization: Option<Result<HeaderValue, String>>,
    timeout: Duration,
}

impl JsonClient {
    pub fn new(base_url: &str, api_key: Option<String>, timeout: Duration) -> Self {
        let authorization = api_key.map(|key| {
            let mut value = HeaderValue::try_from(format!("Bearer {key}"))
                .map_err(|_| "the API key holds characters a header cannot carry".to_string())?;
            value.set_sensitive(true);
            Ok(value)
        });
        Self {
            base_url: base_url.trim_end_matches('/').to_string(),
            clients: Arc::new(ThreadLocal::new()),
            authorization,
            timeout,
        }
    }

    /// This thread's client. Each server worker thread runs its own async runtime, and a
    /// pooled connection is driven by a task on the runtime that opened it: with one shared
    /// pool, a turn served on one thread often borrowed a connection of the other and had to
    /// wake that thread to send and again to hear the reply. One client per thread keeps a
    /// backend call on the thread that serves the turn (about 5% of a short turn's CPU).
    fn thread_client(&self) -> &ThreadClient {
        self.clients.get_or(|| {
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            ThreadClient {
                client: Client::builder(TokioExecutor::new())
                    .pool_max_idle_per_host(64)
                    // Under the 5 s after which llama-server, uvicorn (vLLM, SGLang) and most
                    // servers close an idle connection: one the server is closing is not reused.
                    .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                    .pool_timer(TokioTimer::new())
                    .build(connector),
                urls: RefCell::new(Vec::new()),
            }
        })
    }

    /// `{root}{path}` parsed, once per thread for the first few (the URLs of a server's few
    /// endpoints are the same on every call).
    fn url(&self, thread: &ThreadClient, root: &str, path: &str) -> Result<Uri, BackendError> {
        let mut urls = thread.urls.borrow_mut();
        let known = urls.iter().find(|(text, _)| {
            text.len() == root.len() + path.len() && text.starts_with(root) && text.ends_with(path)
        });
        if let Some((_, url)) = known {
            return Ok(url.clone());
        }
        let text = format!("{root}{path}");
        let url = text
            .parse::<Uri>()
            .map_err(|e| self.unreachable(format!("invalid URL {text:?}: {e}")))?;
        if urls.len() < URLS_KEPT {
            urls.push((text, url.clone()));
        }
        Ok(url)
    }

    /// POSTs `body` to `{root}{path}` and returns the JSON reply parsed as `T`. A request that
    /// continues `session` carries its id in the headers routers hash for session affinity.
    pub async fn post<T: DeserializeOwned>(
        &self,
        root: &str,
        path: &str,
        body: &impl JsonBody,
        session: Option<&str>,
    ) -> Result<T, BackendError> {
        let posted = Posted {
            json: body.to_json(),
            session,
        };
        let reply = self.send(root, path, Some(posted), self.timeout).await?;
        self.json(reply).await
    }

    /// POSTs `body` and returns the reply's byte stream (after checking its status). The
    /// request's timeout covers the whole stream, as it covers a whole reply.
    pub async fn post_stream(
        &self,
        root: &str,
        path: &str,
        body: &impl JsonBody,
        session: Option<&str>,
    ) -> Result<futures::stream::BoxStream<'static, Result<Bytes, String>>, BackendError> {
        let posted = Posted {
            json: body.to_json(),
            session,
        };
        let Reply {
            response,
            deadline,
            timeout,
        } = self.send(root, path, Some(posted), self.timeout).await?;
        let chunks = futures::stream::unfold(Some(response.into_body()), move |body| async move {
            let mut body = body?;
            loop {
                return match tokio::time::timeout_at(deadline, body.frame()).await {
                    Err(_) => Some((Err(format!("timed out after {timeout:?}")), None)),
                    Ok(None) => None,
                    Ok(Some(Err(e))) => Some((Err(error_chain(&e)), None)),
                    Ok(Some(Ok(frame))) => match frame.into_data() {
                        Ok(data) => Some((Ok(data), Some(body))),
                        // Trailers carry no events.
                        Err(_) => continue,
                    },
                };
            }
        });
        Ok(futures::StreamExt::boxed(chunks))
    }

    /// GETs `{root}{path}` and parses the JSON reply.
    pub async fn get_json(&self, root: &str, path: &str) -> Result<Value, BackendError> {
        let timeout = self.timeout.min(PROBE_TIMEOUT);
        let reply = self.send(root, path, None, timeout).await?;
        self.json(reply).await
    }

    /// GETs `{root}{path}` and succeeds on any 2xx status (health probes: a short timeout).
    pub async fn get_ok(&self, root: &str, path: &str) -> Result<(), BackendError> {
        let timeout = self.timeout.min(PROBE_TIMEOUT);
        self.send(root, path, None, timeout).await.map(drop)
    }

    /// Sends with the API key and `timeout` (for the reply and its body): a POST of `posted`,
    /// else a GET. A non-2xx status becomes [`BackendError::Status`] with the message of the
    /// server's error body. Redirects are not followed: a POST redirected elsewhere is a
    /// misconfigured backend URL, and the error says where the server pointed.
    async fn send(
        &self,
        root: &str,
        path: &str,
        posted: Option<Posted<'_>>,
        timeout: Duration,
    ) -> Result<Reply, BackendError> {
        let deadline = Instant::now() + timeout;
        let thread = self.thread_client();
        let is_post = posted.is_some();
        let method = if is_post { Method::POST } else { Method::GET };
        let (json, session) = match posted {
            Some(Posted { json, session }) => (Bytes::from(json), session),
            None => (Bytes::new(), None),
        };
        let mut request = hyper::Request::new(Full::new(json));
        *request.method_mut() = method;
        *request.uri_mut() = self.url(thread, root, path)?;
        let headers = request.headers_mut();
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        if is_post {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        // A session id is a UUID the proxy made: always a valid header value.
        if let Some(value) = session.and_then(|s| HeaderValue::from_str(s).ok()) {
            for name in AFFINITY_HEADERS {
                headers.insert(name, value.clone());
            }
        }
        if let Some(authorization) = &self.authorization {
            let value = authorization.clone().map_err(|e| self.unreachable(e))?;
            headers.insert(header::AUTHORIZATION, value);
        }
        let response = match tokio::time::timeout_at(deadline, thread.client.request(request)).await
        {
            Err(_) => return Err(self.timed_out(timeout)),
            Ok(sent) => sent.map_err(|e| self.unreachable(error_chain(&e)))?,
        };
        let status = response.status();
        if status.is_success() {
            return Ok(Reply {
                response,
                deadline,
                timeout,
            });
        }
        let location = response.headers().get(header::LOCATION).cloned();
        let reply = Reply {
            response,
            deadline,
            timeout,
        };
        let bytes = self.body(reply).await.unwrap_or_default();
        let message = match location {
            Some(location) if status.is_redirection() => format!(
                "redirect to {}: redirects are not followed, give the server's own URL",
                String::from_utf8_lossy(location.as_bytes())
            ),
            _ => error_message(&bytes),
        };
        Err(BackendError::Status {
            url: self.base_url.clone(),
            status: status.as_u16(),
            message,
        })
    }

    /// The whole body of `reply`, by its deadline.
    async fn body(&self, reply: Reply) -> Result<Bytes, BackendError> {
        match tokio::time::timeout_at(reply.deadline, reply.response.into_body().collect()).await {
            Err(_) => Err(self.timed_out(reply.timeout)),
            Ok(read) => read
                .map(|collected| collected.to_bytes())
                .map_err(|e| self.unreachable(error_chain(&e))),
        }
    }

    async fn json<T: DeserializeOwned>(&self, reply: Reply) -> Result<T, BackendError> {
        let bytes = self.body(reply).await?;
        serde_json::from_slice(&bytes).map_err(|e| self.protocol(format!("invalid JSON: {e}")))
    }

    pub fn protocol(&self, reason: impl Into<String>) -> BackendError {
        BackendError::Protocol {
            url: self.base_url.clone(),
            reason: reason.into(),
        }
    }

    fn unreachable(&self, reason: String) -> BackendError {
        BackendError::Unreachable {
            url: self.base_url.clone(),
            reason,
        }
    }

    fn timed_out(&self, timeout: Duration) -> BackendError {
        BackendError::Timeout {
            url: self.base_url.clone(),
            timeout,
        }
    }
}

/// An error with its causes (`client error (Connect): tcp connect error: Connection refused`):
/// the client's own message names only the stage that failed.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        let part = inner.to_string();
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        cause = inner.source();
    }
    text
}

/// The message of an error body in any of the shapes backends use
/// (`{"error":{"message"}}`, `{"error":"..."}`, `{"message"}`), or the raw text.
fn error_message(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(body) else {
        return text.trim().chars().take(500).collect();
    };
    json.pointer("/error/message")
        .or_else(|| json.get("error").filter(|e| e.is_string()))
        .or_else(|| json.get("message"))
        .and_then(|m| m.as_str())
        .map(str::to_string)
        .unwrap_or_else(|| text.chars().take(500).collect())
}

/// Sets each field whose value is present (absent ones keep the server's default).
pub(crate) fn set_present<'k>(
    target: &mut Value,
    fields: impl IntoIterator<Item = (&'k str, Option<Value>)>,
) {
    for (key, value) in fields {
        if let Some(value) = value {
            target[key] = value;
        }
    }
}

/// Strips a trailing `/v1` so both `http://host:8000` and `http://host:8000/v1` work.
pub(crate) fn server_root(base_url: &str) -> String {
    let trimmed = base_url.trim_end_matches('/');
    trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string()
}

/// Turns a backend's SSE reply into sample events: `on_chunk` maps each JSON chunk to events;
/// an `{"error": ...}` chunk becomes an error; the stream ends after the first finish or error
/// (so the connection is closed, and the backend's work cancelled, as soon as it is dropped).
pub(crate) fn event_stream<S, F>(http: JsonClient, bytes: S, mut on_chunk: F) -> EventStream
where
    S: futures::Stream<Item = Result<Bytes, String>> + Send + 'static,
    F: FnMut(&Value) -> Result<Vec<StreamEvent>, BackendError> + Send + 'static,
{
    use futures::StreamExt;
    let mut ended = false;
    let events = sse_events(bytes)
        .map(move |chunk| -> Vec<Result<StreamEvent, BackendError>> {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(e) => return vec![Err(http.protocol(e))],
            };
            if let Some(error) = chunk.get("error") {
                return vec![Err(BackendError::Status {
                    url: http.base_url.clone(),
                    status: error["code"].as_u64().unwrap_or(500) as u16,
                    message: error["message"]
                        .as_str()
                        .map_or_else(|| error.to_string(), str::to_string),
                })];
            }
            match on_chunk(&chunk) {
                Ok(events) => events.into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            }
        })
        .flat_map(futures::stream::iter)
        .take_while(move |event| {
            let go = !ended;
            ended |= matches!(event, Ok(StreamEvent::Finished { .. }) | Err(_));
            std::future::ready(go)
        });
    Box::pin(events)
}

/// The JSON payloads of a server-sent-events stream (`data: {...}` lines; `[DONE]` ends it).
pub(crate) fn sse_events(
    bytes: impl futures::Stream<Item = Result<Bytes, String>>,
) -> impl futures::Stream<Item = Result<Value, String>> {
    use futures::StreamExt;
    let mut buffer = Vec::<u8>::new();
    bytes
        .map(move |chunk| {
            let chunk = chunk?;
            buffer.extend_from_slice(&chunk);
            let mut events = Vec::new();
            while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=end).collect();
                let line = String::from_utf8_lossy(&line);
                let Some(data) = line.trim_end().strip_prefix("data:") else {
                    continue;
                };
                let data = data.trim();
                if data == "[DONE]" || data.is_empty() {
                    continue;
                }
                events.push(
                    serde_json::from_str(data).map_err(|e| format!("bad event {data:?}: {e}")),
                );
            }
            Ok::<_, String>(futures::stream::iter(events))
        })
        .flat_map(|batch| match batch {
            Ok(events) => events.left_stream(),
            Err(e) => futures::stream::iter(vec![Err(e)]).right_stream(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use serde_json::json;

    #[test]
    fn ids_bodies_are_the_json_serde_would_write() {
        // The numbers themselves are json_numbers' tests; this is the body around them.
        let ids = [0, 42, 151_643];
        let rest = json!({"sampling_params": {"max_new_tokens": 8}, "stream": true});
        let body = IdsBody::new("input_ids", &ids, rest);
        let parsed: Value = serde_json::from_slice(&body.to_json()).unwrap();
        assert_eq!(
            parsed,
            json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 8}, "stream": true})
        );
        assert!(
            body.to_json()
                .starts_with(b"{\"input_ids\":[0,42,151643],\"sampling_params\"")
        );
        for (ids, rest) in [(&[][..], json!({})), (&[5][..], json!({"n": 1}))] {
            let parsed: Value =
                serde_json::from_slice(&IdsBody::new("prompt", ids, rest.clone()).to_json())
                    .unwrap();
            let mut expected = json!({"prompt": ids});
            expected
                .as_object_mut()
                .unwrap()
                .extend(rest.as_object().unwrap().clone());
            assert_eq!(parsed, expected);
        }
    }

    #[tokio::test]
    async fn sse_events_survive_arbitrary_chunking() {
        let text = "data: {\"a\": 1}\n\n: keep-alive\n\ndata: {\"b\": [2]}\n\ndata: [DONE]\n\n";
        let chunks: Vec<Result<Bytes, String>> = text
            .as_bytes()
            .chunks(3)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let events: Vec<Value> = sse_events(futures::stream::iter(chunks))
            .map(|e| e.unwrap())
            .collect()
            .await;
        assert_eq!(
            events,
            vec![serde_json::json!({"a": 1}), serde_json::json!({"b": [2]})]
        );
    }

    /// A server that answers every connection's first request with `reply`, sending it in
    /// pieces and keeping the connection open; returns its root URL and the requests it read.
    async fn raw_server(
        reply: &'static str,
    ) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let root = format!("http://{}", listener.local_addr().unwrap());
        let (seen, requests) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            // Connections stay open: a reply shorter than it says never ends.
            let mut held = Vec::new();
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut buffer = vec![0u8; 65536];
                let read = socket.read(&mut buffer).await.unwrap_or(0);
                let _ = seen.send(String::from_utf8_lossy(&buffer[..read]).into_owned());
                for piece in reply.as_bytes().chunks(7) {
                    let _ = socket.write_all(piece).await;
                    let _ = socket.flush().await;
                }
                held.push(socket);
            }
        });
        (root, requests)
    }

    #[tokio::test]
    async fn posts_json_with_the_api_key_and_reads_a_chunked_reply_whole() {
        let (root, mut requests) = raw_server(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n\
             6\r\n{\"a\": \r\n3\r\n[1]\r\n1\r\n}\r\n0\r\n\r\n",
        )
        .await;
        let client = JsonClient::new(&root, Some("secret".into()), Duration::from_secs(5));
        let reply: Value = client
            .post(&root, "/generate", &json!({"x": 1}), Some("a-session"))
            .await
            .unwrap();
        assert_eq!(reply, json!({"a": [1]}));
        let request = requests.recv().await.unwrap().to_lowercase();
        assert!(
            request.starts_with("post /generate http/1.1\r\n"),
            "{request}"
        );
        assert!(
            request.contains("authorization: bearer secret\r\n"),
            "{request}"
        );
        assert!(
            request.contains("content-type: application/json\r\n"),
            "{request}"
        );
        assert!(request.ends_with("\r\n\r\n{\"x\":1}"), "{request}");
        for affinity in [
            "x-session-id: a-session\r\n",
            "x-smg-routing-key: a-session\r\n",
        ] {
            assert!(request.contains(affinity), "{request}");
        }
    }

    #[tokio::test]
    async fn a_redirect_is_an_error_naming_where_it_pointed() {
        let (root, _requests) = raw_server(
            "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://elsewhere:9/generate\r\ncontent-length: 0\r\n\r\n",
        )
        .await;
        let client = JsonClient::new(&root, None, Duration::from_secs(5));
        let error = client
            .post::<Value>(&root, "/generate", &json!({}), None)
            .await
            .unwrap_err();
        let BackendError::Status {
            status, message, ..
        } = &error
        else {
            panic!("{error:?}");
        };
        assert_eq!(*status, 307);
        assert!(message.contains("http://elsewhere:9/generate"), "{message}");
    }

    #[tokio::test]
    async fn failures_say_why() {
        // A port nothing listens on: the reason carries the system's words, not only the stage.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let root = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let client = JsonClient::new(&root, None, Duration::from_secs(5));
        match client.get_ok(&root, "/health").await {
            Err(BackendError::Unreachable { reason, .. }) => {
                assert!(reason.to_lowercase().contains("refused"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        // A server that never finishes its reply: the whole reply is under the timeout.
        let (root, _requests) = raw_server("HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{").await;
        let client = JsonClient::new(&root, None, Duration::from_millis(300));
        let error = client
            .post::<Value>(&root, "/x", &json!({}), None)
            .await
            .unwrap_err();
        assert!(
            matches!(error, BackendError::Timeout { timeout, .. } if timeout == Duration::from_millis(300)),
            "{error:?}"
        );
        // A URL that is not one, and a key that cannot be a header: errors, not panics.
        let client = JsonClient::new("http://bad host", None, Duration::from_secs(1));
        let error = client
            .get_ok("http://bad host", "/health")
            .await
            .unwrap_err();
        assert!(error.to_string().contains("invalid URL"), "{error}");
        let client = JsonClient::new(&root, Some("a\nb".into()), Duration::from_secs(1));
        let error = client.get_ok(&root, "/health").await.unwrap_err();
        assert!(error.to_string().contains("API key"), "{error}");
    }
}
