//! vLLM's tokens-in route (`/inference/v1/generate`) as the scripted upstream answers it: its
//! choices and replies (the shape of vLLM 0.32's), and images: each `<|image_pad|>` of
//! `token_ids` with a `content_parts` image becomes a run of placeholders
//! (`prompt_token_ids`), reported as `mm_placeholders`.

use super::mock_worker::Sample;
use serde_json::{Value, json};

/// The Qwen-VL placeholder.
pub const IMAGE_PAD: u32 = 151655;

/// vLLM's processed-image cache: an image sent with its bytes is kept by its `uuid`; one
/// named alone must be kept, else the request is refused with vLLM's own message.
pub fn cached(body: &Value, cache: &mut std::collections::HashSet<String>) -> Result<(), String> {
    let parts = body["content_parts"].as_array().into_iter().flatten();
    for (index, part) in parts.enumerate() {
        let uuid = part["uuid"].as_str().unwrap_or_default().to_string();
        if part.get("url").is_some() {
            cache.insert(uuid);
        } else if !cache.contains(&uuid) {
            return Err(format!(
                "Cache miss for image at index {index} but data is not provided."
            ));
        }
    }
    Ok(())
}

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

/// A vLLM 0.32 `/inference/v1/generate` choice (copied from a real server's reply): with
/// `last`, the choice that ends the sample (a streamed choice carries only new tokens, and
/// `weight_versions` only on its last chunk).
pub fn choice(index: usize, s: &Sample, range: std::ops::Range<usize>, last: bool) -> Value {
    let content: Vec<Value> = s.ids[range.clone()]
        .iter()
        .zip(&s.logprobs[range])
        .map(|(id, lp)| {
            json!({"token_id": id, "logprob": lp, "rank": 1,
                   "top_logprobs": [{"token_id": id, "logprob": lp, "rank": 1}]})
        })
        .collect();
    let ids: Vec<u32> = content
        .iter()
        .map(|c| c["token_id"].as_u64().unwrap() as u32)
        .collect();
    let stop_reason = match &s.matched {
        Value::String(_) if last => s.matched.clone(),
        _ => Value::Null,
    };
    json!({"index": index, "finish_reason": if last { json!(s.finish) } else { Value::Null },
        "stop_reason": stop_reason, "token_ids": ids, "routed_experts": null, "sampling_mask": null,
        "weight_versions": if last { json!([{"version": "default", "start": 0, "end": s.ids.len()}]) } else { Value::Null },
        "logprobs": {"content": content}})
}

pub fn reply(samples: &[Sample], body: &Value) -> Value {
    let choices: Vec<Value> = samples
        .iter()
        .enumerate()
        .map(|(i, s)| choice(i, s, 0..s.ids.len(), true))
        .collect();
    json!({"request_id": "generate-tokens-mock", "model": "tiny",
        "usage": {"prompt_tokens": 1, "total_tokens": 1, "completion_tokens": 0},
        "prompt_logprobs": null, "prompt_token_id_logprobs": null,
        "metrics": null, "kv_transfer_params": null,
        "ec_transfer_params": null, "output_mode": "tokens", "choices": choices,
        "prompt_token_ids": body["prompt_token_ids"], "mm_placeholders": body["mm_placeholders"]})
}
