#!/usr/bin/env python3
"""Measures mt's training speed and memory on one GPU: `mtrun --device cuda`.

Usage: bench/gpu_train_speed.py [--spec models/gpt-125m.toml] [--set SECTION.KEY=VALUE ...]
         [--seq N] [--micro-batch N] [--global-batch N] [--iters 20] [--warmup 5]
         [--peak-tflops T] [--mtc build/bin/mtc] [--mtrun build/bin/mtrun]
         [--json FILE] [--record]

Compiles the spec for one GPU (tensor, pipeline and data parallel sizes set
to 1, one log line per iteration, no evaluation; --seq, --micro-batch and
--global-batch are shorthands for the --set overrides of those keys), trains
the first --warmup + --iters iterations (mtrun --train-iters, so the spec's
learning-rate schedule is unchanged) on its data and reports, over the last
--iters iterations only:

- step time: the mean of the "elapsed time per iteration (ms)" fields of
  mtrun's Megatron-LM iteration lines;
- tokens / s: global batch x sequence length / step time;
- TFLOP/s and MFU: the iteration's model FLOPs (bench/flops.py, Megatron-LM's
  count) / step time, against --peak-tflops, by default the dense bf16 peak
  of the GPU nvidia-smi names (989 for H100 SXM and H200);
- peak memory: the most GPU memory the mtrun process used while it ran,
  polled with nvidia-smi (mtrun prints no memory figure of its own), beside
  the plan's per-GPU total from `mtc compile --report=json`
  (memory.ranks[heaviest_rank].total: weights, gradients, master weights,
  Adam moments, activation arena, workspace and the stated CUDA context
  reserve).

Targets (printed beside the results): gpt-125m at sequence 1024 >= 600K
tokens/s on an H100; gpt-1.3b >= 55% MFU; peak memory within 2% of the plan
and never above it. bench/gpu_compare.py adds the PyTorch reference and its
ratio. With --record the table is appended to bench/results/gpu-train-speed.md
with the date, GPU, driver, commit and the exact commands; --json writes the
result for gpu_compare.py.

--device cpu runs the same steps on mtrun's CPU executor, to check this
script on a machine without a GPU (no memory figure; MFU needs --peak-tflops).
"""
import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

from flops import model_flops, peak_tflops_for
from gpt_spec import ONE_GPU, load_spec, model_config
from gpu_results import gib, record, target_lines
from machine import GpuMemoryPoller, cpu_name, gpu_name_and_driver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ITERATION = re.compile(r"iteration\s+(\d+)/\s*\d+ \| consumed samples:\s+\d+ \| elapsed time per "
                       r"iteration \(ms\): ([0-9.]+) .* lm loss: ([0-9.EeNAna+-]+)")


def fail(msg):
    sys.exit(f"gpu_train_speed: {msg}")


def last_error_line(text):
    """The line of a failed tool's output that says why: its last 'error' line, else its last."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    for line in reversed(lines):
        if "error" in line.lower():
            return line
    return lines[-1] if lines else "(no output)"


def overrides(args):
    """Every --set this run passes to mtc, in order (later ones win)."""
    sets = list(ONE_GPU)
    sets += ["training.log_interval=1", "training.eval_iters=0"]
    if args.seq:
        sets.append(f"model.seq_length={args.seq}")
    if args.micro_batch:
        sets.append(f"training.micro_batch_size={args.micro_batch}")
    if args.global_batch:
        sets.append(f"training.global_batch_size={args.global_batch}")
    return sets + list(args.set)


def gpu_and_peak(device, peak_tflops):
    """(GPU name, driver, peak TFLOP/s); fails clearly without a usable GPU."""
    if device == "cpu":
        return cpu_name(), "", peak_tflops
    gpu = gpu_name_and_driver()
    if gpu is None:
        fail("no GPU: nvidia-smi is missing or lists no GPU (these benchmarks need one)")
    name, driver = gpu
    peak = peak_tflops or peak_tflops_for(name)
    if peak is None:
        fail(f"no known dense bf16 peak for '{name}'; give it with --peak-tflops")
    return name, driver, peak


def measure(args):
    """Compiles, trains and measures; returns the result as a dict."""
    sets = overrides(args)
    cfg = model_config(load_spec(args.spec, sets))
    gpu, driver, peak = gpu_and_peak(args.device, args.peak_tflops)
    set_args = [a for s in sets for a in ("--set", s)]
    with tempfile.TemporaryDirectory() as tmp:
        plan = os.path.join(tmp, "plan")
        compile_cmd = [args.mtc, "compile", args.spec, *set_args, "-o", plan, "--report=json"]
        r = subprocess.run(compile_cmd, capture_output=True, text=True)
        if r.returncode != 0:
            fail("mtc compile failed: " + last_error_line(r.stderr + r.stdout))
        report = json.loads(r.stdout)
        if report["padded_vocab_size"] != cfg.padded_vocab:
            fail(f"mtc pads the vocabulary to {report['padded_vocab_size']}, this script to "
                 f"{cfg.padded_vocab}: bench/gpt_spec.py is out of date with the spec")
        mem = report["memory"]
        rank = mem["ranks"][mem["heaviest_rank"]]

        run_cmd = [args.mtrun, plan, "--device", args.device,
                   "--train-iters", str(args.warmup + args.iters)]
        poller = GpuMemoryPoller() if args.device == "cuda" else None
        start = time.monotonic()
        proc = subprocess.Popen(run_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if poller:
            poller.start(proc.pid)
        try:
            out, err = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            fail(f"mtrun --device {args.device} did not finish in {args.timeout} s; its last "
                 f"line: {last_error_line(out)}")
        finally:
            peak_bytes = poller.stop() if poller else None
        wall = time.monotonic() - start
    if proc.returncode != 0:
        fail(f"mtrun --device {args.device} failed: {last_error_line(err + out)}")

    iters = [(int(m.group(1)), float(m.group(2)), float(m.group(3)))
             for m in map(ITERATION.search, out.splitlines()) if m]
    if len(iters) != args.warmup + args.iters:
        fail(f"expected {args.warmup + args.iters} iteration lines from mtrun, read "
             f"{len(iters)}:\n{out}")
    measured = iters[args.warmup:]
    losses = [loss for _, _, loss in iters]
    if not all(math.isfinite(l) for l in losses):
        fail(f"mtrun --device {args.device} trained non-finite losses ({losses}); its speed "
             "would not mean anything")
    step_ms = sum(ms for _, ms, _ in measured) / len(measured)
    flops = model_flops(cfg)
    tflops = flops / (step_ms / 1e3) / 1e12
    result = {
        "runner": "mt",
        "spec": rel(args.spec),
        "device": args.device, "gpu": gpu, "driver": driver,
        "seq": cfg.seq, "micro_batch": cfg.micro_batch, "global_batch": cfg.global_batch,
        "warmup": args.warmup, "iters": args.iters,
        "step_ms": step_ms,
        "step_ms_min": min(ms for _, ms, _ in measured),
        "step_ms_max": max(ms for _, ms, _ in measured),
        "tokens_per_s": cfg.global_batch * cfg.seq / (step_ms / 1e3),
        "flops_per_iter": flops, "tflops": tflops,
        "peak_tflops": peak, "mfu": tflops / peak if peak else None,
        "peak_memory": peak_bytes,
        "memory_source": poller.source if poller else None,
        "plan_memory": rank["total"], "plan_context_reserve": rank["context_reserve"],
        "first_loss": losses[0], "last_loss": losses[-1], "wall_s": wall,
        "commands": [shlex.join([rel(args.mtc), "compile", rel(args.spec), *set_args, "-o", "PLAN"]),
                     shlex.join([rel(args.mtrun), "PLAN", *run_cmd[2:]])],
    }
    if args.device == "cuda" and not peak_bytes:
        fail("nvidia-smi showed no GPU memory in use by mtrun while it ran")
    return result


def rel(path):
    """A path inside the repository relative to its root, for recorded commands."""
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def mt_table(res):
    """The result as a markdown table."""
    mfu = f"{100 * res['mfu']:.1f}%" if res["mfu"] else "-"
    ratio = f"{res['peak_memory'] / res['plan_memory']:.3f}" if res["peak_memory"] else "-"
    return (
        "| spec | seq | micro / global batch | iterations | step (ms) | tokens / s | TFLOP/s | MFU "
        "| peak memory (GiB) | plan (GiB) | measured / plan |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
        f"| {res['spec']} | {res['seq']} | {res['micro_batch']} / {res['global_batch']} "
        f"| {res['iters']} (+{res['warmup']} warm-up) | {res['step_ms']:.1f} "
        f"| {res['tokens_per_s']:,.0f} | {res['tflops']:.3g} | {mfu} "
        f"| {gib(res['peak_memory'])} | {gib(res['plan_memory'])} | {ratio} |\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=os.path.join(ROOT, "models", "gpt-125m.toml"))
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a spec key, as mtc compile --set does (repeatable)")
    ap.add_argument("--seq", type=int, help="model.seq_length")
    ap.add_argument("--micro-batch", type=int, help="training.micro_batch_size")
    ap.add_argument("--global-batch", type=int, help="training.global_batch_size")
    ap.add_argument("--iters", type=int, default=20, help="measured iterations")
    ap.add_argument("--warmup", type=int, default=5, help="iterations run first, not measured")
    ap.add_argument("--peak-tflops", type=float,
                    help="dense bf16 peak of the GPU (default: by its nvidia-smi name)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--mtc", default=os.path.join(ROOT, "build", "bin", "mtc"))
    ap.add_argument("--mtrun", default=os.path.join(ROOT, "build", "bin", "mtrun"))
    ap.add_argument("--timeout", type=float, default=1200, help="seconds mtrun may take")
    ap.add_argument("--json", help="also write the result to this file")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    if args.iters < 1 or args.warmup < 0:
        fail("--iters must be >= 1 and --warmup >= 0")
    for tool in (args.mtc, args.mtrun):
        if not os.access(tool, os.X_OK):
            fail(f"{tool} is not an executable; build mt first (README.md) or pass --mtc/--mtrun")

    res = measure(args)
    table = mt_table(res)
    targets = "\n".join(target_lines(res))
    print(table)
    if targets:
        print(targets + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    if args.record:
        record(f"mt {res['spec']}", table + "\n" + (targets + "\n" if targets else ""),
               res["gpu"], res["driver"], res["commands"])


if __name__ == "__main__":
    main()
