//! What keeping sessions costs, side by side in one run: the load generator's rollouts (its
//! workload, `load/`) against the proxy keeping sessions in memory, in `--data-dir`, and in a
//! redis-server (`--store`; Debian's, append-only, fsynced on every write), then against a
//! fleet of 1, 2 and 3 replicas on that store behind HAProxy (round-robin, no stickiness), and
//! of 3 with each session's requests sent to one replica (HAProxy's `balance uri depth 1`).
//!
//! For each: turns per second, the proxy's CPU per turn (every replica's), redis-server's and
//! HAProxy's CPU per turn, turn latency p50/p99, and the store's commands and bytes per turn
//! (its `INFO stats`). Each round runs every setup once, in turn, each on fresh processes; the
//! medians over rounds are printed last.
//!
//! `cargo bench --bench fleet` (needs scripts/fetch-fixtures.sh and
//! scripts/install-fleet-parts.sh). `FLEET_ROUNDS` (3), `LOAD_API` (`chat`), `LOAD_C` (32),
//! `LOAD_R` (400), `LOAD_T` (6). Under `cargo test --all-targets` it runs a small smoke version.

#[path = "load/apis.rs"]
mod apis;
#[path = "../tests/common/mod.rs"]
mod common;
#[path = "load/proxy.rs"]
mod proxy;
#[path = "load/rollouts.rs"]
mod rollouts;
#[path = "load/workload.rs"]
mod workload;

use apis::Api;
use common::fleet::{Balance, Haproxy};
use common::redis::RedisServer;
use common::{env_or, fixture_model, free_port};
use proxy::{ProxyProcess, threads_cpu_ns};
use rollout_proxy::tokenizer::Tokenizer;
use rollouts::{percentile, rollout, upstream};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Where a setup keeps sessions, and how many replicas serve them.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Setup {
    Memory,
    DataDir,
    Store,
    /// Replicas on the store behind HAProxy, round-robin.
    Fleet(usize),
    /// Replicas on the store behind HAProxy, each session's requests to one replica.
    FleetBySession(usize),
}

impl Setup {
    fn name(self) -> String {
        match self {
            Setup::Memory => "memory".into(),
            Setup::DataDir => "--data-dir".into(),
            Setup::Store => "--store".into(),
            Setup::Fleet(n) => format!("fleet of {n}, round-robin"),
            Setup::FleetBySession(n) => format!("fleet of {n}, by session"),
        }
    }
}

/// The commands a client sends on their own (the others run inside these: in a script, or
/// between `MULTI` and `EXEC`), less `INFO`, which is this benchmark's.
const ROUND_TRIPS: [&str; 7] = [
    "cmdstat_evalsha",
    "cmdstat_eval",
    "cmdstat_exec",
    "cmdstat_hmget",
    "cmdstat_hset",
    "cmdstat_hdel",
    "cmdstat_zrange",
];

/// One setup's run.
#[derive(Debug, Clone, Default)]
struct Measured {
    turns_per_s: f64,
    proxy_ms: f64,
    redis_ms: f64,
    haproxy_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    commands: f64,
    round_trips: f64,
    bytes_in: f64,
    bytes_out: f64,
}

/// The load: rollouts, how many at once, turns each.
#[derive(Debug, Clone, Copy)]
struct Load {
    api: Api,
    concurrency: usize,
    rollouts: usize,
    turns: usize,
}

fn main() {
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let (rounds, load) = match benchmarking {
        true => (
            env_or("FLEET_ROUNDS", 3),
            Load {
                api: Api::from_env(),
                concurrency: env_or("LOAD_C", 32),
                rollouts: env_or("LOAD_R", 400),
                turns: env_or("LOAD_T", 6),
            },
        ),
        false => (
            1,
            Load {
                api: Api::from_env(),
                concurrency: 4,
                rollouts: 8,
                turns: 6,
            },
        ),
    };
    let tokenizer = Tokenizer::from_path(&fixture_model("qwen3")).unwrap();
    let worker = upstream(&tokenizer);
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-fleet");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let redis = RedisServer::start(&dir);
    let setups = [
        Setup::Memory,
        Setup::DataDir,
        Setup::Store,
        Setup::Fleet(1),
        Setup::Fleet(2),
        Setup::Fleet(3),
        Setup::FleetBySession(3),
    ];
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut all: HashMap<String, Vec<Measured>> = HashMap::new();
    println!(
        "fleet ({}): C={} R={} T={}, zero-latency upstream, redis-server appendfsync always",
        load.api.name(),
        load.concurrency,
        load.rollouts,
        load.turns
    );
    for round in 1..=rounds {
        for &setup in &setups {
            redis.flush();
            let measured = runtime.block_on(run(setup, load, &worker.url, &redis, &dir));
            print_row(&format!("round {round}: {}", setup.name()), &measured);
            all.entry(setup.name()).or_default().push(measured);
        }
    }
    println!("medians over {rounds} rounds:");
    for setup in setups {
        let runs = &all[&setup.name()];
        let median = |field: fn(&Measured) -> f64| {
            let mut values: Vec<f64> = runs.iter().map(field).collect();
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        let row = Measured {
            turns_per_s: median(|m| m.turns_per_s),
            proxy_ms: median(|m| m.proxy_ms),
            redis_ms: median(|m| m.redis_ms),
            haproxy_ms: median(|m| m.haproxy_ms),
            p50_ms: median(|m| m.p50_ms),
            p99_ms: median(|m| m.p99_ms),
            commands: median(|m| m.commands),
            round_trips: median(|m| m.round_trips),
            bytes_in: median(|m| m.bytes_in),
            bytes_out: median(|m| m.bytes_out),
        };
        print_row(&setup.name(), &row);
    }
}

fn print_row(name: &str, m: &Measured) {
    println!(
        "  {name:<28} {:>6.0} turns/s  CPU/turn: proxy {:.3} ms, redis {:.3} ms, haproxy {:.3} ms  p50/p99 {:.2}/{:.2} ms  store/turn: {:.1} round trips ({:.1} commands), {:.0} B in, {:.0} B out",
        m.turns_per_s,
        m.proxy_ms,
        m.redis_ms,
        m.haproxy_ms,
        m.p50_ms,
        m.p99_ms,
        m.round_trips,
        m.commands,
        m.bytes_in,
        m.bytes_out
    );
}

/// Starts `setup`'s processes, runs the load through them, and stops them.
async fn run(
    setup: Setup,
    load: Load,
    upstream: &str,
    redis: &RedisServer,
    dir: &std::path::Path,
) -> Measured {
    let store = redis.url();
    let data_dir = dir.join(format!("data-{}", free_port()));
    let flags: Vec<&str> = match setup {
        Setup::Memory => vec![],
        Setup::DataDir => vec!["--data-dir", data_dir.to_str().unwrap()],
        Setup::Store | Setup::Fleet(_) | Setup::FleetBySession(_) => vec!["--store", &store],
    };
    let replicas: Vec<ProxyProcess> = (0..match setup {
        Setup::Fleet(n) | Setup::FleetBySession(n) => n,
        _ => 1,
    })
        .map(|_| ProxyProcess::rollout_proxy(upstream, free_port(), &flags))
        .collect();
    for replica in &replicas {
        common::wait_for_health(&reqwest::Client::new(), &replica.url).await;
    }
    let ports: Vec<u16> = replicas
        .iter()
        .map(|r| r.url.rsplit(':').next().unwrap().parse().unwrap())
        .collect();
    let haproxy = match setup {
        Setup::Fleet(_) => Some(Haproxy::start(dir, &ports, Balance::RoundRobin)),
        Setup::FleetBySession(_) => Some(Haproxy::start(dir, &ports, Balance::BySession)),
        _ => None,
    };
    let base = match &haproxy {
        Some(haproxy) => format!("http://127.0.0.1:{}", haproxy.port),
        None => replicas[0].url.clone(),
    };
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(load.concurrency)
        .build()
        .unwrap();
    // Warm-up: one rollout per replica.
    for index in 0..replicas.len() {
        rollout(&client, &base, load.api, index, load.turns).await;
    }
    let (mut redis_seen, mut haproxy_seen) = (HashMap::new(), HashMap::new());
    let mut cpu = |replicas: &[ProxyProcess]| {
        let proxy: u64 = replicas.iter().map(ProxyProcess::cpu_ns).sum();
        let redis_cpu = threads_cpu_ns(redis.pid(), &mut redis_seen);
        let haproxy_cpu = haproxy
            .as_ref()
            .map_or(0, |h| threads_cpu_ns(h.process.0.id(), &mut haproxy_seen));
        (proxy, redis_cpu, haproxy_cpu)
    };
    let stats_before = redis.stats();
    let cpu_before = cpu(&replicas);
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let workers = (0..load.concurrency).map(|_| {
        let (client, base, next) = (client.clone(), base.clone(), next.clone());
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= load.rollouts {
                    return latencies;
                }
                latencies.extend(rollout(&client, &base, load.api, index, load.turns).await);
            }
        })
    });
    let mut latencies: Vec<Duration> = futures::future::join_all(workers)
        .await
        .into_iter()
        .flat_map(Result::unwrap)
        .collect();
    let wall = started.elapsed().as_secs_f64();
    let cpu_after = cpu(&replicas);
    let stats_after = redis.stats();
    latencies.sort();
    let turns = latencies.len() as f64;
    let per_turn_ms = |before: u64, after: u64| (after - before) as f64 / 1e6 / turns;
    let count = |stats: &HashMap<String, u64>, name: &str| stats.get(name).copied().unwrap_or(0);
    let stat = |name: &str| (count(&stats_after, name) - count(&stats_before, name)) as f64 / turns;
    Measured {
        turns_per_s: turns / wall,
        proxy_ms: per_turn_ms(cpu_before.0, cpu_after.0),
        redis_ms: per_turn_ms(cpu_before.1, cpu_after.1),
        haproxy_ms: per_turn_ms(cpu_before.2, cpu_after.2),
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
        commands: stat("total_commands_processed"),
        round_trips: ROUND_TRIPS.iter().map(|name| stat(name)).sum(),
        bytes_in: stat("total_net_input_bytes"),
        bytes_out: stat("total_net_output_bytes"),
    }
}
