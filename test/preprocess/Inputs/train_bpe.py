#!/usr/bin/env python3
"""Trains a byte-level BPE vocabulary with HF `tokenizers` on the texts of a
jsonl file and saves it in GPT-2's format (vocab.json, merges.txt), with
<|endoftext|> last as in GPT-2, so that tests of GPT-2 BPE compatibility run
without GPT-2's own files.

usage: train_bpe.py INPUT_JSONL VOCAB_SIZE OUT_DIR
"""
import json
import os
import sys

from tokenizers import ByteLevelBPETokenizer

src, size, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
texts = [json.loads(line).get("text", "") for line in open(src, encoding="utf-8") if line.strip()]
tok = ByteLevelBPETokenizer(add_prefix_space=False)
tok.train_from_iterator(texts, vocab_size=size, min_frequency=2, show_progress=False)
os.makedirs(out, exist_ok=True)
tok.save_model(out)
vocab_path = os.path.join(out, "vocab.json")
vocab = json.load(open(vocab_path, encoding="utf-8"))
vocab["<|endoftext|>"] = len(vocab)
with open(vocab_path, "w", encoding="utf-8") as f:
    json.dump(vocab, f, ensure_ascii=False)
merges = sum(1 for line in open(os.path.join(out, "merges.txt"), encoding="utf-8")
             if line.strip() and not line.startswith("#"))
print(f"trained: vocab {len(vocab)}, {merges} merges")
