#!/usr/bin/env python3
"""Whether the step between two checkpoints is a fresh Adam's first step.

    adam_first_step.py BEFORE.mtckpt AFTER.mtckpt LR

With zeroed moments, Adam's first update of an element is
lr * g / (|g| + eps) (the bias corrections cancel: m = (1-b1) g, v = (1-b2) g^2),
so no weight moved by more than lr and those whose gradient is well above
eps moved by lr exactly (weight decay 0). An optimizer that carried moments
from earlier steps moves each weight by its own amount. Prints "fresh first
step: yes" when no weight moved by more than lr (0.1% slack for rounding)
and at least 90% of the changed ones moved by lr within 0.1% (the others:
gradients near eps, such as the key projection's, which attention's softmax
all but cancels), else "fresh first step: no" with the shares.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_tensors import tensors  # noqa: E402


def main(before_path, after_path, lr):
    lr = float(lr)
    before, after = tensors(before_path), tensors(after_path)
    changed = by_lr = beyond = 0
    for name, w0 in before.items():
        if "." in name and name.rsplit(".", 1)[1] in ("exp_avg", "exp_avg_sq", "master"):
            continue
        for a, b in zip(w0, after[name]):
            step = abs(a - b)
            if step == 0.0:
                continue
            changed += 1
            if abs(step / lr - 1.0) < 1e-3:
                by_lr += 1
            elif step > lr * (1.0 + 1e-3):
                beyond += 1
    share = by_lr / max(changed, 1)
    if changed > 1000 and share >= 0.9 and beyond == 0:
        print("fresh first step: yes (%d weights changed)" % changed)
    else:
        print("fresh first step: no (of %d changed weights %d moved by lr, %d by more)"
              % (changed, by_lr, beyond))


if __name__ == "__main__":
    main(*sys.argv[1:])
