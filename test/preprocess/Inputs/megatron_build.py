#!/usr/bin/env python3
"""Writes a dataset the way Megatron-LM's tools/preprocess_data.py does, with
Megatron's own IndexedDatasetBuilder (megatron-core) and GPT-2's BPE from HF
`tokenizers`, so mt-preprocess's output can be compared byte for byte.

usage: megatron_build.py REFERENCE_JSONL GPT2_DIR OUT_DIR

Writes OUT_DIR/input.jsonl (the texts of REFERENCE_JSONL plus an empty and a
whitespace-only document), then OUT_DIR/megatron_text_document.{bin,idx}:
per document (json key "text"), the ids, plus <|endoftext|> when there are
any (--append-eod), one sequence per document (no --split-sentences), dtype
DType.optimal_dtype(vocab size) -- preprocess_data.py's choices.
"""
import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder  # noqa: E402
from tokenizers import ByteLevelBPETokenizer  # noqa: E402

ref, gpt2, out = sys.argv[1:4]
texts = []
for line in open(ref, encoding="utf-8"):
    rec = json.loads(line)
    if "text" in rec:
        texts.append(rec["text"])
texts[10:10] = ["", "  \n\t "]
with open(os.path.join(out, "input.jsonl"), "w", encoding="utf-8") as f:
    for t in texts:
        f.write(json.dumps({"text": t}) + "\n")

tok = ByteLevelBPETokenizer(os.path.join(gpt2, "vocab.json"), os.path.join(gpt2, "merges.txt"),
                            add_prefix_space=False)
eod = tok.token_to_id("<|endoftext|>")
vocab_size = tok.get_vocab_size()
prefix = os.path.join(out, "megatron_text_document")
builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(vocab_size))
for t in texts:
    ids = tok.encode(t).ids if t else []
    lens = [len(ids)] if ids else []
    if ids:
        ids.append(eod)
        lens[-1] += 1
    builder.add_document(torch.IntTensor(ids), lens)
builder.finalize(prefix + ".idx")
print(f"megatron: {len(texts)} documents, vocab {vocab_size}, eod {eod}")
