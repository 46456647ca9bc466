//! Helpers shared by the black-box tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The golden chat-template corpus (`fixtures/chat_templates`, see its README), or
/// `$ROLLOUT_PROXY_CONFORMANCE_DIR` (e.g. a held-out set in the same format).
pub fn conformance_dir() -> PathBuf {
    let dir = std::env::var_os("ROLLOUT_PROXY_CONFORMANCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/chat_templates")
        });
    assert!(
        dir.is_dir(),
        "conformance corpus not found at {}",
        dir.display()
    );
    dir
}

/// A real model folder (tokenizer.json + tokenizer_config.json) fetched by
/// `scripts/fetch-fixtures.sh`: qwen3, llama3_1, deepseek_v3, gemma3 or smollm2.
pub fn fixture_model(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/cache")
        .join(name);
    assert!(
        dir.join("tokenizer.json").is_file(),
        "fixture {name} missing: run scripts/fetch-fixtures.sh"
    );
    dir
}

pub mod client;
pub mod fleet;
pub mod image_host;
pub mod images;
pub mod llama;
pub mod mock_worker;
pub mod redis;
pub mod routing;
pub mod vllm;
pub mod vllm_generate;

/// Whether a server on 127.0.0.1:`port` answers `GET path` with 200 (readiness probes of the
/// real servers the tests start, without an async runtime).
pub fn answers_ok(port: u16, path: &str) -> bool {
    use std::io::{Read, Write};
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok_and(|mut stream| {
        let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(2)));
        let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        let _ = stream.write_all(request.as_bytes());
        let mut reply = String::new();
        let _ = stream.read_to_string(&mut reply);
        reply.starts_with("HTTP/1.1 200") || reply.starts_with("HTTP/1.0 200")
    })
}

/// The paths `names` of a tool the tests drive: from the environment when every one is set
/// (as `scripts/test.sh` sets them), else as `script` (in `scripts/`, which installs it into a
/// cache outside the clone) prints them, one `NAME=path` line each.
pub fn installed(script: &str, names: &[&str]) -> Vec<PathBuf> {
    let from_env: Option<Vec<PathBuf>> = names
        .iter()
        .map(|name| std::env::var_os(name).map(PathBuf::from))
        .collect();
    if let Some(paths) = from_env {
        return paths;
    }
    // Tests run at once: one install at a time (the next finds it done).
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(script);
    let output = std::process::Command::new(&script)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "{} failed: {}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8(output.stdout).unwrap();
    names
        .iter()
        .map(|name| {
            printed
                .lines()
                .find_map(|line| line.strip_prefix(&format!("{name}=")))
                .map(PathBuf::from)
                .unwrap_or_else(|| panic!("{} printed no {name}", script.display()))
        })
        .collect()
}

/// The environment variable `key` as a number, else `default` (bench sizes).
pub fn env_or(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// POSTs `body` to `url` and reads the JSON reply (for servers started as processes).
pub async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> serde_json::Value {
    client
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

use mock_worker::{MockWorker, Wire};
use rollout_proxy::backend::{BackendKind, PoolSettings};
use rollout_proxy::config::{ConfigFile, Settings};
use serde_json::Value;
use std::sync::Arc;

/// The Atropos test suite's mock chat format: `<role>content</role>` per message.
pub const ATROPOS_MOCK_TEMPLATE: &str = "{%- if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}\
{%- for m in messages %}<{{ m.role }}>{{ m.content or '' }}</{{ m.role }}>{%- endfor %}\
{%- if add_generation_prompt %}<assistant>{% endif %}";

/// A port free to listen on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process (a server the test started), killed when dropped, so a failing test stops
/// it too.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until the server at `base` answers `GET /health` (loading a model may take a while)
/// and returns that answer.
pub async fn wait_for_health(client: &reqwest::Client, base: &str) -> serde_json::Value {
    let start = std::time::Instant::now();
    loop {
        if let Ok(response) = client.get(format!("{base}/health")).send().await {
            return response.json().await.unwrap();
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(300),
            "{base} never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// An SGLang upstream whose answer depends only on the prompt: proxies restarted, or replicas
/// taking turns, get the same samples for the same prompt.
pub fn prompt_determined_upstream() -> mock_worker::MockWorker {
    let worker = mock_worker::MockWorker::start(mock_worker::Wire::Sglang);
    worker.respond_with(Arc::new(|prompt: &[u32]| {
        mock_worker::Sample::stop(chars(&format!("answer {}", prompt.len())))
    }));
    worker
}

/// A folder for one test's files under cargo's scratch directory for tests (`target/tmp`),
/// emptied first: tests leave nothing in the system's temporary directory.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A model folder with a character-level tokenizer (id = code point, like the Atropos mock
/// tokenizer) and the Atropos mock template. Built once per test process, in a folder named
/// by its contents' hash under `target/tmp` (so test processes share it, and a change to it
/// gets a new one); treat it as read-only.
pub fn char_model_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let tokenizer = char_tokenizer().to_string(false).unwrap();
        let config = serde_json::json!({"chat_template": ATROPOS_MOCK_TEMPLATE}).to_string();
        let hash = xxhash_rust::xxh3::xxh3_64(format!("{tokenizer}\0{config}").as_bytes());
        let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let dir = tmp.join(format!("char-model-{hash:016x}"));
        if !dir.join("tokenizer_config.json").is_file() {
            // Written aside and renamed into place: test processes may race to create it.
            let partial = tmp.join(format!("char-model-{}", uuid::Uuid::new_v4().simple()));
            std::fs::create_dir_all(&partial).unwrap();
            std::fs::write(partial.join("tokenizer.json"), tokenizer).unwrap();
            std::fs::write(partial.join("tokenizer_config.json"), config).unwrap();
            if std::fs::rename(&partial, &dir).is_err() {
                let _ = std::fs::remove_dir_all(&partial);
            }
        }
        dir
    })
    .clone()
}

fn char_tokenizer() -> tokenizers::Tokenizer {
    use tokenizers::SplitDelimiterBehavior;
    use tokenizers::decoders::fuse::Fuse;
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    let vocab: std::collections::HashMap<String, u32> = (1u32..0x10000)
        .filter_map(|cp| char::from_u32(cp).map(|c| (c.to_string(), cp)))
        .chain([("[UNK]".to_string(), 0)])
        .collect();
    let model = WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    let mut tokenizer = tokenizers::Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(
        Split::new(
            SplitPattern::Regex(r"[\s\S]".into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .unwrap(),
    ));
    tokenizer.with_decoder(Some(Fuse::new()));
    tokenizer
}

/// A running proxy in front of one scripted upstream.
pub struct Proxy {
    pub url: String,
    pub worker: MockWorker,
    client: reqwest::Client,
}

impl Proxy {
    /// A proxy for the model folder `model_dir` (its own template unless `template` is given).
    pub fn start(model_dir: PathBuf, template: Option<&str>, wire: Wire) -> Self {
        Self::start_with(model_dir, template, MockWorker::start(wire), |_| {})
    }

    pub fn start_with(
        model_dir: PathBuf,
        template: Option<&str>,
        worker: MockWorker,
        tweak: impl FnOnce(&mut Settings),
    ) -> Self {
        let mut settings = Settings {
            config: ConfigFile {
                pool: PoolSettings {
                    health_check_interval: 0.2,
                    retry_backoff: 0.01,
                    ..PoolSettings::default()
                },
                ..ConfigFile::default()
            },
            tokenizer: Some(model_dir),
            chat_template: template.map(str::to_string),
            backends: vec![worker.url.clone()],
            backend_kind: Some(match worker.wire {
                Wire::Sglang => BackendKind::Sglang,
                Wire::Vllm | Wire::VllmGenerate | Wire::VllmScaleOutOff => BackendKind::Vllm,
                Wire::OpenAiText => BackendKind::Openai,
            }),
            model_name: Some("test_model".into()),
            default_max_tokens: None,
            max_body_bytes: 1024 * 1024,
            ..Settings::default()
        };
        tweak(&mut settings);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (ready, started) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let state = Arc::new(settings.build().await.unwrap());
                let server = rollout_proxy::http::serve(state, listener, None).unwrap();
                ready.send(()).unwrap();
                server.await.unwrap()
            })
        });
        started.recv().expect("proxy started");
        Self {
            url,
            worker,
            client: reqwest::Client::new(),
        }
    }

    /// A client of a proxy started elsewhere (a `serve` process) at `url` in front of
    /// `worker`, once it answers.
    pub async fn attach(url: String, worker: MockWorker) -> Self {
        let client = reqwest::Client::new();
        wait_for_health(&client, &url).await;
        Self {
            url,
            worker,
            client,
        }
    }

    /// The Atropos setup in front of one SGLang upstream that takes one request at a time, with
    /// the pool's queue holding at most `max_queued` requests.
    pub fn single_slot(max_queued: usize) -> Self {
        let worker = MockWorker::start(Wire::Sglang);
        let url = worker.url.clone();
        Self::start_with(char_model_dir(), None, worker, move |settings| {
            settings.backends.clear();
            settings.config.servers = vec![rollout_proxy::backend::BackendConfig {
                num_max_requests_at_once: 1,
                ..rollout_proxy::backend::BackendConfig::new(&url, BackendKind::Sglang)
            }];
            settings.config.pool.max_queued_requests = max_queued;
        })
    }

    /// The Atropos-suite setup: char tokenizer, mock template, SGLang-format upstream.
    pub fn atropos() -> Self {
        Self::start(char_model_dir(), None, Wire::Sglang)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        send(self.client.get(format!("{}{path}", self.url))).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.post_raw(path, body.to_string()).await
    }

    pub async fn post_raw(&self, path: &str, body: String) -> (u16, Value) {
        let request = self
            .client
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(body);
        send(request).await
    }

    /// POSTs `pieces` as one chunked body, each piece its own chunk.
    pub async fn post_chunked(&self, path: &str, pieces: Vec<String>) -> (u16, Value) {
        let chunks = futures::stream::iter(
            pieces
                .into_iter()
                .map(|piece| Ok::<_, std::io::Error>(bytes::Bytes::from(piece))),
        );
        let request = self
            .client
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(chunks));
        send(request).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        send(self.client.delete(format!("{}{path}", self.url))).await
    }

    /// Creates a session with `body` and returns its uuid.
    pub async fn session(&self, body: Value) -> String {
        let (status, data) = self.post("/sessions/create", body).await;
        assert_eq!(status, 200, "{data}");
        data["uuid"].as_str().unwrap().to_string()
    }

    pub async fn chat(&self, uuid: &str, body: Value) -> (u16, Value) {
        self.post(&format!("/{uuid}/v1/chat/completions"), body)
            .await
    }

    /// A streamed chat turn: the status, the raw SSE text, and the JSON of each `data:` event
    /// (`[DONE]` as the string "[DONE]").
    pub async fn chat_stream(&self, uuid: &str, body: Value) -> (u16, String, Vec<Value>) {
        let response = self.start_stream(uuid, body).await;
        let status = response.status().as_u16();
        let raw = response.text().await.unwrap();
        let events = raw
            .split("\n\n")
            .filter_map(|block| block.strip_prefix("data: "))
            .map(|data| serde_json::from_str(data).unwrap_or_else(|_| Value::from(data)))
            .collect();
        (status, raw, events)
    }

    /// Starts a streamed turn and hangs up (closes the socket) once the response holds `seen`
    /// (`"data: "`: after the first chunk), like a client that goes away.
    pub async fn chat_stream_and_hang_up(&self, uuid: &str, body: Value, seen: &str) {
        self.stream_and_hang_up(&format!("/{uuid}/v1/chat/completions"), body, seen)
            .await
    }

    /// Like [`Proxy::chat_stream_and_hang_up`], for a streamed request to any `path`.
    pub async fn stream_and_hang_up(&self, path: &str, mut body: Value, seen: &str) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        body["stream"] = Value::Bool(true);
        let body = body.to_string();
        let address = self.url.trim_start_matches("http://");
        let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut received = Vec::new();
        let mut buffer = [0u8; 4096];
        while !String::from_utf8_lossy(&received).contains(seen) {
            let n = socket.read(&mut buffer).await.unwrap();
            assert!(n > 0, "the stream ended before its first chunk");
            received.extend_from_slice(&buffer[..n]);
        }
    }

    /// A streamed request to `path` (`stream: true` is set): the status, the raw event
    /// stream, and each event as `(event name or "", its data as JSON)`.
    pub async fn post_stream(
        &self,
        path: &str,
        mut body: Value,
    ) -> (u16, String, Vec<(String, Value)>) {
        body["stream"] = Value::Bool(true);
        let response = self
            .client
            .post(format!("{}{path}", self.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let raw = response.text().await.unwrap();
        (status, raw.clone(), sse_events(&raw))
    }

    /// Starts a streamed turn; the response as it arrives.
    pub async fn start_stream(&self, uuid: &str, mut body: Value) -> reqwest::Response {
        body["stream"] = Value::Bool(true);
        self.client
            .post(format!("{}/{uuid}/v1/chat/completions", self.url))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// Waits (up to 5 s) until every backend is healthy again.
    pub async fn wait_until_healthy(&self) {
        for _ in 0..50 {
            let (_, status) = self.get("/servers").await;
            if status["servers"]
                .as_array()
                .unwrap()
                .iter()
                .all(|s| s["healthy"] == true)
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("backends stayed unhealthy");
    }

    /// Scripts the upstream's next sample, then runs a chat turn.
    /// One chat turn, "hi" answered "ok" (the char model's ids), that must succeed: its reply.
    pub async fn hi(&self, uuid: &str) -> Value {
        let body = serde_json::json!({"messages": [{"role": "user", "content": "hi"}]});
        let (status, reply) = self
            .turn(uuid, mock_worker::Sample::stop(chars("ok")), body)
            .await;
        assert_eq!(status, 200, "{reply}");
        reply
    }

    pub async fn turn(&self, uuid: &str, sample: mock_worker::Sample, body: Value) -> (u16, Value) {
        self.worker.push_sample(sample);
        self.chat(uuid, body).await
    }

    /// `GET /metrics`: Prometheus' text.
    pub async fn metrics_text(&self) -> String {
        reqwest::get(format!("{}/metrics", self.url))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub async fn render(&self, uuid: &str, body: Value) -> Value {
        let (status, data) = self
            .post(&format!("/{uuid}/v1/chat/completions/render"), body)
            .await;
        assert_eq!(status, 200, "{data}");
        data
    }

    pub async fn nodes(&self, uuid: &str) -> Vec<Value> {
        let (status, data) = self.get(&format!("/{uuid}/nodes")).await;
        assert_eq!(status, 200, "{data}");
        data["nodes"].as_array().unwrap().clone()
    }
}

/// The events of an event stream: `(event name or "", data as JSON)`; comments are skipped.
pub fn sse_events(raw: &str) -> Vec<(String, Value)> {
    raw.split("\n\n")
        .filter_map(|block| {
            let mut name = String::new();
            let mut data = None;
            for line in block.lines() {
                if let Some(value) = line.strip_prefix("event: ") {
                    name = value.to_string();
                } else if let Some(value) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str(value).unwrap_or_else(|_| Value::from(value)));
                }
            }
            data.map(|data| (name, data))
        })
        .collect()
}

/// Status and JSON body of a request (`null` when the body is not JSON).
async fn send(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request.send().await.unwrap();
    (
        response.status().as_u16(),
        response.json().await.unwrap_or(Value::Null),
    )
}

/// An OpenAI-shaped error body: `{"error": {"message", "type", "code"}}`.
pub fn assert_openai_error(data: &Value) {
    for key in ["message", "type", "code"] {
        assert!(data["error"].get(key).is_some(), "missing {key}: {data}");
    }
}

/// A proxy with Qwen3's tokenizer and template before an SGLang-format upstream, and that
/// tokenizer (to script the upstream's samples in Qwen3's formats).
pub fn qwen3_proxy() -> (rollout_proxy::tokenizer::Tokenizer, Proxy) {
    let tokenizer =
        rollout_proxy::tokenizer::Tokenizer::from_path(&fixture_model("qwen3")).unwrap();
    (
        tokenizer,
        Proxy::start(fixture_model("qwen3"), None, Wire::Sglang),
    )
}

/// The ids of a node the model sampled (its unmasked positions), in order.
pub fn sampled_ids(node: &Value) -> Vec<u32> {
    let masked: Vec<i64> = serde_json::from_value(node["masked_tokens"].clone()).unwrap();
    masked
        .iter()
        .filter(|&&m| m != -100)
        .map(|&m| m as u32)
        .collect()
}

/// Code points of `text`: what the char tokenizer (and the Atropos mock) encodes it to.
pub fn chars(text: &str) -> Vec<u32> {
    text.chars().map(|c| c as u32).collect()
}

/// Every node's lengths agree and masks follow the sampled positions.
pub fn assert_node_shape(node: &Value) {
    let tokens = node["tokens"].as_array().unwrap();
    let masked = node["masked_tokens"].as_array().unwrap();
    let logprobs = node["logprobs"].as_array().unwrap();
    assert_eq!(tokens.len(), masked.len());
    assert_eq!(tokens.len(), logprobs.len());
    for ((t, m), lp) in tokens.iter().zip(masked).zip(logprobs) {
        if m.as_i64() == Some(-100) {
            assert_eq!(lp.as_f64(), Some(1.0));
        } else {
            assert_eq!(t, m);
            // 0.0 is a sampled token's logprob where a grammar left it the only choice (vLLM
            // reports the masked distribution's).
            assert!(lp.as_f64().unwrap() <= 0.0, "{lp}");
        }
    }
}

/// The in-process engine's settings the tests run it with: small, one thread.
pub fn engine_settings() -> rollout_proxy::engine::EngineSettings {
    rollout_proxy::engine::EngineSettings {
        context: 2048,
        slots: 4,
        batch: 512,
        threads: 1,
    }
}

/// A proxy serving the default model's GGUF (SmolLM2-135M-Instruct) in-process: its own
/// vocabulary, the bundled Hermes template.
pub fn engine_proxy() -> Proxy {
    Proxy::start_with(
        char_model_dir(),
        None,
        mock_worker::MockWorker::start(mock_worker::Wire::Sglang),
        |s| {
            s.backends.clear();
            s.tokenizer = None;
            s.model = Some(fixture_model("smollm2").join("model.gguf"));
            s.engine = engine_settings();
            s.chat_template = Some("hermes".into());
        },
    )
}

/// Harbor's ATIF validator (scripts/install-atif-validator.sh, which scripts/test.sh runs):
/// `(python, folder on PYTHONPATH)`.
pub fn atif_validator() -> (PathBuf, PathBuf) {
    let mut paths =
        installed("install-atif-validator.sh", &["ATIF_PYTHON", "ATIF_HARBOR"]).into_iter();
    (paths.next().unwrap(), paths.next().unwrap())
}

/// Harbor's own validator accepts `document`.
pub fn assert_valid_atif(document: &Value, name: &str) {
    let path = scratch_dir(name).join("trajectory.json");
    std::fs::write(&path, serde_json::to_vec(document).unwrap()).unwrap();
    let (python, harbor) = atif_validator();
    let output = std::process::Command::new(python)
        .env("PYTHONPATH", harbor)
        .args(["-m", "harbor.utils.trajectory_validator"])
        .arg(&path)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "Harbor's validator: {said}");
}
