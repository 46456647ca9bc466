#!/usr/bin/env bash
# Builds the pip wheel: the release `rollout-proxy` binary, in-process engine included, packed
# by maturin (pinned by sha256 in scripts/maturin-requirements.txt) into
# target/wheels/rollout_proxy-<version>-py3-none-manylinux_<glibc>_x86_64.whl. maturin checks
# the binary against the manylinux policies and tags the wheel with the oldest glibc it runs
# on. Prints the wheel's path; progress goes to stderr.
#
# The build is kept outside the clone, so a rerun (or another clone) only relinks:
#   ROLLOUT_PROXY_WHEEL_TARGET   cargo's target folder (default ~/.cache/rollout-proxy/wheel-target)
#   ROLLOUT_PROXY_MATURIN_DIR    maturin's venv (default ~/.cache/rollout-proxy/maturin)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-build-deps.sh >&2

cache="${XDG_CACHE_HOME:-$HOME/.cache}/rollout-proxy"
venv="${ROLLOUT_PROXY_MATURIN_DIR:-$cache/maturin}"
if ! "$venv/bin/maturin" --version >/dev/null 2>&1; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --require-hashes -r scripts/maturin-requirements.txt >&2
fi
export CARGO_TARGET_DIR="${ROLLOUT_PROXY_WHEEL_TARGET:-$cache/wheel-target}"
out=target/wheels
version=$(awk -F'"' '/^version = /{ print $2; exit }' Cargo.toml)
rm -f "$out"/rollout_proxy-"$version"-*.whl
"$venv/bin/maturin" build --release --locked --out "$out" >&2
wheel=$(ls "$out"/rollout_proxy-"$version"-*.whl)
echo "$(du -h "$wheel" | cut -f1) $wheel" >&2
echo "$wheel"
