#!/usr/bin/env python3
"""The SentencePiece and tiktoken test tokenizers and the ids the reference
libraries give for corpus.jsonl.

usage:
  make_tokenizers.py build         trains sp_bpe.model, sp_unigram.model and
                                   writes tiktoken.json (needs sentencepiece,
                                   tiktoken, regex), then reference_ids.json
  make_tokenizers.py reference     rewrites reference_ids.json only
  make_tokenizers.py ids [CONFIG...]
                                   prints reference_ids.json's content (or that of
                                   the CONFIGs), computed now with the installed
                                   libraries
  make_tokenizers.py bigvocab DIR  writes DIR/tiktoken_big.json (set
                                   MT_BIG_VOCAB_DIR=DIR for the tt-default config)
  make_tokenizers.py megatron OUT CONFIG...
                                   writes OUT/CONFIG_text_document.{bin,idx}
                                   as tools/preprocess_data.py does (megatron-core's
                                   build_tokenizer and IndexedDatasetBuilder)

Each CONFIG below names mt-preprocess's flags (the tests spell them out) and how
the reference ids are made:
- "megatron": through megatron-core's own build_tokenizer (the current classes,
  identical in core 0.16.1 and 0.17.1), when megatron-core is importable;
  otherwise with the library, following those classes: sentencepiece's
  encode_as_ids; tiktoken's encode(text, allowed_special="all").
- "legacy": the classes of megatron/training/tokenizer/tokenizer.py (not in
  the megatron-core wheel), written out here from their source with the
  library doing the encoding.
Every document's ids end with tokenizer.eod (--append-eod) when non-empty.
"""
import base64
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus.jsonl")

# tiktoken's split patterns, as Megatron defines them
# (megatron/core/tokenizers/text/libraries/tiktoken_tokenizer.py).
PATTERN_V1 = r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
PATTERN_V2 = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
              r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
              r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TT_SPECIALS_V1 = ["<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>", "<|im_start|>",
                  "<|im_end|>"]

# name -> (kind, options)
CONFIGS = {
    "sp-bpe": ("megatron", dict(type="SentencePieceTokenizer", model="sp_bpe.model")),
    "sp-unigram-llama2": ("megatron", dict(type="Llama2Tokenizer", model="sp_unigram.model")),
    "sp-bpe-splegacy": ("megatron", dict(type="SentencePieceTokenizer", model="sp_bpe.model",
                                         sentencepiece_legacy=True,
                                         special_tokens=["<EOD>", "[INST]", "<s>", "<unk>",
                                                         "[/INST]"],
                                         append_eod=False)),
    "sp-bpe-legacy": ("legacy", dict(type="SentencePieceTokenizer", model="sp_bpe.model")),
    "sp-bpe-llama2-legacy": ("legacy", dict(type="Llama2Tokenizer", model="sp_bpe.model")),
    "sp-unigram-gpt-legacy": ("legacy", dict(type="GPTSentencePieceTokenizer",
                                             model="sp_unigram.model")),
    # A pad piece "<pad>" and a user-defined "<mask>" (not the class's <MASK>).
    "sp-unigram-legacy": ("legacy", dict(type="SentencePieceTokenizer", model="sp_unigram.model")),
    # No bos or pad piece: the legacy class falls back to <BOS> and <PAD>.
    "sp-nobos-legacy": ("legacy", dict(type="SentencePieceTokenizer", model="sp_nobos.model")),
    "tt-v2": ("megatron", dict(type="TikTokenizer", model="tiktoken.json", pattern="v2",
                               vocab_size=600, num_special=16)),
    "tt-v1": ("megatron", dict(type="TikTokenizer", model="tiktoken.json", pattern="v1",
                               vocab_size=520, num_special=12, special_tokens=TT_SPECIALS_V1)),
    # Megatron's defaults: pattern v2, 1000 special tokens, vocabulary 2^17
    # (an int32 .bin).
    "tt-default": ("megatron", dict(type="TikTokenizer", model="tiktoken_big.json")),
    "tt-v2-legacy": ("legacy", dict(type="TikTokenizer", model="tiktoken.json", pattern="v2",
                                    vocab_size=600, num_special=16)),
}


def corpus():
    return [json.loads(line)["text"] for line in open(CORPUS, encoding="utf-8")]


# tiktoken_big.json: tiktoken.json padded to Megatron's default vocabulary
# (2^17 ids less 1000 special tokens) with tokens no text here can reach;
# written by `bigvocab DIR` (standard library only), found in $MT_BIG_VOCAB_DIR.
BIG = "tiktoken_big.json"
BIG_ENTRIES = 2**17 - 1000


def write_big_vocab(out_dir):
    vocab = json.load(open(os.path.join(HERE, "tiktoken.json")))
    for i in range(len(vocab), BIG_ENTRIES):
        b = b"\xff\xfe" + i.to_bytes(3, "big")  # never valid UTF-8: no text reaches it
        vocab.append({"rank": i, "token_bytes": base64.b64encode(b).decode(),
                      "token_str": b.decode("utf-8", errors="replace")})
    with open(os.path.join(out_dir, BIG), "w") as f:
        json.dump(vocab, f)


def path(o):
    if o["model"] == BIG:
        big_dir = os.environ.get("MT_BIG_VOCAB_DIR")
        if not big_dir:
            import atexit
            import shutil
            import tempfile
            big_dir = os.environ["MT_BIG_VOCAB_DIR"] = tempfile.mkdtemp()
            atexit.register(shutil.rmtree, big_dir, True)
            write_big_vocab(big_dir)
        return os.path.join(big_dir, BIG)
    return os.path.join(HERE, o["model"])


# ---------------------------------------------------------------------------
# Reference tokenizers: (tokenize, eod, vocab_size)

def megatron_args(o):
    import argparse
    return argparse.Namespace(
        tokenizer_type=o["type"], tokenizer_model=path(o), vocab_file=None, merge_file=None,
        tokenizer_sentencepiece_legacy=o.get("sentencepiece_legacy", False),
        tokenizer_special_tokens=o.get("special_tokens"), tiktoken_pattern=o.get("pattern"),
        vocab_size=o.get("vocab_size"), tiktoken_num_special_tokens=o.get("num_special", 1000),
        tokenizer_metadata=None, tokenizer_hf_use_fast=True, tokenizer_hf_no_use_fast=False,
        tokenizer_hf_include_special_tokens=True, tokenizer_hf_no_include_special_tokens=False,
        trust_remote_code=False, vocab_extra_ids=0, rank=1, make_vocab_size_divisible_by=128,
        tensor_model_parallel_size=1)


def reference_megatron(o):
    import warnings
    warnings.filterwarnings("ignore")
    from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer
    tok = build_tokenizer(megatron_args(o))
    eod = tok.eod if o.get("append_eod", True) else None
    return tok.tokenize, eod, tok.vocab_size


def reference_library(o):
    """The current classes' encoding, with the library alone."""
    if o["type"] == "TikTokenizer":
        enc, specials, _ = tiktoken_encoding(o, current=True)
        return ((lambda t: enc.encode(t, allowed_special="all")), specials.index("</s>"),
                o.get("vocab_size", 2**17))
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=path(o))
    assert not o.get("sentencepiece_legacy"), "needs megatron-core"
    return sp.encode_as_ids, sp.eos_id(), sp.get_piece_size()


def tiktoken_encoding(o, current):
    import tiktoken
    default = (["<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"] if current
               else ["<unk>", "<s>", "</s>"])
    specials = list(o.get("special_tokens") or default)
    n = o.get("num_special", 1000)
    specials += [f"<SPECIAL_{i}>" for i in range(len(specials), n)]
    vocab = json.load(open(path(o)))[: o.get("vocab_size", 2**17) - n]
    ranks = {base64.b64decode(x["token_bytes"]): x["rank"] + n for x in vocab}
    enc = tiktoken.Encoding(name="test", pat_str=PATTERN_V1 if o.get("pattern") == "v1" else PATTERN_V2,
                            mergeable_ranks=ranks,
                            special_tokens={t: i for i, t in enumerate(specials)})
    return enc, specials, ranks


def reference_legacy(o):
    t = o["type"]
    if t == "TikTokenizer":
        # CustomTikTokenizer: encode_ordinary, eod = "</s>".
        enc, specials, _ = tiktoken_encoding(o, current=False)
        return enc.encode_ordinary, specials.index("</s>"), o["vocab_size"]
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=path(o))
    n = sp.get_piece_size()
    if t == "GPTSentencePieceTokenizer":
        return sp.encode_as_ids, sp.eos_id(), n
    if t == "Llama2Tokenizer":
        return (lambda s: [sp.bos_id()] + sp.encode(s)), sp.eos_id(), n
    # _SentencePieceTokenizer: pieces, then <CLS> <SEP> <EOD> <MASK> and the
    # pad/bos/eos pieces as special tokens; a missing one gets the next id.
    vocab = {sp.id_to_piece(i): i for i in range(n)}
    special = {}

    def piece(i, fallback):
        try:
            return sp.id_to_piece(i)
        except IndexError:
            return fallback

    for tok in ["<CLS>", "<SEP>", "<EOD>", "<MASK>", piece(sp.pad_id(), "<PAD>"),
                piece(sp.bos_id(), "<BOS>"), piece(sp.eos_id(), "<EOS>")]:
        if tok not in vocab:
            vocab[tok] = len(vocab)
        special[tok] = vocab[tok]

    def tokenize(text):
        ids, idx = [], 0
        while True:
            hits = {tok: text[idx:].index(tok) for tok in special if tok in text[idx:]}
            if not hits:
                break
            nxt = min(hits, key=hits.get)
            at = idx + hits[nxt]
            ids += sp.encode_as_ids(text[idx:at]) + [special[nxt]]
            idx = at + len(nxt)
        return ids + sp.encode_as_ids(text[idx:])

    return tokenize, special["<EOD>"], len(vocab)


def have_megatron():
    try:
        import megatron.core.tokenizers  # noqa: F401
        return True
    except Exception:
        return False


def reference(name, use_megatron):
    kind, o = CONFIGS[name]
    if kind == "legacy":
        return reference_legacy(o)
    return reference_megatron(o) if use_megatron else reference_library(o)


def reference_ids(names=None):
    use_megatron = have_megatron()
    texts = corpus()
    out = {}
    for name in names or CONFIGS:
        tokenize, eod, vocab_size = reference(name, use_megatron)
        docs = []
        for t in texts:
            ids = list(tokenize(t))
            if ids and eod is not None:
                ids.append(eod)
            docs.append(ids)
        out[name] = {"vocab_size": vocab_size, "eod": eod, "docs": docs}
    return out


def write_ids(f, ids):
    f.write("{\n")
    for i, (name, r) in enumerate(ids.items()):
        f.write(f'"{name}": {{"vocab_size": {r["vocab_size"]}, "eod": {json.dumps(r["eod"])}, "docs": [\n')
        f.write(",\n".join(json.dumps(d) for d in r["docs"]))
        f.write("\n]}" + (",\n" if i + 1 < len(ids) else "\n"))
    f.write("}\n")


# ---------------------------------------------------------------------------
# Training the tokenizers (build).

TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, hello there! It's a test of the tokenizer; numbers 0 1 2 3 4 5 6 7 8 9.",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.",
    "def main():\n    print('hello')\n    return 0\n",
    "Il était une fois un café où l'on parlait français et español y português.",
    "Der schnelle braune Fuchs springt über den faulen Hund. Größe, Übung, Äpfel.",
    "Привет мир, как дела? Хорошо, спасибо. Москва и Санкт-Петербург.",
    "Γειά σου κόσμε, καλημέρα. Αθήνα.",
    "你好世界，今天天气很好。我们一起学习中文。",
    "日本語の文章です。東京は大きな都市です。ひらがなとカタカナ。",
    "مرحبا بالعالم، كيف حالك؟",
    "नमस्ते, आप कैसे हैं? भारत एक बड़ा देश है।",
    "Emoji 😀 😂 👍 ❤️ 🎉 and symbols © ® ™ € £ ¥.",
    "Whitespace   runs\t\ttabs\n\nand newlines; 2024-01-01 12:34:56; 3.14159 2.71828.",
    "CamelCase snake_case kebab-case UPPER lower MiXeD.",
    "[INST] Answer the question. [/INST] The answer is 42.",
]


def training_lines():
    # Repeats with small variations so both trainers see enough pairs.
    lines = []
    for i in range(60):
        for j, s in enumerate(TRAIN_TEXT):
            lines.append(s if (i + j) % 3 else s.lower() + f" {i * 7 + j}")
    return lines


def build():
    import sentencepiece as spm
    lines = training_lines()
    text_path = os.path.join(HERE, "train.txt.tmp")
    with open(text_path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    common = dict(input=text_path, byte_fallback=True, character_coverage=0.995,
                  num_threads=1, minloglevel=2, seed_sentencepiece_size=20000,
                  shuffle_input_sentence=False, hard_vocab_limit=False)
    # BPE with NFKC normalisation (SentencePiece's default); Unigram as
    # Llama-2's model is set up (no normalisation, whitespace kept, digits split).
    spm.SentencePieceTrainer.train(model_prefix=os.path.join(HERE, "sp_bpe"), model_type="bpe",
                                   vocab_size=700, user_defined_symbols=["<CLS>", "[INST]", "@@"],
                                   **common)
    spm.SentencePieceTrainer.train(model_prefix=os.path.join(HERE, "sp_unigram"),
                                   model_type="unigram", vocab_size=600,
                                   user_defined_symbols=["<mask>"], pad_id=3, unk_id=0, bos_id=1,
                                   eos_id=2, normalization_rule_name="identity",
                                   remove_extra_whitespaces=False, split_digits=True,
                                   allow_whitespace_only_pieces=True, **common)
    spm.SentencePieceTrainer.train(model_prefix=os.path.join(HERE, "sp_nobos"),
                                   model_type="unigram", vocab_size=500, bos_id=-1, pad_id=-1,
                                   unk_id=0, eos_id=1, normalization_rule_name="identity",
                                   **common)
    os.remove(text_path)
    for m in ("sp_bpe", "sp_unigram", "sp_nobos"):
        os.remove(os.path.join(HERE, m + ".vocab"))
    # tiktoken: tiktoken's own educational BPE trainer, with the v2 split.
    from tiktoken._educational import bpe_train
    ranks = bpe_train("\n".join(lines[: len(TRAIN_TEXT) * 8]), 700, PATTERN_V2, visualise=None)
    vocab = [{"rank": r, "token_bytes": base64.b64encode(b).decode(),
              "token_str": b.decode("utf-8", errors="replace")}
             for b, r in sorted(ranks.items(), key=lambda kv: kv[1])]
    with open(os.path.join(HERE, "tiktoken.json"), "w") as f:
        json.dump(vocab, f)
        f.write("\n")
    write_reference()


def write_reference():
    with open(os.path.join(HERE, "reference_ids.json"), "w") as f:
        write_ids(f, reference_ids())


def megatron_dataset(out, names):
    """Writes OUT/NAME_text_document.{bin,idx} as preprocess_data.py does."""
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    for name in names:
        kind, o = CONFIGS[name]
        assert kind == "megatron"
        tokenize, eod, vocab_size = reference_megatron(o)
        prefix = os.path.join(out, name + "_text_document")
        builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(vocab_size))
        for t in corpus():
            ids = list(tokenize(t))
            lens = [len(ids)] if ids else []
            if ids and eod is not None:
                ids.append(eod)
                lens[-1] += 1
            builder.add_document(torch.IntTensor(ids), lens)
        builder.finalize(prefix + ".idx")
        print(f"megatron {name}: {len(corpus())} documents, vocab {vocab_size}, eod {eod}")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "build":
        build()
    elif cmd == "reference":
        write_reference()
    elif cmd == "ids":
        write_ids(sys.stdout, reference_ids(sys.argv[2:]))
    elif cmd == "bigvocab":
        write_big_vocab(sys.argv[2])
    elif cmd == "megatron":
        megatron_dataset(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)
