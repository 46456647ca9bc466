//! `serve --data-dir`: sessions survive `kill -9` and restarts byte for byte, a frame torn by
//! a crash mid-write is dropped (never half-applied), and deleted sessions' space is given
//! back.

mod common;

use common::client::Client;
use common::mock_worker::{MockWorker, Sample};
use common::{
    KillOnDrop, char_model_dir, chars, free_port, prompt_determined_upstream, scratch_dir,
    wait_for_health,
};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;

/// The `serve` command on `port` journaling into `dir`, before `upstream`.
fn command(dir: &Path, port: u16, upstream: &str) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rollout-proxy"));
    command
        .args(["serve", "--port", &port.to_string(), "--workers", "1"])
        .arg("--tokenizer")
        .arg(char_model_dir())
        .args(["--backend", upstream, "--backend-type", "sglang"])
        .arg("--data-dir")
        .arg(dir)
        .stdout(std::process::Stdio::null());
    command
}

/// A `serve` process on `port` journaling into `dir`, before `upstream`.
async fn serve(dir: &Path, port: u16, upstream: &str) -> KillOnDrop {
    started(command(dir, port, upstream), port).await
}

/// `command` started, once it answers.
async fn started(mut command: std::process::Command, port: u16) -> KillOnDrop {
    let server = KillOnDrop(command.spawn().unwrap());
    wait_for_health(&reqwest::Client::new(), &format!("http://127.0.0.1:{port}")).await;
    server
}

/// A scratch folder, an upstream, a port and a client for one test's proxy.
fn setup(name: &str) -> (std::path::PathBuf, MockWorker, u16, Client) {
    let port = free_port();
    (
        scratch_dir(name),
        prompt_determined_upstream(),
        port,
        Client::on(port),
    )
}

#[tokio::test]
async fn sessions_survive_kill_9_and_a_torn_frame_is_dropped() {
    let (dir, worker, port, client) = setup("durability-kill");
    let mut server = serve(&dir, port, &worker.url).await;
    let (kept, deleted) = (client.session().await, client.session().await);
    let mut messages = Vec::new();
    client.turn(&kept, &mut messages, "first").await;
    client.turn(&kept, &mut messages, "second").await;
    client.turn(&deleted, &mut Vec::new(), "gone").await;
    client
        .http
        .delete(format!("{}/{deleted}", client.base))
        .send()
        .await
        .unwrap();
    let (_, before) = client.nodes_text(&kept).await;

    drop(server); // SIGKILL: nothing is flushed or closed.
    server = serve(&dir, port, &worker.url).await;
    assert_eq!(
        client.nodes_text(&kept).await,
        (200, before.clone()),
        "byte-identical nodes"
    );
    assert_eq!(
        client.nodes_text(&deleted).await.0,
        404,
        "a deleted session stays deleted"
    );

    // The next turn extends the node as if nothing had happened.
    let journal = dir.join("journal");
    let size_before_turn = std::fs::metadata(&journal).unwrap().len();
    let mut continued = messages.clone();
    client.turn(&kept, &mut continued, "third").await;
    let (_, after) = client.nodes_text(&kept).await;
    let nodes: Value = serde_json::from_str(&after).unwrap();
    assert_eq!(nodes["nodes"].as_array().unwrap().len(), 1);
    assert_eq!(nodes["nodes"][0]["metadata"]["num_turns"], 3);

    // A crash in the middle of writing that turn's frame: it is dropped, not half-applied.
    drop(server);
    let size_after_turn = std::fs::metadata(&journal).unwrap().len();
    let torn = size_before_turn + (size_after_turn - size_before_turn) / 2;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&journal)
        .unwrap()
        .set_len(torn)
        .unwrap();
    let _server = serve(&dir, port, &worker.url).await;
    assert_eq!(
        client.nodes_text(&kept).await,
        (200, before),
        "back to the last whole turn"
    );
    assert_eq!(std::fs::metadata(&journal).unwrap().len(), size_before_turn);
    // And the rollout goes on from there.
    client.turn(&kept, &mut messages, "third again").await;
    let (_, after) = client.nodes_text(&kept).await;
    let nodes: Value = serde_json::from_str(&after).unwrap();
    assert_eq!(nodes["nodes"][0]["metadata"]["num_turns"], 3);
}

#[tokio::test]
async fn deleted_sessions_give_their_space_back() {
    let (dir, worker, port, client) = setup("durability-compaction");
    let server = serve(&dir, port, &worker.url).await;
    let kept = client.session().await;
    client.turn(&kept, &mut Vec::new(), "stay").await;
    for _ in 0..20 {
        let uuid = client.session().await;
        client
            .turn(&uuid, &mut Vec::new(), &"long words ".repeat(50))
            .await;
        client
            .http
            .delete(format!("{}/{uuid}", client.base))
            .send()
            .await
            .unwrap();
    }
    let (_, before) = client.nodes_text(&kept).await;
    let journal = dir.join("journal");
    let full = std::fs::metadata(&journal).unwrap().len();
    drop(server);
    let _server = serve(&dir, port, &worker.url).await;
    let compacted = std::fs::metadata(&journal).unwrap().len();
    assert!(
        compacted * 5 < full,
        "compacted at start: {full} → {compacted} bytes"
    );
    assert_eq!(client.nodes_text(&kept).await, (200, before));
    let health = wait_for_health(&client.http, &client.base).await;
    assert_eq!(health["sessions"], 1);
}

/// SIGTERM: new work is refused with a 503 and `Retry-After`, the stream under way finishes
/// and is journaled, and the process exits 0; a restart serves the finished turn.
#[tokio::test]
async fn sigterm_drains_turns_under_way_then_exits_cleanly() {
    let (dir, worker, port, client) = setup("durability-drain");
    worker.set_token_delay(40);
    let mut server = serve(&dir, port, &worker.url).await;
    let uuid = client.session().await;
    let streamed = client
        .http
        .post(format!("{}/{uuid}/v1/chat/completions", client.base))
        .json(&json!({"messages": [{"role": "user", "content": "slowly"}], "stream": true}))
        .send();
    let stream = tokio::spawn(async move { streamed.await.unwrap().text().await.unwrap() });
    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    // SAFETY: a plain kill(2) of our own child.
    unsafe { libc::kill(server.0.id() as i32, libc::SIGTERM) };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let refused = client
        .http
        .post(format!("{}/sessions/create", client.base))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "5");
    let text = stream.await.unwrap();
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "the stream finished: {text}"
    );
    let status = server.0.wait().unwrap();
    assert!(status.success(), "exit status {status}");

    server = serve(&dir, port, &worker.url).await;
    let (status, nodes) = client.nodes_text(&uuid).await;
    assert_eq!(status, 200);
    let nodes: Value = serde_json::from_str(&nodes).unwrap();
    assert_eq!(
        nodes["nodes"][0]["metadata"]["num_turns"], 1,
        "the drained turn was journaled"
    );
    drop(server);
}

/// Stored Responses API replies survive a restart: `GET` finds them and a request continues
/// one by `previous_response_id`, extending the same node.
#[tokio::test]
async fn stored_responses_survive_a_restart() {
    let (dir, worker, port, client) = setup("durability-responses");
    let server = serve(&dir, port, &worker.url).await;
    let uuid = client.session().await;
    let first = client
        .post(&format!("/{uuid}/v1/responses"), json!({"input": "hello"}))
        .await;
    let id = first["id"].as_str().unwrap().to_string();
    drop(server);
    let _server = serve(&dir, port, &worker.url).await;
    let stored: Value = client
        .http
        .get(format!("{}/{uuid}/v1/responses/{id}", client.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stored, first);
    let next = client
        .post(
            &format!("/{uuid}/v1/responses"),
            json!({"input": "and again", "previous_response_id": id}),
        )
        .await;
    assert_eq!(next["status"], "completed", "{next}");
    let (_, nodes) = client.nodes_text(&uuid).await;
    let nodes: Value = serde_json::from_str(&nodes).unwrap();
    assert_eq!(nodes["nodes"].as_array().unwrap().len(), 1, "{nodes}");
    assert_eq!(nodes["nodes"][0]["metadata"]["num_turns"], 2);
}

/// A reply kept under an `Idempotency-Key` is journaled: a retry after a restart gets it,
/// without a second sample.
#[tokio::test]
async fn an_idempotent_reply_survives_a_restart() {
    let (dir, worker, port, client) = setup("durability-idempotency");
    let server = serve(&dir, port, &worker.url).await;
    let uuid = client.session().await;
    let body = json!({"messages": [{"role": "user", "content": "once"}]});
    let send = || {
        client
            .http
            .post(format!("{}/{uuid}/v1/chat/completions", client.base))
            .header("idempotency-key", "turn-1")
            .json(&body)
            .send()
    };
    let first = send().await.unwrap().text().await.unwrap();
    drop(server);
    let _server = serve(&dir, port, &worker.url).await;
    let retry = send().await.unwrap();
    assert!(retry.headers().contains_key("idempotent-replayed"));
    assert_eq!(retry.text().await.unwrap(), first);
    let (_, nodes) = client.nodes_text(&uuid).await;
    let nodes: Value = serde_json::from_str(&nodes).unwrap();
    assert_eq!(
        nodes["nodes"][0]["metadata"]["num_turns"], 1,
        "not sampled again"
    );
}

/// Rewrites the journal in `dir` without its kept replies (kind 6 entries): as if the proxy
/// had been killed after each keyed turn was journaled but before its reply was sent.
fn forget_replies(dir: &Path) {
    let journal = dir.join("journal");
    let bytes = std::fs::read(&journal).unwrap();
    let mut kept = bytes[..8].to_vec();
    let mut at = 8;
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let frame = &bytes[at..at + 12 + len];
        if frame[12] != 6 {
            kept.extend_from_slice(frame);
        }
        at += 12 + len;
    }
    assert!(kept.len() < bytes.len(), "the replies were journaled");
    std::fs::write(&journal, kept).unwrap();
}

#[tokio::test]
async fn a_keyed_turn_recorded_before_a_crash_is_answered_from_its_record() {
    let (dir, worker, port, client) = setup("durability-recorded-turn");
    worker.respond_with(Arc::new(|prompt: &[u32]| {
        let call = r#"<tool_call>{"name": "lookup", "arguments": {"q": "x"}}</tool_call>"#;
        Sample::stop(chars(&format!("checking {}{call}", prompt.len())))
    }));
    let server = serve(&dir, port, &worker.url).await;
    let uuid = client.session().await;
    let tool = json!({"type": "function", "function": {"name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}});
    let chat = json!({"messages": [{"role": "user", "content": "look"}], "tools": [tool]});
    let messages = json!({"max_tokens": 50, "stream": true,
        "messages": [{"role": "user", "content": "look again"}],
        "tools": [{"name": "lookup", "input_schema": tool["function"]["parameters"]}]});
    let send = |path: String, key: &str, body: &Value| {
        client
            .http
            .post(format!("{}{path}", client.base))
            .header("idempotency-key", key)
            .json(body)
            .send()
    };
    let chat_path = format!("/{uuid}/v1/chat/completions");
    let first: Value = send(chat_path.clone(), "chat-1", &chat)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let other = client.session().await;
    let messages_path = format!("/{other}/v1/messages");
    let send_messages = || async {
        let response = send(messages_path.clone(), "messages-1", &messages).await;
        response.unwrap().text().await.unwrap()
    };
    let first_stream = send_messages().await;
    let (_, nodes_before) = client.nodes_text(&uuid).await;
    let (_, other_before) = client.nodes_text(&other).await;
    let sampled = worker.requests().len();

    drop(server);
    forget_replies(&dir);
    let _server = serve(&dir, port, &worker.url).await;
    let retry = send(chat_path, "chat-1", &chat).await.unwrap();
    assert_eq!(retry.status(), 200);
    assert!(retry.headers().contains_key("idempotent-replayed"));
    let retry: Value = retry.json().await.unwrap();
    assert_eq!(
        retry["choices"][0]["message"],
        first["choices"][0]["message"]
    );
    assert_eq!(
        retry["choices"][0]["message"]["tool_calls"][0]["id"],
        "call_0"
    );
    assert_eq!(retry["usage"], first["usage"]);
    let retry_stream = send_messages().await;
    let blocks = |raw: &str| -> Vec<Value> {
        common::sse_events(raw)
            .into_iter()
            .filter(|(name, _)| name == "content_block_start" || name == "content_block_delta")
            .map(|(_, data)| data)
            .collect()
    };
    assert_eq!(blocks(&retry_stream), blocks(&first_stream));
    assert!(retry_stream.contains("message_stop"));
    assert_eq!(worker.requests().len(), sampled, "nothing sampled again");
    assert_eq!(client.nodes_text(&uuid).await.1, nodes_before, "no fork");
    assert_eq!(client.nodes_text(&other).await.1, other_before, "no fork");

    // The rollout goes on from the replayed reply, on the same node.
    let mut next = chat.clone();
    let history = next["messages"].as_array_mut().unwrap();
    history.push(retry["choices"][0]["message"].clone());
    history.push(json!({"role": "tool", "tool_call_id": "call_0", "content": "found"}));
    client
        .post(&format!("/{uuid}/v1/chat/completions"), next)
        .await;
    let (_, after) = client.nodes_text(&uuid).await;
    let after: Value = serde_json::from_str(&after).unwrap();
    assert_eq!(after["nodes"].as_array().unwrap().len(), 1);
    assert_eq!(after["nodes"][0]["metadata"]["num_turns"], 2);
}

#[tokio::test]
async fn a_reward_survives_a_restart() {
    let (dir, worker, port, client) = setup("durability-reward");
    let server = serve(&dir, port, &worker.url).await;
    let uuid = client.session().await;
    client.turn(&uuid, &mut Vec::new(), "go").await;
    let reward = json!({"reward": -2.5, "metadata": {"judge": "unit tests", "passed": false}});
    client.post(&format!("/{uuid}/reward"), reward).await;
    let export = || async {
        let url = format!("{}/export?finished=true", client.base);
        client
            .http
            .get(url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let before = export().await;
    drop(server);
    let _server = serve(&dir, port, &worker.url).await;
    let after = export().await;
    let line: Value = serde_json::from_str(after.lines().next().unwrap()).unwrap();
    assert_eq!(
        (line["reward"].clone(), line["metadata"]["judge"].clone()),
        (json!(-2.5), json!("unit tests"))
    );
    // Everything but the last-use time reads back the same.
    let without_use = |text: &str| text.split("\"last_accessed\"").next().unwrap().to_string();
    assert_eq!(without_use(&after), without_use(&before));
}

#[tokio::test]
async fn a_second_proxy_on_the_same_data_dir_is_refused_naming_the_first() {
    let (dir, worker, port, client) = setup("durability-lock");
    let first = serve(&dir, port, &worker.url).await;
    let uuid = client.session().await;
    client.turn(&uuid, &mut Vec::new(), "mine").await;
    let (_, before) = client.nodes_text(&uuid).await;
    let journal = std::fs::read(dir.join("journal")).unwrap();
    let second = command(&dir, free_port(), &worker.url)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert!(!second.status.success());
    let said = String::from_utf8_lossy(&second.stderr);
    let holder = format!("in use by rollout-proxy pid {}", first.0.id());
    assert!(said.contains(&holder), "{said}");
    assert_eq!(
        std::fs::read(dir.join("journal")).unwrap(),
        journal,
        "not a byte written"
    );
    assert_eq!(client.nodes_text(&uuid).await, (200, before));
}

/// Sets the soft limit on the size of files process `pid` writes (`None`: no limit).
fn limit_file_size(pid: u32, bytes: Option<u64>) {
    let limit = libc::rlimit {
        rlim_cur: bytes.unwrap_or(libc::RLIM_INFINITY),
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a plain system call on another process's limits, with a valid struct.
    let done = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_FSIZE,
            &limit,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(done, 0, "prlimit: {}", std::io::Error::last_os_error());
}

#[tokio::test]
async fn a_turn_refused_for_a_full_disk_leaves_no_byte_behind() {
    let (dir, worker, port, client) = setup("durability-full");
    let mut command = command(&dir, port, &worker.url);
    // A file grown past its limit is refused with EFBIG, as a full disk refuses with ENOSPC
    // (the signal that would kill the process is ignored, as a server ignores it).
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut server = started(command, port).await;
    let uuid = client.session().await;
    let journal = dir.join("journal");
    let (mut messages, mut served, mut refused) = (Vec::new(), 0, 0);
    for turn in 0..12 {
        if turn == 4 {
            // Room for a few bytes only: the next frame is written in part.
            let size = std::fs::metadata(&journal).unwrap().len();
            limit_file_size(server.0.id(), Some(size + 40));
        }
        if turn == 8 {
            limit_file_size(server.0.id(), None);
        }
        messages.push(json!({"role": "user", "content": format!("turn {turn}")}));
        let response = client
            .http
            .post(format!("{}/{uuid}/v1/chat/completions", client.base))
            .json(&json!({"messages": messages}))
            .send()
            .await
            .unwrap();
        match response.status().as_u16() {
            200 => {
                let reply: Value = response.json().await.unwrap();
                messages.push(reply["choices"][0]["message"].clone());
                served += 1;
            }
            status => {
                assert_eq!(status, 503, "{}", response.text().await.unwrap());
                // The client was told the turn failed: it is not part of the conversation.
                messages.pop();
                refused += 1;
            }
        }
    }
    assert_eq!((served, refused), (8, 4));
    let (_, before) = client.nodes_text(&uuid).await;
    drop(server);
    server = serve(&dir, port, &worker.url).await;
    let (status, after) = client.nodes_text(&uuid).await;
    assert_eq!(status, 200);
    let nodes: Value = serde_json::from_str(&after).unwrap();
    assert_eq!(
        nodes["nodes"][0]["metadata"]["num_turns"], served,
        "only what was served"
    );
    assert_eq!(after, before, "byte-identical");
    drop(server);
}

#[tokio::test]
async fn damage_mid_journal_keeps_every_later_record_and_a_copy() {
    let (dir, worker, port, client) = setup("durability-damage");
    let server = serve(&dir, port, &worker.url).await;
    let (first, second) = (client.session().await, client.session().await);
    let journal = dir.join("journal");
    let mut earlier = Vec::new();
    client.turn(&first, &mut earlier, "early").await;
    let damaged_from = std::fs::metadata(&journal).unwrap().len();
    client.turn(&first, &mut earlier, "hit").await;
    let damaged_to = std::fs::metadata(&journal).unwrap().len();
    let mut later = Vec::new();
    for turn in ["later", "later still"] {
        client.turn(&second, &mut later, turn).await;
    }
    let (_, second_before) = client.nodes_text(&second).await;
    drop(server);
    // One flipped byte inside the frame of the second turn.
    let mut bytes = std::fs::read(&journal).unwrap();
    let original = bytes.clone();
    bytes[((damaged_from + damaged_to) / 2) as usize] ^= 0x40;
    std::fs::write(&journal, &bytes).unwrap();

    let _server = serve(&dir, port, &worker.url).await;
    assert_eq!(
        client.nodes_text(&second).await,
        (200, second_before),
        "the records after the damage are kept"
    );
    let (_, nodes) = client.nodes_text(&first).await;
    let nodes: Value = serde_json::from_str(&nodes).unwrap();
    assert_eq!(
        nodes["nodes"][0]["metadata"]["num_turns"], 1,
        "only the damaged turn is lost (it had two)"
    );
    let (_, health) = client.get_json("/health").await;
    let recovered = &health["journal"]["recovered"];
    assert_eq!(
        recovered["regions"].as_array().unwrap().len(),
        1,
        "{health}"
    );
    let copy = recovered["copy"].as_str().unwrap();
    assert_eq!(
        std::fs::read(copy).unwrap(),
        bytes,
        "the file as it was is kept"
    );
    assert_ne!(bytes, original);
}

#[tokio::test]
async fn a_frames_length_field_sizes_no_allocation() {
    let (dir, worker, port, client) = setup("durability-lengths");
    std::fs::create_dir_all(&dir).unwrap();
    // The magic, then a header claiming a 4 GiB frame, and nothing of it.
    let mut bytes = b"RPJRNL01".to_vec();
    bytes.extend_from_slice(&[0xFF; 16]);
    std::fs::write(dir.join("journal"), &bytes).unwrap();
    let mut command = command(&dir, port, &worker.url);
    // 1 GiB of address space, several times what the proxy uses: a 4 GiB buffer cannot be had.
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            let limit = libc::rlimit {
                rlim_cur: 1 << 30,
                rlim_max: 1 << 30,
            };
            libc::setrlimit(libc::RLIMIT_AS, &limit);
            Ok(())
        });
    }
    let mut server = KillOnDrop(command.spawn().unwrap());
    loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            panic!("the proxy died reading the journal: {status}");
        }
        if client
            .http
            .get(format!("{}/health", client.base))
            .send()
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let uuid = client.session().await;
    client.turn(&uuid, &mut Vec::new(), "after").await;
    assert_eq!(client.nodes_text(&uuid).await.0, 200);
}
