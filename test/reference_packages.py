#!/usr/bin/env python3
"""The reference packages of test/reference-packages.txt: what they are, and
which of them a python can import. Used by test/lit.cfg.py (lit features),
test/run_tests.py (why a test did not run) and setup.sh (--full's check).

usage: reference_packages.py check PYTHON
    exits 1, naming each package PYTHON cannot import and why
"""
import json
import os
import re
import subprocess
import sys

LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference-packages.txt")
INSTALL = "./setup.sh test --full"   # what installs them


class Package:
    def __init__(self, pin, feature, module):
        self.pin = pin
        self.name = re.split(r"[=<>~!\[ ]", pin, maxsplit=1)[0]
        self.feature = feature
        self.module = module


def packages(path=LIST):
    """The packages, in the file's order."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            pin, _, meta = line.partition("#")
            fields = dict(kv.split("=", 1) for kv in meta.split() if "=" in kv)
            if not pin.strip() or "feature" not in fields or "import" not in fields:
                raise ValueError(f"{path}:{n}: expected 'PIN  # feature=NAME import=MODULE', got '{line}'")
            out.append(Package(pin.strip(), fields["feature"], fields["import"]))
    return out


# Runs in the probed python: one process imports every module (torch's import
# alone takes seconds), each failure kept with its last line.
_PROBE = r"""
import importlib, json, sys, warnings
warnings.filterwarnings("ignore")
out = {}
for module in sys.argv[1:]:
    try:
        importlib.import_module(module)
        out[module] = None
    except BaseException as e:
        out[module] = (type(e).__name__ + ": " + str(e)).strip().splitlines()[-1][:200]
print("MT-PROBE " + json.dumps(out))
"""


def probe(python, pkgs=None):
    """{feature: None if `python` imports its module, else why not}."""
    pkgs = packages() if pkgs is None else pkgs
    try:
        r = subprocess.run([python, "-c", _PROBE] + [p.module for p in pkgs],
                           capture_output=True, text=True, timeout=300)
        line = next(l for l in r.stdout.splitlines() if l.startswith("MT-PROBE "))
        got = json.loads(line[len("MT-PROBE "):])
    except (OSError, subprocess.SubprocessError, StopIteration, ValueError) as e:
        return {p.feature: f"{python} could not run the probe ({e})" for p in pkgs}
    return {p.feature: got.get(p.module, "not probed") for p in pkgs}


def main(argv):
    if len(argv) != 3 or argv[1] != "check":
        sys.exit(__doc__.strip())
    python = argv[2]
    pkgs = packages()
    found = probe(python, pkgs)
    missing = [(p, found[p.feature]) for p in pkgs if found[p.feature]]
    for p, why in missing:
        print(f"reference_packages.py: error: {python} cannot import {p.module} ({p.pin}): {why}",
              file=sys.stderr)
    if missing:
        sys.exit(1)
    print(f"reference packages: all {len(pkgs)} importable by {python}")


if __name__ == "__main__":
    main(sys.argv)
