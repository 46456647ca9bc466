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

/// `pattern` with its placeholders filled in.
fn concrete(pattern: &str, uuid: &str) -> String {
    pattern
        .replace("{uuid}", uuid)
        .replace("{id}", "resp_none")
        .replace("{model:.+}", "test_model")
        .replace("{name}", "viewer.js")
}

/// `path` with the first letter of each segment but the session id percent-encoded
/// (`/%73essions`): the router decodes it, so it is the same route.
fn percent_encoded(path: &str, uuid: &str) -> String {
    path.split('/')
        .map(|segment| match segment.chars().next() {
            Some(first) if first.is_ascii_alphabetic() && segment != uuid => {
                format!("%{:02X}{}", first as u8, &segment[1..])
            }
            _ => segment.to_string(),
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether the key `presented` opens a route of `access` on a proxy started with these keys
/// (the policy as docs/security.md states it).
fn opens(access: Access, api: Option<&str>, admin: Option<&str>, presented: Option<&str>) -> bool {
    let is = |key: Option<&str>| key.is_some() && key == presented;
    match access {
        Access::Public => true,
        Access::Client => api.is_none() || is(api) || is(admin),
        Access::Operator => match (admin, api) {
            (Some(_), _) => is(admin),
            (None, Some(_)) => is(api),
            (None, None) => true,
        },
    }
}

use rollout_proxy::http::routes::{Access, Verb, classes};

#[test]
fn the_route_table_says_who_may_call_what() {
    let named = |access: Access| -> Vec<&str> {
        let classes = classes();
        let mut patterns: Vec<&str> = classes
            .iter()
            .filter(|class| class.access == access)
            .map(|class| class.pattern)
            .collect();
        patterns.sort();
        patterns
    };
    assert_eq!(named(Access::Public), ["/health", "/ui", "/ui/{name}"]);
    assert_eq!(
        named(Access::Operator),
        [
            "/blobs/{sha256}",
            "/export",
            "/metrics",
            "/pause",
            "/resume",
            "/servers",
            "/sessions",
            "/setup",
            "/weight_version"
        ]
    );
}

/// Every route of the table, as written and percent-encoded, with no key, each key and a wrong
/// one, under each combination of keys: refused exactly when its class says so. Decided on the
/// route that matched: `/%73essions` is `/sessions`.
#[tokio::test]
async fn every_route_is_guarded_by_the_class_of_the_route_that_matched() {
    let (post, get) = (reqwest::Method::POST, reqwest::Method::GET);
    for (api, admin) in [
        (Some("secret"), Some("root")),
        (None, Some("root")),
        (Some("secret"), None),
    ] {
        let proxy = Proxy::start_with(
            common::char_model_dir(),
            None,
            MockWorker::start(Wire::Sglang),
            |settings| {
                settings.api_key = api.map(str::to_string);
                settings.admin_key = admin.map(str::to_string);
            },
        );
        let key = admin.or(api).unwrap();
        let (status, created) = call(
            post.clone(),
            format!("{}/sessions/create", proxy.url),
            Some(("authorization", &format!("Bearer {key}"))),
            Some(json!({})),
        )
        .await;
        assert_eq!(status, 200, "{created}");
        let uuid = created["uuid"].as_str().unwrap().to_string();
        for class in classes() {
            let plain = concrete(class.pattern, &uuid);
            // Bodies and queries that change nothing: each handler refuses them, or reads only.
            let (method, body, query) = match class.verb {
                Verb::Get => (get.clone(), None, "?format=none"),
                Verb::Post => (post.clone(), Some(json!([])), ""),
                Verb::Delete => (reqwest::Method::DELETE, None, ""),
            };
            // Deleting: a session that is not there.
            let plain = match class.verb {
                Verb::Delete => concrete(class.pattern, &uuid::Uuid::new_v4().to_string()),
                _ => plain,
            };
            for presented in [None, Some("secret"), Some("root"), Some("wrong")] {
                let header = presented.map(|k| format!("Bearer {k}"));
                let header = header.as_deref().map(|h| ("authorization", h));
                let mut statuses = Vec::new();
                for path in [plain.clone(), percent_encoded(&plain, &uuid)] {
                    let url = format!("{}{path}{query}", proxy.url);
                    let (status, data) = call(method.clone(), url, header, body.clone()).await;
                    let allowed = opens(class.access, api, admin, presented);
                    assert_eq!(
                        status == 401,
                        !allowed,
                        "{method} {path} with {presented:?} (api {api:?}, admin {admin:?}): {status} {data}"
                    );
                    statuses.push(status);
                }
                assert_eq!(
                    statuses[0], statuses[1],
                    "{plain}: the encoded path is the same route"
                );
            }
        }
        // Nothing was changed on the way: the session is there, no pause, one backend.
        let (status, health) = call(get.clone(), format!("{}/health", proxy.url), None, None).await;
        assert_eq!(
            (status, &health["paused"], &health["servers"]),
            (200, &Value::Null, &json!(1))
        );
    }
}
