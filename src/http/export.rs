//! `GET /export`: the nodes of the selected sessions for the trainer, as JSON lines (streamed,
//! session by session) or as a NumPy `.npz`; with `delete=true` the exported sessions are
//! removed in the same step.
//!
//! Each session's lock is held from reading it until the export ends (with `delete`, until it
//! is removed): a turn under way finishes first and is exported, a turn that comes later waits
//! and then finds the session removed (404). An export that waited for a session another
//! export removed leaves it out: with `delete`, a session is handed out by exactly one export,
//! and none is lost between two. A client that hangs up before the end removes nothing.

use super::{ApiError, AppState};
use crate::export::atif::{self, AtifContext};
use crate::export::npz::Padding;
use crate::export::{ExportError, Selection, SessionExport, jsonl, npz, parse_time};
use crate::session::{LockedSession, Node, Session, SessionState};
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use std::sync::Arc;

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
    state.refresh_all().await?;
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
                // Not there once this export holds it: another export with `delete` took it.
                if let Some(guard) = lock(&state, &session, delete).await? {
                    held.push((session, guard));
                }
            }
            // A node longer than `pad_to` is a 400, before anything is sent.
            let exports: Vec<_> = held.iter().map(|(s, g)| exported(s, g)).collect();
            npz::shape(&exports, padding)?;
            drop(exports);
            // Without `delete` the nodes are copied (ids packed: far smaller than the file) and
            // the sessions unlocked at once, so their rollouts go on while a slow client reads.
            let rows = match delete {
                true => Rows::Locked(held),
                false => Rows::Copied(
                    held.into_iter()
                        .map(|(session, guard)| (session, guard.nodes.clone()))
                        .collect(),
                ),
            };
            Ok(HttpResponse::Ok()
                .content_type("application/octet-stream")
                .insert_header(("content-disposition", "attachment; filename=\"export.npz\""))
                .streaming(npz_body(state.into_inner(), rows, padding)))
        }
    }
}

/// Chunks of the `.npz` in flight between the thread writing it and the connection.
const NPZ_CHUNKS_IN_FLIGHT: usize = 4;
/// Bytes per chunk.
const NPZ_CHUNK: usize = 256 * 1024;

/// The sessions an `.npz` is written from.
enum Rows {
    /// Locked until the file has been handed over, then removed (`delete=true`).
    Locked(Vec<Held>),
    /// Their nodes, copied.
    Copied(Vec<(Arc<Session>, Vec<Node>)>),
}

impl Rows {
    fn exports(&self) -> Vec<SessionExport<'_>> {
        match self {
            Self::Locked(held) => held.iter().map(|(s, g)| exported(s, g)).collect(),
            Self::Copied(copied) => copied
                .iter()
                .map(|(session, nodes)| SessionExport {
                    session,
                    nodes,
                    completions: &[],
                    reward: session.reward(),
                })
                .collect(),
        }
    }
}

/// The `.npz` of `rows`, written on a blocking thread as the connection takes it (a few chunks
/// ahead, never whole in memory). Locked sessions are removed once the file has been handed
/// over, and not at all if the client hangs up first.
fn npz_body(
    state: Arc<AppState>,
    rows: Rows,
    padding: Padding,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    let (chunks, received) = tokio::sync::mpsc::channel(NPZ_CHUNKS_IN_FLIGHT);
    let writer = tokio::task::spawn_blocking(move || {
        let out = ChunkWriter {
            chunks,
            pending: Vec::with_capacity(NPZ_CHUNK),
        };
        npz::write(&rows.exports(), padding, out).map(|()| rows)
    });
    futures::stream::unfold((received, Some(writer)), move |(mut received, writer)| {
        let state = state.clone();
        async move {
            if let Some(chunk) = received.recv().await {
                return Some((Ok(chunk), (received, writer)));
            }
            // Every chunk is out: the writer has ended, well or not.
            let failure = match writer?.await {
                Ok(Ok(Rows::Locked(held))) => {
                    remove(&state, &held).await;
                    return None;
                }
                Ok(Ok(Rows::Copied(_))) => return None,
                Ok(Err(error)) => std::io::Error::other(error),
                Err(error) => std::io::Error::other(error),
            };
            Some((Err(failure), (received, None)))
        }
    })
}

/// A `Write` that sends what is written as chunks to the connection, blocking while the
/// connection is behind; fails once the connection is gone.
struct ChunkWriter {
    chunks: tokio::sync::mpsc::Sender<bytes::Bytes>,
    pending: Vec<u8>,
}

impl ChunkWriter {
    fn send(&mut self) -> std::io::Result<()> {
        let chunk = std::mem::replace(&mut self.pending, Vec::with_capacity(NPZ_CHUNK));
        self.chunks
            .blocking_send(bytes::Bytes::from(chunk))
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(bytes);
        if self.pending.len() >= NPZ_CHUNK {
            self.send()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self.pending.is_empty() {
            true => Ok(()),
            false => self.send(),
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

type Held = (Arc<Session>, LockedSession);

/// A session's state locked for its export; held across a fleet too when the export deletes
/// it, so that one export fleet-wide hands it out. `None` when it was removed meanwhile.
async fn lock(
    state: &AppState,
    session: &Arc<Session>,
    delete: bool,
) -> Result<Option<LockedSession>, ApiError> {
    let log = state.journal.as_deref().filter(|_| delete);
    session.lock_for_change(log).await.map_err(|error| {
        ApiError::new(
            actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            format!("the session could not be held for export: {error}"),
        )
    })
}

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
                    remove(&state, &held).await;
                }
                return Some((Ok(bytes::Bytes::new()), (state, pending, Vec::new(), true)));
            };
            // Removed while this export waited (another export with `delete` took it, or it
            // was deleted): it is not this export's to hand out.
            let guard = match lock(&state, &session, delete).await {
                Ok(Some(guard)) => guard,
                Ok(None) => return Some((Ok(bytes::Bytes::new()), (state, pending, held, false))),
                Err(error) => {
                    let error = std::io::Error::other(error.to_string());
                    return Some((Err(error), (state, pending, held, true)));
                }
            };
            let mut out = Vec::new();
            let export = exported(&session, &guard);
            let written = match atif {
                true => {
                    let ctx = AtifContext {
                        turn: &state.pipeline.context,
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
async fn remove(state: &AppState, held: &[Held]) {
    for (session, _) in held {
        if state.keep(|log| log.deleted(session.id)).await.is_ok() {
            state.sessions.remove(&session.id.to_string());
        }
    }
    state.freed.note();
}
