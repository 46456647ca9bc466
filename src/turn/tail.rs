//! Rendering only the end of a conversation. A turn's prompt is the node's ids plus the text
//! the template writes after the last sampled turn; rendering the whole conversation for that
//! text makes a long rollout's turns cost in proportion to its history. When the conversation
//! up to the last sampled turn is exactly what the node was built from (its digest, kept per
//! completion, says so), the template renders a shortened conversation instead: the leading
//! system messages, then the messages from the last user message before that turn on (an even
//! number left out, so templates that check turn parity see the same). The text after the
//! last sampled turn is the same in both renders for templates whose rendering of a message
//! depends on what is near it, which `check-template` proves on its shapes at start-up
//! ([`crate::checker::tail_renders_hold`]); every sixteenth such turn a session also renders in
//! full and compares (a mismatch uses the full render and is counted).

use super::TurnError;
use super::planned::Planner;
use super::planned::{Base, Plan, RenderedPrompt, chain_candidate};
use crate::chat::{ChatMessage, ChatRequest, Role};
use crate::session::CompletionId;
use std::hash::Hasher;
use std::sync::Arc;

/// A session renders its first tail-only prompt, and then every this many, also in full.
pub const VERIFY_EVERY: u64 = 16;

/// The digest of `request`'s first `k` messages (with its tools and kwargs), for every `k`
/// from 0 to all: one pass over the conversation.
pub fn prefix_digests(request: &ChatRequest) -> Vec<u64> {
    let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
    if let Some(tools) = &request.tools {
        hasher.write_u64(tools.digest());
    }
    hasher.write(&serde_json::to_vec(&request.template_kwargs).unwrap_or_default());
    let mut digests = Vec::with_capacity(request.messages.len() + 1);
    digests.push(hasher.digest());
    for message in &request.messages {
        hasher.write_u64(message.digest());
        digests.push(hasher.digest());
    }
    digests
}

/// Renders the kept messages (by index) and splits off the text after the last sampled turn;
/// `None` when the template did not reproduce the turns.
pub type RenderKept<'a> = dyn Fn(&[usize]) -> Result<Option<RenderedTail>, TurnError> + 'a;

/// The plan of a tail-only render, when the conversation allows one: `matched` are the
/// request's messages' completions, `digests` its prefix digests.
pub fn plan(
    planner: &Planner,
    matched: &[Option<CompletionId>],
    digests: &[u64],
    render: &RenderKept,
) -> Result<Option<Plan>, TurnError> {
    let (ctx, state, request) = (planner.ctx, planner.state, planner.request);
    let Some(last) = matched.iter().rposition(Option::is_some) else {
        return Ok(None);
    };
    let completion = matched[last].expect("a matched message");
    let unchanged = state
        .sampled_after
        .get(&completion)
        .is_some_and(|before| before.messages == last && before.digest == digests[last]);
    let sampled: Vec<CompletionId> = matched.iter().flatten().copied().collect();
    let Some(node) = (unchanged.then(|| chain_candidate(state, &sampled))).flatten() else {
        return Ok(None);
    };
    let Some(tail) = render(&kept_messages(&request.messages, last))? else {
        return Ok(None);
    };
    let base = &state.nodes[node];
    let mut prompt_ids = Vec::with_capacity(base.len() + 1024);
    base.copy_tokens_into(&mut prompt_ids);
    let base_len = prompt_ids.len();
    prompt_ids.extend(ctx.encode_prompt(&tail.piece)?);
    Ok(Some(Plan {
        prompt_ids: Arc::new(prompt_ids),
        base: Base::Extend { node },
        base_len,
        history: base.history.clone(),
        next_check: tail.next_check,
        rendered: Some(tail.rendered),
        conversation: None,
        echoed_calls: Vec::new(),
        tail_render_disagreed: false,
        images: Default::default(),
    }))
}

/// A shortened render's text after the last sampled turn.
#[derive(Debug)]
pub struct RenderedTail {
    /// The prompt's text after the last sampled turn (its end token removed).
    pub piece: String,
    /// The check of that text for the next turn.
    pub next_check: crate::session::SegmentCheck,
    /// The shortened render.
    pub rendered: RenderedPrompt,
}

/// The indices of the messages a tail render keeps: the leading system messages, then from the
/// last user message before `last` (the last sampled turn) on, an even number left out.
pub fn kept_messages(messages: &[Arc<ChatMessage>], last: usize) -> Vec<usize> {
    let head = messages
        .iter()
        .take_while(|m| matches!(m.role, Role::System | Role::Developer))
        .count()
        .min(last);
    let mut from = messages[..last]
        .iter()
        .rposition(|m| m.role == Role::User)
        .unwrap_or(last)
        .max(head);
    if (from - head) % 2 == 1 {
        from -= 1;
    }
    (0..head).chain(from..messages.len()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(roles: &[Role]) -> Vec<Arc<ChatMessage>> {
        roles
            .iter()
            .map(|&role| Arc::new(ChatMessage::text(role, String::new())))
            .collect()
    }

    #[test]
    fn keeps_the_system_prompt_and_the_last_exchange() {
        use Role::*;
        // system, then turns; the last sampled turn is message 6.
        let conversation = messages(&[
            System, User, Assistant, User, Assistant, Tool, Assistant, User,
        ]);
        assert_eq!(kept_messages(&conversation, 6), [0, 3, 4, 5, 6, 7]);
        // An odd number left out would shift the turns' parity: one more is kept.
        let conversation = messages(&[System, User, Assistant, Tool, User, Assistant, User]);
        assert_eq!(kept_messages(&conversation, 5), [0, 3, 4, 5, 6]);
        // No user message before the turn: from the turn on.
        let conversation = messages(&[Assistant, User]);
        assert_eq!(kept_messages(&conversation, 0), [0, 1]);
    }

    #[test]
    fn the_digest_sees_every_field_and_the_tools() {
        let body = |content: &str, tools: bool| {
            let mut body = serde_json::json!({"messages": [{"role": "user", "content": content},
                {"role": "tool", "tool_call_id": "c", "content": "x"}]});
            if tools {
                body["tools"] =
                    serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
            }
            let body: crate::http::openai::request::ChatCompletionBody =
                serde_json::from_value(body).unwrap();
            prefix_digests(&body.validate(None).unwrap().turn)
        };
        let base = body("hi", false);
        assert_eq!(base.len(), 3);
        assert_eq!(base, body("hi", false));
        assert_ne!(base[1], body("hi!", false)[1]);
        assert_ne!(base[0], body("hi", true)[0]);
    }
}
