#!/usr/bin/env bash
# Installs OpenAI's Harmony library (`openai-harmony` from PyPI, pinned, its wheel checked against
# its sha256) into a venv outside the clone, and writes the `o200k_base.tiktoken` it reads from
# the pinned gpt-oss tokenizer (scripts/build-o200k-tiktoken.py; the library checks the file's
# sha256, so it runs offline). scripts/harmony-golden.py renders the gpt-oss golden cases with it.
# Prints `HARMONY_PYTHON=...` and `TIKTOKEN_ENCODINGS_BASE=...` (eval-able); progress to stderr.
#
#   ROLLOUT_PROXY_HARMONY_DIR   where they are kept (default ~/.cache/rollout-proxy/harmony)
set -euo pipefail
. "$(dirname "$0")/lib/pinned-wheel.sh"
here=$(cd "$(dirname "$0")/.." && pwd)

harmony=0.0.8
harmony_sha=c007d277218a50db8839e599ed78e0fffe5130f614c3f6d93ae257f282071a29
pydantic=2.14.4

dir="${ROLLOUT_PROXY_HARMONY_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rollout-proxy/harmony}"
stamp="$dir/.stamp"
want="openai-harmony=$harmony pydantic=$pydantic"
print_paths() {
  echo "HARMONY_PYTHON=$dir/venv/bin/python"
  echo "TIKTOKEN_ENCODINGS_BASE=$dir/encodings"
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -f "$dir/encodings/o200k_base.tiktoken" ]; then
  print_paths
  exit 0
fi
tokenizer="$here/fixtures/cache/gpt_oss/tokenizer.json"
[ -f "$tokenizer" ] || "$here/scripts/fetch-fixtures.sh"
wheel=$(pinned_wheel openai-harmony "$harmony" "$harmony_sha" "$dir")
[ -x "$dir/venv/bin/python" ] || python3 -m venv "$dir/venv"
"$dir/venv/bin/pip" install --quiet "pydantic==$pydantic" "$wheel" >&2
python3 "$here/scripts/build-o200k-tiktoken.py" "$tokenizer" "$dir/encodings"
TIKTOKEN_ENCODINGS_BASE="$dir/encodings" "$dir/venv/bin/python" -c \
  'import openai_harmony as h; h.load_harmony_encoding(h.HarmonyEncodingName.HARMONY_GPT_OSS)' >&2
echo "$want" >"$stamp"
print_paths
