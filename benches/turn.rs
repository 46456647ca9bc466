//! Per-turn pipeline cost at growing history sizes, on the real Qwen3 tokenizer and template
//! (needs `scripts/fetch-fixtures.sh`):
//!
//! - `prepare_turn`: render, match, split, tokenize, extend;
//! - `request_to_backend_body`: the same from the request's JSON bytes to the backend's
//!   `input_ids` JSON, i.e. everything a turn costs in proportion to its history except the
//!   sockets (`cargo bench --bench load` measures those too, but a separate process is noisier);
//! - `render_history`: the chat template's render of the whole conversation alone, the part
//!   of a turn that must grow with its history for the prompt to stay exact;
//! - `render_short`: the render of a short tool conversation.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rollout_proxy::chat::ChatRequest;
use rollout_proxy::generation::{FinishReason, Generation};
use rollout_proxy::http::openai::request::ChatCompletionBody;
use rollout_proxy::json_numbers::NumberArray;
use rollout_proxy::metrics::Metrics;
use rollout_proxy::session::{CommitRecord, HistoryMode, SessionState};
use rollout_proxy::template::load_template;
use rollout_proxy::tokenizer::Tokenizer;
use rollout_proxy::tools::HermesParser;
use rollout_proxy::turn::reply::CallIds;
use rollout_proxy::turn::{
    ChoiceOutput, ChoiceStream, Plan, Planner, TailRender, TurnContext, TurnRequest,
};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;

fn context() -> TurnContext {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/cache/qwen3");
    let ctx = TurnContext::new(
        Arc::new(load_template(None, Some(&dir)).expect("run scripts/fetch-fixtures.sh")),
        Arc::new(Tokenizer::from_path(&dir).unwrap()),
    );
    ctx.set_tail_renders(rollout_proxy::checker::tail_renders_hold(&ctx));
    ctx
}

/// The prompt that extends `state` for `req`, as the pipeline plans it.
fn plan_turn(
    ctx: &TurnContext,
    state: &SessionState,
    req: &ChatRequest,
    metrics: &Metrics,
) -> Plan {
    plan_with(ctx, state, req, metrics, TailRender::Allowed)
}

fn plan_with(
    ctx: &TurnContext,
    state: &SessionState,
    req: &ChatRequest,
    metrics: &Metrics,
    tail: TailRender,
) -> Plan {
    let planner = Planner {
        ctx,
        state,
        request: req,
        history: HistoryMode::Sampled,
        parser: &HermesParser,
        metrics,
    };
    planner.prepare(tail).unwrap()
}

fn request(messages: &[Value]) -> ChatRequest {
    let body: ChatCompletionBody = serde_json::from_value(json!({"messages": messages})).unwrap();
    body.validate(Some(256)).unwrap().turn
}

/// A session whose single node holds about `target` tokens, and the messages of its next turn.
fn session_with_history(ctx: &TurnContext, target: usize) -> (SessionState, Vec<Value>) {
    let mut state = SessionState::default();
    let mut messages = Vec::new();
    let filler = "The quick brown fox jumps over the lazy dog while counting sheep. ".repeat(6);
    let answer = ctx
        .tokenizer
        .encode(&format!("{filler}<|im_end|>"))
        .unwrap();
    let answer_text = filler.clone();
    let mut turn = 0;
    loop {
        messages.push(json!({"role": "user", "content": format!("question {turn}: {filler}")}));
        let req = request(&messages);
        let plan = plan_turn(ctx, &state, &req, &Metrics::default());
        let generation =
            Generation::new(answer.clone(), vec![-0.5; answer.len()], FinishReason::Stop);
        let shaping = ChoiceStream::new(
            &ctx.tokenizer,
            Arc::new(HermesParser),
            TurnRequest::Chat(&req),
            None,
            "bench".into(),
        );
        let choice = ChoiceOutput {
            reply: shaping.whole(generation.clone(), &mut CallIds::after(0, "call_")),
            generation,
            backend: "bench".into(),
        };
        let record = CommitRecord::new(&plan, &[choice], &Default::default(), false, None);
        rollout_proxy::session::apply(&mut state, &record);
        messages.push(json!({"role": "assistant", "content": answer_text}));
        turn += 1;
        if state.nodes[0].len() >= target {
            break;
        }
    }
    messages.push(json!({"role": "user", "content": "one more question"}));
    (state, messages)
}

fn bench_turn(c: &mut Criterion) {
    let ctx = context();
    let metrics = Metrics::default();
    let mut group = c.benchmark_group("prepare_turn");
    for target in [1_000usize, 8_000, 32_000] {
        let (state, messages) = session_with_history(&ctx, target);
        let req = request(&messages);
        let plan = plan_turn(&ctx, &state, &req, &metrics);
        assert!(matches!(
            plan.base,
            rollout_proxy::turn::Base::Extend { .. }
        ));
        let tokens = state.nodes[0].len();
        // Side by side: the end of the conversation rendered (every 16th turn also in full, as
        // sessions do), and the whole conversation every turn.
        for (name, tail) in [("tail", TailRender::Allowed), ("full", TailRender::Never)] {
            let id = BenchmarkId::new(name, format!("{tokens}_tokens"));
            group.bench_with_input(id, &req, |b, req| {
                b.iter(|| plan_with(&ctx, &state, req, &metrics, tail))
            });
        }
    }
    group.finish();
}

fn bench_pipeline(c: &mut Criterion) {
    let ctx = context();
    let metrics = Metrics::default();
    let mut group = c.benchmark_group("request_to_backend_body");
    for target in [1_000usize, 32_000] {
        let (state, messages) = session_with_history(&ctx, target);
        let body = serde_json::to_vec(&json!({"messages": messages, "max_tokens": 256})).unwrap();
        let id = format!("{}_tokens", state.nodes[0].len());
        group.bench_with_input(BenchmarkId::from_parameter(id), &body, |b, body| {
            b.iter(|| {
                let parsed: ChatCompletionBody = serde_json::from_slice(body).unwrap();
                let req = parsed.validate(Some(256)).unwrap().turn;
                let plan = plan_turn(&ctx, &state, &req, &metrics);
                let mut out = Vec::with_capacity(8 * plan.prompt_ids.len());
                let mut ids = NumberArray::new(&mut out);
                ids.ids(&plan.prompt_ids);
                ids.finish();
                out
            })
        });
    }
    group.finish();
}

/// The render alone of a conversation shaped like the load bench's growth rollout (two
/// messages of ~270 tokens a turn), at turn 1, 32 and 128.
fn bench_render_history(c: &mut Criterion) {
    use rollout_proxy::template::{RenderRequest, TemplateValue};
    let ctx = context();
    let pad = "river market window silver garden engine quiet morning harbor signal ".repeat(25);
    let mut group = c.benchmark_group("render_history");
    for turns in [1usize, 32, 128] {
        let mut messages =
            vec![json!({"role": "system", "content": "You are a helpful assistant."})];
        for turn in 0..turns {
            messages.push(json!({"role": "user", "content": format!("question {turn}: {pad}")}));
            if turn + 1 < turns {
                messages.push(json!({"role": "assistant", "content": format!("answer: {pad}")}));
            }
        }
        let req = request(&messages);
        let values: Vec<TemplateValue> = req
            .messages
            .iter()
            .map(|m| m.to_template_value(false))
            .collect();
        let values = TemplateValue::from(values);
        let render = || {
            ctx.template
                .render(RenderRequest {
                    messages: &values,
                    tools: None,
                    add_generation_prompt: true,
                    kwargs: Some(&req.template_kwargs),
                })
                .unwrap()
        };
        let tokens = ctx.tokenizer.encode(&render()).unwrap().len();
        let id = format!("turn_{turns}_{}_messages_{tokens}_tokens", messages.len());
        group.bench_function(id, |b| b.iter(render));
    }
    group.finish();
}

/// The render of a short tool conversation (the load test's turn 5), the part of a short turn
/// that grows with the tools declared.
fn bench_render_short(c: &mut Criterion) {
    use rollout_proxy::template::{RenderRequest, TemplateValue};
    let ctx = context();
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Current weather for a city.", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let messages = json!([
        {"role": "system", "content": "You are a helpful assistant. Use the tools when they help."},
        {"role": "user", "content": "What's the weather like in Paris right now?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "{\"temperature\": 21}"},
        {"role": "assistant", "content": "It is 21 degrees in Paris."},
        {"role": "user", "content": "Is it raining in Tokyo?"},
    ]);
    let body = json!({"messages": messages, "tools": tools});
    let body: ChatCompletionBody = serde_json::from_value(body).unwrap();
    let req = body.validate(Some(256)).unwrap().turn;
    let values: Vec<TemplateValue> = req
        .messages
        .iter()
        .map(|m| m.to_template_value(false))
        .collect();
    let values = TemplateValue::from(values);
    let mut group = c.benchmark_group("render_short");
    let declared = req.tools.as_ref().map(|tools| tools.json());
    for (name, tools) in [("no_tools", None), ("one_tool", declared)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                ctx.template
                    .render(RenderRequest {
                        messages: &values,
                        tools,
                        add_generation_prompt: true,
                        kwargs: Some(&req.template_kwargs),
                    })
                    .unwrap()
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_turn,
    bench_pipeline,
    bench_render_history,
    bench_render_short
);
criterion_main!(benches);
