//! Recognising replies when they come back: the fingerprints a sampled reply is recorded
//! under, and which assistant messages of a later request are completions this session
//! sampled. Those are replaced by their exact token ids.
//!
//! A call handed back re-serialised, or with its schema's defaults filled in, is still the
//! call the model made ([`crate::tools::echo`]); what changed is recorded on the turn.

use super::reply::Reply;
use crate::chat::{ChatMessage, Role, ToolCall};
use crate::session::completion::{message_fingerprint, tool_call_hash};
use crate::session::{CompletionId, EchoChange, EchoKey, IssuedToolCall, SessionState};
use crate::tools::DeclaredTools;
use crate::tools::echo::canonical;
use serde_json::Value;
use std::sync::Arc;

/// How `reply` will be recognised when a client sends it back: the calls it returned (each
/// under its id, a hash of what it called, and its canonical form under the request's `tools`)
/// and the fingerprints of the assistant messages that stand for it (its content with its
/// call ids; with calls or reasoning, also its raw text, which a client may send back
/// instead).
pub fn recognisers(
    reply: &Reply,
    tools: Option<&DeclaredTools>,
) -> (Vec<IssuedToolCall>, Vec<u64>) {
    let tool_calls: Vec<IssuedToolCall> = reply
        .tool_calls
        .iter()
        .map(|call| {
            let arguments = serde_json::from_str(&call.arguments)
                .unwrap_or_else(|_| Value::String(call.arguments.clone()));
            let schema = tools.and_then(|t| t.parameters(&call.name));
            let canonical = canonical(&call.name, &arguments, schema);
            IssuedToolCall {
                id: call.id.clone(),
                healed_from: call.healed_from,
                call_hash: tool_call_hash(&call.name, &arguments),
                echo: Some(EchoKey {
                    canonical_hash: canonical.hash,
                    text_hash: xxhash_rust::xxh3::xxh3_64(call.arguments.as_bytes()),
                    default_keys: canonical.default_keys,
                }),
            }
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

/// The assistant messages of a request recognised as completions this session sampled.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Matched {
    /// For each message, the completion it is (assistant messages only).
    pub completions: Vec<Option<CompletionId>>,
    /// The calls of the last recognised completion that came back changed, with what changed
    /// (earlier ones were recorded on the turn after theirs).
    pub echoed_calls: Vec<EchoChange>,
}

/// For each message, the completion it is (assistant messages only), matched by tool-call ids
/// and by content; calls are compared under the request's `tools`. A completion is preferred
/// when it followed the previously matched one in its node, so identical answers in different
/// branches map to the right branch.
pub fn match_completions(
    state: &SessionState,
    messages: &[Arc<ChatMessage>],
    tools: Option<&DeclaredTools>,
) -> Matched {
    let mut previous: Option<CompletionId> = None;
    let mut last_echoes = Vec::new();
    let completions = messages
        .iter()
        .map(|message| {
            if message.role != Role::Assistant {
                return None;
            }
            let candidates = state.by_fingerprint.get(&message.fingerprint())?;
            let echoes = |id: CompletionId| calls_match(state, id, message, tools);
            let chosen = candidates
                .iter()
                .filter_map(|&id| Some((id, echoes(id)?)))
                .find(|(id, _)| state.completions[*id].previous == previous)
                .or_else(|| {
                    let latest = candidates
                        .iter()
                        .copied()
                        .filter(|&id| echoes(id).is_some())
                        .max()?;
                    Some((latest, echoes(latest)?))
                });
            let (chosen, echoed) = chosen?;
            previous = Some(chosen);
            last_echoes = echoed;
            Some(chosen)
        })
        .collect();
    Matched {
        completions,
        echoed_calls: last_echoes,
    }
}

/// Whether `message` is completion `id`: every call one the proxy issued for it, the same call
/// (changed at most as [`crate::tools::echo`] allows); `Some` with what changed, `None` if not.
fn calls_match(
    state: &SessionState,
    id: CompletionId,
    message: &ChatMessage,
    tools: Option<&DeclaredTools>,
) -> Option<Vec<EchoChange>> {
    let issued = &state.completions[id].tool_calls;
    if issued.len() != message.tool_calls.len() {
        return None;
    }
    let mut changes = Vec::new();
    let sent_calls = message.tool_calls.iter().zip(message.call_hashes());
    for (issued, (sent, &sent_hash)) in issued.iter().zip(sent_calls) {
        if issued.id != sent.id {
            return None;
        }
        if let Some(change) = handed_back(issued, (sent, sent_hash), tools)? {
            changes.push(change);
        }
    }
    Some(changes)
}

/// Whether `sent` (with its call hash) is the call `issued`: `Some(None)` unchanged,
/// `Some(Some(change))` changed only as a client may change it, `None` another call.
fn handed_back(
    issued: &IssuedToolCall,
    (sent, sent_hash): (&ToolCall, u64),
    tools: Option<&DeclaredTools>,
) -> Option<Option<EchoChange>> {
    let change = |change: &'static str, keys: Vec<String>| EchoChange {
        id: issued.id.clone(),
        change,
        keys,
    };
    if issued.call_hash == sent_hash {
        let rewritten = match (&issued.echo, &sent.arguments) {
            (Some(echo), Value::String(text)) => {
                xxhash_rust::xxh3::xxh3_64(text.as_bytes()) != echo.text_hash
            }
            _ => false,
        };
        return Some(rewritten.then(|| change("formatting", Vec::new())));
    }
    let echo = issued.echo.as_ref()?;
    let arguments = sent.arguments_value();
    let schema = tools.and_then(|t| t.parameters(&sent.name));
    let sent = canonical(&sent.name, &arguments, schema);
    if sent.hash != echo.canonical_hash {
        return None;
    }
    let added = sent
        .default_keys
        .iter()
        .filter(|key| !echo.default_keys.contains(key))
        .map(|key| format!("+{key}"));
    let dropped = echo
        .default_keys
        .iter()
        .filter(|key| !sent.default_keys.contains(key))
        .map(|key| format!("-{key}"));
    let keys: Vec<String> = added.chain(dropped).collect();
    Some(Some(match keys.is_empty() {
        // Only numbers spelled otherwise (`1.0` sent back as `1`).
        true => change("formatting", keys),
        false => change("defaults", keys),
    }))
}
