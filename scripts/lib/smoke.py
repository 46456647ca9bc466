"""The installed proxy answering as a user meets it, for scripts/check-wheel.sh and
scripts/check-image.sh (standard library only: the wheel's venv holds nothing else).

    smoke.py rollout PORT [--log FILE] [--save FILE]
        waits for /health (the first start may fetch the default model), then runs a two-turn
        tool-calling rollout on the default model and checks it is one node with sampled ids;
        --save keeps the session's id and nodes.
    smoke.py same-nodes PORT FILE
        the session saved in FILE is served with the same nodes.
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

DEFAULT_MODEL = "SmolLM2-135M-Instruct.Q4_1"


def call(base, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data, {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.load(reply)


def wait_for_health(base, log, seconds=300):
    deadline = time.time() + seconds
    while True:
        try:
            return call(base, "/health")
        except (urllib.error.URLError, ConnectionError):
            if time.time() > deadline:
                shown = open(log).read() if log else ""
                sys.exit(f"no /health within {seconds} s\n{shown}")
            time.sleep(1)


def rollout(base, log, save):
    health = wait_for_health(base, log)
    assert health["model"] == DEFAULT_MODEL, health
    uuid = call(base, "/sessions/create", {})["uuid"]
    tools = [{"type": "function", "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    chat = f"/{uuid}/v1/chat/completions"
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    # Naming the tool makes the proxy send a grammar of the call: a 135M model then calls it.
    named = {"type": "function", "function": {"name": "get_weather"}}
    first = call(base, chat, {"messages": ask, "tools": tools, "tool_choice": named,
                              "max_tokens": 48, "seed": 1})
    message = first["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["name"] == "get_weather", message
    result = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
              "content": "17 C, sunny"}
    second = call(base, chat, {"messages": ask + [message, result], "tools": tools,
                               "max_tokens": 16, "seed": 1})
    assert second["choices"][0]["message"]["role"] == "assistant", second
    nodes = call(base, f"/{uuid}/nodes")["nodes"]
    sampled = sum(1 for t in nodes[0]["masked_tokens"] if t != -100)
    assert len(nodes) == 1 and sampled > 0, nodes
    print(f"1 node, 2 turns, {len(nodes[0]['tokens'])} tokens, {sampled} sampled",
          file=sys.stderr)
    if save:
        with open(save, "w") as out:
            json.dump({"uuid": uuid, "nodes": nodes}, out)


def same_nodes(base, saved):
    before = json.load(open(saved))
    after = call(base, f"/{before['uuid']}/nodes")["nodes"]
    assert after == before["nodes"], (after, before["nodes"])
    print(f"the session's node of {len(after[0]['tokens'])} tokens is served as it was",
          file=sys.stderr)


def main():
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("rollout")
    run.add_argument("port")
    run.add_argument("--log")
    run.add_argument("--save")
    same = commands.add_parser("same-nodes")
    same.add_argument("port")
    same.add_argument("saved")
    args = parser.parse_args()
    base = f"http://127.0.0.1:{args.port}"
    if args.command == "rollout":
        rollout(base, args.log, args.save)
    else:
        same_nodes(base, args.saved)


if __name__ == "__main__":
    main()
