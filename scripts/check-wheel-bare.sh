#!/usr/bin/env bash
# The wheel on a machine with nothing but Python and pip: a bare Debian 12 container (the base
# image of scripts/lib/container.sh) gets python3-pip and python3-venv from Debian, installs the
# wheel into a venv, and `rollout-proxy serve` fetches the default model with pip and answers a
# two-turn tool call (scripts/lib/smoke.py). No Rust, no compiler, no clone.
#
#   scripts/check-wheel-bare.sh target/wheels/rollout_proxy-0.2.0-py3-none-manylinux_2_34_x86_64.whl
set -euo pipefail
wheel=$(realpath "$1")
cd "$(dirname "$0")/.."
. scripts/lib/container.sh

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# This machine's root certificates ride along for pip (a network that re-signs TLS needs them);
# the container's own apt uses Debian's signed lists over plain HTTP.
$engine run --rm --network host "${run_flags[@]}" \
  -v "$wheel:/wheel/$(basename "$wheel"):ro" -v "$PWD/scripts/lib/smoke.py:/smoke.py:ro" \
  -v /etc/ssl/certs/ca-certificates.crt:/host-ca.crt:ro -e PIP_CERT=/host-ca.crt \
  -e PORT="$port" "$base" sh -ec '
    apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-pip python3-venv >/dev/null
    python3 -m venv /venv && /venv/bin/pip install --quiet /wheel/*.whl
    export PATH=/venv/bin:$PATH
    for tool in cargo rustc cc gcc; do
      if command -v "$tool" >/dev/null; then echo "the container has $tool: not bare" >&2; exit 1; fi
    done
    rollout-proxy --version >&2
    rollout-proxy serve --port "$PORT" --engine-threads 1 >/serve.log 2>&1 &
    python3 /smoke.py rollout "$PORT" --log /serve.log
  '
echo "the wheel serves on a bare Debian 12 with only Python and pip" >&2
