use std::time::Duration;

/// Failures talking to an inference server.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// No connection could be made, or it broke before a reply.
    #[error("backend {url} unreachable: {reason}")]
    Unreachable {
        /// The backend's base URL.
        url: String,
        /// What the connection reported.
        reason: String,
    },
    /// The backend did not answer in time.
    #[error("backend {url} timed out after {timeout:?}")]
    Timeout {
        /// The backend's base URL.
        url: String,
        /// How long it was given.
        timeout: Duration,
    },
    /// The backend answered with an error status.
    #[error("backend {url} returned HTTP {status}: {message}")]
    Status {
        /// The backend's base URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The body it sent.
        message: String,
    },
    /// The backend aborted the request (SGLang reports this with HTTP 200).
    #[error("backend {url} aborted the request: {message}")]
    Aborted {
        /// The backend's base URL.
        url: String,
        /// Its reason.
        message: String,
    },
    /// The reply is not in the backend's wire format.
    #[error("backend {url} sent an unexpected reply: {reason}")]
    Protocol {
        /// The backend's base URL.
        url: String,
        /// What was wrong with the reply.
        reason: String,
    },
    /// The request needs something this backend cannot do (constrained decoding).
    #[error(
        "backend {url} cannot enforce '{option}': it has no constrained decoding (use \
         vLLM, SGLang, llama-server or the in-process engine)"
    )]
    Unsupported {
        /// The backend's base URL.
        url: String,
        /// The request option it cannot honour.
        option: &'static str,
    },
    /// The prompt holds images and this backend cannot take them token-exactly.
    #[error("backend {url} cannot take images token-exactly: {reason}")]
    NoImages {
        /// The backend's base URL.
        url: String,
        /// Why.
        reason: &'static str,
    },
    /// The backend expanded the prompt's images otherwise than the proxy: its prompt is not
    /// the one the node would record.
    #[error(
        "backend {url} placed the prompt's images otherwise than the proxy ({reason}); \
         nothing was recorded"
    )]
    ImagesDiffer {
        /// The backend's base URL.
        url: String,
        /// What differed.
        reason: String,
    },
    /// No backend is configured or available.
    #[error("no backend available: {0}")]
    NoBackend(String),
    /// Every backend is at its limit and the wait queue is full.
    #[error(
        "all backends are at their request limit and {queued} requests already wait (limit {limit}); retry later"
    )]
    Saturated {
        /// Requests waiting.
        queued: usize,
        /// The queue's limit.
        limit: usize,
    },
    /// Every backend stayed at its limit for the whole queue timeout.
    #[error("no backend had a free slot within {waited:?}; retry later")]
    Busy {
        /// How long the request waited.
        waited: Duration,
    },
}
