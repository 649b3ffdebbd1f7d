#!/usr/bin/env python3
"""Makes a Llama-3-style tokenizer.json with HF `tokenizers`, with Llama 3's
vocabulary layout: 128,000 BPE ids, <|begin_of_text|> 128000 (added by the
post-processor), <|end_of_text|> 128001 (the eos_token) and reserved
special tokens up to 128255: 128,256 ids, so its datasets are int32.

The BPE is trained here on a small corpus (Llama 3's split pattern,
ByteLevel without its regex, ignore_merges), 1,000 learned ids; ids up to
127,999 are padding entries that no text reaches. Then, for
llama3-hf-tokenizer.test, it writes the dataset Megatron's preprocess_data.py
would write from JSONL with --append-eod: each document's ids from the
library's encode() (BOS included), EOD after a non-empty one, int32 .bin.

usage: make_llama3_tokenizer.py TRAIN_JSONL OUT_DIR [DATA_JSONL REF_PREFIX]
"""
import json
import os
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BPE_IDS = 128000
TOTAL = 128256


def main():
    train_jsonl, out = sys.argv[1], sys.argv[2]
    texts = [json.loads(line)["text"] for line in open(train_jsonl, encoding="utf-8")]
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([t for t in texts if isinstance(t, str)] * 3, trainers.BpeTrainer(
        vocab_size=1000, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    # Pad the BPE vocabulary to Llama 3's 128,000 ids.
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    n = len(vocab)
    for i in range(n, BPE_IDS):
        vocab["<|padding_%d|>" % i] = i
    tok = Tokenizer.from_str(json.dumps(spec))
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] + [
        "<|reserved_special_token_%d|>" % i for i in range(TOTAL - BPE_IDS - 2)]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=1)
    eod = tok.token_to_id("<|end_of_text|>")
    print("vocab %d eod %d bos %d, %d learned BPE ids" % (tok.get_vocab_size(with_added_tokens=True), eod, bos, n))
    if len(sys.argv) > 3:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "dataset", "Inputs"))
        from make_dataset import write
        docs = []
        for line in open(sys.argv[3], encoding="utf-8"):
            ids = tok.encode(json.loads(line)["text"]).ids
            docs.append([ids + [eod]] if ids else [])
        write(sys.argv[4], "int32", docs)


if __name__ == "__main__":
    main()
