#!/usr/bin/env python3
"""Independent reader of Megatron's indexed format, written from the format's
definition (megatron/core/datasets/indexed_dataset.py: _IndexWriter): prints the
documents as token lists and rebuilds the .idx the way Megatron's writer would
from those lists, failing if our .idx differs by a single byte.

Usage: check_layout.py PREFIX
"""
import struct
import sys

DTYPES = {1: ("B", 1), 2: ("b", 1), 3: ("h", 2), 4: ("i", 4), 5: ("q", 8), 6: ("d", 8), 7: ("f", 4), 8: ("H", 2)}


def main():
    prefix = sys.argv[1]
    idx = open(prefix + ".idx", "rb").read()
    binary = open(prefix + ".bin", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", "magic"
    version, = struct.unpack_from("<Q", idx, 9)
    code, = struct.unpack_from("<B", idx, 17)
    seq_count, doc_count = struct.unpack_from("<QQ", idx, 18)
    fmt, size = DTYPES[code]
    off = 34
    lengths = struct.unpack_from("<%di" % seq_count, idx, off); off += 4 * seq_count
    pointers = struct.unpack_from("<%dq" % seq_count, idx, off); off += 8 * seq_count
    doc_idx = struct.unpack_from("<%dq" % doc_count, idx, off); off += 8 * doc_count
    assert off == len(idx), "trailing bytes in .idx"
    seqs = [list(struct.unpack_from("<%d%s" % (n, fmt), binary, p)) for n, p in zip(lengths, pointers)]
    docs = [[seqs[s] for s in range(doc_idx[d], doc_idx[d + 1])] for d in range(doc_count - 1)]
    print("version %d dtype %d sequences %d documents %d" % (version, code, seq_count, doc_count - 1))
    for d in docs:
        print("doc", d)

    # Megatron's writer: pointers are the running byte offsets of the sequences.
    rebuilt_lengths = [len(s) for d in docs for s in d]
    rebuilt_pointers, p = [], 0
    for n in rebuilt_lengths:
        rebuilt_pointers.append(p)
        p += n * size
    rebuilt_doc_idx = [0]
    for d in docs:
        rebuilt_doc_idx.append(rebuilt_doc_idx[-1] + len(d))
    rebuilt = (b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code)
               + struct.pack("<Q", len(rebuilt_lengths)) + struct.pack("<Q", len(rebuilt_doc_idx))
               + struct.pack("<%di" % len(rebuilt_lengths), *rebuilt_lengths)
               + struct.pack("<%dq" % len(rebuilt_pointers), *rebuilt_pointers)
               + struct.pack("<%dq" % len(rebuilt_doc_idx), *rebuilt_doc_idx))
    rebuilt_bin = b"".join(struct.pack("<%d%s" % (len(s), fmt), *s) for d in docs for s in d)
    print("idx identical" if rebuilt == idx else "idx DIFFERS")
    print("bin identical" if rebuilt_bin == binary else "bin DIFFERS")


if __name__ == "__main__":
    main()
