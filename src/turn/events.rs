//! What a streamed turn reports as it goes ([`TurnEvent`]), and the handle its caller reads
//! them from ([`TurnStream`]).

use super::choice_stream::Delta;
use super::reply::Finish;
use super::{TurnError, Usage};
use crate::generation::StopMatch;
use tokio::sync::mpsc;

/// Tokens one choice sampled since its previous event, with the backend's logprobs.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledTokens {
    /// The ids.
    pub token_ids: Vec<u32>,
    /// Their logprobs.
    pub logprobs: Vec<f32>,
    /// Top alternatives per position, when requested.
    pub top_logprobs: Option<Vec<Vec<(u32, f32)>>>,
}

/// What a streamed turn reports, in order: `Opened`, then `Sampled` and `Finished` events of
/// the choices (interleaved), and last `Done` or `Failed`; `KeepAlive` while nothing happens.
#[derive(Debug)]
pub enum TurnEvent {
    /// The backend streams are open (after any wait in the pool's queue).
    Opened,
    /// A choice sampled tokens; `deltas` is what they let the client be shown (none while
    /// text is held back, e.g. the start of what may be a tool call).
    Sampled {
        /// Which choice.
        choice: usize,
        /// The ids sampled.
        tokens: SampledTokens,
        /// What they let the client be shown.
        deltas: Vec<Delta>,
    },
    /// A choice ended: the last of its text, and why it ended.
    Finished {
        /// Which choice.
        choice: usize,
        /// Text held back until the end.
        deltas: Vec<Delta>,
        /// Why it ended.
        finish: Finish,
        /// What stopped it, when the backend says.
        stop: Option<StopMatch>,
    },
    /// Nothing happened for a while.
    KeepAlive,
    /// Every choice finished and the turn is recorded in the session.
    Done(Usage),
    /// The turn failed after the stream began; nothing was recorded.
    Failed(TurnError),
}

/// A streamed turn under way.
#[derive(Debug)]
pub struct TurnStream {
    /// How many choices are sampled.
    pub choices: usize,
    /// The prompt's ids (shared with the turn, not copied).
    pub prompt_ids: std::sync::Arc<Vec<u32>>,
    /// The turn's events; dropping this cancels the turn.
    pub events: mpsc::Receiver<TurnEvent>,
}
