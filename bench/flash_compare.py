#!/usr/bin/env python3
"""mt's flash attention against PyTorch's FlashAttention-2 on one GPU.

Usage: bench/flash_compare.py [--mt-bench build/bin/mt-flash-bench] [--seq 1024,2048,4096,8192]
         [--head-dim 64,128] [--dropout 0,0.1] [--causal 1|0|both] [--tokens 16384]
         [--hidden 2048] [--backward kv64,kv128] [--repeats 20] [--record [--results FILE]]
         [--emulate]

For each configuration (FlashAttention-2's benchmark shapes: batch * seq =
--tokens, heads * head dim = --hidden, bf16), times mt's generated kernels
(mt-flash-bench, compiler/cuda/FlashAttentionGen) and then
torch.nn.functional.scaled_dot_product_attention restricted to PyTorch's
flash backend (FlashAttention-2) with the same shapes, causality and
dropout, in the same invocation on the same GPU, and prints one table:
forward and backward TFLOP/s of both and mt's ratio. The target: mt within
15% of FlashAttention-2 (ratio >= 0.85) forward and backward, head dim 64
and 128, seq 1024 to 8192, causal.

FLOPs are FlashAttention-2's count: forward 4 * batch * heads * seq^2 *
head dim (half when causal), backward 2.5 times that. PyTorch's backward
time is its forward-and-backward time less its forward time.

mt's backward is timed for each variant of --backward (default both: kv64,
the default kernel, and kv128; `mtc compile --flash-backward`), each in
its own column; the ratio and the target take the faster, named in the
target's line, and with both variants a last line says which was faster
in how many configurations and by how much (kv128's time over kv64's,
geometric mean and range), the figure that decides the default.

--record appends a dated section to bench/results/gpu-flash-attention.md
(or --results FILE), rewritten after each configuration so that a
time-out keeps the rows that finished. --emulate runs mt's kernels on the
host CUDA emulation and PyTorch's math backend on the CPU, at tiny sizes,
to check this script without a GPU; its numbers mean nothing.
"""
import argparse
import json
import math
import os
import subprocess
import sys

from gpu_results import section, write_results
from machine import cpu_name, gpu_name_and_driver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results", "gpu-flash-attention.md")
HEADER = ("# Flash attention on one GPU\n\n"
          "Recorded by bench/flash_compare.py: mt's generated kernels (mt-flash-bench) against "
          "PyTorch's FlashAttention-2 (scaled_dot_product_attention, flash backend), bf16, "
          "FlashAttention-2's benchmark shapes (batch x seq = 16384 tokens, heads x head dim = "
          "2048). Target: mt within 15% of FlashAttention-2 forward and backward, head dim 64 "
          "and 128, seq 1024 to 8192, causal.\n\n")
TARGET_RATIO = 0.85


def flops(r):
    f = 4.0 * r["batch"] * r["heads"] * r["seq"] ** 2 * r["head_dim"]
    return f / 2 if r["causal"] else f


def pytorch_times(r, repeats, device):
    """(forward ms, backward ms) of PyTorch's flash attention for mt's row r."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shape = (r["batch"], r["seq"], r["heads"], r["head_dim"])  # mt's layout, seen as (b, h, s, d)
    q, k, v, dout = (torch.randn(shape, device=device, dtype=dtype).transpose(1, 2) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    p = float(r["dropout"])
    backend = SDPBackend.FLASH_ATTENTION if device == "cuda" else SDPBackend.MATH

    def forward():
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=r["causal"])

    def both():
        forward().backward(dout)

    def timed(fn):
        with sdpa_kernel(backend):
            fn()  # warm-up (and the check that the backend takes these shapes)
            if device == "cuda":
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(repeats):
                    fn()
                end.record()
                torch.cuda.synchronize()
                return start.elapsed_time(end) / repeats
            import time
            t0 = time.perf_counter()
            for _ in range(repeats):
                fn()
            return (time.perf_counter() - t0) * 1e3 / repeats

    fwd = timed(lambda: forward())
    total = timed(both)
    return fwd, max(total - fwd, 1e-9)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mt-bench", default=os.path.join(ROOT, "build", "bin", "mt-flash-bench"))
    ap.add_argument("--seq", default="1024,2048,4096,8192")
    ap.add_argument("--head-dim", default="64,128")
    ap.add_argument("--dropout", default="0,0.1")
    ap.add_argument("--causal", default="1", choices=["1", "0", "both"])
    ap.add_argument("--tokens", default="16384")
    ap.add_argument("--hidden", default="2048")
    ap.add_argument("--backward", default="kv64,kv128",
                    help="mt's backward variants to time (mt-flash-bench --backward)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--emulate", action="store_true",
                    help="mt on the host emulation, PyTorch on the CPU: checks this script")
    args = ap.parse_args()

    gpu = (cpu_name(), "") if args.emulate else gpu_name_and_driver()
    if gpu is None:
        sys.exit("flash_compare: no GPU: nvidia-smi is missing or lists no GPU (--emulate checks "
                 "this script without one)")
    cmd = [args.mt_bench, "--seq", args.seq, "--head-dim", args.head_dim, "--dropout", args.dropout,
           "--causal", args.causal, "--tokens", args.tokens, "--hidden", args.hidden,
           "--backward", args.backward, "--repeats", str(args.repeats)] + (["--emulate"] if args.emulate else [])
    variants = [v for v in dict.fromkeys(args.backward.split(",")) if v]
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
        print("flash_compare: PyTorch is not installed: mt's rows only", file=sys.stderr)

    earlier = ""
    if args.record:
        try:
            with open(args.results) as f:
                earlier = f.read()
        except FileNotFoundError:
            earlier = HEADER
    rows, targets, failed = [], [], False
    variant_ms = []  # per row: {variant: backward ms}

    def variants_line():
        """Which backward variant was faster, over the rows that timed both."""
        if len(variants) != 2:
            return []
        a, b = variants
        pairs = [(t[a], t[b]) for t in variant_ms if a in t and b in t]
        if not pairs:
            return []
        ratios = [tb / ta for ta, tb in pairs]
        mean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        faster = sum(1 for x in ratios if x < 1)
        return [f"- backward {b} against {a}: {b}'s time / {a}'s {mean:.2f}x geometric mean "
                f"({min(ratios):.2f}x to {max(ratios):.2f}x); {b} faster in {faster} of "
                f"{len(ratios)} configurations"]

    def save():
        if not args.record:
            return
        bwd_heads = "".join(f"mt bwd {v} TFLOP/s | " for v in variants)
        body = ("| seq | head dim | batch x heads | causal | dropout | mt fwd TFLOP/s | FA2 fwd "
                f"TFLOP/s | fwd ratio | {bwd_heads}FA2 bwd TFLOP/s | bwd ratio |\n"
                "| --- | --- | --- | --- | --- | --- | --- | --- | " + "--- | " * len(variants)
                + "--- | --- |\n"
                + "".join(rows) + "".join(f"\n{t}" for t in targets + variants_line()) + "\n")
        write_results(earlier + section("mt's flash attention against FlashAttention-2", body,
                                        gpu[0], gpu[1], [" ".join(cmd)]), args.results)

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        r = json.loads(line)
        pt_fwd = pt_bwd = None
        why = ""
        if have_torch:
            try:
                pt_fwd, pt_bwd = pytorch_times(r, args.repeats, "cpu" if args.emulate else "cuda")
            except Exception as e:  # a shape the backend refuses, out of memory: said in the row
                why = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        f = flops(r)
        pt_fwd_tf = f / (pt_fwd * 1e9) if pt_fwd else None
        pt_bwd_tf = 2.5 * f / (pt_bwd * 1e9) if pt_bwd else None
        cell = lambda x: f"{x:.1f}" if x is not None else "-"
        ratio_f = r["fwd_tflops"] / pt_fwd_tf if pt_fwd_tf else None
        ratio_b = r["bwd_tflops"] / pt_bwd_tf if pt_bwd_tf else None
        variant_ms.append({v: r[f"bwd_{v}_ms"] for v in variants if f"bwd_{v}_ms" in r})
        bwd_cells = "".join(f"{cell(r.get(f'bwd_{v}_tflops'))} | " for v in variants)
        rows.append(f"| {r['seq']} | {r['head_dim']} | {r['batch']} x {r['heads']} | "
                    f"{'yes' if r['causal'] else 'no'} | {r['dropout']} | {cell(r['fwd_tflops'])} | "
                    f"{cell(pt_fwd_tf)} | {cell(ratio_f) if ratio_f is None else f'{ratio_f:.2f}x'} | "
                    f"{bwd_cells}{cell(pt_bwd_tf)} | "
                    f"{cell(ratio_b) if ratio_b is None else f'{ratio_b:.2f}x'} |"
                    + (f" PyTorch failed: {why}" if why else "") + "\n")
        if r["causal"] and ratio_f is not None:
            name = f"seq {r['seq']}, head dim {r['head_dim']}, dropout {r['dropout']}"
            best = f" ({r['bwd_best']})" if "bwd_best" in r else ""
            for what, ratio, which in (("forward", ratio_f, ""), ("backward", ratio_b, best)):
                ok = ratio >= TARGET_RATIO
                targets.append(f"- {'met' if ok else 'MISSED'}: {what} within 15% of "
                               f"FlashAttention-2 ({name}): {ratio:.2f}x{which}")
        print(rows[-1], end="", flush=True)
        save()
    if proc.wait() != 0:
        failed = True
        targets.append(f"- mt-flash-bench failed (exit {proc.returncode}); the rows above finished")
        save()
    for t in targets + variants_line():
        print(t)
    if args.record:
        print(f"recorded in {args.results}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
