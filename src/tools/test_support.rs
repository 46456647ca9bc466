//! Helpers for the parsers' unit tests.

use super::{DeclaredTools, Promoter};
use std::sync::Arc;

/// A request's `tools`, checked.
pub fn declared(tools: serde_json::Value) -> Arc<DeclaredTools> {
    let list = serde_json::from_value(tools).expect("a list of tools");
    Arc::new(DeclaredTools::new(list).unwrap().expect("a tool"))
}

/// Healing rules under which every tool in `names` (no parameters schema) is callable.
pub fn promoter(names: &[&str]) -> Promoter {
    let tools: Vec<_> = names
        .iter()
        .map(|n| serde_json::json!({"type": "function", "function": {"name": n}}))
        .collect();
    Promoter::new(
        Some(&declared(tools.into())),
        &names.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
        true,
    )
}
