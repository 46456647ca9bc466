//! Pool behaviour against scripted clients: routing, affinity, failover, the breaker, the
//! bounded queue, n splitting and health probes.
use super::*;
use crate::backend::{Backend, BackendKind};
use crate::generation::{FinishReason, SamplingParams};
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::Mutex;

/// A scripted client: each call pops the next outcome for its URL (default: success
/// after `delay`), and calls are counted.
#[derive(Debug, Default)]
struct Script {
    outcomes: Mutex<HashMap<String, Vec<Result<(), BackendError>>>>,
    calls: Mutex<Vec<(String, u32)>>,
    healthy: Mutex<HashMap<String, bool>>,
    delay_ms: u64,
}

#[derive(Debug)]
struct Fake {
    url: String,
    script: Arc<Script>,
}

#[async_trait]
impl Backend for Fake {
    fn base_url(&self) -> &str {
        &self.url
    }
    async fn generate(&self, request: &GenerateRequest) -> Result<Vec<Generation>, BackendError> {
        self.script
            .calls
            .lock()
            .unwrap()
            .push((self.url.clone(), request.n));
        let next = self
            .script
            .outcomes
            .lock()
            .unwrap()
            .get_mut(&self.url)
            .and_then(|o| (!o.is_empty()).then(|| o.remove(0)));
        tokio::time::sleep(Duration::from_millis(self.script.delay_ms)).await;
        next.unwrap_or(Ok(()))?;
        Ok((0..request.n)
            .map(|i| Generation::new(vec![i], vec![-0.5], FinishReason::Stop))
            .collect())
    }
    async fn health(&self) -> Result<(), BackendError> {
        match self.script.healthy.lock().unwrap().get(&self.url) {
            Some(false) => Err(BackendError::NoBackend("down".into())),
            _ => Ok(()),
        }
    }
}

fn pool(urls: &[&str], limit: usize, settings: PoolSettings, script: Arc<Script>) -> Pool {
    let factory_script = script.clone();
    let factory: ClientFactory = Box::new(move |c: &BackendConfig| -> Box<dyn Backend> {
        Box::new(Fake {
            url: c.base_url.clone(),
            script: factory_script.clone(),
        })
    });
    let configs = urls
        .iter()
        .map(|u| BackendConfig {
            num_max_requests_at_once: limit,
            ..BackendConfig::new(u, BackendKind::Vllm)
        })
        .collect();
    Pool::new(settings, factory, configs)
}

fn request(n: u32) -> GenerateRequest {
    GenerateRequest {
        prompt: vec![1].into(),
        params: SamplingParams::default(),
        n,
        session: None,
        adapter: None,
        routed_experts_from: None,
        images: Default::default(),
    }
}

fn unreachable(url: &str) -> Result<(), BackendError> {
    Err(BackendError::Unreachable {
        url: url.into(),
        reason: "refused".into(),
    })
}

/// A script in which backend `url` is unreachable for its next `times` calls.
fn unreachable_for(url: &str, times: usize) -> Arc<Script> {
    let script = Arc::new(Script::default());
    let failures = (0..times).map(|_| unreachable(url)).collect();
    script.outcomes.lock().unwrap().insert(url.into(), failures);
    script
}

fn fast() -> PoolSettings {
    PoolSettings {
        retry_backoff: 0.001,
        ..PoolSettings::default()
    }
}

#[tokio::test]
async fn least_loaded_then_affinity_then_pinned() {
    let script = Arc::new(Script {
        delay_ms: 50,
        ..Script::default()
    });
    let pool = pool(&["a", "b"], 4, fast(), script.clone());
    let one = request(1);
    // Two concurrent requests spread over both backends.
    let (x, y) = tokio::join!(
        pool.generate(&one, Route::Prefer(None)),
        pool.generate(&one, Route::Prefer(None))
    );
    let mut used = vec![
        x.unwrap().backends[0].to_string(),
        y.unwrap().backends[0].to_string(),
    ];
    used.sort();
    assert_eq!(used, vec!["a", "b"]);
    // A preference wins while that backend has room.
    for _ in 0..3 {
        let sampled = pool
            .generate(&request(1), Route::Prefer(Some("b")))
            .await
            .unwrap();
        assert_eq!(&*sampled.backends[0], "b");
    }
    let sampled = pool
        .generate(&request(1), Route::Pinned("a"))
        .await
        .unwrap();
    assert_eq!(&*sampled.backends[0], "a");
    assert!(matches!(
        pool.generate(&request(1), Route::Pinned("zzz")).await,
        Err(BackendError::NoBackend(_))
    ));
}

#[tokio::test]
async fn failover_retries_same_backend_then_another() {
    let script = Arc::new(Script::default());
    script
        .outcomes
        .lock()
        .unwrap()
        .insert("a".into(), vec![unreachable("a"), unreachable("a")]);
    let pool = pool(&["a", "b"], 4, fast(), script.clone());
    let sampled = pool
        .generate(&request(1), Route::Prefer(Some("a")))
        .await
        .unwrap();
    assert_eq!(&*sampled.backends[0], "b");
    let calls: Vec<String> = script
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.0.clone())
        .collect();
    assert_eq!(calls, vec!["a", "a", "b"]);
    assert_eq!(pool.status()["servers"][0]["retries"], 2);
}

#[tokio::test]
async fn a_retry_that_opens_the_circuit_reports_the_backend_failure() {
    // The first failure opens the only backend's circuit, so the retry finds no backend.
    let script = unreachable_for("a", 1);
    let settings = PoolSettings {
        unhealthy_after: 1,
        breaker_cooldown: 3600.0,
        ..fast()
    };
    let pool = pool(&["a"], 4, settings, script.clone());
    let result = pool.generate(&request(1), Route::Prefer(None)).await;
    assert!(
        matches!(result, Err(BackendError::Unreachable { .. })),
        "{result:?}"
    );
    assert_eq!(script.calls.lock().unwrap().len(), 1);
    assert!(!pool.members()[0].is_healthy());
}

#[tokio::test]
async fn errors_that_are_not_transient_are_not_retried() {
    let script = Arc::new(Script::default());
    script.outcomes.lock().unwrap().insert(
        "a".into(),
        vec![Err(BackendError::Status {
            url: "a".into(),
            status: 400,
            message: "too long".into(),
        })],
    );
    let pool = pool(&["a", "b"], 4, fast(), script.clone());
    let result = pool.generate(&request(1), Route::Prefer(Some("a"))).await;
    assert!(matches!(
        result,
        Err(BackendError::Status { status: 400, .. })
    ));
    assert_eq!(script.calls.lock().unwrap().len(), 1);
    assert!(
        pool.members()[0].is_healthy(),
        "a client error says nothing of the backend's health"
    );
}

#[tokio::test]
async fn breaker_opens_after_failures_and_probes_close_it() {
    let script = unreachable_for("a", 3);
    let settings = PoolSettings {
        max_retries: 0,
        breaker_cooldown: 3600.0,
        ..fast()
    };
    let pool = Arc::new(pool(&["a"], 4, settings, script.clone()));
    for _ in 0..3 {
        assert!(
            pool.generate(&request(1), Route::Prefer(None))
                .await
                .is_err()
        );
    }
    assert!(!pool.members()[0].is_healthy());
    // Open circuit: fail fast without calling the backend.
    let result = pool.generate(&request(1), Route::Prefer(None)).await;
    assert!(
        matches!(result, Err(BackendError::NoBackend(_))),
        "{result:?}"
    );
    assert_eq!(script.calls.lock().unwrap().len(), 3);
    // healthy_after (2) good probes close it.
    let member = pool.members()[0].clone();
    member.record_probe(true, pool.settings());
    assert!(!member.is_healthy());
    member.record_probe(true, pool.settings());
    assert!(member.is_healthy());
    assert!(
        pool.generate(&request(1), Route::Prefer(None))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn request_failures_never_take_out_every_backend_whose_probes_pass() {
    let script = Arc::new(Script::default());
    script.outcomes.lock().unwrap().extend([
        ("a".into(), vec![unreachable("a")]),
        ("b".into(), vec![unreachable("b")]),
    ]);
    let settings = PoolSettings {
        max_retries: 0,
        unhealthy_after: 1,
        breaker_cooldown: 3600.0,
        ..fast()
    };
    let pool = pool(&["a", "b"], 4, settings, script.clone());
    for url in ["a", "b"] {
        assert!(
            pool.generate(&request(1), Route::Pinned(url))
                .await
                .is_err()
        );
    }
    let [a, b] = [0, 1].map(|i| pool.members()[i].clone());
    assert!(!a.is_healthy() && !b.is_healthy());
    // Nothing known of their servers: fail fast.
    assert!(matches!(
        pool.generate(&request(1), Route::Prefer(None)).await,
        Err(BackendError::NoBackend(_))
    ));
    // b's server answers its probe, a's does not: b serves, and its success closes its circuit.
    a.record_probe(false, pool.settings());
    b.record_probe(true, pool.settings());
    let sampled = pool
        .generate(&request(1), Route::Prefer(Some("a")))
        .await
        .unwrap();
    assert_eq!(&*sampled.backends[0], "b");
    assert!(b.is_healthy() && !a.is_healthy());
}

#[tokio::test]
async fn breaker_lets_one_trial_through_after_cooldown() {
    let script = unreachable_for("a", 3);
    let settings = PoolSettings {
        max_retries: 0,
        breaker_cooldown: 0.05,
        unhealthy_after: 3,
        ..fast()
    };
    let pool = pool(&["a"], 4, settings, script.clone());
    for _ in 0..3 {
        let _ = pool.generate(&request(1), Route::Prefer(None)).await;
    }
    assert!(!pool.members()[0].is_healthy());
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert!(
        pool.generate(&request(1), Route::Prefer(None))
            .await
            .is_ok(),
        "the trial succeeds"
    );
    assert!(pool.members()[0].is_healthy());
}

#[tokio::test]
async fn full_backends_queue_boundedly() {
    let script = Arc::new(Script {
        delay_ms: 200,
        ..Script::default()
    });
    let settings = PoolSettings {
        max_queued_requests: 1,
        queue_timeout: 5.0,
        ..fast()
    };
    let pool = pool(&["a"], 1, settings, script.clone());
    let one = request(1);
    let first = pool.generate(&one, Route::Prefer(None));
    let second = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        pool.generate(&request(1), Route::Prefer(None)).await
    };
    let third = async {
        tokio::time::sleep(Duration::from_millis(40)).await;
        pool.generate(&request(1), Route::Prefer(None)).await
    };
    let (first, second, third) = tokio::join!(first, second, third);
    assert!(first.is_ok());
    assert!(
        second.is_ok(),
        "the queued request runs when the slot frees"
    );
    assert!(
        matches!(third, Err(BackendError::Saturated { .. })),
        "{third:?}"
    );

    let settings = PoolSettings {
        queue_timeout: 0.05,
        ..fast()
    };
    let pool = self::pool(&["a"], 1, settings, script);
    let (a, b) = tokio::join!(
        pool.generate(&one, Route::Prefer(None)),
        pool.generate(&one, Route::Prefer(None))
    );
    assert!(a.is_ok() != b.is_ok());
    assert!(matches!(
        a.err().or(b.err()),
        Some(BackendError::Busy { .. })
    ));
}

#[tokio::test]
async fn large_n_is_split_across_calls() {
    let script = Arc::new(Script::default());
    let settings = PoolSettings {
        max_n_completions: 3,
        ..fast()
    };
    let pool = pool(&["a", "b"], 8, settings, script.clone());
    let sampled = pool
        .generate(&request(7), Route::Prefer(None))
        .await
        .unwrap();
    assert_eq!(sampled.generations.len(), 7);
    assert_eq!(sampled.backends.len(), 7);
    let mut sizes: Vec<u32> = script.calls.lock().unwrap().iter().map(|c| c.1).collect();
    sizes.sort();
    assert_eq!(sizes, vec![1, 3, 3]);
}

#[tokio::test]
async fn affinity_is_measured() {
    let pool = pool(&["a", "b"], 4, fast(), Arc::new(Script::default()));
    pool.record_affinity(None, "a");
    pool.record_affinity(Some("a"), "a");
    pool.record_affinity(Some("a"), "b");
    let status = pool.status();
    assert_eq!(status["affinity"]["turns"], 2);
    assert_eq!(status["affinity"]["same_backend"], 1);
    assert_eq!(status["affinity"]["ratio"], 0.5);
}

#[tokio::test]
async fn health_checks_mark_backends() {
    let script = Arc::new(Script::default());
    script.healthy.lock().unwrap().insert("a".into(), false);
    let settings = PoolSettings {
        health_check_interval: 0.01,
        unhealthy_after: 2,
        ..fast()
    };
    let pool = Arc::new(pool(&["a", "b"], 4, settings, script.clone()));
    let checker = tokio::spawn(pool.clone().run_health_checks());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!pool.members()[0].is_healthy());
    assert!(pool.members()[1].is_healthy());
    script.healthy.lock().unwrap().insert("a".into(), true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(pool.members()[0].is_healthy());
    checker.abort();
}
