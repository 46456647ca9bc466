//! `--otlp-endpoint`: every turn leaves the `serve` binary as an OpenTelemetry GenAI span over
//! OTLP/HTTP. A collector stand-in takes the exporter's protobuf requests on `/v1/traces` and
//! decodes them with the OpenTelemetry protocol's own message types.

mod common;

use actix_web::{App, HttpResponse, HttpServer, web};
use common::mock_worker::{MockWorker, Reply, Sample, Wire};
use common::{KillOnDrop, char_model_dir, chars, free_port, post_json, wait_for_health};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind, status::StatusCode};
use prost::Message;
use serde_json::json;
use std::sync::{Arc, Mutex};

/// What the stand-in received: every span, with its resource's `service.name`.
type Received = Arc<Mutex<Vec<(String, Span)>>>;

/// An OTLP/HTTP collector on `port` that keeps what it is sent.
fn collector(port: u16) -> Received {
    let received: Received = Default::default();
    let kept = received.clone();
    let (ready, started) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let server = HttpServer::new(move || {
                let kept = kept.clone();
                App::new().route(
                    "/v1/traces",
                    web::post().to(move |body: web::Bytes| {
                        let kept = kept.clone();
                        async move {
                            let request = ExportTraceServiceRequest::decode(body).unwrap();
                            for resource in request.resource_spans {
                                let service = resource
                                    .resource
                                    .iter()
                                    .flat_map(|r| &r.attributes)
                                    .find(|a| a.key == "service.name")
                                    .and_then(|a| text(a.value.as_ref()))
                                    .unwrap_or_default();
                                for scope in resource.scope_spans {
                                    for span in scope.spans {
                                        kept.lock().unwrap().push((service.clone(), span));
                                    }
                                }
                            }
                            // An empty ExportTraceServiceResponse: everything accepted.
                            HttpResponse::Ok()
                                .content_type("application/x-protobuf")
                                .finish()
                        }
                    }),
                )
            })
            .workers(1)
            .bind(("127.0.0.1", port))
            .unwrap()
            .run();
            ready.send(()).unwrap();
            server.await.unwrap()
        })
    });
    started.recv().unwrap();
    received
}

fn text(value: Option<&AnyValue>) -> Option<String> {
    match value?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

/// A span's attribute, as JSON for easy comparison.
fn attribute(span: &Span, key: &str) -> serde_json::Value {
    let Some(value) = span
        .attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.as_ref())
    else {
        return serde_json::Value::Null;
    };
    match value {
        any_value::Value::StringValue(s) => json!(s),
        any_value::Value::IntValue(i) => json!(i),
        any_value::Value::ArrayValue(array) => {
            array.values.iter().map(|v| json!(text(Some(v)))).collect()
        }
        other => json!(format!("{other:?}")),
    }
}

#[tokio::test]
async fn turns_are_exported_as_genai_spans_to_an_otlp_collector() {
    let collector_port = free_port();
    let received = collector(collector_port);
    let worker = MockWorker::start(Wire::Sglang);
    worker.push_sample(Sample::stop(chars("hello")));
    worker.push_sample(Sample::length(chars("abc")));
    let port = free_port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_rollout-proxy"))
        .args(["serve", "--port", &port.to_string(), "--workers", "1"])
        .arg("--tokenizer")
        .arg(char_model_dir())
        .args(["--backend", &worker.url, "--backend-type", "sglang"])
        .args(["--model-name", "policy-7b"])
        .args([
            "--otlp-endpoint",
            &format!("http://127.0.0.1:{collector_port}"),
        ])
        // Spans are exported whatever the log filter keeps.
        .env("RUST_LOG", "error")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _server = KillOnDrop(child);
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    wait_for_health(&client, &base).await;
    let created = post_json(&client, &format!("{base}/sessions/create"), &json!({})).await;
    let uuid = created["uuid"].as_str().unwrap().to_string();
    let chat = format!("{base}/{uuid}/v1/chat/completions");
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let reply = post_json(&client, &chat, &body).await;
    let completion = json!({"prompt": "once upon", "max_tokens": 3});
    let text_reply = post_json(
        &client,
        &format!("{base}/{uuid}/v1/completions"),
        &completion,
    )
    .await;
    worker.push(Reply::Error(400, "context too long"));
    let refused = client.post(&chat).json(&body).send().await.unwrap();
    assert_eq!(refused.status(), 400);

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let spans = loop {
        let spans = received.lock().unwrap().clone();
        if spans.len() >= 3 {
            break spans;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the collector got {} spans",
            spans.len()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(spans.len(), 3, "one span per turn, nothing else");
    let (backend_host, backend_port) = worker
        .url
        .trim_start_matches("http://")
        .split_once(':')
        .unwrap();
    for (service, span) in &spans {
        assert_eq!(service, "rollout-proxy");
        assert_eq!(span.kind, SpanKind::Client as i32);
        assert_eq!(attribute(span, "gen_ai.request.model"), "policy-7b");
        assert_eq!(attribute(span, "gen_ai.conversation.id"), uuid.as_str());
        assert!(span.end_time_unix_nano > span.start_time_unix_nano);
    }
    let (_, chat_span) = &spans[0];
    assert_eq!(chat_span.name, "chat policy-7b");
    assert_eq!(attribute(chat_span, "gen_ai.operation.name"), "chat");
    assert_eq!(attribute(chat_span, "rollout.api"), "chat.completions");
    assert_eq!(
        attribute(chat_span, "gen_ai.usage.input_tokens"),
        reply["usage"]["prompt_tokens"]
    );
    assert_eq!(
        attribute(chat_span, "gen_ai.usage.output_tokens"),
        reply["usage"]["completion_tokens"]
    );
    assert_eq!(
        attribute(chat_span, "gen_ai.response.finish_reasons"),
        json!(["stop"])
    );
    assert_eq!(attribute(chat_span, "server.address"), backend_host);
    assert_eq!(
        attribute(chat_span, "server.port"),
        json!(backend_port.parse::<i64>().unwrap())
    );
    assert_eq!(
        chat_span.status.as_ref().map_or(0, |s| s.code),
        StatusCode::Unset as i32
    );

    let (_, text_span) = &spans[1];
    assert_eq!(text_span.name, "text_completion policy-7b");
    assert_eq!(
        attribute(text_span, "gen_ai.response.finish_reasons"),
        json!(["length"])
    );
    assert_eq!(
        attribute(text_span, "gen_ai.usage.output_tokens"),
        text_reply["usage"]["completion_tokens"]
    );

    let (_, failed) = &spans[2];
    assert_eq!(attribute(failed, "error.type"), "backend");
    let status = failed.status.as_ref().unwrap();
    assert_eq!(status.code, StatusCode::Error as i32);
    assert!(status.message.contains("context too long"), "{status:?}");
    assert_eq!(attribute(failed, "gen_ai.usage.output_tokens"), json!(null));
}
