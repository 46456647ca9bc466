//! The HTTP edge: routes, JSON bodies, and the shared application state.
//!
//! Data flow of a chat turn: `chat` parses the request → `turn::prepare` renders and tokenizes
//! → the backend samples → `turn::commit` records the node → `response` builds the reply.

mod admin;
mod body;
mod chat;
mod completions;
pub mod error;
mod response;
mod sessions;
mod stream;

pub use error::ApiError;

use crate::backend::{EventStream, GenerateRequest, Pool, Route, pool::Sampled};
use crate::session::{Session, SessionStore};
use crate::turn::TurnContext;
use actix_web::{App, HttpServer, web};
use std::net::TcpListener;
use std::sync::Arc;

/// Everything the handlers share.
#[derive(Debug)]
pub struct AppState {
    pub model_name: String,
    pub turn: TurnContext,
    pub backends: Arc<Pool>,
    pub sessions: SessionStore,
    /// `max_tokens` sent when a request sets none.
    pub default_max_tokens: Option<u32>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Set when sessions are used or deleted, so memory they freed is given back to the OS.
    pub freed: crate::memory::FreedMemory,
}

impl AppState {
    /// The session `id` (marked as used now), or a 404.
    pub fn session(&self, id: &str) -> Result<Arc<Session>, ApiError> {
        let session = self
            .sessions
            .get(id)
            .ok_or_else(|| ApiError::no_session(id))?;
        session.touch();
        // The turn's buffers are freed when it ends; the next release returns what they leave.
        self.freed.note();
        Ok(session)
    }
}

/// Runs a generation for `session` through the pool: on its pinned backend, else preferring
/// the one its previous turn ran on; records the affinity figure.
async fn sample(
    state: &AppState,
    session: &Session,
    request: &GenerateRequest,
) -> Result<Sampled, ApiError> {
    let previous = session.backend();
    let sampled = state
        .backends
        .generate(request, route(session, previous.as_deref()))
        .await?;
    if let Some(used) = sampled.backends.first() {
        state.backends.record_affinity(previous.as_deref(), used);
        session.set_backend(used.clone());
    }
    Ok(sampled)
}

/// Like [`sample`], for one streamed sample.
async fn sample_stream(
    state: &AppState,
    session: &Session,
    request: &GenerateRequest,
) -> Result<(EventStream, Arc<str>), ApiError> {
    let previous = session.backend();
    let (events, used) = state
        .backends
        .generate_stream(request, route(session, previous.as_deref()))
        .await?;
    state.backends.record_affinity(previous.as_deref(), &used);
    session.set_backend(used.clone());
    Ok((events, used))
}

/// The prompt of a turn on `session` (whose state is `session_state`).
fn plan_turn(
    state: &AppState,
    session: &Session,
    session_state: &crate::session::SessionState,
    request: &crate::chat::ChatRequest,
    parser: &dyn crate::tools::ToolParser,
) -> Result<crate::turn::Plan, ApiError> {
    let history = session.options.history;
    Ok(crate::turn::prepare(
        &state.turn,
        session_state,
        request,
        history,
        parser,
    )?)
}

/// `Some(opened)` when the session returns reasoning separately; `opened` says whether the
/// prompt itself opened the reasoning block.
fn reasoning_mode(state: &AppState, session: &Session, plan: &crate::turn::Plan) -> Option<bool> {
    session.options.reasoning.then(|| {
        let tail = &plan.prompt_ids[plan.prompt_ids.len().saturating_sub(4)..];
        crate::reasoning::opened_by(&state.turn.tokenizer.decode(tail))
    })
}

fn route<'a>(session: &'a Session, previous: Option<&'a str>) -> Route<'a> {
    match &session.options.base_url {
        Some(url) => Route::Pinned(url),
        None => Route::Prefer(previous),
    }
}

/// Registers every route on an actix app. A rollout's routes with more than one segment come
/// first: routes are tried in order, each pattern with a session id by a regex, and a turn is
/// the request served most often. None of those patterns matches a fixed route's path;
/// `/{uuid}` would (`/health`), so it stays last.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/{uuid}/v1/chat/completions",
        web::post().to(chat::completions),
    )
    .route(
        "/{uuid}/v1/chat/completions/render",
        web::post().to(chat::render),
    )
    .route(
        "/{uuid}/v1/completions",
        web::post().to(completions::completions),
    )
    .route("/{uuid}/nodes", web::get().to(sessions::nodes))
    .route("/{uuid}/v1/models", web::get().to(admin::session_models))
    .route(
        "/{uuid}/v1/models/{model:.+}",
        web::get().to(admin::session_model),
    )
    .route("/health", web::get().to(admin::health))
    .route("/v1/models", web::get().to(admin::models))
    .route("/v1/models/{model:.+}", web::get().to(admin::model))
    .route("/servers", web::get().to(admin::servers))
    .route("/setup", web::post().to(admin::setup))
    .route("/sessions/create", web::post().to(sessions::create))
    .route("/sessions", web::get().to(sessions::list))
    .route("/{uuid}", web::delete().to(sessions::delete))
    .default_service(web::to(|| async {
        Err::<actix_web::HttpResponse, _>(ApiError::not_found("no such route"))
    }));
}

/// Once a second, gives freed memory back to the OS if sessions were used or deleted since.
async fn release_freed_memory(state: Arc<AppState>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        if state.freed.take() {
            let _ = tokio::task::spawn_blocking(crate::memory::release_freed).await;
        }
    }
}

/// Serves the API on an already bound listener until the server is stopped, with `workers`
/// server threads (actix's default, one per core, when `None`).
pub fn serve(
    state: Arc<AppState>,
    listener: TcpListener,
    workers: Option<usize>,
) -> std::io::Result<actix_web::dev::Server> {
    actix_web::rt::spawn(state.backends.clone().run_health_checks());
    actix_web::rt::spawn(release_freed_memory(state.clone()));
    let data = web::Data::from(state);
    let mut server = HttpServer::new(move || App::new().app_data(data.clone()).configure(routes));
    if let Some(workers) = workers {
        server = server.workers(workers);
    }
    Ok(server.listen(listener)?.run())
}
