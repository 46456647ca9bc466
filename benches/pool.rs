//! The pool's cost and its session affinity, measured side by side in one run:
//! - added latency: a zero-latency backend called directly vs through `Pool::generate`
//!   (routing, slot reservation, health bookkeeping);
//! - affinity: the share of a session's turns (after its first) that land on the backend its
//!   previous turn used, for 64 concurrent 6-turn sessions over 2 backends of 8 slots each.

use async_trait::async_trait;
use criterion::Criterion;
use rollout_proxy::backend::{
    Backend, BackendConfig, BackendError, BackendKind, ClientFactory, Pool, PoolSettings, Route,
};
use rollout_proxy::generation::{FinishReason, GenerateRequest, Generation, SamplingParams};
use std::sync::Arc;
use std::time::Duration;

/// A backend that answers at once (or after `latency`).
#[derive(Debug)]
struct Instant {
    url: String,
    latency: Duration,
}

#[async_trait]
impl Backend for Instant {
    fn base_url(&self) -> &str {
        &self.url
    }
    async fn generate(&self, request: &GenerateRequest) -> Result<Vec<Generation>, BackendError> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        Ok((0..request.n)
            .map(|_| Generation::new(vec![1, 2, 3], vec![-0.1; 3], FinishReason::Stop))
            .collect())
    }
    async fn health(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

fn pool(backends: usize, slots: usize, latency: Duration) -> Pool {
    let factory: ClientFactory = Box::new(move |c: &BackendConfig| -> Box<dyn Backend> {
        Box::new(Instant {
            url: c.base_url.clone(),
            latency,
        })
    });
    let configs = (0..backends)
        .map(|i| BackendConfig {
            num_max_requests_at_once: slots,
            ..BackendConfig::new(&format!("http://b{i}"), BackendKind::Vllm)
        })
        .collect();
    Pool::new(PoolSettings::default(), factory, configs)
}

fn request() -> GenerateRequest {
    GenerateRequest {
        prompt: vec![7; 4096].into(),
        params: SamplingParams::default(),
        n: 1,
        session: None,
        adapter: None,
        routed_experts_from: None,
        images: Default::default(),
    }
}

fn bench_overhead(c: &mut Criterion, runtime: &tokio::runtime::Runtime) {
    let direct = Instant {
        url: "http://b0".into(),
        latency: Duration::ZERO,
    };
    let pooled = pool(2, 512, Duration::ZERO);
    let req = request();
    let mut group = c.benchmark_group("pool_overhead");
    group.bench_function("direct", |b| {
        b.iter(|| runtime.block_on(direct.generate(&req)).unwrap())
    });
    group.bench_function("through_pool", |b| {
        b.iter(|| {
            runtime
                .block_on(pooled.generate(&req, Route::Prefer(Some("http://b0"))))
                .unwrap()
        })
    });
    group.finish();
}

/// Runs the sessions and returns the affinity ratio the pool reports.
fn affinity(runtime: &tokio::runtime::Runtime) -> serde_json::Value {
    let pool = Arc::new(pool(2, 8, Duration::from_millis(2)));
    runtime.block_on(async {
        let sessions = (0..64).map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut previous: Option<Arc<str>> = None;
                for _ in 0..6 {
                    let sampled = pool
                        .generate(&request(), Route::Prefer(previous.as_deref()))
                        .await
                        .unwrap();
                    let used = sampled.backends[0].clone();
                    pool.record_affinity(previous.as_deref(), &used);
                    previous = Some(used);
                }
            })
        });
        futures::future::join_all(sessions).await;
    });
    pool.status()["affinity"].clone()
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let figure = affinity(&runtime);
    println!("affinity (64 sessions x 6 turns, 2 backends x 8 slots): {figure}");
    let mut criterion = Criterion::default().configure_from_args();
    bench_overhead(&mut criterion, &runtime);
    criterion.final_summary();
}
