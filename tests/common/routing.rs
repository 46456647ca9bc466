//! Routed experts as the scripted upstream reports them when a request asks: vLLM a base64
//! `.npy` (uint8, rows × 2 layers × top-2) in each choice, SGLang the base64 of raw `int32`s in
//! `meta_info`. Each row covers one position of the prompt and sample, from the start asked
//! through the last fed one, and depends on its position alone, so a test can tell every row
//! the proxy keeps is where it belongs.

use super::mock_worker::{Sample, Wire};
use base64::Engine;
use serde_json::Value;

/// Expert ids per row: 2 layers × top-2.
pub const WIDTH: usize = 4;

/// The experts the scripted model routes position `position` to.
pub fn row(position: usize) -> [u16; WIDTH] {
    [0, 7, 13, 17].map(|k| ((position * k + position) % 251) as u16)
}

/// Where a request asked for routing from, and its prompt's length.
fn asked(body: &Value, wire: Wire) -> Option<(usize, usize)> {
    let (from, prompt) = match wire {
        Wire::Vllm | Wire::VllmScaleOutOff => {
            (&body["routed_experts_prompt_start"], &body["prompt"])
        }
        Wire::VllmGenerate => (
            &body["sampling_params"]["routed_experts_prompt_start"],
            &body["token_ids"],
        ),
        Wire::Sglang if body["return_routed_experts"] == true => {
            (&body["routed_experts_start_len"], &body["input_ids"])
        }
        _ => return None,
    };
    let from = from.as_u64().or((wire == Wire::Sglang).then_some(0))? as usize;
    Some((from, prompt.as_array().map_or(0, Vec::len)))
}

/// The rows for positions `from..fed - 1`, encoded as `wire` writes them.
fn encoded(wire: Wire, from: usize, fed: usize) -> String {
    let rows: Vec<u16> = (from..fed.saturating_sub(1)).flat_map(row).collect();
    let bytes = match wire {
        Wire::Sglang => rows
            .iter()
            .flat_map(|&id| i32::from(id).to_le_bytes())
            .collect(),
        _ => {
            use ndarray_npy::WriteNpyExt;
            let count = rows.len() / WIDTH;
            let ids: Vec<u8> = rows.iter().map(|&id| id as u8).collect();
            let array = ndarray::Array3::from_shape_vec((count, 2, 2), ids).unwrap();
            let mut npy = Vec::new();
            array.write_npy(&mut npy).unwrap();
            npy
        }
    };
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Adds each sample's routing to a whole reply, when the request asked for it.
pub fn attach(reply: &mut Value, body: &Value, wire: Wire, samples: &[Sample]) {
    let Some((from, prompt)) = asked(body, wire) else {
        return;
    };
    for (index, sample) in samples.iter().enumerate() {
        let routing = Value::from(encoded(wire, from, prompt + sample.ids.len()));
        match (wire, reply.is_array()) {
            (Wire::Sglang, true) => reply[index]["meta_info"]["routed_experts"] = routing,
            (Wire::Sglang, false) => reply["meta_info"]["routed_experts"] = routing,
            _ => reply["choices"][index]["routed_experts"] = routing,
        }
    }
}

/// Adds the sample's routing to its stream's last chunk, when the request asked for it (as
/// vLLM's tokens-in route and SGLang send it; vLLM's completions stream carries none).
pub fn attach_to_chunk(chunk: &mut Value, body: &Value, wire: Wire, sample: &Sample) {
    let Some((from, prompt)) = asked(body, wire) else {
        return;
    };
    let routing = Value::from(encoded(wire, from, prompt + sample.ids.len()));
    match wire {
        Wire::Sglang => chunk["meta_info"]["routed_experts"] = routing,
        Wire::VllmGenerate => chunk["choices"][0]["routed_experts"] = routing,
        _ => {}
    }
}
