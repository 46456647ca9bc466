#!/usr/bin/env bash
# Runs the whole stack on this machine's CPU: a real model (SmolLM2-135M-Instruct) served by
# the pinned llama-server, with rollout-proxy in front of it on http://127.0.0.1:${PORT:-9000}.
# The first run fetches the model and builds llama-server (several minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-fixtures.sh
llama_server=$(scripts/build-llama-server.sh)
backend_port=${BACKEND_PORT:-8081}
"$llama_server" -m fixtures/cache/smollm2/model.gguf --host 127.0.0.1 --port "$backend_port" \
  -c 8192 --parallel 4 --no-webui >/tmp/rollout-proxy-llama-server.log 2>&1 &
backend_pid=$!
trap 'kill $backend_pid 2>/dev/null' EXIT
echo "llama-server starting on 127.0.0.1:$backend_port (log: /tmp/rollout-proxy-llama-server.log)" >&2
cargo run --release -- serve --tokenizer fixtures/cache/smollm2 --chat-template hermes \
  --backend "http://127.0.0.1:$backend_port" --backend-type llamacpp --port "${PORT:-9000}" "$@"
