#!/usr/bin/env python3
"""Where the kernel time goes, from Nsight Compute's per-kernel summary.

    tools/ncu_summary.py NCU.csv [--top N]

NCU.csv is what `ncu --metrics gpu__time_duration.sum --print-summary
per-kernel --csv --log-file NCU.csv APP...` wrote (tools/device-kit.sh,
step `profile`). ncu may write lines of its own before the table
("==PROF== ..."); the header is the first row with a "Kernel Name" column,
and the rows after it with as many fields are the kernels. A kernel's total
is its mean time times its invocations; the kernels are printed largest
total first, with each one's share of the sum of all of them.
"""
import argparse
import csv
import sys

# gpu__time_duration's units as ncu spells them, in nanoseconds.
UNITS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6,
         "s": 1e9, "second": 1e9}


def number(text):
    """ncu's numbers carry thousands separators: "1,151,168.00"."""
    return float(text.replace(",", ""))


def read(path):
    """(header, rows) of the summary table; exits with one line if there is none."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    for at, row in enumerate(rows):
        if "Kernel Name" in [c.strip() for c in row]:
            header = [c.strip() for c in row]
            return header, [r for r in rows[at + 1:] if len(r) == len(header)]
    sys.exit(f"ncu_summary: {path} has no row with a 'Kernel Name' column: ncu wrote no "
             f"per-kernel summary (see the step's log for ncu's and the program's errors)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=60, help="kernels to list (default 60)")
    args = ap.parse_args()
    header, rows = read(args.csv)
    need = ["Kernel Name", "Invocations", "Metric Name", "Metric Unit", "Average"]
    missing = [c for c in need if c not in header]
    if missing:
        sys.exit(f"ncu_summary: {args.csv}: the summary has no column {', '.join(missing)} "
                 f"(its header: {', '.join(header)})")
    col = {c: header.index(c) for c in header}
    kernels = []
    for r in rows:
        if r[col["Metric Name"]] != "gpu__time_duration.sum":
            continue
        unit = r[col["Metric Unit"]]
        if unit not in UNITS:
            sys.exit(f"ncu_summary: {args.csv}: unknown time unit '{unit}' for "
                     f"{r[col['Kernel Name']]}")
        mean_ns = number(r[col["Average"]]) * UNITS[unit]
        calls = int(number(r[col["Invocations"]]))
        shape = ""
        if "Block Size" in col and "Grid Size" in col:
            shape = f"block {r[col['Block Size']]} grid {r[col['Grid Size']]}"
        kernels.append((mean_ns * calls, calls, mean_ns, r[col["Kernel Name"]], shape))
    if not kernels:
        sys.exit(f"ncu_summary: {args.csv}: no gpu__time_duration.sum rows")
    kernels.sort(key=lambda k: -k[0])
    total = sum(k[0] for k in kernels)
    print(f"{len(kernels)} kernels, {total / 1e6:.3f} ms of kernel time in all; "
          f"largest total first")
    print(f"{'share':>7} {'total (ms)':>11} {'calls':>6} {'mean (us)':>10}  kernel")
    for t, calls, mean, name, shape in kernels[:args.top]:
        print(f"{100 * t / total:6.1f}% {t / 1e6:11.3f} {calls:6d} {mean / 1e3:10.1f}  {name}"
              + (f"  ({shape})" if shape else ""))
    if len(kernels) > args.top:
        rest = sum(k[0] for k in kernels[args.top:])
        print(f"{100 * rest / total:6.1f}% {rest / 1e6:11.3f}   (the other {len(kernels) - args.top})")


if __name__ == "__main__":
    main()
