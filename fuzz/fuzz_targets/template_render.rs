//! Qwen3's chat template rendering hostile conversations: arbitrary bytes become messages
//! (role by the first byte, then the text, lossily UTF-8; assistant messages may carry a tool
//! call with that text as name and arguments) and a turn's prompt is built from them. The
//! template may refuse a conversation (an error); it must never panic, and a prompt it builds
//! must decode.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rollout_proxy::http::openai::request::ChatCompletionBody;
use rollout_proxy::session::{HistoryMode, SessionState};
use rollout_proxy::template::load_template;
use rollout_proxy::tokenizer::Tokenizer;
use rollout_proxy::tools::HermesParser;
use rollout_proxy::turn::{Planner, TailRender, TurnContext};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

fn context() -> &'static TurnContext {
    static CONTEXT: OnceLock<TurnContext> = OnceLock::new();
    CONTEXT.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/cache/qwen3");
        TurnContext::new(
            Arc::new(load_template(None, Some(&dir)).expect("run scripts/fetch-fixtures.sh")),
            Arc::new(Tokenizer::from_path(&dir).unwrap()),
        )
    })
}

const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];

fuzz_target!(|data: &[u8]| {
    let messages: Vec<Value> = data
        .split(|&b| b == 0xff)
        .filter(|piece| !piece.is_empty())
        .take(16)
        .map(|piece| {
            let role = ROLES[piece[0] as usize % ROLES.len()];
            let text = String::from_utf8_lossy(&piece[1..]).to_string();
            match (role, piece[0] & 0x80) {
                ("assistant", 0x80) => json!({"role": role, "content": null, "tool_calls": [
                    {"id": "call_0", "type": "function", "function": {"name": text, "arguments": text}}]}),
                ("tool", _) => json!({"role": role, "content": text, "tool_call_id": "call_0"}),
                _ => json!({"role": role, "content": text}),
            }
        })
        .collect();
    let tools =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let Ok(body) =
        serde_json::from_value::<ChatCompletionBody>(json!({"messages": messages, "tools": tools}))
    else {
        return;
    };
    let Ok(request) = body.validate(None).map(|call| call.turn) else {
        return;
    };
    let ctx = context();
    let state = SessionState::default();
    let metrics = Default::default();
    let planner = Planner {
        ctx,
        state: &state,
        request: &request,
        history: HistoryMode::Sampled,
        parser: &HermesParser,
        metrics: &metrics,
    };
    if let Ok(plan) = planner.prepare(TailRender::Allowed) {
        let _ = ctx.tokenizer.decode(&plan.prompt_ids);
    }
});
