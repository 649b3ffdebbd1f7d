#!/usr/bin/env python3
"""--apply-layernorm-1p against the plain model: a run whose norm weights
are stored as w and applied as 1 + w (initialised to 0) computes the plain
model whose norm weights are 1 + w (initialised to 1). Norm weights get no
weight decay, so Adam moves both alike and after training every norm
weight of the 1p checkpoint plus 1 equals the plain checkpoint's, and every
other tensor is equal, to float rounding.

usage: layernorm_1p_check.py PLAIN.mtckpt ONEP.mtckpt TOLERANCE
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_tensors import tensors  # noqa: E402

plain, onep, tol = tensors(sys.argv[1]), tensors(sys.argv[2]), float(sys.argv[3])
assert sorted(plain) == sorted(onep), "the two runs have different tensors"
norms = others = 0
worst = 0.0
for name in sorted(plain):
    # The weight and its f32 master copy, not its Adam moments.
    is_norm = name.endswith("layernorm.weight") or name.endswith("layernorm.weight.master")
    a, b = plain[name], onep[name]
    for x, y in zip(a, b):
        d = abs(x - (y + 1.0 if is_norm else y))
        worst = max(worst, d)
        if d > tol:
            sys.exit("%s: plain %r, 1p %r%s differ by %g > %g"
                     % (name, x, y, " (+1)" if is_norm else "", d, tol))
    # The 1p weights moved away from 0: training changed them.
    if name.endswith("layernorm.weight"):
        assert max(abs(y) for y in b) > 1e-4, name + " did not train"
        norms += 1
    else:
        others += 1
print("%d norm weights equal 1 + w, %d other tensors equal (largest difference %.1e)"
      % (norms, others, worst))
