//! A shape run as a session: each assistant message is sampled as the template renders it
//! (its tokens up to the end-of-turn token) by a scripted backend behind the real turn
//! pipeline, which shapes it into the reply a client gets and records it in the node; the
//! client sends it back on the next turn, tool results naming the ids the proxy issued. Each
//! next turn shows whether the session extends its node (`history: "sampled"`) and whether
//! the template's own render extends the previous prompt plus the sampled reply
//! (`history: "template"`).

use super::rewrite::{self, Rewrite, Sampled};
use super::scripted::Script;
use super::shapes::Shape;
use crate::chat::{CallRules, ChatMessage, ChatRequest, ResponseFormat, ToolChoice};
use crate::fetch::Fetcher;
use crate::generation::{FinishReason, Generation, SamplingParams};
use crate::session::{Api, HistoryMode, SessionOptions, SessionStore};
use crate::template::{RenderRequest, TemplateValue, json_value};
use crate::tools::detect::call_message_forms;
use crate::tools::{DeclaredTools, ToolFormat, ToolParser};
use crate::turn::reply::Reply;
use crate::turn::{Base, Pipeline, Planner, TailRender, TurnContext};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;

/// What running a shape showed.
#[derive(Debug, Default)]
pub struct ShapeRun {
    /// Why the shape could not be run (the template raised, say).
    pub error: Option<String>,
    /// One per sampled turn: how the next turn's prompt relates to it.
    pub transitions: Vec<Transition>,
    /// Calls the template wrote that the session's tool format did not read back.
    pub calls_unread: usize,
    /// Every prompt rendered, for a comparison with a reference renderer.
    pub renders: Vec<Rendered>,
}

/// A prompt the template rendered.
#[derive(Debug, Clone, Serialize)]
pub struct Rendered {
    /// The messages as the template got them.
    pub messages: Value,
    /// The tools declared.
    pub tools: Option<Value>,
    /// `chat_template_kwargs`.
    pub kwargs: Value,
    /// Always true: prompts end with the generation prompt.
    pub add_generation_prompt: bool,
    /// Our engine's output, or the error it raised.
    #[serde(skip)]
    pub text: Result<String, String>,
}

/// How the turn after sampled turn `turn` relates to it.
#[derive(Debug, Clone, Serialize)]
pub struct Transition {
    /// The sampled turn (1-based).
    pub turn: usize,
    /// With `history: "sampled"`, the next prompt extends the node.
    pub keeps_node: bool,
    /// Why a new node started, when it did.
    pub divergence: Option<String>,
    /// Where the template's own render of the next prompt departs from the previous prompt
    /// plus the sampled reply (none: append-only).
    pub rewrite: Option<Rewrite>,
    /// Whether rendering only the conversation's end gave the same prompt as the whole
    /// conversation (`None`: the turn did not allow a tail render).
    pub tail_render: Option<bool>,
}

/// Runs `shape` on a fresh session whose tool format is `parser`.
pub fn run(ctx: &TurnContext, format: &ToolFormat, shape: &Shape) -> ShapeRun {
    let mut run = ShapeRun::default();
    // The shape's turns are not the server's: no log line, span or OTLP export of them.
    let silenced = tracing::subscriber::NoSubscriber::default();
    let ran =
        tracing::subscriber::with_default(silenced, || run_turns(ctx, format, shape, &mut run));
    // With the silent subscriber gone, every log call site is asked again: otherwise each
    // would go on asking at every call whether it is enabled.
    tracing::callsite::rebuild_interest_cache();
    if let Err(error) = ran {
        run.error = Some(error);
    }
    run
}

fn run_turns(
    ctx: &TurnContext,
    format: &ToolFormat,
    shape: &Shape,
    run: &mut ShapeRun,
) -> Result<(), String> {
    let parser = format.parser().as_ref();
    let script = Script::default();
    let pipeline = Pipeline {
        context: ctx.clone(),
        backends: Arc::new(script.pool()),
        context_length: None,
        max_session_tokens: None,
        log: None,
        under_way: Default::default(),
        gate: Default::default(),
        metrics: Default::default(),
        model_name: "check-template".into(),
        blobs: Default::default(),
        fetcher: Arc::new(Fetcher::off()),
    };
    let session = SessionStore::default()
        .create(SessionOptions {
            tool_parser: format.clone(),
            history: HistoryMode::Sampled,
            reasoning: true,
            ..SessionOptions::default()
        })
        .map_err(|e| e.to_string())?;
    let mut client: Vec<Value> = Vec::new();
    let mut issued: HashMap<String, String> = HashMap::new();
    let mut sampled_turns: Vec<Sampled> = Vec::new();
    // A follow-up after the last answer, so every sampled turn has a next prompt.
    let follow_up = json!({"role": "user", "content": "Thanks."});
    for message in shape.messages.iter().chain([&follow_up]) {
        let is_reply = message["role"] == "assistant";
        if !is_reply {
            client.push(with_issued_id(message, &issued));
            if !std::ptr::eq(message, &follow_up) {
                continue;
            }
        }
        let request = chat_request(&client, shape)?;
        let rendered = render(ctx, &request, normalised(ctx, &client, shape)?, shape, true);
        run.renders.push(rendered.clone());
        let prompt = rendered.text?;
        {
            let state = session.state.try_lock().map_err(|e| e.to_string())?;
            let planner = Planner {
                ctx,
                state: &state,
                request: &request,
                history: HistoryMode::Sampled,
                parser,
                metrics: &pipeline.metrics,
            };
            let plan = planner
                .prepare(TailRender::Never)
                .map_err(|e| e.to_string())?;
            if let Some((before, earlier)) = sampled_turns.split_last() {
                let tail_render = planner.tail_agrees().map_err(|e| e.to_string())?;
                let locate = |at: usize| locate_message(ctx, &client, shape, before, at);
                run.transitions.push(Transition {
                    turn: before.turn,
                    keeps_node: matches!(plan.base, Base::Extend { .. }),
                    divergence: match &plan.base {
                        Base::Extend { .. } => None,
                        Base::New { divergence } => Some(
                            divergence
                                .as_ref()
                                .map_or("new_node".to_string(), |d| d.reason.to_string()),
                        ),
                    },
                    rewrite: rewrite::find(ctx, before, earlier, &prompt, &locate),
                    tail_render,
                });
            }
        }
        if !is_reply {
            break;
        }
        let written = Written {
            client: &client,
            message,
            prompt: &prompt,
        };
        let (reply_text, ids) = written_reply(ctx, parser, &request, shape, &written)?;
        script.push(Generation::new(
            ids.clone(),
            vec![-0.1; ids.len()],
            FinishReason::Stop,
        ));
        let output = futures::executor::block_on(pipeline.run(&session, &request))
            .map_err(|e| e.to_string())?;
        let reply = output.choices[0].reply.clone();
        let written_ids: Vec<&str> = message["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|call| call["id"].as_str())
            .collect();
        run.calls_unread += written_ids.len().saturating_sub(reply.tool_calls.len());
        for (written, returned) in written_ids.iter().zip(&reply.tool_calls) {
            issued.insert(written.to_string(), returned.id.clone());
        }
        client.push(returned_message(&reply));
        sampled_turns.push(Sampled {
            turn: sampled_turns.len() + 1,
            message: client.len() - 1,
            history_len: history_len(ctx, &request, &client[..client.len() - 1], shape)?,
            prompt,
            first_call: crate::tools::calls_in_any_format(parser, &reply_text, true)
                .first()
                .map(|(call, _)| call.span.start),
            reasoning: reply.reasoning.clone(),
            reply: reply_text,
        });
    }
    Ok(())
}

/// The turn a chat client sending `messages` in `shape` asks for.
fn chat_request(messages: &[Value], shape: &Shape) -> Result<ChatRequest, String> {
    let messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| ChatMessage::parse(i, m.clone()).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let tools = match &shape.tools {
        Some(tools) => {
            let raw = serde_json::value::to_raw_value(tools).map_err(|e| e.to_string())?;
            DeclaredTools::from_raw(&raw).map_err(|e| e.to_string())?
        }
        None => None,
    };
    let request = ChatRequest {
        api: Api::ChatCompletions,
        messages,
        tools,
        tools_left_out: Vec::new(),
        tool_choice: ToolChoice::Auto,
        calls: CallRules::default(),
        response_format: ResponseFormat::Text,
        template_kwargs: shape.kwargs.as_object().cloned().unwrap_or_default(),
        add_generation_prompt: true,
        params: SamplingParams::default(),
        n: 1,
        key: None,
    };
    request.check().map_err(|e| e.to_string())?;
    Ok(request)
}

/// `messages` as the template gets them, normalised as every turn normalises them.
fn normalised(
    ctx: &TurnContext,
    messages: &[Value],
    shape: &Shape,
) -> Result<Vec<TemplateValue>, String> {
    let reads_parts = ctx.template.reads_content_parts();
    Ok(chat_request(messages, shape)?
        .messages
        .iter()
        .map(|m| m.to_template_value(reads_parts))
        .collect())
}

/// The template's own render of `messages` (or the error it raised).
fn render(
    ctx: &TurnContext,
    request: &ChatRequest,
    messages: Vec<TemplateValue>,
    shape: &Shape,
    add_generation_prompt: bool,
) -> Rendered {
    let messages = TemplateValue::from(messages);
    let text = ctx
        .template
        .render(RenderRequest {
            messages: &messages,
            tools: request.tools.as_ref().map(|tools| tools.json()),
            add_generation_prompt,
            kwargs: Some(&request.template_kwargs),
        })
        .map_err(|e| e.to_string());
    Rendered {
        messages: serde_json::to_value(&messages).unwrap_or_default(),
        tools: shape.tools.clone(),
        kwargs: shape.kwargs.clone(),
        add_generation_prompt,
        text,
    }
}

/// An assistant message of a shape, the conversation the client sent before it, and the
/// prompt that conversation rendered to.
struct Written<'a> {
    client: &'a [Value],
    message: &'a Value,
    prompt: &'a str,
}

/// The reply the model samples for `message` after `prompt`: what the template writes for it.
/// A message with calls is tried in each form templates write calls for
/// ([`call_message_forms`]) until the session's format reads every call back.
fn written_reply(
    ctx: &TurnContext,
    parser: &dyn ToolParser,
    request: &ChatRequest,
    shape: &Shape,
    written: &Written,
) -> Result<(String, Vec<u32>), String> {
    let (client, message, prompt) = (written.client, written.message, written.prompt);
    let calls = message["tool_calls"].as_array().map_or(0, Vec::len);
    let forms = match calls {
        0 => vec![message.clone()],
        _ => call_message_forms(message),
    };
    let mut first = None;
    for (index, form) in forms.iter().enumerate() {
        let mut values = normalised(ctx, client, shape)?;
        // The first form as a turn normalises it; the others as they are.
        values.push(match index {
            0 => normalised(ctx, std::slice::from_ref(form), shape)?.remove(0),
            _ => json_value(form),
        });
        let Ok(full) = render(ctx, request, values, shape, false).text else {
            continue;
        };
        let reply = sampled_reply(ctx, prompt, &full)?;
        if crate::tools::calls_in_any_format(parser, &reply.0, true).len() >= calls {
            return Ok(reply);
        }
        first.get_or_insert(reply);
    }
    first.ok_or_else(|| "the template renders no form of the assistant message".to_string())
}

/// Where the history (the render without the generation prompt) ends in the prompt.
fn history_len(
    ctx: &TurnContext,
    request: &ChatRequest,
    messages: &[Value],
    shape: &Shape,
) -> Result<usize, String> {
    let history = render(
        ctx,
        request,
        normalised(ctx, messages, shape)?,
        shape,
        false,
    )
    .text?;
    let prompt = render(ctx, request, normalised(ctx, messages, shape)?, shape, true).text?;
    Ok(match prompt.starts_with(&history) {
        true => history.len(),
        false => crate::template::common_prefix_len(&prompt, &history),
    })
}

/// The message of the conversation before `before`'s reply in which byte `at` of the
/// previous prompt lies: the last message whose history render ends at or before it.
fn locate_message(
    ctx: &TurnContext,
    messages: &[Value],
    shape: &Shape,
    before: &Sampled,
    at: usize,
) -> Option<usize> {
    let request = chat_request(&messages[..1], shape).ok()?;
    (1..before.message).rev().find_map(|count| {
        let values = normalised(ctx, &messages[..count], shape).ok()?;
        let text = render(ctx, &request, values, shape, false).text.ok()?;
        (text.len() <= at && before.prompt.starts_with(&text)).then_some(count)
    })
}

/// What the template writes for the assistant message after the prompt, up to and with its
/// last special token (the end of the turn), and its ids. A Harmony final answer ends in
/// `<|return|>`, as the model samples it, where a template writes `<|end|>`.
fn sampled_reply(
    ctx: &TurnContext,
    prompt: &str,
    full: &str,
) -> Result<(String, Vec<u32>), String> {
    let written = &full[crate::template::common_prefix_len(prompt, full)..];
    let written = match ctx.harmony {
        true => crate::tokenizer::harmony::as_sampled(written),
        false => written.into(),
    };
    let ids = ctx.encode_prompt(&written).map_err(|e| e.to_string())?;
    let end = ids
        .iter()
        .rposition(|&id| ctx.tokenizer.is_special(id))
        .map_or(ids.len(), |at| at + 1);
    let ids = ids[..end].to_vec();
    Ok((ctx.tokenizer.decode(&ids), ids))
}

/// The assistant message a client sends back for `reply`.
fn returned_message(reply: &Reply) -> Value {
    let mut message = json!({"role": "assistant", "content": reply.content});
    if let Some(reasoning) = &reply.reasoning {
        message["reasoning_content"] = json!(reasoning);
    }
    if !reply.tool_calls.is_empty() {
        let calls: Vec<Value> = reply
            .tool_calls
            .iter()
            .map(|call| {
                json!({"id": call.id, "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments}})
            })
            .collect();
        message["tool_calls"] = json!(calls);
    }
    message
}

/// A tool result naming the id the proxy issued for the call it answers.
fn with_issued_id(message: &Value, issued: &HashMap<String, String>) -> Value {
    let mut message = message.clone();
    if let Some(id) = message["tool_call_id"]
        .as_str()
        .and_then(|id| issued.get(id))
    {
        message["tool_call_id"] = json!(id);
    }
    message
}
