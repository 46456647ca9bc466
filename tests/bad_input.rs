//! Bad input gets an OpenAI-shaped error and leaves the session exactly as it was; backend
//! failures map to 502/503/504 and change nothing.

mod common;

use common::mock_worker::{Reply, Sample, Wire};
use common::{Proxy, assert_openai_error, char_model_dir, chars, fixture_model};
use serde_json::json;

#[tokio::test]
async fn bad_requests_are_400_and_change_nothing() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    proxy
        .turn(
            &uuid,
            Sample::stop(chars("ok")),
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    let before = proxy.nodes(&uuid).await;
    let path = format!("/{uuid}/v1/chat/completions");
    for body in [
        "{not json".to_string(),
        json!({"messages": "hi"}).to_string(),
        json!({"messages": [{"role": "wizard", "content": "x"}]}).to_string(),
        json!({"messages": [{"role": "user", "content": 7}]}).to_string(),
        json!({"messages": [{"role": "user", "content": "x"}], "n": 0}).to_string(),
        json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).to_string(),
        json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})
            .to_string(),
        json!({"messages": [{"role": "user", "content": "x"}], "tools": {"type": "function"}})
            .to_string(),
        json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"})
            .to_string(),
        json!({"messages": []}).to_string(),
    ] {
        let (status, data) = proxy.post_raw(&path, body.clone()).await;
        assert_eq!(status, 400, "{body} → {data}");
        assert_openai_error(&data);
    }
    let (status, data) = proxy
        .post("/sessions/create", json!({"tool_parser": "nope"}))
        .await;
    assert_eq!(status, 400);
    assert_openai_error(&data);
    // A body must be an object: serde would read `[]` as a struct of defaults.
    let (_, listed) = proxy.get("/sessions").await;
    for body in ["[]", "[false]", "5", "\"x\"", "null"] {
        let (status, data) = proxy.post_raw("/sessions/create", body.into()).await;
        assert_eq!(status, 400, "{body} → {data}");
        assert_openai_error(&data);
    }
    assert_eq!(
        proxy.get("/sessions").await.1,
        listed,
        "no session was created"
    );
    let (status, data) = proxy
        .post_raw(
            &path,
            format!(
                "{{\"messages\": [{{\"role\": \"user\", \"content\": \"{}\"}}]}}",
                "x".repeat(2 << 20)
            ),
        )
        .await;
    assert_eq!(status, 413, "{data}");
    assert_openai_error(&data);
    assert_eq!(proxy.nodes(&uuid).await, before);
    assert_eq!(
        proxy.worker.requests().len(),
        1,
        "no bad request reached the backend"
    );
    let (status, data) = proxy.get("/no/such/route").await;
    assert_eq!(status, 404);
    assert_openai_error(&data);
}

#[tokio::test]
async fn template_raise_exception_is_400_with_its_message() {
    let dir = fixture_model("gemma3");
    let proxy = Proxy::start(dir, None, Wire::Sglang);
    let uuid = proxy.session(json!({})).await;
    let (status, data) = proxy
        .chat(&uuid, json!({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}))
        .await;
    assert_eq!(status, 400);
    assert!(
        data["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Conversation roles must alternate"),
        "{data}"
    );
    assert!(proxy.worker.requests().is_empty());
}

#[tokio::test]
async fn backend_failures_map_to_gateway_errors_and_keep_the_session() {
    let proxy = Proxy::start(char_model_dir(), None, Wire::Vllm);
    // Point the single backend at the mock, with a short timeout.
    let (status, _) = proxy
        .post("/setup", json!({"servers": [{"base_url": format!("{}/v1", proxy.worker.url), "server_type": "vllm", "timeout": 0.5}]}))
        .await;
    assert_eq!(status, 200);
    let uuid = proxy.session(json!({})).await;
    proxy.worker.push_sample(Sample::stop(chars("fine")));
    let ok = json!({"messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(proxy.chat(&uuid, ok.clone()).await.0, 200);
    let before = proxy.nodes(&uuid).await;
    let next = json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "fine"}, {"role": "user", "content": "more"}]});
    // 503 is retried (twice by default) before it reaches the client; the others are not.
    for (replies, expected) in [
        (vec![Reply::Error(500, "boom")], 502),
        (vec![Reply::Error(503, "overloaded"); 3], 503),
        (vec![Reply::Error(400, "prompt too long")], 400),
        (vec![Reply::SleepMs(1500)], 504),
    ] {
        replies.into_iter().for_each(|r| proxy.worker.push(r));
        let (status, data) = proxy.chat(&uuid, next.clone()).await;
        assert_eq!(status, expected, "{data}");
        assert_openai_error(&data);
        assert_eq!(
            proxy.nodes(&uuid).await,
            before,
            "a failed turn changes nothing"
        );
        // Four failures in a row open the backend's circuit; health probes close it again.
        proxy.wait_until_healthy().await;
    }
    // A redirect is not followed: a 502 that names where the backend pointed.
    proxy
        .worker
        .push(Reply::Redirect("http://elsewhere:9/v1/completions"));
    let (status, data) = proxy.chat(&uuid, next.clone()).await;
    assert_eq!(status, 502, "{data}");
    assert_openai_error(&data);
    let message = data["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("HTTP 307: redirect to http://elsewhere:9/v1/completions")
            && message.contains("not followed"),
        "{data}"
    );
    assert_eq!(proxy.nodes(&uuid).await, before);
    // Unreachable backend → 502, saying why.
    proxy
        .post(
            "/setup",
            json!({"servers": [{"base_url": "http://127.0.0.1:9", "server_type": "sglang"}]}),
        )
        .await;
    let (status, data) = proxy.chat(&uuid, next.clone()).await;
    assert_eq!(status, 502, "{data}");
    let message = data["error"]["message"].as_str().unwrap().to_lowercase();
    assert!(message.contains("refused"), "{data}");
    let (_, servers) = proxy.get("/servers").await;
    assert_eq!(servers["servers"][0]["healthy"], false);
    assert_eq!(proxy.nodes(&uuid).await, before);
    // Back on the mock, the same turn now extends the node.
    proxy
        .post(
            "/setup",
            json!({"servers": [{"base_url": proxy.worker.url, "server_type": "vllm"}]}),
        )
        .await;
    proxy.worker.push_sample(Sample::stop(chars("again")));
    assert_eq!(proxy.chat(&uuid, next).await.0, 200);
    assert_eq!(proxy.nodes(&uuid).await.len(), 1);
}

#[tokio::test]
async fn a_forced_call_needing_a_huge_grammar_is_refused() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    // Non-ASCII names all sanitise to one rule name: naming them once took quadratic time.
    let properties: serde_json::Map<String, serde_json::Value> = (0..20_000)
        .map(|i| (cjk_name(i), json!({"type": "string"})))
        .collect();
    let body = json!({"messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f",
            "parameters": {"type": "object", "properties": properties}}}],
        "tool_choice": "required"});
    let (status, data) = proxy
        .post(&format!("/{uuid}/v1/chat/completions"), body)
        .await;
    assert_eq!(status, 400, "{data}");
    assert_openai_error(&data);
    assert!(
        data["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("tool_choice: "),
        "{data}"
    );
    assert!(proxy.worker.requests().is_empty());
    assert!(proxy.nodes(&uuid).await.is_empty());
}

/// A property name of CJK characters only: every one sanitises to the same rule name.
fn cjk_name(i: u32) -> String {
    let char = |n: u32| char::from_u32(0x4E00 + n).expect("a CJK ideograph");
    format!("{}{}", char(i % 20_000), char(i / 20_000))
}
