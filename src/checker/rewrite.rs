//! Where a template rewrites history: the first byte at which its render of the next prompt
//! departs from the previous prompt plus the reply sampled after it, named by what it is.

use crate::turn::TurnContext;
use serde::Serialize;

/// A sampled turn, as the next turn's check needs it.
#[derive(Debug, Clone)]
pub struct Sampled {
    /// The sampled turn (1-based).
    pub turn: usize,
    /// The index of its assistant message in the conversation.
    pub message: usize,
    /// The prompt (the template's render, generation prompt included).
    pub prompt: String,
    /// Where the prompt's history ends and its generation prompt begins.
    pub history_len: usize,
    /// The sampled reply's text, end-of-turn token included.
    pub reply: String,
    /// Where in the reply the first call's markup starts, if it made one.
    pub first_call: Option<usize>,
    /// The reasoning returned for the reply, if any.
    pub reasoning: Option<String>,
}

/// Where and how a template rewrote history.
#[derive(Debug, Clone, Serialize)]
pub struct Rewrite {
    /// `end_token_rewritten`, `reasoning_dropped`, `tool_call_reformatted`,
    /// `sampled_turn_rewritten`, `generation_prompt_rewritten` or `earlier_message_rewritten`.
    pub kind: &'static str,
    /// The conversation message in which it happens, when known (0-based).
    pub message: Option<usize>,
    /// Token position (in the previous prompt plus reply) of the first difference.
    pub token: usize,
    /// Text from there, as sampled (up to 48 characters).
    pub sampled: String,
    /// Text from there, as the template renders it now.
    pub rendered: String,
}

/// The rewrite in `next` (the template's render of the next prompt) of `before` (the previous
/// prompt and its sampled reply), if any. `earlier` are the sampled turns before `before`;
/// `locate` names the message an earlier byte lies in.
pub fn find(
    ctx: &TurnContext,
    before: &Sampled,
    earlier: &[Sampled],
    next: &str,
    locate: &dyn Fn(usize) -> Option<usize>,
) -> Option<Rewrite> {
    let sampled = format!("{}{}", before.prompt, before.reply);
    if next.starts_with(&sampled) {
        return None;
    }
    let at = crate::template::common_prefix_len(&sampled, next);
    let prompt_len = before.prompt.len();
    let (kind, message) = if at < before.history_len {
        let message = locate(at);
        let turn = earlier.iter().find(|turn| Some(turn.message) == message);
        let kind = match turn {
            Some(turn) if dropped_reasoning(turn, &sampled, next) => "reasoning_dropped",
            Some(turn) if turn.first_call.is_some() => "tool_call_reformatted",
            Some(_) => "sampled_turn_rewritten",
            None => "earlier_message_rewritten",
        };
        (kind, message)
    } else if at < prompt_len {
        ("generation_prompt_rewritten", Some(before.message))
    } else {
        let kind = reply_rewrite(ctx, before, &sampled, next, at - prompt_len);
        (kind, Some(before.message))
    };
    Some(Rewrite {
        kind,
        message,
        token: ctx.encode_prompt(&sampled[..at]).map_or(0, |ids| ids.len()),
        sampled: snippet(&sampled[at..]),
        rendered: snippet(&next[at..]),
    })
}

/// What a rewrite at byte `at` of the sampled reply is.
fn reply_rewrite(
    ctx: &TurnContext,
    before: &Sampled,
    sampled: &str,
    next: &str,
    at: usize,
) -> &'static str {
    let end_len = ctx
        .encode_prompt(&before.reply)
        .ok()
        .and_then(|ids| ids.last().copied())
        .and_then(|last| ctx.tokenizer.special_token_text(last))
        .map_or(0, str::len);
    if at >= before.reply.len().saturating_sub(end_len) {
        "end_token_rewritten"
    } else if dropped_reasoning(before, sampled, next) {
        "reasoning_dropped"
    } else if before.first_call.is_some_and(|call| at >= call) {
        "tool_call_reformatted"
    } else {
        "sampled_turn_rewritten"
    }
}

/// Whether the render `next` holds fewer copies of `turn`'s reasoning (or, when it was empty,
/// of `<think>` blocks) than the text as sampled.
fn dropped_reasoning(turn: &Sampled, sampled: &str, next: &str) -> bool {
    let Some(reasoning) = turn.reasoning.as_deref() else {
        return false;
    };
    let needle = match reasoning.trim() {
        "" => "<think>",
        text => text,
    };
    next.matches(needle).count() < sampled.matches(needle).count()
}

fn snippet(text: &str) -> String {
    text.chars().take(48).collect()
}
