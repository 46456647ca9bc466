//! The Responses API's stored responses: with `store` (the default), a response is kept on its
//! session so a later request may name it as `previous_response_id` and send only new items,
//! and `GET /{uuid}/v1/responses/{id}` returns it.

use serde_json::Value;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

/// Responses kept per session; older ones are dropped first.
const KEPT: usize = 256;

/// One stored response.
#[derive(Debug)]
pub struct StoredResponse {
    /// Every input item of the conversation up to this response, then its output items: what
    /// a request continuing it stands on.
    pub items: Vec<Value>,
    /// The response object as it was returned.
    pub body: Value,
}

/// A session's stored responses, by id.
#[derive(Debug, Default)]
pub struct ResponseStore(Mutex<VecDeque<(String, Arc<StoredResponse>)>>);

impl ResponseStore {
    /// Keeps `response` under `id`.
    pub fn insert(&self, id: String, response: StoredResponse) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back((id, Arc::new(response)));
    }

    /// The response stored under `id`.
    pub fn get(&self, id: &str) -> Option<Arc<StoredResponse>> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.iter()
            .rev()
            .find(|(known, _)| known == id)
            .map(|(_, response)| response.clone())
    }
}
