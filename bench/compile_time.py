#!/usr/bin/env python3
"""Times `mtc compile` on every preset and records the result.

Usage: bench/compile_time.py [--mtc build/bin/mtc] [--repeat 5] [--only REGEX] [--record]
       bench/compile_time.py --scaling SPEC [--repeat 3] [--record]

Compiles every preset (models/*.toml) and every bench-only spec
(bench/specs/*.toml: the layouts of Megatron-LM's official examples, such
as its GPT-3 175B script's tp 8 x pp 16 with 1536 micro-batches), or those
whose name matches --only. Prints a table per spec: the forward operations of one micro-batch (summed
over the pipeline stages; the tables recorded up to commit 3a48631 show 0 for
pipelined presets), the parameters, the median wall time of `mtc compile SPEC
-o plan.bin` (import, mt-train-pipeline, the summary and writing the plan),
the peak resident memory of that process and the plan's size. With --record
it appends the table, with the date, the machine and the commit, to
bench/results/compile-time.md.

--scaling SPEC compiles one pipelined spec with its layer count and its
global batch (so its micro-batch count) each multiplied by 1, 2 and 4 and
prints the wall time and peak memory of each: the targets are time linear
in layers and flat in micro-batches.
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def compile_once(mtc, path, sets, repeat):
    """Median wall time (s), peak memory (MiB) and plan size (MB) of
    `mtc compile path --set ... -o plan.bin`."""
    times, peak = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        plan = os.path.join(tmp, "plan.bin")
        cmd = [mtc, "compile", path, "-o", plan]
        for s in sets:
            cmd += ["--set", s]
        for _ in range(repeat):
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
            _, status, usage = os.wait4(proc.pid, 0)
            times.append(time.perf_counter() - t0)
            if os.waitstatus_to_exitcode(status) != 0:
                sys.exit(f"{' '.join(cmd)} failed")
            peak = max(peak, usage.ru_maxrss)  # KiB on Linux
        size = os.path.getsize(plan)
    return statistics.median(times), peak / 1024.0, size / 1e6


def spec_value(path, section, key):
    """An integer key of a spec file (the bench specs set both used here)."""
    current = None
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            m = re.match(r"\[(\w+)\]$", line)
            if m:
                current = m.group(1)
                continue
            m = re.match(r"(\w+)\s*=\s*(\d+)$", line)
            if m and current == section and m.group(1) == key:
                return int(m.group(2))
    sys.exit(f"{path} sets no [{section}] {key}")


def scaling(args):
    path = args.scaling
    layers = spec_value(path, "model", "num_layers")
    batch = spec_value(path, "training", "global_batch_size")
    rows = []
    for what, key, base in (("layers", "model.num_layers", layers),
                            ("global batch", "training.global_batch_size", batch)):
        for k in (1, 2, 4):
            t, m, mb = compile_once(args.mtc, path, [f"{key}={base * k}"], args.repeat)
            rows.append((what, base * k, t, m, mb))
    lines = [f"| {os.path.basename(path)[:-5]}: scaled | value | median wall (s) "
             "| peak memory (MiB) | plan.bin (MB) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {w} | {v:,} | {t:.2f} | {m:,.0f} | {mb:.1f} |" for w, v, t, m, mb in rows]
    table = "\n".join(lines)
    print(table)
    if args.record:
        record(args, table, f"`bench/compile_time.py --scaling {os.path.relpath(path, ROOT)} "
                            f"--repeat {args.repeat}`")
    return 0


def record(args, table, how):
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    header = (f"\n## {datetime.date.today().isoformat()} - {cpu_name()}, "
              f"{os.cpu_count()} cores - commit {commit}\n\n"
              f"{how}; whole `mtc compile SPEC -o plan.bin` process, start-up included.\n\n")
    out = os.path.join(ROOT, "bench", "results", "compile-time.md")
    new = not os.path.exists(out)
    with open(out, "a") as f:
        if new:
            f.write("# mtc compile time per preset\n")
        f.write(header + table + "\n")
    print(f"recorded in {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mtc", default=os.path.join(ROOT, "build", "bin", "mtc"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", default="", help="compile only the specs whose name matches")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--scaling", default="", metavar="SPEC",
                    help="compile SPEC at 1, 2 and 4 times its layers and its micro-batches")
    args = ap.parse_args()
    if args.scaling:
        return scaling(args)

    specs = []
    for folder in ("models", os.path.join("bench", "specs")):
        specs += sorted((f, os.path.join(ROOT, folder, f))
                        for f in os.listdir(os.path.join(ROOT, folder)) if f.endswith(".toml"))
    if args.only:
        specs = [(n, p) for n, p in specs if re.search(args.only, n[:-5])]
    rows = []
    for name, path in specs:
        report = json.loads(subprocess.run([args.mtc, "compile", path, "--report=json"],
                                           check=True, capture_output=True, text=True).stdout)
        t, m, mb = compile_once(args.mtc, path, [], args.repeat)
        rows.append((name[:-5], report["forward_ops"], report["parameters"]["total"], t, m, mb))

    lines = ["| preset | forward ops | parameters | median wall (s) | peak memory (MiB) "
             "| plan.bin (MB) |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {n} | {ops} | {p:,} | {t:.2f} | {m:,.0f} | {mb:.1f} |"
              for n, ops, p, t, m, mb in rows]
    table = "\n".join(lines)
    print(table)

    if args.record:
        record(args, table, f"`bench/compile_time.py --repeat {args.repeat}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
