#!/usr/bin/env python3
"""The PyTorch reference for bench/gpu_compare.py: an mt spec's GPT in plain PyTorch.

Usage: bench/pytorch_gpt_reference.py [--spec models/gpt-125m.toml] [--set SECTION.KEY=VALUE ...]
         [--seq N] [--micro-batch N] [--global-batch N] [--layers N] [--hidden N]
         [--heads N] [--iters 20] [--warmup 5] [--device cuda|cpu] [--no-compile]
         [--peak-tflops T] [--json FILE]

The model a spec describes, written directly in torch.nn: a pre-LN GPT
decoder with learned position embeddings, LayerNorm (or RMSNorm), biases,
GeLU (tanh) or SwiGLU, multi-head or grouped-query causal attention through
torch.nn.functional.scaled_dot_product_attention (flash backend on the GPU),
the spec's hidden and attention dropout, tied (or untied) embeddings and
the vocabulary padded as Megatron-LM pads it. Weights start as Megatron's
do: normal(0, init_method_std), the two output projections of each layer
scaled by 1 / sqrt(2 layers), zero biases, unit norms.

Training follows the spec: random tokens (mock data), global batch /
micro-batch gradient-accumulation steps per iteration, bf16 autocast over
fp32 weights (PyTorch's usual mixed precision; fp16 adds a GradScaler),
AdamW (fused on CUDA) with the spec's lr, betas, eps and weight decay (on
weight matrices and embeddings, not on biases or norm weights, as Megatron
decays), gradient clipping at clip_grad, and Megatron's learning-rate schedule
(linear warm-up, then linear or cosine decay to min_lr). torch.compile
compiles the model unless --no-compile.

Reports over the last --iters iterations (after --warmup, which includes
compilation): step time, tokens / s, TFLOP/s and MFU with the same FLOPs
count as the mt benchmark (bench/flops.py), and the peak memory PyTorch's
allocator held (torch.cuda.max_memory_allocated, and max_memory_reserved).
--layers, --hidden, --heads, --seq and the batch options shrink the model,
e.g. to check the script on the CPU:

  bench/pytorch_gpt_reference.py --device cpu --layers 2 --seq 128 --micro-batch 2 \\
      --global-batch 4 --iters 3 --warmup 1 --no-compile
"""
import argparse
import contextlib
import json
import math
import os
import sys
import time

from flops import model_flops, peak_tflops_for
from gpt_spec import ONE_GPU, load_spec, model_config
from machine import cpu_name, gpu_name_and_driver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(msg):
    sys.exit(f"pytorch_gpt_reference: {msg}")


try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    fail(f"needs PyTorch: {e}")


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.heads, self.groups, self.d = cfg.heads, cfg.query_groups, cfg.kv_channels
        q, kv = cfg.heads * cfg.kv_channels, cfg.query_groups * cfg.kv_channels
        self.qkv = nn.Linear(cfg.hidden, q + 2 * kv, bias=cfg.bias)
        self.proj = nn.Linear(q, cfg.hidden, bias=cfg.bias)
        self.dropout = cfg.attention_dropout

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split(
            [self.heads * self.d, self.groups * self.d, self.groups * self.d], dim=-1)
        q = q.view(b, s, self.heads, self.d).transpose(1, 2)
        k = k.view(b, s, self.groups, self.d).transpose(1, 2)
        v = v.view(b, s, self.groups, self.d).transpose(1, 2)
        if self.groups != self.heads:
            # Each key/value head serves heads / groups query heads.
            k = k.repeat_interleave(self.heads // self.groups, dim=1)
            v = v.repeat_interleave(self.heads // self.groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, s, self.heads * self.d))


class Mlp(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.swiglu = cfg.swiglu
        width = 2 * cfg.ffn_hidden if cfg.swiglu else cfg.ffn_hidden
        self.fc1 = nn.Linear(cfg.hidden, width, bias=cfg.bias)
        self.fc2 = nn.Linear(cfg.ffn_hidden, cfg.hidden, bias=cfg.bias)

    def forward(self, x):
        h = self.fc1(x)
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        return self.fc2(h)


def norm(cfg):
    if cfg.normalization == "RMSNorm":
        return nn.RMSNorm(cfg.hidden, eps=cfg.norm_epsilon)
    return nn.LayerNorm(cfg.hidden, eps=cfg.norm_epsilon)


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm1, self.attn = norm(cfg), Attention(cfg)
        self.norm2, self.mlp = norm(cfg), Mlp(cfg)
        self.drop = nn.Dropout(cfg.hidden_dropout)

    def forward(self, x):
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.drop(self.mlp(self.norm2(x)))


class Gpt(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.padded_vocab, cfg.hidden)
        self.wpe = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.drop = nn.Dropout(cfg.hidden_dropout)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))
        self.final_norm = norm(cfg)
        self.output = None if cfg.tied else nn.Linear(cfg.hidden, cfg.padded_vocab, bias=False)
        self._init(cfg)

    def _init(self, cfg):
        scaled = cfg.init_std / math.sqrt(2 * cfg.layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                # Biases start at zero, norm weights at one.
                nn.init.ones_(p) if "norm" in name and name.endswith("weight") else nn.init.zeros_(p)
            elif name.endswith("proj.weight") or name.endswith("fc2.weight"):
                nn.init.normal_(p, 0.0, scaled)
            else:
                nn.init.normal_(p, 0.0, cfg.init_std)

    def forward(self, tokens, labels):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(pos))
        for layer in self.layers:
            x = layer(x)
        x = self.final_norm(x)
        weight = self.wte.weight if self.output is None else self.output.weight
        logits = F.linear(x, weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))


def learning_rate(cfg, iteration):
    """Megatron-LM's schedule at `iteration` (0-based): linear warm-up to lr,
    then constant, linear or cosine decay to min_lr over lr_decay_iters."""
    if cfg.lr_warmup_iters > 0 and iteration <= cfg.lr_warmup_iters:
        return cfg.lr * iteration / cfg.lr_warmup_iters
    if cfg.lr_decay_style == "constant" or iteration > cfg.lr_decay_iters:
        return cfg.lr if cfg.lr_decay_style == "constant" else cfg.min_lr
    ratio = (iteration - cfg.lr_warmup_iters) / max(1, cfg.lr_decay_iters - cfg.lr_warmup_iters)
    coeff = 1.0 - ratio if cfg.lr_decay_style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1)
    return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr)


def make_optimizer(model, cfg, device):
    # Megatron decays weight matrices only: biases and norm weights are 1-D.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    kind = {"fused": True} if device == "cuda" else {"foreach": True}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                             eps=cfg.adam_eps, **kind)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=os.path.join(ROOT, "models", "gpt-125m.toml"))
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a spec key, as mtc compile --set does (repeatable)")
    for flag, key in [("--seq", "model.seq_length"), ("--micro-batch", "training.micro_batch_size"),
                      ("--global-batch", "training.global_batch_size"),
                      ("--layers", "model.num_layers"), ("--hidden", "model.hidden_size"),
                      ("--heads", "model.num_attention_heads")]:
        ap.add_argument(flag, type=int, help=key)
    ap.add_argument("--iters", type=int, default=20, help="measured iterations")
    ap.add_argument("--warmup", type=int, default=5,
                    help="iterations run first, not measured (compilation happens here)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--no-compile", action="store_true", help="run the model without torch.compile")
    ap.add_argument("--peak-tflops", type=float,
                    help="dense bf16 peak of the GPU (default: by its nvidia-smi name)")
    ap.add_argument("--json", help="also write the result to this file")
    return ap.parse_args()


def spec_overrides(args):
    sets = list(ONE_GPU)
    for value, key in [(args.seq, "model.seq_length"),
                       (args.micro_batch, "training.micro_batch_size"),
                       (args.global_batch, "training.global_batch_size"),
                       (args.layers, "model.num_layers"), (args.hidden, "model.hidden_size"),
                       (args.heads, "model.num_attention_heads")]:
        if value:
            sets.append(f"{key}={value}")
    return sets + list(args.set)


def main():
    args = parse_args()
    if args.iters < 1 or args.warmup < 0:
        fail("--iters must be >= 1 and --warmup >= 0")
    sets = spec_overrides(args)
    try:
        cfg = model_config(load_spec(args.spec, sets))
    except (ValueError, KeyError) as e:
        fail(f"{args.spec}: {e}")
    if cfg.position_embedding != "learned_absolute":
        fail(f"position_embedding_type = \"{cfg.position_embedding}\": the reference has learned "
             "absolute positions only")
    if cfg.global_batch % cfg.micro_batch:
        fail(f"global batch {cfg.global_batch} is not a multiple of micro-batch {cfg.micro_batch}")

    if args.device == "cuda":
        if not torch.cuda.is_available():
            fail(f"--device cuda: torch {torch.__version__} sees no GPU "
                 f"(built for CUDA {torch.version.cuda or 'none'})")
        gpu = gpu_name_and_driver() or (torch.cuda.get_device_name(0), "")
        peak = args.peak_tflops or peak_tflops_for(gpu[0])
        if peak is None:
            fail(f"no known dense bf16 peak for '{gpu[0]}'; give it with --peak-tflops")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        gpu, peak = (cpu_name(), ""), args.peak_tflops
    device = torch.device(args.device)
    torch.manual_seed(cfg.seed)

    model = Gpt(cfg).to(device)
    optimizer = make_optimizer(model, cfg, args.device)
    step_model = model if args.no_compile else torch.compile(model)
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
    scaler = torch.amp.GradScaler(args.device) if cfg.precision == "fp16" else None
    params = [p for p in model.parameters()]
    micro_batches = cfg.global_batch // cfg.micro_batch

    def batch():
        tokens = torch.randint(0, cfg.vocab, (cfg.micro_batch, cfg.seq + 1), device=device)
        return tokens[:, :-1], tokens[:, 1:]

    def attention_backend():
        # Flash attention on the GPU, as mt's generated attention kernels
        # are; it takes 16-bit inputs only, so fp32 runs keep PyTorch's choice.
        if args.device != "cuda" or autocast_dtype is None:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)

    def step(iteration):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(cfg, iteration)
        total = 0.0
        for _ in range(micro_batches):
            tokens, labels = batch()
            with torch.autocast(args.device, dtype=autocast_dtype or torch.float32,
                                enabled=autocast_dtype is not None), attention_backend():
                loss = step_model(tokens, labels) / micro_batches
            (scaler.scale(loss) if scaler else loss).backward()
            total += loss.detach()
        if scaler:
            scaler.unscale_(optimizer)
        if cfg.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.clip_grad)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    model.train()
    times, losses = [], []
    for it in range(args.warmup + args.iters):
        sync()
        start = time.perf_counter()
        loss = step(it)
        sync()
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
        if it + 1 == args.warmup and args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
    if not all(math.isfinite(l) for l in losses):
        fail(f"non-finite losses {losses}; the speed would not mean anything")
    measured = times[args.warmup:]
    step_ms = 1e3 * sum(measured) / len(measured)
    flops = model_flops(cfg)
    tflops = flops / (step_ms / 1e3) / 1e12
    res = {
        "runner": "pytorch",
        "spec": os.path.relpath(os.path.abspath(args.spec), ROOT),
        "device": args.device, "gpu": gpu[0], "driver": gpu[1],
        "torch": torch.__version__, "compiled": not args.no_compile,
        "seq": cfg.seq, "micro_batch": cfg.micro_batch, "global_batch": cfg.global_batch,
        "layers": cfg.layers, "hidden": cfg.hidden, "heads": cfg.heads,
        "parameters": sum(p.numel() for p in model.parameters()),
        "warmup": args.warmup, "iters": args.iters,
        "step_ms": step_ms, "step_ms_min": 1e3 * min(measured), "step_ms_max": 1e3 * max(measured),
        "tokens_per_s": cfg.global_batch * cfg.seq / (step_ms / 1e3),
        "flops_per_iter": flops, "tflops": tflops,
        "peak_tflops": peak, "mfu": tflops / peak if peak else None,
        # The measured iterations' peak, after the warm-up (compilation).
        "peak_memory": torch.cuda.max_memory_allocated() if args.device == "cuda" else None,
        "peak_reserved": torch.cuda.max_memory_reserved() if args.device == "cuda" else None,
        "first_loss": losses[0], "last_loss": losses[-1],
        "command": " ".join(["bench/pytorch_gpt_reference.py"] + sys.argv[1:]),
    }
    mem = (f"{res['peak_memory'] / 2**30:.2f} GiB allocated, {res['peak_reserved'] / 2**30:.2f} "
           f"GiB reserved" if res["peak_memory"] else "-")
    mfu = f"{100 * res['mfu']:.1f}%" if res["mfu"] else "-"
    print(f"| spec | layers x hidden | seq | micro / global batch | iterations | step (ms) | "
          f"tokens / s | TFLOP/s | MFU | peak memory | loss first -> last |\n"
          f"| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
          f"| {res['spec']} (PyTorch {torch.__version__}"
          f"{'' if res['compiled'] else ', not compiled'}) | {cfg.layers} x {cfg.hidden} "
          f"| {cfg.seq} | {cfg.micro_batch} / {cfg.global_batch} "
          f"| {args.iters} (+{args.warmup} warm-up) | {step_ms:.1f} | {res['tokens_per_s']:,.0f} "
          f"| {tflops:.3g} | {mfu} | {mem} | {losses[0]:.3f} -> {losses[-1]:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
