#!/usr/bin/env python3
"""Checks `mt-checkpoint to-hf` against transformers: the exported model,
loaded with AutoModelForCausalLM.from_pretrained, gives mt's loss on the
same batch (fp32, relative error < 1e-5).

usage: hf_export_check.py WORKDIR SRC_ROOT MODEL...

MODEL is gpt, llama or llama31 (llama with Llama 3.1's RoPE scaling),
optionally with a layout: llama:2x2 trains on tensor 2 x pipeline 2 ranks
(Gloo on the CPU). For each, mtrun trains a tiny model
3 iterations and saves; a second run loads that checkpoint and trains
iteration 4, whose logged lm loss is the checkpoint's loss on batch 4 (mean
cross-entropy over the padded vocabulary, as Megatron computes it). The
batch is read back with `mt-dataset samples`. The export with
--keep-padded-vocab must give that loss; the default export (the vocabulary
cut to the tokenizer's) must give the same logits over the real vocabulary;
a bf16 export in shards must load and agree to bf16's precision.
`gpt`: LayerNorm, tanh GeLU, biases, tied embeddings, learned positions
(GPT2LMHeadModel); `llama`: RMSNorm, SwiGLU, RoPE, grouped-query attention,
no biases, an untied output layer (LlamaForCausalLM).
"""
import json
import os
import re
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM

WORK, SRC = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(SRC, "test", "dataset", "Inputs"))
import make_dataset  # noqa: E402

LAYERS, HIDDEN, HEADS, SEQ, VOCAB, PADDED = 2, 32, 4, 16, 100, 128
MBS, GBS, SEED, ITERS = 2, 4, 1234, 4
LLAMA_KEYS = """
num_query_groups = 2
ffn_hidden_size = 48
normalization = "RMSNorm"
norm_epsilon = 1e-6
swiglu = true
position_embedding_type = "rope"
rotary_base = 500000
untie_embeddings_and_output_weights = true
add_bias_linear = false
"""


def spec(work, llama, tp, pp, scaling):
    scaled = "use_rope_scaling = true\nrope_scaling_factor = 8.0" if scaling else ""
    return f"""
[model]
num_layers = {LAYERS}
hidden_size = {HIDDEN}
num_attention_heads = {HEADS}
seq_length = {SEQ}
vocab_size = {VOCAB}
make_vocab_size_divisible_by = {PADDED // tp}
hidden_dropout = 0.0
attention_dropout = 0.0
{LLAMA_KEYS if llama else ""}
{scaled}
[parallel]
tensor_model_parallel_size = {tp}
pipeline_model_parallel_size = {pp}

[training]
micro_batch_size = {MBS}
global_batch_size = {GBS}
train_iters = {ITERS}
lr = 1e-2
lr_decay_style = "constant"
seed = {SEED}
eval_iters = 0
log_interval = 1

[data]
data_path = "{work}/data"
split = "100,0,0"

[cluster]
gpus_per_node = {tp * pp}
"""


def run(*cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout


def check(model):
    kind, _, layout = model.partition(":")
    llama = kind in ("llama", "llama31")
    tp, pp = (int(n) for n in layout.split("x")) if layout else (1, 1)
    work = os.path.join(WORK, model.replace(":", "-"))
    os.makedirs(work)
    rng = torch.Generator().manual_seed(5)
    docs = [[torch.randint(0, VOCAB, (int(torch.randint(5, 60, (1,), generator=rng)),),
                           generator=rng).tolist()] for _ in range(40)]
    make_dataset.write(os.path.join(work, "data"), "uint16", docs)
    open(os.path.join(work, "spec.toml"), "w").write(spec(work, llama, tp, pp, kind == "llama31"))
    plan, ckpt = os.path.join(work, "plan"), os.path.join(work, "ckpt")
    nproc = ["--nproc", str(tp * pp)] if tp * pp > 1 else []
    run("mtc", "compile", os.path.join(work, "spec.toml"), "-o", plan)
    run("mtrun", plan, *nproc, "--train-iters", str(ITERS - 1), "--save", ckpt)
    out = run("mtrun", plan, *nproc, "--load", ckpt)
    line = next(l for l in out.splitlines() if re.search(rf"iteration +{ITERS}/", l))
    mt_loss = float(re.search(r"lm loss: ([0-9.E+-]+)", line).group(1))

    samples = run("mt-dataset", "samples", os.path.join(work, "data"), "--seq-length", str(SEQ),
                  "--num-samples", str(GBS * ITERS), "--split", "100,0,0", "--seed", str(SEED),
                  "--show", str(GBS * ITERS))
    rows = [[int(t) for t in l.split()] for l in samples.splitlines()]
    batch = torch.tensor(rows[GBS * (ITERS - 1):])
    assert batch.shape == (GBS, SEQ + 1), batch.shape
    tokens, labels = batch[:, :-1], batch[:, 1:]

    def export(name, *flags):
        d = os.path.join(work, name)
        print(run("mt-checkpoint", "to-hf", ckpt, "-o", d, *flags).strip().replace(WORK, "WORK"))
        return d

    def logits_of(d, dtype=torch.float32):
        m = AutoModelForCausalLM.from_pretrained(d, dtype=dtype).eval()
        with torch.no_grad():
            return type(m).__name__, m(input_ids=tokens).logits.float()

    print(f"{model}:")
    cls, lp = logits_of(export("hf-padded", "--keep-padded-vocab"))
    loss = torch.nn.functional.cross_entropy(lp.reshape(-1, PADDED), labels.reshape(-1)).item()
    rel = abs(loss - mt_loss) / abs(mt_loss)
    print(f"{cls}: loss mt {mt_loss:.7g}, transformers {loss:.7g}, rel {rel:.1e}")
    failures = ["loss"] if rel > 1e-5 else []

    trimmed = export("hf")
    config = json.load(open(os.path.join(trimmed, "config.json")))
    _, lt = logits_of(trimmed)
    diff = float((lt - lp[..., :VOCAB]).abs().max())
    print(f"vocabulary {config['vocab_size']}: logits differ from the padded export's by {diff:.1e}")
    if config["vocab_size"] != VOCAB or lt.shape[-1] != VOCAB or diff > 1e-5:
        failures.append("trimmed vocabulary")
    if llama and (config["num_key_value_heads"] != 2 or config["tie_word_embeddings"]):
        failures.append("config")
    if (config.get("rope_scaling") or {}).get("rope_type") != ("llama3" if kind == "llama31" else None):
        failures.append("rope scaling")

    half = export("hf-bf16", "--dtype", "bf16", "--max-shard-size", "20KB")
    shards = sorted(f for f in os.listdir(half) if f.endswith(".safetensors"))
    index = json.load(open(os.path.join(half, "model.safetensors.index.json")))
    _, lb = logits_of(half, torch.bfloat16)
    err = float((lb - lt).norm() / lt.norm())
    print(f"bf16 in {len(shards)} shards: logits within {err:.1e} of fp32's")
    if len(shards) < 2 or set(index["weight_map"].values()) != set(shards) or err > 2e-2:
        failures.append("bf16 shards")
    if failures:
        sys.exit(f"{model}: mismatch: " + ", ".join(failures))
    print(f"{model}: all match")


for m in sys.argv[3:]:
    check(m)
