//! Helpers for the parsers' unit tests.

use super::Promoter;

/// Healing rules under which every tool in `names` (no parameters schema) is callable.
pub fn promoter(names: &[&str]) -> Promoter {
    let tools: Vec<_> = names
        .iter()
        .map(|n| serde_json::json!({"type": "function", "function": {"name": n}}))
        .collect();
    Promoter::new(
        Some(&serde_json::Value::from(tools)),
        &names.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
        true,
    )
}
