#!/usr/bin/env python3
"""Writes an indexed dataset the way Megatron-LM's tools/preprocess_data.py
does for --tokenizer-type HuggingFaceTokenizer --append-eod, with Megatron's
own IndexedDatasetBuilder (megatron-core): per document the ids of
tokenizer(text).input_ids, which for a fast tokenizer is HF `tokenizers`'
encode(text, add_special_tokens=True), then the eos_token's id when there are
any; dtype DType.optimal_dtype(len(tokenizer)). (Megatron reaches the library
through transformers' AutoTokenizer, which the reference packages do not
install; the tokenizers here have no tokenizer_config.json behaviour that
transformers would change.)

usage: megatron_build_hf.py INPUT_JSONL OUT_DIR TOKENIZER_DIR... [--grow N]
  writes OUT_DIR/NAME-megatron.{bin,idx} for each tokenizer directory NAME;
  with --grow, also OUT_DIR/big (the first tokenizer with N more added tokens
  "<extra_I>", written into its JSON) and OUT_DIR/big-megatron.{bin,idx}.
  One process for all: importing megatron-core takes seconds.
"""
import json
import os
import shutil
import sys
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402



def build(tok_dir, src, prefix):
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    config = json.load(open(os.path.join(tok_dir, "tokenizer_config.json"), encoding="utf-8"))
    eod = tok.token_to_id(config["eos_token"])
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    dtype = DType.optimal_dtype(vocab_size)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    n = 0
    for line in open(src, encoding="utf-8"):
        ids = tok.encode(json.loads(line)["text"], add_special_tokens=True).ids
        lens = [len(ids)] if ids else []
        if ids:
            ids.append(eod)
            lens[-1] += 1
        builder.add_document(torch.IntTensor(ids), lens)
        n += 1
    builder.finalize(prefix + ".idx")
    print(f"megatron {os.path.basename(prefix)}: {n} documents, vocab {vocab_size}, eod {eod}, "
          f"{dtype.__name__}")


def grow(tok_dir, extra, out_dir):
    # Written into the JSON (the library's add_tokens is slow for so many).
    first = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    j = json.load(open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8"))
    j["added_tokens"] += [{"id": first + i, "content": "<extra_%d>" % i, "single_word": False,
                           "lstrip": False, "rstrip": False, "normalized": False, "special": False}
                          for i in range(extra)]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    shutil.copy(os.path.join(tok_dir, "tokenizer_config.json"), out_dir)


args = sys.argv[1:]
extra = None
if "--grow" in args:
    k = args.index("--grow")
    extra = int(args[k + 1])
    del args[k:k + 2]
src, out, dirs = args[0], args[1], args[2:]
for d in dirs:
    build(d, src, os.path.join(out, os.path.basename(d.rstrip("/")) + "-megatron"))
if extra:
    grow(dirs[0], extra, os.path.join(out, "big"))
    build(os.path.join(out, "big"), src, os.path.join(out, "big-megatron"))
