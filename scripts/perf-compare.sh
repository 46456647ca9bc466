#!/usr/bin/env bash
# Side-by-side load test: rollout-proxy against the Atropos proxy (atroposlib 0.4.0), same
# machine, same mock SGLang upstream, same workload, one run, with the harness in
# ../shared/perf (or $PERF_HARNESS). Prints the ratio tables (also kept in
# target/perf/compare.md). The Atropos side runs without vLLM (its tool-call parsing needs an
# 8 GB torch install), so its turns are text-only; the recorded reference with vLLM is
# compared too ($PERF_HARNESS/results/atropos-baseline.json).
# Then both proxies are driven by the Rust load generator (benches/load.rs), which can keep a
# proxy busy where the Python harness cannot, in PERF_PAIRS interleaved pairs.
#   PERF_REPEAT (2), PERF_R (200), PERF_C (32): sizes of the Python harness's load runs;
#   PERF_PAIRS (3): Rust-generator pairs (1500 rollouts for rollout-proxy, 400 for Atropos).
set -euo pipefail
cd "$(dirname "$0")/.."
here=$(pwd)
harness=${PERF_HARNESS:-$here/../shared/perf}
venv=${PERF_VENV:-$HOME/.cache/rollout-proxy/perfvenv}
out=$here/target/perf
mkdir -p "$out"
if [ ! -x "$venv/bin/python" ]; then
  echo "creating $venv (atroposlib 0.4.0 and the harness's needs)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet atroposlib==0.4.0 aiohttp tokenizers transformers uvloop orjson
fi
scripts/install-build-deps.sh
scripts/fetch-fixtures.sh
cargo build --release --quiet
export PERF_TOKENIZER_DIR=$here/fixtures/cache/qwen3 HF_HUB_OFFLINE=1
sizes=(-C "${PERF_C:-32}" -R "${PERF_R:-200}" -T 6 --repeat "${PERF_REPEAT:-2}"
  --mem-sessions 1000 --mem-target-tokens 4000 --mem-turns 4 --mem-rounds 2)
scenarios=load:0,load:0:pin,load:50,mem:0
cd "$harness"
"$venv/bin/python" bench.py --name rollout-proxy --proxy-port 9100 --scenarios "$scenarios" "${sizes[@]}" \
  --proxy-cmd "$here/target/release/rollout-proxy serve --port {port} --tokenizer $PERF_TOKENIZER_DIR --backend http://{upstream_host}:{upstream_port} --backend-type sglang --model-name Qwen/Qwen3-8B" \
  --logs "$out/logs" --out "$out/rollout-proxy.json"
"$venv/bin/python" bench.py --name atropos --proxy-port 9100 --scenarios "$scenarios" "${sizes[@]}" \
  --proxy-cmd "$venv/bin/python {here}/run_atropos_proxy.py --port {port} --upstream {upstream} --tokenizer-dir $PERF_TOKENIZER_DIR --no-vllm" \
  --logs "$out/logs" --out "$out/atropos.json"
{
  echo "# this run: Atropos (no vLLM) vs rollout-proxy"
  "$venv/bin/python" compare.py "$out/atropos.json" "$out/rollout-proxy.json"
  echo
  echo "# the recorded reference (Atropos with vLLM) vs rollout-proxy"
  "$venv/bin/python" compare.py results/atropos-baseline.json "$out/rollout-proxy.json"
} | tee "$out/compare.md"
cd "$here"
atropos_cmd="$venv/bin/python $harness/run_atropos_proxy.py --port {port} --upstream {upstream} --tokenizer-dir $PERF_TOKENIZER_DIR --no-vllm"
rust_load() { GROWTH_TURNS=0 cargo bench --quiet --bench load 2>/dev/null | grep ' turns in '; }
cpu() { sed -E 's/.*proxy CPU ([0-9.]+) ms.*/\1/'; }
{
  echo
  echo "# Rust load generator, C=32 T=6, interleaved pairs: rollout-proxy, then Atropos (no vLLM)"
  for pair in $(seq "${PERF_PAIRS:-3}"); do
    ours=$(LOAD_R=1500 rust_load)
    theirs=$(LOAD_R=400 LOAD_PROXY_CMD="$atropos_cmd" rust_load)
    echo "pair $pair"
    echo "  rollout-proxy: $ours"
    echo "  atropos:       $theirs"
    awk -v a="$(echo "$ours" | cpu)" -v b="$(echo "$theirs" | cpu)" \
      'BEGIN { printf "  proxy CPU per turn: %.3f vs %.3f ms = 1/%.1f\n", a, b, b / a }'
  done
} | tee -a "$out/compare.md"
