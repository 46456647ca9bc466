//! One rollout as a careful RL client runs it through faults: every turn carries an
//! `Idempotency-Key` and is retried with it — after a refused connection (the proxy is being
//! restarted) until the proxy is back, after a 5xx or a stream's error event a few times with
//! backoff, and after hanging up mid-stream on purpose. A turn that still fails ends the
//! rollout, and the session must then be exactly as it was before that turn.

use super::apis::{Api, Conversation};
use super::chaos::DOOM;
use super::workload::{self, QUESTIONS, SYSTEM};
use futures::StreamExt;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Attempts of a turn answered with an error (a 5xx, an error event) before it is given up.
const FAILED_ATTEMPTS: u32 = 6;
/// A chat stream's chunk that finishes a choice.
const FINISH: &[u8] = b"\"finish_reason\":\"";
/// How long a turn keeps trying to reach a proxy that does not answer.
const UNREACHABLE_FOR: Duration = Duration::from_secs(90);

/// What the clients saw, summed over rollouts.
#[derive(Default)]
pub struct Seen {
    pub attempts: AtomicU64,
    pub turns: AtomicU64,
    pub connection_errors: AtomicU64,
    pub error_statuses: AtomicU64,
    pub error_events: AtomicU64,
    pub hang_ups: AtomicU64,
    pub replayed: AtomicU64,
}

/// How a rollout ended.
pub enum Outcome {
    /// Every turn done; the node is checked by the caller.
    Completed,
    /// A turn failed for good after `turns_done` turns; `before` is the session's `/nodes`
    /// from before it, `after` from after.
    Failed {
        turns_done: usize,
        before: String,
        after: String,
        /// The last error the turn got.
        error: String,
    },
}

/// The rollout's shape: its API, whether (chat) its odd turns stream, and when it is doomed
/// (the turn whose every upstream request fails).
pub struct Plan {
    pub index: usize,
    pub api: Api,
    pub turns: usize,
    pub doomed_at: Option<usize>,
    /// One streamed attempt in this many hangs up on purpose.
    pub hang_up_every: u64,
}

/// When a client hangs up a stream on purpose.
#[derive(Clone, Copy, PartialEq, Eq)]
enum HangUp {
    /// After the first bytes.
    Early,
    /// On the event that finishes the reply (the turn is being recorded), before the end.
    Late,
}

/// The result of one attempt at a turn.
enum Attempt {
    Reply(Value),
    /// The proxy could not be reached, or the connection broke.
    Unreachable,
    /// An error status or an error event (its message): nothing was recorded.
    Failed(String),
    /// We hung up on purpose.
    HungUp,
}

pub async fn run(
    client: &reqwest::Client,
    base: &str,
    plan: &Plan,
    uuid: &str,
    seen: &Seen,
) -> Outcome {
    let mut conversation =
        Conversation::new(plan.api, SYSTEM, QUESTIONS[plan.index % QUESTIONS.len()]);
    let mut rng = workload::rollout_rng(plan.index);
    let tools = plan.api.tools(&workload::tools());
    let mut asked = 1;
    let url = plan.api.url(base, uuid);
    for turn in 0..plan.turns {
        let stream = plan.api == Api::Chat && turn % 2 == 1;
        let body = conversation.body(&tools, None, stream);
        let key = format!("rollout-{}-turn-{turn}", plan.index);
        let before = nodes(client, base, uuid).await;
        let reply = match turn_with_retries(
            &Post {
                client,
                url: &url,
                key: &key,
                stream,
            },
            body,
            plan,
            seen,
        )
        .await
        {
            Ok(reply) => reply,
            Err(error) => {
                let after = nodes(client, base, uuid).await;
                return Outcome::Failed {
                    turns_done: turn,
                    before,
                    after,
                    error,
                };
            }
        };
        seen.turns.fetch_add(1, Ordering::Relaxed);
        // The doomed turn's prompt ends with the marker (a tool result's or a question's).
        let doom = |text: String| match plan.doomed_at {
            Some(at) if at == turn + 1 => format!("{text} {DOOM}"),
            _ => text,
        };
        let question = doom(QUESTIONS[(plan.index + asked) % QUESTIONS.len()].to_string());
        let answered = conversation.answer(&reply, &question, |call| {
            doom(workload::tool_result(call, &mut rng))
        });
        asked += usize::from(answered);
    }
    Outcome::Completed
}

/// Where and how a rollout's turn is posted.
struct Post<'a> {
    client: &'a reqwest::Client,
    url: &'a str,
    /// The turn's `Idempotency-Key`.
    key: &'a str,
    stream: bool,
}

async fn turn_with_retries(
    post: &Post<'_>,
    body: Vec<u8>,
    plan: &Plan,
    seen: &Seen,
) -> Result<Value, String> {
    let stream = post.stream;
    let started = Instant::now();
    let mut failures = 0;
    loop {
        let n = seen.attempts.fetch_add(1, Ordering::Relaxed);
        let hang_up = match n % plan.hang_up_every == plan.index as u64 % plan.hang_up_every {
            false => None,
            true if n.is_multiple_of(2) => Some(HangUp::Early),
            true => Some(HangUp::Late),
        };
        let hang_up = hang_up.filter(|_| stream);
        match attempt(post, body.clone(), hang_up, seen).await {
            Attempt::Reply(reply) => return Ok(reply),
            Attempt::HungUp => seen.hang_ups.fetch_add(1, Ordering::Relaxed),
            Attempt::Unreachable => {
                assert!(started.elapsed() < UNREACHABLE_FOR, "the proxy stayed away");
                tokio::time::sleep(Duration::from_millis(50)).await;
                seen.connection_errors.fetch_add(1, Ordering::Relaxed)
            }
            Attempt::Failed(error) => {
                failures += 1;
                if failures == FAILED_ATTEMPTS {
                    return Err(error);
                }
                tokio::time::sleep(Duration::from_millis(20 << failures)).await;
                0
            }
        };
    }
}

async fn attempt(post: &Post<'_>, body: Vec<u8>, hang_up: Option<HangUp>, seen: &Seen) -> Attempt {
    let Post {
        client,
        url,
        key,
        stream,
    } = *post;
    let sent = client
        .post(url)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body)
        .send()
        .await;
    let Ok(response) = sent else {
        return Attempt::Unreachable;
    };
    let status = response.status();
    if status.is_server_error() || status == 429 {
        seen.error_statuses.fetch_add(1, Ordering::Relaxed);
        let body = response.text().await.unwrap_or_default();
        return Attempt::Failed(format!("{status}: {}", error_message(&body)));
    }
    assert!(status.is_success(), "{url}: {status}");
    if response.headers().contains_key("idempotent-replayed") {
        seen.replayed.fetch_add(1, Ordering::Relaxed);
    }
    if !stream {
        return match response.json().await {
            Ok(reply) => Attempt::Reply(reply),
            Err(_) => Attempt::Unreachable,
        };
    }
    let mut events = response.bytes_stream();
    let mut raw = Vec::new();
    while let Some(chunk) = events.next().await {
        let Ok(chunk) = chunk else {
            return Attempt::Unreachable;
        };
        raw.extend_from_slice(&chunk);
        let finishing = || chunk.windows(FINISH.len()).any(|w| w == FINISH);
        match hang_up {
            Some(HangUp::Early) => return Attempt::HungUp,
            Some(HangUp::Late) if finishing() => return Attempt::HungUp,
            _ => {}
        }
    }
    let raw = String::from_utf8_lossy(&raw);
    match assemble_chat_stream(&raw) {
        Some(reply) => Attempt::Reply(reply),
        None => {
            seen.error_events.fetch_add(1, Ordering::Relaxed);
            let event = raw
                .lines()
                .find(|l| l.contains("\"error\""))
                .unwrap_or_default();
            let event = event.trim_start_matches("data: ");
            Attempt::Failed(format!("error event: {}", error_message(event)))
        }
    }
}

/// The message of an error body (every API puts it at `error.message`).
fn error_message(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.chars().take(120).collect())
}

/// A chat stream's reply as the non-streamed reply's shape (`choices[0].message`), or `None`
/// when it carried an error event or ended early.
fn assemble_chat_stream(raw: &str) -> Option<Value> {
    let (mut content, mut calls, mut finished) = (String::new(), Vec::<Value>::new(), false);
    for line in raw.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).ok()?;
        if chunk.get("error").is_some() {
            return None;
        }
        let choice = &chunk["choices"][0];
        if let Some(text) = choice["delta"]["content"].as_str() {
            content.push_str(text);
        }
        for call in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let mut call = call.clone();
            call.as_object_mut()?.remove("index");
            calls.push(call);
        }
        finished |= choice["finish_reason"].is_string();
    }
    if !finished {
        return None;
    }
    let mut message = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        message["tool_calls"] = Value::from(calls);
    }
    Some(json!({"choices": [{"message": message}]}))
}

/// `GET /{uuid}/nodes` as text, waiting out a restart.
pub async fn nodes(client: &reqwest::Client, base: &str, uuid: &str) -> String {
    let started = Instant::now();
    loop {
        let response = client.get(format!("{base}/{uuid}/nodes")).send().await;
        if let Ok(response) = response
            && response.status().is_success()
            && let Ok(text) = response.text().await
        {
            return text;
        }
        assert!(
            started.elapsed() < UNREACHABLE_FOR,
            "nodes of {uuid} unreachable"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates a session, waiting out a restart.
pub async fn create_session(client: &reqwest::Client, base: &str) -> String {
    let started = Instant::now();
    loop {
        let response = client
            .post(format!("{base}/sessions/create"))
            .json(&json!({"tool_parser": "hermes"}))
            .send()
            .await;
        if let Ok(response) = response
            && response.status().is_success()
            && let Ok(created) = response.json::<Value>().await
        {
            return created["uuid"].as_str().unwrap().to_string();
        }
        assert!(
            started.elapsed() < UNREACHABLE_FOR,
            "sessions cannot be created"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
