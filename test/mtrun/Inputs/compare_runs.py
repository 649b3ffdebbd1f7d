#!/usr/bin/env python3
"""Compares the lm loss and grad norm of every iteration line, every
validation loss, and the final evaluations on the validation and test sets,
of two mtrun outputs within a relative tolerance.

usage: compare_runs.py A.out B.out TOLERANCE [--loss-only]

--loss-only compares the losses and not the grad norms (runs in different
precisions: a loss curve tracks, the norms of bf16 and fp32 gradients
differ more).
"""
import re
import sys


def fields(path):
    its, vals, finals = [], [], []
    for line in open(path):
        m = re.search(r"iteration\s+(\d+)/.*lm loss: ([0-9.E+-]+) \|.*grad norm: ([0-9.]+)", line)
        if m:
            its.append((int(m.group(1)), float(m.group(2)), float(m.group(3))))
        m = re.search(r"validation loss at iteration (\d+) \| lm loss value: ([0-9.E+-]+)", line)
        if m:
            vals.append((int(m.group(1)), float(m.group(2))))
        m = re.search(r"validation loss at (iteration \d+ on \w+ set) \| lm loss value: ([0-9.E+-]+)",
                      line)
        if m:
            finals.append((m.group(1), float(m.group(2))))
    return its, vals, finals


a, b, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
loss_only = "--loss-only" in sys.argv[4:]
(ia, va, fa), (ib, vb, fb) = fields(a), fields(b)
if [x[0] for x in ia] != [x[0] for x in ib] or [x[0] for x in va] != [x[0] for x in vb] or not ia:
    sys.exit(f"the runs log different iterations: {ia} vs {ib}")
for (it, la, ga), (_, lb, gb) in zip(ia, ib):
    for what, x, y in (("lm loss", la, lb),) + (() if loss_only else (("grad norm", ga, gb),)):
        if abs(x - y) > tol * abs(x) + 1e-3 * (what == "grad norm"):
            sys.exit(f"iteration {it}: {what} {x} vs {y}")
for (it, la), (_, lb) in zip(va, vb):
    if abs(la - lb) > tol * abs(la):
        sys.exit(f"validation at {it}: {la} vs {lb}")
if [x[0] for x in fa] != [x[0] for x in fb]:
    sys.exit(f"the runs end with different evaluations: {fa} vs {fb}")
for (where, la), (_, lb) in zip(fa, fb):
    if abs(la - lb) > tol * abs(la):
        sys.exit(f"evaluation at {where}: {la} vs {lb}")
print(f"{len(ia)} iterations and {len(va)} validations agree within {tol:g}"
      + (f" (so do {len(fa)} final evaluations)" if fa else ""))
