#!/usr/bin/env python3
"""Checks the characters behind mt-preprocess's progress lines: for each
"Processed N documents (D docs/s, M MB/s)." line, M / D * 2^20 * N must be the
characters of the first N lines of the input, counted as Megatron counts
them (len(json_line) of lines read as UTF-8 text, newline included).

usage: check_progress.py JSONL LOG INTERVAL
"""
import re
import sys


def main():
    jsonl, log, interval = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(jsonl, encoding="utf-8", newline="") as f:
        lines = f.readlines()
    with open(jsonl, "rb") as f:
        raw = f.read().splitlines(keepends=True)
    pattern = re.compile(r"^Processed (\d+) documents \((\S+) docs/s, (\S+) MB/s\)\.$")
    seen = 0
    for line in open(log):
        m = pattern.match(line.rstrip("\n"))
        if not m:
            continue
        n, docs_rate, mb_rate = int(m.group(1)), float(m.group(2)), float(m.group(3))
        assert n % interval == 0, line
        chars = sum(len(s) for s in lines[:n])
        got = mb_rate / docs_rate * n * 1024 * 1024
        assert abs(got - chars) <= 1e-6 * chars, (line, got, chars)
        nbytes = sum(len(b) for b in raw[:n])
        assert nbytes != chars, "the test needs non-ASCII text"
        print("Processed %d documents: %d lines of %d characters (%d bytes), as Megatron counts them"
              % (n, n, chars, nbytes))
        seen += 1
    assert seen > 0, "no progress line"


if __name__ == "__main__":
    main()
