"""Build a Hugging Face tokenizer.json (+ tokenizer_config.json) from a GGUF file's metadata.

Used for SmolLM2, whose only distribution here is a GGUF. The GGUF pre-tokenizer is 'smollm'
(llama.cpp's StarCoder split: each digit is its own piece, then the GPT-2 byte-level regex), so
the result tokenizes exactly as llama.cpp does.

usage: derive_gguf_tokenizer.py MODEL.gguf OUT_DIR
"""

import json
import sys
from pathlib import Path

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

CONTROL_TOKEN_TYPE = 3


def main(gguf_path: str, out_dir: str) -> None:
    fields = GGUFReader(gguf_path).fields

    def meta(key):
        return fields[key].contents() if key in fields else None

    tokens = meta("tokenizer.ggml.tokens")
    token_types = meta("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ")) for m in meta("tokenizer.ggml.merges")]

    bpe = models.BPE(
        vocab={tok: idx for idx, tok in enumerate(tokens)},
        merges=merges,
        fuse_unk=False,
        byte_fallback=False,
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tokenizer.post_processor = processors.ByteLevel(
        add_prefix_space=True, trim_offsets=False, use_regex=True
    )
    control = [t for t, kind in zip(tokens, token_types) if kind == CONTROL_TOKEN_TYPE]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"), pretty=False)

    def token_for(key):
        idx = meta(key)
        return tokens[int(idx)] if idx is not None else None

    config = {
        "chat_template": meta("tokenizer.chat_template"),
        "bos_token": token_for("tokenizer.ggml.bos_token_id"),
        "eos_token": token_for("tokenizer.ggml.eos_token_id"),
        "unk_token": token_for("tokenizer.ggml.unknown_token_id"),
        "pad_token": token_for("tokenizer.ggml.padding_token_id"),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
