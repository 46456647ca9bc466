//! Inputs and faults that used to hurt: each answered with a clear error in the API's shape,
//! the session left as it was.

mod common;

use common::mock_worker::{Reply, Sample};
use common::{Proxy, assert_openai_error, chars, qwen3_proxy};
use serde_json::json;

#[tokio::test]
async fn completion_ids_outside_the_vocabulary_are_refused_at_the_edge() {
    let (tok, proxy) = qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    let path = format!("/{uuid}/v1/completions");
    for id in [tok.vocab_size() as u64, 3_000_000_000] {
        let (status, data) = proxy.post(&path, json!({"prompt": [1, 2, id]})).await;
        assert_eq!(status, 400, "{data}");
        assert_openai_error(&data);
        let message = data["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("token id {id}")), "{message}");
    }
    let (status, data) = proxy.post(&path, json!({"prompt": [1, -5]})).await;
    assert_eq!(status, 400, "{data}");
    assert!(
        proxy.worker.requests().is_empty(),
        "nothing reached the backend"
    );
    assert!(proxy.nodes(&uuid).await.is_empty());
}

#[tokio::test]
async fn out_of_range_settings_and_parameters_are_400s() {
    let proxy = Proxy::atropos();
    for server in [
        json!({"base_url": "http://x:1", "timeout": 1e20}),
        json!({"base_url": "http://x:1", "timeout": -1}),
        json!({"base_url": "http://x:1", "num_max_requests_at_once": 0}),
        json!({"base_url": ""}),
    ] {
        let (status, data) = proxy.post("/setup", json!({"servers": [server]})).await;
        assert_eq!(status, 400, "{server} → {data}");
        assert_openai_error(&data);
    }
    let (_, servers) = proxy.get("/servers").await;
    assert_eq!(
        servers["servers"].as_array().unwrap().len(),
        1,
        "the list is unchanged"
    );

    let uuid = proxy.session(json!({})).await;
    let messages = json!([{"role": "user", "content": "hi"}]);
    let (status, data) = proxy
        .chat(&uuid, json!({"messages": messages, "temperature": 150}))
        .await;
    assert_eq!(status, 400);
    let message = data["error"]["message"].as_str().unwrap();
    assert!(message.contains("between 0 and 100"), "{message}");
    let path = format!("/{uuid}/v1/completions");
    let (status, data) = proxy
        .post(&path, json!({"prompt": "a", "logprobs": 1000}))
        .await;
    assert_eq!(status, 400, "{data}");
    assert!(proxy.worker.requests().is_empty());
}

#[tokio::test]
async fn seeds_near_the_top_of_the_range_do_not_overflow() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    for _ in 0..3 {
        proxy.worker.push_sample(Sample::stop(chars("ok")));
    }
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "n": 3, "seed": i64::MAX, "stream": true});
    let (status, raw, _) = proxy
        .post_stream(&format!("/{uuid}/v1/chat/completions"), body)
        .await;
    assert_eq!(status, 200, "{raw}");
    let seeds: Vec<_> = proxy
        .worker
        .requests()
        .iter()
        .map(|r| r["sampling_params"]["sampling_seed"].clone())
        .collect();
    assert_eq!(seeds.len(), 3, "{seeds:?}");
}

#[tokio::test]
async fn health_says_degraded_with_no_healthy_backend() {
    let proxy = Proxy::atropos();
    let (status, health) = proxy.get("/health").await;
    assert_eq!((status, &health["status"]), (200, &json!("ok")));
    let (status, _) = proxy
        .post(
            "/setup",
            json!({"servers": [{"base_url": "http://127.0.0.1:9", "server_type": "sglang"}]}),
        )
        .await;
    assert_eq!(status, 200);
    let start = std::time::Instant::now();
    loop {
        let (status, health) = proxy.get("/health").await;
        if status == 503 {
            assert_eq!(health["status"], "degraded");
            assert_eq!(health["healthy_servers"], 0);
            break;
        }
        assert!(start.elapsed().as_secs() < 10, "{health}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_backend_refusing_the_proxys_key_is_a_502_not_the_clients_fault() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    for status in [401, 403] {
        proxy.worker.push(Reply::Error(status, "bad key"));
        let (got, data) = proxy
            .chat(
                &uuid,
                json!({"messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(got, 502, "{data}");
        let message = data["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("refused the proxy's credentials"),
            "{message}"
        );
    }
    assert!(proxy.nodes(&uuid).await.is_empty());
}

/// A backend whose stream ends mid-sample: the client gets an error event, then `[DONE]`, and
/// the session is exactly as before the turn.
#[tokio::test]
async fn a_backend_stream_cut_mid_sample_is_an_error_event_and_changes_nothing() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(chars("fine")));
    let messages = json!([{"role": "user", "content": "a"}]);
    let (status, _) = proxy.chat(&uuid, json!({"messages": messages})).await;
    assert_eq!(status, 200);
    let before = proxy.nodes(&uuid).await;
    // Every retry of the pool is cut too.
    for _ in 0..3 {
        proxy
            .worker
            .push(Reply::CutStream(3, Sample::stop(chars("a longer answer"))));
    }
    let next = json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "fine"}, {"role": "user", "content": "b"}]});
    let (status, raw, events) = proxy.chat_stream(&uuid, next).await;
    assert_eq!(status, 200, "{raw}");
    let error = &events[events.len() - 2];
    assert_eq!(error["error"]["type"], "upstream_error", "{raw}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("before the sample finished")
    );
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert_eq!(proxy.nodes(&uuid).await, before, "the session is unchanged");
}

/// A streamed turn that waits in the pool's queue gets its 200 and keep-alives after a second;
/// when the queue gives up on it, the refusal arrives as an error event.
#[tokio::test]
async fn a_queued_stream_refused_after_its_200_gets_an_error_event() {
    let worker = common::mock_worker::MockWorker::start(common::mock_worker::Wire::Sglang);
    let url = worker.url.clone();
    let proxy = Proxy::start_with(common::char_model_dir(), None, worker, move |settings| {
        settings.backends.clear();
        settings.config.servers = vec![rollout_proxy::backend::BackendConfig {
            num_max_requests_at_once: 1,
            ..rollout_proxy::backend::BackendConfig::new(
                &url,
                rollout_proxy::backend::BackendKind::Sglang,
            )
        }];
        settings.config.pool.queue_timeout = 1.5;
    });
    let (first, second) = (
        proxy.session(json!({})).await,
        proxy.session(json!({})).await,
    );
    proxy
        .worker
        .push(Reply::Delayed(4000, vec![Sample::stop(chars("slow"))]));
    let messages = json!({"messages": [{"role": "user", "content": "a"}]});
    let holding = proxy.chat(&first, messages.clone());
    let queued = async {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        proxy.chat_stream(&second, messages.clone()).await
    };
    let ((status, _), (queued_status, raw, events)) = futures::join!(holding, queued);
    assert_eq!(status, 200);
    assert_eq!(queued_status, 200, "the 200 came before the refusal: {raw}");
    assert!(raw.contains(": keep-alive"), "{raw}");
    let error = &events[events.len() - 2];
    assert_eq!(error["error"]["code"], 503, "{raw}");
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert!(proxy.nodes(&second).await.is_empty());
}
