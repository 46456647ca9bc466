#!/usr/bin/env bash
# Runs the redis-clients benchmark against a redis-server of its own on a free port.
# Usage: ./run.sh always|no [extra bench args...]
#   always -> --appendonly yes --appendfsync always
#   no     -> --appendonly no
# Build first: cargo build --release (in this folder).
set -euo pipefail
MODE=${1:?always|no}; shift
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$HERE/target/release/redis-clients
# pick a free port
P=16400
while ss -ltnH "sport = :$P" | grep -q .; do P=$((P+1)); done
DIR=$(mktemp -d)
if [ "$MODE" = always ]; then
  PERSIST=(--appendonly yes --appendfsync always)
else
  PERSIST=(--appendonly no)
fi
redis-server --port "$P" --bind 127.0.0.1 --save "" "${PERSIST[@]}" --dir "$DIR" \
  --logfile "$DIR/redis.log" --daemonize no &
RPID=$!
trap 'kill $RPID 2>/dev/null; wait $RPID 2>/dev/null; rm -rf "$DIR"' EXIT
for i in $(seq 50); do redis-cli -p "$P" ping >/dev/null 2>&1 && break; sleep 0.1; done
mkdir -p "$HERE/target/results"
OUT="$HERE/target/results/$(date +%Y%m%d-%H%M%S)-$MODE.txt"
echo "# redis-server $(redis-server --version | awk '{print $3}') mode=$MODE nproc=$(nproc)" | tee "$OUT"
"$BIN" --port "$P" "$@" | tee -a "$OUT"
echo "results: $OUT"
