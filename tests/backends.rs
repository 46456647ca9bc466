//! Backend clients through the proxy against scripted upstreams in each wire format, and the
//! pool's HTTP-visible behaviour (backpressure, affinity figures).

mod common;

use common::mock_worker::{MockWorker, Reply, Sample, Wire};
use common::{Proxy, assert_node_shape, assert_openai_error, char_model_dir, chars, fixture_model};
use rollout_proxy::config::Settings;
use serde_json::{Value, json};

/// vLLM servers that list `/inference/v1/generate` get tokens in, tokens out there.
#[tokio::test]
async fn vllm_generate_endpoint_is_used_when_offered() {
    let proxy = Proxy::start(char_model_dir(), None, Wire::VllmGenerate);
    let uuid = proxy.session(json!({})).await;
    let mut messages = vec![json!({"role": "user", "content": "hi"})];
    let (status, data) = proxy
        .turn(
            &uuid,
            Sample::stop(chars("hello")),
            json!({"messages": messages, "max_tokens": 9, "seed": 4}),
        )
        .await;
    assert_eq!(status, 200, "{data}");
    let sent = &proxy.worker.requests()[0];
    assert_eq!(
        sent["token_ids"],
        json!(chars("<user>hi</user><assistant>"))
    );
    assert_eq!(sent["sampling_params"]["max_tokens"], 9);
    assert_eq!(sent["sampling_params"]["seed"], 4);
    messages.push(json!({"role": "assistant", "content": "hello"}));
    messages.push(json!({"role": "user", "content": "again"}));
    proxy
        .turn(
            &uuid,
            Sample::stop(chars("ok")),
            json!({"messages": messages}),
        )
        .await;
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes.len(), 1);
    assert_node_shape(&nodes[0]);
}

/// vLLM 0.32 lists `/inference/v1/generate` in /openapi.json but answers 403 unless started
/// with `--enable-scale-out`: the proxy falls back to `/v1/completions` with token-id prompts
/// at once, and remembers it.
#[tokio::test]
async fn a_vllm_without_scale_out_is_served_over_completions() {
    let proxy = Proxy::start(char_model_dir(), None, Wire::VllmScaleOutOff);
    let uuid = proxy.session(json!({})).await;
    let mut messages = vec![json!({"role": "user", "content": "hi"})];
    for reply in ["hello", "again"] {
        let (status, data) = proxy
            .turn(
                &uuid,
                Sample::stop(chars(reply)),
                json!({"messages": messages}),
            )
            .await;
        assert_eq!(status, 200, "{data}");
        messages.push(json!({"role": "assistant", "content": reply}));
        messages.push(json!({"role": "user", "content": "more"}));
    }
    assert_eq!(
        proxy.worker.refused_generate(),
        1,
        "asked once, then remembered"
    );
    let sent = proxy.worker.requests();
    assert_eq!(sent.len(), 2);
    assert_eq!(
        sent[0]["prompt"],
        json!(chars("<user>hi</user><assistant>"))
    );
    assert_eq!(proxy.nodes(&uuid).await.len(), 1);
}

/// One turn ("hi", answered "ok") through a proxy set up by `tweak` in front of a server
/// speaking `wire` that serves `tiny` with a 64-token context: the proxy, its reply and the
/// request the server got.
async fn one_turn_on_tiny(
    wire: Wire,
    tweak: impl FnOnce(&mut Settings) + Send + 'static,
) -> (Proxy, Value, Value) {
    let worker = MockWorker::start(wire);
    worker.serve_model("tiny", 64);
    let proxy = Proxy::start_with(char_model_dir(), None, worker, tweak);
    let uuid = proxy.session(json!({})).await;
    let reply = proxy.hi(&uuid).await;
    let sent = proxy.worker.requests()[0].clone();
    (proxy, reply, sent)
}

/// A proxy told nothing but the server's URL names the model the server serves in its
/// requests and replies, and fits `max_tokens` to the context the server reports; flags
/// still win.
#[tokio::test]
async fn model_name_and_context_length_are_asked_of_the_server() {
    let (proxy, reply, sent) =
        one_turn_on_tiny(Wire::VllmScaleOutOff, |settings| settings.model_name = None).await;
    assert_eq!(
        (&sent["model"], &reply["model"]),
        (&json!("tiny"), &json!("tiny"))
    );
    let prompt = chars("<user>hi</user><assistant>").len() as u64;
    assert_eq!(
        sent["max_tokens"],
        64 - prompt,
        "the room the context leaves"
    );
    let (_, servers) = proxy.get("/servers").await;
    assert_eq!(servers["servers"][0]["model"], "tiny");
    assert_eq!(servers["servers"][0]["context_length"], 64);
    // A prompt that fills the reported context is refused before it reaches the server.
    let long = json!([{"role": "user", "content": "x".repeat(80)}]);
    let other = proxy.session(json!({})).await;
    let (status, data) = proxy.chat(&other, json!({"messages": long})).await;
    assert_eq!(status, 400, "{data}");
    assert_openai_error(&data);
    assert_eq!(proxy.worker.requests().len(), 1);

    let (_, reply, sent) = one_turn_on_tiny(Wire::VllmScaleOutOff, |settings| {
        settings.model_name = Some("mine".into());
        settings.context_length = Some(40);
    })
    .await;
    assert_eq!(
        (&sent["model"], &reply["model"]),
        (&json!("mine"), &json!("mine"))
    );
    assert_eq!(sent["max_tokens"], 40 - prompt);
}

/// SGLang says its context in `GET /v1/models` too; it needs no model name in requests.
#[tokio::test]
async fn sglang_reports_its_context() {
    let (_, _, sent) = one_turn_on_tiny(Wire::Sglang, |_| {}).await;
    let prompt = chars("<user>hi</user><assistant>").len() as u64;
    assert_eq!(
        sent["sampling_params"]["max_new_tokens"],
        64 - prompt,
        "{sent}"
    );
    assert!(sent.get("model").is_none());
}

/// A server that tokenizes the probe text differently would sample from prompts the trainer
/// never sees: it gets no turn, and the error names both tokenizers.
#[tokio::test]
async fn a_server_with_another_tokenizer_is_refused() {
    for wire in [Wire::VllmScaleOutOff, Wire::Sglang] {
        refused_for_its_tokenizer(wire).await;
    }
}

/// A proxy before a server speaking `wire` whose `/tokenize` gives other ids than the proxy's.
async fn refused_for_its_tokenizer(wire: Wire) {
    let worker = MockWorker::start(wire);
    worker.serve_model("tiny", 4096);
    worker.shift_tokenizer(1);
    let proxy = Proxy::start_with(char_model_dir(), None, worker, |_| {});
    let uuid = proxy.session(json!({})).await;
    let messages = json!([{"role": "user", "content": "hi"}]);
    let (status, data) = proxy.chat(&uuid, json!({"messages": messages})).await;
    assert_eq!(status, 503, "{data}");
    assert_openai_error(&data);
    let message = data["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("tokenizer of http://127.0.0.1"),
        "{message}"
    );
    assert!(
        message.contains(char_model_dir().to_str().unwrap()),
        "{message}"
    );
    assert!(proxy.worker.requests().is_empty(), "nothing was sampled");
    let (_, servers) = proxy.get("/servers").await;
    assert!(
        servers["servers"][0]["refused"]
            .as_str()
            .unwrap()
            .contains("differs")
    );
    assert!(proxy.nodes(&uuid).await.is_empty());
}

/// A session may name a LoRA adapter: vLLM gets it as the model (both endpoints), SGLang as
/// `lora_path`, and each turn records it. A server that loads no adapters by name, or a bad
/// name, is refused at create.
#[tokio::test]
async fn a_session_samples_with_its_lora_adapter() {
    for wire in [Wire::Vllm, Wire::VllmGenerate, Wire::Sglang] {
        let proxy = Proxy::start(char_model_dir(), None, wire);
        let (status, created) = proxy
            .post("/sessions/create", json!({"adapter": "math-lora"}))
            .await;
        assert_eq!(status, 200, "{created}");
        assert_eq!(created["adapter"], "math-lora");
        let uuid = created["uuid"].as_str().unwrap();
        let messages = json!([{"role": "user", "content": "hi"}]);
        let (status, data) = proxy
            .turn(
                uuid,
                Sample::stop(chars("ok")),
                json!({"messages": messages}),
            )
            .await;
        assert_eq!(status, 200, "{data}");
        let sent = &proxy.worker.requests()[0];
        let named = match wire {
            Wire::Sglang => &sent["lora_path"],
            _ => &sent["model"],
        };
        assert_eq!(named, "math-lora", "{wire:?}: {sent}");
        let turn = &proxy.nodes(uuid).await[0]["metadata"]["turns"][0];
        assert_eq!(turn["adapter"], "math-lora", "{turn}");
        // Sessions without one name the served model, and record none.
        let plain = proxy.session(json!({})).await;
        proxy.hi(&plain).await;
        let sent = proxy.worker.requests().pop().unwrap();
        assert!(sent.get("lora_path").is_none(), "{sent}");
        assert_ne!(sent["model"], "math-lora", "{sent}");
        assert!(
            proxy.nodes(&plain).await[0]["metadata"]["turns"][0]
                .get("adapter")
                .is_none()
        );
    }

    let proxy = Proxy::start(char_model_dir(), None, Wire::Vllm);
    for bad in [json!(""), json!("x".repeat(257)), json!("a\nb"), json!(7)] {
        let (status, body) = proxy
            .post("/sessions/create", json!({"adapter": bad}))
            .await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_openai_error(&body);
    }
    let worker = MockWorker::start(Wire::Sglang);
    let url = worker.url.clone();
    let llama = Proxy::start_with(char_model_dir(), None, worker, move |settings| {
        settings.backends.clear();
        settings.config.servers = vec![rollout_proxy::backend::BackendConfig::new(
            &url,
            rollout_proxy::backend::BackendKind::Llamacpp,
        )];
    });
    let (status, body) = llama
        .post("/sessions/create", json!({"adapter": "math-lora"}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Llamacpp"),
        "{body}"
    );
    let (_, sessions) = llama.get("/sessions").await;
    assert_eq!(
        sessions["sessions"],
        json!([]),
        "a refused create leaves no session"
    );
}

/// A text-only OpenAI backend: the prompt goes as text, the reply is re-tokenized and the turn
/// is marked approximate.
#[tokio::test]
async fn openai_text_backend_marks_turns_approximate() {
    let proxy = Proxy::start(char_model_dir(), None, Wire::OpenAiText);
    let uuid = proxy.session(json!({})).await;
    let (status, data) = proxy
        .turn(
            &uuid,
            Sample::stop(chars("hey there")),
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(status, 200, "{data}");
    assert_eq!(data["choices"][0]["message"]["content"], "hey there");
    assert_eq!(
        proxy.worker.requests()[0]["prompt"],
        "<user>hi</user><assistant>"
    );
    let nodes = proxy.nodes(&uuid).await;
    assert_eq!(nodes[0]["metadata"]["turns"][0]["approximate"], true);
    assert_eq!(
        nodes[0]["tokens"].as_array().unwrap().len(),
        chars("<user>hi</user><assistant>hey there").len()
    );
}

/// SGLang reports the policy version and cache hits; both land in the turn's metadata.
#[tokio::test]
async fn weight_version_and_backend_are_recorded_per_turn() {
    let proxy = Proxy::start(fixture_model("qwen3"), None, Wire::Sglang);
    let uuid = proxy.session(json!({})).await;
    proxy
        .turn(
            &uuid,
            Sample::stop(vec![9707, 151645]),
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    let turn = proxy.nodes(&uuid).await[0]["metadata"]["turns"][0].clone();
    assert_eq!(turn["weight_version"], "default");
    assert_eq!(turn["cached_tokens"], 0);
    assert_eq!(turn["backend"], proxy.worker.url);
    assert!(turn.get("approximate").is_none());
}

/// When every backend is at its limit and the queue is full, requests get 429, not a hang.
#[tokio::test]
async fn saturated_pool_answers_429() {
    let proxy = Proxy::single_slot(0);
    proxy
        .worker
        .push(Reply::Delayed(400, vec![Sample::stop(chars("slow"))]));
    let (a, b) = (
        proxy.session(json!({})).await,
        proxy.session(json!({})).await,
    );
    let first = proxy.chat(&a, json!({"messages": [{"role": "user", "content": "1"}]}));
    let second = async {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        proxy
            .chat(&b, json!({"messages": [{"role": "user", "content": "2"}]}))
            .await
    };
    let ((s1, _), (s2, body)) = tokio::join!(first, second);
    assert_eq!(s1, 200);
    assert_eq!(s2, 429, "{body}");
    assert_openai_error(&body);
    assert!(proxy.nodes(&b).await.is_empty());
}

/// Every turn of a session after the first counts toward the affinity figure on /servers.
#[tokio::test]
async fn servers_report_affinity() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let mut messages = vec![json!({"role": "user", "content": "a"})];
    for i in 0..3 {
        let (status, _) = proxy
            .turn(
                &uuid,
                Sample::stop(chars("x")),
                json!({"messages": messages}),
            )
            .await;
        assert_eq!(status, 200);
        messages.push(json!({"role": "assistant", "content": "x"}));
        messages.push(json!({"role": "user", "content": format!("q{i}")}));
    }
    let (_, servers) = proxy.get("/servers").await;
    assert_eq!(servers["affinity"]["turns"], 2);
    assert_eq!(servers["affinity"]["same_backend"], 2);
    assert_eq!(servers["servers"][0]["requests"], 3);
    assert_eq!(servers["servers"][0]["in_flight"], 0);
}
