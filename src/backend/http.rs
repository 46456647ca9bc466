//! The HTTP plumbing the JSON backends share: requests with timeouts, auth and error mapping,
//! and server-sent-event parsing.

use super::{BackendError, EventStream, StreamEvent};
use crate::json_numbers::NumberArray;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;
use thread_local::ThreadLocal;

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

/// Longest wait for a health or metadata probe (`/health`, `/props`, `/openapi.json`).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an idle pooled connection to a backend is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// URLs a thread keeps parsed for one server (its few endpoints).
const URLS_KEPT: usize = 16;

/// One thread's client for a server, with the URLs it has parsed.
#[derive(Debug)]
struct ThreadClient {
    client: reqwest::Client,
    urls: RefCell<Vec<(String, reqwest::Url)>>,
}

/// A JSON-over-HTTP connection to one server.
#[derive(Debug, Clone)]
pub(crate) struct JsonClient {
    pub base_url: String,
    clients: Arc<ThreadLocal<ThreadClient>>,
    api_key: Option<String>,
    timeout: Duration,
}

impl JsonClient {
    pub fn new(base_url: &str, api_key: Option<String>, timeout: Duration) -> Self {
        Self {
            base_url: base_url.trim_end_matches('/').to_string(),
            clients: Arc::new(ThreadLocal::new()),
            api_key,
            timeout,
        }
    }

    /// This thread's client. Each server worker thread runs its own async runtime, and a
    /// pooled connection is driven by a task on the runtime that opened it: with one shared
    /// pool, a turn served on one thread often borrowed a connection of the other and had to
    /// wake that thread to send and again to hear the reply. One client per thread keeps a
    /// backend call on the thread that serves the turn (about 5% of a short turn's CPU).
    fn thread_client(&self) -> &ThreadClient {
        self.clients.get_or(|| ThreadClient {
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                // Under the 5 s after which llama-server, uvicorn (vLLM, SGLang) and most
                // servers close an idle connection: one the server is closing is not reused.
                .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                .tcp_nodelay(true)
                .build()
                .expect("HTTP client builds with default TLS-free settings"),
            urls: RefCell::new(Vec::new()),
        })
    }

    /// A request to `{root}{path}`, its URL parsed once per thread (parsing, with its host
    /// name checks, cost about 1% of a short turn).
    fn request(&self, method: reqwest::Method, root: &str, path: &str) -> reqwest::RequestBuilder {
        let thread = self.thread_client();
        let mut urls = thread.urls.borrow_mut();
        let known = urls.iter().find(|(text, _)| {
            text.len() == root.len() + path.len() && text.starts_with(root) && text.ends_with(path)
        });
        if let Some((_, url)) = known {
            return thread.client.request(method, url.clone());
        }
        let text = format!("{root}{path}");
        match reqwest::Url::parse(&text) {
            Ok(url) if urls.len() < URLS_KEPT => {
                urls.push((text, url.clone()));
                thread.client.request(method, url)
            }
            // reqwest reports a bad URL when the request is sent, as it always has.
            _ => thread.client.request(method, text),
        }
    }

    /// POSTs `body` to `{root}{path}` and returns the JSON reply parsed as `T`.
    pub async fn post<T: DeserializeOwned>(
        &self,
        root: &str,
        path: &str,
        body: &impl JsonBody,
    ) -> Result<T, BackendError> {
        let request = self.json_post(root, path, body);
        self.json(self.send(request, self.timeout).await?).await
    }

    /// POSTs `body` and returns the reply's byte stream (after checking its status).
    pub async fn post_stream(
        &self,
        root: &str,
        path: &str,
        body: &impl JsonBody,
    ) -> Result<futures::stream::BoxStream<'static, Result<bytes::Bytes, String>>, BackendError>
    {
        let request = self.json_post(root, path, body);
        let response = self.send(request, self.timeout).await?;
        let bytes = futures::StreamExt::map(response.bytes_stream(), |chunk| {
            chunk.map_err(|e| e.to_string())
        });
        Ok(futures::StreamExt::boxed(bytes))
    }

    fn json_post(&self, root: &str, path: &str, body: &impl JsonBody) -> reqwest::RequestBuilder {
        self.request(reqwest::Method::POST, root, path)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_json())
    }

    /// GETs `{root}{path}` and parses the JSON reply.
    pub async fn get_json(&self, root: &str, path: &str) -> Result<Value, BackendError> {
        let request = self.request(reqwest::Method::GET, root, path);
        self.json(self.send(request, self.timeout.min(PROBE_TIMEOUT)).await?)
            .await
    }

    /// GETs `{root}{path}` and succeeds on any 2xx status (health probes: a short timeout).
    pub async fn get_ok(&self, root: &str, path: &str) -> Result<(), BackendError> {
        let request = self.request(reqwest::Method::GET, root, path);
        self.send(request, self.timeout.min(PROBE_TIMEOUT))
            .await
            .map(drop)
    }

    /// Sends with the API key and `timeout`; a non-2xx status becomes [`BackendError::Status`]
    /// with the message of the server's error body.
    async fn send(
        &self,
        mut request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<reqwest::Response, BackendError> {
        request = request.timeout(timeout);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| self.transport_error(e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let bytes = response.bytes().await.unwrap_or_default();
        Err(BackendError::Status {
            url: self.base_url.clone(),
            status: status.as_u16(),
            message: error_message(&bytes),
        })
    }

    async fn json<T: DeserializeOwned>(
        &self,
        response: reqwest::Response,
    ) -> Result<T, BackendError> {
        let bytes = response
            .bytes()
            .await
            .map_err(|e| self.transport_error(e))?;
        serde_json::from_slice(&bytes).map_err(|e| self.protocol(format!("invalid JSON: {e}")))
    }

    pub fn protocol(&self, reason: impl Into<String>) -> BackendError {
        BackendError::Protocol {
            url: self.base_url.clone(),
            reason: reason.into(),
        }
    }

    fn transport_error(&self, error: reqwest::Error) -> BackendError {
        if error.is_timeout() {
            BackendError::Timeout {
                url: self.base_url.clone(),
                timeout: self.timeout,
            }
        } else {
            BackendError::Unreachable {
                url: self.base_url.clone(),
                reason: error.to_string(),
            }
        }
    }
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
    S: futures::Stream<Item = Result<bytes::Bytes, String>> + Send + 'static,
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
    bytes: impl futures::Stream<Item = Result<bytes::Bytes, String>>,
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
        let chunks: Vec<Result<bytes::Bytes, String>> = text
            .as_bytes()
            .chunks(3)
            .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
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
}
