# Sourced by the scripts that run containers (scripts/check-image.sh,
# scripts/check-wheel-bare.sh). Sets `engine` (the command: docker, or podman with the flags
# this machine needs), `run_flags` and `build_flags` (for its `run` and `build`), and `base`,
# the Debian 12 image the Dockerfile starts from, made sure to be there.
#
# Where debian:bookworm-slim cannot be pulled (no container registry in reach), it is made from
# Debian's packages: mmdebstrap, with this machine's apt sources, writes a minimal bookworm root
# file system that is imported under that name.
#
#   ROLLOUT_PROXY_CONTAINER   docker or podman (default: the first that runs a container)
base=docker.io/library/debian:bookworm-slim
engine=${ROLLOUT_PROXY_CONTAINER:-}
run_flags=()

"$(dirname "${BASH_SOURCE[0]}")/../install-container-tools.sh"
if [ -z "$engine" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    engine=docker
  else
    engine=podman
  fi
fi

# The base image: pulled, or made from Debian's packages.
if ! $engine image inspect "$base" >/dev/null 2>&1 && ! $engine pull -q "$base" >/dev/null 2>&1; then
  echo "cannot pull $base: making it with mmdebstrap from this machine's apt sources" >&2
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
