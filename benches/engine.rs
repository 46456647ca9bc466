//! The in-process engine against llama-server, side by side in one run: the same GGUF
//! (SmolLM2-135M-Instruct Q4_1), the same threads, the same batch size, four slots each, and
//! the same client path (`Backend::generate_stream`, token ids in, streamed ids out).
//!
//! - prefill: a 512-token prompt nobody has cached, 1 token sampled; tok/s = 512 / time to the
//!   first token;
//! - decode, one session: tokens after the first / time from the first to the last;
//! - decode, four sessions at once: all their tokens after the first / the span they took.
//!
//! Rounds alternate between the two so machine noise hits both; medians are reported.
//! `cargo bench --bench engine` (needs scripts/fetch-fixtures.sh and scripts/build-llama-server.sh;
//! `BENCH_THREADS` (default: all cores but one), `BENCH_ROUNDS` (5)).

#[path = "../tests/common/mod.rs"]
mod common;

use common::llama::LlamaServer;
use futures::StreamExt;
use rollout_proxy::backend::{Backend, LlamaCppBackend};
use rollout_proxy::engine::{self, Engine, EngineBackend, EngineSettings};
use rollout_proxy::generation::{GenerateRequest, SamplingParams, StreamEvent};
use std::time::{Duration, Instant};

const PREFILL: usize = 512;
const DECODE: u32 = 128;

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Times one streamed sample: (time to the first token, time from the first to the last, tokens).
async fn timed(
    backend: &dyn Backend,
    prompt: Vec<u32>,
    max_tokens: u32,
    seed: i64,
) -> (Duration, Duration, usize) {
    let request = GenerateRequest {
        prompt: prompt.into(),
        params: SamplingParams {
            max_tokens: Some(max_tokens),
            temperature: Some(1.0),
            seed: Some(seed),
            ..SamplingParams::default()
        },
        n: 1,
        session: None,
        adapter: None,
        routed_experts_from: None,
        images: Default::default(),
    };
    let start = Instant::now();
    let mut events = backend
        .generate_stream(&request)
        .await
        .expect("stream opens");
    let (mut first, mut last, mut tokens) = (None, start, 0);
    while let Some(event) = events.next().await {
        match event.expect("no stream error") {
            StreamEvent::Tokens { token_ids, .. } => {
                let now = Instant::now();
                first.get_or_insert(now);
                last = now;
                tokens += token_ids.len();
            }
            StreamEvent::Finished { .. } => break,
        }
    }
    let first = first.expect("a token");
    (first - start, last - first, tokens)
}

struct Figures {
    prefill: Vec<f64>,
    decode_one: Vec<f64>,
    decode_four: Vec<f64>,
}

impl Figures {
    fn new() -> Self {
        Self {
            prefill: Vec::new(),
            decode_one: Vec::new(),
            decode_four: Vec::new(),
        }
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

async fn round(
    backend: &dyn Backend,
    long: &[u32],
    story: &[u32],
    round: usize,
    figures: &mut Figures,
) {
    // A first token no round used before: nothing of this prompt is cached anywhere.
    let mut prompt = long.to_vec();
    prompt[0] = 1000 + round as u32;
    let (ttft, _, _) = timed(backend, prompt, 1, 1).await;
    figures.prefill.push(PREFILL as f64 / ttft.as_secs_f64());

    let (_, span, tokens) = timed(backend, story.to_vec(), DECODE, round as i64).await;
    figures
        .decode_one
        .push((tokens - 1) as f64 / span.as_secs_f64());

    let start = Instant::now();
    let four = (0..4).map(|i| timed(backend, story.to_vec(), DECODE, (round * 4 + i) as i64));
    let results = futures::future::join_all(four).await;
    let firsts = results
        .iter()
        .map(|(ttft, _, _)| start + *ttft)
        .min()
        .unwrap();
    let lasts = results
        .iter()
        .map(|(ttft, span, _)| start + *ttft + *span)
        .max()
        .unwrap();
    let tokens: usize = results.iter().map(|(_, _, n)| n - 1).sum();
    figures
        .decode_four
        .push(tokens as f64 / (lasts - firsts).as_secs_f64());
}

fn main() {
    let threads: i32 = env_or("BENCH_THREADS", EngineSettings::default().threads);
    // `cargo test --all-targets` runs this too (without `--bench`): one round as a smoke test.
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let rounds: usize = if benchmarking {
        env_or("BENCH_ROUNDS", 5)
    } else {
        1
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let gguf = common::fixture_model("smollm2").join("model.gguf");
    // 4 sequences of 4096 tokens: llama-server's `-c 16384 --parallel 4`.
    let settings = EngineSettings {
        context: 4096,
        slots: 4,
        batch: 512,
        threads,
    };
    let model = engine::model::load(&gguf).unwrap();
    let vocab = rollout_proxy::tokenizer::GgufVocab::new(model.clone());
    let engine = EngineBackend(Engine::start(model, settings).unwrap());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let threads_arg = threads.to_string();
    let server = LlamaServer::start_with(
        port,
        &[
            "-c",
            "16384",
            "--parallel",
            "4",
            "-b",
            "512",
            "-ub",
            "512",
            "-t",
            &threads_arg,
            "-tb",
            &threads_arg,
        ],
    );
    let llama = LlamaCppBackend::new(&server.url(), None, Duration::from_secs(600));

    let text = "The history of the river valley is long and full of change. ".repeat(80);
    let long: Vec<u32> = vocab.encode(&text)[..PREFILL].to_vec();
    let story = vocab.encode(
        "<|im_start|>user\nWrite a long story about a lighthouse keeper and a storm.<|im_end|>\n<|im_start|>assistant\n",
    );
    let (mut ours, mut theirs) = (Figures::new(), Figures::new());
    runtime.block_on(async {
        // Warm both (page in the model, start the threads).
        timed(&engine, story.clone(), 8, 0).await;
        timed(&llama, story.clone(), 8, 0).await;
        for r in 0..rounds {
            round(&engine, &long, &story, 2 * r, &mut ours).await;
            round(&llama, &long, &story, 2 * r + 1, &mut theirs).await;
        }
    });
    println!(
        "SmolLM2-135M-Instruct Q4_1, {threads} thread(s), batch 512, 4 slots, {rounds} rounds (medians, tok/s)"
    );
    println!(
        "{:<28} {:>10} {:>13} {:>7}",
        "", "engine", "llama-server", "ratio"
    );
    for (name, a, b) in [
        ("prefill (512-token prompt)", &ours.prefill, &theirs.prefill),
        ("decode, 1 session", &ours.decode_one, &theirs.decode_one),
        (
            "decode, 4 sessions (total)",
            &ours.decode_four,
            &theirs.decode_four,
        ),
    ] {
        let (a, b) = (median(a), median(b));
        println!("{name:<28} {a:>10.1} {b:>13.1} {:>6.2}x", a / b);
    }
}
