#!/usr/bin/env python3
"""Checks the tokenizer files of `mt-checkpoint to-hf`: transformers'
AutoTokenizer, loaded from the exported folder, gives the ids mt's own
tokenizer gives (mt-preprocess's dataset of the same documents), knows the
end of document as eos_token_id, and has the config's vocabulary size.

usage: hf_tokenizer_check.py WORKDIR SRC_ROOT

gpt2: GPT2BPETokenizer with a small vocab.json/merges.txt (vocab.json,
merges.txt and a written tokenizer_config.json are exported); hf:
HuggingFaceTokenizer named by its tokenizer.json file, a BPE trained here
with HF `tokenizers` and an eos_token in tokenizer_config.json beside it
(both copied).
"""
import json
import os
import subprocess
import sys

import numpy as np
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers
from transformers import AutoTokenizer

WORK, SRC = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(SRC, "test", "dataset", "Inputs"))
import make_dataset  # noqa: E402

TEXTS = ["hello world", "hell is other people", "a\nb  c", "héllo wörld!", "the end"]


def run(*cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout


def spec(data_keys, llama):
    return f"""
[model]
num_layers = 1
hidden_size = 32
num_attention_heads = 4
seq_length = 16
{'normalization = "RMSNorm"' if llama else ""}
{'swiglu = true' if llama else ""}
{'position_embedding_type = "rope"' if llama else ""}
[training]
micro_batch_size = 2
global_batch_size = 2
train_iters = 1
eval_iters = 0
lr = 1e-3
[data]
mock_data = true
{data_keys}
"""


def check(name, data_keys, pre_flags, llama):
    work = os.path.join(WORK, name)
    os.makedirs(work, exist_ok=True)
    open(os.path.join(work, "spec.toml"), "w").write(spec(data_keys, llama))
    run("mtc", "compile", os.path.join(work, "spec.toml"), "-o", os.path.join(work, "plan"))
    run("mtrun", os.path.join(work, "plan"), "--save", os.path.join(work, "ckpt"))
    out = os.path.join(work, "hf")
    print(run("mt-checkpoint", "to-hf", os.path.join(work, "ckpt"), "-o", out)
          .strip().replace(WORK, "WORK"))
    # mt's ids: mt-preprocess's dataset of the documents, each ended by EOD.
    with open(os.path.join(work, "docs.jsonl"), "w") as f:
        for t in TEXTS:
            f.write(json.dumps({"text": t}) + "\n")
    run("mt-preprocess", "--input", os.path.join(work, "docs.jsonl"), "--output-prefix",
        os.path.join(work, "docs"), "--append-eod", "--workers", "1", *pre_flags)
    mt_ids = np.fromfile(os.path.join(work, "docs_text_document.bin"), dtype=np.uint16).tolist()

    config = json.load(open(os.path.join(out, "config.json")))
    tok = AutoTokenizer.from_pretrained(out)
    eos = tok.eos_token_id
    hf_ids = [i for t in TEXTS for i in tok(t).input_ids + [eos]]
    print(f"{name}: {type(tok).__name__}, {len(tok)} ids, eos {eos}; "
          f"{len(mt_ids)} ids of mt, {len(hf_ids)} of transformers")
    bad = []
    if hf_ids != mt_ids:
        bad.append(f"ids differ: mt {mt_ids} transformers {hf_ids}")
    if eos != config["eos_token_id"] or len(tok) != config["vocab_size"]:
        bad.append(f"eos {eos} vs {config['eos_token_id']}, {len(tok)} ids vs {config['vocab_size']}")
    if bad:
        sys.exit(f"{name}: " + "; ".join(bad))
    print(f"{name}: same ids")


vocab = os.path.join(WORK, "gpt2tok")
make_dataset.write_vocab(vocab)
check("gpt2", f'vocab_file = "{vocab}/vocab.json"\nmerge_file = "{vocab}/merges.txt"',
      ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", f"{vocab}/vocab.json",
       "--merge-file", f"{vocab}/merges.txt"], llama=False)

hftok = os.path.join(WORK, "hftok")
os.makedirs(hftok, exist_ok=True)
t = Tokenizer(models.BPE())
t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
t.train_from_iterator(TEXTS * 5, trainers.BpeTrainer(
    vocab_size=300, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
t.add_special_tokens([AddedToken("<|end|>", special=True, normalized=False)])
from tokenizers import decoders  # noqa: E402
t.decoder = decoders.ByteLevel()
t.save(os.path.join(hftok, "tokenizer.json"))
json.dump({"eos_token": "<|end|>", "tokenizer_class": "PreTrainedTokenizerFast"},
          open(os.path.join(hftok, "tokenizer_config.json"), "w"))
check("hf", f'tokenizer_type = "HuggingFaceTokenizer"\ntokenizer_model = "{hftok}/tokenizer.json"',
      ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", f"{hftok}/tokenizer.json"],
      llama=True)
