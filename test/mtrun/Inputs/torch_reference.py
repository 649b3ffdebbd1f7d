#!/usr/bin/env python3
"""Checks mtrun's loss and every gradient against the same GPT written in
PyTorch (fp32), from the weights of an mtrun checkpoint.

usage: torch_reference.py WORKDIR SRC_ROOT [gpt|llama|moe|moe-drop]

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

`moe`, `moe-drop`: the Llama-style model with a mixture of experts in every
layer (torch_moe.py: Megatron-Core 0.16's TopKRouter on Megatron's [s, b]
token layout: top-2 of 4 SwiGLU experts, softmax over the chosen logits,
the switch load-balancing loss and the z-loss with their coefficients in
the objective; `moe-drop` adds a capacity factor of 1 with the position
drop policy). These train several iterations: the PyTorch model starts
from the checkpoint of a one-iteration run at learning rate 0 (mtc's
initialisation depends on the seed and the names only), runs Adam at a
constant rate, and every iteration's lm loss, load_balancing_loss and
z_loss must match mtrun's iteration lines.
"""
import math
import os
import re
import subprocess
import sys

import numpy as np
import torch

WORK, SRC = sys.argv[1], sys.argv[2]
MODE = sys.argv[3] if len(sys.argv) > 3 else "gpt"
MOE = MODE in ("moe", "moe-drop")
LLAMA = MODE == "llama" or MOE
sys.path.insert(0, os.path.join(SRC, "tools"))
sys.path.insert(0, os.path.join(SRC, "test", "dataset", "Inputs"))
import make_dataset  # noqa: E402
import mt_checkpoint  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_moe  # noqa: E402

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
EXPERTS, TOPK, MOE_FFN, AUX_COEFF, Z_COEFF, ITERS, LR = 4, 2, 24, 0.01, 0.001, 4, 3e-3
CAPACITY_FACTOR = 1.0 if MODE == "moe-drop" else None
MOE_CONFIG = torch_moe.Config(EXPERTS, TOPK, CAPACITY_FACTOR, "position")
MOE_KEYS = f"""
num_experts = {EXPERTS}
moe_router_topk = {TOPK}
moe_ffn_hidden_size = {MOE_FFN}
moe_router_load_balancing_type = "aux_loss"
moe_aux_loss_coeff = {AUX_COEFF}
moe_z_loss_coeff = {Z_COEFF}
""" + (f"""moe_expert_capacity_factor = {CAPACITY_FACTOR}
moe_token_drop_policy = "position"
""" if CAPACITY_FACTOR else "") if MOE else ""
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
{LLAMA_KEYS}{MOE_KEYS}
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
if MOE:
    # The run to compare: ITERS iterations at a constant rate, no weight
    # decay, no clipping (Adam as torch.optim.Adam computes it).
    TRAIN_SPEC = (SPEC.replace("train_iters = 1", f"train_iters = {ITERS}")
                  .replace("lr = 1e-3", f"lr = {LR}")
                  .replace("lr_warmup_iters = 1", "lr_warmup_iters = 0")
                  .replace("lr_decay_iters = 2", f"lr_decay_iters = {ITERS + 1}")
                  .replace("[training]", "[training]\nweight_decay = 0.0"))
    open(os.path.join(WORK, "train.toml"), "w").write(TRAIN_SPEC)
run("mtc", "compile", os.path.join(WORK, "spec.toml"), "-o", os.path.join(WORK, "plan"))
out = run("mtrun", os.path.join(WORK, "plan"), "--save", os.path.join(WORK, "ckpt"))
mt_loss = float(re.search(r"lm loss: ([0-9.E+-]+)", out).group(1))
mt_norm = float(re.search(r"grad norm: ([0-9.]+)", out).group(1))

samples = run("mt-dataset", "samples", os.path.join(WORK, "data"), "--seq-length", str(SEQ),
              "--num-samples", str(GBS), "--split", "100,0,0", "--seed", str(SEED),
              "--show", str(GBS))
batch = torch.tensor([[int(t) for t in line.split()] for line in samples.splitlines()])
assert batch.shape == (GBS, SEQ + 1), batch.shape
if MOE:
    samples = run("mt-dataset", "samples", os.path.join(WORK, "data"), "--seq-length", str(SEQ),
                  "--num-samples", str(GBS * ITERS), "--split", "100,0,0", "--seed", str(SEED),
                  "--show", str(GBS * ITERS))
    batch = torch.tensor([[int(t) for t in line.split()] for line in samples.splitlines()])
    assert batch.shape == (GBS * ITERS, SEQ + 1), batch.shape

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


def moe_mlp(h, i, router_losses):
    pre = f"decoder.layers.{i}.mlp."
    out, aux, z = torch_moe.moe_mlp(h, p(pre + "router.weight"),
                                    p(pre + "experts.linear_fc1.weight"),
                                    p(pre + "experts.linear_fc2.weight"), MOE_CONFIG)
    router_losses.append((aux, z))
    return out


def moe_block(x, i, router_losses):
    pre = f"decoder.layers.{i}."
    b, s, _ = x.shape
    d = HIDDEN // HEADS
    per = HEADS // GROUPS
    h = layer_norm(x, pre + "input_layernorm")
    qkv = linear(h, pre + "self_attention.linear_qkv").view(b, s, GROUPS, per + 2, d)
    q = qkv[:, :, :, :per].reshape(b, s, HEADS, d)
    k, v = qkv[:, :, :, per], qkv[:, :, :, per + 1]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k = rope(q), rope(k)
    k = k.repeat_interleave(per, dim=1)
    v = v.repeat_interleave(per, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    a = (torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v)
    x = x + linear(a.transpose(1, 2).reshape(b, s, HIDDEN), pre + "self_attention.linear_proj")
    return x + moe_mlp(layer_norm(x, pre + "pre_mlp_layernorm"), i, router_losses)


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


def moe_train():
    """ITERS iterations of the MoE model against mtrun's iteration lines."""
    out = run("mtrun", os.path.join(WORK, "train_plan"))
    logged = {}
    for line in out.splitlines():
        it = re.search(r"iteration +(\d+)/", line)
        if it:
            logged[int(it.group(1))] = {k: float(v) for k, v in re.findall(
                r"(lm loss|load_balancing_loss|z_loss): ([0-9.E+-]+)", line)}
    opt = torch.optim.Adam(params.values(), lr=LR, betas=(BETA1, 0.999), eps=1e-8)
    micro = GBS // MBS
    failures = []
    for it in range(1, ITERS + 1):
        opt.zero_grad()
        lm = aux_sum = z_sum = 0.0
        for m in range(micro):
            rows = batch[(it - 1) * GBS + m * MBS:(it - 1) * GBS + (m + 1) * MBS]
            router_losses = []
            x = p("embedding.word_embeddings.weight")[rows[:, :-1]]
            for i in range(LAYERS):
                x = moe_block(x, i, router_losses)
            logits = layer_norm(x, "decoder.final_layernorm") @ p("output_layer.weight").T
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, PADDED),
                                                     rows[:, 1:].reshape(-1))
            aux = sum(a for a, _ in router_losses)
            z = sum(zz for _, zz in router_losses)
            # MoEAuxLossAutoScaler: the router losses' gradients at the main
            # loss's backward scale (1 / micro-batches).
            ((loss + AUX_COEFF * aux + Z_COEFF * z) / micro).backward()
            lm += loss.item() / micro
            aux_sum += aux.item()
            z_sum += z.item()
        # track_moe_metrics: summed over layers and micro-batches, times
        # 1 / micro-batches, divided by the MoE layers.
        want = {"lm loss": lm, "load_balancing_loss": aux_sum / micro / LAYERS,
                "z_loss": z_sum / micro / LAYERS}
        got = logged.get(it, {})
        for key, ref in want.items():
            mine = got.get(key)
            rel = abs(mine - ref) / abs(ref) if mine is not None else float("inf")
            print(f"iteration {it} {key}: mtrun {mine}, pytorch {ref:.7g}, rel {rel:.1e}")
            if rel > 1e-5:
                failures.append(f"iteration {it} {key}")
        opt.step()
    if failures:
        sys.exit("mismatch: " + ", ".join(failures))
    print("all match")
    sys.exit(0)


if MOE:
    run("mtc", "compile", os.path.join(WORK, "train.toml"), "-o", os.path.join(WORK, "train_plan"))
    moe_train()

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
