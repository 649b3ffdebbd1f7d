"""Checks an mtrun --power-log CSV (runtime/train/power_log.h) and prints a
summary for FileCheck: the header, every iteration's marks in order, and
whether the samples' readings are those of test/mtrun/Inputs/nvml_stub.c.

usage: check_power_log.py CSV ITERATIONS [--no-power] [--temperature C]
                          [--tensorboard DIR]
"""
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from check_tfevents import scalars  # noqa: E402

FIELDS = ["power_w", "sm_clock_mhz", "mem_clock_mhz", "temperature_c",
          "gpu_util_pct", "mem_util_pct", "memory_used_mib"]


def main():
    path, iterations = sys.argv[1], int(sys.argv[2])
    no_power = "--no-power" in sys.argv
    temperature = sys.argv[sys.argv.index("--temperature") + 1] if "--temperature" in sys.argv else "40"
    board = sys.argv[sys.argv.index("--tensorboard") + 1] if "--tensorboard" in sys.argv else None
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    print("header:", ",".join(rows[0]))
    rows = [dict(zip(rows[0], r)) for r in rows[1:]]
    times = [float(r["time_s"]) for r in rows]
    assert times == sorted(times), "rows are not in time order"
    marks = [(int(r["iteration"]), r["phase"]) for r in rows if r["kind"] == "mark"]
    for r in rows:
        if r["kind"] == "mark":
            assert all(r[k] == "" for k in FIELDS), f"a mark with readings: {r}"
    print("first mark:", marks[0])
    for it in range(1, iterations + 1):
        print(f"iteration {it}:", " ".join(p for i, p in marks if i == it))
    samples = [r for r in rows if r["kind"] == "sample"]
    assert samples, "no samples"
    powers = set()
    for r in samples:
        if no_power:
            assert r["power_w"] == "", f"power where NVML has none: {r}"
        else:
            p = float(r["power_w"])
            assert 300 <= p < 400 and p == int(p), f"not the stub's power: {r}"
            powers.add(p)
        assert (r["sm_clock_mhz"], r["mem_clock_mhz"], r["temperature_c"], r["gpu_util_pct"],
                r["mem_util_pct"], r["memory_used_mib"]) == ("1980", "2619", temperature, "97", "41",
                                                             "10240.0"), f"not the stub's: {r}"
    # Each sample carries the phase in progress: the last mark before it.
    current = None
    for r in rows:
        if r["kind"] == "mark":
            current = (r["iteration"], r["phase"])
        else:
            assert (r["iteration"], r["phase"]) == current, f"a sample off its phase: {r}"
    print("samples: stub readings" + (", power climbing" if len(powers) > 1 else ""))
    if board:
        s = scalars(board)
        # The stub's figures: every mean is its fixed reading, power's mean
        # and maximum lie in its climb.
        fixed = {"gpu-sm-clock-mhz": 1980, "gpu-memory-clock-mhz": 2619,
                 "gpu-temperature-celsius": 40, "gpu-utilization-percent": 97,
                 "gpu-memory-utilization-percent": 41, "gpu-memory-used-mib": 10240}
        for tag in sorted(t for t in s if t.startswith("gpu-")):
            steps = [st for st, _ in s[tag]]
            assert steps == sorted(set(steps)) and 1 <= steps[0] and steps[-1] <= iterations, steps
            for _, v in s[tag]:
                if tag in fixed:
                    assert abs(v - fixed[tag]) < 1e-3, (tag, v)
                else:
                    assert 300 <= v < 400, (tag, v)
            print(f"{tag}: the stub's")


if __name__ == "__main__":
    main()
