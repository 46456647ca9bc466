//! Side-by-side benchmark of the `redis` (ConnectionManager + Script::invoke_async)
//! and `fred` (Client + script_load/evalsha) crates on a session-store turn:
//! ACQUIRE script -> APPEND script -> RELEASE script, all by EVALSHA.
//!
//! Usage: bench --port P [--turns 20000] [--tasks 32] [--rounds 4] [--nodelay] [--warmup 2000]
//! The redis-server on P must already be running (see ../run.sh).

use std::sync::Arc;
use std::time::{Duration, Instant};

const ACQUIRE_LUA: &str = "if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, 0} end local held = redis.call('GET', KEYS[2]) if held and string.sub(held, 1, string.len(ARGV[1]) + 1) ~= ARGV[1] .. ':' then return {0, redis.call('PTTL', KEYS[2])} end local token = redis.call('INCR', KEYS[3]) redis.call('SET', KEYS[2], ARGV[1] .. ':' .. token, 'PX', ARGV[2]) return {token, redis.call('LLEN', KEYS[1])}";
const APPEND_LUA: &str = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {0, 0} end local length = redis.call('LLEN', KEYS[2]) if length ~= tonumber(ARGV[2]) then return {-1, length} end return {1, redis.call('RPUSH', KEYS[2], ARGV[3])}";
const RELEASE_LUA: &str = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end return redis.call('DEL', KEYS[1])";

const TTL_MS: i64 = 30_000;
const ENTRY_BYTES: usize = 600;
const ENTRIES_PER_TASK: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    Redis,
    Fred,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Which::Redis => "redis",
            Which::Fred => "fred",
        }
    }
}

struct Opts {
    port: u16,
    turns: usize,
    tasks: usize,
    rounds: usize,
    warmup: usize,
    nodelay: bool,
}

fn parse_opts() -> Opts {
    let mut o = Opts { port: 0, turns: 20_000, tasks: 32, rounds: 4, warmup: 2_000, nodelay: false };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = || args.get(i + 1).expect("missing value").parse::<usize>().expect("bad number");
        match args[i].as_str() {
            "--port" => { o.port = v() as u16; i += 1; }
            "--turns" => { o.turns = v(); i += 1; }
            "--tasks" => { o.tasks = v(); i += 1; }
            "--rounds" => { o.rounds = v(); i += 1; }
            "--warmup" => { o.warmup = v(); i += 1; }
            "--nodelay" => o.nodelay = true,
            other => panic!("unknown arg {other}"),
        }
        i += 1;
    }
    assert!(o.port != 0, "--port required");
    o
}

/// user+system CPU time of this whole process, in microseconds.
fn cpu_us() -> u64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(rc, 0);
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

struct TaskKeys {
    log: String,
    lease: String,
    fence: String,
    holder: String,
    entries: Vec<bytes::Bytes>,
}

fn make_keys(tasks: usize) -> Arc<Vec<TaskKeys>> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    Arc::new(
        (0..tasks)
            .map(|i| TaskKeys {
                log: format!("sess:{{{i}}}:log"),
                lease: format!("sess:{{{i}}}:lease"),
                fence: format!("sess:{{{i}}}:fence"),
                holder: format!("worker-{i}"),
                entries: (0..ENTRIES_PER_TASK)
                    .map(|_| {
                        let v: Vec<u8> = (0..ENTRY_BYTES).map(|_| (next() >> 56) as u8).collect();
                        bytes::Bytes::from(v)
                    })
                    .collect(),
            })
            .collect(),
    )
}

/// Untimed: wipe data + scripts, compact the AOF (so it does not grow across runs and
/// no auto-rewrite fires mid-run), create each session's log with one RPUSH.
fn reset(admin: &mut redis::Connection, keys: &[TaskKeys]) {
    let _: () = redis::cmd("FLUSHALL").query(admin).unwrap();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(admin).unwrap();
    let aof: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("appendonly").query(admin).unwrap();
    if aof.get(1).map(|s| s == "yes").unwrap_or(false) {
        let _: redis::Value = redis::cmd("BGREWRITEAOF").query(admin).unwrap();
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let info: String = redis::cmd("INFO").arg("persistence").query(admin).unwrap();
            if info.contains("aof_rewrite_in_progress:0") && info.contains("aof_rewrite_scheduled:0") {
                break;
            }
        }
    }
    for k in keys {
        let _: i64 = redis::cmd("RPUSH").arg(&k.log).arg("init").query(admin).unwrap();
    }
}

fn verify(admin: &mut redis::Connection, keys: &[TaskKeys], per_task: &[usize]) {
    for (k, n) in keys.iter().zip(per_task) {
        let len: usize = redis::cmd("LLEN").arg(&k.log).query(admin).unwrap();
        assert_eq!(len, 1 + n, "log length mismatch for {}", k.log);
        let exists: i64 = redis::cmd("EXISTS").arg(&k.lease).query(admin).unwrap();
        assert_eq!(exists, 0, "lease left behind for {}", k.lease);
    }
}

struct RunResult {
    wall: Duration,
    cpu_us: u64,
    lat_ns: Vec<u64>,
}

async fn turns_redis(
    mut con: redis::aio::ConnectionManager,
    scripts: Arc<(redis::Script, redis::Script, redis::Script)>,
    keys: Arc<Vec<TaskKeys>>,
    idx: usize,
    n: usize,
) -> Vec<u64> {
    let k = &keys[idx];
    let (acquire, append, release) = &*scripts;
    let mut lat = Vec::with_capacity(n);
    for t in 0..n {
        let st = Instant::now();
        let (token, len): (i64, i64) = acquire
            .key(&k.log)
            .key(&k.lease)
            .key(&k.fence)
            .arg(&k.holder)
            .arg(TTL_MS)
            .invoke_async(&mut con)
            .await
            .expect("acquire");
        assert!(token > 0, "acquire failed: {token} {len}");
        let value = format!("{}:{}", k.holder, token);
        let entry = &k.entries[t % ENTRIES_PER_TASK];
        let (ok, newlen): (i64, i64) = append
            .key(&k.lease)
            .key(&k.log)
            .arg(&value)
            .arg(len)
            .arg(&entry[..])
            .invoke_async(&mut con)
            .await
            .expect("append");
        assert!(ok == 1 && newlen == len + 1, "append failed: {ok} {newlen}");
        let r: i64 = release.key(&k.lease).arg(&value).invoke_async(&mut con).await.expect("release");
        assert_eq!(r, 1);
        lat.push(st.elapsed().as_nanos() as u64);
    }
    lat
}

async fn turns_fred(
    client: fred::prelude::Client,
    shas: Arc<(String, String, String)>,
    keys: Arc<Vec<TaskKeys>>,
    idx: usize,
    n: usize,
) -> Vec<u64> {
    use fred::prelude::*;
    let k = &keys[idx];
    let (acquire, append, release) = &*shas;
    let mut lat = Vec::with_capacity(n);
    for t in 0..n {
        let st = Instant::now();
        let (token, len): (i64, i64) = client
            .evalsha(
                acquire.as_str(),
                vec![k.log.as_str(), k.lease.as_str(), k.fence.as_str()],
                vec![Value::from(k.holder.as_str()), Value::from(TTL_MS)],
            )
            .await
            .expect("acquire");
        assert!(token > 0, "acquire failed: {token} {len}");
        let value = format!("{}:{}", k.holder, token);
        let entry = k.entries[t % ENTRIES_PER_TASK].clone();
        let (ok, newlen): (i64, i64) = client
            .evalsha(
                append.as_str(),
                vec![k.lease.as_str(), k.log.as_str()],
                vec![Value::from(value.as_str()), Value::from(len), Value::Bytes(entry)],
            )
            .await
            .expect("append");
        assert!(ok == 1 && newlen == len + 1, "append failed: {ok} {newlen}");
        let r: i64 = client
            .evalsha(release.as_str(), vec![k.lease.as_str()], vec![Value::from(value)])
            .await
            .expect("release");
        assert_eq!(r, 1);
        lat.push(st.elapsed().as_nanos() as u64);
    }
    lat
}

fn split_turns(total: usize, tasks: usize) -> Vec<usize> {
    (0..tasks).map(|i| total / tasks + usize::from(i < total % tasks)).collect()
}

fn run_once(which: Which, o: &Opts, keys: &Arc<Vec<TaskKeys>>, per_task: &[usize]) -> RunResult {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let url = format!("redis://127.0.0.1:{}/", o.port);
    let res = rt.block_on(async {
        let mut handles = Vec::with_capacity(o.tasks);
        let (cpu0, t0);
        match which {
            Which::Redis => {
                use redis::IntoConnectionInfo;
                let mut info = url.as_str().into_connection_info().unwrap();
                if o.nodelay {
                    info = info.set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
                }
                let client = redis::Client::open(info).unwrap();
                let mut mgr = redis::aio::ConnectionManager::new(client).await.unwrap();
                let scripts = Arc::new((
                    redis::Script::new(ACQUIRE_LUA),
                    redis::Script::new(APPEND_LUA),
                    redis::Script::new(RELEASE_LUA),
                ));
                // load once, so every timed call is a plain EVALSHA hit
                scripts.0.load_async(&mut mgr).await.unwrap();
                scripts.1.load_async(&mut mgr).await.unwrap();
                scripts.2.load_async(&mut mgr).await.unwrap();
                cpu0 = cpu_us();
                t0 = Instant::now();
                for (i, &n) in per_task.iter().enumerate() {
                    handles.push(tokio::spawn(turns_redis(mgr.clone(), scripts.clone(), keys.clone(), i, n)));
                }
            }
            Which::Fred => {
                use fred::prelude::*;
                let config = Config::from_url(&url).unwrap();
                let mut builder = Builder::from_config(config);
                if o.nodelay {
                    builder.with_connection_config(|c| {
                        c.tcp = TcpConfig { nodelay: Some(true), ..Default::default() };
                    });
                }
                let client = builder.build().unwrap();
                let _conn_task = client.init().await.unwrap();
                let a: String = client.script_load(ACQUIRE_LUA).await.unwrap();
                let b: String = client.script_load(APPEND_LUA).await.unwrap();
                let c: String = client.script_load(RELEASE_LUA).await.unwrap();
                let shas = Arc::new((a, b, c));
                cpu0 = cpu_us();
                t0 = Instant::now();
                for (i, &n) in per_task.iter().enumerate() {
                    handles.push(tokio::spawn(turns_fred(client.clone(), shas.clone(), keys.clone(), i, n)));
                }
            }
        }
        let mut lat_ns = Vec::new();
        for h in handles {
            lat_ns.extend(h.await.unwrap());
        }
        let wall = t0.elapsed();
        let cpu = cpu_us() - cpu0;
        RunResult { wall, cpu_us: cpu, lat_ns }
    });
    rt.shutdown_timeout(Duration::from_secs(2));
    res
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

#[derive(Clone, Copy)]
struct Row {
    cpu_per_turn_us: f64,
    turns_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn main() {
    let o = parse_opts();
    let keys = make_keys(o.tasks);
    let admin_client = redis::Client::open(format!("redis://127.0.0.1:{}/", o.port)).unwrap();
    let mut admin = admin_client.get_connection().unwrap();
    let aof: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("appendonly").query(&mut admin).unwrap();
    let fsync: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("appendfsync").query(&mut admin).unwrap();
    println!(
        "# port={} appendonly={} appendfsync={} tasks={} turns/run={} rounds={} nodelay={}",
        o.port, aof[1], fsync[1], o.tasks, o.turns, o.rounds, o.nodelay
    );

    let one = |which: Which, turns: usize, admin: &mut redis::Connection| -> Row {
        let per_task = split_turns(turns, o.tasks);
        reset(admin, &keys);
        let r = run_once(which, &o, &keys, &per_task);
        verify(admin, &keys, &per_task);
        let mut lat = r.lat_ns;
        lat.sort_unstable();
        assert_eq!(lat.len(), turns);
        Row {
            cpu_per_turn_us: r.cpu_us as f64 / turns as f64,
            turns_per_s: turns as f64 / r.wall.as_secs_f64(),
            p50_ms: pct(&lat, 0.50) as f64 / 1e6,
            p99_ms: pct(&lat, 0.99) as f64 / 1e6,
        }
    };

    if o.warmup > 0 {
        for w in [Which::Redis, Which::Fred] {
            let r = one(w, o.warmup, &mut admin);
            println!("warmup {:5} cpu/turn={:7.1}us turns/s={:8.0}", w.name(), r.cpu_per_turn_us, r.turns_per_s);
        }
    }

    let mut rows: Vec<(Which, Row)> = Vec::new();
    println!("{:>5} {:>5} {:>14} {:>10} {:>8} {:>8}", "round", "crate", "cpu_us/turn", "turns/s", "p50_ms", "p99_ms");
    for round in 0..o.rounds {
        // alternate order (AB BA AB ...) so any drift/order effect hits both crates alike
        let order = if round % 2 == 0 { [Which::Redis, Which::Fred] } else { [Which::Fred, Which::Redis] };
        for w in order {
            let r = one(w, o.turns, &mut admin);
            println!(
                "{:>5} {:>5} {:>14.1} {:>10.0} {:>8.3} {:>8.3}",
                round, w.name(), r.cpu_per_turn_us, r.turns_per_s, r.p50_ms, r.p99_ms
            );
            rows.push((w, r));
        }
    }

    println!("\nSUMMARY (median [min-max] over {} rounds)", o.rounds);
    for w in [Which::Redis, Which::Fred] {
        let sel: Vec<Row> = rows.iter().filter(|(x, _)| *x == w).map(|(_, r)| *r).collect();
        let stat = |f: fn(&Row) -> f64| {
            let v: Vec<f64> = sel.iter().map(f).collect();
            let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            (median(v), lo, hi)
        };
        let c = stat(|r| r.cpu_per_turn_us);
        let t = stat(|r| r.turns_per_s);
        let p5 = stat(|r| r.p50_ms);
        let p9 = stat(|r| r.p99_ms);
        println!(
            "{:5} cpu_us/turn {:.1} [{:.1}-{:.1}] | turns/s {:.0} [{:.0}-{:.0}] | p50_ms {:.3} [{:.3}-{:.3}] | p99_ms {:.3} [{:.3}-{:.3}]",
            w.name(), c.0, c.1, c.2, t.0, t.1, t.2, p5.0, p5.1, p5.2, p9.0, p9.1, p9.2
        );
    }
    // paired per-round ratios fred/redis (both ran back-to-back in the same round)
    let r: Vec<Row> = rows.iter().filter(|(x, _)| *x == Which::Redis).map(|(_, r)| *r).collect();
    let f: Vec<Row> = rows.iter().filter(|(x, _)| *x == Which::Fred).map(|(_, r)| *r).collect();
    let ratio = |g: fn(&Row) -> f64| {
        let v: Vec<f64> = r.iter().zip(&f).map(|(a, b)| g(b) / g(a)).collect();
        let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        (median(v), lo, hi)
    };
    let c = ratio(|r| r.cpu_per_turn_us);
    let t = ratio(|r| r.turns_per_s);
    let p5 = ratio(|r| r.p50_ms);
    let p9 = ratio(|r| r.p99_ms);
    println!(
        "ratio fred/redis per round: cpu {:.2} [{:.2}-{:.2}] | turns/s {:.2} [{:.2}-{:.2}] | p50 {:.2} [{:.2}-{:.2}] | p99 {:.2} [{:.2}-{:.2}]",
        c.0, c.1, c.2, t.0, t.1, t.2, p5.0, p5.1, p5.2, p9.0, p9.1, p9.2
    );
}
