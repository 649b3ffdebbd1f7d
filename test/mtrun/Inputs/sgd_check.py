#!/usr/bin/env python3
"""Checks SGD with momentum (--optimizer sgd) from consecutive checkpoints
against torch.optim.SGD's rule as Megatron-LM runs it (no dampening, no
Nesterov, weight decay added to the gradient):

    d = g + wd w;  buf' = momentum buf + d;  w' = w - lr buf'

With a constant learning rate, checkpoint k - 1 (w, buf) and checkpoint k
(w', buf') must give w - w' = lr buf' for every element of every weight.
Where the gradient is zero (the learned position embeddings' rows at or past
the sequence length, which no token reads) the buffer must follow
buf' = momentum buf + wd w exactly as written. Checkpoints hold
momentum_buffer and no Adam moments.

usage: sgd_check.py SAVE FIRST LAST LR MOMENTUM WD SEQ HIDDEN
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_tensors import tensors  # noqa: E402

save, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lr, momentum, wd = map(float, sys.argv[4:7])
seq, hidden = int(sys.argv[7]), int(sys.argv[8])
POS = "embedding.position_embeddings.weight"


def ckpt(k):
    return tensors(os.path.join(save, "iter_%07d" % k, "mp_rank_00.mtckpt"))


def close(a, b, scale):
    # fp32 results of double arithmetic: a few ulps of the values involved.
    return abs(a - b) <= 4e-7 * scale + 1e-30


bad = []
moved = rows = nonzero = 0
before = ckpt(first - 1)
assert not any(n.endswith(".exp_avg") or n.endswith(".exp_avg_sq") for n in before), \
    "an SGD checkpoint holds Adam moments"
for k in range(first, last + 1):
    after = ckpt(k)
    for name, w in before.items():
        if name.endswith(".momentum_buffer") or name.endswith(".master"):
            continue
        buf2 = after[name + ".momentum_buffer"]
        w2 = after[name]
        for i in range(len(w)):
            if not close(w[i] - w2[i], lr * buf2[i], abs(w[i]) + abs(w2[i])):
                bad.append("%s[%d] at update %d: w - w' = %g, lr buf' = %g"
                           % (name, i, k, w[i] - w2[i], lr * buf2[i]))
            moved += 1
            nonzero += buf2[i] != 0
    buf, w = before[POS + ".momentum_buffer"], before[POS]
    buf2 = after[POS + ".momentum_buffer"]
    for i in range(seq * hidden, len(w)):
        want = momentum * buf[i] + wd * w[i]
        if not close(buf2[i], want, abs(want) + abs(buf2[i])):
            bad.append("%s[%d] at update %d: buf' = %g, momentum buf + wd w = %g"
                       % (POS, i, k, buf2[i], want))
        rows += 1
    before = after
for b in bad[:10]:
    print(b)
if bad:
    sys.exit("%d of %d elements disagree" % (len(bad), moved + rows))
# A step that changed nothing would satisfy w - w' = lr buf' with buf' = 0.
if nonzero < 0.9 * moved:
    sys.exit("only %d of %d momentum buffer elements are nonzero" % (nonzero, moved))
print("%d updates agree: %d weight elements moved by lr x their momentum buffer, "
      "%d zero-gradient elements follow momentum x buffer + weight decay x weight"
      % (last - first + 1, moved, rows))
