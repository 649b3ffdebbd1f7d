#!/usr/bin/env python3
"""Trains small tokenizers with HF `tokenizers` in the forms real models use,
and writes the ids the library gives on a multilingual corpus, so that
mt-preprocess --tokenizer-type HuggingFaceTokenizer is checked against the
real library (hf-tokenizers.test reads the stored files; hf-tokenizers-live.test
regenerates the ids with the library on the stored tokenizers).

usage:
  make_hf_tokenizers.py train TRAIN_JSONL OUT_DIR   # tokenizers + corpus + ids
  make_hf_tokenizers.py ids CORPUS_JSONL CORPUS_INVALID_TXT OUT_DIR TOKENIZER_DIR...
                               # ids only, from stored files: OUT_DIR/NAME.txt
  make_hf_tokenizers.py fuzz SEED N OUT_JSONL       # N random documents
  make_hf_tokenizers.py behaviors OUT_DIR           # tokenizers for each split
      behaviour, Metaspace scheme, normalizer and added-token option, random
      texts (OUT_DIR/input.jsonl) and the library's ids (OUT_DIR/NAME/expected.txt)
  make_hf_tokenizers.py precompiled SP_MODEL OUT_DIR
      OUT_DIR/tokenizer.json: the unigram tokenizer here behind T5's
      normalizer, Precompiled with the precompiled_charsmap (nmt_nfkc) of a
      SentencePiece model, and T5's pre-tokenizer; standard library only
  make_hf_tokenizers.py unicode OUT_DIR             # tokenizers that show one
      normalizer's output or one pre-tokenizer's splits, texts over most of
      Unicode, and the library's ids on them (OUT_DIR/NAME/expected.txt)

The ids of a document are what transformers' tokenizer(text).input_ids gives
(Megatron's HuggingFaceTokenizer.tokenize with include_special_tokens): HF's
encode(text, add_special_tokens=True). Text with invalid UTF-8 cannot reach
a Python tokenizer; it is decoded as bytes.decode("utf-8", "replace") first,
which is what mt does with it (docs/data.md).

Each expected file: a line "vocab V eod E" (get_vocab_size(with_added_tokens),
the eos_token's id), then one line of ids per document.
"""
import json
import os
import sys

if sys.argv[1:2] != ["precompiled"]:  # the one command without the library
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors, trainers)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2-style: possessive quantifiers.
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# The corpus: scripts, emoji, whitespace and digit runs, special-token text
# (exact, inside words, with spaces around), and edge cases.
EXTRA = [
    "New York and new york, NEW YORK!", "1234567 ²³ ½ 42°", "title: >>TITLE<< x",
    "", " ", "  ", "\n", "\t\t x", "a", "Hello world", " Hello world", "hello   world  ",
    "<|begin_of_text|>Hello<|end_of_text|>", "x<|end_of_text|>y", " <|end_of_text|> ",
    "<s>hello</s>", "<s> hello </s>", "text </s> more", "<unk>", "<0x41>", "[MASK] me",
    "new line\nand\r\nwindows\r\n\n\n", "tabs\tand\u00a0nbsp\u3000ideographic",
    "1234567890 12 345 6789", "3.14159 and 2,718,281", "٠١٢٣٤٥ ๑๒๓ ⅧⅫ ½ ²",
    "Grüße aus Köln, naïve café", "ＡＢＣ ｆｕｌｌｗｉｄｔｈ ①②", "ﬁ ﬂ ligatures Å Å",
    "Привет, мир! Съешь же ещё этих мягких французских булок",
    "Γειά σου Κόσμε ΣΊΣΥΦΟΣ", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
    "こんにちは世界、東京タワー", "你好，世界！我们的模型", "안녕하세요 세계",
    "สวัสดีชาวโลก", "ሰላም ለዓለም", "Emoji 😀😃🤖 👩‍👩‍👧‍👦 🇩🇪 ❤️",
    "mixed日本語and English123abc", "CamelCaseWords and snake_case_words",
    "DON'T YOU'LL we've I'M", "URL https://example.com/a?b=c&d=e#f",
    "code: def f(x):\n    return x**2  # comment", "    indented\n        more",
    "İstanbul ǅ ß ẞ", "a\u0301 e\u0301 combining", "zero\u200bwidth\u200djoiner",
    "!!!??? ... --- ***", "x" * 300, "ab" * 150, " " * 40 + "end",
]
INVALID = [
    b"abc\xffdef", b"\xc3(", b"\xe2\x82 euro cut", b"\xf0\x9f\x98 cut emoji",
    b"\xed\xa0\x80 surrogate", b"\xc0\xaf overlong", b"tail \xe2", b"\x80\x80\x80",
    "ok ünïcödé".encode() + b"\xfe\xff",
]


def write_corpus(train_jsonl, out):
    texts = [json.loads(line)["text"] for line in open(train_jsonl, encoding="utf-8")
             if '"text"' in line]
    corpus = EXTRA + texts[::4]
    with open(os.path.join(out, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for t in corpus:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    with open(os.path.join(out, "corpus_invalid.txt"), "wb") as f:
        for b in INVALID:
            assert b"\n" not in b
            f.write(b + b"\n")
    return texts


def save(tok, out, name, config, edit=None):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.json")
    tok.save(path)
    if edit:
        j = json.load(open(path, encoding="utf-8"))
        edit(j)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, indent=1)
        Tokenizer.from_file(path)  # the library still reads it
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)


def with_byte_pieces(j, first_id):
    """Puts <0x00>..<0xFF> into a BPE vocabulary at ids first_id.. (as
    Llama-2's tokenizer.json has them), moving the trained tokens up."""
    vocab = j["model"]["vocab"]
    shifted = {t: (i if i < first_id else i + 256) for t, i in vocab.items()}
    for b in range(256):
        shifted["<0x%02X>" % b] = first_id + b
    j["model"]["vocab"] = shifted
    for a in j["added_tokens"]:
        if a["id"] >= first_id:
            a["id"] += 256
    pp = j.get("post_processor")
    if pp and pp["type"] == "TemplateProcessing":
        for v in pp["special_tokens"].values():
            v["ids"] = [shifted[t] for t in v["tokens"]]


def train(train_jsonl, out):
    texts = write_corpus(train_jsonl, out)
    data = texts + EXTRA

    # 1. Llama-3 form: Split with Llama-3's pattern, ByteLevel without its
    # regex, ignore_merges, <|begin_of_text|> by TemplateProcessing.
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(data, trainers.BpeTrainer(
        vocab_size=1200, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|begin_of_text|>", "<|end_of_text|>"]))
    tok.add_special_tokens([AddedToken("<|eot_id|>", special=True, normalized=False)])
    tok.add_tokens([AddedToken(" world", normalized=True), AddedToken("[MASK]", lstrip=True, rstrip=True),
                    AddedToken("code", single_word=True)])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                      special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])])
    save(tok, out, "llama3", {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                              "tokenizer_class": "PreTrainedTokenizerFast"})

    # 2. GPT-2 form: ByteLevel with its own regex; merges written as "a b"
    # strings (tokenizers before 0.20 wrote them so); no BOS.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(data, trainers.BpeTrainer(
        vocab_size=900, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]))
    tok.post_processor = processors.ByteLevel(trim_offsets=False)

    def string_merges(j):
        j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    save(tok, out, "gpt2", {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                            "tokenizer_class": "GPT2Tokenizer"}, string_merges)

    # 3. Qwen-style: possessive-free pattern variant with single digits,
    # add_prefix_space ByteLevel, NFC.
    tok = Tokenizer(models.BPE(ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN.replace("\\s+(?!\\S)", "\\s++(?!\\S)")), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(data, trainers.BpeTrainer(
        vocab_size=700, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>", "<|im_start|>"]))
    save(tok, out, "qwen", {"eos_token": "<|endoftext|>", "tokenizer_class": "Qwen2Tokenizer"})

    # 4. SentencePiece-style BPE (Llama-2 / Mistral tokenizer.json): Prepend
    # and Replace normalizers, no pre-tokenizer, byte_fallback with <0xNN>
    # pieces, fuse_unk, <s> by TemplateProcessing; limit_alphabet leaves rare
    # characters to the byte pieces.
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(data, trainers.BpeTrainer(
        vocab_size=900, min_frequency=2, show_progress=False, limit_alphabet=120,
        special_tokens=["<unk>", "<s>", "</s>"]))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                       special_tokens=[("<s>", 1)])
    save(tok, out, "llama2", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                              "tokenizer_class": "PreTrainedTokenizerFast"},
         lambda j: with_byte_pieces(j, 3))

    # 5. The same model behind Metaspace (prepend_scheme first, no split),
    # as newer Llama/Mistral files have it, with <s> and </s> around.
    def metaspace(j):
        with_byte_pieces(j, 3)
        j["normalizer"] = None
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                              "split": False}
        j["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                               "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}}
    save(tok, out, "mistral", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, metaspace)

    # 6. Unigram with byte fallback: NFKC + Lowercase, Digits then Metaspace
    # (always, split); <s> ... </s>.
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)])
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(data, trainers.UnigramTrainer(
        vocab_size=1500, show_progress=False, unk_token="<unk>", special_tokens=["<unk>", "<s>", "</s>"],
        max_piece_length=8))

    def unigram_bytes(j):
        vocab = j["model"]["vocab"]
        low = min(s for _, s in vocab)
        vocab.extend([["<0x%02X>" % b, low - 1.0] for b in range(256)])
        j["model"]["byte_fallback"] = True
        j["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                               "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}}
    save(tok, out, "unigram", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, unigram_bytes)

    # 7. Unigram without byte fallback, unknown characters fused into <unk>;
    # Whitespace pre-tokenizer, NFD + StripAccents, Strip.
    def plain_unigram(j):
        j["model"]["byte_fallback"] = False
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Strip", "strip_left": True, "strip_right": True}, {"type": "NFD"}, {"type": "StripAccents"}]}
        j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Whitespace"}, {"type": "Punctuation", "behavior": "Isolated"}]}
        j["post_processor"] = None
    save(tok, out, "unigram-unk", {"eos_token": "</s>"}, plain_unigram)

    # 8. Falcon form: ByteLevel in the middle of the sequence, so Digits and
    # a Split see its byte alphabet; Punctuation contiguous before it.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Punctuation(behavior="contiguous"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.Split(Regex("[0-9][0-9][0-9]"), behavior="isolated", invert=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(data, trainers.BpeTrainer(
        vocab_size=800, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[">>TITLE<<", "<|endoftext|>"]))
    save(tok, out, "falcon", {"eos_token": "<|endoftext|>"})

    # 9. WordLevel, Lowercase + WhitespaceSplit, a normalized added token
    # matched on the lowercased text, [CLS] A [SEP] by BertProcessing.
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.train_from_iterator(data, trainers.WordLevelTrainer(
        vocab_size=1500, min_frequency=2, show_progress=False, special_tokens=["[UNK]", "[CLS]", "[SEP]"]))
    tok.add_tokens([AddedToken("New York", normalized=True), AddedToken("[SEP]", special=True)])
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    save(tok, out, "wordlevel", {"eos_token": "[SEP]", "cls_token": "[CLS]"})

    # 10. BERT form: BertNormalizer (lowercase, accents stripped, CJK spaced,
    # control characters out), BertPreTokenizer, WordPiece, [CLS] A [SEP].
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=20))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(data, trainers.WordPieceTrainer(
        vocab_size=1500, min_frequency=2, show_progress=False,
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    save(tok, out, "bert", {"eos_token": "[SEP]", "cls_token": "[CLS]", "unk_token": "[UNK]",
                            "mask_token": "[MASK]", "pad_token": "[PAD]"})

    for name in NAMES:
        ids(os.path.join(out, name), os.path.join(out, "corpus.jsonl"),
            os.path.join(out, "corpus_invalid.txt"), os.path.join(out, name, "expected.txt"))
    # expected.txt is the file of the tests; the ids command writes NAME.txt


NAMES = ["llama3", "gpt2", "qwen", "llama2", "mistral", "unigram", "unigram-unk", "falcon", "wordlevel", "bert"]


def ids(tok_dir, corpus, invalid, out):
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    config = json.load(open(os.path.join(tok_dir, "tokenizer_config.json"), encoding="utf-8"))
    eod = tok.token_to_id(config["eos_token"])
    texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
    texts += [b.decode("utf-8", "replace") for b in open(invalid, "rb").read().split(b"\n")[:-1]]
    with open(out, "w") as f:
        f.write("vocab %d eod %d\n" % (tok.get_vocab_size(with_added_tokens=True), eod))
        for t in texts:
            f.write(" ".join(map(str, tok.encode(t, add_special_tokens=True).ids)) + "\n")


FUZZ_PIECES = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<s>", "</s>", "<unk>", "[MASK]",
               " world", "code", "<0x41>", " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2581",
               "'s", "'LL", "123", "4567", "\u0663", "\u00bd", "\u00e9", "e\u0301", "\u00c5", "\ufb01",
               "\uff21\uff22", "\u0130", "\u00df", "\u03a3", "\u03c2", "\u65e5\u672c", "\U0001f600",
               "\U0001f469\u200d\U0001f469\u200d\U0001f467", "abc", "Hello", "WORLD", "_", "-", "...",
               "!?", "$", "(", ")", "{", "x"]


def fuzz(seed, n, out):
    """Random documents: pieces that matter to the tokenizers here (special
    and added tokens, spaces, digits, case, combining marks, emoji) mixed
    with random code points of every plane and random ASCII words."""
    import random
    rng = random.Random(seed)
    with open(out, "w", encoding="utf-8") as f:
        for _ in range(n):
            parts = []
            for _ in range(rng.randint(0, 30)):
                r = rng.random()
                if r < 0.5:
                    parts.append(rng.choice(FUZZ_PIECES))
                elif r < 0.8:
                    lo, hi = rng.choice([(0x20, 0x7e), (0xa0, 0x2fff), (0x3000, 0xffef), (0x10000, 0x1faff)])
                    c = rng.randint(lo, hi)
                    if not 0xd800 <= c <= 0xdfff:
                        parts.append(chr(c))
                else:
                    parts.append("".join(rng.choice("abcdefghij ") for _ in range(rng.randint(1, 12))))
            f.write(json.dumps({"text": "".join(parts)}, ensure_ascii=False) + "\n")


UNICODE_NAMES = ["NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents", "Nmt", "BertClean", "BertAccents",
                 "Digits", "Punctuation", "WhitespaceSplit", "Whitespace", "BertPreTokenizer"]
BERT_NORMALIZERS = {
    "BertClean": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": False,
                  "strip_accents": False, "lowercase": False},
    "BertAccents": {"type": "BertNormalizer", "clean_text": False, "handle_chinese_chars": True,
                    "strip_accents": None, "lowercase": True}}


def unicode_probe(out):
    """Each normalizer alone before a byte-level BPE without merges (its ids
    are the normalized bytes), and each character-class pre-tokenizer alone
    before a BPE that knows only "x" and fuses unknown characters (its ids
    count the pieces, with "x" between the characters); over every code
    point outside the big CJK, Hangul, Tangut, private-use and unassigned
    blocks, 64 to a line."""
    skip = [(0x3400, 0x4dbf), (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0xd800, 0xdfff), (0xe000, 0xf8ff),
            (0x17000, 0x18aff), (0x20000, 0x3ffff), (0x40000, 0x10ffff)]
    chars = [chr(c) for c in range(0x80, 0x40000) if not any(a <= c <= b for a, b in skip)
             and c not in (0x85, 0x2028, 0x2029)]  # line breaks would split the lines
    lines = ["".join(chars[i:i + 64]) for i in range(0, len(chars), 64)]
    xlines = ["x" + "x".join(chars[i:i + 64]) + "x" for i in range(0, len(chars), 64)]
    bs = list(range(0x21, 0x7f)) + list(range(0xa1, 0xad)) + list(range(0xae, 0x100))
    cs = bs[:]
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + len(cs) - 188)
    byte_vocab = {chr(c): i for i, c in enumerate(cs)}
    for name in UNICODE_NAMES:
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        if name in UNICODE_NAMES[:9]:
            j = {"normalizer": BERT_NORMALIZERS.get(name, {"type": name}),
                 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                   "use_regex": False},
                 "model": {"type": "BPE", "vocab": byte_vocab, "merges": []}}
            eos, texts = "a", lines
        else:
            pre = {"type": name}
            if name == "Digits":
                pre["individual_digits"] = True
            j = {"normalizer": None, "pre_tokenizer": pre,
                 "model": {"type": "BPE", "vocab": {"<unk>": 0, "x": 1}, "merges": [], "unk_token": "<unk>",
                           "fuse_unk": True}}
            eos, texts = "<unk>", xlines
        j.update({"version": "1.0", "added_tokens": [], "post_processor": None, "decoder": None})
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"eos_token": eos}, f)
        with open(os.path.join(d, "input.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(texts) + "\n")
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "expected.txt"), "w") as f:
            f.write("vocab %d eod %d\n" % (tok.get_vocab_size(with_added_tokens=True), tok.token_to_id(eos)))
            for e in tok.encode_batch(texts):
                f.write(" ".join(map(str, e.ids)) + "\n")


def behaviors(out):
    """Small tokenizers written as JSON, each trying one option, with a BPE
    that shows where pre-tokens end: every ASCII character has a token and
    a "</w>" token (end_of_word_suffix) or a "##" one (continuing prefix),
    plus a few merges; random texts of letters, digits, punctuation and
    spaces."""
    import random
    rng = random.Random(7)
    ascii_chars = [chr(c) for c in range(0x20, 0x7f)]

    def model(kind="suffix"):
        vocab = {"<unk>": 0}
        for c in ascii_chars:
            vocab[c] = len(vocab)
            vocab[c + "</w>" if kind == "suffix" else "##" + c] = len(vocab)
        if kind == "suffix":
            merges = [["t", "h"], ["th", "e</w>"], ["a", "b"], ["ab", "c</w>"], ["1", "2</w>"]]
        else:
            merges = [["t", "##h"], ["th", "##e"], ["a", "##b"], ["ab", "##c"], ["1", "##2"]]
        for a, b in merges:
            vocab[a + (b[2:] if b.startswith("##") else b)] = len(vocab)
        m = {"type": "BPE", "vocab": vocab, "merges": merges, "unk_token": "<unk>", "fuse_unk": False}
        if kind == "suffix":
            m["end_of_word_suffix"] = "</w>"
        else:
            m["continuing_subword_prefix"] = "##"
        return m

    configs = {}
    for b in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for invert in [False, True]:
            configs["split-%s%s" % (b, "-invert" if invert else "")] = (
                None, {"type": "Split", "pattern": {"Regex": "\\s+|[0-9]"}, "behavior": b, "invert": invert}, [])
    configs["split-empty-matches"] = (None, {"type": "Split", "pattern": {"Regex": "a*"},
                                             "behavior": "MergedWithNext", "invert": False}, [])
    configs["split-string"] = (None, {"type": "Split", "pattern": {"String": "ab"},
                                      "behavior": "MergedWithPrevious", "invert": False}, [])
    for scheme in ["always", "first", "never"]:
        for split in [True, False]:
            configs["metaspace-%s%s" % (scheme, "-split" if split else "")] = (
                None, {"type": "Metaspace", "replacement": "_", "prepend_scheme": scheme, "split": split},
                [{"content": "[x]", "normalized": False, "special": True}])
    configs["digits-punctuation"] = (None, {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, {"type": "Digits", "individual_digits": False},
        {"type": "Punctuation", "behavior": "MergedWithNext"}]}, [])
    configs["bytelevel-prefix-space"] = (None, {"type": "Sequence", "pretokenizers": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "Split", "pattern": {"String": "\u0120"}, "behavior": "Removed", "invert": False}]}, [])
    configs["strip-replace"] = ({"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": True, "strip_right": False},
        {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}, {"type": "Lowercase"}]},
        {"type": "Metaspace", "replacement": "_", "prepend_scheme": "first", "split": True}, [])
    configs["prepend-added"] = ({"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "_"}, {"type": "Replace", "pattern": {"String": " "}, "content": "_"}]},
        None, [{"content": "the", "normalized": True, "lstrip": True},
               {"content": "AB", "normalized": False, "rstrip": True},
               {"content": "c", "normalized": False, "single_word": True}])
    configs["prefix-model"] = (None, {"type": "WhitespaceSplit"}, [])
    configs["nmt"] = ({"type": "Nmt"}, {"type": "Metaspace", "replacement": "_", "prepend_scheme": "first",
                                        "split": True}, [])

    texts = []
    words = ["the", "abc", "ab", "a", "12", "1", "th", "AB", "c", "x", "[x]", "_", ".",
             "\x01", "\x0b", "\x0c", "\x1f", "\x7f", "\x8f", "\u200b", "\ufeff", "\u2581"]
    for _ in range(600):
        parts = []
        for _ in range(rng.randint(0, 12)):
            r = rng.random()
            parts.append(rng.choice(words) if r < 0.5 else rng.choice(["", " ", "  ", "\t", " \n "])
                         if r < 0.8 else rng.choice(ascii_chars))
        texts.append("".join(parts))
    with open(os.path.join(out, "input.jsonl"), "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    for name, (norm, pre, added) in configs.items():
        m = model("prefix" if name == "prefix-model" else "suffix")
        vocab_size = len(m["vocab"])
        added_tokens = []
        for a in added:
            tok = {"id": vocab_size + len(added_tokens), "single_word": False, "lstrip": False, "rstrip": False,
                   "normalized": True, "special": False}
            tok.update(a)
            added_tokens.append(tok)
        j = {"version": "1.0", "added_tokens": added_tokens, "normalizer": norm, "pre_tokenizer": pre,
             "post_processor": None, "decoder": None, "model": m}
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"eos_token": "<unk>"}, f)
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "expected.txt"), "w") as f:
            f.write("vocab %d eod 0\n" % tok.get_vocab_size(with_added_tokens=True))
            for e in tok.encode_batch(texts):
                f.write(" ".join(map(str, e.ids)) + "\n")
    with open(os.path.join(out, "names.txt"), "w") as f:
        f.write("\n".join(configs) + "\n")


def sp_charsmap(model_path):
    """normalizer_spec.precompiled_charsmap (ModelProto field 3, its field
    2) of a SentencePiece .model, read from the protobuf wire format."""
    def varint(b, i):
        r, shift = 0, 0
        while True:
            c = b[i]
            i += 1
            r |= (c & 0x7F) << shift
            shift += 7
            if c < 0x80:
                return r, i

    def fields(b):
        i = 0
        while i < len(b):
            key, i = varint(b, i)
            kind = key & 7
            if kind == 0:
                v, i = varint(b, i)
            elif kind == 2:
                n, i = varint(b, i)
                v, i = b[i:i + n], i + n
            elif kind == 5:
                v, i = b[i:i + 4], i + 4
            elif kind == 1:
                v, i = b[i:i + 8], i + 8
            else:
                raise ValueError("unexpected wire type %d" % kind)
            yield key >> 3, v

    for f, v in fields(open(model_path, "rb").read()):
        if f == 3:
            for f2, v2 in fields(v):
                if f2 == 2:
                    return v2
    raise ValueError("%s has no precompiled_charsmap" % model_path)


def precompiled(sp_model, out):
    import base64
    here = os.path.dirname(os.path.abspath(__file__))
    j = json.load(open(os.path.join(here, "unigram", "tokenizer.json"), encoding="utf-8"))
    j["normalizer"] = {"type": "Precompiled",
                       "precompiled_charsmap": base64.b64encode(sp_charsmap(sp_model)).decode()}
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                                      "split": True}]}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "</s>", "unk_token": "<unk>"}, f)


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "fuzz":
        fuzz(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    elif sys.argv[1] == "precompiled":
        precompiled(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "behaviors":
        behaviors(sys.argv[2])
    elif sys.argv[1] == "unicode":
        unicode_probe(sys.argv[2])
    else:
        corpus, invalid, out_dir = sys.argv[2:5]
        for d in sys.argv[5:]:
            ids(d, corpus, invalid, os.path.join(out_dir, os.path.basename(d.rstrip("/")) + ".txt"))
