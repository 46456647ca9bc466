//! rollout-proxy: an OpenAI-compatible proxy that records token-exact training nodes.
pub mod template;
pub mod tokenizer;
pub mod backend;
pub mod session;
pub mod chat;
pub mod tools;
