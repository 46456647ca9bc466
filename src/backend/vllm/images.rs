//! Images on vLLM's tokens-in route (`/inference/v1/generate`). The proxy records each image
//! as the run of placeholders the model's processor makes of it; vLLM takes the prompt with
//! one placeholder per image plus the image itself (a `content_parts` entry) and expands the
//! placeholder again. Ids sent already expanded would be expanded a second time, silently, so
//! each run is collapsed before sending, and the prompt vLLM reports back must be the proxy's
//! own, run for run, or nothing is recorded.
//!
//! vLLM keeps processed images by the `uuid` they came with (the bytes' SHA-256 here): an image
//! a server took before is sent by its name alone ([`Sent`]), so a rollout's turns do not send
//! every earlier image again. A server that no longer has it answers a 400 ("Cache miss");
//! the request is then sent again with every image's bytes.

use crate::backend::BackendError;
use crate::generation::GenerateRequest;
use base64::Engine;
use serde_json::{Value, json};
use std::borrow::Cow;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// The prompt as sent: each image's run collapsed to its first placeholder.
pub(super) fn collapsed(request: &GenerateRequest) -> Cow<'_, [u32]> {
    if request.images.is_empty() {
        return Cow::Borrowed(&request.prompt);
    }
    let prompt = &request.prompt;
    let mut ids = Vec::with_capacity(prompt.len());
    let mut at = 0;
    for image in request.images.iter() {
        let span = &image.span;
        ids.extend_from_slice(&prompt[at..=span.offset]);
        at = span.offset + span.length;
    }
    ids.extend_from_slice(&prompt[at..]);
    Cow::Owned(ids)
}

/// How many image names a client remembers sending to its server.
const REMEMBERED: usize = 4096;
/// Cache misses in a row after which a server is sent every image's bytes for good (its cache
/// is off, or too small to hold a rollout's images).
const MISSES_TO_GIVE_UP: u32 = 3;

/// Names remembered: a set to look them up, and their order to forget the oldest.
#[derive(Debug, Default)]
struct Names {
    known: HashSet<Arc<str>>,
    oldest_first: VecDeque<Arc<str>>,
}

/// The images one server was sent and took, by name.
#[derive(Debug, Default)]
pub(super) struct Sent {
    names: std::sync::Mutex<Names>,
    misses: AtomicU32,
}

impl Sent {
    /// Whether `sha256` was sent to the server and taken (and the server keeps images).
    fn knows(&self, sha256: &str) -> bool {
        self.misses.load(Ordering::Relaxed) < MISSES_TO_GIVE_UP
            && self.lock().known.contains(sha256)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers that the server took `request`'s images.
    pub(super) fn took(&self, request: &GenerateRequest) {
        let mut names = self.lock();
        for image in request.images.iter() {
            if names.known.insert(image.span.sha256.clone()) {
                names.oldest_first.push_back(image.span.sha256.clone());
            }
        }
        while names.oldest_first.len() > REMEMBERED {
            let oldest = names
                .oldest_first
                .pop_front()
                .expect("longer than the limit");
            names.known.remove(&oldest);
        }
    }

    /// Whether `error` is the server missing an image sent by name; it is then forgotten
    /// what the server was sent, and the request is to be sent again with every image.
    pub(super) fn missed(&self, error: &BackendError) -> bool {
        let missed = matches!(error, BackendError::Status { status: 400, message, .. }
            if message.contains("Cache miss"));
        if missed {
            self.misses.fetch_add(1, Ordering::Relaxed);
            *self.lock() = Default::default();
        }
        missed
    }

    /// A request the server took: its cache held what it was asked for.
    pub(super) fn hit(&self) {
        if self.misses.load(Ordering::Relaxed) < MISSES_TO_GIVE_UP {
            self.misses.store(0, Ordering::Relaxed);
        }
    }

    /// The images as vLLM's `content_parts`, each named by its hash (the `uuid` vLLM keeps the
    /// processed image under): by name alone when the server took it before (unless
    /// `every_image`), else with its bytes as a data URL.
    pub(super) fn content_parts(&self, request: &GenerateRequest, every_image: bool) -> Value {
        let parts: Vec<Value> = (request.images.iter())
            .map(|image| {
                let sha256 = &image.span.sha256;
                if !every_image && self.knows(sha256) {
                    return json!({"type": "image_url", "uuid": sha256});
                }
                let data = base64::engine::general_purpose::STANDARD.encode(&image.bytes);
                json!({
                    "type": "image_url",
                    "url": format!("data:{};base64,{data}", image.span.media_type),
                    "uuid": sha256,
                })
            })
            .collect();
        Value::Array(parts)
    }
}

/// Checks the prompt vLLM reports (`prompt_token_ids`, `mm_placeholders`) against the one the
/// proxy planned: the same ids, each image's run where the proxy put it.
pub(super) fn check(
    url: &str,
    request: &GenerateRequest,
    reply: &Value,
) -> Result<(), BackendError> {
    let differ = |reason: String| BackendError::ImagesDiffer {
        url: url.to_string(),
        reason,
    };
    let ids: Vec<u32> = serde_json::from_value(reply["prompt_token_ids"].clone())
        .map_err(|_| differ("the reply has no prompt_token_ids".into()))?;
    if ids != *request.prompt {
        let at = ids
            .iter()
            .zip(request.prompt.iter())
            .position(|(a, b)| a != b)
            .unwrap_or(ids.len().min(request.prompt.len()));
        return Err(differ(format!(
            "its prompt has {} ids, the proxy's {}, first differing at position {at}",
            ids.len(),
            request.prompt.len()
        )));
    }
    let placed = reply["mm_placeholders"]["image"].as_array();
    let runs: Vec<(u64, u64)> = placed
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["offset"].as_u64().unwrap_or(u64::MAX),
                p["length"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let planned: Vec<(u64, u64)> = (request.images.iter())
        .map(|image| (image.span.offset as u64, image.span.length as u64))
        .collect();
    if runs != planned {
        return Err(differ(format!(
            "its image placeholders are {runs:?} (offset, length), the proxy's {planned:?}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::{ImageSpan, PromptImage};
    use std::sync::Arc;

    fn request() -> GenerateRequest {
        let image = |offset, length| PromptImage {
            span: ImageSpan {
                sha256: "ab".into(),
                media_type: "image/png".into(),
                offset,
                length,
                grid_thw: [1, 2, 2],
            },
            bytes: Arc::from(&b"png"[..]),
        };
        GenerateRequest {
            prompt: Arc::new(vec![1, 9, 9, 9, 2, 9, 9, 3]),
            params: Default::default(),
            n: 1,
            session: None,
            adapter: None,
            routed_experts_from: None,
            images: vec![image(1, 3), image(5, 2)].into(),
        }
    }

    #[test]
    fn runs_are_collapsed_and_checked() {
        let request = request();
        assert_eq!(*collapsed(&request), [1, 9, 2, 9, 3]);
        let sent = Sent::default();
        assert_eq!(
            sent.content_parts(&request, false)[0],
            json!({"type": "image_url", "url": "data:image/png;base64,cG5n", "uuid": "ab"})
        );
        sent.took(&request);
        assert_eq!(
            sent.content_parts(&request, false)[0],
            json!({"type": "image_url", "uuid": "ab"})
        );
        assert!(sent.content_parts(&request, true)[0].get("url").is_some());
        let miss = BackendError::Status {
            url: "u".into(),
            status: 400,
            message: "Cache miss for image at index 0 but data is not provided.".into(),
        };
        for _ in 0..MISSES_TO_GIVE_UP {
            assert!(sent.missed(&miss));
            assert!(sent.content_parts(&request, false)[0].get("url").is_some());
            sent.took(&request);
        }
        // A server whose cache keeps missing gets the bytes from then on.
        assert!(sent.content_parts(&request, false)[0].get("url").is_some());
        let good = json!({"prompt_token_ids": [1, 9, 9, 9, 2, 9, 9, 3],
            "mm_placeholders": {"image": [{"offset": 1, "length": 3}, {"offset": 5, "length": 2}]}});
        assert!(check("u", &request, &good).is_ok());
        let twice = json!({"prompt_token_ids": [1, 9, 9, 9, 9, 2, 9, 9, 3],
            "mm_placeholders": {"image": [{"offset": 1, "length": 4}, {"offset": 6, "length": 2}]}});
        let error = check("u", &request, &twice).unwrap_err().to_string();
        assert!(error.contains("first differing at position 4"), "{error}");
        let moved = json!({"prompt_token_ids": [1, 9, 9, 9, 2, 9, 9, 3],
            "mm_placeholders": {"image": [{"offset": 1, "length": 3}]}});
        assert!(check("u", &request, &moved).is_err());
        assert!(check("u", &request, &json!({})).is_err());
    }
}
