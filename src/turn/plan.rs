//! Building a turn's prompt: the request's messages → prompt ids that extend the session's
//! node, and what to record once the reply is sampled.
//!
//! [`Planner::prepare`] reads the session and writes nothing to it (it only counts its tail-only
//! renders, [`super::tail`]), so `/render` shows exactly what a real call would send, and a
//! failed backend call leaves the session untouched.
//!
//! How the prompt is built (template-agnostic, no per-model code):
//! 1. assistant messages that are completions this session sampled are found
//!    ([`super::matching`]);
//! 2. the conversation is rendered with each of them replaced by a placeholder
//!    ([`super::segments`]);
//! 3. the node that ends with the last such completion is extended when every piece of text
//!    between its completions still renders as it did; the new prompt is that node's ids plus
//!    the tokens of the text after the last placeholder (minus an end token the model already
//!    sampled), else a new node starts and records why.
//!
//! When the conversation up to its last sampled turn is unchanged, step 2 renders only its end
//! ([`TailRender`], [`super::tail`]).

use super::planned::{
    Base, Plan, Planner, RenderedPrompt, Split, chain_candidate, history_entries, strip_end_token,
    strip_end_tokens,
};
use super::render::{self, History};
use super::segments::{generation_check, verify};
use super::{TurnError, matching};
use crate::chat::{ChatMessage, Role};
use crate::metrics::Stage;
use crate::session::{CompletionId, ConversationDigest, Divergence, HistoryMode, SessionState};
use crate::template::TemplateValue;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The whole conversation in template form, and its render.
struct WholeRender {
    messages: Vec<TemplateValue>,
    rendered: render::Rendered,
}

/// Whether a turn may render only the end of its conversation ([`super::tail`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailRender {
    /// When the template allows it and the conversation before the last sampled turn is
    /// unchanged; every [`super::tail::VERIFY_EVERY`]th such turn is also rendered in full.
    Allowed,
    /// Always in full (`/render` shows the template's whole output; `check-template` compares
    /// its sessions' full renders with tail-only ones). The conversation is still remembered
    /// with what the turn samples, so a later turn may render tail-only.
    Never,
}

impl Planner<'_> {
    /// Builds the prompt; `tail` says whether only the conversation's end may be rendered.
    /// A tail-only render that disagrees with the full one is counted and reported on the
    /// plan ([`Plan::tail_render_disagreed`]); the caller decides what follows.
    pub fn prepare(&self, tail: TailRender) -> Result<Plan, TurnError> {
        let images = super::images::of_request(self.request)?;
        super::images::taken(self.ctx, &images)?;
        let plan = self.prepare_text(tail)?;
        super::images::place(self.ctx, self.state, &images, plan)
    }

    /// [`Planner::prepare`]'s prompt with one placeholder for each image, as rendered.
    fn prepare_text(&self, tail: TailRender) -> Result<Plan, TurnError> {
        let (ctx, request, mode) = (self.ctx, self.request, self.history);
        let matching::Matched {
            completions: matched,
            echoed_calls,
        } = matching::match_completions(self.state, &request.messages, request.tools.as_deref());
        let tail_allowed =
            tail == TailRender::Allowed && ctx.tail_renders() && mode == HistoryMode::Sampled;
        // The digests only serve tail renders (this one, and a later turn's): a session that
        // renders in full for good (`--full-render`, a template proved non-local) skips them.
        let remembers = mode == HistoryMode::Sampled
            && (tail == TailRender::Never || !ctx.tail_renders_ruled_out());
        let digests = match remembers {
            true => super::tail::prefix_digests(request),
            false => Vec::new(),
        };
        let conversation = digests.last().map(|&digest| ConversationDigest {
            messages: request.messages.len(),
            digest,
        });
        let plan = match tail_allowed {
            true => self.tail_plan(&matched, &digests)?,
            false => None,
        };
        let Some((plan, whole)) = plan else {
            return Ok(Plan {
                conversation,
                echoed_calls,
                ..self.full_plan(&matched)?
            });
        };
        let done = self.state.tail_renders.fetch_add(1, Ordering::Relaxed);
        if !done.is_multiple_of(super::tail::VERIFY_EVERY) {
            self.metrics.tail_render("used");
            return Ok(Plan {
                conversation,
                echoed_calls,
                ..plan
            });
        }
        let full = match whole {
            Some(whole) => self.plan_from_render(&matched, whole)?,
            None => self.full_plan(&matched)?,
        };
        let agrees = same_prompt(&full, &plan);
        self.metrics
            .tail_render(if agrees { "verified" } else { "mismatch" });
        Ok(Plan {
            conversation,
            echoed_calls,
            tail_render_disagreed: !agrees,
            ..full
        })
    }

    /// Whether a tail-only render of the request gives the same plan as a full one; `None`
    /// when the conversation does not allow one (nothing sampled before, or history edited).
    pub fn tail_agrees(&self) -> Result<Option<bool>, TurnError> {
        let request = self.request;
        let matched =
            matching::match_completions(self.state, &request.messages, request.tools.as_deref())
                .completions;
        let digests = super::tail::prefix_digests(request);
        let Some((tail, _)) = self.tail_plan(&matched, &digests)? else {
            return Ok(None);
        };
        let sampled_history = Planner {
            history: HistoryMode::Sampled,
            ..*self
        };
        let full = sampled_history.full_plan(&matched)?;
        Ok(Some(same_prompt(&full, &tail)))
    }

    /// The template-value form of `indices` of the request's messages: a placeholder for each
    /// sampled turn (numbered in order), the message itself otherwise.
    fn template_messages(
        &self,
        matched: &[Option<CompletionId>],
        indices: impl Iterator<Item = usize>,
    ) -> Vec<TemplateValue> {
        let mut placeholder = 0;
        indices
            .map(|i| match matched[i] {
                Some(_) => {
                    placeholder += 1;
                    self.ctx.placeholders.message(placeholder - 1)
                }
                None => self.unsampled_message(&self.request.messages[i]),
            })
            .collect()
    }

    /// Splits `rendered` at the placeholders of `sampled`; `None` when the template did not
    /// reproduce each once and in order.
    fn split<'r>(
        &self,
        rendered: &'r render::Rendered,
        sampled: &[CompletionId],
    ) -> Option<Split<'r>> {
        let (ctx, state) = (self.ctx, self.state);
        let pieces = ctx.placeholders.split(&rendered.prompt, sampled.len())?;
        let last = pieces[sampled.len()];
        let history_last = match &rendered.history {
            History::PromptWithout(generation_prompt) => {
                &last[..last.len().saturating_sub(*generation_prompt)]
            }
            History::Separate(text) => ctx.placeholders.split(text, sampled.len())?[sampled.len()],
        };
        let pieces = strip_end_tokens(state, sampled, pieces);
        let history_last = match sampled.last() {
            Some(&completion) => strip_end_token(state, completion, history_last),
            None => history_last,
        };
        let next_check = generation_check(history_last, pieces[sampled.len()]);
        Some(Split { pieces, next_check })
    }

    /// Renders `messages` (the template's values of the request's) with the generation prompt.
    fn render(&self, messages: TemplateValue) -> Result<render::Rendered, TurnError> {
        let _timed = self.metrics.timed(Stage::Render);
        let ctx = self.ctx;
        let rendered = render::render_turn(
            &ctx.template,
            &ctx.generation_prompts,
            &messages,
            self.request,
        )?;
        Ok(rendered)
    }

    /// A plan from a render of the messages from the last sampled turn's exchange on
    /// ([`super::tail`]), when the conversation allows one.
    /// When the kept messages were all of them, the render is handed back too: a turn that
    /// also plans in full (to verify) need not render the same conversation twice.
    fn tail_plan(
        &self,
        matched: &[Option<CompletionId>],
        digests: &[u64],
    ) -> Result<Option<(Plan, Option<WholeRender>)>, TurnError> {
        let whole = std::cell::RefCell::new(None);
        let render = |kept: &[usize]| -> Result<Option<super::tail::RenderedTail>, TurnError> {
            let sampled: Vec<CompletionId> = kept.iter().filter_map(|&i| matched[i]).collect();
            let messages = self.template_messages(matched, kept.iter().copied());
            let rendered = self.render(TemplateValue::from(messages.clone()))?;
            if kept.len() == self.request.messages.len() {
                let rendered = rendered.clone();
                whole.replace(Some(WholeRender { messages, rendered }));
            }
            let Some(Split { pieces, next_check }) = self.split(&rendered, &sampled) else {
                return Ok(None);
            };
            let piece = pieces[sampled.len()].to_string();
            Ok(Some(super::tail::RenderedTail {
                piece,
                next_check,
                rendered: RenderedPrompt {
                    text: rendered.prompt,
                    sampled,
                },
            }))
        };
        let plan = super::tail::plan(self, matched, digests, &render)?;
        Ok(plan.map(|plan| (plan, whole.into_inner())))
    }

    /// The plan from a render of the whole conversation.
    fn full_plan(&self, matched: &[Option<CompletionId>]) -> Result<Plan, TurnError> {
        let messages = self.template_messages(matched, 0..self.request.messages.len());
        let rendered = self.render(TemplateValue::from(messages.clone()))?;
        self.plan_from_render(matched, WholeRender { messages, rendered })
    }

    /// The plan from `whole`, a render of the whole conversation.
    fn plan_from_render(
        &self,
        matched: &[Option<CompletionId>],
        whole: WholeRender,
    ) -> Result<Plan, TurnError> {
        let (ctx, state, request) = (self.ctx, self.state, self.request);
        let WholeRender { messages, rendered } = whole;
        let sampled: Vec<CompletionId> = matched.iter().flatten().copied().collect();
        let unmatched_assistant = request
            .messages
            .iter()
            .zip(matched)
            .any(|(m, c)| m.role == crate::chat::Role::Assistant && c.is_none());
        let Some(split) = self.split(&rendered, &sampled) else {
            return super::template_history::faithful_fallback(self, &messages, matched);
        };
        if self.history == HistoryMode::Template && !sampled.is_empty() {
            return super::template_history::template_mode_plan(self, &messages, matched, split);
        }
        let Split { pieces, next_check } = split;
        let (base, divergence) = find_base(state, &sampled, &pieces);
        let (mut prompt_ids, first_piece, base) = match base {
            Some((node, matched)) => {
                let base = &state.nodes[node];
                let mut ids = Vec::with_capacity(base.len() + 4096);
                base.copy_tokens_into(&mut ids);
                (ids, matched, Base::Extend { node })
            }
            None => {
                let divergence = divergence.or_else(|| {
                    (!state.nodes.is_empty()).then(|| new_node_reason(unmatched_assistant))
                });
                (Vec::new(), 0, Base::New { divergence })
            }
        };
        let base_len = prompt_ids.len();
        let tokenizing = self.metrics.timed(Stage::Tokenize);
        // The base node ends with completion `first_piece` (none for a new node); everything
        // after it is new prompt: the pieces between sampled turns, tokenized, and the
        // sampled ids.
        prompt_ids.extend(ctx.encode_prompt(pieces[first_piece])?);
        for (j, &completion) in sampled.iter().enumerate().skip(first_piece) {
            let record = &state.completions[completion];
            state.nodes[record.node].copy_span_into(record.span, &mut prompt_ids);
            prompt_ids.extend(ctx.encode_prompt(pieces[j + 1])?);
        }
        drop(tokenizing);
        let history = history_entries(&sampled, &pieces);
        Ok(Plan {
            prompt_ids: Arc::new(prompt_ids),
            base,
            base_len,
            history,
            next_check,
            rendered: Some(RenderedPrompt {
                text: rendered.prompt,
                sampled,
            }),
            conversation: None,
            echoed_calls: Vec::new(),
            tail_render_disagreed: false,
            images: Default::default(),
        })
    }

    /// A message the session did not sample, as the template gets it. Tool calls the proxy never
    /// produced are rendered by the template when it knows `tool_calls`; otherwise they are
    /// written into the content in the session's format, so the model still sees them.
    fn unsampled_message(&self, message: &ChatMessage) -> TemplateValue {
        let (ctx, parser, request) = (self.ctx, self.parser, self.request);
        if ctx.harmony
            && let Some(named) = with_function_name(message, &request.messages)
        {
            return named.to_template_value(ctx.template.reads_content_parts());
        }
        if message.tool_calls.is_empty() || ctx.template.renders_tool_calls() {
            return message.to_template_value(ctx.template.reads_content_parts());
        }
        let arguments: Vec<Value> = message
            .tool_calls
            .iter()
            .map(|c| c.arguments_value())
            .collect();
        let calls: Vec<(&str, &Value)> = message
            .tool_calls
            .iter()
            .zip(&arguments)
            .map(|(call, arguments)| (call.name.as_str(), arguments))
            .collect();
        let mut content = message.content.clone().unwrap_or_default();
        if !content.is_empty() {
            content.push('\n');
        }
        content.push_str(&parser.write_calls(&calls));
        let mut written = message.clone();
        written.content = Some(content);
        written.tool_calls = Vec::new();
        written.to_template_value(ctx.template.reads_content_parts())
    }
}

/// Why a conversation that extends no node starts a new one.
fn new_node_reason(unmatched_assistant: bool) -> Divergence {
    match unmatched_assistant {
        true => Divergence {
            reason: "unmatched_assistant_message",
            detail: "an assistant message matches no completion of this session (edited or \
                     written by the client); the template renders it as text"
                .into(),
            from_node: None,
            token_position: None,
        },
        false => Divergence {
            reason: "new_conversation",
            detail: "the request continues no earlier turn of this session: a conversation of \
                     its own, such as an agent's side request for a title or a summary"
                .into(),
            from_node: None,
            token_position: None,
        },
    }
}

/// Whether a tail-only plan sends what the full plan sends and checks the next turn the same
/// way. (Its history keeps the node's checks as recorded, where a full render upgrades the
/// last turn's to an exact one: the text before each turn is hash-checked either way.)
fn same_prompt(full: &Plan, tail: &Plan) -> bool {
    full.prompt_ids == tail.prompt_ids
        && full.base == tail.base
        && full.next_check == tail.next_check
}

/// The node whose completions are exactly `sampled[..m]` for the largest `m`, and whose text
/// between them still renders the same. Otherwise, why the best candidate was rejected.
fn find_base(
    state: &SessionState,
    sampled: &[CompletionId],
    pieces: &[&str],
) -> (Option<(usize, usize)>, Option<Divergence>) {
    let mut divergence = None;
    for m in (1..=sampled.len()).rev() {
        let Some(n) = chain_candidate(state, &sampled[..m]) else {
            continue;
        };
        let node = &state.nodes[n];
        match (0..m).find(|&j| !verify(&node.history[j].before, pieces[j])) {
            None => return (Some((n, m)), None),
            Some(j) if divergence.is_none() => {
                let position = match j {
                    0 => Some(0),
                    _ => {
                        let record = &state.completions[node.history[j - 1].completion];
                        (record.node == n).then_some(record.span.end as usize)
                    }
                };
                divergence = Some(Divergence {
                    reason: "history_edited",
                    detail: format!(
                        "the conversation before sampled turn {} no longer renders as it did \
                         (an edited or inserted message, or changed tools or template kwargs)",
                        j + 1
                    ),
                    from_node: Some(n),
                    token_position: position,
                });
            }
            Some(_) => {}
        }
    }
    (None, divergence)
}

/// A tool result without a `name`, given the name of the call it answers: Harmony writes a
/// result as a message from `functions.NAME`, and a sampled call stands in the render as a
/// placeholder whose calls the template cannot see.
fn with_function_name(message: &ChatMessage, messages: &[Arc<ChatMessage>]) -> Option<ChatMessage> {
    if message.role != Role::Tool || message.extra.contains_key("name") {
        return None;
    }
    let id = message.extra.get("tool_call_id")?.as_str()?;
    let call = messages
        .iter()
        .flat_map(|m| &m.tool_calls)
        .find(|call| call.id == id)?;
    let mut named = message.clone();
    named
        .extra
        .insert("name".into(), Value::String(call.name.clone()));
    Some(named)
}
