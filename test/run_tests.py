#!/usr/bin/env python3
"""Runs the test suite (lit over test/, GoogleTest binaries included), then
prints one line: how many tests did not run, and why.

usage: run_tests.py LIT_PY TEST_DIR [LIT_ARGS...]

With MT_REQUIRE_REFERENCE=1 (set by `./setup.sh test --full`, so in CI) a
test that did not run because a reference package
(test/reference-packages.txt) is missing fails the run: those tests compare
mt with the real thing and must not rot unseen.
"""
import collections
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_packages  # noqa: E402

# Why a lit feature can be missing, in words.
FEATURES = {
    "gpt2-data": "GPT-2's vocab.json and merges.txt (../shared/data/gpt2)",
    "slurm": "root and the SLURM and munge daemons",
    "cuda-driver": "a GPU driver",
    "cuda-2gpus": "two GPUs",
    "cuda-stub": "the CUDA toolkit's stub driver",
    "nvrtc": "NVRTC (the CUDA toolkit)",
}


def need(features, pkgs):
    """Words for what a test needs: the other things, then the reference
    packages with how to get them."""
    names = {p.feature: p.name for p in pkgs}
    words = [FEATURES.get(f, f"the lit feature '{f}'") for f in features if f not in names]
    packages = [names[f] for f in features if f in names]
    if packages:
        words.append(f"{', '.join(packages)} ({reference_packages.INSTALL} installs "
                     f"{'them' if len(packages) > 1 else 'it'})")
    return "need " + " and ".join(words)


def gtest_reasons(binary_dir, skipped):
    """The first line of each skipped case's message (binary, Suite.Case), from
    running each binary once more on its skipped cases only."""
    found = {}
    by_binary = collections.defaultdict(list)
    for binary, case in skipped:
        by_binary[binary].append(case)
    for binary, cases in by_binary.items():
        try:
            r = subprocess.run([os.path.join(binary_dir, binary), "--gtest_filter=" + ":".join(cases)],
                               capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError):
            continue
        # "[ RUN      ] S.C", "file:line: Skipped", the message, "[  SKIPPED ] S.C"
        for m in re.finditer(r"^\[ RUN +\] (\S+)\n(.*?)^\[  SKIPPED \] \1", r.stdout, re.M | re.S):
            lines = m.group(2).splitlines()
            i = next((k for k, l in enumerate(lines) if l.endswith(": Skipped")), None)
            if i is not None and i + 1 < len(lines) and lines[i + 1].strip():
                found[(binary, m.group(1))] = lines[i + 1].strip()
    return [found.get(key, "no reason given") for key in skipped]


def reason_key(message):
    """What groups skip messages: the words before the details."""
    return re.split(r":|\s\(|;", message, maxsplit=1)[0].strip()


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__.strip())
    lit_py, test_dir, lit_args = argv[1], argv[2], argv[3:]
    # lit's JSON report has each unsupported test's reason; only its xunit
    # report lists the GoogleTest cases that skipped themselves.
    report, xml = os.path.join(test_dir, "results.json"), os.path.join(test_dir, "results.xml")
    for f in (report, xml):
        if os.path.exists(f):
            os.remove(f)
    rc = subprocess.call([sys.executable, lit_py] + lit_args + ["-o", report, "--xunit-xml-output", xml, test_dir])
    if not (os.path.exists(report) and os.path.exists(xml)):
        return rc or 1

    pkgs = reference_packages.packages()
    reference = {p.feature for p in pkgs}
    reasons = collections.Counter()
    missing_reference = []   # (test, [reference features it lacked])
    counts = collections.Counter()
    with open(report, encoding="utf-8") as f:
        tests = sorted(json.load(f)["tests"], key=lambda t: t["name"])
    for t in tests:
        if t["code"] != "UNSUPPORTED":
            continue
        counts["unsupported"] += 1
        test = t["name"].split(" :: ", 1)[-1]
        m = re.search(r"requires the following unavailable features: (.*)", t["output"])
        if m:
            features = [f.strip() for f in m.group(1).split(",")]
            reasons[need(features, pkgs)] += 1
            if any(f in reference for f in features):
                missing_reference.append((test, [f for f in features if f in reference]))
            continue
        m = re.search(r"does not support the following features and/or targets: (.*)", t["output"])
        features = [f.strip() for f in m.group(1).split(",")] if m else []
        reasons["run only without " + (" or ".join(FEATURES.get(f, f) for f in features)
                                       or "this configuration")] += 1

    skipped_gtests = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        skip = case.find("skipped")
        classname = case.get("classname")
        if (skip is None or not classname.startswith("mt-unit.")
                or skip.get("message", "").startswith("Test not selected")):
            continue
        # "mt-unit._/BINARY/SUITE" (lit writes the path "./BINARY", '.' as '_')
        parts = classname[len("mt-unit."):].split("/")
        if parts[0] == "_":
            parts = parts[1:]
        skipped_gtests.append((parts[0], "/".join(parts[1:]) + "." + case.get("name")))
    counts["skipped"] = len(skipped_gtests)
    for msg in gtest_reasons(os.path.join(test_dir, "unit"), skipped_gtests):
        reasons[reason_key(msg)] += 1
    total = counts["skipped"] + counts["unsupported"]
    if total:
        parts = "; ".join(f"{n} {why}" for why, n in reasons.most_common())
        print(f"tests that did not run: {total} ({counts['skipped']} skipped, "
              f"{counts['unsupported']} unsupported): {parts}", flush=True)
    else:
        print("tests that did not run: none", flush=True)

    if os.environ.get("MT_REQUIRE_REFERENCE") == "1" and missing_reference:
        names = {p.feature: p.name for p in pkgs}
        for test, features in missing_reference:
            print(f"run_tests.py: error: {test} did not run: lit's %python cannot import "
                  f"{', '.join(names[f] for f in features)}; with --full every compatibility test "
                  f"must run ({reference_packages.INSTALL} installs the packages)", file=sys.stderr)
        return rc or 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
