#!/usr/bin/env python3
"""Checks that the rooms of runtime/ and compiler/ depend only downward
(runtime/README.md, compiler/README.md): every `#include "runtime/ROOM/..."`
in a runtime room names a room it may use, and so does every
`#include "compiler/ROOM/..."` in a compiler room; nothing in runtime/
includes the compiler's folders, MLIR or LLVM.

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
# The compiler's rooms (the driver, compiler/*.cpp, may use them all).
COMPILER_MAY_USE = {
    "import": set(),
    "cuda": set(),
    "report": set(),
    "plan": {"cuda", "report"},
}
FORBIDDEN = re.compile(r'#\s*include\s*[<"](compiler|passes|spec|dialects|mlir|llvm)/')
INCLUDE = re.compile(r'#\s*include\s*"runtime/([^"]+)/[^/"]+"')
COMPILER_INCLUDE = re.compile(r'#\s*include\s*"compiler/([^"/]+)/[^/"]+"')


def room_of(path, rooms=MAY_USE):
    """The deepest room a path lies in ('' for the folder itself)."""
    d = os.path.dirname(path)
    return max((r for r in rooms if d == r or d.startswith(r + "/")), key=len, default="")


def check_compiler(root, bad):
    """Includes between the compiler's rooms; returns how many it checked."""
    checked = 0
    compiler = os.path.join(root, "compiler")
    for dirpath, _, files in os.walk(compiler):
        for f in sorted(files):
            if not f.endswith((".h", ".cpp")):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), compiler)
            room = room_of(rel, COMPILER_MAY_USE)
            with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    m = COMPILER_INCLUDE.search(line)
                    if not m or not room:
                        continue
                    checked += 1
                    target = m.group(1)
                    if target != room and target not in COMPILER_MAY_USE[room]:
                        allowed = ", ".join(sorted(COMPILER_MAY_USE[room])) or "no other room"
                        bad.append(f"compiler/{rel}:{n}: {line.strip()}: {room}/ may use {allowed}, "
                                   f"not {target}/ (compiler/README.md)")
    return checked


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
    compiler_checked = check_compiler(root, bad)
    for b in bad:
        print("check_layers.py: " + b)
    if bad:
        sys.exit(1)
    print(f"check_layers.py: {checked} includes between runtime rooms and {compiler_checked} "
          "between compiler rooms, all downward")


if __name__ == "__main__":
    main()
