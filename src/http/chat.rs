//! `POST /{uuid}/v1/chat/completions` and its `/render` twin.

use super::body::read_json;
use super::response::{chat_logprobs, chat_message, envelope, sampled_choice, shape_choice};
use super::{ApiError, AppState};
use crate::backend::GenerateRequest;
use crate::chat::{ChatCompletionBody, ChatRequest};
use crate::session::Session;
use crate::tools::parser_for;
use crate::turn::{self, Base};
use actix_web::{HttpResponse, web};
use serde_json::json;
use std::sync::Arc;

async fn parse(
    state: &AppState,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<(Arc<Session>, ChatRequest), ApiError> {
    let session = state.session(&path.into_inner())?;
    let body: ChatCompletionBody = read_json(payload, state.max_body_bytes).await?;
    let request = ChatRequest::from_body(body, state.default_max_tokens)?;
    Ok((session, request))
}

/// Shows the exact prompt a real call would send now; changes nothing.
pub async fn render(
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (session, request) = parse(&state, path, payload).await?;
    let guard = session.state.lock().await;
    let plan = turn::prepare(&state.turn, &guard, &request, session.options.history)?;
    drop(guard);
    let extends_node = match &plan.base {
        Base::Extend { node } => Some(*node),
        Base::New { .. } => None,
    };
    Ok(HttpResponse::Ok().json(json!({
        "prompt_text": state.turn.tokenizer.decode(&plan.prompt_ids),
        "num_tokens": plan.prompt_ids.len(),
        "token_ids": plan.prompt_ids,
        "extends_node": extends_node,
    })))
}

/// One chat turn: prompt → backend → node → reply.
pub async fn completions(
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (session, request) = parse(&state, path, payload).await?;
    let parser = parser_for(&session.options.tool_parser).expect("validated at session creation");
    if request.stream {
        return super::stream::respond(state, session, request, parser).await;
    }
    // Held for the whole turn: requests on one session are serialised.
    let mut guard = session.state.lock().await;
    let mut plan = turn::prepare(&state.turn, &guard, &request, session.options.history)?;
    let generate = GenerateRequest {
        prompt: std::mem::take(&mut plan.prompt_ids),
        params: request.params.clone(),
        n: request.n,
    };
    let sampled = super::sample(&state, &session, &generate).await?;
    plan.prompt_ids = generate.prompt;
    let generations = sampled.generations;

    let tokenizer = &state.turn.tokenizer;
    let replies: Vec<_> = generations
        .iter()
        .map(|g| {
            shape_choice(
                tokenizer,
                parser.as_ref(),
                &request,
                g,
                super::reasoning_mode(&state, &session, &plan),
            )
        })
        .collect();
    let choices: Vec<_> = replies
        .iter()
        .zip(&generations)
        .enumerate()
        .map(|(index, (reply, generation))| {
            let mut choice = json!({
                "index": index,
                "message": chat_message(reply),
                "finish_reason": reply.finish_reason,
                "logprobs": request.logprobs.then(|| chat_logprobs(tokenizer, generation)),
                "token_ids": generation.token_ids,
            });
            if let Some(stop) = &generation.stop {
                choice["stop_reason"] = json!(stop);
            }
            choice
        })
        .collect();
    let completion_tokens: usize = generations.iter().map(|g| g.token_ids.len()).sum();
    let mut body = envelope(
        "chat.completion",
        "chatcmpl",
        &state.model_name,
        choices,
        plan.prompt_ids.len(),
        completion_tokens,
    );
    body["prompt_token_ids"] = json!(plan.prompt_ids);

    let sampled = replies
        .iter()
        .zip(generations)
        .zip(&sampled.backends)
        .map(|((reply, generation), backend)| sampled_choice(reply, generation, backend))
        .collect();
    turn::commit(&mut guard, &plan, sampled, session.options.track_tree);
    session.set_num_nodes(guard.nodes.len());
    Ok(HttpResponse::Ok().json(body))
}
