//! Start-up configuration: the Atropos-style config file merged with command-line flags.

use crate::backend::{
    Backend, BackendConfig, BackendKind, ClientFactory, LlamaCppBackend, OpenAiTextBackend,
    PROBE_TEXT, Pool, PoolSettings, Probe, SglangBackend, VllmBackend,
};
use crate::engine::{self, Embedded, EngineSettings};
use crate::http::AppState;
use crate::session::SessionStore;
use crate::template::{
    ChatTemplate, TemplateError, TemplateSpec, load_template, template_with_source,
};
use crate::tokenizer::Tokenizer;
use crate::turn::{Pipeline, TurnContext};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The config file (`--config servers.json`), in the Atropos `ServerManager` shape.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConfigFile {
    /// The model name replies carry (and vLLM requests send).
    pub model_name: Option<String>,
    /// A local model folder holding tokenizer.json (Atropos names a hub repo here).
    pub tokenizer_name: Option<String>,
    /// A chat template: a bundled name or a file.
    pub chat_template: Option<String>,
    /// The inference servers.
    #[serde(default)]
    pub servers: Vec<BackendConfig>,
    /// `max_tokens` sent when a request sets none.
    pub default_max_tokens: Option<u32>,
    /// The model's context window in tokens (prompt and sample together), when known.
    pub context_length: Option<u32>,
    /// Routing, health, retry and queue settings.
    #[serde(default)]
    pub pool: PoolSettings,
}

/// Everything needed to build the application state.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The config file, if one was given (flags override it).
    pub config: ConfigFile,
    /// A folder holding `tokenizer.json` (and a chat template).
    pub tokenizer: Option<PathBuf>,
    /// A chat template: a bundled name or a file.
    pub chat_template: Option<String>,
    /// Backend URLs given on the command line.
    pub backends: Vec<String>,
    /// The wire format of those backends.
    pub backend_kind: Option<BackendKind>,
    /// The model name replies carry (and vLLM requests send).
    pub model_name: Option<String>,
    /// `max_tokens` sent when a request sets none.
    pub default_max_tokens: Option<u32>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// A GGUF model to serve in-process. Without it, and without any backend, the default
    /// model is fetched and served in-process.
    pub model: Option<PathBuf>,
    /// Settings of the in-process engine.
    pub engine: EngineSettings,
    /// The model's context window in tokens (prompt and sample together): `max_tokens` is
    /// lowered to what a prompt leaves of it, and a prompt that fills it is refused. The
    /// in-process engine's context is used when it serves the model.
    pub context_length: Option<u32>,
    /// Where sessions are journaled (`--data-dir`): they survive a crash or restart.
    pub data_dir: Option<PathBuf>,
    /// The Redis or Valkey store sessions are kept in (`--store redis://host:port/db`): they
    /// survive the replica, and another replica started on the store serves them.
    pub store: Option<String>,
    /// Bounds on the sessions held.
    pub session_limits: crate::session::SessionLimits,
    /// Most tokens a session's node may hold.
    pub max_session_tokens: Option<u32>,
    /// Every route but `GET /health` needs this key.
    pub api_key: Option<String>,
    /// The operator routes (`POST /setup`, `GET /servers`, `GET /sessions`, ...) need this key.
    pub admin_key: Option<String>,
    /// Web origins whose pages may call the routes that change state (`*`: any).
    pub allow_origins: Vec<String>,
    /// Host names a loopback-bound proxy answers to besides the loopback names.
    pub allow_hosts: Vec<String>,
    /// Render every turn's whole conversation (no tail-only renders; `--full-render`).
    pub full_render: bool,
    /// What image URLs are fetched, from where, and how much.
    pub image_fetch: crate::fetch::FetchSettings,
}

/// Start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file cannot be read or parsed.
    #[error("cannot read config {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why it cannot be read or parsed.
        reason: String,
    },
    #[error(
        "no tokenizer: pass --tokenizer DIR (a folder with tokenizer.json) or set tokenizer_name"
    )]
    /// Neither a tokenizer folder nor a model to take one from.
    NoTokenizer,
    /// The tokenizer cannot be loaded.
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    /// The chat template cannot be loaded.
    #[error(transparent)]
    Template(#[from] crate::template::TemplateError),
    /// The in-process engine cannot start.
    #[error(transparent)]
    Engine(#[from] crate::engine::EngineError),
    /// The journal cannot be opened or replayed.
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    /// The session store cannot be reached or read.
    #[error(transparent)]
    Store(#[from] crate::fleet::StoreError),
    /// The model's image processor config cannot be used.
    #[error(transparent)]
    Vision(#[from] crate::vision::VisionError),
    /// The folder of images in `--data-dir` cannot be made.
    #[error("cannot keep images in {0}")]
    Blobs(String),
    /// The image fetcher cannot be built (its extra certificates).
    #[error(transparent)]
    Fetch(#[from] crate::fetch::FetchError),
    /// Sessions can be kept in one place only.
    #[error("--data-dir and --store both keep sessions: give one")]
    TwoSessionLogs,
}

impl ConfigFile {
    /// Reads and parses the config file at `path`.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let fail = |reason: String| ConfigError::File {
            path: path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let config: Self = serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?;
        config.pool.check().map_err(|e| fail(e.to_string()))?;
        for server in &config.servers {
            server.check().map_err(|e| fail(e.to_string()))?;
        }
        Ok(config)
    }
}

/// How long start-up waits for the backends to say which model they serve and their context.
const DESCRIBE_AT_START: Duration = Duration::from_secs(3);

/// `max_tokens` sent when a request sets none (vLLM's completions endpoint would stop at 16).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

impl Settings {
    /// Loads the tokenizer and template and assembles the shared state.
    pub async fn build(self) -> Result<AppState, ConfigError> {
        // First: a bad --image-fetch-ca is named before any model is loaded.
        let fetcher = Arc::new(crate::fetch::Fetcher::new(self.image_fetch.clone())?);
        let mut servers = self.config.servers.clone();
        let kind = self.backend_kind.unwrap_or(BackendKind::Vllm);
        servers.extend(
            self.backends
                .iter()
                .map(|url| BackendConfig::new(url, kind)),
        );
        let embedded = Embedded::start(
            self.model.as_deref(),
            servers.is_empty(),
            self.engine.clone(),
        )?;
        if let Some(embedded) = &embedded {
            servers.push(BackendConfig {
                num_max_requests_at_once: self.engine.slots,
                ..BackendConfig::new(engine::ENGINE_URL, BackendKind::Embedded)
            });
            tracing::info!(model = %embedded.path().display(), "serving the model in-process (llama.cpp)");
        }
        let tokenizer_dir = self
            .tokenizer
            .clone()
            .or_else(|| self.config.tokenizer_name.as_ref().map(PathBuf::from));
        let tokenizer = Arc::new(match (&tokenizer_dir, &embedded) {
            (Some(dir), _) => Tokenizer::from_path(dir)?,
            (None, Some(embedded)) => embedded.tokenizer(),
            (None, None) => return Err(ConfigError::NoTokenizer),
        });
        let model_dir = tokenizer_dir.as_deref().filter(|d| d.is_dir());
        let given_model = self.model_name.clone().or(self.config.model_name.clone());
        let local_name = {
            let named = embedded.as_ref().map(Embedded::path);
            named
                .or(tokenizer_dir.as_deref())
                .and_then(|p| p.file_stem())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into())
        };
        let spec = self
            .chat_template
            .clone()
            .or(self.config.chat_template.clone())
            .map(|s| TemplateSpec::parse(&s));
        let template = match (&spec, model_dir, &embedded) {
            (None, None, Some(embedded)) => embedded.template()?,
            _ => match load_template(spec.as_ref(), model_dir) {
                // No template anywhere local: a llama-server knows its model's.
                Err(TemplateError::Load(reason)) if spec.is_none() => {
                    llama_server_template(&servers, model_dir)
                        .await?
                        .ok_or(TemplateError::Load(reason))?
                }
                other => other?,
            },
        };
        let vision = match model_dir {
            Some(dir) => {
                let image_pad = tokenizer.token_id(crate::vision::IMAGE_PAD);
                crate::vision::VisionModel::from_dir(dir, image_pad)?
            }
            None => None,
        };
        if let Some(vision) = &vision {
            tracing::info!(grid = ?vision.grid, "the model takes images");
        }
        let engine_context = embedded.is_some().then_some(self.engine.context);
        let sessions = SessionStore::new(self.session_limits);
        let fleet = match &self.store {
            Some(url) => {
                let holder = format!("{}:{}", std::process::id(), uuid::Uuid::new_v4().simple());
                let expiry = self.session_limits.ttl;
                let fleet = crate::fleet::Fleet::open(url, &holder, expiry).await?;
                tracing::info!(%holder, "serving the sessions of the store");
                Some(Arc::new(fleet))
            }
            None => None,
        };
        let journal = match (&self.data_dir, &fleet) {
            (Some(_), Some(_)) => return Err(ConfigError::TwoSessionLogs),
            (None, Some(fleet)) => Some(fleet.clone() as Arc<dyn crate::session::SessionLog>),
            (Some(dir), None) => {
                let started = std::time::Instant::now();
                let (journal, replayed) = crate::journal::Journal::open(dir, &sessions)?;
                tracing::info!(
                    sessions = replayed.sessions,
                    turns = replayed.turns,
                    seconds = started.elapsed().as_secs_f64(),
                    "journal replayed"
                );
                Some(Arc::new(journal) as Arc<dyn crate::session::SessionLog>)
            }
            (None, None) => None,
        };
        let blobs = Arc::new(match &self.data_dir {
            Some(dir) => crate::session::Blobs::on_disk(dir.join("blobs"))
                .map_err(|e| ConfigError::Blobs(format!("{}: {e}", dir.join("blobs").display())))?,
            None => crate::session::Blobs::default(),
        });
        let engine = embedded.map(Arc::new);
        // A tokenizer that cannot encode the probe leaves the servers unchecked, not the
        // proxy unstarted.
        let probe = tokenizer.encode(PROBE_TEXT).ok().map(|expected| Probe {
            expected,
            tokenizer: tokenizer_dir
                .as_deref()
                .map_or_else(|| local_name.clone(), |d| d.display().to_string()),
        });
        let factory = default_factory(given_model.clone(), &local_name, tokenizer.clone(), engine);
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let server_count = servers.len();
        let mut pool =
            Pool::new(self.config.pool.clone(), factory, servers).with_metrics(metrics.clone());
        if let Some(probe) = probe {
            pool = pool.with_probe(probe);
        }
        let backends = Arc::new(pool);
        // Servers that answer now say which model they serve and their context; the others
        // are asked once their health probe passes.
        backends.describe_all(DESCRIBE_AT_START).await;
        let model_name = given_model
            .or_else(|| backends.reported_model())
            .unwrap_or(local_name);
        tracing::info!(
            model = %model_name,
            template = template.name(),
            servers = server_count,
            "configuration loaded"
        );
        Ok(AppState {
            model_name: model_name.clone(),
            pipeline: Pipeline {
                context: {
                    let context =
                        TurnContext::new(Arc::new(template), tokenizer).with_vision(vision);
                    let tail = !self.full_render && crate::checker::tail_renders_hold(&context);
                    tracing::info!(tail_renders = tail, "rendering only a conversation's end");
                    context.set_tail_renders(tail);
                    context
                },
                backends,
                context_length: self
                    .context_length
                    .or(self.config.context_length)
                    .or(engine_context)
                    .map(|n| n as usize),
                max_session_tokens: self.max_session_tokens.map(|n| n as usize),
                log: journal.clone(),
                under_way: Default::default(),
                gate: Default::default(),
                metrics,
                model_name: model_name.as_str().into(),
                blobs,
                fetcher,
            },
            sessions,
            journal: journal.clone(),
            fleet,
            draining: Default::default(),
            keys: crate::http::auth::Keys::new(self.api_key.as_deref(), self.admin_key.as_deref()),
            origins: crate::http::guard::Origins::new(&self.allow_origins, &self.allow_hosts),
            default_max_tokens: self
                .default_max_tokens
                .or(self.config.default_max_tokens)
                .or(Some(DEFAULT_MAX_TOKENS)),
            max_body_bytes: self.max_body_bytes,
            freed: Default::default(),
        })
    }
}

/// The chat template of the first llama-server backend that reports one (`GET /props`).
async fn llama_server_template(
    servers: &[BackendConfig],
    model_dir: Option<&Path>,
) -> Result<Option<ChatTemplate>, ConfigError> {
    for server in servers
        .iter()
        .filter(|s| s.server_type == BackendKind::Llamacpp)
    {
        let client = LlamaCppBackend::new(
            &server.base_url,
            server.api_key.clone(),
            Duration::from_secs(10),
        );
        match client.chat_template().await {
            Ok(Some(source)) => {
                let name = format!("{} /props", server.base_url);
                tracing::info!(server = %server.base_url, "using the llama-server's chat template");
                return Ok(Some(template_with_source(&name, source, model_dir)?));
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "cannot read the llama-server's chat template"),
        }
    }
    Ok(None)
}

/// The standard clients: one per [`BackendKind`]. Requests name the server's `model_name`,
/// else `given_model` (`--model-name`); a vLLM server is asked which model it serves before
/// `fallback` is used.
fn default_factory(
    given_model: Option<String>,
    fallback: &str,
    tokenizer: Arc<Tokenizer>,
    engine: Option<Arc<Embedded>>,
) -> ClientFactory {
    let fallback = fallback.to_string();
    Box::new(move |config: &BackendConfig| -> Box<dyn Backend> {
        let timeout = Duration::from_secs_f64(config.timeout.max(0.001));
        let given = config.model_name.as_deref().or(given_model.as_deref());
        let model = given.unwrap_or(&fallback);
        let key = config.api_key.clone();
        let url = config.base_url.as_str();
        match config.server_type {
            BackendKind::Vllm => Box::new(VllmBackend::new(url, given, &fallback, key, timeout)),
            BackendKind::Sglang => Box::new(SglangBackend::new(url, key, timeout)),
            BackendKind::Llamacpp => Box::new(LlamaCppBackend::new(url, key, timeout)),
            BackendKind::Openai => Box::new(OpenAiTextBackend::new(
                url,
                model,
                key,
                timeout,
                tokenizer.clone(),
            )),
            BackendKind::Embedded => engine
                .as_ref()
                .expect("embedded entries are only added with a running engine")
                .backend(),
        }
    })
}
