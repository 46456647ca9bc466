#!/usr/bin/env bash
# Installs vLLM's CPU build (pinned, every wheel checked against its sha256 in
# scripts/vllm-requirements.txt) into a venv outside the clone, and writes the tiny
# random-weight Qwen3 the live tests serve, with a LoRA adapter for it
# (scripts/write-tiny-qwen3.py, next to the pinned Qwen3 tokenizer of fixtures/cache), and tiny
# random-weight Qwen2-VL, Qwen2.5-VL and Qwen3-VL (scripts/write-tiny-vl-models.py, 159 MB,
# 7 s). Prints `VLLM_PYTHON=...`, `VLLM_MODEL=...` and `VLLM_VL_MODELS=...` (eval-able);
# progress to stderr. It downloads
# about 2.2 GB (5.6 GB installed; 1m46s from an empty pip cache on 2 cores, 2026-12-07); a
# rerun with the same pins and script does nothing.
#
#   ROLLOUT_PROXY_VLLM_DIR   where it is kept (default ~/.cache/rollout-proxy/vllm)
set -euo pipefail
cd "$(dirname "$0")/.."

requirements=scripts/vllm-requirements.txt
dir="${ROLLOUT_PROXY_VLLM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rollout-proxy/vllm}"
hashes() { sha256sum "$@" | cut -d' ' -f1 | tr '\n' ' '; }

# Each part is marked complete only at its end: an interrupted install starts that part over.
want_venv="$(hashes "$requirements")"
if [ "$(cat "$dir/.venv-stamp" 2>/dev/null)" != "$want_venv" ] || [ ! -x "$dir/venv/bin/python" ]; then
  rm -f "$dir/.venv-stamp" "$dir/.model-stamp" "$dir/.vl-stamp"
  rm -rf "$dir/venv"
  mkdir -p "$dir"
  python3 -m venv "$dir/venv"
  echo "installing vLLM (CPU) and torch into $dir/venv" >&2
  "$dir/venv/bin/pip" install --quiet --no-deps --only-binary=:all: --require-hashes \
    -r "$requirements" >&2
  VLLM_LOGGING_LEVEL=ERROR "$dir/venv/bin/python" -c \
    'import torch, vllm; assert vllm.__version__ == "0.32.0", vllm.__version__' >&2
  echo "$want_venv" >"$dir/.venv-stamp"
fi

want_model="$(hashes scripts/write-tiny-qwen3.py fixtures/cache/qwen3/tokenizer.json)"
if [ "$(cat "$dir/.model-stamp" 2>/dev/null)" != "$want_model" ]; then
  rm -f "$dir/.model-stamp"
  "$dir/venv/bin/python" scripts/write-tiny-qwen3.py fixtures/cache/qwen3 "$dir/tiny-qwen3" >&2
  echo "$want_model" >"$dir/.model-stamp"
fi

# The tiny vision-language models of tests/vllm_vision.rs (Qwen2-VL, Qwen2.5-VL, Qwen3-VL).
want_vl="$(hashes scripts/write-tiny-vl-models.py fixtures/cache/qwen3/tokenizer.json templates/qwen2_vl.jinja templates/qwen3_vl.jinja)"
if [ "$(cat "$dir/.vl-stamp" 2>/dev/null)" != "$want_vl" ]; then
  rm -f "$dir/.vl-stamp"
  "$dir/venv/bin/python" scripts/write-tiny-vl-models.py fixtures/cache/qwen3 "$dir/tiny-vl" >&2
  echo "$want_vl" >"$dir/.vl-stamp"
fi

echo "VLLM_PYTHON=$dir/venv/bin/python"
echo "VLLM_MODEL=$dir/tiny-qwen3"
echo "VLLM_VL_MODELS=$dir/tiny-vl"
