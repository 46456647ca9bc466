#!/usr/bin/env bash
# Installs Hugging Face transformers (pinned, its wheel checked against its sha256) with the
# versions the conformance corpus was rendered with (fixtures/README.md) into a venv outside the
# clone, for `rollout-proxy check-template --reference-python`. Prints `TRANSFORMERS_PYTHON=...`
# (eval-able); progress to stderr.
#
#   ROLLOUT_PROXY_TRANSFORMERS_DIR   where it is kept (default ~/.cache/rollout-proxy/transformers)
set -euo pipefail
. "$(dirname "$0")/lib/pinned-wheel.sh"

transformers=5.24.0
transformers_sha=ff5ebedf9359f94bb63772b6380eba6e7104d010cbbb2cb82c788817ea7486f6
# transformers' dependencies, pinned as the corpus was rendered (jinja2, tokenizers) or as
# resolved on 2026-12-05.
pins=(jinja2==3.1.6 tokenizers==0.23.3 huggingface_hub==2.4.0 numpy==2.4.6 packaging==26.4
  pyyaml==6.0.4 regex==2026.12.2 safetensors==0.8.0 tqdm==4.70.1 typer==0.29.2
  filelock==4.3.2 fsspec==2026.9.0 hf-xet==1.8.0 httpx2==2.17.0)

dir="${ROLLOUT_PROXY_TRANSFORMERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rollout-proxy/transformers}"
stamp="$dir/.stamp"
want="transformers=$transformers ${pins[*]}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$dir/venv/bin/python" ]; then
  echo "TRANSFORMERS_PYTHON=$dir/venv/bin/python"
  exit 0
fi
wheel=$(pinned_wheel transformers "$transformers" "$transformers_sha" "$dir")
[ -x "$dir/venv/bin/python" ] || python3 -m venv "$dir/venv"
"$dir/venv/bin/pip" install --quiet "${pins[@]}" "$wheel" >&2
TRANSFORMERS_VERBOSITY=error "$dir/venv/bin/python" -c \
  'import transformers; assert transformers.__version__ == "'"$transformers"'"' >&2
echo "$want" >"$stamp"
echo "TRANSFORMERS_PYTHON=$dir/venv/bin/python"
