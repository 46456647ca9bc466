#!/usr/bin/env bash
# Installs what the fleet's store tests start on their own: Debian's redis-server (7.0), when
# missing and when this runs as root. Each test runs its own server on a free port.
set -euo pipefail

if ! command -v redis-server >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing Debian's redis-server" >&2
    (apt-get install -y -qq --no-install-recommends redis-server ||
      (apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server)) >&2
  else
    echo "redis-server is missing: apt-get install redis-server" >&2
    exit 1
  fi
fi
# Debian's package starts a server as a service where there is an init system; the tests do
# not use it.
redis-server --version >&2
