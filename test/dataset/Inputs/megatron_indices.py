#!/usr/bin/env python3
"""Megatron-LM's GPT training samples, transcribed independently with numpy,
as the reference for `mt-dataset samples`.

Follows megatron/core/datasets (core 0.8): the split string is normalized and
turned into bookends, each rounded as round(bookend * sequences)
(blended_megatron_dataset_config.py, blended_megatron_dataset_builder.py);
GPTDataset counts epochs, decides on a separate final epoch (< 80% of it
used), shuffles the document index and the shuffle index with one
numpy.random.RandomState(seed), and cuts samples of seq_length + 1 tokens
stepping by seq_length (gpt_dataset.py, helpers.cpp build_sample_idx); a
weighted blend asks each dataset for ceil(n * w * 1.005) samples and
interleaves them greedily (build_blending_indices); mock data has 100000
documents with lengths from numpy.random.default_rng(0) and tokens 1, 2, ...
then EOD, with the split forced to "1,1,1".

usage:
  megatron_indices.py make PREFIX --documents N --seed S [--max-length M]
  megatron_indices.py samples (PREFIX | W1 PREFIX1 W2 PREFIX2 ... | --mock)
      --seq-length L --num-samples N [--which train|valid|test] [--split S]
      [--seed S] [--show K] [--vocab-size V] [--eod E]
`make` writes a random dataset (empty documents, several sequences per
document, empty sequences included); `samples` prints one sample per line.
"""
import argparse
import functools
import math
import re
import struct

import numpy

DTYPES = {1: numpy.uint8, 2: numpy.int8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64,
          6: numpy.float64, 7: numpy.float32, 8: numpy.uint16}


def make(prefix, documents, seed, max_length):
    rs = numpy.random.RandomState(seed)
    lengths, doc_idx, tokens = [], [0], []
    for _ in range(documents):
        kind = rs.randint(10)
        count = 0 if kind == 0 else (2 + rs.randint(2) if kind == 1 else 1)
        for _ in range(count):
            n = int(rs.randint(max_length + 1))
            tokens.append(rs.randint(0, 50257, size=n).astype(numpy.uint16))
            lengths.append(n)
        doc_idx.append(len(lengths))
    with open(prefix + ".bin", "wb") as f:
        for t in tokens:
            f.write(t.tobytes())
    pointers = numpy.concatenate([[0], numpy.cumsum(lengths)[:-1]]) * 2 if lengths else []
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(lengths), len(doc_idx)))
        f.write(numpy.array(lengths, dtype="<i4").tobytes())
        f.write(numpy.array(pointers, dtype="<i8").tobytes())
        f.write(numpy.array(doc_idx, dtype="<i8").tobytes())


class Indexed:
    """The low-level dataset: sequences of an indexed dataset."""

    def __init__(self, prefix):
        idx = open(prefix + ".idx", "rb").read()
        assert idx[:9] == b"MMIDIDX\x00\x00"
        _, code, s, _ = struct.unpack("<QBQQ", idx[9:34])
        self.sizes = numpy.frombuffer(idx, dtype="<i4", count=s, offset=34)
        self.pointers = numpy.frombuffer(idx, dtype="<i8", count=s, offset=34 + 4 * s)
        self.dtype = DTYPES[code]
        self.bin = numpy.fromfile(prefix + ".bin", dtype=self.dtype)

    def get(self, i, offset=0, length=None):
        if length is None:
            length = self.sizes[i] - offset
        at = self.pointers[i] // numpy.dtype(self.dtype).itemsize + offset
        return self.bin[at:at + length].astype(numpy.int64)


class Mock:
    """MockGPTLowLevelDataset."""

    def __init__(self, vocab_size, eod=None):  # tokenizer.vocab_size, tokenizer.eod
        self.vocab_size = vocab_size
        self.eod = vocab_size - 1 if eod is None else eod
        rng = numpy.random.default_rng(seed=0)
        self.sizes = rng.integers(low=1, high=4096, size=100000, dtype=numpy.int32)

    def get(self, i, offset=0, length=None):
        n = self.sizes[i]
        if length is None:
            length = n - offset
        doc = numpy.concatenate([(numpy.arange(n - 1) + 1) % self.vocab_size, [self.eod]])
        return numpy.int64(doc)[offset:offset + length]


def normalize(w):
    w = numpy.array(w, dtype=numpy.float64)
    return (w / numpy.sum(w)).tolist()


def split_range(split, which, n):
    v = list(map(float, re.findall(r"[.0-9]+", split)))
    v = normalize(v + [0.0] * (3 - len(v)))
    ends = functools.reduce(lambda a, b: a + [a[len(a) - 1] + b], [[0], *v])
    beg, end = ends[which], ends[which + 1]
    assert end > beg, "the split has no share"
    return int(round(beg * float(n))), int(round(end * float(n)))


def document_index(documents, epochs, rs, separate):
    if not separate or epochs == 1:
        d = numpy.mgrid[0:epochs, 0:len(documents)][1]
        d[:] = documents
        d = d.reshape(-1).astype(numpy.int32)
        rs.shuffle(d)
        return d
    return numpy.concatenate((document_index(documents, epochs - 1, rs, False),
                              document_index(documents, 1, rs, False)))


def sample_index(sizes, doc, seq_length, epochs, tokens):
    num = (epochs * tokens - 1) // seq_length
    out = [(0, 0)]
    d, off = 0, 0
    while len(out) <= num:
        remaining = seq_length + 1
        while remaining != 0:
            length = int(sizes[doc[d]]) - off
            remaining -= length
            if remaining <= 0:
                off += remaining + length - 1
                remaining = 0
            else:
                d += 1
                off = 0
        out.append((d, off))
    return out


def shuffle_index(first, total, rs):
    dtype = numpy.uint32 if total < numpy.iinfo(numpy.uint32).max - 1 else numpy.int64
    a = numpy.arange(0, first, dtype=dtype)
    rs.shuffle(a)
    if first == total:
        return a
    b = numpy.arange(first, total, dtype=dtype)
    rs.shuffle(b)
    return numpy.concatenate((a, b))


class GPT:
    def __init__(self, low, split, which, num_samples, seq_length, seed):
        self.low, self.seq_length = low, seq_length
        beg, end = split_range(split, which, len(low.sizes))
        documents = numpy.arange(beg, end, dtype=numpy.int32)
        tokens = int(numpy.sum(low.sizes[documents]))
        if tokens < 2:
            raise SystemExit("the split has %d tokens" % tokens)
        epochs, have = 1, tokens
        while have < num_samples * seq_length + 1:
            epochs += 1
            have += tokens
        separate = False
        if epochs > 1:
            sans = ((epochs - 1) * tokens - 1) // seq_length
            per_epoch = (tokens - 1) // seq_length
            separate = num_samples - sans < int(0.80 * per_epoch)
        rs = numpy.random.RandomState(seed)
        self.doc = document_index(documents, epochs, rs, separate)
        self.sample = sample_index(low.sizes, self.doc, seq_length, epochs, tokens)
        n = len(self.sample) - 1
        self.shuffle = shuffle_index(sans if separate else n, n, rs)

    def __len__(self):
        return len(self.sample) - 1

    def __getitem__(self, i):
        i = self.shuffle[i]
        (d0, o0), (d1, o1) = self.sample[i], self.sample[i + 1]
        if d0 == d1:
            return self.low.get(self.doc[d0], o0, o1 - o0 + 1)
        parts = []
        for d in range(d0, d1 + 1):
            parts.append(self.low.get(self.doc[d], o0 if d == d0 else 0,
                                      None if d < d1 else o1 + 1))
        return numpy.concatenate(parts)


class Blend:
    def __init__(self, datasets, weights, size):
        self.datasets, counts = datasets, [0] * len(datasets)
        self.index = []
        for s in range(size):
            at = max(float(s), 1.0)
            errors = [w * at - c for w, c in zip(weights, counts)]
            best = errors.index(max(errors))
            self.index.append((best, counts[best]))
            counts[best] += 1

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        d, j = self.index[i]
        return self.datasets[d][j]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["make", "samples"])
    p.add_argument("data", nargs="*")
    p.add_argument("--documents", type=int)
    p.add_argument("--max-length", type=int, default=60)
    p.add_argument("--mock", action="store_true")
    p.add_argument("--vocab-size", type=int, default=50257)
    p.add_argument("--eod", type=int)
    p.add_argument("--seq-length", type=int)
    p.add_argument("--num-samples", type=int)
    p.add_argument("--which", default="train", choices=["train", "valid", "test"])
    p.add_argument("--split", default="969,30,1")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--show", type=int, default=10)
    a = p.parse_args()
    if a.command == "make":
        make(a.data[0], a.documents, a.seed, a.max_length)
        return
    which = ["train", "valid", "test"].index(a.which)
    gpt = lambda low, split, n: GPT(low, split, which, n, a.seq_length, a.seed)
    if a.mock:
        ds = gpt(Mock(a.vocab_size, a.eod), "1,1,1", a.num_samples)
    elif len(a.data) == 1:
        ds = gpt(Indexed(a.data[0]), a.split, a.num_samples)
    else:
        weights = normalize([float(w) for w in a.data[0::2]])
        requests = [int(math.ceil(a.num_samples * w * 1.005)) for w in weights]
        parts = [gpt(Indexed(prefix), a.split, n) for prefix, n in zip(a.data[1::2], requests)]
        ds = Blend(parts, normalize(weights), sum(requests))
    for i in range(min(a.show, len(ds))):
        print(" ".join(str(int(t)) for t in ds[i]))


if __name__ == "__main__":
    main()
