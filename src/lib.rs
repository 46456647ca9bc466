//! rollout-proxy: a proxy between reinforcement-learning environments and inference servers
//! that records, for every rollout, exactly the tokens the model saw and sampled.
//!
//! An agent talks to a session URL (`/{uuid}/v1/chat/completions`, `/{uuid}/v1/completions`)
//! as it would to any OpenAI-compatible server. Each request is one turn, and every turn takes
//! the same path whichever API it came in by:
//!
//! ```text
//! http (an API's adapter: wire request in)
//!   → chat (the conversation, validated: messages, tools, sampling)
//!   → turn (the pipeline, once for every API)
//!       plan:    template (render) → tokenizer (ids that extend the session's node)
//!       sample:  backend (vLLM, SGLang, llama.cpp, OpenAI text; a pool) or engine (in-process)
//!       reply:   tokenizer (visible text) → reasoning, tools (calls promoted from the text)
//!       commit:  session (the node grows by the prompt and the sampled ids)
//!   → http (the adapter writes the reply, whole or as server-sent events)
//! ```
//!
//! The trainer reads the nodes back (`GET /{uuid}/nodes`): `tokens`, `masked_tokens` (-100
//! where the model did not sample) and `logprobs`. A later turn that resends the conversation
//! is matched to the ids already sampled, so one rollout stays one node. Beyond the nodes,
//! `export` writes them out in bulk (JSON lines, NumPy, Harbor's ATIF), [`journal`] keeps
//! them through restarts ([`fleet`]: in Redis or Valkey, shared by replicas), [`metrics`] counts what turns did, [`telemetry`] sends each turn as an OpenTelemetry span, and `viewer` shows them token
//! by token in a browser (`GET /ui`).
//!
//! Modules, in the order a turn uses them: [`http`], [`chat`], [`turn`], [`template`],
//! [`tokenizer`], [`generation`] (what a backend is asked and answers), [`backend`],
//! [`engine`], [`reasoning`], [`tools`], [`session`]; start-up in [`config`]; support in
//! [`json_numbers`], `json_shape` (JSON of any shape read into what a field takes) and
//! [`memory`].
//!
//! # Public surface
//!
//! What a program built on the crate uses: [`serve`] with its [`Settings`] (the binary is
//! one such program), the [`Pipeline`] and [`TurnContext`] a turn runs in with the turn's
//! request and reply types ([`chat::ChatRequest`], [`turn`]), the [`tokenizer`] and
//! [`template`] (`check-template`, [`checker`]), the backends' clients and the in-process
//! engine, the tool-call parsers ([`tools`]), the session store and journal. Inside each
//! module, what only the server itself needs is `pub(crate)`: the HTTP adapters of each API
//! (their wire types), the export writers, the viewer, the session's internal records.

#![warn(missing_docs)]

pub mod backend;
pub mod chat;
pub mod checker;
pub mod config;
pub mod engine;
pub(crate) mod export;
pub mod fetch;
pub mod fleet;
pub mod generation;
pub mod grammar;
pub mod http;
pub mod journal;
pub mod json_numbers;
pub(crate) mod json_shape;
pub mod memory;
pub mod metrics;
pub mod reasoning;
pub mod session;
pub mod telemetry;
pub mod template;
pub mod tokenizer;
pub mod tools;
pub mod turn;
pub(crate) mod viewer;
pub mod vision;

pub use config::Settings;
pub use http::{AppState, serve};
pub use turn::{Pipeline, TurnContext};
