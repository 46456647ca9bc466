"""Writes a tiny random-weight Qwen3 model next to the pinned Qwen3 tokenizer, for the live
vLLM tests (no model can be fetched from a hub on CI machines), and a random LoRA adapter for
it in OUT_DIR/lora (PEFT's layout, rank 8 on q_proj and v_proj).

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
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

RANK = 8


def write_lora(config: Qwen3Config, out: str) -> None:
    """A LoRA adapter whose B matrices are not zero (PEFT starts them at zero, which would
    change nothing): sampling with it gives other logprobs than the base model."""
    os.makedirs(out)
    width = config.head_dim * config.num_attention_heads
    kv_width = config.head_dim * config.num_key_value_heads
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for name, rows in (("q_proj", width), ("v_proj", kv_width)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(RANK, config.hidden_size) * 0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(rows, RANK) * 0.5
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "adapter_model.safetensors"))
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": 16,
                   "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
                   "target_modules": ["q_proj", "v_proj"], "modules_to_save": None,
                   "use_rslora": False, "use_dora": False, "base_model_name_or_path": "tiny"}, f)


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
    write_lora(config, os.path.join(partial, "lora"))
    shutil.rmtree(out, ignore_errors=True)
    os.rename(partial, out)


if __name__ == "__main__":
    main()
