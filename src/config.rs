//! Start-up configuration: the Atropos-style config file merged with command-line flags.

use crate::backend::{BackendConfig, BackendKind, BackendSet};
use crate::http::AppState;
use crate::session::SessionStore;
use crate::template::{TemplateSpec, load_template};
use crate::tokenizer::Tokenizer;
use crate::turn::TurnContext;
use crate::turn::segments::Placeholders;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The config file (`--config servers.json`), in the Atropos `ServerManager` shape.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConfigFile {
    pub model_name: Option<String>,
    /// A local model folder holding tokenizer.json (Atropos names a hub repo here).
    pub tokenizer_name: Option<String>,
    pub chat_template: Option<String>,
    #[serde(default)]
    pub servers: Vec<BackendConfig>,
    pub default_max_tokens: Option<u32>,
}

/// Everything needed to build the application state.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub config: ConfigFile,
    pub tokenizer: Option<PathBuf>,
    pub chat_template: Option<String>,
    pub backends: Vec<String>,
    pub backend_kind: Option<BackendKind>,
    pub model_name: Option<String>,
    pub default_max_tokens: Option<u32>,
    pub max_body_bytes: usize,
}

/// Start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error(
        "no tokenizer: pass --tokenizer DIR (a folder with tokenizer.json) or set tokenizer_name"
    )]
    NoTokenizer,
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error(transparent)]
    Template(#[from] crate::template::TemplateError),
}

impl ConfigFile {
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let fail = |reason: String| ConfigError::File {
            path: path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| fail(e.to_string()))
    }
}

/// `max_tokens` sent when a request sets none (vLLM's completions endpoint would stop at 16).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

impl Settings {
    /// Loads the tokenizer and template and assembles the shared state.
    pub fn build(self) -> Result<AppState, ConfigError> {
        let tokenizer_dir = self
            .tokenizer
            .or_else(|| self.config.tokenizer_name.as_ref().map(PathBuf::from))
            .ok_or(ConfigError::NoTokenizer)?;
        let tokenizer = Tokenizer::from_path(&tokenizer_dir)?;
        let model_dir = tokenizer_dir.is_dir().then_some(tokenizer_dir.as_path());
        let spec = self
            .chat_template
            .or(self.config.chat_template.clone())
            .map(|s| TemplateSpec::parse(&s));
        let template = load_template(spec.as_ref(), model_dir)?;
        let model_name = self
            .model_name
            .or(self.config.model_name.clone())
            .unwrap_or_else(|| {
                tokenizer_dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "model".into())
            });
        let mut servers = self.config.servers.clone();
        servers.extend(self.backends.iter().map(|url| BackendConfig {
            base_url: url.clone(),
            server_type: self.backend_kind.unwrap_or(BackendKind::Vllm),
            api_key: None,
            num_max_requests_at_once: 512,
            timeout: 1200.0,
            model_name: None,
        }));
        tracing::info!(
            model = %model_name,
            template = template.name(),
            servers = servers.len(),
            "configuration loaded"
        );
        Ok(AppState {
            backends: BackendSet::new(&model_name, servers),
            model_name,
            turn: TurnContext {
                template: Arc::new(template),
                tokenizer: Arc::new(tokenizer),
                placeholders: Placeholders::new(),
            },
            sessions: SessionStore::default(),
            default_max_tokens: self
                .default_max_tokens
                .or(self.config.default_max_tokens)
                .or(Some(DEFAULT_MAX_TOKENS)),
            max_body_bytes: self.max_body_bytes,
        })
    }
}
