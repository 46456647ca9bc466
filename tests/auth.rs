//! `--api-key` and `--admin-key`: every route but `/health` and the token viewer's page needs
//! the key (as a bearer token or `x-api-key`), the operator routes the admin key; refusals are
//! 401s in the API's shape.

mod common;

use common::Proxy;
use common::mock_worker::{MockWorker, Sample, Wire};
use serde_json::{Value, json};

async fn call(
    method: reqwest::Method,
    url: String,
    header: Option<(&str, &str)>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new().request(method, url);
    if let Some((name, value)) = header {
        request = request.header(name, value);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn keys_guard_every_route_but_health() {
    let proxy = Proxy::start_with(
        common::char_model_dir(),
        None,
        MockWorker::start(Wire::Sglang),
        |settings| {
            settings.api_key = Some("secret".into());
            settings.admin_key = Some("root".into());
        },
    );
    let url = |path: &str| format!("{}{path}", proxy.url);
    let (post, get) = (reqwest::Method::POST, reqwest::Method::GET);
    let bearer = |key: &'static str| -> Option<(&str, &str)> {
        Some((
            "authorization",
            Box::leak(format!("Bearer {key}").into_boxed_str()),
        ))
    };

    let (status, _) = call(get.clone(), url("/health"), None, None).await;
    assert_eq!(status, 200, "health is open");
    let (status, error) = call(post.clone(), url("/sessions/create"), None, Some(json!({}))).await;
    assert_eq!(status, 401);
    assert_eq!(error["error"]["type"], "authentication_error", "{error}");
    assert_eq!(error["error"]["code"], 401);
    let (status, _) = call(
        post.clone(),
        url("/sessions/create"),
        bearer("wrong"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 401);
    let (status, session) = call(
        post.clone(),
        url("/sessions/create"),
        bearer("secret"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 200, "{session}");
    let uuid = session["uuid"].as_str().unwrap();

    // Anthropic clients send x-api-key, and are refused in Anthropic's shape.
    let messages = url(&format!("/{uuid}/v1/messages"));
    let body = json!({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let (status, error) = call(post.clone(), messages.clone(), None, Some(body.clone())).await;
    assert_eq!(status, 401);
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "authentication_error", "{error}");
    proxy.worker.push_sample(Sample::stop(common::chars("ok")));
    let (status, reply) = call(
        post.clone(),
        messages,
        Some(("x-api-key", "secret")),
        Some(body),
    )
    .await;
    assert_eq!(status, 200, "{reply}");

    // Operator routes: the admin key only.
    let setup = json!({"servers": [{"base_url": proxy.worker.url, "server_type": "sglang"}]});
    for (method, path, body) in [
        (post.clone(), "/setup", Some(setup)),
        (get.clone(), "/servers", None),
        (get.clone(), "/sessions", None),
    ] {
        let (status, _) = call(method.clone(), url(path), bearer("secret"), body.clone()).await;
        assert_eq!(status, 401, "{path} with the API key");
        let (status, data) = call(method, url(path), bearer("root"), body).await;
        assert_eq!(status, 200, "{path} with the admin key: {data}");
    }
    let (status, nodes) = call(
        get.clone(),
        url(&format!("/{uuid}/nodes")),
        bearer("root"),
        None,
    )
    .await;
    assert_eq!(status, 200, "the admin key opens every route: {nodes}");

    // The token viewer's page and files carry no data and are open; what it shows is not.
    for path in ["/ui", "/ui/viewer.js", "/ui/viewer.css"] {
        let response = reqwest::get(url(path)).await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
    }
    let (status, error) = call(get.clone(), url("/ui/secrets"), None, None).await;
    assert_eq!(status, 404, "{error}");
    let view = url(&format!("/{uuid}/view"));
    let (status, _) = call(get.clone(), view.clone(), None, None).await;
    assert_eq!(status, 401);
    let (status, data) = call(get, view, bearer("secret"), None).await;
    assert_eq!(status, 200, "{data}");
    assert_eq!(data["nodes"][0]["messages"][0]["role"], "text", "{data}");
}
