//! What a web page in the user's browser can make a proxy without keys (the loopback default)
//! do: nothing. Routes that change state refuse requests from another origin or site, bodies
//! that are not `application/json`, and a loopback proxy answers only loopback host names (DNS
//! rebinding). Every reply carries the security headers. `tests/viewer.rs` tries the same
//! from a page in a real Chromium.

mod common;

use common::Proxy;
use common::mock_worker::{MockWorker, Wire};
use serde_json::{Value, json};

/// Sends `method path` with `headers` and a raw `body`; the status and the JSON reply.
async fn send(
    proxy: &Proxy,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new().request(method, format!("{}{path}", proxy.url));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.body(body.to_string());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

const JSON: (&str, &str) = ("content-type", "application/json");

/// The proxy's state a page would change: its backends, whether it is paused, its sessions.
async fn state(proxy: &Proxy) -> Value {
    let (_, servers) = proxy.get("/servers").await;
    let (_, health) = proxy.get("/health").await;
    let (_, sessions) = proxy.get("/sessions").await;
    json!({"servers": servers, "paused": health["paused"], "sessions": sessions})
}

#[tokio::test]
async fn pages_of_other_sites_change_nothing() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let before = state(&proxy).await;
    let own = proxy.url.clone();
    let post = reqwest::Method::POST;
    let setup = r#"{"servers": [{"base_url": "http://evil.example", "server_type": "vllm"}]}"#;
    // What a cross-site form or a no-cors fetch can send: text/plain, form data, no type.
    for (path, headers, body) in [
        ("/setup", vec![("content-type", "text/plain")], Some(setup)),
        (
            "/setup",
            vec![("content-type", "text/plain;charset=UTF-8")],
            Some(setup),
        ),
        (
            "/setup",
            vec![("content-type", "application/x-www-form-urlencoded")],
            Some(setup),
        ),
        (
            "/setup",
            vec![("content-type", "multipart/form-data; boundary=x")],
            Some(setup),
        ),
        ("/setup", vec![], Some(setup)),
        (
            "/sessions/create",
            vec![("content-type", "text/plain")],
            Some("{}"),
        ),
        ("/pause", vec![("content-type", "text/plain")], Some("{}")),
    ] {
        let (status, error) = send(&proxy, post.clone(), path, &headers, body).await;
        assert_eq!(status, 415, "{path} {headers:?}: {error}");
        common::assert_openai_error(&error);
    }
    // JSON from another origin, or marked by the browser as sent from another site.
    for (path, headers) in [
        ("/pause", vec![("origin", "http://evil.example")]),
        ("/pause", vec![("origin", "null")]),
        ("/pause", vec![("origin", "http://127.0.0.1:1")]),
        ("/pause", vec![("sec-fetch-site", "cross-site")]),
        ("/pause", vec![("sec-fetch-site", "same-site")]),
        ("/setup", vec![("origin", "http://evil.example"), JSON]),
        (
            "/sessions/create",
            vec![("origin", "http://evil.example"), JSON],
        ),
    ] {
        let body = match path {
            "/setup" => Some(setup),
            _ => None,
        };
        let (status, error) = send(&proxy, post.clone(), path, &headers, body).await;
        assert_eq!(status, 403, "{path} {headers:?}: {error}");
        assert_eq!(error["error"]["type"], "permission_error", "{error}");
    }
    // An <img> pointed at an export that deletes.
    let (status, _) = send(
        &proxy,
        reqwest::Method::GET,
        "/export?delete=true",
        &[
            ("sec-fetch-site", "cross-site"),
            ("sec-fetch-dest", "image"),
        ],
        None,
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = send(
        &proxy,
        reqwest::Method::DELETE,
        &format!("/{uuid}"),
        &[("origin", "http://evil.example")],
        None,
    )
    .await;
    assert_eq!(status, 403);
    // A turn from another site, in each API's shape.
    let (status, error) = send(
        &proxy,
        post.clone(),
        &format!("/{uuid}/v1/messages"),
        &[("content-type", "text/plain")],
        Some(r#"{"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}"#),
    )
    .await;
    assert_eq!((status, &error["type"]), (415, &json!("error")), "{error}");
    assert_eq!(state(&proxy).await, before, "nothing changed");
    assert!(proxy.worker.requests().is_empty());

    // The proxy's own pages, and clients that are not browsers, go on as before: JSON with
    // the proxy's own origin, an empty body with no type.
    let (status, paused) = send(
        &proxy,
        post.clone(),
        "/pause",
        &[("origin", &own), JSON],
        Some("{}"),
    )
    .await;
    assert_eq!(status, 200, "{paused}");
    let (status, _) = send(&proxy, post.clone(), "/resume", &[], None).await;
    assert_eq!(status, 200);
    let (status, _) = send(
        &proxy,
        post,
        "/sessions/create",
        &[
            ("content-type", "application/json; charset=utf-8"),
            ("sec-fetch-site", "same-origin"),
        ],
        Some("{}"),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_loopback_proxy_answers_loopback_names_only() {
    let proxy = Proxy::atropos();
    let get = reqwest::Method::GET;
    // A page whose own name was made to resolve to 127.0.0.1 sends its name as the host.
    let (status, error) = send(
        &proxy,
        get.clone(),
        "/sessions",
        &[("host", "evil.example")],
        None,
    )
    .await;
    assert_eq!(status, 403, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--allow-host"),
        "{error}"
    );
    let port = proxy.url.rsplit(':').next().unwrap();
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let (status, data) = send(&proxy, get.clone(), "/sessions", &[("host", &host)], None).await;
        assert_eq!(status, 200, "{host}: {data}");
    }
    let (status, _) = send(&proxy, get, "/health", &[("host", "evil.example")], None).await;
    assert_eq!(status, 200, "public routes carry nothing");
}

#[tokio::test]
async fn allowed_origins_and_hosts_are_let_in() {
    let proxy = Proxy::start_with(
        common::char_model_dir(),
        None,
        MockWorker::start(Wire::Sglang),
        |settings| {
            settings.allow_origins = vec!["https://trainer.example".into()];
            settings.allow_hosts = vec!["proxy.internal".into()];
        },
    );
    let post = reqwest::Method::POST;
    let from = |origin| [("origin", origin), ("host", "proxy.internal:80"), JSON];
    let (status, data) = send(
        &proxy,
        post.clone(),
        "/sessions/create",
        &from("https://trainer.example"),
        Some("{}"),
    )
    .await;
    assert_eq!(status, 200, "{data}");
    let (status, _) = send(
        &proxy,
        post,
        "/sessions/create",
        &from("https://other.example"),
        Some("{}"),
    )
    .await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn every_reply_carries_the_security_headers() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    for path in [
        "/health".to_string(),
        format!("/{uuid}/nodes"),
        "/no/such/route".into(),
        "/ui".into(),
        "/ui/viewer.js".into(),
    ] {
        let response = reqwest::get(format!("{}{path}", proxy.url)).await.unwrap();
        let headers = response.headers();
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(headers["x-frame-options"], "DENY", "{path}");
        assert_eq!(headers["referrer-policy"], "no-referrer", "{path}");
        let policy = headers["content-security-policy"].to_str().unwrap();
        assert!(
            policy.contains("frame-ancestors 'none'"),
            "{path}: {policy}"
        );
        match path.starts_with("/ui") {
            true => assert!(policy.contains("script-src 'self'"), "{policy}"),
            false => assert!(policy.starts_with("default-src 'none'"), "{policy}"),
        }
    }
}

/// Runs `tests/ui/cross_site.mjs` against `proxy` in Chromium: the requests the page made.
async fn attack_from_a_page(proxy: &Proxy) -> Value {
    let mut tools =
        common::installed("install-browser.sh", &["CHROMIUM_BIN", "PLAYWRIGHT_CORE"]).into_iter();
    let (chromium, playwright) = (tools.next().unwrap(), tools.next().unwrap());
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui/cross_site.mjs");
    let output = tokio::process::Command::new("node")
        .arg(script)
        .env("PROXY_URL", &proxy.url)
        .env("CHROMIUM_BIN", chromium)
        .env("PLAYWRIGHT_CORE", playwright)
        .output()
        .await
        .expect("run node");
    assert!(
        output.status.success(),
        "the browser driver failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the driver's JSON")
}

/// A page of another site in a real Chromium (a no-cors POST, a text/plain form, an image
/// pointed at an export that deletes) changes nothing; the same page let in with
/// `--allow-origin '*'` does reach the proxy, so the refusals are the proxy's, not the
/// browser's.
#[tokio::test(flavor = "multi_thread")]
async fn a_page_in_a_real_browser_changes_nothing() {
    let proxy = Proxy::atropos();
    proxy.session(json!({})).await;
    let before = state(&proxy).await;
    let report = attack_from_a_page(&proxy).await;
    let requests = report["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 4, "{report}");
    assert_eq!(state(&proxy).await, before, "nothing changed: {report}");

    let open = Proxy::start_with(
        common::char_model_dir(),
        None,
        MockWorker::start(Wire::Sglang),
        |settings| settings.allow_origins = vec!["*".into()],
    );
    open.session(json!({})).await;
    let before = state(&open).await;
    let report = attack_from_a_page(&open).await;
    let after = state(&open).await;
    assert_ne!(
        after["paused"],
        Value::Null,
        "the no-cors POST paused it: {report}"
    );
    assert_eq!(
        after["sessions"]["sessions"],
        json!([]),
        "the image exported and deleted"
    );
    // The body types still hold.
    assert_eq!(after["servers"], before["servers"]);
}
