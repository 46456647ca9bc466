#!/usr/bin/env bash
# Installs xgrammar (pinned, its wheel checked against its sha256), the grammar engine SGLang and
# vLLM enforce `ebnf` / `structured_outputs` grammars with, into a venv outside the clone:
# tests/constrained.rs checks that it reads every grammar the proxy writes. Only what parsing
# and matching need is installed (xgrammar's import of torch and transformers is stubbed by
# tests/grammar/xgrammar_check.py; neither is used to parse or match a grammar).
# Prints `XGRAMMAR_PYTHON=...` (eval-able); progress to stderr.
#
#   ROLLOUT_PROXY_XGRAMMAR_DIR   where it is kept (default ~/.cache/rollout-proxy/xgrammar)
set -euo pipefail
. "$(dirname "$0")/lib/pinned-wheel.sh"

xgrammar=0.2.9
xgrammar_sha=b5179499ae9ef8366e1dcf592c3ee6b17ecf646971df50828b242934862d916c
pins=(apache-tvm-ffi==0.1.15.post2 typing-extensions==4.16.0 numpy==2.4.6 pydantic==2.14.4
  pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5)

dir="${ROLLOUT_PROXY_XGRAMMAR_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rollout-proxy/xgrammar}"
stamp="$dir/.stamp"
want="xgrammar=$xgrammar ${pins[*]}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$dir/venv/bin/python" ]; then
  echo "XGRAMMAR_PYTHON=$dir/venv/bin/python"
  exit 0
fi
wheel=$(pinned_wheel xgrammar "$xgrammar" "$xgrammar_sha" "$dir")
[ -x "$dir/venv/bin/python" ] || python3 -m venv "$dir/venv"
"$dir/venv/bin/pip" install --quiet --no-deps "${pins[@]}" "$wheel" >&2
echo "$want" >"$stamp"
echo "XGRAMMAR_PYTHON=$dir/venv/bin/python"
