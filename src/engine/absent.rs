//! A build without the `engine` feature: nothing can be served in-process, so [`Embedded`]
//! has no values and start-up refuses what would need one.

use super::{EngineError, EngineSettings};
use crate::backend::Backend;
use crate::template::{ChatTemplate, TemplateError};
use crate::tokenizer::Tokenizer;
use std::path::Path;

/// The model served in-process: never, in this build.
pub enum Embedded {}

impl Embedded {
    /// `None` when HTTP backends serve and no `model` is named; else [`EngineError::NotBuilt`].
    pub fn start(
        model: Option<&Path>,
        no_backends: bool,
        _settings: EngineSettings,
    ) -> Result<Option<Self>, EngineError> {
        match (model, no_backends) {
            (None, false) => Ok(None),
            _ => Err(EngineError::NotBuilt),
        }
    }

    /// Never called: there is no value to call it on.
    pub fn path(&self) -> &Path {
        match *self {}
    }

    /// Never called: there is no value to call it on.
    pub fn tokenizer(&self) -> Tokenizer {
        match *self {}
    }

    /// Never called: there is no value to call it on.
    pub fn template(&self) -> Result<ChatTemplate, TemplateError> {
        match *self {}
    }

    /// Never called: there is no value to call it on.
    pub fn backend(&self) -> Box<dyn Backend> {
        match *self {}
    }
}
