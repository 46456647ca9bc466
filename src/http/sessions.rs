//! Session routes: create, list, delete, and the nodes a trainer collects.

use super::body::read_json;
use super::{ApiError, AppState};
use crate::session::{Divergence, HistoryMode, Node, Reward, SessionOptions, TurnRecord};
use crate::tools::ToolFormat;
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

#[derive(Debug, Deserialize)]
pub struct CreateBody {
    #[serde(default)]
    tool_parser: Option<String>,
    #[serde(default)]
    track_tree: bool,
    #[serde(default)]
    base_url: Option<String>,
    #[serde(default)]
    history: HistoryMode,
    #[serde(default)]
    reasoning: bool,
    #[serde(default)]
    adapter: Option<String>,
    #[serde(default)]
    routed_experts: bool,
}

/// Longest LoRA adapter name a session may give.
const MAX_ADAPTER_NAME: usize = 256;

pub async fn create(
    state: web::Data<AppState>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body: CreateBody = read_json(payload, state.max_body_bytes).await?;
    let tool_parser = match body.tool_parser {
        Some(name) => ToolFormat::named(&name).map_err(|e| ApiError::bad_request(e.to_string()))?,
        None => state.pipeline.context.default_tool_format.clone(),
    };
    if let Some(url) = body
        .base_url
        .as_deref()
        .filter(|url| !state.pipeline.backends.contains(url))
    {
        return Err(ApiError::bad_request(format!(
            "base_url {url} is not a configured backend"
        )));
    }
    if let Some(adapter) = &body.adapter {
        if adapter.is_empty()
            || adapter.len() > MAX_ADAPTER_NAME
            || adapter.chars().any(char::is_control)
        {
            return Err(ApiError::bad_request(format!(
                "adapter must be a name of 1 to {MAX_ADAPTER_NAME} bytes without control characters"
            )));
        }
        let route = body.base_url.as_deref();
        if let Some(refusal) = state.pipeline.backends.adapter_refusal(route) {
            return Err(ApiError::bad_request(refusal));
        }
    }
    let session = state
        .sessions
        .create(SessionOptions {
            tool_parser,
            track_tree: body.track_tree,
            base_url: body.base_url,
            history: body.history,
            reasoning: body.reasoning,
            adapter: body.adapter.map(std::sync::Arc::from),
            routed_experts: body.routed_experts,
        })
        .map_err(|full| {
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                full.to_string(),
            )
        })?;
    if let Err(error) = state.keep(|log| log.created(&session)).await {
        state.sessions.remove(&session.id.to_string());
        return Err(error);
    }
    tracing::debug!(session = %session.id, "session created");
    Ok(HttpResponse::Ok().json(json!({
        "uuid": session.id,
        "model_name": state.model_name,
        "tool_parser": session.options.tool_parser,
        "base_url": session.options.base_url,
        "track_tree": session.options.track_tree,
        "history": session.options.history,
        "reasoning": session.options.reasoning,
        "adapter": session.options.adapter,
        "routed_experts": session.options.routed_experts,
        "created_at": session.created_at,
    })))
}

pub async fn list(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    state.refresh_all().await?;
    let sessions: Vec<_> = state
        .sessions
        .list()
        .iter()
        .map(|s| {
            json!({
                "uuid": s.id,
                "created_at": s.created_at,
                "last_accessed": s.last_accessed(),
                "num_nodes": s.num_nodes(),
                "reward": s.reward().map(|r| r.reward),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "sessions": sessions })))
}

pub async fn delete(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    let session = state.known_session(&id).await?;
    state.keep(|log| log.deleted(session.id)).await?;
    state.sessions.remove(&id);
    state.freed.note();
    Ok(HttpResponse::Ok().json(json!({"status": "deleted", "uuid": session.id})))
}

/// `POST /{uuid}/reward`: `{"reward": number, "metadata": {...}}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardBody {
    reward: f64,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
}

/// Keeps the rollout's reward (and free metadata) with the session: every export carries it,
/// and the session counts as finished (`GET /export?finished=true`).
pub async fn reward(
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let session = state.session(&path.into_inner()).await?;
    let body: RewardBody = read_json(payload, state.max_body_bytes).await?;
    let reward = Reward {
        reward: body.reward,
        metadata: body.metadata.unwrap_or_default(),
        rewarded_at: crate::session::now_seconds(),
    };
    state.keep(|log| log.rewarded(session.id, &reward)).await?;
    let reply = json!({"uuid": session.id, "reward": reward.reward,
        "metadata": reward.metadata, "rewarded_at": reward.rewarded_at});
    session.set_reward(reward);
    Ok(HttpResponse::Ok().json(reply))
}

/// `GET /{uuid}/divergences`: each turn that could not extend a node, with where its prompt
/// parted from the closest node (ids and their text on both sides).
pub async fn divergences(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let session = state.session(&path.into_inner()).await?;
    let guard = session.state.lock().await;
    let tokenizer = &state.pipeline.context.tokenizer;
    let side = |ids: &[u32]| json!({"token_ids": ids, "text": tokenizer.decode(ids)});
    let reports: Vec<Value> = guard
        .divergences
        .iter()
        .map(|report| {
            json!({
                "node": report.node,
                "reason": report.divergence.reason,
                "detail": report.divergence.detail,
                "closest_node": report.closest_node,
                "position": report.position,
                "window_start": report.window_start,
                "expected": side(&report.expected),
                "received": side(&report.received),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({"divergences": reports})))
}

pub async fn nodes(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let session = state.session(&path.into_inner()).await?;
    let guard = session.state.lock().await;
    let mut body = Vec::with_capacity(guard.nodes.iter().map(|n| 24 * n.len() + 512).sum());
    body.extend_from_slice(b"{\"nodes\":[");
    for (index, node) in guard.nodes.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        write_node(&mut body, &state, index, node).map_err(|e| {
            ApiError::new(
                actix_web::http::StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                e.to_string(),
            )
        })?;
    }
    body.extend_from_slice(b"]}");
    Ok(super::body::json_response(body))
}

/// A node's `metadata`, written straight from the node.
#[derive(Serialize)]
struct NodeMetadata<'n> {
    node_index: usize,
    num_turns: usize,
    finish_reasons: Vec<&'static str>,
    turns: &'n [TurnRecord],
    divergence: Option<&'n Divergence>,
    parent: Option<usize>,
}

/// A node as trainers receive it: `full_text`, `tokens`, `masked_tokens` (-100 where the model
/// did not sample), `logprobs` (1.0 there; sampled ones as the f64 nearest the stored f32) and
/// `metadata`. The arrays are written straight from the node.
fn write_node(
    out: &mut Vec<u8>,
    state: &AppState,
    index: usize,
    node: &Node,
) -> serde_json::Result<()> {
    let tokens = node.tokens();
    out.extend_from_slice(b"{\"full_text\":");
    serde_json::to_writer(&mut *out, &state.pipeline.context.tokenizer.decode(&tokens))?;
    crate::export::jsonl::write_arrays(out, node, &tokens);
    out.extend_from_slice(b",\"metadata\":");
    let metadata = NodeMetadata {
        node_index: index,
        num_turns: node.turns.len(),
        finish_reasons: node.turns.iter().map(|t| t.finish_reason).collect(),
        turns: &node.turns,
        divergence: node.divergence.as_ref(),
        parent: node.parent,
    };
    serde_json::to_writer(&mut *out, &metadata)?;
    out.push(b'}');
    Ok(())
}
