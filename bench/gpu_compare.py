#!/usr/bin/env python3
"""mt against the PyTorch reference on one GPU: speed, MFU and memory, one table.

Usage: bench/gpu_compare.py [--only gpt-125m|gpt-125m-fill|gpt-1.3b ...] [--iters 20] [--warmup 5]
         [--no-compile] [--peak-tflops T] [--mtc build/bin/mtc] [--mtrun build/bin/mtrun]
         [--timeout S] [--budget S] [--record [--results FILE]]
         [--device cpu --set SECTION.KEY=VALUE ...]

For each case, on the same GPU in this one invocation, runs
bench/gpu_train_speed.py (mtrun --device cuda) and then
bench/pytorch_gpt_reference.py with the same spec and overrides, each in its
own process, and prints one table with both and their ratio, then the
project's targets, met or missed:

  gpt-125m  models/gpt-125m.toml as it is: sequence 1024, micro-batch 4,
            global batch 128 (32 micro-batches); mt >= 600K tokens/s on an
            H100 and >= 1.3x the PyTorch reference's tokens/s
  gpt-125m-fill
            models/gpt-125m.toml at the micro-batch that fills the GPU: the
            largest multiple of 8 whose plan fits the preset's H100-80GB
            (mtc's verdict; --fill-memory for another size), global batch
            two micro-batches. PyTorch runs at the same micro-batch; if it
            runs out of memory there, at half of it, and so on, and its row
            says at which it ran
  gpt-1.3b  models/gpt-1.3b.toml on one GPU (dp 1): sequence 2048,
            micro-batch 2, global batch 64 (32 micro-batches; the preset's
            512 would take ~17 s an iteration on one GPU, and the optimizer
            step is under 1% of an iteration at 64); mt >= 55% MFU
  both      mt's peak GPU memory within 2% of the plan and never above

MFU is Megatron-LM's FLOPs count (bench/flops.py) over the dense bf16 peak
(989 TFLOP/s for H100 SXM and H200, from nvidia-smi's name, or
--peak-tflops). A run that fails is shown with its error line and the
script exits 1; nothing is estimated in its place. With --record the table
is appended to bench/results/gpu-train-speed.md (or --results FILE) with the
date, GPU, driver, commit and every command that ran; the file is rewritten
after each run, so the runs that finished stay recorded when a later one is
cut off. --budget bounds the whole invocation (tools/device-kit.sh runs one
case at a time inside the device tool's 10 minutes a command).

--device cpu with --set overrides for toy sizes runs the same steps on
mtrun's CPU executor and PyTorch on the CPU, to check this script without a
GPU; its numbers say nothing about the targets.
"""
import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

from gpu_results import RESULTS, gib, read_results, section, target_lines, write_results
from machine import cpu_name, gpu_name_and_driver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")

CASES = {
    "gpt-125m": ("models/gpt-125m.toml", []),
    "gpt-125m-fill": ("models/gpt-125m.toml", None),  # micro-batch from fill_micro_batch
    "gpt-1.3b": ("models/gpt-1.3b.toml", ["--global-batch", "64"]),
}


def kill_tree(pid):
    """Kills a process and every process under it: a runner's mtrun or
    compile workers must not hold the GPU after the runner is given up on."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        children = []
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for c in children:
        kill_tree(c)


def run_json(cmd, timeout):
    """Runs one benchmark script; (result dict, None) or (None, its error line)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        proc = subprocess.Popen(cmd + ["--json", out.name], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.communicate()
            return None, f"did not finish in {timeout:.0f} s"
        if proc.returncode != 0:
            sys.stderr.write(stderr)
            lines = [l for l in (stderr + stdout).splitlines() if l.strip()]
            return None, lines[-1] if lines else f"exit status {proc.returncode}"
        return json.load(open(out.name)), None


def plan_fits(mtc, spec, sets, micro_batch):
    """mtc's verdict for the spec at this micro-batch: True, False, or the error line."""
    cmd = [mtc, "compile", spec, "--emit=summary", "--set",
           f"training.micro_batch_size={micro_batch}", "--set",
           f"training.global_batch_size={2 * micro_batch}"]
    for x in sets:
        cmd += ["--set", x]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith("verdict: fits"):
            return True
        if line.startswith("verdict:"):
            return False
    lines = [l for l in (proc.stderr + proc.stdout).splitlines() if l.strip()]
    return lines[-1] if lines else f"mtc exit status {proc.returncode}"


def fill_micro_batch(mtc, spec, sets, limit=4096):
    """The largest multiple of 8 micro-batch whose plan fits: (micro-batch, None)
    or (None, why)."""
    lo, hi = 0, None  # lo fits (0: none yet); hi does not
    mb = 8
    while hi is None:
        fits = plan_fits(mtc, spec, sets, mb)
        if isinstance(fits, str):
            return None, fits
        if not fits:
            hi = mb
        elif mb >= limit:
            return mb, None
        else:
            lo, mb = mb, mb * 2
    while hi - lo > 8:
        mid = (lo + hi) // 16 * 8
        fits = plan_fits(mtc, spec, sets, mid)
        if isinstance(fits, str):
            return None, fits
        lo, hi = (mid, hi) if fits else (lo, mid)
    if lo == 0:
        return None, "the plan does not fit even at micro-batch 8"
    return lo, None


def out_of_memory(err):
    return err and ("out of memory" in err.lower() or "OutOfMemoryError" in err)


def row(case, runner, res, err):
    if err:
        return f"| {case} | {runner} | failed: {err} ||||||||\n"
    mfu = f"{100 * res['mfu']:.1f}%" if res.get("mfu") else "-"
    plan = gib(res.get("plan_memory"))
    return (f"| {case} | {runner} | {res['seq']} | {res['micro_batch']} / {res['global_batch']} "
            f"| {res['iters']} | {res['step_ms']:.1f} | {res['tokens_per_s']:,.0f} "
            f"| {res['tflops']:.3g} | {mfu} | {gib(res.get('peak_memory'))} | {plan} |\n")


def command_line(cmd):
    """A runner's command as recorded: its script relative to the checkout."""
    return shlex.join([os.path.relpath(c, ROOT) if c.startswith(BENCH) else c for c in cmd[1:]])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", choices=list(CASES),
                    help="run only this case (repeatable; default: all)")
    ap.add_argument("--iters", type=int, default=20, help="measured iterations per run")
    ap.add_argument("--warmup", type=int, default=5, help="iterations run first, not measured")
    ap.add_argument("--no-compile", action="store_true", help="PyTorch without torch.compile")
    ap.add_argument("--peak-tflops", type=float, help="dense bf16 peak of the GPU")
    ap.add_argument("--mtc", default=os.path.join(ROOT, "build", "bin", "mtc"))
    ap.add_argument("--mtrun", default=os.path.join(ROOT, "build", "bin", "mtrun"))
    ap.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    ap.add_argument("--budget", type=float,
                    help="seconds all runs together may take; a run gets at most what is left")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--results", default=RESULTS, help="the file --record writes")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu checks this script without a GPU (with --set for toy sizes)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a spec override for both runners (repeatable)")
    ap.add_argument("--fill-memory", metavar="GiB",
                    help="gpt-125m-fill: the GPU memory its plan must fit (default: the "
                         "preset's device_memory, H100-80GB)")
    ap.add_argument("--fill-limit", type=int, default=4096,
                    help="gpt-125m-fill: the largest micro-batch tried")
    args = ap.parse_args()

    gpu = gpu_name_and_driver() if args.device == "cuda" else (cpu_name(), "")
    if gpu is None:
        sys.exit("gpu_compare: no GPU: nvidia-smi is missing or lists no GPU "
                 "(these benchmarks need one)")
    common = ["--iters", str(args.iters), "--warmup", str(args.warmup), "--device", args.device]
    common += [a for s in args.set for a in ("--set", s)]
    if args.peak_tflops:
        common += ["--peak-tflops", str(args.peak_tflops)]
    deadline = time.monotonic() + args.budget if args.budget else None

    def run(cmd):
        timeout = args.timeout
        if deadline:
            timeout = min(timeout, deadline - time.monotonic())
            if timeout < 1:
                return None, f"not started: the --budget of {args.budget:.0f} s was spent"
        return run_json(cmd, timeout)

    rows, targets, commands, failed = [], [], [], False
    earlier = read_results(args.results) if args.record else ""

    def body(pending=()):
        lines = targets + list(pending)
        return ("| case | runner | seq | micro / global batch | iterations | step (ms) | tokens / s "
                "| TFLOP/s | MFU | peak memory (GiB) | plan (GiB) |\n"
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
                + "".join(rows) + "\nmt's peak memory: nvidia-smi's figure for the mtrun process "
                "(CUDA context included), beside the plan's total with its stated context reserve. "
                "PyTorch's: torch.cuda.max_memory_allocated over the measured iterations (no "
                "context, no allocator cache).\n" + "".join(f"\n{l}" for l in lines) + "\n")

    def save(pending=()):
        # After every run: a later run cut off (a time-out) leaves these rows.
        if args.record:
            write_results(earlier + section("mt against PyTorch", body(pending), gpu[0], gpu[1],
                                            commands), args.results)

    for case in args.only or list(CASES):
        spec, extra = CASES[case]
        if extra is None:
            sets = list(args.set)
            if args.fill_memory:
                sets.append(f"cluster.device_memory={args.fill_memory}")
            print(f"{case}: finding the micro-batch that fills the GPU ...", file=sys.stderr,
                  flush=True)
            mb, why = fill_micro_batch(args.mtc, spec, sets, args.fill_limit)
            if mb is None:
                failed = True
                rows.append(row(case, "mt", None, f"no micro-batch found: {why}"))
                targets.append(f"- MISSED: {case}: no micro-batch found ({why})")
                save()
                continue
            extra = ["--micro-batch", str(mb), "--global-batch", str(2 * mb)]
            if args.fill_memory:
                extra += ["--set", f"cluster.device_memory={args.fill_memory}"]
        mt_cmd = [sys.executable, os.path.join(BENCH, "gpu_train_speed.py"), "--spec", spec,
                  *extra, *common, "--mtc", args.mtc, "--mtrun", args.mtrun]
        pt_cmd = [sys.executable, os.path.join(BENCH, "pytorch_gpt_reference.py"), "--spec", spec,
                  *extra, *common, *(["--no-compile"] if args.no_compile else [])]
        print(f"{case}: mt ...", file=sys.stderr, flush=True)
        mt, mt_err = run(mt_cmd)
        rows.append(row(case, "mt", mt, mt_err))
        if mt:
            commands += mt["commands"]
        commands.append(command_line(mt_cmd))
        save(target_lines(mt) if mt else [])
        print(f"{case}: PyTorch ...", file=sys.stderr, flush=True)
        pt, pt_err = run(pt_cmd)
        # The fill case: PyTorch at the largest micro-batch (halving) that
        # it can hold, each try recorded.
        tried = []
        while CASES[case][1] is None and out_of_memory(pt_err):
            mb = int(pt_cmd[pt_cmd.index("--micro-batch") + 1]) // 2
            if mb < 1:
                break
            tried.append(pt_cmd[pt_cmd.index("--micro-batch") + 1])
            commands.append(command_line(pt_cmd) + "  # out of memory")
            pt_cmd = list(pt_cmd)
            pt_cmd[pt_cmd.index("--micro-batch") + 1] = str(mb)
            pt_cmd[pt_cmd.index("--global-batch") + 1] = str(2 * mb)
            print(f"{case}: PyTorch out of memory; at micro-batch {mb} ...", file=sys.stderr,
                  flush=True)
            pt, pt_err = run(pt_cmd)
        failed |= bool(mt_err or pt_err)
        label = "PyTorch" + (f" {pt['torch']}" if pt else "") + (
            ", not compiled" if args.no_compile else "") + (
            f" (out of memory at micro-batch {', '.join(tried)})" if tried else "")
        rows.append(row(case, label, pt, pt_err))
        if mt and pt:
            rows.append(f"| {case} | mt / PyTorch | | | | {mt['step_ms'] / pt['step_ms']:.2f}x "
                        f"| {mt['tokens_per_s'] / pt['tokens_per_s']:.2f}x | | | | |\n")
        if mt:
            targets += target_lines(mt, pt)
        elif case.startswith("gpt-125m"):
            targets.append(f"- MISSED: gpt-125m targets: mt did not run ({mt_err})")
        elif case == "gpt-1.3b":
            targets.append(f"- MISSED: gpt-1.3b target: mt did not run ({mt_err})")
        commands.append(command_line(pt_cmd))
        save()

    print(body())
    if args.record:
        path = os.path.abspath(args.results)
        print("recorded in " + (os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep)
                                else args.results))
    if failed:
        sys.exit("gpu_compare: a run failed (its line is in the table); nothing was estimated "
                 "in its place")


if __name__ == "__main__":
    main()
