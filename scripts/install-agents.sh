#!/usr/bin/env bash
# Installs the real agent clients the end-to-end tests drive, pinned, into a cache outside the
# clone: Claude Code and Codex (npm), and a venv with the official anthropic + openai Python SDKs
# and the agent frameworks LangChain, LangGraph and the Agents SDK.
# Idempotent: a stamp file records the pinned versions, so a warm run only prints the paths.
# Prints shell-friendly `NAME=path` lines on stdout (eval-able); progress goes to stderr.
#
#   ROLLOUT_PROXY_AGENTS_DIR   where they are kept (default ~/.cache/rollout-proxy/agents)
set -euo pipefail

claude_code=2.1.332
codex=0.171.0
anthropic_py=2.17.0
openai_py=3.63.0
# The agent frameworks of tests/clients/framework_loops.py.
langchain_openai=1.8.1
langchain=1.5.2
langgraph=1.2.24
openai_agents=0.24.0

dir="${ROLLOUT_PROXY_AGENTS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rollout-proxy/agents}"
stamp="$dir/.stamp"
want="claude-code=$claude_code codex=$codex anthropic=$anthropic_py openai=$openai_py"
want="$want langchain-openai=$langchain_openai langchain=$langchain langgraph=$langgraph"
want="$want openai-agents=$openai_agents"
npm_dir="$dir/npm"
venv="$dir/venv"
# Both native binaries come from optional platform packages. Claude's own bin/claude.exe is a
# stub until its postinstall script copies the binary over it, and npm may skip install scripts
# (allowScripts policy, --ignore-scripts), so point at the platform package's binary directly.
claude_native="$npm_dir/node_modules/@anthropic-ai/claude-code-linux-x64/claude"
# Codex's launcher (bin/codex.js) finds its binary in `@openai/codex-linux-x64` (an npm alias).
codex_native="$npm_dir/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"

print_paths() {
  echo "CLAUDE_BIN=$claude_native"
  echo "CODEX_BIN=$npm_dir/node_modules/.bin/codex"
  echo "CLIENTS_PYTHON=$venv/bin/python"
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$claude_native" ] &&
  [ -x "$codex_native" ] && [ -x "$venv/bin/python" ]; then
  print_paths
  exit 0
fi

mkdir -p "$npm_dir"
rm -f "$stamp"

echo "installing @anthropic-ai/claude-code@$claude_code and @openai/codex@$codex" >&2
# --include=optional: both packages ship their native binaries as optional platform
# dependencies, which an `omit=optional` npm config would silently skip.
# --os/--cpu pin the platform so a cache built elsewhere still gets the linux x64 binaries.
# --ignore-scripts: Claude's postinstall only copies the native binary we use in place anyway.
npm install --prefix "$npm_dir" --no-audit --no-fund --no-save --include=optional \
  --ignore-scripts --os=linux --cpu=x64 \
  "@anthropic-ai/claude-code@$claude_code" "@openai/codex@$codex" >&2

for native in "$claude_native" "$codex_native"; do
  if [ ! -x "$native" ]; then
    echo "native binary missing: $native (optional dependencies not installed?)" >&2
    exit 1
  fi
done

echo "creating venv with anthropic==$anthropic_py openai==$openai_py" >&2
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet "anthropic==$anthropic_py" "openai==$openai_py" \
  "langchain-openai==$langchain_openai" "langchain==$langchain" "langgraph==$langgraph" \
  "openai-agents==$openai_agents" >&2

# Smoke-check that every client actually runs before recording the install as done.
"$claude_native" --version >&2
"$npm_dir/node_modules/.bin/codex" --version >&2
"$venv/bin/python" -c 'import anthropic, openai, langchain_openai, langgraph, agents' >&2

echo "$want" >"$stamp"
print_paths
