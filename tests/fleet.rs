//! `serve --store redis://…`: sessions kept in a real redis-server (Debian's, started by each
//! test with append-only persistence fsynced on every write). A replica killed with `kill -9`
//! loses nothing and another started on the store serves its sessions byte for byte; a
//! replica whose copy of a session another changed refuses the turn (503) rather than let the
//! node diverge; a restarted store keeps every acknowledged turn, and a store that is down
//! refuses turns with a 503 and leaves the session as it was.

mod common;

use common::client::Client;
use common::redis::RedisServer;
use common::{KillOnDrop, char_model_dir, free_port, prompt_determined_upstream, scratch_dir};
use serde_json::Value;

/// A replica (`serve --store`) on a free port, before `upstream`; with its client.
async fn replica(store: &str, upstream: &str) -> (KillOnDrop, Client) {
    let port = free_port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_rollout-proxy"))
        .args(["serve", "--port", &port.to_string(), "--workers", "1"])
        .arg("--tokenizer")
        .arg(char_model_dir())
        .args(["--backend", upstream, "--backend-type", "sglang"])
        .args(["--store", store])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let client = Client::on(port);
    common::wait_for_health(&client.http, &client.base).await;
    (KillOnDrop(child), client)
}

#[tokio::test]
async fn a_killed_replicas_sessions_are_served_exactly_by_another() {
    let dir = scratch_dir("fleet-takeover");
    let redis = RedisServer::start(&dir);
    let upstream = prompt_determined_upstream();
    let (a, on_a) = replica(&redis.url(), &upstream.url).await;
    let (kept, deleted) = (on_a.session().await, on_a.session().await);
    let mut messages = Vec::new();
    for user in ["first", "second", "third"] {
        assert_eq!(on_a.try_turn(&kept, &mut messages, user).await, 200);
    }
    assert_eq!(on_a.try_turn(&deleted, &mut Vec::new(), "gone").await, 200);
    let gone = on_a
        .http
        .delete(format!("{}/{deleted}", on_a.base))
        .send()
        .await
        .unwrap();
    assert!(gone.status().is_success());
    let (_, before) = on_a.nodes_text(&kept).await;

    drop(a); // SIGKILL: nothing is flushed or closed.
    let (_b, on_b) = replica(&redis.url(), &upstream.url).await;
    assert_eq!(
        on_b.nodes_text(&kept).await,
        (200, before.clone()),
        "byte for byte"
    );
    assert_eq!(on_b.get_json(&format!("/{deleted}/nodes")).await.0, 404);
    assert_eq!(on_b.try_turn(&kept, &mut messages, "fourth").await, 200);
    let (_, nodes) = on_b.get_json(&format!("/{kept}/nodes")).await;
    let nodes = nodes["nodes"].as_array().unwrap().clone();
    assert_eq!(nodes.len(), 1, "one node across replicas");
    let earlier: Value = serde_json::from_str(&before).unwrap();
    let earlier = earlier["nodes"][0]["tokens"].as_array().unwrap();
    let tokens = nodes[0]["tokens"].as_array().unwrap();
    assert!(tokens.len() > earlier.len() && tokens.starts_with(earlier));
}

#[tokio::test]
async fn a_replica_whose_copy_another_changed_refuses_rather_than_diverge() {
    let dir = scratch_dir("fleet-stale");
    let redis = RedisServer::start(&dir);
    let upstream = prompt_determined_upstream();
    let (_a, on_a) = replica(&redis.url(), &upstream.url).await;
    let uuid = on_a.session().await;
    let mut messages = Vec::new();
    assert_eq!(on_a.try_turn(&uuid, &mut messages, "first").await, 200);
    // B loads the session as it is now; A then changes it.
    let (_b, on_b) = replica(&redis.url(), &upstream.url).await;
    let mut on_b_messages = messages.clone();
    assert_eq!(on_a.try_turn(&uuid, &mut messages, "second").await, 200);
    let (_, after_a) = on_a.nodes_text(&uuid).await;

    assert_eq!(
        on_b.try_turn(&uuid, &mut on_b_messages, "second").await,
        503
    );
    let (_c, on_c) = replica(&redis.url(), &upstream.url).await;
    assert_eq!(
        on_c.nodes_text(&uuid).await,
        (200, after_a),
        "the store holds A's turns only"
    );
}

#[tokio::test]
async fn a_restarted_store_keeps_every_acknowledged_turn_and_a_dead_one_refuses() {
    let dir = scratch_dir("fleet-store-restart");
    let mut redis = RedisServer::start(&dir);
    let upstream = prompt_determined_upstream();
    let (_a, on_a) = replica(&redis.url(), &upstream.url).await;
    let uuid = on_a.session().await;
    let mut messages = Vec::new();
    assert_eq!(on_a.try_turn(&uuid, &mut messages, "first").await, 200);
    redis.restart(); // SIGKILL, then the same port and append-only file.
    // The connection comes back by itself; a turn in the gap is refused, not half-kept.
    let mut status = 0;
    for _ in 0..20 {
        status = on_a.try_turn(&uuid, &mut messages, "second").await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 503);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(status, 200, "the replica reconnects");
    let (_, acknowledged) = on_a.nodes_text(&uuid).await;

    redis.stop();
    assert_eq!(
        on_a.try_turn(&uuid, &mut messages.clone(), "third").await,
        503
    );
    assert_eq!(on_a.nodes_text(&uuid).await, (200, acknowledged.clone()));
    redis.restart();
    let (_b, on_b) = replica(&redis.url(), &upstream.url).await;
    assert_eq!(on_b.nodes_text(&uuid).await, (200, acknowledged));
}

#[test]
fn sessions_are_kept_in_one_place_only() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_rollout-proxy"))
        .args(["serve", "--port", &free_port().to_string()])
        .args(["--data-dir", "unused", "--store", "redis://127.0.0.1:1/0"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("--data-dir") && said.contains("--store"),
        "{said}"
    );
}
