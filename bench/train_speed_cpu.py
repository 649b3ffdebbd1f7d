#!/usr/bin/env python3
"""Measures the CPU reference path: `mtrun --device cpu` on a preset.

Usage: bench/train_speed_cpu.py [--spec models/tiny.toml] [--iters 100] [--record]
         [--mtc build/bin/mtc] [--mtrun build/bin/mtrun]

Compiles the spec, trains --iters iterations on its data (tiny: mock data),
and reports the whole run's wall time (plan load, data indices and
initialisation included), the mean time per iteration from Megatron's
iteration lines, and tokens per second. Target (issue: single-device
training): 100 iterations of tiny in under a minute on 2 cores. With
--record the table is appended to bench/results/train-speed-cpu.md with the
date, machine and commit.
"""
import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
import time

from machine import cpu_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=os.path.join(ROOT, "models", "tiny.toml"))
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--mtc", default=os.path.join(ROOT, "build", "bin", "mtc"))
    ap.add_argument("--mtrun", default=os.path.join(ROOT, "build", "bin", "mtrun"))
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        plan = os.path.join(tmp, "plan")
        subprocess.run([args.mtc, "compile", args.spec, "-o", plan], check=True,
                       stdout=subprocess.DEVNULL)
        start = time.monotonic()
        out = subprocess.run([args.mtrun, plan, "--train-iters", str(args.iters)], check=True,
                             capture_output=True, text=True).stdout
        wall = time.monotonic() - start

    iter_ms, samples, losses = [], 0, []
    for line in out.splitlines():
        m = re.search(r"iteration\s+(\d+)/\s*\d+ \| consumed samples:\s+(\d+) \| elapsed time per "
                      r"iteration \(ms\): ([0-9.]+) .* lm loss: ([0-9.E+-]+)", line)
        if m:
            iter_ms.append(float(m.group(3)))
            samples = int(m.group(2))
            losses.append(float(m.group(4)))
    seq = None
    for line in out.splitlines():
        m = re.search(r"sequence (\d+)", line)
        if m:
            seq = int(m.group(1))
            break
    if not iter_ms or seq is None:
        sys.exit("bench: could not read mtrun's iteration lines:\n" + out)
    mean_ms = sum(iter_ms) / len(iter_ms)
    tokens = samples * seq
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    table = (
        f"| spec | iterations | wall time (s) | ms / iteration (logged) | tokens / s | first -> last lm loss |\n"
        f"| --- | --- | --- | --- | --- | --- |\n"
        f"| {os.path.relpath(args.spec, ROOT)} | {args.iters} | {wall:.1f} | {mean_ms:.1f} | "
        f"{tokens / wall:,.0f} | {losses[0]:.3f} -> {losses[-1]:.3f} |\n")
    print(table)
    if args.record:
        path = os.path.join(ROOT, "bench", "results", "train-speed-cpu.md")
        new = not os.path.exists(path)
        with open(path, "a") as f:
            if new:
                f.write("# mtrun --device cpu: training speed of the reference path\n\n"
                        "Recorded by bench/train_speed_cpu.py. Target: 100 iterations of "
                        "models/tiny.toml in under a minute on 2 cores.\n\n")
            f.write(f"## {datetime.date.today()} on {cpu_name()}, {os.cpu_count()} cores, "
                    f"commit {commit}\n\n{table}\n")


if __name__ == "__main__":
    main()
