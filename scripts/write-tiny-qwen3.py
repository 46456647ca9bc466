"""Writes a tiny random-weight Qwen3 model next to the pinned Qwen3 tokenizer, for the live
vLLM tests (no model can be fetched from a hub on CI machines).

    python scripts/write-tiny-qwen3.py TOKENIZER_DIR OUT_DIR

The weights come from a fixed seed, so the same transformers and torch write the same model.
Sizes: hidden 128, 2 layers, 2 heads of head_dim 64 (vLLM's CPU attention refuses head_dim
16), the full Qwen3 vocabulary (151,936 rows) so every id the tokenizer writes is valid.
"""

import json
import os
import shutil
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def main() -> None:
    tokenizer_dir, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(20261207)
    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
        torch_dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    partial = out + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, name), os.path.join(partial, name))
    with open(os.path.join(partial, "generation_config.json"), "w") as f:
        # No sampling defaults of the model's own: requests say what they want.
        json.dump({"bos_token_id": 151643, "eos_token_id": [151645, 151643]}, f)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(partial, out)


if __name__ == "__main__":
    main()
