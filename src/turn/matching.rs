//! Recognising replies when they come back: the fingerprints a sampled reply is recorded
//! under, and which assistant messages of a later request are completions this session
//! sampled. Those are replaced by their exact token ids.

use super::reply::Reply;
use crate::chat::{ChatMessage, Role};
use crate::session::completion::{message_fingerprint, tool_call_hash};
use crate::session::{CompletionId, IssuedToolCall, SessionState};
use serde_json::Value;

/// How `reply` will be recognised when a client sends it back: the calls it returned (each
/// under its id and a hash of what it called) and the fingerprints of the assistant messages
/// that stand for it (its content with its call ids; with calls or reasoning, also its raw
/// text, which a client may send back instead).
pub fn recognisers(reply: &Reply) -> (Vec<IssuedToolCall>, Vec<u64>) {
    let tool_calls: Vec<IssuedToolCall> = reply
        .tool_calls
        .iter()
        .map(|call| IssuedToolCall {
            id: call.id.clone(),
            healed_from: call.healed_from,
            call_hash: tool_call_hash(
                &call.name,
                &serde_json::from_str(&call.arguments)
                    .unwrap_or_else(|_| Value::String(call.arguments.clone())),
            ),
        })
        .collect();
    let content = reply.content.as_deref().unwrap_or("");
    let mut fingerprints = vec![message_fingerprint(
        content,
        tool_calls.iter().map(|c| c.id.as_str()),
    )];
    if !tool_calls.is_empty() || reply.reasoning.is_some() {
        fingerprints.push(message_fingerprint(&reply.text, std::iter::empty()));
    }
    (tool_calls, fingerprints)
}

/// For each message, the completion it is (assistant messages only), matched by tool-call ids
/// and by content. A completion is preferred when it followed the previously matched one in
/// its node, so identical answers in different branches map to the right branch.
pub fn match_completions(
    state: &SessionState,
    messages: &[ChatMessage],
) -> Vec<Option<CompletionId>> {
    let mut previous: Option<CompletionId> = None;
    messages
        .iter()
        .map(|message| {
            if message.role != Role::Assistant {
                return None;
            }
            let content = message.content.as_deref().unwrap_or("");
            let ids = message.tool_calls.iter().map(|c| c.id.as_str());
            let candidates = state
                .by_fingerprint
                .get(&message_fingerprint(content, ids))?;
            let fits = |id: &&CompletionId| calls_match(state, **id, message);
            let chosen = candidates
                .iter()
                .filter(fits)
                .find(|id| state.completions[**id].previous == previous)
                .or_else(|| candidates.iter().filter(fits).max())
                .copied();
            if chosen.is_some() {
                previous = chosen;
            }
            chosen
        })
        .collect()
}

/// A message with tool calls matches only if every call is one the proxy issued, unchanged.
fn calls_match(state: &SessionState, id: CompletionId, message: &ChatMessage) -> bool {
    if message.tool_calls.is_empty() {
        return true;
    }
    let issued = &state.completions[id].tool_calls;
    issued.len() == message.tool_calls.len()
        && issued
            .iter()
            .zip(&message.tool_calls)
            .all(|(issued, sent)| {
                issued.id == sent.id
                    && issued.call_hash == tool_call_hash(&sent.name, &sent.arguments_value())
            })
}
