"""The GPU benchmarks' results file and the targets they check, shared by
gpu_train_speed.py and gpu_compare.py."""
import datetime
import os
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results", "gpu-train-speed.md")

HEADER = ("# Training speed and memory on one GPU\n\n"
          "Recorded by bench/gpu_compare.py and bench/gpu_train_speed.py. Targets: "
          "gpt-125m (sequence 1024) >= 600K tokens/s on an H100 and >= 1.3x the "
          "PyTorch reference (bench/pytorch_gpt_reference.py); gpt-1.3b >= 55% MFU "
          "(Megatron-LM's FLOPs, dense bf16 peak 989 TFLOP/s); peak GPU memory "
          "within 2% of the plan and never above.\n\n")

# The targets the project states for one H100 (or H200).
TARGET_TOKENS_125M = 600_000
TARGET_RATIO_125M = 1.3
TARGET_MFU_1_3B = 0.55
TARGET_MEMORY_BAND = 0.02


def gib(b):
    return f"{b / 2**30:.2f}" if b else "-"


def target_lines(res, pytorch=None):
    """The project's targets that apply to this result, each with met / missed."""
    lines = []

    def check(ok, text):
        lines.append(f"- {'met' if ok else 'MISSED'}: {text}")

    spec = os.path.basename(res["spec"])
    if spec == "gpt-125m.toml" and res["seq"] == 1024:
        check(res["tokens_per_s"] >= TARGET_TOKENS_125M,
              f"gpt-125m >= {TARGET_TOKENS_125M:,} tokens/s on an H100: {res['tokens_per_s']:,.0f}")
        if pytorch:
            ratio = res["tokens_per_s"] / pytorch["tokens_per_s"]
            check(ratio >= TARGET_RATIO_125M,
                  f"gpt-125m >= {TARGET_RATIO_125M}x the PyTorch reference: {ratio:.2f}x")
    if spec == "gpt-1.3b.toml" and res["mfu"]:
        check(res["mfu"] >= TARGET_MFU_1_3B,
              f"gpt-1.3b >= {100 * TARGET_MFU_1_3B:.0f}% MFU: {100 * res['mfu']:.1f}%")
    if res["peak_memory"]:
        ratio = res["peak_memory"] / res["plan_memory"]
        check(1 - TARGET_MEMORY_BAND <= ratio <= 1,
              f"peak memory within {100 * TARGET_MEMORY_BAND:.0f}% of the plan and never above: "
              f"{gib(res['peak_memory'])} GiB measured ({res['memory_source']}), "
              f"{gib(res['plan_memory'])} GiB planned (of which {gib(res['plan_context_reserve'])} "
              f"GiB stated CUDA context reserve; measured beyond the planned allocations: "
              f"{gib(res['peak_memory'] - res['plan_memory'] + res['plan_context_reserve'])} GiB), "
              f"ratio {ratio:.3f}")
    return lines


def commit():
    return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()


def section(title, body, gpu, driver, commands):
    """One dated section of the results file."""
    driver_text = f", driver {driver}" if driver else ""
    return (f"## {datetime.date.today()}: {title} on {gpu}{driver_text}, commit {commit()}\n\n"
            f"{body}\nCommands:\n\n```\n" + "\n".join(commands) + "\n```\n\n")


def read_results(path=RESULTS):
    """The results file as it is, or its header where there is none yet."""
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return HEADER


def write_results(text, path=RESULTS):
    """Replaces the results file with text. Written to a temporary file and
    renamed, so a run killed meanwhile (a time-out) leaves the previous
    version whole."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".gpu-results-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def record(title, body, gpu, driver, commands, path=RESULTS):
    """Appends one dated section to the results file."""
    write_results(read_results(path) + section(title, body, gpu, driver, commands), path)
