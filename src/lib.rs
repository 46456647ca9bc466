//! rollout-proxy: an OpenAI-compatible proxy that records token-exact training nodes.
pub mod backend;
pub mod chat;
pub mod config;
pub mod engine;
pub mod http;
pub mod json_numbers;
pub mod memory;
pub mod reasoning;
pub mod session;
pub mod template;
pub mod tokenizer;
pub mod tools;
pub mod turn;
