#!/usr/bin/env python3
"""Measures mt-preprocess throughput on English text, by worker count, and HF
`tokenizers` on the same documents when it is installed.

Usage: bench/preprocess_speed.py [--mb 64] [--workers 1 2] [--record]
         [--vocab-file V --merge-file M] [--mt-preprocess build/bin/mt-preprocess]

The corpus is real English prose found on any Debian machine (license texts and
package copyright files under /usr/share), one paragraph per JSON line, repeated
to --mb megabytes. Repetition helps any per-word cache, as a large natural corpus
does (word frequencies are Zipfian), so treat the figures as steady-state
throughput. With --record the table is appended to bench/results/preprocess-speed.md
with the date, machine and commit.
"""
import argparse
import datetime
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

from machine import cpu_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(ROOT, "..", "shared", "data", "gpt2")


def english_paragraphs():
    files = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob("/usr/share/doc/*/copyright"))
    paragraphs = []
    for path in files:
        try:
            text = open(path, encoding="utf-8", errors="strict").read()
        except (OSError, UnicodeDecodeError):
            continue
        for p in text.split("\n\n"):
            p = p.strip()
            if len(p) > 40:
                paragraphs.append(p)
    return paragraphs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=64.0)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--vocab-file", default=os.path.join(GPT2, "vocab.json"))
    ap.add_argument("--merge-file", default=os.path.join(GPT2, "merges.txt"))
    ap.add_argument("--mt-preprocess", default=os.path.join(ROOT, "build", "bin", "mt-preprocess"))
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(args.vocab_file):
        print("bench: GPT-2 vocab.json not found at %s; pass --vocab-file" % args.vocab_file)
        return 1

    paragraphs = english_paragraphs()
    tmp = tempfile.mkdtemp(prefix="mt-bench-")
    corpus = os.path.join(tmp, "corpus.jsonl")
    target = int(args.mb * 1e6)
    size = 0
    docs = []
    with open(corpus, "w", encoding="utf-8") as f:
        while size < target:
            for p in paragraphs:
                line = json.dumps({"text": p}) + "\n"
                f.write(line)
                docs.append(p)
                size += len(line.encode("utf-8"))
                if size >= target:
                    break
    print("corpus: %.1f MB, %d documents, from %d distinct paragraphs" % (size / 1e6, len(docs), len(paragraphs)))

    rows = []
    for w in args.workers:
        t0 = time.perf_counter()
        subprocess.run([args.mt_preprocess, "--input", corpus, "--output-prefix", os.path.join(tmp, "out%d" % w),
                        "--vocab-file", args.vocab_file, "--merge-file", args.merge_file,
                        "--append-eod", "--workers", str(w), "--quiet"], check=True)
        dt = time.perf_counter() - t0
        rows.append(("mt-preprocess, %d worker%s" % (w, "" if w == 1 else "s"), size / 1e6 / dt, dt))

    try:
        import tokenizers
        tok = tokenizers.ByteLevelBPETokenizer(args.vocab_file, args.merge_file)
        t0 = time.perf_counter()
        for i in range(0, len(docs), 4096):
            tok.encode_batch(docs[i:i + 4096])
        dt = time.perf_counter() - t0
        rows.append(("HF tokenizers %s encode_batch (all cores, no JSON, no output)" % tokenizers.__version__,
                     size / 1e6 / dt, dt))
    except ImportError:
        rows.append(("HF tokenizers: not installed", 0.0, 0.0))

    lines = ["| what | MB/s | seconds |", "| --- | ---: | ---: |"]
    lines += ["| %s | %.1f | %.2f |" % r for r in rows]
    table = "\n".join(lines)
    print(table)
    if args.record:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        out = os.path.join(ROOT, "bench", "results", "preprocess-speed.md")
        new = not os.path.exists(out)
        with open(out, "a") as f:
            if new:
                f.write("# mt-preprocess throughput (GPT-2 BPE, English text)\n")
            f.write("\n## %s - %s, %d cores - commit %s\n\n`bench/preprocess_speed.py --mb %g`; "
                    "corpus %.1f MB of Debian license/copyright prose as jsonl, `--append-eod`.\n\n%s\n"
                    % (datetime.date.today().isoformat(), cpu_name(), os.cpu_count(), commit, args.mb,
                       size / 1e6, table))
        print("recorded in", out)
    subprocess.run(["rm", "-rf", tmp])
    return 0


if __name__ == "__main__":
    sys.exit(main())
