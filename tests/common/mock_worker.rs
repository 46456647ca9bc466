//! A scripted inference server speaking SGLang's `/generate` or vLLM's `/v1/completions` wire
//! format exactly. Each request pops the next scripted reply and is recorded; past the script,
//! a responder answers, and a fault injector beside it may fail the request instead. The
//! server can be killed (its connections dropped) and restarted on the same address.

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// SGLang `POST /generate`.
    Sglang,
    /// vLLM `POST /v1/completions` (its /openapi.json lists no tokens-in endpoint).
    Vllm,
    /// vLLM with the tokens-in `POST /inference/v1/generate` listed in /openapi.json.
    VllmGenerate,
    /// vLLM 0.32 started as users start it (without `--enable-scale-out`): /openapi.json lists
    /// `/inference/v1/generate`, which answers 403 with vLLM's own message; tokens go over
    /// `/v1/completions`.
    VllmScaleOutOff,
    /// A text-only OpenAI `POST /v1/completions` (ids are code points: use the char model).
    OpenAiText,
}

impl Wire {
    fn path(self) -> &'static str {
        match self {
            Wire::Sglang => "/generate",
            Wire::Vllm | Wire::VllmScaleOutOff | Wire::OpenAiText => "/v1/completions",
            Wire::VllmGenerate => "/inference/v1/generate",
        }
    }
}

/// One sampled continuation to return.
#[derive(Debug, Clone)]
pub struct Sample {
    pub ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// "stop" or "length".
    pub finish: &'static str,
    /// What stopped it: a token id or a stop string.
    pub matched: Value,
}

impl Sample {
    pub fn stop(ids: Vec<u32>) -> Self {
        let logprobs = (0..ids.len()).map(|i| -0.1 - i as f32 * 0.01).collect();
        let matched = ids.last().map(|&id| json!(id)).unwrap_or(Value::Null);
        Self {
            ids,
            logprobs,
            finish: "stop",
            matched,
        }
    }
    pub fn length(ids: Vec<u32>) -> Self {
        Self {
            finish: "length",
            matched: Value::Null,
            ..Self::stop(ids)
        }
    }
    pub fn stop_string(ids: Vec<u32>, stop: &str) -> Self {
        Self {
            matched: json!(stop),
            ..Self::stop(ids)
        }
    }
}

/// A scripted reply: samples, or an HTTP error, or a delay past the proxy's timeout.
#[derive(Debug, Clone)]
pub enum Reply {
    Samples(Vec<Sample>),
    Error(u16, &'static str),
    /// A `307` to this URL.
    Redirect(&'static str),
    SleepMs(u64),
    /// Samples returned after a delay.
    Delayed(u64, Vec<Sample>),
    /// A streamed sample whose stream ends after this many tokens, unfinished (the connection
    /// is closed as by a server that died).
    CutStream(usize, Sample),
    /// The connection is dropped after the status line, before any body.
    Reset,
}

/// What a fault injector puts in place of a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// An HTTP error with this status.
    Status(u16),
    /// The connection dropped before the body.
    Reset,
    /// No answer for this many milliseconds (then a 500).
    Hang(u64),
    /// A stream cut after this many tokens (a whole request is reset instead).
    Cut(usize),
}

/// Decides, from a request's prompt ids, whether it fails and how.
pub type FaultInjector = Arc<dyn Fn(&[u32]) -> Option<Fault> + Send + Sync>;

#[derive(Default)]
struct Shared {
    script: VecDeque<Reply>,
    requests: Vec<Value>,
    in_flight: usize,
    max_in_flight: usize,
    /// Delay between streamed tokens.
    token_delay_ms: u64,
    /// Streams that the client closed before their end.
    cancelled_streams: usize,
    /// Answers requests once the script is empty (load tests); requests are then not kept.
    responder: Option<Responder>,
    /// Fails some of the requests the responder would answer.
    faults: Option<FaultInjector>,
    /// Requests refused at the tokens-in endpoint (`Wire::VllmScaleOutOff`).
    refused_generate: usize,
    /// Each scripted request's session-affinity headers (`x-session-id`, `x-smg-routing-key`).
    affinity: Vec<(Option<String>, Option<String>)>,
    /// The model `GET /v1/models` lists (`id`, `max_model_len`), once declared; `POST /tokenize`
    /// answers only then.
    model_card: Option<(String, u32)>,
    /// Added to every id `POST /tokenize` gives (a server with another tokenizer).
    tokenize_shift: u32,
    /// How many placeholders each image of a tokens-in request expands to ([`super::vllm_generate`]).
    image_runs: Vec<usize>,
    /// The images the tokens-in route keeps, by uuid.
    image_cache: std::collections::HashSet<String>,
}

/// Chooses the sample for a request's prompt ids.
pub type Responder = Arc<dyn Fn(&[u32]) -> Sample + Send + Sync>;

/// A running scripted upstream.
#[derive(Clone)]
pub struct MockWorker {
    pub url: String,
    pub wire: Wire,
    shared: Arc<Mutex<Shared>>,
    address: std::net::SocketAddr,
    /// The running server (none while killed).
    server: Arc<Mutex<Option<actix_web::dev::ServerHandle>>>,
}

impl MockWorker {
    pub fn start(wire: Wire) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let server = serve(listener, shared.clone(), wire);
        Self {
            url: format!("http://{address}"),
            wire,
            shared,
            address,
            server: Arc::new(Mutex::new(Some(server))),
        }
    }

    /// Stops the server at once, dropping its connections (requests and streams under way),
    /// as a crash would.
    pub async fn kill(&self) {
        let server = self.server.lock().unwrap().take();
        if let Some(server) = server {
            server.stop(false).await;
        }
    }

    /// Starts the server again on its address, with its script and responder.
    pub fn restart(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let listener = loop {
            match std::net::TcpListener::bind(self.address) {
                Ok(listener) => break listener,
                Err(error) if std::time::Instant::now() > deadline => panic!("rebind: {error}"),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        };
        let server = serve(listener, self.shared.clone(), self.wire);
        *self.server.lock().unwrap() = Some(server);
    }

    /// Fails the requests `injector` picks among those the responder answers.
    pub fn inject_faults(&self, injector: FaultInjector) {
        self.shared.lock().unwrap().faults = Some(injector);
    }

    /// Queues the reply to the next request.
    pub fn push(&self, reply: Reply) {
        self.shared.lock().unwrap().script.push_back(reply);
    }

    /// Answers every request past the script with `responder` (for load: nothing is recorded).
    pub fn respond_with(&self, responder: Responder) {
        self.shared.lock().unwrap().responder = Some(responder);
    }

    /// Queues one sample.
    pub fn push_sample(&self, sample: Sample) {
        self.push(Reply::Samples(vec![sample]));
    }

    /// Every request body received so far.
    pub fn requests(&self) -> Vec<Value> {
        self.shared.lock().unwrap().requests.clone()
    }

    /// Lists `id` in `GET /v1/models` with `max_model_len`, and answers `POST /tokenize`.
    pub fn serve_model(&self, id: &str, max_model_len: u32) {
        self.shared.lock().unwrap().model_card = Some((id.to_string(), max_model_len));
    }

    /// Expands each image of a tokens-in request to this many placeholders, in order, as vLLM
    /// would for the model's processor ([`super::vllm_generate`]).
    pub fn expand_images(&self, runs: Vec<usize>) {
        self.shared.lock().unwrap().image_runs = runs;
    }

    /// Empties the tokens-in route's image cache (as an eviction or a restart would).
    pub fn forget_images(&self) {
        self.shared.lock().unwrap().image_cache.clear();
    }

    /// Adds `by` to every id `POST /tokenize` answers (a server with another tokenizer).
    pub fn shift_tokenizer(&self, by: u32) {
        self.shared.lock().unwrap().tokenize_shift = by;
    }

    /// Each request's session-affinity headers: vLLM's `X-Session-ID` and the SGLang
    /// gateway's `X-SMG-Routing-Key`.
    pub fn affinity_headers(&self) -> Vec<(Option<String>, Option<String>)> {
        self.shared.lock().unwrap().affinity.clone()
    }

    /// Requests the tokens-in endpoint refused (`Wire::VllmScaleOutOff`).
    pub fn refused_generate(&self) -> usize {
        self.shared.lock().unwrap().refused_generate
    }

    /// Streams one token every `ms` milliseconds.
    pub fn set_token_delay(&self, ms: u64) {
        self.shared.lock().unwrap().token_delay_ms = ms;
    }

    /// How many streams the client (the proxy) closed before they ended.
    pub fn cancelled_streams(&self) -> usize {
        self.shared.lock().unwrap().cancelled_streams
    }

    /// The most requests that were in progress at once.
    pub fn max_in_flight(&self) -> usize {
        self.shared.lock().unwrap().max_in_flight
    }

    /// The prompt ids of the last request.
    pub fn last_prompt(&self) -> Vec<u32> {
        let last = self.requests().pop().expect("a request was made");
        match self.wire {
            Wire::Sglang => serde_json::from_value(last["input_ids"].clone()).unwrap(),
            Wire::Vllm | Wire::VllmScaleOutOff => {
                serde_json::from_value(last["prompt"].clone()).unwrap()
            }
            Wire::VllmGenerate => serde_json::from_value(last["token_ids"].clone()).unwrap(),
            Wire::OpenAiText => last["prompt"]
                .as_str()
                .unwrap()
                .chars()
                .map(|c| c as u32)
                .collect(),
        }
    }
}

/// Runs the server on `listener` in a thread of its own; returns its handle.
fn serve(
    listener: std::net::TcpListener,
    shared: Arc<Mutex<Shared>>,
    wire: Wire,
) -> actix_web::dev::ServerHandle {
    let (handle_sender, server_handle) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let data = web::Data::new((shared, wire));
            let server = HttpServer::new(move || {
                App::new()
                    .app_data(data.clone())
                    .route("/generate", web::post().to(handle))
                    .route("/v1/completions", web::post().to(handle))
                    .route("/inference/v1/generate", web::post().to(handle))
                    .route("/openapi.json", web::get().to(openapi))
                    .route("/v1/models", web::get().to(models))
                    .route("/tokenize", web::post().to(tokenize))
                    .route(
                        "/health",
                        web::get().to(|| async { HttpResponse::Ok().finish() }),
                    )
            })
            // As the real servers do (uvicorn sets TCP_NODELAY): each streamed token is
            // sent at once, not held for the proxy's delayed ACK.
            .on_connect(|connection, _| {
                if let Some(socket) = connection.downcast_ref::<actix_web::rt::net::TcpStream>() {
                    let _ = socket.set_nodelay(true);
                }
            })
            .workers(1)
            .shutdown_timeout(0)
            .listen(listener)
            .unwrap()
            .run();
            handle_sender.send(server.handle()).unwrap();
            server.await.unwrap()
        })
    });
    server_handle.recv().unwrap()
}

async fn handle(
    req: HttpRequest,
    body: web::Json<Value>,
    data: web::Data<(Arc<Mutex<Shared>>, Wire)>,
) -> HttpResponse {
    let (shared, wire) = data.get_ref();
    if *wire == Wire::VllmScaleOutOff && req.path() == "/inference/v1/generate" {
        shared.lock().unwrap().refused_generate += 1;
        return HttpResponse::Forbidden().json(json!({"error": {
            "message": "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.",
            "type": "PermissionDeniedError", "param": null, "code": 403}}));
    }
    if req.path() != wire.path() {
        return HttpResponse::NotFound()
            .json(json!({"error": {"message": "wrong endpoint", "code": 404}}));
    }
    let cached = super::vllm_generate::cached(&body, &mut shared.lock().unwrap().image_cache);
    if let Err(message) = cached {
        return HttpResponse::BadRequest().json(json!({"error": {
            "message": message, "type": "BadRequestError", "param": null, "code": 400}}));
    }
    let reply = {
        let mut shared = shared.lock().unwrap();
        shared.in_flight += 1;
        shared.max_in_flight = shared.max_in_flight.max(shared.in_flight);
        match (shared.script.pop_front(), &shared.responder) {
            (None, Some(responder)) => {
                let prompt: Vec<u32> =
                    serde_json::from_value(body["input_ids"].clone()).unwrap_or_default();
                let sample = responder(&prompt);
                let fault = shared.faults.as_ref().and_then(|faults| faults(&prompt));
                Some(match fault {
                    None => Reply::Samples(vec![sample]),
                    Some(Fault::Status(status)) => Reply::Error(status, "injected fault"),
                    Some(Fault::Reset) => Reply::Reset,
                    Some(Fault::Hang(ms)) => Reply::SleepMs(ms),
                    Some(Fault::Cut(after)) if body["stream"] == true => {
                        Reply::CutStream(after, sample)
                    }
                    Some(Fault::Cut(_)) => Reply::Reset,
                })
            }
            (scripted, _) => {
                shared.requests.push(body.0.clone());
                let header = |name: &str| {
                    let value = req.headers().get(name)?.to_str().ok()?;
                    Some(value.to_string())
                };
                shared
                    .affinity
                    .push((header("x-session-id"), header("x-smg-routing-key")));
                scripted
            }
        }
    };
    let mut body = body.0;
    if let Some((prompt, placed)) =
        super::vllm_generate::expand(&body, &shared.lock().unwrap().image_runs)
    {
        // Read back by the replies below, as vLLM reports the prompt it expanded.
        body["prompt_token_ids"] = json!(prompt);
        body["mm_placeholders"] = placed;
    }
    if body["stream"] == true {
        let streamed = match &reply {
            Some(Reply::Samples(samples)) => Some((&samples[0], None)),
            Some(Reply::CutStream(after, sample)) => Some((sample, Some(*after))),
            _ => None,
        };
        if let Some((sample, cut)) = streamed {
            shared.lock().unwrap().in_flight -= 1;
            return stream_reply(shared.clone(), (&body, sample), *wire, cut);
        }
    }
    let response = respond(reply, &body, *wire).await;
    shared.lock().unwrap().in_flight -= 1;
    response
}

async fn respond(reply: Option<Reply>, body: &Value, wire: Wire) -> HttpResponse {
    match reply {
        None => HttpResponse::InternalServerError()
            .json(json!({"error": {"message": "script exhausted", "code": 500}})),
        Some(Reply::Error(status, message)) => HttpResponse::build(
            actix_web::http::StatusCode::from_u16(status).unwrap(),
        )
        .json(json!({"error": {"message": message, "type": "BadRequestError", "code": status}})),
        Some(Reply::Redirect(location)) => HttpResponse::TemporaryRedirect()
            .insert_header(("location", location))
            .finish(),
        Some(Reply::SleepMs(ms)) => {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            HttpResponse::InternalServerError().finish()
        }
        Some(Reply::Delayed(ms, samples)) => {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            samples_reply(body, &samples, wire)
        }
        Some(Reply::Samples(samples)) => samples_reply(body, &samples, wire),
        Some(Reply::CutStream(_, sample)) => samples_reply(body, &[sample], wire),
        Some(Reply::Reset) => {
            let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
            HttpResponse::Ok().streaming(futures::stream::once(async move {
                Err::<bytes::Bytes, _>(reset)
            }))
        }
    }
}

/// One SSE chunk per token, in the wire's streaming shape (SGLang: cumulative; vLLM: deltas).
fn stream_chunks(sample: &Sample, wire: Wire) -> Vec<Value> {
    let n = sample.ids.len();
    (1..=n)
        .map(|k| {
            let last = k == n;
            match wire {
                Wire::Sglang => {
                    let finish = if !last {
                        Value::Null
                    } else if sample.finish == "length" {
                        json!({"type": "length", "length": n})
                    } else {
                        json!({"type": "stop", "matched": sample.matched})
                    };
                    // Cumulative, as SGLang streams by default; the spans on the last chunk.
                    let spans = json!([{"version": "default", "start": 0, "end": k}]);
                    json!({"text": "", "output_ids": sample.ids[..k], "meta_info": {
                        "finish_reason": finish, "completion_tokens": k, "weight_version": "default",
                        "output_token_logprobs": sample.ids[..k].iter().zip(&sample.logprobs).map(|(id, lp)| json!([lp, id, null])).collect::<Vec<_>>(),
                        "output_token_logprobs_length": k,
                        "weight_versions": if last { spans } else { Value::Null },
                    }})
                }
                Wire::VllmGenerate => json!({"request_id": "generate-tokens-mock", "usage": null,
                    "output_mode": "tokens", "choices": [super::vllm_generate::choice(0, sample, k - 1..k, last)]}),
                _ => {
                    let id = sample.ids[k - 1];
                    let lp = sample.logprobs[k - 1];
                    json!({"id": "cmpl-s", "object": "text_completion", "choices": [{"index": 0, "text": "",
                        "logprobs": {"token_logprobs": [lp], "tokens": [format!("token_id:{id}")], "top_logprobs": [{format!("token_id:{id}"): lp}]},
                        "token_ids": [id],
                        "finish_reason": if last { json!(sample.finish) } else { Value::Null },
                        "stop_reason": if last && sample.matched.is_string() { sample.matched.clone() } else { Value::Null }}]})
                }
            }
        })
        .collect()
}

/// Counts a stream as cancelled if it is dropped before its last chunk was sent.
struct StreamGuard {
    shared: Arc<Mutex<Shared>>,
    done: bool,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if !self.done {
            self.shared.lock().unwrap().cancelled_streams += 1;
        }
    }
}

/// The sample's stream; with `cut`, only its first `cut` tokens, then the stream ends.
fn stream_reply(
    shared: Arc<Mutex<Shared>>,
    (body, sample): (&Value, &Sample),
    wire: Wire,
    cut: Option<usize>,
) -> HttpResponse {
    let delay = shared.lock().unwrap().token_delay_ms;
    let mut chunks = stream_chunks(sample, wire);
    // vLLM's first chunk reports the prompt it expanded.
    if let Some(first) = chunks
        .first_mut()
        .filter(|_| !body["prompt_token_ids"].is_null())
    {
        first["prompt_token_ids"] = body["prompt_token_ids"].clone();
        first["mm_placeholders"] = body["mm_placeholders"].clone();
    }
    if let Some(last) = chunks.last_mut() {
        super::routing::attach_to_chunk(last, body, wire, sample);
    }
    let mut lines: VecDeque<String> = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    match cut {
        Some(after) => lines.truncate(after),
        None => lines.push_back("data: [DONE]\n\n".to_string()),
    }
    let guard = StreamGuard {
        shared,
        done: false,
    };
    let body = futures::stream::unfold((lines, guard), move |(mut lines, mut guard)| async move {
        let line = lines.pop_front()?;
        // Not even a zero sleep: tokio's timer rounds it up to a millisecond per token.
        if delay > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
        }
        guard.done = lines.is_empty();
        Some((
            Ok::<_, std::convert::Infallible>(bytes::Bytes::from(line)),
            (lines, guard),
        ))
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .streaming(body)
}

fn samples_reply(body: &Value, samples: &[Sample], wire: Wire) -> HttpResponse {
    let mut reply = match wire {
        Wire::Sglang => sglang_reply(body, samples),
        Wire::Vllm | Wire::VllmScaleOutOff => vllm_reply(body, samples),
        Wire::VllmGenerate => super::vllm_generate::reply(samples, body),
        Wire::OpenAiText => openai_text_reply(samples),
    };
    super::routing::attach(&mut reply, body, wire, samples);
    HttpResponse::Ok().json(reply)
}

/// vLLM's `GET /v1/models` (shape of a real 0.32 reply): the declared model, else none.
async fn models(data: web::Data<(Arc<Mutex<Shared>>, Wire)>) -> HttpResponse {
    let card = data.0.lock().unwrap().model_card.clone();
    let listed: Vec<Value> = card
        .into_iter()
        .map(|(id, max_model_len)| {
            json!({"id": id, "object": "model", "created": 1796604163, "owned_by": "vllm",
                "root": "/models/tiny", "parent": null, "max_model_len": max_model_len, "permission": []})
        })
        .collect();
    HttpResponse::Ok().json(json!({"object": "list", "data": listed}))
}

/// vLLM's `POST /tokenize` for the char model (ids are code points of the Basic Multilingual
/// Plane, 0 beyond it, plus the shift), once a model is declared.
async fn tokenize(
    body: web::Json<Value>,
    data: web::Data<(Arc<Mutex<Shared>>, Wire)>,
) -> HttpResponse {
    let shared = data.0.lock().unwrap();
    let Some((_, max_model_len)) = &shared.model_card else {
        return HttpResponse::NotFound().json(json!({"detail": "Not Found"}));
    };
    let tokens: Vec<u32> = body["prompt"]
        .as_str()
        .unwrap_or_default()
        .chars()
        .map(|c| if (c as u32) < 0x10000 { c as u32 } else { 0 } + shared.tokenize_shift)
        .collect();
    HttpResponse::Ok().json(
        json!({"count": tokens.len(), "max_model_len": max_model_len,
        "tokens": tokens, "token_strs": null}),
    )
}

async fn openapi(data: web::Data<(Arc<Mutex<Shared>>, Wire)>) -> HttpResponse {
    match data.1 {
        Wire::Vllm | Wire::VllmGenerate => {
            HttpResponse::Ok().json(json!({"paths": {data.1.path(): {}, "/health": {}}}))
        }
        Wire::VllmScaleOutOff => HttpResponse::Ok().json(json!({"paths": {
            "/v1/completions": {}, "/inference/v1/generate": {}, "/tokenize": {}, "/health": {}}})),
        _ => HttpResponse::NotFound().finish(),
    }
}

fn openai_text_reply(samples: &[Sample]) -> Value {
    let choices: Vec<Value> = samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let text: String = s.ids.iter().filter_map(|&id| char::from_u32(id)).collect();
            json!({"index": i, "text": text, "finish_reason": s.finish, "logprobs": null})
        })
        .collect();
    json!({"id": "cmpl-x", "object": "text_completion", "choices": choices})
}

fn sglang_reply(body: &Value, samples: &[Sample]) -> Value {
    let prompt_len = body["input_ids"].as_array().map_or(0, Vec::len);
    let outputs: Vec<Value> = samples
        .iter()
        .map(|s| {
            let finish = match s.finish {
                "length" => json!({"type": "length", "length": s.ids.len()}),
                _ => json!({"type": "stop", "matched": s.matched}),
            };
            json!({
                "text": "",
                "output_ids": s.ids,
                // The fields of a real SGLang 0.5.23 reply (CPU, a tiny Qwen3), in its order.
                "meta_info": {
                    "id": uuid::Uuid::new_v4().simple().to_string(),
                    "finish_reason": finish,
                    "prompt_tokens": prompt_len,
                    "weight_version": "default",
                    "num_retractions": 0,
                    "input_token_logprobs": [],
                    "output_token_logprobs": s.ids.iter().zip(&s.logprobs).map(|(id, lp)| json!([lp, id, null])).collect::<Vec<_>>(),
                    "output_token_logprobs_length": s.ids.len(),
                    "output_top_logprobs": top_alternatives(s, body["top_logprobs_num"].as_u64().unwrap_or(0)),
                    "reasoning_tokens": 0,
                    "completion_tokens": s.ids.len(),
                    "cached_tokens": 0,
                    "weight_versions": [{"version": "default", "start": 0, "end": s.ids.len()}],
                    "cached_tokens_details": null,
                    "dp_rank": null,
                    "e2e_latency": 0.054,
                }
            })
        })
        .collect();
    if outputs.len() == 1 && body["sampling_params"]["n"].as_u64().unwrap_or(1) == 1 {
        outputs[0].clone()
    } else {
        Value::Array(outputs)
    }
}

/// `k` alternatives per position: the sampled id, then id+1, id+2... each 1 nat less likely.
fn top_alternatives(sample: &Sample, k: u64) -> Value {
    if k == 0 {
        return Value::Null;
    }
    sample
        .ids
        .iter()
        .zip(&sample.logprobs)
        .map(|(&id, &lp)| {
            (0..k as u32)
                .map(|j| json!([lp - j as f32, id + j, null]))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn vllm_reply(body: &Value, samples: &[Sample]) -> Value {
    let prompt = body["prompt"].clone();
    let choices: Vec<Value> = samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let stop_reason = match (&s.matched, s.finish) {
                (Value::String(_), _) => s.matched.clone(),
                _ => Value::Null,
            };
            json!({
                "index": i,
                "text": "",
                "logprobs": {
                    "text_offset": (0..s.ids.len()).collect::<Vec<_>>(),
                    "token_logprobs": s.logprobs,
                    "tokens": s.ids.iter().map(|id| format!("token_id:{id}")).collect::<Vec<_>>(),
                    "top_logprobs": s.ids.iter().zip(&s.logprobs).map(|(id, lp)| json!({format!("token_id:{id}"): lp})).collect::<Vec<_>>(),
                },
                "finish_reason": s.finish,
                "stop_reason": stop_reason,
                "token_ids": s.ids,
                "prompt_logprobs": null,
                "prompt_token_ids": prompt,
            })
        })
        .collect();
    json!({
        "id": "cmpl-mock", "object": "text_completion", "created": 0, "model": body["model"],
        "choices": choices, "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    })
}
