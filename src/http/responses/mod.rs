//! OpenAI's Responses API on a session (what Codex CLI and the Agents SDK speak):
//! `POST /{uuid}/v1/responses` (streamed or not), `GET /{uuid}/v1/responses/{id}` and
//! `POST /{uuid}/v1/responses/render`. The body is read into the turn's request
//! ([`request`]), the turn runs on the pipeline, and its output is written as a `response`
//! object ([`reply`]) or as Responses events ([`stream`]). Responses are kept on the session
//! (unless `store: false`) so a request may continue one with `previous_response_id`.

mod items;
mod reply;
mod request;
mod stream;

use super::body::read_body_noting_unknown;
use super::{ApiError, AppState};
use crate::metrics::Stage;
use crate::session::Session;
use crate::session::replies::TurnKey;
use crate::session::responses::StoredResponse;
use actix_web::{HttpResponse, web};
use items::SentItem;
pub use items::{Item, input_items};
use request::KNOWN_FIELDS;
pub use request::ResponsesBody;
use request::read_responses;
use std::sync::Arc;

/// Where a finished response is kept (when the request lets it be).
pub struct Finished {
    session: Arc<Session>,
    /// Where the stored response is kept beyond the process too (`--data-dir`).
    journal: Option<Arc<dyn crate::session::SessionLog>>,
    store: bool,
    /// What the request continued.
    conversation: Conversation,
}

/// A request's conversation: the stored response it continues, and what it adds.
struct Conversation {
    /// The response named by `previous_response_id`.
    previous: Option<Arc<StoredResponse>>,
    /// The request's own input items, as sent.
    input: Vec<Arc<SentItem>>,
}

impl Conversation {
    /// Every item, the previous responses' first.
    fn items(&self) -> Vec<Item<'_>> {
        let stored = self
            .previous
            .as_ref()
            .map(|previous| previous.conversation());
        let stored = stored.into_iter().flatten().map(Item::Stored);
        stored
            .chain(self.input.iter().map(|sent| Item::Sent(sent)))
            .collect()
    }
}

/// Keeps a finished response on its session: the items it added (its input, then its output),
/// linked to the response it continued, and the object. Returns the journal's write of it,
/// which the caller awaits before the reply ends (the turn itself is journaled before: a
/// failed write only loses the stored copy on a restart).
fn keep(
    finished: Finished,
    output: &[reply::OutputItem],
    response: &reply::ResponseObject,
) -> Option<futures::future::BoxFuture<'static, ()>> {
    if !finished.store {
        return None;
    }
    let id = response.id.to_string();
    let Conversation { previous, input } = finished.conversation;
    let input = input
        .iter()
        .filter_map(|sent| serde_json::from_str(sent.raw().get()).ok());
    let output = output
        .iter()
        .filter_map(|item| serde_json::to_value(item).ok());
    let items = input.chain(output).collect();
    let stored = Arc::new(StoredResponse {
        previous,
        items,
        body: serde_json::to_value(response).unwrap_or_default(),
    });
    let session = finished.session;
    session.responses.insert(id.clone(), stored.clone());
    let log = finished.journal?;
    Some(Box::pin(async move {
        if let Err(error) = log.stored(session.id, &id, &stored).await {
            tracing::error!(%error, "keeping a stored response failed");
        }
    }))
}

/// The session, the body, and the conversation (the stored response of
/// `previous_response_id`, and the new input items); unknown fields are logged at debug.
async fn parse(
    state: &AppState,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<(Arc<Session>, ResponsesBody, Conversation), ApiError> {
    let session = state.session(&path.into_inner()).await?;
    let _parse = state.pipeline.metrics.timed(Stage::Parse);
    let bytes = read_body_noting_unknown(payload, state.max_body_bytes, KNOWN_FIELDS).await?;
    let (body, input) = read_responses(&session, &bytes)?;
    let previous = match &body.previous_response_id {
        Some(id) => Some(session.responses.get(id).ok_or_else(|| {
            ApiError::bad_request(format!(
                "previous_response_id: no stored response '{id}' on this session"
            ))
        })?),
        None => None,
    };
    Ok((session, body, Conversation { previous, input }))
}

/// The request settings a `response` object repeats.
fn echo(body: &ResponsesBody) -> reply::Echo {
    let reasoning = body.reasoning.as_ref();
    let field = |name: &str| reasoning.and_then(|r| r.get(name)).cloned();
    reply::Echo {
        instructions: body.instructions.clone(),
        max_output_tokens: body.max_output_tokens,
        parallel_tool_calls: body.parallel_tool_calls.unwrap_or(true),
        previous_response_id: body.previous_response_id.clone(),
        reasoning: reply::ReasoningEcho {
            effort: field("effort"),
            summary: field("summary"),
        },
        store: body.store.unwrap_or(true),
        temperature: body.temperature,
        text: (),
        tool_choice: body.tool_choice.clone().unwrap_or_else(|| "auto".into()),
        tools: [],
        top_p: body.top_p,
        truncation: "disabled",
        metadata: reply::Empty {},
    }
}

/// One Responses turn: a `response` object, or its events with `stream`.
pub async fn create(
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
    key: Option<web::ReqData<TurnKey>>,
) -> Result<HttpResponse, ApiError> {
    let (session, body, conversation) = parse(&state, path, payload).await?;
    let mut request = body.to_request(&conversation.items(), state.default_max_tokens)?;
    request.key = key.map(web::ReqData::into_inner);
    let shell = reply::Shell {
        id: format!("resp_{}", uuid::Uuid::new_v4().simple()),
        created_at: crate::session::now_seconds() as u64,
        model: body
            .model
            .clone()
            .unwrap_or_else(|| state.model_name.clone()),
        echo: echo(&body),
        encrypted_reasoning: body
            .include
            .iter()
            .any(|i| i == "reasoning.encrypted_content"),
        namespaces: body.namespaces(),
    };
    let finished = Finished {
        session: session.clone(),
        journal: state.journal.clone(),
        store: body.store != Some(false),
        conversation,
    };
    if body.stream {
        let turn = state.pipeline.stream(session, request).await?;
        return Ok(stream::respond(shell, turn, finished));
    }
    let output = state.pipeline.run(&session, &request).await?;
    let reply = &output.choices[0].reply;
    let items = shell.output(reply);
    let usage = output.usage();
    let response = shell.response(
        reply::status(reply.finish),
        &items,
        Some(reply.finish),
        Some(&usage),
    );
    if let Some(journaled) = keep(finished, &items, &response) {
        journaled.await;
    }
    Ok(HttpResponse::Ok().json(response))
}

/// A stored response.
pub async fn retrieve(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (uuid, id) = path.into_inner();
    let session = state.session(&uuid).await?;
    let stored = session
        .responses
        .get(&id)
        .ok_or_else(|| ApiError::not_found(format!("no stored response '{id}' on this session")))?;
    Ok(HttpResponse::Ok().json(&stored.body))
}

/// The exact prompt a Responses turn would send now; changes nothing.
pub async fn render(
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (session, body, conversation) = parse(&state, path, payload).await?;
    let request = body.to_request(&conversation.items(), state.default_max_tokens)?;
    let rendered = state.pipeline.render(&session, &request).await?;
    Ok(super::render_reply(rendered))
}
