#!/usr/bin/env python3
"""Checks `mtc import-hf` and `mt-checkpoint from-hf` against transformers:
a tiny model transformers initialises at random is saved with
save_pretrained; import-hf writes its spec, mtc compiles it (in the given
parallel layout), from-hf writes the checkpoint, and `mtrun --load` trains
one iteration, whose logged lm loss is the loss of the imported weights on
batch 1. transformers' own loss on that batch (fp32) must match it
(relative error < 1e-5).

usage: hf_import_check.py WORKDIR SRC_ROOT MODEL...

MODEL is gpt (GPT2LMHeadModel: LayerNorm, tanh GeLU, biases, tied
embeddings, learned positions; fp32, one model.safetensors), llama
(LlamaForCausalLM: RMSNorm, SwiGLU, RoPE, 4 heads in 2 query groups, no
biases, an untied output layer; saved in bf16, in shards with
model.safetensors.index.json) or llama31 (llama with Llama 3.1's RoPE
scaling), optionally with a layout: llama:2x2 runs on tensor 2 x pipeline
2 ranks (Gloo on the CPU).

The vocabulary (100 tokens) is padded by the spec to 128 (tp 1) or 256
(tp 2) rows as Megatron pads it, the last row repeated; mtrun's loss, like
Megatron's, is a softmax over the padded rows, so the reference appends
the padded rows' logits (the last token's, repeated) to transformers'.
"""
import os
import re
import subprocess
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

WORK, SRC = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(SRC, "test", "dataset", "Inputs"))
import make_dataset  # noqa: E402

LAYERS, HIDDEN, HEADS, SEQ, VOCAB = 2, 32, 4, 16, 100
MBS, GBS, SEED = 2, 4, 1234


def run(*cmd, stderr=False):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout + (r.stderr if stderr else "")


def hf_model(kind, folder):
    torch.manual_seed(7)
    if kind == "gpt":
        cfg = GPT2Config(n_layer=LAYERS, n_embd=HIDDEN, n_head=HEADS, n_positions=32,
                         vocab_size=VOCAB, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(cfg)
    else:
        scaling = ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
                   if kind == "llama31" else None)
        cfg = LlamaConfig(num_hidden_layers=LAYERS, hidden_size=HIDDEN, intermediate_size=48,
                          num_attention_heads=HEADS, num_key_value_heads=2,
                          max_position_embeddings=16384 if scaling else 64, vocab_size=VOCAB,
                          rms_norm_eps=1e-6,
                          rope_theta=500000.0, rope_scaling=scaling, tie_word_embeddings=False,
                          bos_token_id=0, eos_token_id=0)
        model = LlamaForCausalLM(cfg)
    # Weights well away from zero, so that every layout error shows in the loss.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    if kind == "gpt":
        model.save_pretrained(folder)
    else:  # bf16 in shards: the values are exact in f32 as well
        model.to(torch.bfloat16).save_pretrained(folder, max_shard_size="20KB")
        model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval()


def check(model):
    kind, _, layout = model.partition(":")
    tp, pp = (int(n) for n in layout.split("x")) if layout else (1, 1)
    work = os.path.join(WORK, model.replace(":", "-"))
    os.makedirs(work)
    hf_dir = os.path.join(work, "hf")
    ref = hf_model(kind, hf_dir)
    rng = torch.Generator().manual_seed(5)
    docs = [[torch.randint(0, VOCAB, (int(torch.randint(5, 60, (1,), generator=rng)),),
                           generator=rng).tolist()] for _ in range(40)]
    make_dataset.write(os.path.join(work, "data"), "uint16", docs)

    spec = os.path.join(work, "spec.toml")
    print(run("mtc", "import-hf", hf_dir, "-o", spec, stderr=True).strip().replace(WORK, "WORK"))
    text = open(spec).read()
    # [model] as import-hf wrote it; the run's sections are the test's.
    model_part = text[:text.index("\n[parallel]\n")]
    model_part = re.sub(r"seq_length = \d+", f"seq_length = {SEQ}", model_part)
    open(spec, "w").write(model_part + f"""
[parallel]
tensor_model_parallel_size = {tp}
pipeline_model_parallel_size = {pp}

[training]
micro_batch_size = {MBS}
global_batch_size = {GBS}
train_iters = 1
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
""")
    plan, ckpt = os.path.join(work, "plan"), os.path.join(work, "ckpt")
    run("mtc", "compile", spec, "-o", plan)
    print(run("mt-checkpoint", "from-hf", hf_dir, "--plan", plan, "-o", ckpt).strip()
          .replace(WORK, "WORK"))
    nproc = ["--nproc", str(tp * pp)] if tp * pp > 1 else []
    out = run("mtrun", plan, *nproc, "--load", ckpt)
    line = next(l for l in out.splitlines() if re.search(r"iteration +1/", l))
    mt_loss = float(re.search(r"lm loss: ([0-9.E+-]+)", line).group(1))

    samples = run("mt-dataset", "samples", os.path.join(work, "data"), "--seq-length", str(SEQ),
                  "--num-samples", str(GBS), "--split", "100,0,0", "--seed", str(SEED),
                  "--show", str(GBS))
    rows = [[int(t) for t in l.split()] for l in samples.splitlines() if l.strip()]
    batch = torch.tensor(rows[:GBS])
    assert batch.shape == (GBS, SEQ + 1), batch.shape
    tokens, labels = batch[:, :-1], batch[:, 1:]
    padded = 128 * tp
    with torch.no_grad():
        logits = ref(input_ids=tokens).logits.float()
    logits = torch.cat([logits, logits[..., -1:].expand(-1, -1, padded - VOCAB)], dim=-1)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, padded), labels.reshape(-1)).item()
    rel = abs(loss - mt_loss) / abs(loss)
    print(f"{model}: {type(ref).__name__}: loss mt {mt_loss:.7g}, transformers {loss:.7g}, "
          f"rel {rel:.1e}")
    if rel > 1e-5:
        sys.exit(f"{model}: mismatch")
    print(f"{model}: match")


for m in sys.argv[3:]:
    check(m)
