//! Helpers shared by the black-box tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The golden chat-template corpus (`../shared/conformance/chat_templates`, or
/// `$ROLLOUT_PROXY_CONFORMANCE_DIR`).
pub fn conformance_dir() -> PathBuf {
    let dir = std::env::var_os("ROLLOUT_PROXY_CONFORMANCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/chat_templates")
        });
    assert!(dir.is_dir(), "conformance corpus not found at {}", dir.display());
    dir
}

/// A real model folder (tokenizer.json + tokenizer_config.json) fetched by
/// `scripts/fetch-fixtures.sh`: qwen3, llama3_1, deepseek_v3, gemma3 or smollm2.
pub fn fixture_model(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/cache").join(name);
    assert!(
        dir.join("tokenizer.json").is_file(),
        "fixture {name} missing: run scripts/fetch-fixtures.sh"
    );
    dir
}
