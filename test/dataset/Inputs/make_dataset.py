#!/usr/bin/env python3
"""Writes PREFIX.bin/.idx byte for byte as Megatron-LM does, as the independent
reference for mt's reader, optionally corrupted; and a toy GPT-2 vocabulary.

Layout (megatron/core/datasets/indexed_dataset.py, _IndexWriter and
IndexedDatasetBuilder): b"MMIDIDX\\x00\\x00", <Q version 1, <B dtype code,
<Q sequence count, <Q len(document_indices), int32 sequence lengths, int64
sequence byte offsets (running sum of length * itemsize from 0), int64
document indices ([0] plus len(sequence_lengths) after each document). The
.bin is the token ids in the dtype, no header.

usage: make_dataset.py PREFIX [--dtype NAME] [--docs JSON] [--corrupt KIND]
       make_dataset.py --vocab DIR [--vocab-eod-first]
--docs is a JSON list of documents, each a list of sequences of token ids;
--docs @FILE reads that JSON from FILE.
"""
import argparse
import json
import os
import struct

DTYPES = {  # name: (code, struct format)
    "uint8": (1, "B"), "int8": (2, "b"), "int16": (3, "h"), "int32": (4, "i"),
    "int64": (5, "q"), "float64": (6, "d"), "float32": (7, "f"), "uint16": (8, "H"),
}

# Ids are bytes of the toy vocabulary (--vocab); 258 is "hell", 259 <|endoftext|>.
DEFAULT_DOCS = [
    # "Hello, \"world\"\n" and EOD: one sequence.
    [[72, 101, 108, 108, 111, 44, 32, 34, 119, 111, 114, 108, 100, 34, 10, 259]],
    # An empty document: no sequences, so its document index repeats.
    [],
    # "hello " + "world!": two sequences.
    [[258, 111, 32], [119, 111, 114, 108, 100, 33]],
    # 500 letters: longer than inspect shows.
    [[97 + i % 26 for i in range(500)]],
]


def write(prefix, dtype, docs):
    code, fmt = DTYPES[dtype]
    itemsize = struct.calcsize("<" + fmt)
    lengths, doc_idx = [], [0]
    with open(prefix + ".bin", "wb") as f:
        for doc in docs:
            for seq in doc:
                f.write(struct.pack("<%d%s" % (len(seq), fmt), *seq))
                lengths.append(len(seq))
            doc_idx.append(len(lengths))
    pointers, at = [], 0
    for n in lengths:
        pointers.append(at)
        at += n * itemsize
    idx = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code)
    idx += struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(doc_idx))
    idx += struct.pack("<%di" % len(lengths), *lengths)
    idx += struct.pack("<%dq" % len(pointers), *pointers)
    idx += struct.pack("<%dq" % len(doc_idx), *doc_idx)
    with open(prefix + ".idx", "wb") as f:
        f.write(idx)
    return len(lengths), len(doc_idx)


def patch(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def corrupt(prefix, kind, S, D):
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    lengths_at = 34
    pointers_at = lengths_at + 4 * S
    docs_at = pointers_at + 8 * S
    if kind == "magic":
        patch(idx, 0, b"XXIDIDX")
    elif kind == "legacy":
        patch(idx, 0, b"TNTIDX\x00\x00")
    elif kind == "version":
        patch(idx, 9, struct.pack("<Q", 2))
    elif kind == "dtype":
        patch(idx, 17, struct.pack("<B", 9))
    elif kind == "negative-length":
        patch(idx, lengths_at, struct.pack("<i", -1))
    elif kind == "pointer":
        patch(idx, pointers_at + 8, struct.pack("<q", 3))
    elif kind == "doc-start":
        patch(idx, docs_at, struct.pack("<q", 1))
    elif kind == "doc-order":
        patch(idx, docs_at + 8, struct.pack("<q", S))
    elif kind == "doc-end":
        patch(idx, docs_at + 8 * (D - 1), struct.pack("<q", S - 1))
    elif kind == "idx-extra":
        with open(idx, "ab") as f:
            f.write(b"\x00" * 8)
    elif kind == "bin-extra":
        with open(bin_, "ab") as f:
            f.write(b"\x00" * 2)
    elif kind == "multimodal":
        with open(idx, "ab") as f:
            f.write(b"\x00" * S)
    else:
        raise SystemExit("unknown --corrupt kind " + kind)


def byte_symbol(b):
    # GPT-2's bytes_to_unicode: printable bytes stand for themselves, the rest
    # map to 256, 257, ... in byte order.
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    if b in printable:
        return chr(b)
    return chr(256 + sorted(set(range(256)) - set(printable)).index(b))


def write_vocab(out, eod_first=False):
    os.makedirs(out, exist_ok=True)
    if eod_first:  # <|endoftext|> is id 0, not the last: EOD != vocab size - 1
        vocab = {"<|endoftext|>": 0}
        vocab.update({byte_symbol(b): b + 1 for b in range(256)})
        vocab.update({"he": 257, "ll": 258, "hell": 259})
    else:
        vocab = {byte_symbol(b): b for b in range(256)}
        vocab.update({"he": 256, "ll": 257, "hell": 258, "<|endoftext|>": 259})
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\nh e\nl l\nhe ll\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("prefix", nargs="?")
    p.add_argument("--dtype", default="uint16", choices=sorted(DTYPES))
    p.add_argument("--docs", help="JSON list of documents (lists of sequences)")
    p.add_argument("--corrupt")
    p.add_argument("--vocab", metavar="DIR")
    p.add_argument("--vocab-eod-first", action="store_true")
    a = p.parse_args()
    if a.vocab:
        write_vocab(a.vocab, a.vocab_eod_first)
    if a.prefix:
        text = a.docs
        if text is not None and text.startswith("@"):
            with open(text[1:]) as f:
                text = f.read()
        docs = json.loads(text) if text is not None else DEFAULT_DOCS
        S, D = write(a.prefix, a.dtype, docs)
        if a.corrupt:
            corrupt(a.prefix, a.corrupt, S, D)


if __name__ == "__main__":
    main()
