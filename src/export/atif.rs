//! A node as an agent trajectory in Harbor's ATIF (Agent Trajectory Interchange Format,
//! written as `ATIF-v1.6`, the newest version older Harbor releases read too), one document
//! per node, so agent-evaluation tooling can read RL rollouts.
//!
//! Each sampled turn is an `agent` step carrying its exact ids in `metrics`
//! (`prompt_token_ids`: the whole prompt, `completion_token_ids`, `logprobs`), its visible
//! text, reasoning (when the session returns it) and the tool calls it made, under the ids the
//! client got. A node keeps ids, not messages: what the environment added between two turns is
//! read back from those prompt tokens' message headers ([`super::messages`]) — each system or
//! user message a step, and the tool results the observation of the step that called the
//! tools, each under the call it answers. Without headers (a plain-text prompt) the text
//! between two turns is one `user` step or observation. The reward travels in
//! `final_metrics.extra`.

use super::SessionExport;
use super::messages;
use crate::session::completion::tool_call_hash;
use crate::session::{CompletionRecord, Node};
use crate::turn::TurnContext;
use crate::turn::reply::shown_markers;
use serde_json::{Map, Value, json};

/// The schema version written.
pub const SCHEMA_VERSION: &str = "ATIF-v1.6";

/// What the documents are written with.
#[derive(Debug, Clone, Copy)]
pub struct AtifContext<'a> {
    /// The model's tokenizer (decodes ids into text) and what its replies look like.
    pub turn: &'a TurnContext,
    /// The served model's name.
    pub model_name: &'a str,
}

/// Appends one line per node of `export`: its ATIF document.
pub fn write_session(
    out: &mut Vec<u8>,
    export: &SessionExport,
    ctx: AtifContext,
) -> serde_json::Result<()> {
    for (index, node) in export.nodes.iter().enumerate() {
        serde_json::to_writer(&mut *out, &document(export, index, node, ctx))?;
        out.push(b'\n');
    }
    Ok(())
}

/// The ATIF document of node `index`.
fn document(export: &SessionExport, index: usize, node: &Node, ctx: AtifContext) -> Value {
    let session = export.session;
    let tokens = node.tokens();
    let sampled_logprobs: Vec<(usize, &[f32])> = node
        .runs()
        .filter_map(|(range, logprobs)| Some((range.start, logprobs?)))
        .collect();
    let parser = session.options.tool_parser.parser();
    let messages = messages::segment(node, &tokens, &ctx.turn.tokenizer);
    // Without message headers (a plain-text prompt) the input between turns stays one text.
    let headed = messages.iter().any(|m| m.role != "text");
    let mut steps: Vec<Value> = Vec::new();
    let mut calling_step: Option<usize> = None;
    let mut input_start = 0;
    let (mut total_prompt, mut total_completion, mut total_cached) = (0u64, 0u64, 0u64);
    for (turn_index, turn) in node.turns.iter().enumerate() {
        let start = turn.completion_start;
        let end = start + turn.completion_tokens;
        let window = input_start.min(start)..start;
        let inputs: Vec<(&str, String)> = match headed {
            // The messages the environment added (the one the sample continues is the turn's).
            true => messages
                .iter()
                .filter(|m| window.contains(&m.start) && m.end <= start)
                .map(|m| (m.role, messages::content(m, &tokens, &ctx.turn.tokenizer)))
                .collect(),
            false => vec![("text", ctx.turn.tokenizer.decode(&tokens[window]))],
        };
        add_inputs(&mut steps, &mut calling_step, inputs);
        let completion = &tokens[start..end];
        let logprobs = sampled_logprobs
            .iter()
            .find(|(at, _)| *at == start)
            .map_or(&[][..], |(_, lp)| *lp);
        let syntax = ctx
            .turn
            .reasoning_syntax(session.options.reasoning, &tokens[..start]);
        let shown = shown_markers(&ctx.turn.tokenizer, parser.as_ref(), syntax);
        let text = ctx.turn.tokenizer.decode_visible(completion, &shown);
        let (reasoning, answer) = match syntax {
            Some(syntax) => crate::reasoning::split(&text, syntax),
            None => (None, text),
        };
        let issued = node
            .history
            .get(turn_index)
            .and_then(|entry| export.completions.get(entry.completion))
            .map_or(&[][..], |record: &CompletionRecord| &record.tool_calls[..]);
        let (message, tool_calls) = calls_made(parser.as_ref(), &answer, issued);
        let mut metrics = Map::new();
        metrics.insert("prompt_tokens".into(), json!(start));
        metrics.insert("completion_tokens".into(), json!(turn.completion_tokens));
        if let Some(cached) = turn.cached_tokens {
            metrics.insert("cached_tokens".into(), json!(cached));
            total_cached += u64::from(cached);
        }
        metrics.insert("prompt_token_ids".into(), json!(&tokens[..start]));
        metrics.insert("completion_token_ids".into(), json!(completion));
        metrics.insert("logprobs".into(), json!(logprobs));
        metrics.insert(
            "extra".into(),
            json!({"finish_reason": turn.finish_reason, "backend": turn.backend,
                "weight_version": turn.weight_version, "api": turn.api}),
        );
        total_prompt += start as u64;
        total_completion += turn.completion_tokens as u64;
        let mut step = json!({"step_id": steps.len() + 1, "source": "agent",
            "model_name": ctx.model_name, "message": message, "metrics": metrics});
        if let Some(reasoning) = reasoning {
            step["reasoning_content"] = json!(reasoning);
        }
        if !tool_calls.is_empty() {
            step["tool_calls"] = Value::from(tool_calls);
            calling_step = Some(steps.len());
        }
        steps.push(step);
        input_start = end;
    }
    let reward = export.reward.as_ref();
    let mut extra = json!({"node_index": index, "divergence": node.divergence, "parent": node.parent,
        "created_at": session.created_at});
    if !node.images().is_empty() {
        // Each image's run of placeholders, as positions of the node's ids (the steps'
        // `prompt_token_ids`), with the hash its bytes are fetched by.
        extra["images"] = json!(node.images());
    }
    json!({
        "schema_version": SCHEMA_VERSION,
        "session_id": session.id,
        "agent": {"name": "rollout-proxy", "version": env!("CARGO_PKG_VERSION"), "model_name": ctx.model_name},
        "notes": "Exported by rollout-proxy from one training node. System and user steps and tool \
                  observations are the messages the environment added between two turns, read \
                  back from the node's ids (template markup left out).",
        "steps": steps,
        "final_metrics": {
            "total_prompt_tokens": total_prompt,
            "total_completion_tokens": total_completion,
            "total_cached_tokens": total_cached,
            "total_steps": steps.len(),
            "extra": {"reward": reward.map(|r| r.reward), "reward_metadata": reward.map(|r| &r.metadata)},
        },
        "extra": extra,
    })
}

/// Adds what the environment said before a turn: tool results as the observation of the step
/// that called the tools (each result under the call it answers, in order), anything else as a
/// step of its own.
fn add_inputs(
    steps: &mut Vec<Value>,
    calling_step: &mut Option<usize>,
    inputs: Vec<(&str, String)>,
) {
    let mut results = Vec::new();
    for (role, text) in inputs.into_iter().filter(|(_, text)| !text.is_empty()) {
        match (role, *calling_step) {
            ("tool", Some(step)) => {
                for content in messages::tool_results(&text) {
                    let call = &steps[step]["tool_calls"][results.len()]["tool_call_id"];
                    let mut result = json!({"content": content});
                    if call.is_string() {
                        result["source_call_id"] = call.clone();
                    }
                    results.push(result);
                }
            }
            // Unheaded text after a step that called tools is what the tools returned.
            ("text", Some(_)) if results.is_empty() => results.push(json!({"content": text})),
            _ => {
                let source = match role {
                    "system" => "system",
                    "assistant" => "agent",
                    _ => "user",
                };
                steps.push(json!({"step_id": steps.len() + 1, "source": source, "message": text}));
            }
        }
    }
    if let Some(step) = calling_step.take()
        && !results.is_empty()
    {
        steps[step]["observation"] = json!({"results": results});
    }
}

/// The calls the client was given for this text (matched to their issued ids by name and
/// arguments), as ATIF tool calls, and the text without their markup.
fn calls_made(
    parser: &dyn crate::tools::ToolParser,
    text: &str,
    issued: &[crate::session::IssuedToolCall],
) -> (String, Vec<Value>) {
    let mut unused: Vec<_> = issued.iter().collect();
    let mut message = String::with_capacity(text.len());
    let mut cursor = 0;
    let mut calls = Vec::new();
    for found in parser.find_calls(text, true) {
        let arguments: Value = serde_json::from_str(&found.arguments)
            .unwrap_or_else(|_| Value::String(found.arguments.clone()));
        let hash = tool_call_hash(&found.name, &arguments);
        let Some(at) = unused.iter().position(|call| call.call_hash == hash) else {
            continue;
        };
        let id = unused.remove(at).id.clone();
        let arguments = match arguments {
            Value::Object(map) => Value::Object(map),
            other => json!({"value": other}),
        };
        message.push_str(&text[cursor..found.span.start]);
        cursor = found.span.end;
        calls
            .push(json!({"tool_call_id": id, "function_name": found.name, "arguments": arguments}));
    }
    message.push_str(&text[cursor..]);
    (message.trim().to_string(), calls)
}
