#!/usr/bin/env python3
"""Checks the router losses of mtrun's iteration lines (and TensorBoard).

usage: check_router_losses.py LOG [--tb DIR] [--zero TAG...] NAME=RATIO...

Every iteration line must carry exactly the NAMEs, in the order given,
after "lm loss" and before "loss scale", each RATIO times the line's lm
loss (RATIO "any": present and above 0). With --tb DIR, the event files
must hold each NAME at every logged iteration with the line's value, and
each --zero TAG at those iterations with 0 (a name Megatron tracks but
never prints, its average being 0).
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_tfevents  # noqa: E402

ROUTER = ("load_balancing_loss", "seq_load_balancing_loss", "z_loss")


def main():
    args = sys.argv[1:]
    log, tb, zero, want = args[0], None, [], []
    rest = args[1:]
    while rest:
        if rest[0] == "--tb":
            tb, rest = rest[1], rest[2:]
        elif rest[0] == "--zero":
            zero.append(rest[1])
            rest = rest[2:]
        else:
            name, ratio = rest[0].split("=")
            want.append((name, None if ratio == "any" else float(ratio)))
            rest = rest[1:]
    lines = {}
    for line in open(log):
        m = re.search(r"iteration\s+(\d+)/", line)
        if not m:
            continue
        fields = re.findall(r" ([a-z_ ]+): ([^|]+) \|", line)
        keys = [k for k, _ in fields]
        loss = float(dict(fields)["lm loss"])
        router = [(k, float(v)) for k, v in fields if k in ROUTER]
        at = keys.index("lm loss")
        if [k for k, _ in router] != [n for n, _ in want]:
            sys.exit(f"iteration {m.group(1)}: router losses {router}, expected {want}")
        if router and (keys[at + 1:at + 1 + len(router)] != [k for k, _ in router] or
                       keys[at + 1 + len(router)] != "loss scale"):
            sys.exit(f"iteration {m.group(1)}: the router losses are not between lm loss and "
                     f"loss scale: {keys}")
        for (name, v), (_, ratio) in zip(router, want):
            if not v > 0 or (ratio is not None and abs(v - ratio * loss) > 2e-6 * ratio * loss):
                sys.exit(f"iteration {m.group(1)}: {name} {v}, lm loss {loss}, expected ratio "
                         f"{ratio}")
        lines[int(m.group(1))] = dict(router)
    if not lines:
        sys.exit("no iteration lines")
    print(f"{len(lines)} iteration lines: " + ", ".join(
        f"{n} > 0" if r is None else f"{n} = {r:g} x lm loss" for n, r in want))
    if tb is None:
        return
    got = check_tfevents.scalars(tb)
    for name, _ in want:
        points = {s: v for s, v in got.get(name, [])}
        for it, router in lines.items():
            if it not in points or not check_tfevents.close(points[it], router[name], 1e-6):
                sys.exit(f"TensorBoard '{name}' at step {it}: {points.get(it)}, the log "
                         f"{router[name]}")
        print(f"tensorboard {name}: steps {sorted(points)}")
    for name in zero:
        points = {s: v for s, v in got.get(name, [])}
        if sorted(points) != sorted(lines) or any(v != 0 for v in points.values()):
            sys.exit(f"TensorBoard '{name}': {sorted(points.items())}, expected 0 at "
                     f"{sorted(lines)}")
        print(f"tensorboard {name}: 0 at steps {sorted(points)}")


if __name__ == "__main__":
    main()
