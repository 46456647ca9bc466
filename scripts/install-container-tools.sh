#!/usr/bin/env bash
# Installs what the image's checks need when this machine lacks it and runs as root: Debian's
# podman (and runc, which it falls back to where crun cannot start a container) unless a docker
# daemon answers, and mmdebstrap, which makes the base image where it cannot be pulled.
# .ci/run calls this before it starts the image's build beside the tests, so that apt runs once.
set -euo pipefail
. "$(dirname "$0")/lib/debian-packages.sh"

missing=()
if ! { command -v docker >/dev/null && docker info >/dev/null 2>&1; }; then
  command -v podman >/dev/null || missing+=(podman)
  command -v runc >/dev/null || missing+=(runc)
fi
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
install_missing ${missing[@]+"${missing[@]}"}
