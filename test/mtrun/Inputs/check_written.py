"""Checks that a run wrote files only under the paths its block names.

  check_written.py snapshot ROOT > BEFORE    every file under ROOT
  check_written.py check ROOT BEFORE OUT     every file under ROOT not in
      BEFORE lies under a path of the paths block in OUT (mtrun's stdout)
"""
import os
import sys


def files(root):
    out = set()
    for d, _, names in os.walk(root):
        for n in names:
            out.add(os.path.realpath(os.path.join(d, n)))
    return out


def block(out_path):
    paths, inside = [], False
    for line in open(out_path):
        line = line.rstrip("\n")
        if line.startswith("------------------------ paths"):
            inside = True
        elif line.startswith("-------------------- end of paths"):
            return paths
        elif inside:
            value = line.split(" ", 4)[-1]
            paths += [v for v in value.split(" ") if v.startswith("/")]
    sys.exit(f"{out_path}: no paths block")


def main():
    if sys.argv[1] == "snapshot":
        print("\n".join(sorted(files(sys.argv[2]))))
        return
    root, before, out = sys.argv[2:5]
    old = set(open(before).read().split())
    roots = [os.path.realpath(p) for p in block(out)]
    new = sorted(files(root) - old)
    if not new:
        sys.exit("the run wrote no file")
    bad = [f for f in new if not any(f == r or f.startswith(r + "/") for r in roots)]
    if bad:
        sys.exit("written outside the printed paths: " + ", ".join(bad))
    print(f"{len(new)} files written, all under the printed paths")


if __name__ == "__main__":
    main()
