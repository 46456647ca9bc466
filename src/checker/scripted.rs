//! The backend of a checked shape: it samples exactly the replies the template writes, queued
//! one per turn, so the shape runs through the real turn pipeline with nothing to serve it.

use crate::backend::{
    Backend, BackendConfig, BackendError, BackendKind, ClientFactory, Pool, PoolSettings,
};
use crate::generation::{GenerateRequest, Generation};
use async_trait::async_trait;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Where the scripted backend is said to be (no request leaves the process).
const URL: &str = "check-template";

/// The samples the next turns get, in order.
#[derive(Debug, Clone, Default)]
pub struct Script(Arc<Mutex<VecDeque<Generation>>>);

impl Script {
    /// The next turn samples `generation`.
    pub fn push(&self, generation: Generation) {
        self.queue().push_back(generation);
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Generation>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A pool whose one backend samples what this script holds.
    pub fn pool(&self) -> Pool {
        let script = self.clone();
        let factory: ClientFactory = Box::new(move |_| Box::new(Scripted(script.clone())));
        Pool::new(
            PoolSettings::default(),
            factory,
            vec![BackendConfig::new(URL, BackendKind::Sglang)],
        )
    }
}

#[derive(Debug)]
struct Scripted(Script);

#[async_trait]
impl Backend for Scripted {
    fn base_url(&self) -> &str {
        URL
    }

    async fn generate(&self, _request: &GenerateRequest) -> Result<Vec<Generation>, BackendError> {
        let next = self.0.queue().pop_front();
        next.map(|generation| vec![generation])
            .ok_or_else(|| BackendError::Protocol {
                url: URL.into(),
                reason: "the shape has no reply for this turn".into(),
            })
    }

    async fn health(&self) -> Result<(), BackendError> {
        Ok(())
    }
}
