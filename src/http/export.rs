//! `GET /export`: the nodes of the selected sessions for the trainer, as JSON lines (streamed,
//! session by session) or as a NumPy `.npz`; with `delete=true` the exported sessions are
//! removed in the same step.
//!
//! Each session's lock is held from reading it until the export ends (with `delete`, until it
//! is removed): a turn under way finishes first and is exported, a turn that comes later waits
//! and then finds the session removed (404) — nothing is exported twice or lost between two
//! exports. A client that hangs up before the end removes nothing.

use super::{ApiError, AppState};
use crate::export::atif::{self, AtifContext};
use crate::export::npz::Padding;
use crate::export::{ExportError, Selection, SessionExport, jsonl, npz, parse_time};
use crate::session::{Session, SessionState};
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use std::sync::Arc;
use tokio::sync::OwnedMutexGuard;

/// The query string.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportQuery {
    format: Option<String>,
    /// Comma-separated session ids.
    sessions: Option<String>,
    finished: Option<bool>,
    since: Option<String>,
    #[serde(default)]
    delete: bool,
    pad_to: Option<usize>,
    pad_id: Option<i32>,
}

enum Format {
    Jsonl,
    Atif,
    Npz(Padding),
}

impl From<ExportError> for ApiError {
    fn from(error: ExportError) -> Self {
        match error {
            ExportError::Write(_) => Self::new(
                actix_web::http::StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                error.to_string(),
            ),
            _ => Self::bad_request(error.to_string()),
        }
    }
}

fn parse(request: &HttpRequest) -> Result<(Selection, Format, bool), ApiError> {
    let query = web::Query::<ExportQuery>::from_query(request.query_string())
        .map_err(|e| ApiError::bad_request(format!("export query: {e}")))?
        .into_inner();
    let selection = Selection {
        sessions: query.sessions.map(|ids| {
            ids.split(',')
                .filter(|id| !id.is_empty())
                .map(str::to_string)
                .collect()
        }),
        finished: query.finished,
        since: query.since.as_deref().map(parse_time).transpose()?,
    };
    let format = match query.format.as_deref().unwrap_or("jsonl") {
        "jsonl" => Format::Jsonl,
        "atif" => Format::Atif,
        "npz" => Format::Npz(Padding {
            pad_to: match query.pad_to {
                Some(0) => return Err(ApiError::bad_request("'pad_to' must be at least 1")),
                pad_to => pad_to,
            },
            pad_id: query.pad_id.unwrap_or(0),
        }),
        other => {
            return Err(ApiError::bad_request(format!(
                "format '{other}' is not one of: jsonl, atif, npz"
            )));
        }
    };
    if !matches!(format, Format::Npz(_)) && (query.pad_to.is_some() || query.pad_id.is_some()) {
        return Err(ApiError::bad_request(
            "'pad_to' and 'pad_id' apply to format=npz",
        ));
    }
    Ok((selection, format, query.delete))
}

/// The export.
pub async fn export(
    state: web::Data<AppState>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let (selection, format, delete) = parse(&request)?;
    let sessions = selection.apply(&state.sessions);
    match format {
        Format::Jsonl | Format::Atif => Ok(HttpResponse::Ok()
            .content_type("application/x-ndjson")
            .streaming(lines(
                state.into_inner(),
                sessions,
                delete,
                matches!(format, Format::Atif),
            ))),
        Format::Npz(padding) => {
            let mut held = Vec::with_capacity(sessions.len());
            for session in sessions {
                let guard = session.state.clone().lock_owned().await;
                held.push((session, guard));
            }
            let exports: Vec<_> = held.iter().map(|(s, g)| exported(s, g)).collect();
            let bytes = bytes::Bytes::from(npz::write(&exports, padding)?);
            if !delete {
                held.clear();
            }
            // With `delete`, the sessions stay locked until the file has been handed over, and
            // are removed only then.
            let state = state.into_inner();
            let body = futures::stream::unfold(Some((bytes, held)), move |left| {
                let state = state.clone();
                async move {
                    let (bytes, held) = left?;
                    if bytes.is_empty() {
                        remove(&state, &held);
                        return None;
                    }
                    Some((
                        Ok::<_, std::io::Error>(bytes),
                        Some((bytes::Bytes::new(), held)),
                    ))
                }
            });
            Ok(HttpResponse::Ok()
                .content_type("application/octet-stream")
                .insert_header(("content-disposition", "attachment; filename=\"export.npz\""))
                .streaming(body))
        }
    }
}

/// The session as exported, read under its lock.
fn exported<'a>(session: &'a Session, state: &'a SessionState) -> SessionExport<'a> {
    SessionExport {
        session,
        nodes: &state.nodes,
        completions: &state.completions,
        reward: session.reward(),
    }
}

type Held = (Arc<Session>, OwnedMutexGuard<SessionState>);

/// The JSON lines, a session at a time; with `delete`, the sessions are removed once the last
/// line has been handed to the connection.
fn lines(
    state: Arc<AppState>,
    sessions: Vec<Arc<Session>>,
    delete: bool,
    atif: bool,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    let pending = sessions.into_iter();
    futures::stream::unfold(
        (state, pending, Vec::<Held>::new(), false),
        move |(state, mut pending, mut held, done)| async move {
            if done {
                return None;
            }
            let Some(session) = pending.next() else {
                if delete {
                    remove(&state, &held);
                }
                return Some((Ok(bytes::Bytes::new()), (state, pending, Vec::new(), true)));
            };
            let guard = session.state.clone().lock_owned().await;
            let mut out = Vec::new();
            let export = exported(&session, &guard);
            let written = match atif {
                true => {
                    let ctx = AtifContext {
                        tokenizer: &state.pipeline.context.tokenizer,
                        model_name: &state.model_name,
                    };
                    atif::write_session(&mut out, &export, ctx)
                }
                false => jsonl::write_session(&mut out, &export, &state.pipeline.context.tokenizer),
            };
            if delete {
                held.push((session, guard));
            }
            let chunk = written
                .map(|()| bytes::Bytes::from(out))
                .map_err(std::io::Error::other);
            Some((chunk, (state, pending, held, false)))
        },
    )
}

/// Removes the exported sessions (journaled first; one that cannot be journaled stays, to be
/// exported again rather than lost).
fn remove(state: &AppState, held: &[Held]) {
    for (session, _) in held {
        if state.keep(|log| log.deleted(session.id)).is_ok() {
            state.sessions.remove(&session.id.to_string());
        }
    }
    state.freed.note();
}
