#!/usr/bin/env python3
"""Writes `o200k_base.tiktoken` (the vocabulary file OpenAI's Harmony library reads) from the
pinned gpt-oss tokenizer.json, so the library runs offline.

Usage: build-o200k-tiktoken.py TOKENIZER_JSON OUT_DIR

The file lists the byte-level BPE vocabulary's ids 0..199997 in order, one `base64(bytes) id`
line each, each piece turned back into its bytes through the byte-level alphabet (GPT-2's
byte-to-character table, inverted). Built this way it is byte-identical to the published file:
the sha256 below is the one the library checks.
"""
import base64
import hashlib
import json
import os
import sys

RANKS = 199_998
SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def byte_alphabet():
    """The byte-level alphabet: every byte as the character that stands for it in pieces."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return {c: b for b, c in chars.items()}


def main(tokenizer_json, out_dir):
    model = json.load(open(tokenizer_json, encoding="utf-8"))["model"]
    assert model["type"] == "BPE", model["type"]
    to_byte = byte_alphabet()
    pieces = {}
    for piece, rank in model["vocab"].items():
        if rank < RANKS:
            pieces[rank] = bytes(to_byte[c] for c in piece)
    if len(pieces) != RANKS:
        sys.exit(f"{tokenizer_json}: {RANKS - len(pieces)} of ids 0..{RANKS - 1} missing")
    data = "".join(
        f"{base64.b64encode(pieces[rank]).decode()} {rank}\n" for rank in range(RANKS)
    ).encode()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256:
        sys.exit(f"o200k_base.tiktoken rebuilt with sha256 {digest}, want {SHA256}")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "o200k_base.tiktoken"), "wb") as out:
        out.write(data)


if __name__ == "__main__":
    main(*sys.argv[1:3])
