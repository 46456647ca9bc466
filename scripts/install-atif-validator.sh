#!/usr/bin/env bash
# Installs Harbor's own ATIF trajectory validator, pinned, into a cache outside the clone, for
# tests/export.rs: the `harbor` wheel from PyPI (checked against its sha256; only its pure-Python
# validator and models are used, which need pydantic alone) and a venv with pydantic.
# Prints `ATIF_PYTHON=...` and `ATIF_HARBOR=...` (eval-able); progress goes to stderr.
#
#   ROLLOUT_PROXY_ATIF_DIR   where they are kept (default ~/.cache/rollout-proxy/atif)
set -euo pipefail
. "$(dirname "$0")/lib/pinned-wheel.sh"

harbor=0.26.0
harbor_sha=b7c752c5b51ae2ee1fc2ea30621493c7dc0b5a3d0157295bed4552115027baee
pydantic=2.14.4

dir="${ROLLOUT_PROXY_ATIF_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rollout-proxy/atif}"
stamp="$dir/.stamp"
want="harbor=$harbor pydantic=$pydantic"
print_paths() {
  echo "ATIF_PYTHON=$dir/venv/bin/python"
  echo "ATIF_HARBOR=$dir/harbor"
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  print_paths
  exit 0
fi
rm -rf "$dir/harbor"
# The wheel declares Python 3.12; its validator runs on 3.11 too (it imports pydantic only).
wheel=$(pinned_wheel harbor "$harbor" "$harbor_sha" "$dir" --python-version 3.12)
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
  "$wheel" "$dir/harbor"
[ -x "$dir/venv/bin/python" ] || python3 -m venv "$dir/venv"
"$dir/venv/bin/pip" install --quiet "pydantic==$pydantic" >&2
PYTHONPATH="$dir/harbor" "$dir/venv/bin/python" -c \
  'from harbor.utils.trajectory_validator import TrajectoryValidator' >&2
echo "$want" >"$stamp"
print_paths
