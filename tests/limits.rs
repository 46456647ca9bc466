//! Bounded state: `--max-sessions`, `--session-ttl` and `--max-session-tokens`.

mod common;

use common::mock_worker::{MockWorker, Sample, Wire};
use common::{Proxy, assert_openai_error, char_model_dir, chars};
use rollout_proxy::session::SessionLimits;
use serde_json::json;
use std::time::Duration;

fn proxy(tweak: impl FnOnce(&mut rollout_proxy::config::Settings)) -> Proxy {
    Proxy::start_with(
        char_model_dir(),
        None,
        MockWorker::start(Wire::Sglang),
        tweak,
    )
}

#[tokio::test]
async fn creating_past_max_sessions_is_a_429_until_one_is_deleted() {
    let proxy = proxy(|s| {
        s.session_limits = SessionLimits {
            max_sessions: Some(2),
            ttl: None,
        }
    });
    let first = proxy.session(json!({})).await;
    proxy.session(json!({})).await;
    let (status, data) = proxy.post("/sessions/create", json!({})).await;
    assert_eq!(status, 429, "{data}");
    assert_openai_error(&data);
    assert!(
        data["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-sessions")
    );
    let (status, _) = proxy.delete(&format!("/{first}")).await;
    assert_eq!(status, 200);
    proxy.session(json!({})).await;
}

#[tokio::test]
async fn an_idle_session_expires_and_its_routes_say_so() {
    let proxy = proxy(|s| {
        s.session_limits = SessionLimits {
            max_sessions: Some(1),
            ttl: Some(Duration::from_millis(600)),
        }
    });
    let idle = proxy.session(json!({})).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, data) = proxy.get(&format!("/{idle}/nodes")).await;
    assert_eq!(status, 404, "{data}");
    let message = data["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("expired") && message.contains("--session-ttl"),
        "{message}"
    );
    let (status, _) = proxy
        .chat(
            &idle,
            json!({"messages": [{"role": "user", "content": "a"}]}),
        )
        .await;
    assert_eq!(status, 404);
    let (_, health) = proxy.get("/health").await;
    assert_eq!(health["sessions"], 0);
    // Its place is free again (the limit is one session), and a used session stays.
    let busy = proxy.session(json!({})).await;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (status, _) = proxy.get(&format!("/{busy}/nodes")).await;
        assert_eq!(status, 200, "a session in use does not expire");
    }
}

#[tokio::test]
async fn max_session_tokens_lowers_max_tokens_and_refuses_a_full_prompt() {
    let proxy = proxy(|s| s.max_session_tokens = Some(100));
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(chars("ok")));
    let (status, _) = proxy
        .chat(
            &uuid,
            json!({"messages": [{"role": "user", "content": "a"}], "max_tokens": 500}),
        )
        .await;
    assert_eq!(status, 200);
    let prompt = proxy.worker.last_prompt().len();
    let sent = &proxy.worker.requests()[0]["sampling_params"]["max_new_tokens"];
    assert_eq!(sent, 100 - prompt, "the node cannot grow past the limit");
    let before = proxy.nodes(&uuid).await;
    let long = "x".repeat(200);
    let (status, data) = proxy
        .chat(
            &uuid,
            json!({"messages": [{"role": "user", "content": long}]}),
        )
        .await;
    assert_eq!(status, 400, "{data}");
    let message = data["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("--max-session-tokens") && message.contains("100"),
        "{message}"
    );
    assert_eq!(proxy.nodes(&uuid).await, before, "the session is unchanged");
}
