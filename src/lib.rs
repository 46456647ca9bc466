//! rollout-proxy: an OpenAI-compatible proxy that records token-exact training nodes.
pub mod template;
pub mod tokenizer;
