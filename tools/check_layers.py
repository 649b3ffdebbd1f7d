#!/usr/bin/env python3
"""Checks that runtime/'s rooms depend only downward (runtime/README.md):
every `#include "runtime/ROOM/..."` in a room's files names a room it may
use, and nothing in runtime/ includes the compiler's folders, MLIR or LLVM.

usage: check_layers.py [SOURCE_ROOT]     (default: this checkout)
Prints one line per violation, naming the file, the line and the include,
and exits 1; otherwise prints how many includes it checked.
"""
import os
import re
import sys

# Each room and the rooms it may include from (its own files always).
MAY_USE = {
    "base": set(),
    "plan": {"base"},
    "comm": {"base", "plan"},
    "exec/cuda": {"base"},
    "exec": {"base", "plan", "comm", "exec/cuda"},
    "data/tokenizers": set(),
    "data": {"base", "data/tokenizers"},
    "ckpt": {"base", "plan", "comm"},
    "train": {"base", "plan", "comm", "exec", "exec/cuda", "data", "data/tokenizers", "ckpt"},
}
FORBIDDEN = re.compile(r'#\s*include\s*[<"](compiler|passes|spec|dialects|mlir|llvm)/')
INCLUDE = re.compile(r'#\s*include\s*"runtime/([^"]+)/[^/"]+"')


def room_of(path):
    """The deepest room a path under runtime/ lies in ('' for runtime/ itself)."""
    d = os.path.dirname(path)
    return max((r for r in MAY_USE if d == r or d.startswith(r + "/")), key=len, default="")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    runtime = os.path.join(root, "runtime")
    bad, checked = [], 0
    for dirpath, _, files in os.walk(runtime):
        for f in sorted(files):
            if not f.endswith((".h", ".cpp")):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), runtime)
            room = room_of(rel)
            if not room:
                bad.append(f"runtime/{rel}: a source file outside every room; put it in the room of its layer")
                continue
            with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    if FORBIDDEN.search(line):
                        bad.append(f"runtime/{rel}:{n}: {line.strip()}: the runtime includes nothing of "
                                   "the compiler, MLIR or LLVM")
                    m = INCLUDE.search(line)
                    if not m:
                        continue
                    checked += 1
                    target = room_of(m.group(1) + "/x")
                    if target != room and target not in MAY_USE[room]:
                        allowed = ", ".join(sorted(MAY_USE[room])) or "no other room"
                        bad.append(f"runtime/{rel}:{n}: {line.strip()}: {room}/ may use {allowed}, "
                                   f"not {target or m.group(1)}/ (runtime/README.md)")
    for b in bad:
        print("check_layers.py: " + b)
    if bad:
        sys.exit(1)
    print(f"check_layers.py: {checked} includes between runtime rooms, all downward")


if __name__ == "__main__":
    main()
