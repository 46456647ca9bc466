//! A fleet as it is deployed: three replicas on one redis-server (Debian's, append-only,
//! fsynced on every write) behind HAProxy balancing round-robin with no stickiness. Rollouts
//! of eight turns each, half over chat completions and half over Messages, each request sent
//! with an `Idempotency-Key` and retried until it is answered. Mid-run one replica is killed
//! (`kill -9`) and started again, and then redis-server itself. At the end every node is
//! exact (one node per rollout, every reply the client got in it once, nothing else), and
//! three exports with `delete=true`, one per replica at once, hand every rollout out once.
//!
//! `FLEET_ROLLOUTS` (default 1,000) and `FLEET_CONCURRENCY` (default 32) size the run.

mod common;

use common::client::Client;
use common::fleet::{Balance, Haproxy, Replica};
use common::redis::RedisServer;
use common::{chars, env_or, prompt_determined_upstream, scratch_dir};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const TURNS: usize = 8;
/// Requests that were refused or cut off and sent again.
static RETRIED: AtomicUsize = AtomicUsize::new(0);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_balanced_fleet_loses_nothing_through_a_killed_replica_and_a_restarted_store() {
    let rollouts = env_or("FLEET_ROLLOUTS", 1000);
    let concurrency = env_or("FLEET_CONCURRENCY", 32);
    let dir = scratch_dir("fleet-balanced");
    let mut redis = RedisServer::start(&dir);
    let upstream = prompt_determined_upstream();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Replica::start(&redis.url(), &upstream.url).await);
    }
    let ports: Vec<u16> = replicas.iter().map(|r| r.port).collect();
    let haproxy = Haproxy::start(&dir, &ports, Balance::RoundRobin);
    let fleet = Arc::new(haproxy.client());

    let done = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (fleet, done, next) = (fleet.clone(), done.clone(), next.clone());
            tokio::spawn(async move {
                let mut finished = Vec::new();
                loop {
                    let rollout = next.fetch_add(1, Ordering::Relaxed);
                    if rollout >= rollouts {
                        return finished;
                    }
                    finished.push(run_rollout(&fleet, rollout, &done).await);
                }
            })
        })
        .collect();

    // The faults, each once the run is well under way: a replica killed and started again,
    // then the store.
    let total = rollouts * TURNS;
    wait_until(&done, total / 4).await;
    let victim = (std::process::id() as usize) % replicas.len();
    replicas[victim].kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    replicas[victim].restart().await;
    wait_until(&done, total * 3 / 5).await;
    redis.restart();

    let mut finished = Vec::new();
    for worker in workers {
        finished.extend(worker.await.unwrap());
    }
    assert_eq!(finished.len(), rollouts);
    // The faults were met mid-request, not between requests.
    assert!(RETRIED.load(Ordering::Relaxed) > 0);
    for rollout in &finished {
        rollout.assert_exact(&fleet).await;
    }

    // Three exports at once, one per replica, each deleting what it hands out.
    let exports = replicas.iter().map(|replica| {
        let client = replica.client();
        async move {
            let response = client
                .http
                .get(format!("{}/export?delete=true", client.base))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            response.text().await.unwrap()
        }
    });
    let mut handed_out: HashMap<String, usize> = HashMap::new();
    for text in futures::future::join_all(exports).await {
        for line in text.lines().filter(|l| !l.is_empty()) {
            let node: Value = serde_json::from_str(line).unwrap();
            let id = node["session_id"].as_str().unwrap().to_string();
            *handed_out.entry(id).or_default() += 1;
        }
    }
    for rollout in &finished {
        assert_eq!(handed_out.get(&rollout.uuid), Some(&1), "{}", rollout.uuid);
    }
    assert_eq!(handed_out.len(), rollouts);
}

/// A rollout as its client saw it.
struct Rollout {
    uuid: String,
    /// The user's messages and the replies, in order.
    exchanges: Vec<(String, String)>,
}

impl Rollout {
    /// The rollout's one node holds exactly the conversation its client had.
    async fn assert_exact(&self, fleet: &Client) {
        let (status, nodes) = fleet.get_json(&format!("/{}/nodes", self.uuid)).await;
        assert_eq!(status, 200, "{}: {nodes}", self.uuid);
        let nodes = nodes["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 1, "{}: one node: {nodes:#?}", self.uuid);
        let node = &nodes[0];
        assert_eq!(node["metadata"]["num_turns"], TURNS);
        let mut text = String::new();
        for (user, reply) in &self.exchanges {
            text.push_str(&format!(
                "<user>{user}</user><assistant>{reply}</assistant>"
            ));
        }
        let text = text.strip_suffix("</assistant>").unwrap();
        assert_eq!(node["full_text"], text, "{}", self.uuid);
        let tokens: Vec<u32> = serde_json::from_value(node["tokens"].clone()).unwrap();
        assert_eq!(tokens, chars(text));
        let sampled: Vec<u32> = common::sampled_ids(node);
        let replies: String = self.exchanges.iter().map(|(_, r)| r.as_str()).collect();
        assert_eq!(sampled, chars(&replies), "{}: what was sampled", self.uuid);
    }
}

async fn wait_until(done: &AtomicUsize, turns: usize) {
    while done.load(Ordering::Relaxed) < turns {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One rollout of [`TURNS`] turns through the fleet; even ones over chat, odd over Messages.
async fn run_rollout(fleet: &Client, rollout: usize, done: &AtomicUsize) -> Rollout {
    let created = send(
        fleet,
        "/sessions/create",
        json!({}),
        &format!("create-{rollout}"),
    )
    .await;
    let uuid = created["uuid"].as_str().unwrap().to_string();
    let messages_api = rollout % 2 == 1;
    let mut exchanges: Vec<(String, String)> = Vec::new();
    for turn in 0..TURNS {
        let user = format!("rollout {rollout} turn {turn}");
        let mut messages = Vec::new();
        for (asked, answered) in &exchanges {
            messages.push(json!({"role": "user", "content": asked}));
            messages.push(json!({"role": "assistant", "content": answered}));
        }
        messages.push(json!({"role": "user", "content": user}));
        let key = format!("{uuid}-{turn}");
        let reply = match messages_api {
            false => {
                let body = json!({ "messages": messages });
                let reply = send(fleet, &format!("/{uuid}/v1/chat/completions"), body, &key).await;
                reply["choices"][0]["message"]["content"].clone()
            }
            true => {
                let body = json!({ "max_tokens": 64, "messages": messages });
                let reply = send(fleet, &format!("/{uuid}/v1/messages"), body, &key).await;
                reply["content"][0]["text"].clone()
            }
        };
        exchanges.push((user, reply.as_str().unwrap().to_string()));
        done.fetch_add(1, Ordering::Relaxed);
    }
    Rollout { uuid, exchanges }
}

/// POSTs `body` to `path` with `key` as its `Idempotency-Key` until it is answered: a replica
/// killed mid-request, a store restarting, a lease left by the dead replica all get a retry.
async fn send(fleet: &Client, path: &str, body: Value, key: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let sent = fleet
            .http
            .post(format!("{}{path}", fleet.base))
            .header("Idempotency-Key", key)
            .json(&body)
            .timeout(Duration::from_secs(60))
            .send()
            .await;
        let refused = match sent {
            Ok(response) if response.status() == 200 => match response.json().await {
                Ok(reply) => return reply,
                Err(error) => error.to_string(),
            },
            Ok(response) => {
                let status = response.status();
                assert!(
                    [502, 503, 504].contains(&status.as_u16()),
                    "{path}: {status}: {}",
                    response.text().await.unwrap_or_default()
                );
                status.to_string()
            }
            Err(error) => error.to_string(),
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path}: never answered ({refused})"
        );
        RETRIED.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
