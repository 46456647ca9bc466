#!/usr/bin/env bash
# Installs vLLM's CPU build (pinned, every wheel checked against its sha256 in
# scripts/vllm-requirements.txt) into a venv outside the clone, and writes the tiny
# random-weight Qwen3 the live tests serve (scripts/write-tiny-qwen3.py, next to the pinned
# Qwen3 tokenizer of fixtures/cache). Prints `VLLM_PYTHON=...` and `VLLM_MODEL=...`
# (eval-able); progress to stderr. About 1.3 GB; a rerun with the same pins does nothing.
#
#   ROLLOUT_PROXY_VLLM_DIR   where it is kept (default ~/.cache/rollout-proxy/vllm)
set -euo pipefail
cd "$(dirname "$0")/.."

requirements=scripts/vllm-requirements.txt
dir="${ROLLOUT_PROXY_VLLM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rollout-proxy/vllm}"
stamp="$dir/.stamp"
want="$(sha256sum "$requirements" scripts/write-tiny-qwen3.py fixtures/cache/qwen3/tokenizer.json | cut -d' ' -f1 | tr '\n' ' ')"
print() {
  echo "VLLM_PYTHON=$dir/venv/bin/python"
  echo "VLLM_MODEL=$dir/tiny-qwen3"
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$dir/venv/bin/python" ]; then
  print
  exit 0
fi
# Marked complete only at the end: an interrupted install starts over.
rm -f "$stamp"
rm -rf "$dir/venv"
mkdir -p "$dir"
python3 -m venv "$dir/venv"
echo "installing vLLM (CPU) and torch into $dir/venv" >&2
"$dir/venv/bin/pip" install --quiet --no-deps --only-binary=:all: --require-hashes \
  -r "$requirements" >&2
VLLM_LOGGING_LEVEL=ERROR "$dir/venv/bin/python" -c \
  'import torch, vllm; assert vllm.__version__ == "0.32.0", vllm.__version__' >&2
"$dir/venv/bin/python" scripts/write-tiny-qwen3.py fixtures/cache/qwen3 "$dir/tiny-qwen3" >&2
echo "$want" >"$stamp"
print
