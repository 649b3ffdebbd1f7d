#!/usr/bin/env python3
"""Writes a small GPT-2-style byte-level vocabulary for tests: DIR/vocab.json, DIR/merges.txt.

Ids 0..255 are the bytes (id = byte value) spelled in GPT-2's bytes_to_unicode
alphabet; merges "h e", "l l", "he ll" give ids 256, 257, 258; <|endoftext|> is 259.
"""
import json
import os
import sys


def byte_symbol(b):
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    if b in printable:
        return chr(b)
    return chr(256 + sorted(set(range(256)) - set(printable)).index(b))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    vocab = {byte_symbol(b): b for b in range(256)}
    vocab.update({"he": 256, "ll": 257, "hell": 258, "<|endoftext|>": 259})
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\nh e\nl l\nhe ll\n")


if __name__ == "__main__":
    main()
