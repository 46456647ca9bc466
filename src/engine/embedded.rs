//! The in-process engine as start-up sees it: which model to serve, and the tokenizer,
//! template and pool backend that come with it.

use super::{Engine, EngineBackend, EngineError, EngineSettings, default_model, model};
use crate::backend::Backend;
use crate::template::{ChatTemplate, TemplateError, TemplateSpec, load_template};
use crate::tokenizer::{GgufVocab, Tokenizer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The model served in-process, with its running engine.
pub struct Embedded {
    engine: Arc<Engine>,
    path: PathBuf,
    /// The fetched default model (its GGUF template has no tools).
    is_default: bool,
}

impl Embedded {
    /// Starts the engine: for `model` when given, else with the default model (fetched on
    /// first use) when `no_backends` says nothing else serves; `None` when neither.
    pub fn start(
        model: Option<&Path>,
        no_backends: bool,
        settings: EngineSettings,
    ) -> Result<Option<Self>, EngineError> {
        let (path, is_default) = match (model, no_backends) {
            (Some(path), _) => (path.to_path_buf(), false),
            (None, true) => (default_model::default_model()?, true),
            (None, false) => return Ok(None),
        };
        let loaded = model::load(&path)?;
        let engine = Engine::start(loaded, settings)?;
        Ok(Some(Self {
            engine,
            path,
            is_default,
        }))
    }

    /// The GGUF file served.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The model's own vocabulary, so prompts are tokenized exactly as the engine reads them.
    pub fn tokenizer(&self) -> Tokenizer {
        Tokenizer::from_gguf(GgufVocab::new(self.engine.model().clone()))
    }

    /// The template when none is configured: the bundled Hermes tool-calling ChatML for the
    /// default model, else the GGUF's own.
    pub fn template(&self) -> Result<ChatTemplate, TemplateError> {
        if self.is_default {
            return load_template(Some(&TemplateSpec::parse("hermes")), None);
        }
        let model = self.engine.model();
        let source = model::chat_template(model).ok_or_else(|| {
            TemplateError::Load(format!(
                "{} carries no chat template: pass --chat-template",
                self.path.display()
            ))
        })?;
        let name = format!("{} (GGUF)", self.path.display());
        ChatTemplate::new(name, source, model::template_tokens(model))
    }

    /// A pool client of the engine.
    pub fn backend(&self) -> Box<dyn Backend> {
        Box::new(EngineBackend(self.engine.clone()))
    }
}
