//! What vLLM's tokens-in route does with images, for the scripted upstream: each
//! `<|image_pad|>` of `token_ids` with a `content_parts` image becomes a run of placeholders
//! (`prompt_token_ids`), reported as `mm_placeholders` (the shape of vLLM 0.32's reply).

use serde_json::{Value, json};

/// The Qwen-VL placeholder.
pub const IMAGE_PAD: u32 = 151655;

/// `prompt_token_ids` and `mm_placeholders` for a request whose images expand to `runs`
/// placeholders each (in order; an image past `runs` keeps one); `None` when the request asks
/// for no ids back.
pub fn expand(body: &Value, runs: &[usize]) -> Option<(Vec<u32>, Value)> {
    if body["return_token_ids"] != true {
        return None;
    }
    let ids: Vec<u32> = serde_json::from_value(body["token_ids"].clone()).ok()?;
    let images = body["content_parts"].as_array().map_or(0, Vec::len);
    let mut prompt = Vec::with_capacity(ids.len());
    let mut placed = Vec::new();
    for id in ids {
        if id != IMAGE_PAD || placed.len() == images {
            prompt.push(id);
            continue;
        }
        let length = runs.get(placed.len()).copied().unwrap_or(1);
        placed.push(json!({"offset": prompt.len(), "length": length}));
        prompt.extend(std::iter::repeat_n(IMAGE_PAD, length));
    }
    Some((prompt, json!({"image": placed})))
}
