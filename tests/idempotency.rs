//! `Idempotency-Key`: a retried turn gets the recorded reply, never a second sample or a fork.

mod common;

use common::mock_worker::{Reply, Sample};
use common::{Proxy, chars};
use serde_json::{Value, json};

async fn post(proxy: &Proxy, path: &str, key: &str, body: &Value) -> (u16, bool, String) {
    let response = reqwest::Client::new()
        .post(format!("{}{path}", proxy.url))
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let replayed = response.headers().contains_key("idempotent-replayed");
    (
        response.status().as_u16(),
        replayed,
        response.text().await.unwrap(),
    )
}

#[tokio::test]
async fn a_retry_gets_the_recorded_reply_and_the_node_does_not_fork() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/chat/completions");
    let body = json!({"messages": [{"role": "user", "content": "a"}]});
    proxy.worker.push_sample(Sample::stop(chars("first")));
    proxy.worker.push_sample(Sample::stop(chars("second")));
    let (status, replayed, first) = post(&proxy, &path, "k1", &body).await;
    assert_eq!((status, replayed), (200, false));
    let (status, replayed, again) = post(&proxy, &path, "k1", &body).await;
    assert_eq!((status, replayed), (200, true));
    assert_eq!(again, first, "the very same reply");
    assert_eq!(proxy.worker.requests().len(), 1, "sampled once");
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(
        (nodes.len(), &nodes[0]["metadata"]["num_turns"]),
        (1, &json!(1))
    );

    let other = json!({"messages": [{"role": "user", "content": "b"}]});
    let (status, _, error) = post(&proxy, &path, "k1", &other).await;
    assert_eq!(status, 422, "{error}");

    // Streamed: the whole event stream is replayed.
    let streamed = json!({"messages": [{"role": "user", "content": "c"}], "stream": true});
    let (status, _, stream) = post(&proxy, &path, "k2", &streamed).await;
    assert_eq!(status, 200);
    assert!(stream.ends_with("data: [DONE]\n\n"));
    let (_, replayed, again) = post(&proxy, &path, "k2", &streamed).await;
    assert!(replayed);
    assert_eq!(again, stream);
    assert_eq!(proxy.worker.requests().len(), 2);
}

#[tokio::test]
async fn concurrent_retries_wait_for_the_first_and_failures_are_not_kept() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/chat/completions");
    let body = json!({"messages": [{"role": "user", "content": "a"}]});
    proxy
        .worker
        .push(Reply::Delayed(300, vec![Sample::stop(chars("slow"))]));
    let (a, b) = futures::join!(
        post(&proxy, &path, "k", &body),
        post(&proxy, &path, "k", &body)
    );
    assert_eq!(a.2, b.2, "both get the one reply");
    assert!(a.1 != b.1, "one ran, the other was replayed");
    assert_eq!(proxy.worker.requests().len(), 1);

    // A failed turn keeps nothing: its retry runs.
    proxy.worker.push(Reply::Error(400, "prompt too long"));
    let next = json!({"messages": [{"role": "user", "content": "b"}]});
    let (status, _, _) = post(&proxy, &path, "k-fail", &next).await;
    assert_eq!(status, 400);
    proxy.worker.push_sample(Sample::stop(chars("ok")));
    let (status, replayed, _) = post(&proxy, &path, "k-fail", &next).await;
    assert_eq!((status, replayed), (200, false));

    // So does a stream that failed after its 200 (the error arrives as an event).
    let streamed = json!({"messages": [{"role": "user", "content": "c"}], "stream": true});
    proxy
        .worker
        .push(Reply::CutStream(2, Sample::stop(chars("cut short"))));
    let (status, _, failed) = post(&proxy, &path, "k-cut", &streamed).await;
    assert_eq!(status, 200);
    assert!(failed.contains("\"error\""), "{failed}");
    proxy.worker.push_sample(Sample::stop(chars("whole")));
    let (status, replayed, retried) = post(&proxy, &path, "k-cut", &streamed).await;
    assert_eq!((status, replayed), (200, false), "the retry runs anew");
    assert!(!retried.contains("\"error\"") && retried.contains("\"finish_reason\":\"stop\""));
}

#[tokio::test]
async fn a_refused_request_binds_no_key_and_its_corrected_retry_runs() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/chat/completions");
    let good = json!({"messages": [{"role": "user", "content": "a"}]});
    let mut refused = good.clone();
    refused["temperature"] = json!(-1);
    let (status, _, error) = post(&proxy, &path, "k", &refused).await;
    assert_eq!(status, 400, "{error}");
    proxy.worker.push_sample(Sample::stop(chars("ok")));
    let (status, replayed, first) = post(&proxy, &path, "k", &good).await;
    assert_eq!((status, replayed), (200, false), "{first}");
    // Now the key is bound: to this request.
    let (status, replayed, again) = post(&proxy, &path, "k", &good).await;
    assert_eq!((status, replayed, &again), (200, true, &first));
    let (status, _, error) = post(&proxy, &path, "k", &refused).await;
    assert_eq!(status, 422, "{error}");

    // On the Anthropic route the 422 is in Anthropic's shape.
    let messages = format!("/{uuid}/v1/messages");
    let body = json!({"max_tokens": 8, "messages": [{"role": "user", "content": "b"}]});
    proxy.worker.push_sample(Sample::stop(chars("fine")));
    let (status, _, _) = post(&proxy, &messages, "m", &body).await;
    assert_eq!(status, 200);
    let mut other = body.clone();
    other["max_tokens"] = json!(9);
    let (status, _, error) = post(&proxy, &messages, "m", &other).await;
    assert_eq!(status, 422);
    let error: Value = serde_json::from_str(&error).unwrap();
    assert_eq!(error["type"], "error", "{error}");
    assert_eq!(proxy.worker.requests().len(), 2, "each turn sampled once");
}
