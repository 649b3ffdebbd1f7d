#!/usr/bin/env python3
"""Checks mtrun's loss and every gradient against the same GPT written in
PyTorch (fp32), from the weights of an mtrun checkpoint.

usage: torch_reference.py WORKDIR SRC_ROOT [gpt|llama]

mtrun trains one iteration whose update runs at learning rate 0 (warm-up),
so the checkpoint holds the initial weights, and Adam's first moment holds
(1 - beta1) times the gradient: the gradient itself, recovered exactly
enough for a 1e-5 comparison. The batch is read back with
`mt-dataset samples`, which builds Megatron's sample order as mtrun does.
The PyTorch model follows Megatron-LM's layout independently: pre-norm
blocks, QKV fused per query group, mean cross-entropy over the padded
vocabulary; `gpt`: LayerNorm, tanh GeLU, biases, tied embeddings, learned
positions; `llama`: RMSNorm, SwiGLU, rotary embeddings (rotate-half form),
grouped-query attention, no biases, an untied output layer.
"""
import math
import os
import re
import subprocess
import sys

import numpy as np
import torch

WORK, SRC = sys.argv[1], sys.argv[2]
LLAMA = len(sys.argv) > 3 and sys.argv[3] == "llama"
sys.path.insert(0, os.path.join(SRC, "tools"))
sys.path.insert(0, os.path.join(SRC, "test", "dataset", "Inputs"))
import make_dataset  # noqa: E402
import mt_checkpoint  # noqa: E402

LAYERS, HIDDEN, HEADS, SEQ, VOCAB, PADDED = 2, 32, 4, 16, 100, 128
GROUPS, FFN = (2, 48) if LLAMA else (4, 128)
LLAMA_KEYS = f"""
num_query_groups = {GROUPS}
ffn_hidden_size = {FFN}
normalization = "RMSNorm"
swiglu = true
position_embedding_type = "rope"
untie_embeddings_and_output_weights = true
add_bias_linear = false
""" if LLAMA else ""
MBS, GBS, SEED, BETA1 = 2, 4, 1234, 0.9
SPEC = f"""
[model]
num_layers = {LAYERS}
hidden_size = {HIDDEN}
num_attention_heads = {HEADS}
seq_length = {SEQ}
vocab_size = {VOCAB}
make_vocab_size_divisible_by = {PADDED}
hidden_dropout = 0.0
attention_dropout = 0.0
{LLAMA_KEYS}
[training]
micro_batch_size = {MBS}
global_batch_size = {GBS}
train_iters = 1
lr = 1e-3
lr_warmup_iters = 1
lr_decay_iters = 2
lr_decay_style = "constant"
clip_grad = 0.0
adam_beta1 = {BETA1}
seed = {SEED}
eval_iters = 0
log_interval = 1

[data]
data_path = "{WORK}/data"
split = "100,0,0"
"""


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


rng = np.random.default_rng(5)
docs = [[list(rng.integers(0, VOCAB, int(rng.integers(5, 60))))] for _ in range(40)]
make_dataset.write(os.path.join(WORK, "data"), "uint16", docs)
open(os.path.join(WORK, "spec.toml"), "w").write(SPEC)
run("mtc", "compile", os.path.join(WORK, "spec.toml"), "-o", os.path.join(WORK, "plan"))
out = run("mtrun", os.path.join(WORK, "plan"), "--save", os.path.join(WORK, "ckpt"))
mt_loss = float(re.search(r"lm loss: ([0-9.E+-]+)", out).group(1))
mt_norm = float(re.search(r"grad norm: ([0-9.]+)", out).group(1))

samples = run("mt-dataset", "samples", os.path.join(WORK, "data"), "--seq-length", str(SEQ),
              "--num-samples", str(GBS), "--split", "100,0,0", "--seed", str(SEED),
              "--show", str(GBS))
batch = torch.tensor([[int(t) for t in line.split()] for line in samples.splitlines()])
assert batch.shape == (GBS, SEQ + 1), batch.shape

meta, tensors = mt_checkpoint.load(os.path.join(WORK, "ckpt"))
params = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True)
          for k, v in tensors.items() if not k.endswith((".exp_avg", ".exp_avg_sq", ".master"))}


def p(name):
    return params[name]


def layer_norm(x, prefix):
    if LLAMA:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
        return x * p(prefix + ".weight")
    return torch.nn.functional.layer_norm(x, (HIDDEN,), p(prefix + ".weight"), p(prefix + ".bias"), 1e-5)


def linear(x, prefix):
    y = x @ p(prefix + ".weight").T
    return y if LLAMA else y + p(prefix + ".bias")


def rope(x):
    # Megatron's rotary embedding: angle pos * 10000^(-2j/d), rotate-half form.
    d = x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.arange(x.shape[2], dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1).to(torch.float32)       # [s, d]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * torch.cos(ang) + torch.cat([-x2, x1], dim=-1) * torch.sin(ang)


def block(x, i):
    pre = f"decoder.layers.{i}."
    b, s, _ = x.shape
    d = HIDDEN // HEADS
    per = HEADS // GROUPS
    h = layer_norm(x, pre + "input_layernorm")
    qkv = linear(h, pre + "self_attention.linear_qkv")
    # Megatron's layout: per query group, its query heads, then one key and
    # one value head.
    qkv = qkv.view(b, s, GROUPS, per + 2, d)
    q = qkv[:, :, :, :per].reshape(b, s, HEADS, d)
    k, v = qkv[:, :, :, per], qkv[:, :, :, per + 1]             # [b, s, groups, d]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))            # [b, heads or groups, s, d]
    if LLAMA:
        q, k = rope(q), rope(k)
    k = k.repeat_interleave(per, dim=1)
    v = v.repeat_interleave(per, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
    a = (probs @ v).transpose(1, 2).reshape(b, s, HIDDEN)
    x = x + linear(a, pre + "self_attention.linear_proj")
    h = linear(layer_norm(x, pre + "pre_mlp_layernorm"), pre + "mlp.linear_fc1")
    if LLAMA:
        gate, up = torch.chunk(h, 2, dim=-1)
        h = torch.nn.functional.silu(gate) * up
    else:
        h = torch.nn.functional.gelu(h, approximate="tanh")
    return x + linear(h, pre + "mlp.linear_fc2")


def micro_batch_loss(tokens, labels):
    wte = p("embedding.word_embeddings.weight")
    x = wte[tokens]
    if not LLAMA:
        x = x + p("embedding.position_embeddings.weight")[torch.arange(SEQ)]
    for i in range(LAYERS):
        x = block(x, i)
    x = layer_norm(x, "decoder.final_layernorm")
    out = p("output_layer.weight") if LLAMA else wte
    logits = x @ out.T                                          # [b, s, padded vocab]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, PADDED), labels.reshape(-1))


losses = [micro_batch_loss(batch[m:m + MBS, :-1], batch[m:m + MBS, 1:]) for m in range(0, GBS, MBS)]
loss = sum(losses) / len(losses)
loss.backward()

failures = []
rel = abs(loss.item() - mt_loss) / abs(loss.item())
print(f"loss: mtrun {mt_loss:.7g}, pytorch {loss.item():.7g}, rel {rel:.1e}")
if rel > 1e-5:
    failures.append("loss")
norm = math.sqrt(sum(float((t.grad.double() ** 2).sum()) for t in params.values()))
print(f"grad norm: mtrun {mt_norm:.3f}, pytorch {norm:.3f}")
if abs(norm - mt_norm) > 1e-3 * norm + 1e-3:
    failures.append("grad norm")
worst = 0.0
for name, t in params.items():
    mine = torch.tensor(tensors[name + ".exp_avg"], dtype=torch.float64) / (1.0 - BETA1)
    ref = t.grad.double()
    err = float((mine - ref).norm() / max(ref.norm(), 1e-30))
    worst = max(worst, err)
    if err > 1e-5:
        failures.append(f"{name} (rel {err:.1e})")
print(f"gradients: {len(params)} tensors, worst relative error {worst:.1e}")
if failures:
    sys.exit("mismatch: " + ", ".join(failures))
print("all match")
