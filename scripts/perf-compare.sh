#!/usr/bin/env bash
# Side-by-side load test: rollout-proxy against the Atropos proxy (atroposlib 0.4.0), same
# machine, same zero-latency SGLang upstream, same workload, one run. Prints the ratio tables
# (also kept in target/perf/compare.md).
#
# Atropos runs twice: as its recorded reference was measured, with vLLM installed for its
# Hermes tool-call parser (the workload's tool loop; the venv is about 8.6 GB), and without vLLM
# (its tool calls come back as text, a lighter turn). Both are started by scripts/run-atropos.py.
#
# 1. Optional: the Python load harness the reference was recorded with (its bench.py and
#    compare.py), when PERF_HARNESS names its folder; skipped otherwise. It compares against
#    its recorded reference ($PERF_HARNESS/results/atropos-baseline.json) too.
# 2. The Rust load generator (benches/load.rs, the same workload; it can keep a proxy busy
#    where the Python harness cannot), in PERF_PAIRS interleaved rounds.
# 3. The growth of our proxy's CPU per turn over one 128-turn rollout (also drawn as an SVG).
#   PERF_HARNESS: the Python harness's folder (optional, see 1);
#   PERF_REPEAT (2), PERF_R (1000), PERF_C (32): sizes of the Python harness's load runs (the
#     reference used R=200; the harness counts CPU in 10 ms clock ticks, and at R=200 our
#     proxy's whole run is ~15 of them, so longer runs read its CPU to a few percent);
#   PERF_PAIRS (3): Rust-generator rounds (1500 rollouts for rollout-proxy, 400 for Atropos);
#   PERF_VLLM (1): 0 leaves out Atropos with vLLM (and its install).
set -euo pipefail
cd "$(dirname "$0")/.."
here=$(pwd)
harness=${PERF_HARNESS:-}
venv=${PERF_VENV:-$HOME/.cache/rollout-proxy/perfvenv}
vllm_venv=${PERF_VLLM_VENV:-$HOME/.cache/rollout-proxy/perfvenv-vllm}
with_vllm=${PERF_VLLM:-1}
out=$here/target/perf
mkdir -p "$out"
# make_venv DIR PACKAGES...: a venv with atroposlib 0.4.0, the harness's needs and PACKAGES;
# marked complete only once every package installed, so an interrupted install is redone.
make_venv() {
  local dir=$1
  shift
  if [ ! -e "$dir/.installed" ]; then
    echo "setting up $dir (atroposlib 0.4.0 $*)" >&2
    python3 -m venv "$dir"
    "$dir/bin/pip" install --quiet atroposlib==0.4.0 aiohttp tokenizers transformers uvloop orjson "$@"
    touch "$dir/.installed"
  fi
}
make_venv "$venv"
if [ "$with_vllm" = 1 ]; then make_venv "$vllm_venv" vllm==0.20.0; fi
scripts/install-build-deps.sh
scripts/fetch-fixtures.sh
cargo build --release --quiet
export PERF_TOKENIZER_DIR=$here/fixtures/cache/qwen3 HF_HUB_OFFLINE=1
atropos_vllm="$vllm_venv/bin/python $here/scripts/run-atropos.py --port {port} --upstream {upstream} --tokenizer-dir $PERF_TOKENIZER_DIR"
atropos_light="$venv/bin/python $here/scripts/run-atropos.py --port {port} --upstream {upstream} --tokenizer-dir $PERF_TOKENIZER_DIR --no-vllm"
: >"$out/compare.md"
if [ -n "$harness" ]; then
  sizes=(-C "${PERF_C:-32}" -R "${PERF_R:-1000}" -T 6 --repeat "${PERF_REPEAT:-2}"
    --mem-sessions 1000 --mem-target-tokens 4000 --mem-turns 4 --mem-rounds 2)
  scenarios=load:0,load:0:pin,load:50,mem:0
  cd "$harness"
  "$venv/bin/python" bench.py --name rollout-proxy --proxy-port 9100 --scenarios "$scenarios" "${sizes[@]}" \
    --proxy-cmd "$here/target/release/rollout-proxy serve --port {port} --tokenizer $PERF_TOKENIZER_DIR --backend http://{upstream_host}:{upstream_port} --backend-type sglang --model-name Qwen/Qwen3-8B" \
    --logs "$out/logs" --out "$out/rollout-proxy.json"
  if [ "$with_vllm" = 1 ]; then
    "$vllm_venv/bin/python" bench.py --name atropos-vllm --proxy-port 9100 --scenarios "$scenarios" "${sizes[@]}" \
      --proxy-cmd "$atropos_vllm" --logs "$out/logs" --out "$out/atropos-vllm.json"
  fi
  "$venv/bin/python" bench.py --name atropos --proxy-port 9100 --scenarios "$scenarios" "${sizes[@]}" \
    --proxy-cmd "$atropos_light" --logs "$out/logs" --out "$out/atropos.json"
  {
    if [ "$with_vllm" = 1 ]; then
      echo "# this run: Atropos with vLLM (the reference's configuration) vs rollout-proxy"
      "$venv/bin/python" compare.py "$out/atropos-vllm.json" "$out/rollout-proxy.json"
      echo
    fi
    echo "# this run: Atropos without vLLM vs rollout-proxy"
    "$venv/bin/python" compare.py "$out/atropos.json" "$out/rollout-proxy.json"
    echo
    echo "# the recorded reference (Atropos with vLLM) vs rollout-proxy"
    "$venv/bin/python" compare.py results/atropos-baseline.json "$out/rollout-proxy.json"
  } | tee -a "$out/compare.md"
else
  echo "PERF_HARNESS not set: the Python harness's runs are skipped" >&2
fi
cd "$here"
rust_load() { GROWTH_TURNS=0 cargo bench --quiet --bench load 2>/dev/null | grep ' turns in '; }
cpu() { sed -E 's/.*proxy CPU ([0-9.]+) ms.*/\1/'; }
# against NAME COMMAND: one Atropos run of a round, and its CPU ratio to this round's ours.
against() {
  local theirs
  # No stream probes: they time our token events, which Atropos does not send.
  theirs=$(LOAD_R=400 STREAM_PROBES=0 LOAD_PROXY_CMD="$2" rust_load)
  echo "  $1: $theirs"
  awk -v a="$(echo "$ours" | cpu)" -v b="$(echo "$theirs" | cpu)" -v n="$1" \
    'BEGIN { printf "  proxy CPU per turn, rollout-proxy vs %s: %.3f vs %.3f ms = 1/%.1f\n", n, a, b, b / a }'
}
{
  echo
  echo "# Rust load generator, C=32 T=6, interleaved rounds: rollout-proxy, then Atropos"
  for round in $(seq "${PERF_PAIRS:-3}"); do
    ours=$(LOAD_R=1500 rust_load)
    echo "round $round"
    echo "  rollout-proxy: $ours"
    if [ "$with_vllm" = 1 ]; then against "Atropos with vLLM" "$atropos_vllm"; fi
    against "Atropos without vLLM" "$atropos_light"
  done
} | tee -a "$out/compare.md"
LOAD_R=64 cargo bench --quiet --bench load 2>/dev/null | sed -n '/^growth/,$p' > "$out/growth.txt"
scripts/plot-growth.py "$out/growth.svg" "$out/growth.txt"
{
  echo
  echo "# growth, rollout-proxy alone (cargo bench --bench load; drawn in $out/growth.svg)"
  cat "$out/growth.txt"
} | tee -a "$out/compare.md"
