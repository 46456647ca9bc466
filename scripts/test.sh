#!/usr/bin/env bash
# Runs the whole test suite: fetches the pinned tokenizers, templates and SmolLM2 GGUF, builds
# the pinned llama-server (cached outside the clone), prints the chat-template conformance
# count, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-fixtures.sh
LLAMA_SERVER_BIN=$(scripts/build-llama-server.sh)
export LLAMA_SERVER_BIN
cargo test --test conformance -- --nocapture
cargo test --all-targets
