//! `POST /{uuid}/v1/completions`: a text completion tracked on the session's nodes.
//!
//! The prompt extends the node whose ids (or text) it starts with, like ManagedServer's
//! `completion`: the node's ids are reused and only the rest of the prompt is tokenized.

use super::body::read_json;
use super::response::{ChoiceReply, envelope, sampled_choice, visible_text};
use super::{ApiError, AppState};
use crate::backend::{GenerateRequest, SamplingParams};
use crate::chat::request::{MAX_N, StopField};
use crate::session::SessionState;
use crate::turn::segments::generation_check;
use crate::turn::{self, Base, Plan};
use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

/// `prompt` as text or as token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

#[derive(Debug, Deserialize)]
pub struct CompletionBody {
    prompt: Prompt,
    max_tokens: Option<u32>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    seed: Option<i64>,
    n: Option<u32>,
    stop: Option<StopField>,
    /// Legacy OpenAI: number of alternatives per position.
    logprobs: Option<u32>,
    stream: Option<bool>,
    /// Add `prompt_token_ids` to each choice (as in vLLM).
    return_token_ids: Option<bool>,
}

pub async fn completions(
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let session = state.session(&path.into_inner())?;
    let body: CompletionBody = read_json(payload, state.max_body_bytes).await?;
    if body.stream == Some(true) {
        return Err(ApiError::bad_request(
            "stream=true is not supported on /v1/completions; use the chat endpoint to stream",
        ));
    }
    let n = body.n.unwrap_or(1);
    let return_token_ids = body.return_token_ids.unwrap_or(false);
    if n == 0 || n > MAX_N {
        return Err(ApiError::bad_request(format!(
            "'n' must be between 1 and {MAX_N}"
        )));
    }
    let tokenizer = &state.turn.tokenizer;
    let mut guard = session.state.lock().await;
    let mut plan = plan_for_prompt(&state, &guard, &body.prompt)?;
    let generate = GenerateRequest {
        prompt: std::mem::take(&mut plan.prompt_ids),
        params: SamplingParams {
            max_tokens: body.max_tokens.or(state.default_max_tokens),
            temperature: body.temperature,
            top_p: body.top_p,
            top_k: body.top_k,
            min_p: body.min_p,
            seed: body.seed,
            stop: StopField::list(body.stop),
            top_logprobs: body.logprobs,
        },
        n,
    };
    let sampled_by = super::sample(&state, &session, &generate).await?;
    plan.prompt_ids = generate.prompt;

    let mut choices = Vec::with_capacity(n as usize);
    let mut sampled = Vec::with_capacity(n as usize);
    let backends = sampled_by.backends;
    for (index, (generation, backend)) in sampled_by
        .generations
        .into_iter()
        .zip(&backends)
        .enumerate()
    {
        let (text, end_token_text) = visible_text(tokenizer, &generation, &[]);
        let logprobs = body.logprobs.map(|_| {
            json!({
                "tokens": generation.token_ids.iter().map(|&id| tokenizer.decode(&[id])).collect::<Vec<_>>(),
                "token_logprobs": generation.logprobs,
                "top_logprobs": generation.top_logprobs.as_ref().map(|positions| positions.iter().map(|alts| {
                    alts.iter().map(|&(id, lp)| (tokenizer.decode(&[id]), json!(lp))).collect::<serde_json::Map<_, _>>()
                }).collect::<Vec<_>>()),
            })
        });
        let mut choice = json!({
            "index": index,
            "text": text,
            "finish_reason": generation.finish_reason.as_str(),
            "logprobs": logprobs,
            "token_ids": generation.token_ids,
        });
        if return_token_ids {
            choice["prompt_token_ids"] = json!(plan.prompt_ids);
        }
        choices.push(choice);
        let reply = ChoiceReply {
            content: Some(text.clone()),
            reasoning: None,
            tool_calls: Vec::new(),
            finish_reason: generation.finish_reason.as_str(),
            text,
            end_token_text,
        };
        sampled.push(sampled_choice(&reply, generation, backend));
    }
    let completion_tokens: usize = sampled.iter().map(|s| s.generation.token_ids.len()).sum();
    let prompt_tokens = plan.prompt_ids.len();
    turn::commit(&mut guard, &plan, sampled, session.options.track_tree);
    session.set_num_nodes(guard.nodes.len());
    Ok(HttpResponse::Ok().json(envelope(
        "text_completion",
        "cmpl",
        &state.model_name,
        choices,
        prompt_tokens,
        completion_tokens,
    )))
}

/// Extends the longest node whose ids (for an id prompt) or text (for a text prompt) the
/// prompt starts with; otherwise the prompt starts a new node.
fn plan_for_prompt(
    state: &AppState,
    session: &SessionState,
    prompt: &Prompt,
) -> Result<Plan, ApiError> {
    let tokenizer = &state.turn.tokenizer;
    let mut best: Option<(usize, Vec<u32>)> = None;
    for (index, node) in session.nodes.iter().enumerate() {
        if best
            .as_ref()
            .is_some_and(|(b, _)| session.nodes[*b].len() >= node.len())
        {
            continue;
        }
        let node_ids = node.tokens();
        let rest = match prompt {
            Prompt::Ids(ids) => ids.strip_prefix(node_ids.as_slice()).map(<[u32]>::to_vec),
            Prompt::Text(text) => match text.strip_prefix(tokenizer.decode(&node_ids).as_str()) {
                Some(rest) => Some(tokenizer.encode(rest)?),
                None => None,
            },
        };
        if let Some(rest) = rest {
            best = Some((index, rest));
        }
    }
    let (base, base_len, prompt_ids, history) = match best {
        Some((node, rest)) => {
            let base_node = &session.nodes[node];
            let mut ids = base_node.tokens();
            ids.extend(rest);
            (
                Base::Extend { node },
                base_node.len(),
                ids,
                base_node.history.clone(),
            )
        }
        None => {
            let ids = match prompt {
                Prompt::Ids(ids) => ids.clone(),
                Prompt::Text(text) => tokenizer.encode(text)?,
            };
            (Base::New { divergence: None }, 0, ids, Vec::new())
        }
    };
    if prompt_ids.is_empty() {
        return Err(ApiError::bad_request("'prompt' must not be empty"));
    }
    Ok(Plan {
        prompt_ids,
        base,
        base_len,
        history,
        // A raw-text prompt has no chat structure to check on a later chat turn.
        next_check: generation_check("", ""),
        rendered: None,
    })
}
