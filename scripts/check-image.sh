#!/usr/bin/env bash
# Builds the container image (Dockerfile) with docker or podman and smoke-tests it: the health
# check passes, it runs as the non-root user, `--version` names the commit, the default model
# answers a two-turn tool call, and a session recorded in the /data volume is served again
# after the container is replaced. Prints the image's size.
#
# Where the base image debian:bookworm-slim cannot be pulled (no container registry in reach),
# it is made from Debian's packages: mmdebstrap, with this machine's apt sources, writes a
# minimal bookworm root file system that is imported under that name.
#
#   ROLLOUT_PROXY_CONTAINER   docker or podman (default: the first that runs a container)
set -euo pipefail
cd "$(dirname "$0")/.."
base=docker.io/library/debian:bookworm-slim
image=localhost/rollout-proxy:check
engine=${ROLLOUT_PROXY_CONTAINER:-}
run_flags=()

if [ -z "$engine" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    engine=docker
  elif command -v podman >/dev/null; then
    engine=podman
  elif [ "$(id -u)" = 0 ]; then
    echo "installing Debian's podman" >&2
    apt-get install -y -qq --no-install-recommends podman runc >&2
    engine=podman
  else
    echo "neither docker (with a daemon) nor podman is here: apt-get install podman" >&2
    exit 1
  fi
fi

# The base image: pulled, or made from Debian's packages.
if ! $engine image inspect "$base" >/dev/null 2>&1 && ! $engine pull -q "$base" >/dev/null 2>&1; then
  echo "cannot pull $base: making it with mmdebstrap from this machine's apt sources" >&2
  command -v mmdebstrap >/dev/null || apt-get install -y -qq --no-install-recommends mmdebstrap >&2
  sources=$(mktemp)
  cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null >"$sources" || true
  mmdebstrap --quiet --variant=minbase bookworm - "$sources" | $engine import - "$base" >&2
  rm -f "$sources"
fi

# A rootful podman inside a container (no CAP_SYS_RESOURCE, cgroups v1 and v2 mixed) cannot
# raise the open-file and process limits its defaults ask for, and crun refuses mixed cgroups:
# there, runc with cgroupfs and this machine's own limits.
if [ "$engine" = podman ] && ! podman run --rm --network host "$base" true 2>/dev/null; then
  echo "podman's defaults cannot start a container here; using runc, cgroupfs and this shell's limits" >&2
  engine="podman --runtime runc --cgroup-manager cgroupfs"
  run_flags=(--ulimit "nofile=$(ulimit -n):$(ulimit -Hn)" --ulimit "nproc=1024:1024")
fi

# podman writes OCI images by default, a format without HEALTHCHECK: the docker format keeps it.
build_flags=()
if [ "${engine%% *}" = podman ]; then
  build_flags=(--format docker)
fi
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# This machine's root certificates go to the build (the Dockerfile's secret `ca`): they hold
# those of a network that re-signs TLS, where there is one.
$engine build "${build_flags[@]}" --network host "${run_flags[@]}" --build-arg ROLLOUT_PROXY_COMMIT="$commit" \
  --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt -t "$image" . >&2
echo "image $image: $($engine image inspect --format '{{.Size}}' "$image" | numfmt --to=si)B" >&2

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
