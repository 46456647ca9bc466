#!/usr/bin/env bash
# Builds the container image (Dockerfile) with docker or podman and smoke-tests it: the health
# check passes, it runs as the non-root user, `--version` names the commit, the default model
# answers a two-turn tool call, and a session recorded in the /data volume is served again
# after the container is replaced. Prints the image's size. The container engine and the base
# image: scripts/lib/container.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
image=localhost/rollout-proxy:check
. scripts/lib/container.sh

commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# This machine's root certificates go to the build (the Dockerfile's secret `ca`): they hold
# those of a network that re-signs TLS, where there is one.
$engine build "${build_flags[@]}" --network host "${run_flags[@]}" --build-arg ROLLOUT_PROXY_COMMIT="$commit" \
  --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt -t "$image" . >&2
echo "image $image: $($engine image inspect --format '{{.Size}}' "$image" | numfmt --to=si)B" >&2
# The build stage keeps a tag of its own, so its layers (Debian's Rust, the compile) stay the
# next build's cache; the untagged images of earlier runs go, so reruns do not fill the disk.
$engine build "${build_flags[@]}" --network host "${run_flags[@]}" --build-arg ROLLOUT_PROXY_COMMIT="$commit" \
  --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt --target build -t "$image-build" . >/dev/null
$engine image prune -f >/dev/null

name=rollout-proxy-check-$$
volume=rollout-proxy-check-$$
recorded=$(mktemp)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cleanup() {
  $engine rm -f "$name" >/dev/null 2>&1 || true
  $engine volume rm -f "$volume" >/dev/null 2>&1 || true
  rm -f "$recorded"
}
trap cleanup EXIT

version=$($engine run --rm "${run_flags[@]}" "$image" --version)
echo "$version" >&2
case "$version" in *"commit $commit"*) ;; *) echo "--version lacks the commit $commit" >&2; exit 1 ;; esac
[ "$($engine run --rm "${run_flags[@]}" --entrypoint id "$image" -u)" = 10001 ]

# The image's own command (serve --data-dir /data), on the host's network at a free port.
start() {
  $engine run -d --name "$name" --network host -e ROLLOUT_PROXY_PORT="$port" \
    -v "$volume:/data" "${run_flags[@]}" "$image" >/dev/null
}
healthy() {
  for _ in $(seq 120); do
    if $engine healthcheck run "$name" >/dev/null 2>&1 ||
      [ "$($engine inspect --format '{{.State.Health.Status}}' "$name" 2>/dev/null)" = healthy ]; then
      return 0
    fi
    sleep 1
  done
  $engine logs "$name" >&2
  echo "the container's health check did not pass" >&2
  return 1
}
start
healthy
python3 scripts/lib/smoke.py rollout "$port" --save "$recorded"
# A new container on the same volume serves the session as it was.
$engine rm -f "$name" >/dev/null
start
healthy
python3 scripts/lib/smoke.py same-nodes "$port" "$recorded"
