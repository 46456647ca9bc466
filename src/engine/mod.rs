//! The embedded engine: a GGUF model run in-process by llama.cpp, behind the same [`Backend`]
//! trait as the HTTP backends (token ids in; sampled ids, raw logprobs and finish reasons out,
//! token by token). One engine thread owns the llama.cpp context ([`scheduler`]); requests
//! reach it through a channel, so inference never runs on the async runtime's threads.

//!
//! The engine is the default cargo feature `engine`; a build without it
//! (`--no-default-features`) fronts HTTP servers only and skips compiling llama.cpp, and
//! [`Embedded::start`] then refuses what would need it.

#[cfg(feature = "engine")]
pub mod default_model;
#[cfg(feature = "engine")]
mod embedded;
#[cfg(feature = "engine")]
mod handle;
#[cfg(feature = "engine")]
pub mod model;
#[cfg(feature = "engine")]
mod sampling;
#[cfg(feature = "engine")]
mod scheduler;

#[cfg(not(feature = "engine"))]
#[path = "absent.rs"]
mod embedded;

pub use embedded::Embedded;
#[cfg(feature = "engine")]
pub use handle::{Engine, EngineBackend, EngineCounters, EngineStats};
#[cfg(feature = "engine")]
pub use sampling::{Sampler, SamplingConfig};
#[cfg(feature = "engine")]
pub use scheduler::new_context;

/// The base URL the pool knows the engine by.
pub const ENGINE_URL: &str = "embedded://llama.cpp";

/// Failures of the engine itself.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model file cannot be loaded.
    #[error("cannot load the model: {0}")]
    Load(String),
    /// The default model cannot be fetched.
    #[error("cannot fetch the default model: {0}")]
    Fetch(String),
    /// The engine's thread has stopped.
    #[error("the engine thread stopped")]
    Stopped,
    /// This build was made without the in-process engine (the cargo feature `engine`).
    #[error(
        "this build has no in-process engine (built without the `engine` feature): \
         pass --backend URL or --config FILE to front inference servers"
    )]
    NotBuilt,
}

/// Sizes of the engine.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// KV-cache tokens of each sequence: the longest prompt plus sample one request can have.
    pub context: u32,
    /// Cached sequences (sessions whose cache is kept); also the most requests decoded at once.
    pub slots: usize,
    /// Most tokens decoded in one step.
    pub batch: usize,
    /// CPU threads for decoding.
    pub threads: i32,
}

impl Default for EngineSettings {
    /// One core is left free: llama.cpp's worker threads spin at barriers, and a worker
    /// descheduled by another busy process stalls every step (measured on 2 cores: 2 threads
    /// decoded at 2-12 tok/s beside a build, 1 thread at 48-84).
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = cores.saturating_sub(1).max(1);
        Self {
            context: 4096,
            slots: 4,
            batch: 512,
            threads: threads as i32,
        }
    }
}
