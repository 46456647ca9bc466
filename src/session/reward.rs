//! What the environment says of a rollout once it is done (`POST /{uuid}/reward`): a reward
//! and free metadata, kept with the session and carried by every export.

use serde::Serialize;
use serde_json::{Map, Value};

/// A rollout's reward.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reward {
    /// The reward (finite).
    pub reward: f64,
    /// Whatever else the environment wants kept with it.
    pub metadata: Map<String, Value>,
    /// When it was given, seconds since the epoch.
    pub rewarded_at: f64,
}
