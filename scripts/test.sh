#!/usr/bin/env bash
# Runs the whole test suite: installs the build dependencies of llama.cpp if missing, fetches
# the pinned tokenizers, templates and SmolLM2 GGUF, builds the pinned llama-server and
# installs the pinned agent clients, Harbor's validator, the browser test's driver, vLLM's
# CPU build (all cached outside the clone) and Debian's redis-server, prints the
# chat-template conformance count, then runs every test and ends with one "N passed, N
# failed" line (also kept in target/test-summary.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-build-deps.sh
scripts/fetch-fixtures.sh
LLAMA_SERVER_BIN=$(scripts/build-llama-server.sh)
export LLAMA_SERVER_BIN
# The real clients of tests/agents.rs: Claude Code, Codex CLI, the anthropic/openai SDKs.
eval "$(scripts/install-agents.sh)"
# tests/export.rs checks the ATIF export with Harbor's own validator.
eval "$(scripts/install-atif-validator.sh)"
export ATIF_PYTHON ATIF_HARBOR
# tests/harmony.rs reproduces the gpt-oss golden renders with OpenAI's Harmony library.
eval "$(scripts/install-harmony-reference.sh)"
export HARMONY_PYTHON TIKTOKEN_ENCODINGS_BASE
# tests/check_template.rs compares `check-template`'s renders with transformers'.
eval "$(scripts/install-transformers-reference.sh)"
export TRANSFORMERS_PYTHON
# tests/constrained.rs checks every grammar it writes with xgrammar (SGLang's and vLLM's).
eval "$(scripts/install-xgrammar.sh)"
export XGRAMMAR_PYTHON
# tests/vllm_live.rs puts a real vLLM (its CPU build, serving a tiny random-weight Qwen3)
# behind the proxy.
eval "$(scripts/install-vllm.sh)"
export VLLM_PYTHON VLLM_MODEL VLLM_VL_MODELS
# tests/viewer.rs drives the token viewer in Debian's chromium through playwright-core.
eval "$(scripts/install-browser.sh)"
export CHROMIUM_BIN PLAYWRIGHT_CORE
# The fleet's tests (src/fleet, tests/fleet*.rs) start their own redis-server and HAProxy.
scripts/install-fleet-parts.sh
# tests/export.rs opens the `.npz` export with numpy; tests/metrics.rs parses /metrics with
# prometheus_client.
python3 -c 'import numpy, prometheus_client' 2>/dev/null || pip install --quiet numpy prometheus_client
export CLAUDE_BIN CODEX_BIN CLIENTS_PYTHON
cargo test --test conformance -- --nocapture
mkdir -p target
cargo test --all-targets 2>&1 | tee target/test-output.txt
summary=$(awk '/^test result:/ { passed += $4; failed += $6 } END { printf "tests: %d passed, %d failed\n", passed, failed }' target/test-output.txt)
echo "$summary" | tee target/test-summary.txt
