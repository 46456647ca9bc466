#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (default 30 s each) from the committed seed corpus
# of real model outputs, prompts, requests and journals (fuzz/corpus/); tokenizer_roads and
# template_render need the fetched fixtures. cargo-fuzz needs nightly-only flags; the stable toolchain accepts them with
# RUSTC_BOOTSTRAP=1. No sanitizer: the code under test is safe Rust,
# and what the targets look for are panics and broken invariants (this also keeps the build
# short). The targets build with fuzz/Cargo.toml's dev profile (see there).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1
for target in tool_parsers stream_splitters tokenizer_roads requests template_render journal_replay; do
  work=$(mktemp -d)
  cp fuzz/corpus/"$target"/* "$work"/
  echo "fuzzing $target for ${seconds}s" >&2
  (cd fuzz && cargo fuzz run --dev --sanitizer none "$target" "$work" -- -max_total_time="$seconds" -timeout=10 -print_final_stats=1)
  rm -rf "$work"
done
