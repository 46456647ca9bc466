//! The Responses API's stored responses: with `store` (the default), a response is kept on its
//! session so a later request may name it as `previous_response_id` and send only new items,
//! and `GET /{uuid}/v1/responses/{id}` returns it.
//!
//! A response keeps only what it added to the conversation and a link to the response it
//! continued: a rollout of many turns holds (and journals) each item once, not its whole
//! conversation again at every turn.

use serde_json::Value;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

/// Responses findable by id per session; older ones are forgotten first (a response that a
/// kept one continued stays reachable through it).
const KEPT: usize = 256;

/// One stored response.
#[derive(Debug)]
pub struct StoredResponse {
    /// The response it continued (`previous_response_id`), if any.
    pub previous: Option<Arc<StoredResponse>>,
    /// What it added to the conversation: its request's input items, then its output items.
    pub items: Vec<Value>,
    /// The response object as it was returned.
    pub body: Value,
}

impl StoredResponse {
    /// Every item of the conversation up to and with this response's output, oldest first:
    /// what a request continuing it stands on.
    pub fn conversation(&self) -> Vec<&Value> {
        let mut chain = vec![self];
        while let Some(previous) = chain.last().and_then(|r| r.previous.as_deref()) {
            chain.push(previous);
        }
        let total = chain.iter().map(|r| r.items.len()).sum();
        let mut items = Vec::with_capacity(total);
        for response in chain.iter().rev() {
            items.extend(response.items.iter());
        }
        items
    }
}

impl Drop for StoredResponse {
    /// Unlinks the chain one response at a time: dropping a rollout of thousands of turns
    /// must not recurse once per turn.
    fn drop(&mut self) {
        let mut next = self.previous.take();
        while let Some(response) = next {
            next = match Arc::try_unwrap(response) {
                Ok(mut alone) => alone.previous.take(),
                Err(_) => None,
            };
        }
    }
}

/// A session's stored responses, by id.
#[derive(Debug, Default)]
pub struct ResponseStore(Mutex<VecDeque<(String, Arc<StoredResponse>)>>);

impl ResponseStore {
    /// Keeps `response` under `id`.
    pub fn insert(&self, id: String, response: Arc<StoredResponse>) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back((id, response));
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_conversation_is_its_chain_of_additions_and_a_long_one_drops_without_recursing() {
        let store = ResponseStore::default();
        let mut previous = None;
        for turn in 0..200_000 {
            let response = Arc::new(StoredResponse {
                previous: previous.take(),
                items: vec![json!(turn)],
                body: json!({}),
            });
            previous = Some(response);
        }
        let last = previous.unwrap();
        let items = last.conversation();
        assert_eq!(items.len(), 200_000);
        assert_eq!((items[0], items[199_999]), (&json!(0), &json!(199_999)));
        drop(items);
        store.insert("last".into(), last);
        drop(store);
    }
}
