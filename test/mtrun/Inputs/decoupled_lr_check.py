#!/usr/bin/env python3
"""Recovers the learning rate each AdamW update used from consecutive
checkpoints and checks it against Megatron-LM's schedule: the decoupled
rate (its own peak and floor) for the word embeddings and output layer,
lr for every other weight (--decoupled-lr, --decoupled-min-lr).

AdamW with decoupled weight decay turns w into
    w' = w (1 - lr wd) - lr (m' / c1) / (sqrt(v' / c2) + eps),
c1 = 1 - beta1^k, c2 = 1 - beta2^k at update k, so with w from checkpoint
k - 1 and w', m', v' from checkpoint k, lr = (w - w') / (wd w + (m' / c1) /
(sqrt(v' / c2) + eps)) per element; the median over elements with a large
denominator is the rate. Update k runs at (k - 1) * GBS samples of the
schedule (get_lr from megatron_lr.py, written from Megatron's formulas).

usage: decoupled_lr_check.py SAVE FIRST LAST STYLE LR MIN_LR DLR DMIN WARMUP DECAY GBS
           WD [BETA1 BETA2 EPS]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_tensors import tensors  # noqa: E402
from megatron_lr import get_lr  # noqa: E402

save, first, last, style = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lr, min_lr, dlr, dmin = map(float, sys.argv[5:9])
warmup, decay, gbs = int(sys.argv[9]), int(sys.argv[10]), int(sys.argv[11])
wd = float(sys.argv[12])
b1, b2, eps = (map(float, sys.argv[13:16]) if len(sys.argv) > 13 else (0.9, 0.999, 1e-8))


def ckpt(k):
    return tensors(os.path.join(save, "iter_%07d" % k, "mp_rank_00.mtckpt"))


def recovered(before, after, name, k):
    w, w2 = before[name], after[name]
    m2, v2 = after[name + ".exp_avg"], after[name + ".exp_avg_sq"]
    c1, c2 = 1 - b1 ** k, 1 - b2 ** k
    rates = []
    for x, y, m, v in zip(w, w2, m2, v2):
        den = wd * x + (m / c1) / ((v / c2) ** 0.5 + eps)
        if abs(den) > 0.5:
            rates.append((x - y) / den)
    assert len(rates) > 20, name + ": too few elements to recover the rate"
    rates.sort()
    return rates[len(rates) // 2]


checked = 0
prev = ckpt(first - 1)
for k in range(first, last + 1):
    cur = ckpt(k)
    for name in sorted(cur):
        if not name.endswith(".weight") or name + ".exp_avg" not in cur or "norm" in name:
            continue
        decoupled = name in ("embedding.word_embeddings.weight", "output_layer.weight")
        peak, floor = (dlr, dmin) if decoupled else (lr, min_lr)
        want = get_lr(style, peak, floor, warmup * gbs, decay * gbs, (k - 1) * gbs, None, None)
        got = recovered(prev, cur, name, k)
        if abs(got - want) > 2e-3 * max(want, 1e-12) + 1e-9:
            sys.exit("update %d, %s: the rate was %.6e, Megatron's schedule gives %.6e%s"
                     % (k, name, got, want, " (decoupled)" if decoupled else ""))
        checked += 1
    prev = cur
print("%d rates agree over updates %d to %d" % (checked, first, last))
