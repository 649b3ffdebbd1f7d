#!/usr/bin/env python3
"""Checks mtrun's output line by line against the lines Megatron-Core 0.16
prints (megatron/training/training.py training_log, megatron/core/timers.py
Timers.log, megatron/training/utils.py report_memory): every field is
parsed, formatted again with Megatron's own format spec and must give the
same text, in Megatron's order.

usage: check_megatron_log.py OUT [--throughput] [--params-norm] [--num-zeros]
           [--timing-level N] [--timing-option max|minmax|all] [--ranks N]

Prints one summary line per kind of line it checked; exits 1 naming the
first line and field that differ.
"""
import re
import sys

args = sys.argv[2:]
flag = lambda name: name in args
value = lambda name, default: args[args.index(name) + 1] if name in args else default
throughput, params_norm, num_zeros = flag("--throughput"), flag("--params-norm"), flag("--num-zeros")
level = int(value("--timing-level", "0"))
option = value("--timing-option", "minmax")
ranks = int(value("--ranks", "1"))


def fail(n, line, why):
    sys.exit(f"line {n}: {why}\n  {line}")


# training_log's fields, in its order: (name, format, optional).
FIELDS = [
    ("iteration", None, False),
    ("consumed samples", "{:12d}", False),
    ("elapsed time per iteration (ms)", "{:.1f}", False),
    ("throughput per GPU (TFLOP/s/GPU)", "{:.1f}", not throughput),
    ("learning rate", "{:.6E}", False),
    ("global batch size", "{:5d}", False),
    ("lm loss", "{:.6E}", True),
    ("loss scale", "{:.1f}", False),
    ("grad norm", "{:.3f}", True),
    ("num zeros", "{}", True),
    ("params norm", "{:.3f}", not params_norm),
    ("number of skipped iterations", "{:3d}", False),
    ("number of nan iterations", "{:3d}", False),
]
# Timers.log's names at each level, in training_log's order.
LEVEL1 = ["forward-backward", "layernorm-grads-all-reduce", "embedding-grads-all-reduce",
          "all-grads-sync", "params-all-gather", "optimizer-copy-to-main-grad",
          "optimizer-unscale-and-check-inf", "optimizer-clip-main-grad", "optimizer-count-zeros",
          "optimizer-inner-step", "optimizer-copy-main-to-model-params", "optimizer"]
LEVEL2 = ["batch-generator", "forward-compute", "backward-compute", "forward-recv",
          "forward-send", "backward-recv", "backward-send", "forward-send-forward-recv",
          "forward-send-backward-recv", "backward-send-forward-recv",
          "backward-send-backward-recv", "forward-backward-send-forward-backward-recv"]
# The ones mt measures (the others have no phase of their own in mt).
MT_TIMERS = {1: ["forward-backward", "optimizer-clip-main-grad", "optimizer-count-zeros",
                 "optimizer-inner-step", "optimizer"],
             2: ["batch-generator"]}


def number(text, fmt):
    if fmt.endswith("d}"):
        return int(text)
    return float(text)


def check_iteration(n, line):
    m = re.fullmatch(r" \[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6})\](.*)", line)
    if not m:
        fail(n, line, "no Megatron timestamp (%Y-%m-%d %H:%M:%S.%f)")
    parts = m.group(2).split(" |")
    if parts[-1] != "":
        fail(n, line, "the line does not end with ' |'")
    parts = parts[:-1]
    names = []
    for part in parts:
        if part.startswith(" iteration "):
            it = re.fullmatch(r" iteration ( *\d+)/( *\d+)", part)
            if not it or "{:8d}/{:8d}".format(int(it.group(1)), int(it.group(2))) != \
                    it.group(1) + "/" + it.group(2):
                fail(n, line, f"iteration field {part!r} is not ' iteration {{:8d}}/{{:8d}}'")
            names.append("iteration")
            continue
        name, sep, text = part[1:].partition(": ")
        spec = dict((f[0], f[1]) for f in FIELDS).get(name)
        if not sep or spec is None:
            fail(n, line, f"field {part!r} is not one of Megatron's")
        if name == "num zeros":
            # f'{num_zeros_in_grad}' of a Python float (an f32 tensor's item()).
            if repr(float(text)) != text:
                fail(n, line, f"num zeros {text!r} is not a Python float's repr")
        elif spec.format(number(text, spec)) != text:
            fail(n, line, f"{name} {text!r} is not {spec}")
        names.append(name)
    # Order and presence.
    order = [f[0] for f in FIELDS]
    if names != sorted(names, key=order.index):
        fail(n, line, f"fields out of Megatron's order: {names}")
    for name, _, optional in FIELDS:
        if not optional and name not in names:
            fail(n, line, f"missing field {name!r}")
    if num_zeros and "grad norm" in names and "num zeros" not in names:
        fail(n, line, "num zeros missing on an iteration that was not skipped")
    if not num_zeros and "num zeros" in names:
        fail(n, line, "num zeros without --log-num-zeros-in-grad")
    if "num zeros" in names and "grad norm" not in names:
        fail(n, line, "num zeros on a skipped iteration (Megatron has None there)")
    return int(re.search(r"iteration +(\d+)/", line).group(1))


def check_timers(n, lines):
    header = {"max": "max time across ranks (ms):",
              "minmax": "(min, max) time across ranks (ms):",
              "all": "times across ranks (ms):"}[option]
    if lines[0] != header:
        fail(n, lines[0], f"timers header is not {header!r}")
    names, i = [], 1
    while i < len(lines):
        line = lines[i]
        if option == "all":
            m = re.fullmatch(r"  (\S+):", line)
            if not m:
                break
            names.append(m.group(1))
            i += 1
            seen = 0
            while i < len(lines) and (r := re.fullmatch(r"     rank +(\d+): (\S+)", lines[i])):
                rank, t = int(r.group(1)), float(r.group(2))
                if "\n     rank {:2d}: {:.2f}".format(rank, t) != "\n" + lines[i]:
                    fail(n + i, lines[i], "not '     rank {:2d}: {:.2f}'")
                seen += 1
                i += 1
            if seen != ranks:
                fail(n + i, line, f"{seen} ranks timed, expected {ranks}")
            continue
        m = re.fullmatch(r"    (\S+) \.*: (.*)", line)
        if not m:
            break
        name = m.group(1)
        if option == "max":
            t = float(m.group(2))
            want = "    {}: {:.2f}".format((name + " ").ljust(48, "."), t)
        else:
            lo, hi = (float(x) for x in re.fullmatch(r"\((\S+), (\S+)\)", m.group(2)).groups())
            want = "    {}: ({:.2f}, {:.2f})".format((name + " ").ljust(48, "."), lo, hi)
            if lo > hi:
                fail(n + i, line, "min above max")
        if want != line:
            fail(n + i, line, f"timer line is not Megatron's: expected {want!r}")
        names.append(name)
        i += 1
    megatron = LEVEL1 + LEVEL2
    for name in names:
        if name not in megatron[:len(LEVEL1) + (len(LEVEL2) if level >= 2 else 0)]:
            fail(n, name, f"timer {name!r} is not one of Megatron's level-{level} timers")
    if names != sorted(names, key=megatron.index):
        fail(n, lines[0], f"timers out of Megatron's order: {names}")
    want = [t for lv in range(1, level + 1) for t in MT_TIMERS[lv]
            if t != "optimizer-count-zeros" or num_zeros]
    if names != want:
        fail(n, lines[0], f"timers {names}, expected {want}")
    return i


def check_memory(n, line):
    m = re.fullmatch(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\)"
                     r" \| allocated: (\S+) \| max allocated: (\S+) \| reserved: (\S+)"
                     r" \| max reserved: (\S+)", line)
    if not m:
        fail(n, line, "not report_memory's line")
    figures = [float(x) for x in m.groups()[2:]]
    for text, x in zip(m.groups()[2:], figures):
        if "{:.2f}".format(x) != text:
            fail(n, line, f"{text!r} is not {{:.2f}}")
    allocated, max_allocated, reserved, max_reserved = figures
    if not (0 < allocated <= max_allocated <= reserved <= max_reserved):
        fail(n, line, "expected 0 < allocated <= max allocated <= reserved <= max reserved")
    return int(m.group(1)), int(m.group(2))


lines = open(sys.argv[1]).read().split("\n")
iterations, memory, timer_blocks = [], [], 0
# report_memory's lines come from other processes too, so they may land
# anywhere between the printing rank's lines: they are checked apart.
for n, line in enumerate(lines):
    if line.startswith("[Rank "):
        memory.append(check_memory(n + 1, line))
lines = [line for line in lines if not line.startswith("[Rank ")]
n = 0
while n < len(lines):
    line = lines[n]
    if re.match(r" \[\d{4}-", line) and " iteration " in line:
        iterations.append(check_iteration(n + 1, line))
        if level > 0:
            n += 1 + check_timers(n + 2, lines[n + 1:])
            timer_blocks += 1
            continue
    elif "time across ranks" in line or line == "times across ranks (ms):":
        fail(n + 1, line, "a timers block that follows no iteration line"
             if level else "a timers block with --timing-log-level 0")
    n += 1
if not iterations:
    sys.exit("no iteration line")
print(f"{len(iterations)} iteration lines match Megatron's: iterations {iterations}")
if level > 0:
    print(f"{timer_blocks} timers blocks ({option}) match Megatron's")
if memory:
    print("memory lines: " + ", ".join(f"rank {r} after {k}" for r, k in memory))
