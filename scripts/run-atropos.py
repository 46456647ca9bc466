#!/usr/bin/env python3
"""Serve the Atropos ManagedServer OpenAI proxy (atroposlib 0.4.0) for side-by-side benchmarks.

One process, one uvicorn worker (Atropos keeps sessions in process memory, so this process's
PID is the one to measure), one backend of server_type "sglang" at --upstream
(POST {upstream}/generate). Run it with a Python that has atroposlib, transformers and uvicorn
installed (scripts/perf-compare.sh makes such a venv), e.g.

    python scripts/run-atropos.py --port 9100 --upstream http://127.0.0.1:30000 \
        --tokenizer-dir fixtures/cache/qwen3

Atropos translates Hermes tool calls with vLLM's parser when vLLM is importable; --no-vllm hides
vLLM, and tool calls then come back as text (a lighter turn).
"""

import argparse
import importlib.abc
import json
import os
import sys


class HideVllm(importlib.abc.MetaPathFinder):
    """Makes `import vllm` fail, as if vLLM were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "vllm":
            raise ImportError("vllm hidden by --no-vllm")
        return None


def tokenizer_from_dir(folder):
    """A fast tokenizer from tokenizer.json, with the template and special tokens of
    tokenizer_config.json (no hub access)."""
    from transformers import PreTrainedTokenizerFast

    with open(os.path.join(folder, "tokenizer_config.json")) as f:
        config = json.load(f)
    specials = {k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if config.get(k)}
    return PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(folder, "tokenizer.json"),
        chat_template=config.get("chat_template"),
        **specials,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--upstream", required=True, help="the SGLang server's base URL")
    parser.add_argument("--tokenizer-dir", required=True, help="a folder with tokenizer.json and tokenizer_config.json")
    parser.add_argument("--model-name", default="Qwen/Qwen3-8B")
    parser.add_argument("--no-vllm", action="store_true", help="hide vLLM: tool calls stay text")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.no_vllm:
        sys.meta_path.insert(0, HideVllm())

    import uvicorn
    from atroposlib.envs.server_handling.managed_server_proxy import create_app
    from atroposlib.envs.server_handling.server_baseline import APIServerConfig
    from atroposlib.envs.server_handling.server_manager import ServerManager

    upstream = args.upstream.rstrip("/")
    config = APIServerConfig(
        model_name=args.model_name,
        base_url=upstream if upstream.endswith("/v1") else upstream + "/v1",
        # The OpenAI client Atropos builds for the server refuses an empty key.
        api_key="unused",
        server_type="sglang",
        tokenizer_name=os.path.abspath(args.tokenizer_dir),
        num_max_requests_at_once=512,
        timeout=1200,
        # Its probe posts to /v1/completions, which an SGLang-native mock does not serve.
        health_check=False,
    )
    app = create_app(
        server_manager=ServerManager(configs=[config]),
        tokenizer=tokenizer_from_dir(args.tokenizer_dir),
        model_name=args.model_name,
    )
    print(f"atropos proxy pid {os.getpid()} on http://{args.host}:{args.port} -> {upstream}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
