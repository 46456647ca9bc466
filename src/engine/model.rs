//! Loading a GGUF model with llama.cpp, and what its metadata says.

use super::EngineError;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// llama.cpp may be initialised once per process; every model and context shares it.
static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();

/// The process's llama.cpp backend (its own logging routed to `tracing`).
pub fn llama_backend() -> Result<&'static LlamaBackend, EngineError> {
    BACKEND
        .get_or_init(|| {
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|reason| EngineError::Load(reason.clone()))
}

/// Loads a GGUF file (CPU).
pub fn load(path: &Path) -> Result<Arc<LlamaModel>, EngineError> {
    let backend = llama_backend()?;
    let model = LlamaModel::load_from_file(backend, path, &LlamaModelParams::default())
        .map_err(|e| EngineError::Load(format!("{}: {e}", path.display())))?;
    Ok(Arc::new(model))
}

/// The chat template the GGUF carries (`tokenizer.chat_template`), if any.
pub fn chat_template(model: &LlamaModel) -> Option<String> {
    model
        .meta_val_str("tokenizer.chat_template")
        .ok()
        .filter(|t| !t.is_empty())
}

/// `bos_token` and `eos_token` for the chat template, from the model's vocabulary.
pub fn template_tokens(model: &LlamaModel) -> BTreeMap<String, String> {
    let vocab = model.vocab();
    [("bos_token", vocab.bos()), ("eos_token", vocab.eos())]
        .into_iter()
        .filter(|(_, token)| token.0 >= 0)
        .map(|(name, token)| {
            let text = vocab.token_to_piece(token, true, None);
            (
                name.to_string(),
                String::from_utf8_lossy(&text).into_owned(),
            )
        })
        .collect()
}
