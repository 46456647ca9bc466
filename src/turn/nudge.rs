//! The nudge: when the model described a tool call instead of making one, the turn is asked
//! once more, with the reply as it was and a request to make the call properly.

use super::reply::Reply;
use crate::chat::{ChatMessage, ChatRequest};
use crate::tools::ToolParser;
use serde_json::json;
use std::sync::Arc;

/// The first choice wrote tool-call markup, but nothing could be promoted from it.
pub fn deserves_nudge(request: &ChatRequest, parser: &dyn ToolParser, reply: &Reply) -> bool {
    request.calls.nudge
        && request.promoter().is_active()
        && reply.tool_calls.is_empty()
        && parser.signals().iter().any(|s| reply.text.contains(s))
}

/// `request` followed by the reply as it was and the request to make the call.
pub fn nudge_request(request: &ChatRequest, reply: &Reply) -> ChatRequest {
    let mut names = request.callable_tools();
    names.sort();
    let hint = if names.is_empty() {
        "an available tool".to_string()
    } else {
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(" or ")
    };
    let mut retry = request.clone();
    // The retry is sampled, never replayed from the first attempt's record under the key.
    retry.key = None;
    let assistant =
        json!({"role": "assistant", "content": reply.content.clone().unwrap_or_default()});
    let user = json!({"role": "user", "content": format!(
        "You have access to the declared tools. If a tool is needed to complete the action you \
         described, call {hint} now using the native tool-call format with valid JSON arguments, \
         not prose. If no tool is needed, provide the final answer directly."
    )});
    let base = retry.messages.len();
    retry.messages.push(Arc::new(
        ChatMessage::parse(base, assistant).expect("a valid assistant message"),
    ));
    retry.messages.push(Arc::new(
        ChatMessage::parse(base + 1, user).expect("a valid user message"),
    ));
    retry
}
