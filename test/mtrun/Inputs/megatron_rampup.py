#!/usr/bin/env python3
"""Checks sample-based training and the batch-size ramp-up against Megatron-LM.

usage:
  megatron_rampup.py iters GBS TRAIN_SAMPLES [START INCR RAMP_SAMPLES]
      prints the iterations Megatron's update_train_iters derives
  megatron_rampup.py run MTRUN.out --gbs G --mbs M --dp D --train-samples N
      [--rampup START INCR SAMPLES] --lr LR --min-lr MIN --style STYLE
      --warmup W --decay D [--wsd-style S --wsd K]
      checks every iteration line of MTRUN.out: the iteration count, the
      global batch and consumed samples of each iteration, the learning rate
      (Megatron's scheduler stepped by each update's samples) and the
      "ramping up batch size" lines before the iterations whose batch grows

Written here from Megatron-Core 0.16's RampupBatchsizeNumMicroBatchesCalculator,
update_train_iters and OptimizerParamScheduler.get_lr, independently of mt's code.
"""
import argparse
import math
import re
import sys


class Calculator:
    """The global batch at a number of consumed samples."""

    def __init__(self, gbs, rampup):
        self.gbs = gbs
        self.rampup = rampup
        if rampup:
            start, incr, samples = rampup
            assert gbs - start >= 0 and (gbs - start) % incr == 0
            self.per_increment = samples / ((gbs - start) // incr)

    def batch(self, consumed):
        if not self.rampup or consumed > self.rampup[2]:
            return self.gbs
        start, incr, _ = self.rampup
        return start + int(consumed / self.per_increment) * incr


def train_iters(calc, train_samples):
    if not calc.rampup:
        return train_samples // calc.gbs
    iterations = consumed = 0
    while consumed <= calc.rampup[2] and consumed <= train_samples:
        consumed += calc.batch(consumed)
        iterations += 1
    if train_samples > consumed:
        iterations += (train_samples - consumed) // calc.gbs
    return iterations


def get_lr(a, num):
    if a.warmup > 0 and num <= a.warmup:
        return a.lr * float(num) / float(a.warmup)
    if a.style == "constant":
        return a.lr
    if num > a.decay:
        return a.min_lr
    if a.style == "inverse-square-root":
        return max(a.min_lr, a.lr * max(a.warmup, 1) ** 0.5 / (max(num, 1) ** 0.5))
    ratio = float(num - a.warmup) / float(a.decay - a.warmup)
    if a.style == "linear":
        coeff = 1.0 - ratio
    elif a.style == "cosine":
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    else:  # WSD
        start = a.decay - a.wsd
        if num <= start:
            coeff = 1.0
        else:
            r = float(num - start) / float(a.wsd)
            coeff = {"linear": 1.0 - r, "cosine": 0.5 * (math.cos(math.pi * r) + 1.0),
                     "exponential": 2.0 * math.pow(0.5, r) - 1.0,
                     "minus_sqrt": 1.0 - math.sqrt(r)}[a.wsd_style]
    return a.min_lr + coeff * (a.lr - a.min_lr)


def check_run(a):
    calc = Calculator(a.gbs, a.rampup)
    want_iters = train_iters(calc, a.train_samples)
    consumed = scheduler = 0
    current = calc.batch(0)
    lines = 0
    batches = []
    pending_ramp = None
    for line in open(a.out):
        m = re.match(r"ramping up batch size from (\d+) to (\d+)$", line.strip())
        if m:
            pending_ramp = (int(m.group(1)), int(m.group(2)))
            continue
        m = re.search(r"setting training iterations to (\d+)$", line.strip())
        if m and int(m.group(1)) != want_iters:
            sys.exit(f"mtrun derives {m.group(1)} iterations, Megatron {want_iters}")
        m = re.search(r"iteration\s+(\d+)/\s*(\d+) \| consumed samples:\s+(\d+) \|.*"
                      r"learning rate: ([0-9.E+-]+) \| global batch size:\s+(\d+) \|", line)
        if not m:
            continue
        it, total, logged_consumed = int(m.group(1)), int(m.group(2)), int(m.group(3))
        logged_lr, logged_batch = float(m.group(4)), int(m.group(5))
        if total != want_iters:
            sys.exit(f"mtrun trains {total} iterations, Megatron {want_iters}")
        # Megatron's train loop: update_num_microbatches(consumed) before the step
        batch = calc.batch(consumed)
        assert batch % (a.mbs * a.dp) == 0
        if batch != current:
            if pending_ramp != (current, batch):
                sys.exit(f"iteration {it}: no 'ramping up batch size from {current} to {batch}'")
            current = batch
        elif pending_ramp:
            sys.exit(f"iteration {it}: unexpected ramp-up line {pending_ramp}")
        pending_ramp = None
        consumed += batch
        scheduler += batch  # no skipped updates in these runs
        if it != lines + 1:
            sys.exit(f"iteration lines out of order at {it}")
        if logged_batch != batch or logged_consumed != consumed:
            sys.exit(f"iteration {it}: batch {logged_batch}, consumed {logged_consumed}; "
                     f"Megatron's {batch}, {consumed}")
        want_lr = get_lr(a, scheduler)
        if abs(logged_lr - want_lr) > 6e-7 * abs(want_lr) + 1e-30:
            sys.exit(f"iteration {it}: learning rate {logged_lr:.6E}, Megatron's {want_lr:.6E}")
        lines += 1
        if not batches or batches[-1] != batch:
            batches.append(batch)
    if lines != want_iters:
        sys.exit(f"{lines} iteration lines, Megatron trains {want_iters}")
    print(f"{lines} iterations agree: batches {' '.join(map(str, batches))}, "
          f"{consumed} samples")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "iters":
        v = [int(x) for x in sys.argv[2:]]
        calc = Calculator(v[0], v[2:5] if len(v) > 2 else None)
        print(f"{train_iters(calc, v[1])} iterations")
        return
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("out")
    for k in ("--gbs", "--mbs", "--dp", "--train-samples", "--warmup", "--decay", "--wsd"):
        p.add_argument(k, type=int, default=0)
    p.add_argument("--rampup", type=int, nargs=3)
    p.add_argument("--lr", type=float)
    p.add_argument("--min-lr", type=float)
    p.add_argument("--style")
    p.add_argument("--wsd-style")
    check_run(p.parse_args())


main()
