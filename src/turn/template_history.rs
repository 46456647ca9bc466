//! The template's own rendering of a conversation, sampled turns written in as their text:
//! `history: "template"` (the node is extended only where that rendering starts with it), and
//! the fallback for a template that does not reproduce the sampled turns' placeholders.

use super::planned::{
    Base, Plan, Planner, RenderedPrompt, Split, chain_candidate, history_entries,
};
use super::segments::generation_check;
use super::{TurnContext, TurnError};
use crate::session::{CompletionId, Divergence, SessionState};
use crate::template::{RenderRequest, TemplateValue, template_map};
use std::sync::Arc;

/// Renders the conversation with each sampled turn as its raw text (what the template itself
/// would produce from the model's output).
fn render_raw(
    planner: &Planner,
    messages: &[TemplateValue],
    matched: &[Option<CompletionId>],
) -> Result<String, TurnError> {
    let (ctx, state, request) = (planner.ctx, planner.state, planner.request);
    let raw: Vec<TemplateValue> = messages
        .iter()
        .zip(matched)
        .zip(&request.messages)
        .map(|((message, completion), sent)| match completion {
            // Harmony's channel markup cannot stand as content: the template renders the
            // message as the client sent it back (content, reasoning and calls).
            Some(_) if ctx.harmony => sent.to_template_value(ctx.template.reads_content_parts()),
            Some(completion) => assistant_value(&raw_text(ctx, state, *completion)),
            None => message.clone(),
        })
        .collect();
    Ok(ctx.template.render(RenderRequest {
        messages: &TemplateValue::from(raw),
        tools: request.tools.as_ref().map(|tools| tools.json()),
        add_generation_prompt: request.add_generation_prompt,
        kwargs: Some(&request.template_kwargs),
    })?)
}

/// An assistant message with only text, as the template gets it.
fn assistant_value(content: &str) -> TemplateValue {
    template_map([
        ("role", TemplateValue::from("assistant")),
        ("content", TemplateValue::from(content)),
    ])
}

/// The text of a completion as message content: its tokens decoded, without the end token.
fn raw_text(ctx: &TurnContext, state: &SessionState, completion: CompletionId) -> String {
    let record = &state.completions[completion];
    let text = ctx
        .tokenizer
        .decode(&state.nodes[record.node].slice(record.span));
    match &record.end_token_text {
        Some(end) => text
            .strip_suffix(end.as_str())
            .map(str::to_string)
            .unwrap_or(text),
        None => text,
    }
}

/// `history: "template"`: the prompt is the template's own rendering of the conversation; the
/// node is extended only when its text is a prefix of that rendering.
pub(super) fn template_mode_plan(
    planner: &Planner,
    messages: &[TemplateValue],
    matched: &[Option<CompletionId>],
    Split { pieces, next_check }: Split,
) -> Result<Plan, TurnError> {
    let (ctx, state) = (planner.ctx, planner.state);
    let sampled: Vec<CompletionId> = matched.iter().flatten().copied().collect();
    let faithful = render_raw(planner, messages, matched)?;
    let history = history_entries(&sampled, &pieces);
    let mut divergence = None;
    if let Some(n) = (1..=sampled.len())
        .rev()
        .find_map(|m| chain_candidate(state, &sampled[..m]))
    {
        let node = &state.nodes[n];
        let node_ids = node.tokens();
        let node_text = ctx.tokenizer.decode(&node_ids);
        if let Some(rest) = faithful.strip_prefix(node_text.as_str()) {
            let mut prompt_ids = node_ids;
            prompt_ids.extend(ctx.encode_prompt(rest)?);
            return Ok(Plan {
                prompt_ids: Arc::new(prompt_ids),
                base: Base::Extend { node: n },
                base_len: node.len(),
                history,
                next_check,
                rendered: Some(RenderedPrompt::with_turns_as_text(faithful)),
                conversation: None,
                echoed_calls: Vec::new(),
                tail_render_disagreed: false,
                images: Default::default(),
            });
        }
        let at = node_text
            .char_indices()
            .zip(faithful.chars())
            .find(|((_, a), b)| a != b)
            .map_or(node_text.len().min(faithful.len()), |((i, _), _)| i);
        divergence = Some(Divergence {
            reason: "template_rewrites_history",
            detail: format!(
                "the chat template renders earlier turns differently from what was sampled \
                 (e.g. it drops old reasoning); first difference at character {at} of the node text"
            ),
            from_node: Some(n),
            token_position: None,
        });
    }
    Ok(Plan {
        prompt_ids: Arc::new(ctx.encode_prompt(&faithful)?),
        base: Base::New { divergence },
        base_len: 0,
        history,
        next_check,
        rendered: Some(RenderedPrompt::with_turns_as_text(faithful)),
        conversation: None,
        echoed_calls: Vec::new(),
        tail_render_disagreed: false,
        images: Default::default(),
    })
}

/// The template did not reproduce every placeholder once and in order (it dropped, reordered or
/// altered a sampled turn): tokenize its own rendering as a new node and say so.
pub(super) fn faithful_fallback(
    planner: &Planner,
    messages: &[TemplateValue],
    matched: &[Option<CompletionId>],
) -> Result<Plan, TurnError> {
    let ctx = planner.ctx;
    let sampled: Vec<CompletionId> = matched.iter().flatten().copied().collect();
    let text = render_raw(planner, messages, matched)?;
    let empty_pieces = vec![""; sampled.len()];
    Ok(Plan {
        prompt_ids: Arc::new(ctx.encode_prompt(&text)?),
        base: Base::New {
            divergence: Some(Divergence {
                reason: "template_altered_sampled_turn",
                detail: "the chat template did not render every sampled assistant turn verbatim, \
                         so their ids cannot be reused; the prompt is the template's rendering"
                    .into(),
                from_node: None,
                token_position: None,
            }),
        },
        base_len: 0,
        history: history_entries(&sampled, &empty_pieces),
        next_check: generation_check("", ""),
        rendered: Some(RenderedPrompt::with_turns_as_text(text)),
        conversation: None,
        echoed_calls: Vec::new(),
        tail_render_disagreed: false,
        images: Default::default(),
    })
}
