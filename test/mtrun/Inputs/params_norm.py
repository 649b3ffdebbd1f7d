#!/usr/bin/env python3
"""The params norm of mtrun's last iteration line against an independent
computation: numpy's L2 norm over a checkpoint saved right after that
iteration (every parameter once; the fp32 master copies when the
checkpoint has them, as Megatron's calc_params_l2_norm reads the main
params with bf16).

usage: params_norm.py TOOLS_DIR CHECKPOINT_DIR MTRUN.out [--masters]
"""
import re
import sys

sys.path.insert(0, sys.argv[1])
import numpy as np  # noqa: E402
import mt_checkpoint  # noqa: E402

meta, tensors = mt_checkpoint.load(sys.argv[2])
masters = "--masters" in sys.argv[4:]
total = 0.0
count = 0
for name, a in tensors.items():
    if name.endswith((".exp_avg", ".exp_avg_sq")) or name == "blob":
        continue
    if masters != name.endswith(".master"):
        continue
    total += float(np.sum(np.asarray(a, dtype=np.float64) ** 2))
    count += 1
norms = re.findall(r"params norm: (\S+) \|", open(sys.argv[3]).read())
if not norms or not count:
    sys.exit(f"no params norm in the log ({len(norms)}) or no tensors ({count})")
want = "{:.3f}".format(total ** 0.5)
if norms[-1] != want:
    sys.exit(f"the log's params norm {norms[-1]} is not the checkpoint's {want}")
print(f"params norm {want} is numpy's over the {count} tensors of iteration {meta['iteration']}")
