#!/usr/bin/env python3
"""Compares mt-preprocess with the reference tokenizer library, per tokenizer
type, on the same corpus with the same number of workers, as a ratio.

Usage: bench/preprocess_speed.py [--mb 16] [--workers 1 2] [--only REGEX] [--record]
         [--python PY] [--mt-preprocess build/bin/mt-preprocess]
         [--vocab-file V --merge-file M] [--hf-tokenizer tokenizer.json]
         [--sp-model x.model]

For each type mt-preprocess supports it times `mt-preprocess --tokenizer-type
TYPE --workers W --append-eod` over a jsonl corpus (the whole job: reading,
JSON, tokenizing, writing .bin/.idx), and the reference library tokenizing the
same texts with W threads or processes (tokenizing only: no JSON, no output),
in a separate process of PY (a python with the reference packages; default:
build/reference-venv, else the venv of /work/ci-clone, else python3):

| type | reference | how it runs W workers |
| --- | --- | --- |
| GPT2BPETokenizer | `tokenizers` ByteLevelBPETokenizer(vocab.json, merges.txt) | encode_batch, RAYON_NUM_THREADS=W |
| HuggingFaceTokenizer | `tokenizers` Tokenizer.from_file(tokenizer.json) | encode_batch, RAYON_NUM_THREADS=W |
| SentencePieceTokenizer | `sentencepiece` SentencePieceProcessor | encode(texts, num_threads=W) |
| TikTokenizer | `tiktoken` Encoding (pattern v2) | encode_ordinary_batch(texts, num_threads=W) |
| NullTokenizer | Megatron's tokenize(), [int(x) for x in text.split(' ')] | multiprocessing.Pool(W) |

The ratio is mt's MB/s over the reference's (above 1: mt is faster; the
issue's target is at least 1 for every type). A type whose mt-preprocess
loader or reference package is absent is skipped, and the table says which.

The text corpus is English prose found on any Debian machine (license texts
and package copyright files under /usr/share), one paragraph per JSON line,
repeated to --mb megabytes; NullTokenizer's is lines of random ids below
65000. Tokenizer files the options do not give are made here from GPT-2's
(the SentencePiece model is trained on the corpus's distinct paragraphs with
`sentencepiece`, a BPE of 8000 pieces with byte fallback). With --record the
table is appended to bench/results/preprocess-speed.md with the date, the
machine and the commit.
"""
import argparse
import base64
import datetime
import glob
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

from machine import cpu_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(ROOT, "..", "shared", "data", "gpt2")

# What the reference process runs: it reads the texts (one JSON string per
# line), tokenizes them with W workers and prints the seconds that took.
REFERENCE = r'''
import json, os, sys, time
kind, path, texts_path, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
texts = [json.loads(l) for l in open(texts_path, encoding="utf-8")]
chunk = 4096
if kind in ("GPT2BPETokenizer", "HuggingFaceTokenizer"):
    import tokenizers
    if kind == "GPT2BPETokenizer":
        vocab, merges = path.split(",")
        tok = tokenizers.ByteLevelBPETokenizer(vocab, merges)
    else:
        tok = tokenizers.Tokenizer.from_file(path)
    run = lambda: [tok.encode_batch(texts[i:i + chunk]) for i in range(0, len(texts), chunk)]
elif kind == "SentencePieceTokenizer":
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=path)
    run = lambda: [sp.encode(texts[i:i + chunk], num_threads=workers)
                   for i in range(0, len(texts), chunk)]
elif kind == "TikTokenizer":
    import base64, tiktoken
    ranks = {base64.b64decode(x["token_bytes"]): x["rank"] for x in json.load(open(path))}
    v2 = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
          "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
          "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    enc = tiktoken.Encoding("bench", pat_str=v2, mergeable_ranks=ranks, special_tokens={})
    run = lambda: [enc.encode_ordinary_batch(texts[i:i + chunk], num_threads=workers)
                   for i in range(0, len(texts), chunk)]
elif kind == "NullTokenizer":
    import multiprocessing
    def tokenize(text):
        return [int(x) for x in text.split(" ")]
    pool = multiprocessing.Pool(workers)
    run = lambda: list(pool.imap(tokenize, texts, 32))
t0 = time.perf_counter()
run()
print(time.perf_counter() - t0)
'''

TYPES = [
    ("GPT2BPETokenizer", "tokenizers"),
    ("HuggingFaceTokenizer", "tokenizers"),
    ("SentencePieceTokenizer", "sentencepiece"),
    ("TikTokenizer", "tiktoken"),
    ("NullTokenizer", "multiprocessing"),
]


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


def write_corpus(path, texts_path, source, target):
    """Repeats `source` into a jsonl corpus of `target` bytes, and the same
    texts one JSON string a line for the reference; returns the bytes."""
    size = 0
    with open(path, "w", encoding="utf-8") as f, open(texts_path, "w", encoding="utf-8") as t:
        while size < target:
            for p in source:
                line = json.dumps({"text": p}) + "\n"
                f.write(line)
                t.write(json.dumps(p) + "\n")
                size += len(line.encode("utf-8"))
                if size >= target:
                    break
    return size


def default_python():
    for py in (os.path.join(ROOT, "build", "reference-venv", "bin", "python"),
               "/work/ci-clone/build/reference-venv/bin/python"):
        if os.path.exists(py):
            return py
    return sys.executable


def run_py(python, code, *args, env=None):
    r = subprocess.run([python, "-c", code, *args], capture_output=True, text=True,
                       env=dict(os.environ, **(env or {})))
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "failed")
    return r.stdout.strip()


def gpt2_to_tiktoken(vocab_json, out):
    """GPT-2's vocabulary as Megatron's TikTokenizer file: a JSON list of
    {rank, token_bytes (base64), token_str}: the 256 single bytes first, in
    byte order (as Megatron's format wants), then GPT-2's longer tokens in id
    order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_of = {chr(c): b for b, c in zip(bs, cs)}
    vocab = json.load(open(vocab_json, encoding="utf-8"))
    tokens = [bytes([b]) for b in range(256)]
    for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
        raw = bytes(byte_of[c] for c in token) if token != "<|endoftext|>" else b""
        if len(raw) > 1:
            tokens.append(raw)
    items = [{"rank": i, "token_bytes": base64.b64encode(raw).decode(),
              "token_str": raw.decode("utf-8", errors="replace")} for i, raw in enumerate(tokens)]
    json.dump(items, open(out, "w"))
    return len(items)


def mt_supports(mt, flags, tmp):
    """"" when mt-preprocess loads this tokenizer, else its error line."""
    probe = os.path.join(tmp, "probe.jsonl")
    with open(probe, "w") as f:
        f.write('{"text": "1 2"}\n')
    r = subprocess.run([mt, "--input", probe, "--output-prefix", os.path.join(tmp, "probe"), "--quiet", *flags],
                       capture_output=True, text=True)
    return "" if r.returncode == 0 else (r.stderr.strip().splitlines() or ["failed"])[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=16.0)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--only", help="regex over the tokenizer types")
    ap.add_argument("--python", default=default_python())
    ap.add_argument("--vocab-file", default=os.path.join(GPT2, "vocab.json"))
    ap.add_argument("--merge-file", default=os.path.join(GPT2, "merges.txt"))
    ap.add_argument("--hf-tokenizer", help="a tokenizer.json (default: GPT-2's files as one)")
    ap.add_argument("--sp-model", help="a SentencePiece .model (default: trained on the corpus)")
    ap.add_argument("--mt-preprocess", default=os.path.join(ROOT, "build", "bin", "mt-preprocess"))
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(args.vocab_file):
        print("bench: GPT-2 vocab.json not found at %s; pass --vocab-file" % args.vocab_file)
        return 1

    tmp = tempfile.mkdtemp(prefix="mt-bench-")
    target = int(args.mb * 1e6)
    paragraphs = english_paragraphs()
    corpus, texts = os.path.join(tmp, "corpus.jsonl"), os.path.join(tmp, "texts.jsonl")
    size = write_corpus(corpus, texts, paragraphs, target)
    rng = random.Random(0)
    id_lines = [" ".join(str(rng.randrange(65000)) for _ in range(rng.randint(50, 500))) for _ in range(2000)]
    ids_corpus, ids_texts = os.path.join(tmp, "ids.jsonl"), os.path.join(tmp, "ids_texts.jsonl")
    ids_size = write_corpus(ids_corpus, ids_texts, id_lines, target)
    print("corpus: %.1f MB of English prose (%d distinct paragraphs); %.1f MB of ids for NullTokenizer"
          % (size / 1e6, len(paragraphs), ids_size / 1e6))

    rows, skipped = [], []
    for kind, package in TYPES:
        if args.only and not re.search(args.only, kind):
            continue
        try:
            version = run_py(args.python, "import %s as m; print(getattr(m, '__version__', ''))" % package)
        except RuntimeError as e:
            skipped.append("%s: reference package `%s` is not importable by %s (%s)" % (kind, package, args.python, e))
            continue
        # The tokenizer's files, for mt and for the reference alike.
        try:
            if kind == "GPT2BPETokenizer":
                flags = ["--vocab-file", args.vocab_file, "--merge-file", args.merge_file]
                ref_path = args.vocab_file + "," + args.merge_file
            elif kind == "HuggingFaceTokenizer":
                ref_path = args.hf_tokenizer or os.path.join(tmp, "hf", "tokenizer.json")
                if not args.hf_tokenizer:
                    os.makedirs(os.path.dirname(ref_path))
                    run_py(args.python, "import sys, tokenizers; tokenizers.ByteLevelBPETokenizer("
                           "sys.argv[1], sys.argv[2]).save(sys.argv[3])",
                           args.vocab_file, args.merge_file, ref_path)
                    with open(os.path.join(os.path.dirname(ref_path), "tokenizer_config.json"), "w") as f:
                        json.dump({"eos_token": "<|endoftext|>"}, f)  # Megatron's eod
                flags = ["--tokenizer-model", ref_path]
            elif kind == "SentencePieceTokenizer":
                ref_path = args.sp_model or os.path.join(tmp, "sp.model")
                if not args.sp_model:
                    train_txt = os.path.join(tmp, "sp_train.txt")
                    with open(train_txt, "w", encoding="utf-8") as f:
                        f.write("\n".join(p.replace("\n", " ") for p in paragraphs))
                    run_py(args.python, "import sys, sentencepiece as s; s.SentencePieceTrainer.train("
                           "input=sys.argv[1], model_prefix=sys.argv[2], vocab_size=8000, model_type='bpe', "
                           "byte_fallback=True, minloglevel=2)", train_txt, ref_path[:-len(".model")])
                flags = ["--tokenizer-model", ref_path]
            elif kind == "TikTokenizer":
                ref_path = os.path.join(tmp, "tiktoken.json")
                n = gpt2_to_tiktoken(args.vocab_file, ref_path)
                flags = ["--tokenizer-model", ref_path, "--tiktoken-pattern", "v2",
                         "--vocab-size", str(1000 + n)]
            else:
                ref_path = ""
                flags = ["--vocab-size", "65000"]
        except RuntimeError as e:
            skipped.append("%s: could not make its tokenizer files (%s)" % (kind, e))
            continue
        flags = ["--tokenizer-type", kind] + flags
        why = mt_supports(args.mt_preprocess, flags, tmp)
        if why:
            skipped.append("%s: mt-preprocess cannot load it here (%s)" % (kind, why))
            continue
        src, txt, mb = (ids_corpus, ids_texts, ids_size / 1e6) if kind == "NullTokenizer" else (corpus, texts, size / 1e6)
        for w in args.workers:
            t0 = time.perf_counter()
            subprocess.run([args.mt_preprocess, "--input", src, "--output-prefix", os.path.join(tmp, "out"),
                            "--append-eod", "--workers", str(w), "--quiet", *flags], check=True)
            mt_s = time.perf_counter() - t0
            ref_s = float(run_py(args.python, REFERENCE, kind, ref_path, txt, str(w),
                                 env={"RAYON_NUM_THREADS": str(w), "TOKENIZERS_PARALLELISM": "true"}))
            ref_name = "Python `int()` (Megatron's tokenize)" if kind == "NullTokenizer" else "%s %s" % (package, version)
            rows.append((kind, w, mb / mt_s, ref_name, mb / ref_s, ref_s / mt_s))
            print("%-24s %d worker%s: mt %.1f MB/s, %s %.1f MB/s, ratio %.2f"
                  % (kind, w, "" if w == 1 else "s", mb / mt_s, ref_name, mb / ref_s, ref_s / mt_s))

    lines = ["| tokenizer type | workers | mt-preprocess MB/s | reference | reference MB/s | ratio mt / reference |",
             "| --- | ---: | ---: | --- | ---: | ---: |"]
    lines += ["| %s | %d | %.1f | %s | %.1f | %.2f |" % r for r in rows]
    table = "\n".join(lines)
    if skipped:
        table += "\n\nSkipped:\n\n" + "\n".join("- " + s for s in skipped)
    print(table)
    if args.record:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        out = os.path.join(ROOT, "bench", "results", "preprocess-speed.md")
        with open(out, "a") as f:
            f.write("\n## %s - %s, %d cores - commit %s\n\n`bench/preprocess_speed.py --mb %g --workers %s`; "
                    "corpus %.1f MB of Debian license/copyright prose as jsonl (NullTokenizer: %.1f MB of "
                    "ids), `--append-eod`. mt-preprocess's time is the whole job (read, JSON, tokenize, "
                    "write); the reference's is tokenizing the same texts only, with the same number of "
                    "workers.\n\n%s\n"
                    % (datetime.date.today().isoformat(), cpu_name(), os.cpu_count(), commit, args.mb,
                       " ".join(map(str, args.workers)), size / 1e6, ids_size / 1e6, table))
        print("recorded in", out)
    subprocess.run(["rm", "-rf", tmp])
    return 0


if __name__ == "__main__":
    sys.exit(main())
