#!/usr/bin/env python3
"""Writes what Megatron-LM's tools/preprocess_data.py writes with
--tokenizer-type NullTokenizer --vocab-size N --append-eod, computed here from
Megatron's definitions, as the independent reference for mt-preprocess.

NullTokenizer.tokenize(text) is [int(x) for x in text.split(' ')] (Python's
own int() here). Its vocab_size and eod: current Megatron-Core
(megatron/core/tokenizers, core 0.18 and later) N and N - 1; --legacy (the
_NullTokenizer of megatron/training/tokenizer, core 0.14 to 0.16) N + 1 and N.
The dtype is uint16 below 65500 ids, else int32 (DType.optimal_dtype); a
document is its non-empty sentences, EOD on the last one.

usage: null_reference.py JSONL N [--legacy] PREFIX
With --megatron, Megatron-Core's own NullTokenizer and IndexedDatasetBuilder
(whichever version is installed) write PREFIX instead: its vocab_size and eod
are printed.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "dataset", "Inputs"))
from make_dataset import write  # noqa: E402


def main():
    args = sys.argv[1:]
    legacy = "--legacy" in args
    megatron = "--megatron" in args
    jsonl, n, prefix = [a for a in args if not a.startswith("--")]
    n = int(n)
    texts = [json.loads(line)["text"] for line in open(jsonl, encoding="utf-8")]
    if megatron:
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
        from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer
        tok = NullTokenizer(n)
        print("megatron NullTokenizer(%d): vocab_size %d, eod %d" % (n, tok.vocab_size, tok.eod))
        builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(tok.vocab_size))
        for text in texts:  # Encoder.encode, then add_document, as preprocess_data.py
            sentences = text if isinstance(text, list) else [text]
            doc_ids, lens = [], []
            for s in sentences:
                ids = tok.text_to_ids(s)
                if len(ids) > 0:
                    doc_ids.extend(ids)
                    lens.append(len(ids))
            if len(doc_ids) > 0:
                doc_ids.append(tok.eod)
                lens[-1] += 1
            builder.add_document(doc_ids, lens)
        builder.finalize(prefix + ".idx")
        return
    vocab, eod = (n + 1, n) if legacy else (n, n - 1)
    docs = []
    for text in texts:
        sentences = text if isinstance(text, list) else [text]
        ids = [[int(x) for x in s.split(" ")] for s in sentences]
        ids = [s for s in ids if s]
        if ids:
            ids[-1].append(eod)
        docs.append(ids)
    write(prefix, "uint16" if vocab < 65500 else "int32", docs)
    print("reference: vocab_size %d, eod %d" % (vocab, eod))


if __name__ == "__main__":
    main()
