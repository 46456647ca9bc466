//! `serve --store redis://…`: sessions kept in a real redis-server (Debian's, started by each
//! test with append-only persistence fsynced on every write). Every replica serves every
//! session, turn after turn; a retry sent to another replica mid-turn is answered from the
//! first one's record; a replica killed with `kill -9` loses nothing and another serves its
//! sessions byte for byte; a replica paused past its lease writes nothing; a restarted store
//! keeps every acknowledged turn, and while the store is down turns and reads get a 503 and the
//! session stays as it was.

mod common;

use common::client::Client;
use common::fleet::Replica;
use common::mock_worker::{MockWorker, Reply, Sample};
use common::redis::RedisServer;
use common::{chars, free_port, prompt_determined_upstream, scratch_dir};
use serde_json::Value;

/// A replica (`serve --store`) before `upstream`, with its client.
async fn replica(store: &str, upstream: &str) -> (Replica, Client) {
    let replica = Replica::start(store, upstream).await;
    let client = replica.client();
    (replica, client)
}

/// Two replicas on a store of their own, before one upstream, and a session made on the first.
struct TwoReplicas {
    _redis: RedisServer,
    upstream: MockWorker,
    a: Replica,
    on_a: Client,
    _b: Replica,
    on_b: Client,
    uuid: String,
}

async fn two_replicas(name: &str) -> TwoReplicas {
    let redis = RedisServer::start(&scratch_dir(name));
    let upstream = prompt_determined_upstream();
    let (a, on_a) = replica(&redis.url(), &upstream.url).await;
    let (_b, on_b) = replica(&redis.url(), &upstream.url).await;
    let uuid = on_a.session().await;
    TwoReplicas {
        _redis: redis,
        upstream,
        a,
        on_a,
        _b,
        on_b,
        uuid,
    }
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
    on_a.delete_session(&deleted).await;
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
async fn every_replica_serves_every_session_at_once() {
    let dir = scratch_dir("fleet-any-replica");
    let redis = RedisServer::start(&dir);
    let upstream = prompt_determined_upstream();
    let (_a, on_a) = replica(&redis.url(), &upstream.url).await;
    let (_b, on_b) = replica(&redis.url(), &upstream.url).await;
    let (_c, on_c) = replica(&redis.url(), &upstream.url).await;
    let replicas = [&on_a, &on_b, &on_c];
    let (uuid, other) = (on_a.session().await, on_b.session().await);
    let mut messages = Vec::new();
    // Round-robin, as a load balancer without stickiness sends them.
    for (turn, user) in ["one", "two", "three", "four", "five", "six"]
        .iter()
        .enumerate()
    {
        assert_eq!(
            replicas[turn % 3]
                .try_turn(&uuid, &mut messages, user)
                .await,
            200
        );
    }
    let (_, on_one) = on_a.nodes_text(&uuid).await;
    for replica in replicas {
        assert_eq!(replica.nodes_text(&uuid).await, (200, on_one.clone()));
    }
    let nodes: Value = serde_json::from_str(&on_one).unwrap();
    let nodes = nodes["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1, "one node, extended by three replicas");
    assert_eq!(nodes[0]["metadata"]["num_turns"], 6);

    on_c.post(
        &format!("/{uuid}/reward"),
        serde_json::json!({"reward": 0.5}),
    )
    .await;
    let (_, listed) = on_a.get_json("/sessions").await;
    let listed = listed["sessions"].as_array().unwrap();
    let ids: Vec<&str> = listed.iter().map(|s| s["uuid"].as_str().unwrap()).collect();
    assert!(ids.contains(&uuid.as_str()) && ids.contains(&other.as_str()));
    let ours = listed.iter().find(|s| s["uuid"] == uuid.as_str()).unwrap();
    assert_eq!(ours["reward"], 0.5, "a reward given on C is seen on A");

    on_b.delete_session(&uuid).await;
    for replica in replicas {
        assert_eq!(replica.get_json(&format!("/{uuid}/nodes")).await.0, 404);
    }
}

/// An `Idempotency-Key` retry that a load balancer sends to another replica while the first
/// request still samples waits for it, and is answered from its record: one turn, one reply.
#[tokio::test]
async fn a_retry_sent_to_another_replica_is_answered_from_the_first_ones_record() {
    let fleet = two_replicas("fleet-retry").await;
    let (upstream, on_a, on_b, uuid) = (&fleet.upstream, &fleet.on_a, &fleet.on_b, &fleet.uuid);
    upstream.push(Reply::Delayed(
        1500,
        vec![Sample::stop(chars("slow answer"))],
    ));
    let keyed = |client: &Client| {
        client
            .http
            .post(format!("{}/{uuid}/v1/chat/completions", client.base))
            .header("Idempotency-Key", "turn-1")
            .json(&serde_json::json!({"messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };
    let first = keyed(on_a);
    let retry = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        keyed(on_b).await
    };
    let (first, retry) = tokio::join!(first, retry);
    let (first, retry) = (first.unwrap(), retry.unwrap());
    assert_eq!(
        (first.status().as_u16(), retry.status().as_u16()),
        (200, 200)
    );
    let first: Value = first.json().await.unwrap();
    let retry: Value = retry.json().await.unwrap();
    assert_eq!(first["choices"][0]["message"]["content"], "slow answer");
    assert_eq!(retry["choices"], first["choices"]);
    let (_, nodes) = on_b.get_json(&format!("/{uuid}/nodes")).await;
    assert_eq!(
        nodes["nodes"][0]["metadata"]["num_turns"], 1,
        "sampled once"
    );
}

/// A replica stopped mid-turn past its lease (a long pause, a partition) finds its turn
/// refused when it wakes: another replica continued the session meanwhile, and the node holds
/// that replica's turn only.
#[tokio::test]
async fn a_replica_paused_past_its_lease_writes_nothing() {
    let fleet = two_replicas("fleet-paused").await;
    let (upstream, on_a, on_b, uuid) = (&fleet.upstream, &fleet.on_a, &fleet.on_b, &fleet.uuid);
    upstream.push(Reply::Delayed(1000, vec![Sample::stop(chars("late"))]));
    let mut on_a_messages = Vec::new();
    let late = on_a.try_turn(uuid, &mut on_a_messages, "first");
    let pause = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        signal(&fleet.a, "STOP");
        // B waits for A's lease to run out (5 s), then takes the session over.
        let mut messages = Vec::new();
        let status = on_b.try_turn(uuid, &mut messages, "first").await;
        signal(&fleet.a, "CONT");
        status
    };
    let (late, continued) = tokio::join!(late, pause);
    assert_eq!((late, continued), (503, 200));
    let (_, nodes) = on_b.get_json(&format!("/{uuid}/nodes")).await;
    let nodes = nodes["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0]["metadata"]["num_turns"], 1);
    assert_eq!(on_a.nodes_text(uuid).await, on_b.nodes_text(uuid).await);
}

fn signal(replica: &Replica, signal: &str) {
    let sent = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(replica.process().0.id().to_string())
        .status()
        .unwrap();
    assert!(sent.success());
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
    // Nor are nodes read from a copy that may be behind: the trainer is told to wait.
    let (status, said) = on_a.nodes_text(&uuid).await;
    assert_eq!(status, 503, "{said}");
    redis.restart();
    let (_b, on_b) = replica(&redis.url(), &upstream.url).await;
    assert_eq!(on_b.nodes_text(&uuid).await, (200, acknowledged.clone()));
    assert_eq!(on_a.nodes_text(&uuid).await, (200, acknowledged));
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

/// `/pause`, `/weight_version` and `/resume` sent to one replica apply to the whole fleet, and
/// `/health` on any replica counts the fleet's turns at a backend: the one number a trainer
/// waits on before it swaps weights.
#[tokio::test]
async fn the_trainer_controls_the_whole_fleet_through_any_replica() {
    let fleet = two_replicas("fleet-control").await;
    let (upstream, on_a, on_b, uuid) = (&fleet.upstream, &fleet.on_a, &fleet.on_b, &fleet.uuid);
    // Asked at once, a replica that does not follow a pause yet is not counted as settled,
    // even while no turn is at a backend.
    wait_for_reports(on_a, 2).await;
    on_b.post("/pause", serde_json::json!({})).await;
    let (_, health) = on_a.get_json("/health").await;
    if health["paused"].is_null() {
        assert!(
            health["fleet"]["turns_at_backend"].as_u64().unwrap() >= 1,
            "{health}"
        );
    }
    on_b.post("/resume", serde_json::json!({})).await;
    fleet_at_backend_until(on_a, |at| at == 0).await;

    upstream.push(Reply::Delayed(1500, vec![Sample::stop(chars("slow"))]));
    let mut messages = Vec::new();
    let slow = on_a.try_turn(uuid, &mut messages, "under way");
    let trainer = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        on_b.post("/pause", serde_json::json!({"mode": "reject"}))
            .await;
        // A's turn at the backend is counted, and the count falls to 0 once it is done.
        let seen = fleet_at_backend_until(on_b, |at| at == 0).await;
        assert!(seen.contains(&1), "{seen:?}");
        let (_, health) = on_b.get_json("/health").await;
        assert_eq!(health["fleet"]["replicas"], 2);
        assert_eq!(health["fleet"]["replicas_paused"], 2);
    };
    let (slow, ()) = tokio::join!(slow, trainer);
    assert_eq!(
        slow, 200,
        "a turn at a backend when the pause came finishes"
    );
    let refused = on_a.try_turn(uuid, &mut messages.clone(), "paused").await;
    assert_eq!(refused, 429, "A follows B's pause");

    on_a.post(
        "/weight_version",
        serde_json::json!({"weight_version": "v7"}),
    )
    .await;
    on_a.post("/resume", serde_json::json!({})).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (_, health) = on_b.get_json("/health").await;
        if health["paused"].is_null() && health["weight_version"] == "v7" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{health}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(on_b.try_turn(uuid, &mut messages, "resumed").await, 200);
}

/// Polls `/health` until the fleet's turns at a backend satisfy `done`; every count seen.
async fn fleet_at_backend_until(client: &Client, done: impl Fn(u64) -> bool) -> Vec<u64> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        let (_, health) = client.get_json("/health").await;
        let at = health["fleet"]["turns_at_backend"].as_u64().unwrap();
        seen.push(at);
        if done(at) {
            return seen;
        }
        assert!(std::time::Instant::now() < deadline, "{seen:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Whichever replica serves a session's turn, it goes to the inference server the session's
/// previous turn ran on (the record says which), so that server's prefix cache still hits:
/// here the first turn goes to the second server (the first is busy on that replica), and the
/// other replicas, to which the first server looks idle, follow it there.
#[tokio::test]
async fn a_sessions_turns_stay_on_one_backend_across_replicas() {
    let dir = scratch_dir("fleet-backends");
    let redis = RedisServer::start(&dir);
    let (first, second) = (prompt_determined_upstream(), prompt_determined_upstream());
    let upstreams = [first.url.as_str(), second.url.as_str()];
    let mut running = Vec::new();
    for _ in 0..3 {
        running.push(Replica::before(&redis.url(), &upstreams).await);
    }
    let replicas: Vec<Client> = running.iter().map(Replica::client).collect();
    let (busy, uuid) = (replicas[0].session().await, replicas[0].session().await);
    first.push(Reply::Delayed(1500, vec![Sample::stop(chars("busy"))]));
    let mut busy_messages = Vec::new();
    let busy_turn = replicas[0].try_turn(&busy, &mut busy_messages, "keep the first busy");
    let session_turns = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let mut messages = Vec::new();
        for turn in 0..6 {
            let user = format!("turn {turn}");
            assert_eq!(
                replicas[turn % 3]
                    .try_turn(&uuid, &mut messages, &user)
                    .await,
                200
            );
        }
    };
    let (busy_status, ()) = tokio::join!(busy_turn, session_turns);
    assert_eq!(busy_status, 200);
    let (_, nodes) = replicas[1].get_json(&format!("/{uuid}/nodes")).await;
    let turns = nodes["nodes"][0]["metadata"]["turns"]
        .as_array()
        .unwrap()
        .clone();
    let backends: Vec<&str> = turns
        .iter()
        .map(|t| t["backend"].as_str().unwrap())
        .collect();
    assert_eq!(backends, [second.url.as_str(); 6]);
}

/// With `--session-ttl`, a session no replica changes for that long expires in the store
/// itself: every replica then answers 404 for it, and none lists it.
#[tokio::test]
async fn an_idle_session_expires_fleet_wide() {
    let dir = scratch_dir("fleet-ttl");
    let redis = RedisServer::start(&dir);
    let upstream = prompt_determined_upstream();
    let ttl = ["--session-ttl", "1"];
    let a = Replica::with_flags(&redis.url(), &[upstream.url.as_str()], &ttl).await;
    let b = Replica::with_flags(&redis.url(), &[upstream.url.as_str()], &ttl).await;
    let (on_a, on_b) = (a.client(), b.client());
    let (idle, used) = (on_a.session().await, on_a.session().await);
    on_a.turn(&idle, &mut Vec::new(), "once").await;
    let mut messages = Vec::new();
    // `used` changes every half second, on both replicas in turn; `idle` never again.
    for (turn, replica) in [&on_a, &on_b, &on_a, &on_b, &on_a].iter().enumerate() {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        replica
            .turn(&used, &mut messages, &format!("turn {turn}"))
            .await;
    }
    for replica in [&on_a, &on_b] {
        assert_eq!(replica.get_json(&format!("/{idle}/nodes")).await.0, 404);
        assert_eq!(replica.get_json(&format!("/{used}/nodes")).await.0, 200);
    }
    let (_, listed) = on_b.get_json("/sessions").await;
    let ids: Vec<&str> = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["uuid"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [used.as_str()]);
}

/// Waits until `/health` on `client` counts `replicas` replicas that reported.
async fn wait_for_reports(client: &Client, replicas: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, health) = client.get_json("/health").await;
        if health["fleet"]["replicas"] == replicas {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{health}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
