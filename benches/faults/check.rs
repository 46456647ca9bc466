//! What "exact" means for a rollout's node: one node, whose every sampled run is exactly the
//! upstream's reply to the prompt before it (ids and logprobs), one run per turn.

use serde_json::Value;

/// The upstream's deterministic reply to a prompt (ids; the logprobs follow from them).
pub type Replies<'a> = &'a dyn Fn(&[u32]) -> Vec<u32>;

/// Checks `nodes` (a `GET /nodes` body) holds one exact node of `turns` turns.
pub fn exact_node(nodes: &Value, turns: usize, replies: Replies) -> Result<(), String> {
    let nodes = nodes["nodes"].as_array().ok_or("no nodes")?;
    if nodes.len() != 1 {
        let reasons: Vec<_> = nodes.iter().map(|n| &n["metadata"]["divergence"]).collect();
        return Err(format!("{} nodes: {reasons:?}", nodes.len()));
    }
    let ids = |field: &str| -> Result<Vec<i64>, String> {
        nodes[0][field]
            .as_array()
            .ok_or(format!("no {field}"))?
            .iter()
            .map(|v| v.as_i64().ok_or(format!("{field}: not an integer")))
            .collect()
    };
    let (tokens, masked) = (ids("tokens")?, ids("masked_tokens")?);
    let logprobs: Vec<f64> = nodes[0]["logprobs"]
        .as_array()
        .ok_or("no logprobs")?
        .iter()
        .map(|v| v.as_f64().unwrap_or(f64::NAN))
        .collect();
    if tokens.len() != masked.len() || tokens.len() != logprobs.len() {
        return Err("arrays of different lengths".into());
    }
    let prompt: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
    let mut runs = 0;
    let mut at = 0;
    while at < tokens.len() {
        if masked[at] == -100 {
            if logprobs[at] != 1.0 {
                return Err(format!("prompt position {at} has logprob {}", logprobs[at]));
            }
            at += 1;
            continue;
        }
        let expected = replies(&prompt[..at]);
        let end = at + expected.len();
        if end > tokens.len() || prompt[at..end] != expected[..] {
            return Err(format!(
                "turn {} at {at}: not the upstream's reply",
                runs + 1
            ));
        }
        for (i, position) in (at..end).enumerate() {
            let logprob = -0.1 - i as f64 * 0.01;
            if masked[position] != tokens[position] || (logprobs[position] - logprob).abs() > 1e-5 {
                return Err(format!("turn {} at {position}: mask or logprob", runs + 1));
            }
        }
        runs += 1;
        at = end;
    }
    if runs != turns {
        return Err(format!("{runs} sampled turns, expected {turns}"));
    }
    Ok(())
}
