#!/usr/bin/env python3
"""The largest absolute difference between the model weights (not the
optimizer state) of two mt checkpoints, which must lie in [LOW, HIGH]:
two runs that should differ a little, not a lot.

usage: ckpt_diff.py A.mtckpt B.mtckpt LOW HIGH
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_tensors import tensors  # noqa: E402

a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
low, high = float(sys.argv[3]), float(sys.argv[4])
worst, where = 0.0, ""
for name in sorted(a):
    if name.endswith((".exp_avg", ".exp_avg_sq", ".master", ".momentum")):
        continue
    d = max(abs(x - y) for x, y in zip(a[name], b[name]))
    if d > worst:
        worst, where = d, name
if not low <= worst <= high:
    sys.exit("largest weight difference %g (%s) is outside [%g, %g]" % (worst, where, low, high))
print("largest weight difference in [%g, %g]" % (low, high))
