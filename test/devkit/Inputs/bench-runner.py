#!/usr/bin/env python3
"""Stands in for bench/gpu_train_speed.py and bench/pytorch_gpt_reference.py
in device-kit.test: writes a made-up result to --json, but for PyTorch's run
of gpt-1.3b, which kills the kit as the device tool's time-out would."""
import json
import os
import signal
import sys


def kill_kit():
    """Kills gpu_compare.py and the kit's shells above this process at once."""
    pid, kit = os.getppid(), []
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
        if b"gpu_compare.py" not in cmd and b"device-kit.sh" not in cmd:
            break
        kit.append(pid)
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    # Outermost first: a shell whose child died first could print and move
    # on before its own kill arrives (a race a loaded machine loses).
    for p in reversed(kit):
        os.kill(p, signal.SIGKILL)


args = sys.argv
spec = args[args.index("--spec") + 1]
pytorch = os.path.basename(args[0]) == "pytorch_gpt_reference.py"
big = "1.3b" in spec
if pytorch and big:
    kill_kit()
    sys.exit(1)

seq, micro, batch = (2048, 2, 64) if big else (1024, 4, 128)
if "--micro-batch" in args:  # gpu_compare.py's gpt-125m-fill
    micro = int(args[args.index("--micro-batch") + 1])
    batch = int(args[args.index("--global-batch") + 1])
step_ms = (2000.0 if big else 200.0) * (1.3 if pytorch else 1.0)
result = {
    "spec": spec, "seq": seq, "micro_batch": micro, "global_batch": batch, "iters": 20,
    "step_ms": step_ms, "tokens_per_s": batch * seq / (step_ms / 1e3),
    "tflops": 500.0, "mfu": 0.5, "peak_memory": 20 * 2**30, "plan_memory": 20.2 * 2**30,
    "plan_context_reserve": 0.75 * 2**30, "memory_source": "the mtrun process",
    "commands": ["mtc compile " + spec + " -o PLAN", "mtrun PLAN --device cuda"], "torch": "2.9.0",
}
with open(args[args.index("--json") + 1], "w") as f:
    json.dump(result, f)
