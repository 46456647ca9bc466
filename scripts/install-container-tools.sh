#!/usr/bin/env bash
# Installs what the image's checks need when this machine lacks it and runs as root: Debian's
# podman (and runc, which it falls back to where crun cannot start a container) unless a docker
# daemon answers, and mmdebstrap, which makes the base image where it cannot be pulled.
# .ci/run calls this before it starts the image's build beside the tests, so that apt runs once.
set -euo pipefail

missing=()
if ! { command -v docker >/dev/null && docker info >/dev/null 2>&1; }; then
  command -v podman >/dev/null || missing+=(podman)
  command -v runc >/dev/null || missing+=(runc)
fi
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing Debian's ${missing[*]}" >&2
    (apt-get install -y -qq --no-install-recommends "${missing[@]}" ||
      (apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}")) >&2
  else
    echo "missing: ${missing[*]} (apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi
