//! The RL control plane: `POST /pause` (new turns wait, or are refused with 429 +
//! `Retry-After`) and `/resume`, `POST /{uuid}/abort` (the backend request dropped, the session
//! unchanged), `POST /weight_version` (recorded on turns whose backend reports none).

mod common;

use common::mock_worker::{Reply, Sample, Wire};
use common::{Proxy, assert_openai_error, char_model_dir, chars};
use serde_json::{Value, json};
use std::time::Duration;

fn turn_body() -> Value {
    json!({"messages": [{"role": "user", "content": "go"}]})
}

#[tokio::test]
async fn a_pause_holds_new_turns_until_resume() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let (status, paused) = proxy
        .post("/pause", json!({"reason": "weight update"}))
        .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["paused"]["mode"], "wait");
    let (_, health) = proxy.get("/health").await;
    assert_eq!(health["paused"]["reason"], "weight update");
    proxy.worker.push_sample(Sample::stop(chars("after")));
    proxy.worker.push_sample(Sample::stop(chars("streamed")));
    let whole = proxy.chat(&uuid, turn_body());
    let streamed = async {
        let other = proxy.session(json!({})).await;
        proxy.chat_stream(&other, turn_body()).await
    };
    let resume = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let (_, health) = proxy.get("/health").await;
        assert_eq!(health["turns_under_way"], 2, "both held: {health}");
        assert_eq!(health["turns_at_backend"], 0, "{health}");
        assert!(
            proxy.worker.requests().is_empty(),
            "nothing reached the backend"
        );
        proxy.post("/resume", json!({})).await
    };
    let ((status, reply), (stream_status, raw, _), (_, resumed)) =
        futures::join!(whole, streamed, resume);
    assert_eq!(status, 200, "{reply}");
    assert_eq!(resumed["resumed"], true);
    assert_eq!(stream_status, 200);
    assert!(
        raw.starts_with(": keep-alive\n\n"),
        "kept alive while paused: {raw}"
    );
    assert!(raw.ends_with("data: [DONE]\n\n"), "{raw}");
    assert_eq!(proxy.get("/health").await.1["paused"], Value::Null);
}

#[tokio::test]
async fn a_reject_pause_refuses_with_retry_after_in_each_api_shape() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    proxy
        .post("/pause", json!({"mode": "reject", "reason": "swap"}))
        .await;
    let response = reqwest::Client::new()
        .post(format!("{}/{uuid}/v1/chat/completions", proxy.url))
        .json(&turn_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "5");
    let body: Value = response.json().await.unwrap();
    assert_openai_error(&body);
    assert!(body["error"]["message"].as_str().unwrap().contains("swap"));
    let (status, body) = proxy
        .post(
            &format!("/{uuid}/v1/messages"),
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!((status, body["type"].clone()), (429, json!("error")));
    let (status, _, _) = proxy.chat_stream(&uuid, turn_body()).await;
    assert_eq!(status, 429, "refused before the stream begins");
    assert!(proxy.nodes(&uuid).await.is_empty());
    assert!(proxy.worker.requests().is_empty());
    for bad in [
        json!({"mode": "sleep"}),
        json!({"reason": 3}),
        json!({"pause": true}),
    ] {
        let (status, body) = proxy.post("/pause", bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
}

#[tokio::test]
async fn abort_drops_the_backend_request_and_leaves_the_session_as_it_was() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let (_, nothing) = proxy.post(&format!("/{uuid}/abort"), json!({})).await;
    assert_eq!(nothing["aborted"], false);

    proxy
        .worker
        .push(Reply::Delayed(5_000, vec![Sample::stop(chars("late"))]));
    let turn = proxy.chat(&uuid, turn_body());
    let abort = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.post(&format!("/{uuid}/abort"), json!({})).await
    };
    let started = std::time::Instant::now();
    let ((status, body), (_, aborted)) = futures::join!(turn, abort);
    assert_eq!(
        (status, aborted["aborted"].clone()),
        (409, json!(true)),
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "not left to run"
    );
    assert!(proxy.nodes(&uuid).await.is_empty());

    // Streamed: an error event, the backend stream cancelled.
    proxy.worker.set_token_delay(50);
    proxy
        .worker
        .push_sample(Sample::stop(chars("a long streamed answer")));
    let streamed = proxy.chat_stream(&uuid, turn_body());
    let abort = async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        proxy.post(&format!("/{uuid}/abort"), json!({})).await
    };
    let ((status, raw, _), (_, aborted)) = futures::join!(streamed, abort);
    assert_eq!((status, aborted["aborted"].clone()), (200, json!(true)));
    assert!(raw.contains("aborted"), "{raw}");
    assert!(
        proxy.nodes(&uuid).await.is_empty(),
        "the session is as it was"
    );
    for _ in 0..50 {
        if proxy.worker.cancelled_streams() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(proxy.worker.cancelled_streams(), 1);
    // The next turn runs as usual.
    let (status, _) = proxy
        .turn(&uuid, Sample::stop(chars("ok")), turn_body())
        .await;
    assert_eq!(status, 200);
}

/// `"in_flight": "keep"` asks each backend to freeze its requests in place; one without such a
/// control (a vLLM started without `VLLM_SERVER_DEV_MODE`) says so, and the proxy's own pause
/// still holds new turns. A bad `in_flight` is refused and changes nothing.
#[tokio::test]
async fn a_pause_that_keeps_turns_in_flight_asks_the_backends() {
    let proxy = Proxy::start(char_model_dir(), None, Wire::Vllm);
    let (status, body) = proxy.post("/pause", json!({"in_flight": "freeze"})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(proxy.get("/health").await.1["paused"], Value::Null);
    let (status, body) = proxy.post("/pause", json!({"in_flight": "keep"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["paused"]["in_flight"], "keep");
    let url = proxy.worker.url.clone();
    assert_eq!(body["backends"], json!([{"base_url": url, "held": false}]));
    let (status, body) = proxy.post("/resume", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["backends"],
        json!([{"base_url": url, "released": false}])
    );
    // A plain pause and resume leave the backends alone.
    proxy.post("/pause", json!({})).await;
    let (_, body) = proxy.post("/resume", json!({})).await;
    assert_eq!(body["backends"], json!([]));
    // A plain pause in place of a freezing one lets the frozen turns go on at once.
    proxy.post("/pause", json!({"in_flight": "keep"})).await;
    let (_, body) = proxy.post("/pause", json!({"mode": "reject"})).await;
    assert_eq!(
        body["backends"],
        json!([{"base_url": url, "released": false}])
    );
    let (_, body) = proxy.post("/resume", json!({})).await;
    assert_eq!(body["backends"], json!([]));
}

#[tokio::test]
async fn the_announced_weight_version_is_recorded_where_the_backend_reports_none() {
    // vLLM's completions report no weight version.
    let proxy = Proxy::start(char_model_dir(), None, Wire::Vllm);
    let uuid = proxy.session(json!({})).await;
    let (status, body) = proxy
        .post("/weight_version", json!({"weight_version": "step-700"}))
        .await;
    assert_eq!(status, 200, "{body}");
    // A vLLM without its dev-mode routes stamps no versions itself: it says so.
    assert_eq!(body["backends"][0]["weight_version"], false, "{body}");
    assert_eq!(proxy.get("/health").await.1["weight_version"], "step-700");
    proxy
        .turn(&uuid, Sample::stop(chars("one")), turn_body())
        .await;
    let node = &proxy.nodes(&uuid).await[0];
    assert_eq!(node["metadata"]["turns"][0]["weight_version"], "step-700");
    let (status, _) = proxy
        .post("/weight_version", json!({"weight_version": 7}))
        .await;
    assert_eq!(status, 400);
}
