#!/usr/bin/env bash
# Checks the build without the in-process engine (`--no-default-features`: llama.cpp is not
# compiled): it builds, `--version` says so, and `serve` with no backend to front (or with
# --model) stops at once with the reason instead of starting. It shares the test build's
# target folder: the dependencies are built already, and the crate's build for these features
# is kept beside the default one (cargo names them apart), so neither rebuilds the other.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --locked --no-default-features
bin="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/debug/rollout-proxy"

version=$("$bin" --version)
echo "$version" >&2
case "$version" in *"no in-process engine"*) ;; *) echo "--version should say there is no engine" >&2; exit 1 ;; esac
if "$bin" help fetch-default-model >/dev/null 2>&1; then
  echo "fetch-default-model should not exist without the engine" >&2
  exit 1
fi
for args in "serve --port 0" "serve --port 0 --model any.gguf"; do
  # shellcheck disable=SC2086
  if said=$(timeout 30 "$bin" $args 2>&1); then
    echo "\`$args\` started with no engine" >&2
    exit 1
  fi
  case "$said" in
    *"no in-process engine"*) ;;
    *) echo "\`$args\` failed without naming the missing engine: $said" >&2; exit 1 ;;
  esac
done
echo "the build without the engine fronts servers only, and says so" >&2
