//! Rewards and exports: `POST /{uuid}/reward`, `GET /export` as JSON lines (checked against
//! `GET /nodes`) and as a NumPy `.npz` (opened by numpy in Python and checked against the JSON
//! lines), the filters, and `delete=true` removing exactly what was exported.

mod common;

use common::mock_worker::{Reply, Sample};
use common::{Proxy, assert_openai_error, assert_valid_atif, chars, scratch_dir};
use serde_json::{Value, json};

/// A session with `turns` turns (replies "r0", "r1", ...).
async fn rollout(proxy: &Proxy, turns: usize) -> String {
    let uuid = proxy.session(json!({})).await;
    let mut messages = vec![json!({"role": "user", "content": "q"})];
    for turn in 0..turns {
        let sample = Sample::stop(chars(&format!("r{turn}")));
        let (status, reply) = proxy
            .turn(&uuid, sample, json!({"messages": messages}))
            .await;
        assert_eq!(status, 200, "{reply}");
        messages.push(reply["choices"][0]["message"].clone());
        messages.push(json!({"role": "user", "content": format!("q{turn}")}));
    }
    uuid
}

async fn export_text(proxy: &Proxy, query: &str) -> (u16, String) {
    let response = reqwest::get(format!("{}/export{query}", proxy.url))
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn rewards_are_kept_and_bad_ones_refused() {
    let proxy = Proxy::atropos();
    let uuid = rollout(&proxy, 1).await;
    let path = format!("/{uuid}/reward");
    let (status, body) = proxy
        .post(&path, json!({"reward": 0.75, "metadata": {"passed": 3}}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["reward"].clone(), body["metadata"]["passed"].clone()),
        (json!(0.75), json!(3))
    );
    for bad in [
        json!({}),
        json!({"reward": "high"}),
        json!({"reward": null}),
        json!({"reward": 1, "metadata": [1]}),
        json!({"reward": 1, "extra": true}),
    ] {
        let (status, body) = proxy.post(&path, bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_openai_error(&body);
    }
    let (status, body) = proxy.post_raw(&path, r#"{"reward": 1e999}"#.into()).await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = proxy
        .post(
            "/00000000-0000-0000-0000-000000000000/reward",
            json!({"reward": 1}),
        )
        .await;
    assert_eq!(status, 404);
    // The first reward stands; a later one would replace it.
    let (_, sessions) = proxy.get("/sessions").await;
    assert_eq!(sessions["sessions"][0]["reward"], 0.75);
}

#[tokio::test]
async fn jsonl_export_matches_the_nodes_and_filters() {
    let proxy = Proxy::atropos();
    let (a, b) = (rollout(&proxy, 2).await, rollout(&proxy, 1).await);
    proxy
        .post(
            &format!("/{a}/reward"),
            json!({"reward": 1.5, "metadata": {"task": "t1"}}),
        )
        .await;
    let (status, text) = export_text(&proxy, "").await;
    assert_eq!(status, 200);
    let exported = lines(&text);
    assert_eq!(exported.len(), 2);
    for (uuid, reward) in [(&a, json!(1.5)), (&b, Value::Null)] {
        let line = exported.iter().find(|l| l["session_id"] == **uuid).unwrap();
        let node = &proxy.nodes(uuid).await[0];
        for field in ["tokens", "masked_tokens", "logprobs"] {
            assert_eq!(line[field], node[field], "{field}");
        }
        assert_eq!(line["node_index"], 0);
        assert_eq!(line["turns"], node["metadata"]["turns"]);
        assert_eq!(line["reward"], reward);
        assert!(line["session"]["created_at"].is_f64());
    }
    let line_a = exported.iter().find(|l| l["session_id"] == *a).unwrap();
    assert_eq!(line_a["metadata"]["task"], "t1");
    assert_eq!(line_a["turns"].as_array().unwrap().len(), 2);

    let only = |query: &str| {
        let query = query.to_string();
        let proxy = &proxy;
        async move {
            let (status, text) = export_text(proxy, &query).await;
            assert_eq!(status, 200, "{query}: {text}");
            lines(&text)
                .iter()
                .map(|l| l["session_id"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(only("?finished=true").await, vec![a.clone()]);
    assert_eq!(only("?finished=false").await, vec![b.clone()]);
    assert_eq!(only(&format!("?sessions={b}")).await, vec![b.clone()]);
    assert!(only("?since=2999-01-01T00:00:00Z").await.is_empty());
    assert_eq!(only("?since=0").await.len(), 2);
    for bad in [
        "?format=csv",
        "?since=yesterday",
        "?finished=maybe",
        "?pad_to=3",
        "?colour=red",
    ] {
        let (status, body) = export_text(&proxy, bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_openai_error(&serde_json::from_str(&body).unwrap());
    }
}

#[tokio::test]
async fn export_with_delete_removes_exactly_what_it_exported() {
    let proxy = Proxy::atropos();
    let (done, running) = (rollout(&proxy, 1).await, rollout(&proxy, 1).await);
    proxy
        .post(&format!("/{done}/reward"), json!({"reward": 1}))
        .await;
    let (_, text) = export_text(&proxy, "?finished=true&delete=true").await;
    assert_eq!(lines(&text).len(), 1);
    assert_eq!(proxy.get(&format!("/{done}/nodes")).await.0, 404);
    assert_eq!(proxy.get(&format!("/{running}/nodes")).await.0, 200);
    let (_, again) = export_text(&proxy, "?finished=true&delete=true").await;
    assert!(again.is_empty(), "nothing exported twice");
    // The same for a `.npz`: removed once the file has been sent.
    proxy
        .post(&format!("/{running}/reward"), json!({"reward": 0}))
        .await;
    let (status, _) = export_text(&proxy, "?format=npz&finished=true&delete=true").await;
    assert_eq!(status, 200);
    assert_eq!(proxy.get(&format!("/{running}/nodes")).await.0, 404);
}

#[tokio::test]
async fn a_turn_waiting_on_a_removed_session_writes_nothing() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    proxy
        .worker
        .push(Reply::Delayed(400, vec![Sample::stop(chars("slow"))]));
    let body = json!({"messages": [{"role": "user", "content": "a"}]});
    let first = proxy.chat(&uuid, body.clone());
    let waiting = async {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        proxy.chat(&uuid, body.clone()).await
    };
    let delete = async {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        proxy.delete(&format!("/{uuid}")).await
    };
    let ((first, _), (waited, error), (deleted, _)) = futures::join!(first, waiting, delete);
    assert_eq!((first, deleted), (200, 200));
    assert_eq!(waited, 404, "{error}");
    assert_eq!(
        proxy.worker.requests().len(),
        1,
        "the waiting turn never sampled"
    );
}

#[tokio::test]
async fn npz_export_opens_in_numpy_and_equals_the_jsonl() {
    let proxy = Proxy::atropos();
    let (a, b) = (rollout(&proxy, 2).await, rollout(&proxy, 1).await);
    proxy
        .post(
            &format!("/{a}/reward"),
            json!({"reward": 0.5, "metadata": {"k": "v"}}),
        )
        .await;
    let dir = scratch_dir("export-npz");
    let (_, text) = export_text(&proxy, "").await;
    std::fs::write(dir.join("export.jsonl"), &text).unwrap();
    let response = reqwest::get(format!(
        "{}/export?format=npz&pad_to=600&pad_id=7",
        proxy.url
    ))
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    std::fs::write(dir.join("export.npz"), response.bytes().await.unwrap()).unwrap();
    let (status, body) = export_text(&proxy, "?format=npz&pad_to=5").await;
    assert_eq!(status, 400, "{body}");
    let check = r#"
import json, math, sys
import numpy as np
folder = sys.argv[1]
rows = [json.loads(l) for l in open(folder + "/export.jsonl")]
z = np.load(folder + "/export.npz")
described = json.loads(z["nodes.json"])
assert z["tokens"].dtype == np.int32 and z["logprobs"].dtype == np.float32, z["tokens"].dtype
assert z["tokens"].shape == (len(rows), 600), z["tokens"].shape
for i, row in enumerate(rows):
    n = len(row["tokens"])
    assert described[i]["session_id"] == row["session_id"]
    assert z["lengths"][i] == n
    assert z["tokens"][i, :n].tolist() == row["tokens"]
    assert (z["tokens"][i, n:] == 7).all()
    assert z["masked_tokens"][i, :n].tolist() == row["masked_tokens"]
    assert (z["masked_tokens"][i, n:] == -100).all()
    assert np.allclose(z["logprobs"][i, :n], np.array(row["logprobs"], dtype=np.float32))
    assert z["attention_mask"][i].sum() == n and z["attention_mask"][i, :n].all()
    if row["reward"] is None:
        assert math.isnan(z["rewards"][i])
    else:
        assert z["rewards"][i] == np.float32(row["reward"])
        assert described[i]["metadata"] == row["metadata"]
print("ok", len(rows))
"#;
    // numpy: scripts/test.sh installs it.
    let output = std::process::Command::new("python3")
        .args(["-c", check])
        .arg(&dir)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{said}");
    assert_eq!(said.trim(), "ok 2");
    let _ = b;
}

#[tokio::test]
async fn atif_export_passes_harbors_validator_and_keeps_the_ids() {
    let proxy = Proxy::atropos();
    let uuid = proxy.session(json!({})).await;
    let tool = json!({"type": "function", "function": {"name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}});
    let mut messages = vec![json!({"role": "user", "content": "find it"})];
    let call = r#"Let me look.<tool_call>{"name": "lookup", "arguments": {"q": "x"}}</tool_call>"#;
    let (_, reply) = proxy
        .turn(
            &uuid,
            Sample::stop(chars(call)),
            json!({"messages": messages, "tools": [tool]}),
        )
        .await;
    let call_id = reply["choices"][0]["message"]["tool_calls"][0]["id"].clone();
    messages.push(reply["choices"][0]["message"].clone());
    messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": "found: 42"}));
    proxy
        .turn(
            &uuid,
            Sample::stop(chars("It is 42.")),
            json!({"messages": messages, "tools": [tool]}),
        )
        .await;
    proxy
        .post(
            &format!("/{uuid}/reward"),
            json!({"reward": 1.0, "metadata": {"ok": true}}),
        )
        .await;
    let (status, text) = export_text(&proxy, "?format=atif").await;
    assert_eq!(status, 200, "{text}");
    let documents = lines(&text);
    assert_eq!(documents.len(), 1);
    let document = &documents[0];
    let steps = document["steps"].as_array().unwrap();
    let agent: Vec<&Value> = steps.iter().filter(|s| s["source"] == "agent").collect();
    assert_eq!(agent.len(), 2, "{document}");
    assert_eq!(agent[0]["tool_calls"][0]["tool_call_id"], call_id);
    assert_eq!(agent[0]["tool_calls"][0]["arguments"], json!({"q": "x"}));
    assert_eq!(agent[0]["message"], "Let me look.");
    assert!(
        agent[0]["observation"]["results"][0]["content"]
            .as_str()
            .unwrap()
            .contains("found: 42")
    );
    assert_eq!(agent[1]["message"], "It is 42.");
    // The ids are the node's, exactly.
    let node = &proxy.nodes(&uuid).await[0];
    let tokens = node["tokens"].as_array().unwrap();
    for (step, turn) in agent
        .iter()
        .zip(node["metadata"]["turns"].as_array().unwrap())
    {
        let start = turn["completion_start"].as_u64().unwrap() as usize;
        let end = start + turn["completion_tokens"].as_u64().unwrap() as usize;
        let metrics = &step["metrics"];
        assert_eq!(
            metrics["completion_token_ids"].as_array().unwrap()[..],
            tokens[start..end]
        );
        assert_eq!(
            metrics["prompt_token_ids"].as_array().unwrap()[..],
            tokens[..start]
        );
        assert_eq!(metrics["logprobs"].as_array().unwrap().len(), end - start);
    }
    assert_eq!(document["final_metrics"]["extra"]["reward"], 1.0);
    assert_eq!(document["schema_version"], "ATIF-v1.6");

    assert_valid_atif(document, "export-atif");
}

#[tokio::test]
async fn atif_steps_are_the_conversations_messages_on_a_real_template() {
    let (tokenizer, proxy) = common::qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let mut messages = vec![
        json!({"role": "system", "content": "You answer weather questions."}),
        json!({"role": "user", "content": "Weather in Paris and Rome?"}),
    ];
    let calls = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n\
                 </tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
                 {\"city\": \"Rome\"}}\n</tool_call><|im_end|>";
    let sample = Sample::stop(tokenizer.encode(calls).unwrap());
    let (status, reply) = proxy
        .turn(&uuid, sample, json!({"messages": messages, "tools": tools}))
        .await;
    assert_eq!(status, 200, "{reply}");
    let assistant = reply["choices"][0]["message"].clone();
    let ids: Vec<Value> = assistant["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].clone())
        .collect();
    assert_eq!(ids.len(), 2);
    messages.push(assistant);
    messages.push(json!({"role": "tool", "tool_call_id": ids[0], "content": "sunny"}));
    messages.push(json!({"role": "tool", "tool_call_id": ids[1], "content": "rainy"}));
    let sample = Sample::stop(
        tokenizer
            .encode("Paris is sunny, Rome rainy.<|im_end|>")
            .unwrap(),
    );
    let (status, _) = proxy
        .turn(&uuid, sample, json!({"messages": messages, "tools": tools}))
        .await;
    assert_eq!(status, 200);
    let (_, text) = export_text(&proxy, "?format=atif").await;
    let document = &lines(&text)[0];
    let steps = document["steps"].as_array().unwrap();
    let shape: Vec<(&str, &str)> = steps
        .iter()
        .map(|s| {
            (
                s["source"].as_str().unwrap(),
                s["message"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("system", shape[0].1),
            ("user", "Weather in Paris and Rome?"),
            ("agent", ""),
            ("agent", "Paris is sunny, Rome rainy."),
        ],
        "{document}"
    );
    // The system message as the template wrote it: the tools' description included.
    assert!(shape[0].1.starts_with("You answer weather questions."));
    assert_eq!(
        steps[2]["observation"]["results"],
        json!([{"source_call_id": ids[0], "content": "sunny"},
            {"source_call_id": ids[1], "content": "rainy"}])
    );
    assert_valid_atif(document, "export-atif-messages");
}

#[tokio::test]
async fn jsonl_lines_say_which_message_each_token_came_from() {
    let (tokenizer, proxy) = common::qwen3_proxy();
    let uuid = proxy.session(json!({})).await;
    let messages = json!([{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"}]);
    let sample = Sample::stop(tokenizer.encode("Hello!<|im_end|>").unwrap());
    let (status, _) = proxy
        .turn(&uuid, sample, json!({"messages": messages}))
        .await;
    assert_eq!(status, 200);
    let (_, text) = export_text(&proxy, "").await;
    let line = &lines(&text)[0];
    let tokens: Vec<u32> = serde_json::from_value(line["tokens"].clone()).unwrap();
    let spans = line["messages"].as_array().unwrap();
    let roles: Vec<&str> = spans.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant"]);
    let text_of = |m: &Value| {
        let (start, end) = (m["start"].as_u64().unwrap(), m["end"].as_u64().unwrap());
        tokenizer.decode(&tokens[start as usize..end as usize])
    };
    assert_eq!(text_of(&spans[1]), "<|im_start|>user\nHi<|im_end|>\n");
    assert_eq!(
        text_of(&spans[2]),
        "<|im_start|>assistant\nHello!<|im_end|>"
    );
    assert_eq!(spans[2]["end"], tokens.len());
}

#[tokio::test]
async fn a_slow_npz_reader_holds_up_no_turn_and_gets_the_whole_file() {
    let proxy = Proxy::atropos();
    // About 13 MB of arrays: more than the connection and the export's own buffers hold.
    let prompt: String = "abcd".repeat(1024);
    let mut sessions = Vec::new();
    for _ in 0..200 {
        let uuid = proxy.session(json!({})).await;
        let body = json!({"messages": [{"role": "user", "content": prompt}]});
        let (status, _) = proxy.turn(&uuid, Sample::stop(chars("ok")), body).await;
        assert_eq!(status, 200);
        sessions.push(uuid);
    }
    let response = reqwest::get(format!("{}/export?format=npz", proxy.url))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // The body is not read yet: a turn on an exported session goes on regardless.
    let next = json!({"messages": [{"role": "user", "content": "again"}]});
    let turn = proxy.turn(&sessions[0], Sample::stop(chars("on")), next);
    let (status, _) = tokio::time::timeout(std::time::Duration::from_secs(10), turn)
        .await
        .expect("the turn waited for the export");
    assert_eq!(status, 200);
    let bytes = response.bytes().await.unwrap();
    assert!(bytes.len() > 12_000_000, "{} bytes", bytes.len());
    // The file ends with the zip's end-of-central-directory record.
    let end = &bytes[bytes.len() - 22..];
    assert_eq!(&end[..4], b"PK\x05\x06");
}

#[tokio::test]
async fn numbers_in_the_query_are_bounded() {
    let proxy = Proxy::atropos();
    rollout(&proxy, 1).await;
    for query in [
        // Once an allocation failure that aborted the process.
        "?format=npz&pad_to=72057594037927936",
        "?format=npz&pad_to=16777217",
        "?format=npz&pad_to=18446744073709551616",
        "?format=npz&pad_to=-1",
        "?format=npz&pad_id=99999999999",
        "?since=1e999",
    ] {
        let response = reqwest::get(format!("{}/export{query}", proxy.url))
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{query}");
        assert_openai_error(&response.json().await.unwrap());
    }
    // The widest row allowed is written (hung up on: 64 MiB an array per node).
    let widest = reqwest::get(format!("{}/export?format=npz&pad_to=16777216", proxy.url))
        .await
        .unwrap();
    assert_eq!(widest.status(), 200);
    drop(widest);
    assert_eq!(proxy.get("/health").await.0, 200);
}

/// The session ids of an export's JSON lines.
fn session_ids(text: &str) -> Vec<String> {
    let mut ids: Vec<String> = lines(text)
        .iter()
        .map(|line| line["session_id"].as_str().unwrap().to_string())
        .collect();
    ids.dedup();
    ids
}

#[tokio::test]
async fn concurrent_exports_with_delete_hand_each_session_out_once() {
    let proxy = Proxy::atropos();
    let mut all = Vec::new();
    for _ in 0..6 {
        all.push(rollout(&proxy, 2).await);
    }
    let ((_, first), (_, second)) = futures::join!(
        export_text(&proxy, "?delete=true"),
        export_text(&proxy, "?delete=true")
    );
    let (first, second) = (session_ids(&first), session_ids(&second));
    assert!(
        first.iter().all(|id| !second.contains(id)),
        "handed out twice: {first:?} and {second:?}"
    );
    let mut together = [first, second].concat();
    together.sort();
    all.sort();
    assert_eq!(together, all, "every session handed out once");

    // The same for two `.npz` files.
    let mut all = Vec::new();
    for _ in 0..4 {
        all.push(rollout(&proxy, 1).await);
    }
    let npz = || async {
        let url = format!("{}/export?format=npz&delete=true", proxy.url);
        let bytes = reqwest::get(url).await.unwrap().bytes().await.unwrap();
        let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes.to_vec())).unwrap();
        let described: Vec<Value> =
            serde_json::from_reader(zip.by_name("nodes.json").unwrap()).unwrap();
        let mut ids: Vec<String> = described
            .iter()
            .map(|row| row["session_id"].as_str().unwrap().to_string())
            .collect();
        ids.dedup();
        ids
    };
    let (first, second) = futures::join!(npz(), npz());
    assert!(
        first.iter().all(|id| !second.contains(id)),
        "{first:?} {second:?}"
    );
    let mut together = [first, second].concat();
    together.sort();
    all.sort();
    assert_eq!(together, all);
}
