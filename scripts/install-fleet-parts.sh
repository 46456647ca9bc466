#!/usr/bin/env bash
# Installs what the fleet's tests start on their own: Debian's redis-server (7.0) and HAProxy
# (2.6), when missing and when this runs as root. Each test runs its own processes on free
# ports; the services Debian's packages start where there is an init system are not used.
set -euo pipefail
. "$(dirname "$0")/lib/debian-packages.sh"

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v haproxy >/dev/null || missing+=(haproxy)
install_missing ${missing[@]+"${missing[@]}"}
redis-server --version >&2
# Its first line only, read without a pipe: under pipefail, `| head -1` fails the script
# whenever haproxy is still writing when head exits (SIGPIPE, exit 141).
haproxy_version=$(haproxy -v)
echo "${haproxy_version%%$'\n'*}" >&2
