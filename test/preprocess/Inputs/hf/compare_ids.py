#!/usr/bin/env python3
"""Compares an indexed dataset mt-preprocess wrote (--append-eod, one
sequence per document; a document without ids stays, empty) with the ids HF `tokenizers` gave for the same
documents (an expected file of make_hf_tokenizers.py). Reads the .idx/.bin
from the format's definition (megatron/core/datasets/indexed_dataset.py);
standard library only.

usage: compare_ids.py EXPECTED [--log LOG] PREFIX [PREFIX2 ...]
  the documents of the prefixes, in order, are the expected lines; LOG is
  mt-preprocess's stderr, whose tokenizer line must show the same vocabulary
  size and eod.
Prints "N documents match, vocab V eod E, dtype D" or the first difference.
"""
import struct
import sys

DTYPES = {1: ("B", 1), 2: ("b", 1), 3: ("h", 2), 4: ("i", 4), 5: ("q", 8), 8: ("H", 2)}


def read(prefix):
    idx = open(prefix + ".idx", "rb").read()
    binary = open(prefix + ".bin", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", "magic"
    code, = struct.unpack_from("<B", idx, 17)
    seq_count, doc_count = struct.unpack_from("<QQ", idx, 18)
    fmt, _ = DTYPES[code]
    off = 34
    lengths = struct.unpack_from("<%di" % seq_count, idx, off)
    off += 4 * seq_count
    pointers = struct.unpack_from("<%dq" % seq_count, idx, off)
    off += 8 * seq_count
    doc_idx = struct.unpack_from("<%dq" % doc_count, idx, off)
    seqs = [list(struct.unpack_from("<%d%s" % (n, fmt), binary, p)) for n, p in zip(lengths, pointers)]
    docs = []
    for d in range(doc_count - 1):
        toks = []
        for s in range(doc_idx[d], doc_idx[d + 1]):
            toks += seqs[s]
        docs.append(toks)
    return docs, {"H": "uint16", "i": "int32"}.get(fmt, fmt)


def main():
    lines = open(sys.argv[1]).read().split("\n")
    head = lines[0].split()
    vocab, eod = int(head[1]), int(head[3])
    want = [[int(x) for x in line.split()] for line in lines[1:-1]]
    got, dtype = [], None
    prefixes = sys.argv[2:]
    if prefixes[0] == "--log":
        line = "vocab size %d, eod %d" % (vocab, eod)
        if line not in open(prefixes[1]).read():
            print("error: mt's log has no '%s':\n%s" % (line, open(prefixes[1]).read()))
            sys.exit(1)
        prefixes = prefixes[2:]
    for prefix in prefixes:
        docs, dtype = read(prefix)
        got += docs
    # Every document is kept; EOD follows the ids of one that has any.
    expected = [ids + [eod] if ids else [] for ids in want]
    if len(got) != len(expected):
        print("error: %d documents, expected %d" % (len(got), len(expected)))
        sys.exit(1)
    for i, ids in enumerate(expected):
        if got[i] != ids:
            print("error: document %d (line %d of %s) differs:\n  mt:  %s\n  ref: %s"
                  % (i, i + 2, sys.argv[1], got[i], ids))
            sys.exit(1)
    print("%d documents match, vocab %d eod %d, dtype %s" % (len(got), vocab, eod, dtype))


main()
