#!/usr/bin/env bash
# Checks the pip wheel the way a user meets it: a new venv with nothing but the wheel, then
# `rollout-proxy serve` with no backend and an empty model cache, so the default model is
# fetched with pip, served in-process, and answers a chat turn and a tool call.
#
#   scripts/check-wheel.sh target/wheels/rollout_proxy-0.2.0-py3-none-manylinux_2_34_x86_64.whl
set -euo pipefail
wheel=$(realpath "$1")
smoke=$(realpath "$(dirname "$0")/lib/smoke.py")
work=$(mktemp -d)
server=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet "$wheel"
"$work/venv/bin/pip" list --format=freeze | grep -v '^pip=' | grep -v '^setuptools=' >&2
# The venv's bin on PATH, as activating it does.
export PATH="$work/venv/bin:$PATH"
echo "$(command -v rollout-proxy): $(rollout-proxy --version)" >&2

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ROLLOUT_PROXY_CACHE="$work/cache" rollout-proxy serve --port "$port" --engine-threads 1 \
  >"$work/serve.log" 2>&1 &
server=$!

python3 "$smoke" rollout "$port" --log "$work/serve.log"
