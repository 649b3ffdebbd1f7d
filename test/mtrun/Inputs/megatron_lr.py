#!/usr/bin/env python3
"""Checks mtrun's logged learning rates against Megatron-LM's schedule.

usage: megatron_lr.py MTRUN.out STYLE LR MIN_LR WARMUP DECAY GBS [WSD_STYLE WSD_ITERS]

Megatron's OptimizerParamScheduler counts samples: warmup, decay and WSD's
anneal are iterations times the global batch, and each optimizer step adds
the global batch. The iteration line prints the rate after the scheduler's
step, get_lr at (iteration * GBS) samples. Written here from Megatron's
formulas, independently of mtrun's code; prints how many lines agreed.
"""
import math
import re
import sys


def get_lr(style, max_lr, min_lr, warmup, decay, num, wsd_style, wsd_decay):
    if warmup > 0 and num <= warmup:
        return max_lr * float(num) / float(warmup)
    if style == "constant":
        return max_lr
    if num > decay:
        return min_lr
    if style == "inverse-square-root":
        lr = max_lr * max(warmup, 1) ** 0.5 / (max(num, 1) ** 0.5)
        return max(min_lr, lr)
    ratio = float(num - warmup) / float(decay - warmup)
    assert 0.0 <= ratio <= 1.0
    if style == "linear":
        coeff = 1.0 - ratio
    elif style == "cosine":
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    elif style == "WSD":
        start = decay - wsd_decay
        if num <= start:
            coeff = 1.0
        else:
            r = float(num - start) / float(wsd_decay)
            coeff = {"linear": 1.0 - r,
                     "cosine": 0.5 * (math.cos(math.pi * r) + 1.0),
                     "exponential": 2.0 * math.pow(0.5, r) - 1.0,
                     "minus_sqrt": 1.0 - math.sqrt(r)}[wsd_style]
    else:
        sys.exit(f"unknown style {style}")
    return min_lr + coeff * (max_lr - min_lr)


def main():
    out, style = sys.argv[1], sys.argv[2]
    max_lr, min_lr = float(sys.argv[3]), float(sys.argv[4])
    warmup, decay, gbs = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
    wsd_style = sys.argv[8] if len(sys.argv) > 8 else None
    wsd_decay = int(sys.argv[9]) * gbs if len(sys.argv) > 9 else None
    lines = 0
    distinct = set()
    for line in open(out):
        m = re.search(r"iteration\s+(\d+)/.*learning rate: ([0-9.E+-]+) \|", line)
        if not m:
            continue
        it, logged = int(m.group(1)), float(m.group(2))
        want = get_lr(style, max_lr, min_lr, warmup * gbs, decay * gbs, it * gbs, wsd_style,
                      wsd_decay)
        # printed with %.6E; the rate itself is an f32
        if abs(logged - want) > 6e-7 * abs(want) + 1e-30:
            sys.exit(f"iteration {it}: learning rate {logged:.6E}, Megatron's {want:.6E}")
        lines += 1
        distinct.add(f"{want:.6E}")
    if not lines:
        sys.exit(f"no iteration lines in {out}")
    print(f"{lines} learning rates agree ({len(distinct)} distinct)")


if __name__ == "__main__":
    main()
