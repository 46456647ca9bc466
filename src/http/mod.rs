//! The HTTP edge: routes, the shared application state, and one adapter per API.
//!
//! Every route is in one table with its class ([`routes`]); each is wrapped in the guard that
//! checks what its class needs before any handler runs ([`guard`]). An adapter parses its wire
//! request into a [`crate::chat::ChatRequest`], runs the turn on [`crate::turn::Pipeline`], and
//! writes the turn's output in its wire format ([`openai`]: chat and text completions;
//! [`anthropic`]: Messages; [`responses`]: Responses). Errors of every module are mapped to
//! HTTP once, in [`error`].

mod admin;
mod anthropic;
pub(crate) mod auth;
mod blobs;
mod body;
mod control;
pub mod drain;
pub(crate) mod error;
mod export;
pub(crate) mod guard;
mod idempotency;
pub mod openai;
mod responses;
pub mod routes;
mod sessions;
mod sse;
mod viewer;

pub use error::ApiError;

use crate::session::{Session, SessionStore};
use crate::turn::Pipeline;
use actix_web::{App, HttpServer, web};
use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Arc;

/// Everything the handlers share.
#[derive(Debug)]
pub struct AppState {
    /// The model name replies carry.
    pub model_name: String,
    /// Runs turns: the model-side pieces and the backend pool.
    pub pipeline: Pipeline,
    /// The live sessions.
    pub sessions: SessionStore,
    /// `max_tokens` sent when a request sets none.
    pub default_max_tokens: Option<u32>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Where sessions are kept beyond the process (`--data-dir`: the journal; `--store`: the
    /// fleet's store).
    pub journal: Option<Arc<dyn crate::session::SessionLog>>,
    /// The fleet this replica is part of (`--store`): its control and numbers.
    pub fleet: Option<Arc<crate::fleet::Fleet>>,
    /// The keys callers must present (none: every route is open).
    pub keys: auth::Keys,
    /// Where requests may come from (`--allow-origin`, `--allow-host`).
    pub origins: guard::Origins,
    /// Set when the proxy drains: new work is refused.
    pub draining: std::sync::atomic::AtomicBool,
    /// Set when sessions are used or deleted, so memory they freed is given back to the OS.
    pub freed: crate::memory::FreedMemory,
}

impl AppState {
    /// The session `id` (marked as used now), or a 404 (saying so when it expired).
    pub async fn session(&self, id: &str) -> Result<Arc<Session>, ApiError> {
        let session = self.known_session(id).await?;
        session.touch();
        // The turn's buffers are freed when it ends; the next release returns what they leave.
        self.freed.note();
        Ok(session)
    }

    /// The session `id`, up to date with a record other processes share (`--store`), not
    /// marked as used; or a 404.
    pub async fn known_session(&self, id: &str) -> Result<Arc<Session>, ApiError> {
        if let (Some(log), Ok(uuid)) = (&self.journal, uuid::Uuid::parse_str(id)) {
            log.refresh(&self.sessions, uuid)
                .await
                .map_err(unreadable_record)?;
        }
        self.sessions.get(id).ok_or_else(|| self.missing(id))
    }

    /// The session `id` for a turn that reads nothing of it before the turn holds it (which
    /// brings it up to date): loaded from a shared record only when it is not here. Marked
    /// as used now.
    pub async fn turn_session(&self, id: &str) -> Result<Arc<Session>, ApiError> {
        let session = match self.sessions.get(id) {
            Some(session) => session,
            None => self.known_session(id).await?,
        };
        session.touch();
        self.freed.note();
        Ok(session)
    }

    /// Brings every session up to date with a record other processes share (`--store`),
    /// before they are listed or exported.
    pub async fn refresh_all(&self) -> Result<(), ApiError> {
        match &self.journal {
            Some(log) => log
                .refresh_all(&self.sessions)
                .await
                .map_err(unreadable_record),
            None => Ok(()),
        }
    }
}

fn unreadable_record(error: crate::session::LogError) -> ApiError {
    tracing::error!(%error, "the session log could not be read");
    ApiError::new(
        actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
        "unavailable_error",
        format!("the sessions' record could not be read: {error}"),
    )
}

/// The conversation a request body asks a turn for, read as the route of `api` reads it
/// (without a session: no stored responses). The fuzz targets drive every API's reader
/// through this.
pub fn read_turn(
    api: crate::session::Api,
    body: &[u8],
) -> Result<crate::chat::ChatRequest, ApiError> {
    use crate::session::Api;
    match api {
        Api::Completions => Err(ApiError::bad_request(
            "a text completion's prompt is not a conversation",
        )),
        Api::ChatCompletions => {
            let body: openai::request::ChatCompletionBody = body::parse_json(body)?;
            Ok(body.validate(None)?.turn)
        }
        Api::Messages => {
            let body: anthropic::MessagesBody = body::parse_json(body)?;
            Ok(body.into_request(None, false)?)
        }
        Api::Responses => {
            let mut body: responses::ResponsesBody = body::parse_json(body)?;
            let items = responses::input_items(body.input.take())?;
            let items: Vec<_> = items
                .iter()
                .map(|sent| responses::Item::Sent(sent))
                .collect();
            Ok(body.to_request(&items, None)?)
        }
    }
}

/// The reply of every API's `/render`: the prompt as text, its ids, the node it extends, and
/// its images (each run of placeholders, as the node would record it) when it has any.
fn render_reply(rendered: crate::turn::RenderedTurn) -> actix_web::HttpResponse {
    let mut reply = serde_json::json!({
        "prompt_text": rendered.prompt_text,
        "num_tokens": rendered.prompt_ids.len(),
        "token_ids": rendered.prompt_ids,
        "extends_node": rendered.extends_node,
    });
    if !rendered.images.is_empty() {
        reply["images"] = serde_json::json!(rendered.images);
    }
    actix_web::HttpResponse::Ok().json(reply)
}

/// Registers every route of the table ([`routes::table`]) on an actix app, each wrapped in
/// its guard ([`guard::check`]) with the class of the route.
pub fn routes(cfg: &mut web::ServiceConfig) {
    for route in routes::table() {
        let class = route.class;
        cfg.service(
            web::resource(class.pattern)
                .route(route.handler)
                // Other methods get a 405 in the API's error shape (actix's own has no body).
                .default_service(web::to(move |request: actix_web::HttpRequest| async move {
                    method_not_allowed(class, &request)
                }))
                .wrap(actix_web::middleware::from_fn(
                    move |request, next: actix_web::middleware::Next<actix_web::body::BoxBody>| {
                        guard::check(class, request, next)
                    },
                )),
        );
    }
    cfg.default_service(web::to(|| async {
        Err::<actix_web::HttpResponse, _>(ApiError::not_found("no such route"))
    }));
}

fn method_not_allowed(
    class: routes::RouteClass,
    request: &actix_web::HttpRequest,
) -> actix_web::HttpResponse {
    let error = ApiError::new(
        actix_web::http::StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!("{} is not allowed on {}", request.method(), request.path()),
    );
    class.shape.refuse(error)
}

impl AppState {
    /// Whether the proxy is draining.
    pub fn draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Refuses new work from now on.
    pub fn start_draining(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Has the session log (when sessions are kept beyond the process) keep a change; a 503
    /// when it cannot.
    pub async fn keep<'a>(
        &'a self,
        change: impl FnOnce(&'a dyn crate::session::SessionLog) -> LogChange<'a>,
    ) -> Result<(), ApiError> {
        let Some(log) = &self.journal else {
            return Ok(());
        };
        change(log.as_ref()).await.map_err(|error| {
            tracing::error!(%error, "the session log failed");
            ApiError::new(
                actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
                "unavailable_error",
                format!("the session change could not be kept: {error}"),
            )
        })
    }

    /// The 404 for a session that is not here: expired (with the limit), or unknown.
    pub fn missing(&self, id: &str) -> ApiError {
        match (self.sessions.was_expired(id), self.sessions.limits().ttl) {
            (true, Some(ttl)) => ApiError::not_found(format!(
                "session {id} expired after {} s idle (--session-ttl)",
                ttl.as_secs_f64()
            )),
            _ => ApiError::no_session(id),
        }
    }
}

/// A change a [`crate::session::SessionLog`] is keeping.
pub type LogChange<'a> = futures::future::BoxFuture<'a, Result<(), crate::session::LogError>>;

/// Expires idle sessions (with `--session-ttl`), checking a few times per time to live.
async fn expire_idle_sessions(state: Arc<AppState>) {
    let Some(ttl) = state.sessions.limits().ttl else {
        return;
    };
    let period = (ttl / 4).clamp(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(10),
    );
    let mut tick = tokio::time::interval(period);
    loop {
        tick.tick().await;
        let expired = state.sessions.expire_idle();
        for &id in &expired {
            // Logged inside; the session is gone from memory either way.
            let _ = state.keep(|log| log.expired(id)).await;
        }
        if !expired.is_empty() {
            state.freed.note();
            tracing::info!(expired = expired.len(), "idle sessions expired");
        }
    }
}

/// Once a second, gives freed memory back to the OS if sessions were used or deleted since,
/// and compacts the journal when deletions have left it mostly garbage.
async fn release_freed_memory(state: Arc<AppState>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        if state.freed.take() {
            let _ = tokio::task::spawn_blocking(crate::memory::release_freed).await;
            if let Some(journal) = state.journal.clone() {
                let compacted = tokio::task::spawn_blocking(move || journal.tidy());
                if let Ok(Err(error)) = compacted.await {
                    tracing::error!(%error, "journal compaction failed");
                }
            }
            sweep_images(&state).await;
        }
    }
}

/// Drops the kept images no session holds any more. A locked session may be adding one: the
/// sweep then waits for the next tick. A fleet's replica keeps every image it took (another
/// replica's sessions may hold it).
async fn sweep_images(state: &AppState) {
    if state.fleet.is_some() {
        return;
    }
    let blobs = state.pipeline.blobs.clone();
    blobs.begin_sweep();
    let mut referenced: HashSet<Arc<str>> = HashSet::new();
    for session in state.sessions.list() {
        let Ok(held) = session.state.try_lock() else {
            state.freed.note();
            return;
        };
        for node in &held.nodes {
            referenced.extend(node.images().iter().map(|image| image.sha256.clone()));
        }
    }
    let swept = tokio::task::spawn_blocking(move || {
        let referenced: HashSet<&str> = referenced.iter().map(|sha| &**sha).collect();
        blobs.sweep(&referenced)
    });
    match swept.await {
        Ok(Ok(0)) => {}
        Ok(Ok(dropped)) => tracing::info!(dropped, "images no session holds were dropped"),
        Ok(Err(error)) => tracing::error!(%error, "dropping unheld images failed"),
        Err(error) => tracing::error!(%error, "dropping unheld images failed"),
    }
}

/// Headers every reply carries unless it sets its own: no type sniffing, no framing, no
/// referrer, and a content policy that lets a reply load nothing (the viewer's page sets the
/// policy it needs, see [`viewer`]).
fn security_headers() -> actix_web::middleware::DefaultHeaders {
    actix_web::middleware::DefaultHeaders::new()
        .add(("X-Content-Type-Options", "nosniff"))
        .add(("X-Frame-Options", "DENY"))
        .add(("Referrer-Policy", "no-referrer"))
        .add((
            "Content-Security-Policy",
            "default-src 'none'; frame-ancestors 'none'",
        ))
}

/// Sends each write at once: a stream's events are small writes, and with Nagle's algorithm
/// each one after the first waited for the client's delayed ACK (about 40 ms).
fn no_delay(connection: &dyn std::any::Any, _: &mut actix_web::dev::Extensions) {
    if let Some(socket) = connection.downcast_ref::<actix_web::rt::net::TcpStream>() {
        let _ = socket.set_nodelay(true);
    }
}

/// Serves the API on an already bound listener until the server is stopped, with `workers`
/// server threads (actix's default, one per core, when `None`).
pub fn serve(
    state: Arc<AppState>,
    listener: TcpListener,
    workers: Option<usize>,
) -> std::io::Result<actix_web::dev::Server> {
    actix_web::rt::spawn(state.pipeline.backends.clone().run_health_checks());
    actix_web::rt::spawn(release_freed_memory(state.clone()));
    actix_web::rt::spawn(expire_idle_sessions(state.clone()));
    if let Some(fleet) = state.fleet.clone() {
        actix_web::rt::spawn(fleet.follow(state.pipeline.clone()));
    }
    state.origins.listening_on(listener.local_addr()?);
    let data = web::Data::from(state);
    let mut server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .wrap(security_headers())
            .configure(routes)
    })
    .on_connect(no_delay);
    if let Some(workers) = workers {
        server = server.workers(workers);
    }
    // Signals are the binary's to handle (it drains, see `drain`); a test process keeps its own.
    server = server.disable_signals();
    Ok(server.listen(listener)?.run())
}
