#!/usr/bin/env python3
"""Compares the lm loss and grad norm of every iteration line, every
validation loss, and the final evaluations on the validation and test sets,
of two mtrun outputs within a relative tolerance; an MoE model's router
losses on the iteration lines too (load_balancing_loss,
seq_load_balancing_loss, z_loss), which both runs must print alike.

usage: compare_runs.py A.out B.out TOLERANCE [--loss-only] [--no-z-loss]

--loss-only compares the losses and not the grad norms (runs in different
precisions: a loss curve tracks, the norms of bf16 and fp32 gradients
differ more).
--no-z-loss leaves z_loss out: Megatron logs the last rank's own (its
tracker entry has no data-parallel reduction), so it differs from one
rank's when data-parallel ranks see different samples.
"""
import re
import sys


ROUTER_LOSSES = ("load_balancing_loss", "seq_load_balancing_loss", "z_loss")


def fields(path):
    its, vals, finals, routers = [], [], [], []
    for line in open(path):
        m = re.search(r"iteration\s+(\d+)/.*lm loss: ([0-9.E+-]+) \|.*grad norm: ([0-9.]+)", line)
        if m:
            its.append((int(m.group(1)), float(m.group(2)), float(m.group(3))))
            routers.append({name: float(v.group(1)) for name in ROUTER_LOSSES
                            if (v := re.search(r"\| " + name + r": ([0-9.E+-]+) \|", line))})
        m = re.search(r"validation loss at iteration (\d+) \| lm loss value: ([0-9.E+-]+)", line)
        if m:
            vals.append((int(m.group(1)), float(m.group(2))))
        m = re.search(r"validation loss at (iteration \d+ on \w+ set) \| lm loss value: ([0-9.E+-]+)",
                      line)
        if m:
            finals.append((m.group(1), float(m.group(2))))
    return its, vals, finals, routers


a, b, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
loss_only = "--loss-only" in sys.argv[4:]
if "--no-z-loss" in sys.argv[4:]:
    ROUTER_LOSSES = ROUTER_LOSSES[:2]
(ia, va, fa, ra), (ib, vb, fb, rb) = fields(a), fields(b)
if [x[0] for x in ia] != [x[0] for x in ib] or [x[0] for x in va] != [x[0] for x in vb] or not ia:
    sys.exit(f"the runs log different iterations: {ia} vs {ib}")
for (it, la, ga), (_, lb, gb) in zip(ia, ib):
    for what, x, y in (("lm loss", la, lb),) + (() if loss_only else (("grad norm", ga, gb),)):
        if abs(x - y) > tol * abs(x) + 1e-3 * (what == "grad norm"):
            sys.exit(f"iteration {it}: {what} {x} vs {y}")
for (it, *_), x, y in zip(ia, ra, rb):
    if x.keys() != y.keys():
        sys.exit(f"iteration {it}: router losses {sorted(x)} vs {sorted(y)}")
    for name in x:
        if abs(x[name] - y[name]) > tol * abs(x[name]) + 1e-7:
            sys.exit(f"iteration {it}: {name} {x[name]} vs {y[name]}")
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
