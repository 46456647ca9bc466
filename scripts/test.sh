#!/usr/bin/env bash
# Runs the whole test suite: fetches the pinned tokenizers and templates, prints the chat
# template conformance count, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-fixtures.sh
cargo test --test conformance -- --nocapture
cargo test --all-targets
