#!/usr/bin/env bash
# Installs what tests/viewer.rs drives the token viewer with: Debian's chromium (when missing,
# and when this runs as root) and playwright-core, pinned, into a cache outside the clone.
# Prints `NAME=path` lines on stdout (eval-able); progress goes to stderr.
#
#   ROLLOUT_PROXY_BROWSER_DIR   where playwright-core is kept (default ~/.cache/rollout-proxy/browser)
set -euo pipefail

playwright_core=1.65.2

dir="${ROLLOUT_PROXY_BROWSER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rollout-proxy/browser}"
package="$dir/node_modules/playwright-core"

if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing Debian's chromium" >&2
    (apt-get install -y -qq --no-install-recommends chromium ||
      (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium)) >&2
  else
    echo "chromium is missing: apt-get install chromium" >&2
    exit 1
  fi
fi

installed=$(node -p "require('$package/package.json').version" 2>/dev/null || true)
if [ "$installed" != "$playwright_core" ]; then
  echo "installing playwright-core@$playwright_core" >&2
  mkdir -p "$dir"
  # playwright-core drives a browser it is given; it downloads none.
  npm install --prefix "$dir" --no-audit --no-fund --no-save "playwright-core@$playwright_core" >&2
fi

echo "CHROMIUM_BIN=$(command -v chromium)"
echo "PLAYWRIGHT_CORE=$package"
