//! Images named by `http(s)` URL: fetched before the turn (over TLS too), once per message
//! however often the conversation is resent, and recorded like any other image; and every URL
//! that must not be fetched — an address out of reach, a host not listed, a redirect that
//! leaves them, too many redirects — or cannot be (an error status, too large, too slow, not
//! an image, an untrusted certificate) refused in the API's shape before anything is recorded
//! or sent. The image host is `tests/common/image_host.rs`; the inference server is the
//! scripted vLLM tokens-in route.

mod common;

use common::image_host::{Answer, ImageHost};
use common::images::{messages_and_responses_nodes, png, qwen2_vl_dir, sha256, turned_jpeg, user};
use common::mock_worker::{MockWorker, Sample, Wire};
use common::{Proxy, assert_openai_error};
use rollout_proxy::fetch::{FetchSettings, Reach};
use serde_json::json;
use std::time::Duration;

const IM_END: u32 = 151645;
/// Placeholders of a 100x60 image for Qwen2-VL.
const RUN: usize = 8;

fn proxy(fetch: FetchSettings) -> Proxy {
    let worker = MockWorker::start(Wire::VllmGenerate);
    worker.expand_images(vec![RUN; 4]);
    Proxy::start_with(qwen2_vl_dir(), None, worker, |settings| {
        settings.image_fetch = fetch;
    })
}

/// Fetching from any address (the host runs on loopback), trusting `host`'s CA.
fn anywhere(host: Option<&ImageHost>) -> FetchSettings {
    FetchSettings {
        reach: Reach::Any,
        extra_roots: host.and_then(|h| h.ca.clone()),
        ..FetchSettings::default()
    }
}

#[tokio::test]
async fn image_urls_are_fetched_once_and_recorded_like_data_urls() {
    let (cat, dog) = (png(100, 60, 1), turned_jpeg(100, 60, 2));
    let plain = ImageHost::start(vec![("/cat.png", Answer::Image(cat.clone()))]);
    let tls = ImageHost::start_tls(vec![("/dog.jpg", Answer::Image(dog.clone()))]);
    let proxy = proxy(anywhere(Some(&tls)));
    let uuid = proxy.session(json!({})).await;
    let mut messages = vec![user("What is it?", &plain.url("/cat.png"))];
    proxy.worker.push_sample(Sample::stop(vec![9707, IM_END]));
    let (status, reply) = proxy.chat(&uuid, json!({"messages": messages})).await;
    assert_eq!(status, 200, "{reply}");
    messages.push(reply["choices"][0]["message"].clone());
    messages.push(user("And this?", &tls.url("/dog.jpg")));
    proxy.worker.push_sample(Sample::stop(vec![9707, IM_END]));
    let (status, _, events) = proxy
        .chat_stream(&uuid, json!({"messages": messages, "stream": true}))
        .await;
    assert_eq!(status, 200, "{events:?}");
    let rendered = proxy.render(&uuid, json!({"messages": messages})).await;

    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let images = nodes[0]["images"].as_array().unwrap();
    assert_eq!(images.len(), 2);
    assert_eq!(images[0]["sha256"], sha256(&cat));
    assert_eq!(images[0]["media_type"], "image/png");
    assert_eq!(images[1]["sha256"], sha256(&dog));
    assert_eq!(
        images[1]["grid_thw"],
        json!([1, 8, 4]),
        "turned by its EXIF"
    );
    assert_eq!(rendered["images"], nodes[0]["images"]);
    // The resent conversation's image was not fetched again: its message is the one the
    // session already read.
    assert_eq!((plain.hits("/cat.png"), tls.hits("/dog.jpg")), (1, 1));
    // vLLM gets the bytes as a data URL, as it does a data URL's.
    let requests = proxy.worker.requests();
    let sent = requests[0]["content_parts"][0]["url"].as_str().unwrap();
    assert_eq!(sent, common::images::data_url(&cat, "image/png"));
    // The trainer fetches the bytes the model saw.
    let blob = reqwest::get(format!(
        "{}/{uuid}/blobs/{}",
        proxy.url,
        images[1]["sha256"].as_str().unwrap()
    ))
    .await
    .unwrap();
    assert_eq!(blob.status(), 200);
    assert_eq!(blob.bytes().await.unwrap()[..], dog[..]);
}

#[tokio::test]
async fn messages_and_responses_fetch_their_image_urls_too() {
    let cat = png(100, 60, 3);
    let host = ImageHost::start(vec![("/cat.png", Answer::Image(cat.clone()))]);
    let proxy = proxy(anywhere(None));
    let url = host.url("/cat.png");
    let source = json!({"type": "url", "url": url});
    let (a, b) = messages_and_responses_nodes(&proxy, source, &url).await;
    assert_eq!(a[0]["images"][0]["sha256"], sha256(&cat));
    assert_eq!(a[0]["images"], b[0]["images"]);
    assert_eq!(a[0]["tokens"], b[0]["tokens"]);
}

/// Sends `url` as the one image of a chat turn, a Messages turn and a Responses turn, and
/// checks each is refused with `why`, in its API's shape, with nothing recorded or sent.
async fn refused(proxy: &Proxy, url: &str, why: &str) {
    let uuid = proxy.session(json!({})).await;
    let sent = proxy.worker.requests().len();
    let (status, reply) = proxy
        .chat(&uuid, json!({"messages": [user("x", url)]}))
        .await;
    assert_eq!(status, 400, "{url}: {reply}");
    assert_openai_error(&reply);
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains(why), "{url}: {message}");
    let (status, raw, _) = proxy
        .chat_stream(&uuid, json!({"messages": [user("x", url)], "stream": true}))
        .await;
    assert_eq!(status, 400, "{url} streamed: {raw}");
    assert!(raw.contains(why), "{url} streamed: {raw}");
    let (status, reply) = proxy
        .post(
            &format!("/{uuid}/v1/messages"),
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": url}}]}]}),
        )
        .await;
    assert_eq!(status, 400, "{url}: {reply}");
    assert_eq!(reply["type"], "error", "{reply}");
    assert!(
        reply["error"]["message"].as_str().unwrap().contains(why),
        "{reply}"
    );
    let (status, reply) = proxy
        .post(
            &format!("/{uuid}/v1/responses"),
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": url}]}]}),
        )
        .await;
    assert_eq!(status, 400, "{url}: {reply}");
    assert_openai_error(&reply);
    assert!(
        proxy.nodes(&uuid).await.is_empty(),
        "{url}: nothing recorded"
    );
    assert_eq!(proxy.worker.requests().len(), sent, "{url}: nothing sent");
}

#[tokio::test]
async fn urls_out_of_reach_are_refused_before_a_connection_is_made() {
    let cat = png(100, 60, 1);
    let host = ImageHost::start(vec![
        ("/cat.png", Answer::Image(cat.clone())),
        (
            "/away",
            Answer::Redirect("http://localhost:1/cat.png".into()),
        ),
    ]);
    let port = host.base.rsplit(':').next().unwrap().to_string();
    // The default: public addresses only. Loopback, by address or by name, is not one.
    let public = proxy(FetchSettings::default());
    refused(&public, &host.url("/cat.png"), "not a public address").await;
    let by_name = format!("http://localhost:{port}/cat.png");
    refused(&public, &by_name, "not a public address").await;
    refused(
        &public,
        "http://169.254.169.254/latest/meta-data/",
        "not a public address",
    )
    .await;
    refused(
        &public,
        "http://[::ffff:127.0.0.1]/",
        "not a public address",
    )
    .await;
    assert_eq!(host.hits("/cat.png"), 0, "never connected");

    // Listed hosts only: a redirect to another host is refused at that hop.
    let listed = proxy(FetchSettings {
        hosts: vec!["127.0.0.1".into()],
        ..anywhere(None)
    });
    refused(&listed, &by_name, "is not among the hosts").await;
    refused(
        &listed,
        &host.url("/away"),
        "'localhost' is not among the hosts",
    )
    .await;
    assert_eq!(host.hits("/cat.png"), 0);
    assert_eq!(host.hits("/away"), 4, "each API's turn asked once");

    // A model that takes no images fetches none.
    let text_only = Proxy::start_with(
        common::fixture_model("qwen3"),
        None,
        MockWorker::start(Wire::VllmGenerate),
        |settings| settings.image_fetch = anywhere(None),
    );
    refused(&text_only, &host.url("/cat.png"), "takes no images").await;
    assert_eq!(host.hits("/cat.png"), 0);

    // Off: no URL is fetched.
    let off = proxy(FetchSettings {
        reach: Reach::Off,
        ..FetchSettings::default()
    });
    refused(&off, &host.url("/cat.png"), "fetches no image URLs").await;
    assert_eq!(host.hits("/cat.png"), 0);
}

#[tokio::test]
async fn urls_that_cannot_be_fetched_are_refused() {
    let host = ImageHost::start(vec![
        ("/gone.png", Answer::Status(404)),
        ("/huge.png", Answer::Image(vec![0; 2 * 1024 * 1024])),
        ("/endless.png", Answer::Unsized(8 * 1024 * 1024)),
        (
            "/slow.png",
            Answer::Slow(Duration::from_secs(5), png(10, 10, 1)),
        ),
        ("/text.png", Answer::Image(b"not an image at all".to_vec())),
        ("/loop", Answer::Redirect("/loop".into())),
    ]);
    let tls = ImageHost::start_tls(vec![("/cat.png", Answer::Image(png(10, 10, 1)))]);
    let proxy = proxy(FetchSettings {
        timeout: Duration::from_secs(1),
        max_bytes: 1024 * 1024,
        ..anywhere(None)
    });
    refused(&proxy, &host.url("/gone.png"), "the server answered 404").await;
    refused(&proxy, &host.url("/huge.png"), "over 1048576 bytes").await;
    refused(&proxy, &host.url("/endless.png"), "over 1048576 bytes").await;
    refused(&proxy, &host.url("/slow.png"), "no answer within 1s").await;
    refused(&proxy, &host.url("/text.png"), "cannot be decoded").await;
    refused(&proxy, &host.url("/loop"), "more than 3 redirects").await;
    // A certificate its CA signed, but the proxy was not told to trust that CA.
    refused(&proxy, &tls.url("/cat.png"), "certificate").await;
    assert_eq!(
        host.hits("/loop"),
        4 * 4,
        "each API's turn: the URL and 3 redirects"
    );
}

/// However many images a request names, what it fetches is bounded together (64 MiB), as a
/// body's images are by the body's limit.
#[tokio::test]
async fn what_one_request_fetches_is_bounded_together() {
    // A PNG's header, then 17 MiB the header does not count: an image of 17 MiB.
    let mut large = png(10, 10, 1);
    large.resize(17 * 1024 * 1024, 0);
    let paths: Vec<String> = (0..4).map(|i| format!("/large-{i}.png")).collect();
    let host = ImageHost::start(
        paths
            .iter()
            .map(|p| (p.as_str(), Answer::Image(large.clone())))
            .collect(),
    );
    let proxy = proxy(anywhere(None));
    let uuid = proxy.session(json!({})).await;
    let content: Vec<_> = paths
        .iter()
        .map(|p| json!({"type": "image_url", "image_url": {"url": host.url(p)}}))
        .collect();
    let (status, reply) = proxy
        .chat(
            &uuid,
            json!({"messages": [{"role": "user", "content": content}]}),
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains("over 64 MiB together"), "{message}");
    assert!(proxy.nodes(&uuid).await.is_empty());
}

#[test]
fn bad_fetch_flags_stop_the_proxy_at_start_saying_why() {
    let missing = common::scratch_dir("image-fetch-flags").join("missing.pem");
    let missing = missing.to_str().unwrap();
    for (flags, why) in [
        (
            ["--image-fetch-timeout", "0"],
            "--image-fetch-timeout 0: give seconds",
        ),
        (["--image-fetch-max-mib", "0"], "--image-fetch-max-mib"),
        (["--image-fetch", "sometimes"], "invalid value 'sometimes'"),
        (
            ["--image-fetch-ca", missing],
            "cannot read the certificates of --image-fetch-ca",
        ),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_rollout-proxy"))
            .args(["serve", "--port", "0"])
            .args(flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{flags:?} started");
        assert!(stderr.contains(why), "{flags:?}: {stderr}");
    }
}
