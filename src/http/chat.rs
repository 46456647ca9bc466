//! `POST /{uuid}/v1/chat/completions` and its `/render` twin.

use super::body::read_json;
use super::response::{
    CallIds, ChatChoice, chat_logprobs, chat_message, envelope, json_response, sampled_choice,
    shape_choice, with_prompt_ids,
};
use super::{ApiError, AppState};
use crate::backend::GenerateRequest;
use crate::chat::ChatMessage;
use crate::chat::{ChatCompletionBody, ChatRequest};
use crate::session::Session;
use crate::session::SessionState;
use crate::tools::ToolParser;
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
    let parser = parser_for(&session.options.tool_parser).expect("validated at session creation");
    let plan = super::plan_turn(&state, &session, &guard, &request, parser.as_ref())?;
    let prompt_text = plan.prompt_text(&state.turn, &guard);
    drop(guard);
    let extends_node = match &plan.base {
        Base::Extend { node } => Some(*node),
        Base::New { .. } => None,
    };
    Ok(HttpResponse::Ok().json(json!({
        "prompt_text": prompt_text,
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
    let attempt = Attempt::run(&state, &session, &guard, &request, parser.as_ref()).await?;
    if !(request.nudge_tool_calls && attempt.deserves_nudge(&request, parser.as_ref())) {
        let body = attempt.body(&state, &request);
        attempt.commit(&mut guard, &session, None);
        return Ok(json_response(body));
    }
    // The model described a call it did not make: record this attempt, then ask once more on
    // the same node; keep whichever attempt has a call, and say so in the node.
    let first_body = attempt.body(&state, &request);
    let retry_request = nudge_request(&request, &attempt.replies[0]);
    let nodes = attempt.commit(&mut guard, &session, Some("kept"));
    let retry = Attempt::run(&state, &session, &guard, &retry_request, parser.as_ref()).await;
    match retry {
        Ok(retry) if !retry.replies[0].tool_calls.is_empty() => {
            set_nudge(&mut guard, nodes[0], "discarded");
            let body = retry.body(&state, &retry_request);
            retry.commit(&mut guard, &session, Some("kept"));
            Ok(json_response(body))
        }
        other => {
            if let Err(error) = other {
                tracing::warn!(%error, "nudge retry failed; keeping the first attempt");
            }
            set_nudge(&mut guard, nodes[0], "kept_retry_discarded");
            Ok(json_response(first_body))
        }
    }
}

/// One sampled attempt at a turn, not yet recorded.
struct Attempt {
    plan: turn::Plan,
    generations: Vec<crate::backend::Generation>,
    replies: Vec<super::response::ChoiceReply>,
    backends: Vec<Arc<str>>,
}

impl Attempt {
    async fn run(
        state: &AppState,
        session: &Session,
        session_state: &SessionState,
        request: &ChatRequest,
        parser: &dyn ToolParser,
    ) -> Result<Self, ApiError> {
        let mut plan = super::plan_turn(state, session, session_state, request, parser)?;
        let generate = GenerateRequest {
            prompt: std::mem::take(&mut plan.prompt_ids),
            params: request.params.clone(),
            n: request.n,
        };
        let sampled = super::sample(state, session, &generate).await?;
        plan.prompt_ids = generate.prompt;
        let reasoning = super::reasoning_mode(state, session, &plan);
        let mut ids = CallIds::after(session_state.issued_calls);
        let replies = sampled
            .generations
            .iter()
            .map(|g| {
                shape_choice(
                    &state.turn.tokenizer,
                    parser,
                    request,
                    g,
                    reasoning,
                    &mut ids,
                )
            })
            .collect();
        Ok(Self {
            plan,
            generations: sampled.generations,
            replies,
            backends: sampled.backends,
        })
    }

    /// The first choice wrote tool-call markup, but nothing could be promoted from it.
    fn deserves_nudge(&self, request: &ChatRequest, parser: &dyn ToolParser) -> bool {
        let reply = &self.replies[0];
        request.promoter().is_active()
            && reply.tool_calls.is_empty()
            && parser.signals().iter().any(|s| reply.text.contains(s))
    }

    /// The response body: the prompt's ids are written straight from the plan (a long
    /// history costs no JSON value per token).
    fn body(&self, state: &AppState, request: &ChatRequest) -> Vec<u8> {
        let tokenizer = &state.turn.tokenizer;
        let choices: Vec<_> = self
            .replies
            .iter()
            .zip(&self.generations)
            .enumerate()
            .map(|(index, (reply, generation))| ChatChoice {
                index,
                message: chat_message(reply),
                finish_reason: reply.finish_reason,
                logprobs: request
                    .logprobs
                    .then(|| chat_logprobs(tokenizer, generation)),
                token_ids: &generation.token_ids,
                stop_reason: generation.stop.as_ref(),
            })
            .collect();
        let completion_tokens: usize = self.generations.iter().map(|g| g.token_ids.len()).sum();
        let body = envelope(
            "chat.completion",
            "chatcmpl",
            &state.model_name,
            choices,
            self.plan.prompt_ids.len(),
            completion_tokens,
        );
        with_prompt_ids(&body, request, &self.plan.prompt_ids)
    }

    /// Records the attempt; returns the node of each choice.
    fn commit(
        self,
        session_state: &mut SessionState,
        session: &Session,
        nudge: Option<&'static str>,
    ) -> Vec<usize> {
        let sampled = self
            .replies
            .iter()
            .zip(self.generations)
            .zip(&self.backends)
            .map(|((reply, generation), backend)| {
                let mut choice = sampled_choice(reply, generation, backend);
                choice.nudge = nudge;
                choice
            })
            .collect();
        let nodes = turn::commit(
            session_state,
            &self.plan,
            sampled,
            session.options.track_tree,
        );
        session.set_num_nodes(session_state.nodes.len());
        nodes
    }
}

/// The nudge: the reply as it was, then a request to make the call properly.
fn nudge_request(request: &ChatRequest, reply: &super::response::ChoiceReply) -> ChatRequest {
    let mut names = request.callable_tools();
    names.sort();
    let hint = if names.is_empty() {
        "an available tool".to_string()
    } else {
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(" or ")
    };
    let mut retry = request.clone();
    let assistant =
        json!({"role": "assistant", "content": reply.content.clone().unwrap_or_default()});
    let user = json!({"role": "user", "content": format!(
        "You have access to the declared tools. If a tool is needed to complete the action you \
         described, call {hint} now using the native tool-call format with valid JSON arguments, \
         not prose. If no tool is needed, provide the final answer directly."
    )});
    let base = retry.messages.len();
    retry
        .messages
        .push(ChatMessage::parse(base, assistant).expect("a valid assistant message"));
    retry
        .messages
        .push(ChatMessage::parse(base + 1, user).expect("a valid user message"));
    retry
}

/// Labels the last turn of `node` with how the nudge went.
fn set_nudge(session_state: &mut SessionState, node: usize, label: &'static str) {
    if let Some(turn) = session_state.nodes[node].turns.last_mut() {
        turn.nudge = Some(label);
    }
}
