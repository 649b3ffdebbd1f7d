#!/usr/bin/env python3
"""Compares a dataset mt-preprocess wrote (PREFIX.bin/.idx) with reference ids
(reference_ids.json's shape: CONFIG -> vocab_size, eod, docs), reading the
Megatron indexed format from its definition (megatron/core/datasets/
indexed_dataset.py), standard library only. Megatron writes one sequence per
non-empty document, ids in uint16 below a vocabulary of 65,500 and int32 above
(DType.optimal_dtype). Exit status 1 at the first difference, named.

usage: compare_ids.py PREFIX REFERENCE_JSON CONFIG
"""
import json
import struct
import sys

DTYPES = {4: ("i", 4), 8: ("H", 2)}


def main():
    prefix, ref_path, name = sys.argv[1:4]
    ref = json.load(open(ref_path, encoding="utf-8"))[name]
    idx = open(prefix + ".idx", "rb").read()
    binary = open(prefix + ".bin", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", "not a Megatron .idx"
    code, = struct.unpack_from("<B", idx, 17)
    want = 8 if ref["vocab_size"] < 65500 else 4
    if code != want:
        sys.exit(f"{name}: dtype code {code}, Megatron's is {want} for vocabulary {ref['vocab_size']}")
    fmt, size = DTYPES[code]
    seq_count, doc_count = struct.unpack_from("<QQ", idx, 18)
    off = 34
    lengths = struct.unpack_from("<%di" % seq_count, idx, off); off += 4 * seq_count
    pointers = struct.unpack_from("<%dq" % seq_count, idx, off); off += 8 * seq_count
    doc_idx = struct.unpack_from("<%dq" % doc_count, idx, off)
    seqs = [list(struct.unpack_from("<%d%s" % (n, fmt), binary, p)) for n, p in zip(lengths, pointers)]
    docs = [sum((seqs[s] for s in range(doc_idx[d], doc_idx[d + 1])), []) for d in range(doc_count - 1)]
    expected = ref["docs"]
    if len(docs) != len(expected):
        sys.exit(f"{name}: {len(docs)} documents, the reference has {len(expected)}")
    for i, (got, exp) in enumerate(zip(docs, expected)):
        if got != exp:
            at = next((k for k, (a, b) in enumerate(zip(got, exp)) if a != b), min(len(got), len(exp)))
            sys.exit(f"{name}: document {i} differs at token {at}: mt {got[at:at + 8]}, "
                     f"reference {exp[at:at + 8]} (lengths {len(got)} and {len(exp)})")
    for d in range(doc_count - 1):
        n = doc_idx[d + 1] - doc_idx[d]
        if n != (1 if expected[d] else 0):
            sys.exit(f"{name}: document {d} has {n} sequences; Megatron writes one per non-empty document")
    tokens = sum(len(d) for d in docs)
    print(f"{name}: {len(docs)} documents, {tokens} tokens identical; vocab {ref['vocab_size']}, "
          f"dtype {'uint16' if code == 8 else 'int32'}, eod {ref['eod']}")


if __name__ == "__main__":
    main()
