"""Writes three tiny random-weight vision-language models next to the pinned Qwen3 tokenizer,
for the live vLLM image tests (no model can be fetched from a hub on CI machines): a Qwen2-VL,
a Qwen2.5-VL and a Qwen3-VL, in OUT_DIR/qwen2-vl, OUT_DIR/qwen2.5-vl and OUT_DIR/qwen3-vl.

    python scripts/write-tiny-vl-models.py TOKENIZER_DIR OUT_DIR

The repository's templates/ holds each model's official chat template (qwen2_vl.jinja, which
Qwen2-VL and Qwen2.5-VL share byte for byte, and qwen3_vl.jinja); each is written into its model as
chat_template.jinja (read first by transformers, vLLM and the proxy) and as tokenizer_config's
chat_template, replacing the text-only Qwen3 template of TOKENIZER_DIR.

The weights come from a fixed seed (set again before each model), so the same transformers and
torch write the same models. Sizes, the smallest vLLM's CPU build serves:
- text: hidden 128, 2 layers, 2 heads of head_dim 64 (vLLM's CPU attention refuses head_dim
  16), tied embeddings, the full 151,936-row vocabulary so every id the tokenizer writes is
  valid; the Qwen3 tokenizer already has the vision tokens at the ids these models use
  (151652 <|vision_start|>, 151653 <|vision_end|>, 151655 <|image_pad|>, 151656 <|video_pad|>).
  M-RoPE's sections add up to head_dim / 2 = 32, split in the real models' proportions.
- vision: depth 2, width 128, 2 heads of 64; the real models' patch, merge and temporal sizes
  (14/2/2 for Qwen2-VL and Qwen2.5-VL, 16/2/2 for Qwen3-VL), since they decide how many
  <|image_pad|> tokens an image becomes: one per merged 2x2 patch group.
- preprocessor_config.json is written by hand with the real processors' values (pixel limits,
  normalisation), so an image expands to as many tokens as it would with the real model.
- generation_config.json has no sampling defaults (the real ones do, and vLLM applies them by
  default): requests say what they want.
"""

import json
import os
import shutil
import sys

import torch
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

SEED = 20261207
VOCAB = 151936
BOS, EOS = 151643, 151645

# The text part every model shares: like the tiny Qwen3 of write-tiny-qwen3.py.
TEXT = {
    "vocab_size": VOCAB,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 8192,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
}

# CLIP's normalisation, used by Qwen2-VL and Qwen2.5-VL.
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


# Qwen2-VL-7B's and Qwen2.5-VL-7B's text rope: rope_theta 1e6, mrope_section [16, 24, 24] of
# head_dim 128, here of head_dim 64.
QWEN2_TEXT = {**TEXT, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                          "mrope_section": [8, 12, 12]}}


def qwen2_preprocessor(processor_class):
    """Qwen/Qwen2-VL-7B-Instruct's and Qwen/Qwen2.5-VL-7B-Instruct's preprocessor_config.json
    (the same image processor; only the processor class differs)."""
    return {
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": processor_class,
    }


def qwen2_vl():
    config = Qwen2VLConfig(
        text_config=QWEN2_TEXT,
        vision_config={"depth": 2, "embed_dim": 128, "hidden_size": 128, "num_heads": 2,
                       "mlp_ratio": 4, "patch_size": 14, "spatial_merge_size": 2,
                       "temporal_patch_size": 2},
        tie_word_embeddings=True,
    )
    return Qwen2VLForConditionalGeneration, config, qwen2_preprocessor("Qwen2VLProcessor")


def qwen2_5_vl():
    config = Qwen2_5_VLConfig(
        text_config=QWEN2_TEXT,
        # Window attention in block 0, full attention in the last (the 7B: 7, 15, 23, 31).
        vision_config={"depth": 2, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2,
                       "out_hidden_size": 128, "patch_size": 14, "spatial_merge_size": 2,
                       "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [1],
                       "tokens_per_second": 2},
        tie_word_embeddings=True,
    )
    return Qwen2_5_VLForConditionalGeneration, config, qwen2_preprocessor("Qwen2_5_VLProcessor")


def qwen3_vl():
    config = Qwen3VLConfig(
        # Qwen3-VL-8B: rope_theta 5e6, interleaved mrope_section [24, 20, 20] of head_dim 128.
        text_config={**TEXT, "head_dim": 64,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                         "mrope_section": [12, 10, 10], "mrope_interleaved": True}},
        # DeepStack from the last vision block into the first text layer (the 8B: 8, 16, 24);
        # 2304 learned positions (a 48x48 grid) as the real models.
        vision_config={"depth": 2, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2,
                       "out_hidden_size": 128, "patch_size": 16, "spatial_merge_size": 2,
                       "temporal_patch_size": 2, "num_position_embeddings": 2304,
                       "deepstack_visual_indexes": [1]},
        tie_word_embeddings=True,
    )
    # Qwen/Qwen3-VL-8B-Instruct's preprocessor_config.json: pixel limits as size's
    # shortest_edge (a minimum area, 256x256) and longest_edge (a maximum area, 4096x4096).
    preprocessor = {
        "size": {"longest_edge": 16777216, "shortest_edge": 65536},
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "processor_class": "Qwen3VLProcessor",
        "image_processor_type": "Qwen2VLImageProcessorFast",
    }
    return Qwen3VLForConditionalGeneration, config, preprocessor


# Each model, what writes it, and its template in templates/.
MODELS = {
    "qwen2-vl": (qwen2_vl, "qwen2_vl"),
    "qwen2.5-vl": (qwen2_5_vl, "qwen2_vl"),
    "qwen3-vl": (qwen3_vl, "qwen3_vl"),
}
TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "templates")


def write(make, template_name, tokenizer_dir, out):
    model_class, config, preprocessor = make()
    torch.manual_seed(SEED)
    model = model_class(config).to(torch.bfloat16)
    template_path = os.path.join(TEMPLATES, f"{template_name}.jinja")
    with open(template_path, encoding="utf-8", newline="") as f:
        template = f.read()
    partial = out + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial, safe_serialization=True)
    shutil.copy(os.path.join(tokenizer_dir, "tokenizer.json"), os.path.join(partial, "tokenizer.json"))
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        tokenizer_config = json.load(f)
    tokenizer_config["chat_template"] = template
    with open(os.path.join(partial, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config, f, indent=2, ensure_ascii=False)
    with open(os.path.join(partial, "chat_template.jinja"), "w", encoding="utf-8", newline="") as f:
        f.write(template)
    with open(os.path.join(partial, "preprocessor_config.json"), "w") as f:
        json.dump(preprocessor, f, indent=2)
    with open(os.path.join(partial, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": BOS, "eos_token_id": [EOS, BOS]}, f)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(partial, out)


def main() -> None:
    tokenizer_dir, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for name, (make, template_name) in MODELS.items():
        write(make, template_name, tokenizer_dir, os.path.join(out, name))


if __name__ == "__main__":
    main()
