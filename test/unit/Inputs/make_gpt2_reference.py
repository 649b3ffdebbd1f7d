#!/usr/bin/env python3
"""Writes gpt2_reference.jsonl: varied texts and the ids HF tokenizers gives
them with GPT-2's vocab.json and merges.txt. Gpt2TokenizerTest compares mt's
encoder against it.

The committed file was generated with tokenizers 0.23.3 (Python 3.11) by

    python3 make_gpt2_reference.py /work/shared/data/gpt2 gpt2_reference.jsonl

Its first line records the generator; every other line is
{"text": "...", "ids": [...]}. The texts are deterministic (seeded), so a
rerun with the same tokenizers version gives the same file. --records and
--seed make larger or different sets for one-off checks.

Texts: English-like prose from a word list (contractions, punctuation, space
runs), code, numbers, many scripts, emoji sequences, unusual whitespace,
letters from scripts new in Unicode 15/16, random code points, and the tricky
cases of the unit test. HF takes Python strings, so there is no invalid UTF-8
here; the unit test covers that by round trip.
"""
import argparse
import json
import os
import random
import sys

WORDS = """the of and to a in is it you that he was for on are with as I his they be
at one have this from or had by hot word but what some we can out other were all there
when up use your how said an each she which do their time if will way about many then
them write would like so these her long make thing see him two has look more day could
go come did number sound no most people my over know water than call first who may down
side been now find any new work part take get place made live where after back little
only round man year came show every good me give our under name very through just form
sentence great think say help low line differ turn cause much mean before move right boy
old too same tell does set three want air well also play small end put home read hand
port large spell add even land here must big high such follow act why ask men change went
light kind off need house picture try us again animal point mother world near build self
earth father head stand own page should country found answer school grow study still learn
plant cover food sun four between state keep eye never last let thought city tree cross
farm hard start might story saw far sea draw left late run while press close night real
life few north open seem together next white children begin got walk example ease paper
group always music those both mark often letter until mile river car feet care second book
carry took science eat room friend began idea fish mountain stop once base hear horse cut
sure watch color face wood main enough plain girl usual young ready above ever red list
though feel talk bird soon body dog family direct pose leave song measure door product
black short numeral class wind question happen complete ship area half rock order fire
south problem piece told knew pass since top whole king space heard best hour better true
during hundred five remember step early hold west ground interest reach fast verb sing
listen six table travel less morning ten simple several vowel toward war lay against
pattern slow center love person money serve appear road map rain rule govern pull cold
notice voice unit power town fine certain fly fall lead cry dark machine note wait plan
figure star box noun field rest correct able pound done beauty drive stood contain front
teach week final gave green oh quick develop ocean warm free minute strong special mind
behind clear tail produce fact street inch multiply nothing course stay wheel full force
blue object decide surface deep moon island foot system busy test record boat common gold
possible plane stead dry wonder laugh thousand ago ran check game shape equate miss
brought heat snow tire bring yes distant fill east paint language among tokenizer GPU
Megatron transformer gradient parallelism NVIDIA checkpoint""".split()

CONTRACTIONS = ["don't", "it's", "I'm", "we'll", "they're", "you've", "he'd", "can't",
                "won't", "isn't", "I'd", "she'll", "we've", "that's", "DON'T", "It'S",
                "o'clock", "rock'n'roll", "'90s", "y'all"]

PHRASES = [
    "Voilà, un café crème à côté de l'hôtel — très bien !",
    "Größenordnung: Straße, Mädchen, Übermut; ß ẞ",
    "¿Dónde está la niña? ¡Olé! Año, señor.",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Ελληνικά: Γειά σου Κόσμε, αβγδεζηθ ΑΒΓΔ.",
    "中文文本：你好，世界！我们在测试分词器。",
    "日本語のテキスト、カタカナとひらがな。ｶﾀｶﾅ、ー〜。",
    "한국어 텍스트: 안녕하세요, 세계!",
    "مرحبا بالعالم، هذا اختبار. ١٢٣٤٥٦٧٨٩٠",
    "שלום עולם, זה מבחן.",
    "नमस्ते दुनिया, यह एक परीक्षण है। १२३",
    "สวัสดีชาวโลก นี่คือการทดสอบ",
    "Tiếng Việt: Xin chào thế giới, đây là bài kiểm tra.",
    "Türkçe: İstanbul'da ılık bir gün; ğüşiöç.",
    "Zalgo: Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǵ̨̪o̶",
    "combining: e\u0301 a\u0300 n\u0303 o\u0308\u0304",
    "math: ∀x∈ℝ, ∑ᵢ xᵢ² ≤ ∞; ∫₀¹ f(x) dx ≈ π/4 ± ε",
    "box: ┌──┬──┐ │░▒▓│ └──┴──┘",
    "fullwidth: ＡＢＣ１２３！？",
    "roman: Ⅻ Ⅸ ⅷ, fractions ½ ¾ ⅓, superscripts x² y³",
    "emoji: 😀😃😄 👍🏽👋🏿 👨‍👩‍👧‍👦 🏳️‍🌈 🇩🇪🇯🇵 1️⃣ #️⃣ ❤️",
    "symbols: ©®™ § ¶ † ‡ • … ‰ ′ ″ € £ ¥ ₹ ₿",
    "new scripts: 𑼄𑼅𑼆 𞓐𞓑𞓒 𐵊𐵋𐵌 𞓰𞓱 𑯀𑯁 𖄀𖄁",
    "odd space:\u00a0a\u2003b\u3000c\u2028d\u2029e\x0bf\x0cg\x85h\u180ei\u200bj\u2060k",
    "controls: \x00\x01\x1b[0m\x7f\x1c\x1d\x1e\x1f end",
    "<|endoftext|> in text, <|endoftext|>twice<|endoftext|>",
]

TRICKY = [
    "Hello world", " Hello world", "<|endoftext|>", "hello   world", "don't", "I'll",
    "they're", "'s start", "It's", "DON'T", "we've I'm he'd you'll", "'", "''s", " 's",
    "a  b", "x\n", "a\n\n b", "end   ", "\t", "a\tb", "\r\n", "line1\r\nline2", "   ", " ",
    "  a", "\n\n\n", "a  !", "  \n  x", "a \n", "a\u00a0b", "a \u3000b", "x\u2028y",
    "a\u180e b", "2024", " 3.14", "12345 apples", "abc123def", "$100", "-5", "a 1",
    "Hello!!! ...?", "foo()->bar", "x = y;", "a\x00b", "hi 😀😀!", "😀 👍🏽 🇩🇪",
    "Привет мир", "日本語テキスト", "مرحبا بالعالم", "naïve", "nai\u0308ve", "𑼄𑼅",
    "", "a" * 300, " " * 100 + "x", "!" * 200, "1" * 120, "-" * 80 + "\n",
]


def prose(rng):
    out = []
    for _ in range(rng.randint(1, 6)):
        n = rng.randint(3, 18)
        words = []
        for i in range(n):
            r = rng.random()
            if r < 0.06:
                w = rng.choice(CONTRACTIONS)
            elif r < 0.10:
                w = str(rng.choice([rng.randint(0, 100), rng.randint(1900, 2030),
                                    round(rng.uniform(0, 1000), rng.randint(1, 3))]))
            else:
                w = rng.choice(WORDS)
            if i == 0:
                w = w[:1].upper() + w[1:]
            if rng.random() < 0.08:
                w += rng.choice([",", ";", ":", " -", " —"])
            if rng.random() < 0.03:
                w = rng.choice(['"%s"', "(%s)", "'%s'", "[%s]", "*%s*", "`%s`"]) % w
            words.append(w)
        sent = " ".join(words) + rng.choice([".", ".", ".", "?", "!", "...", "?!", ""])
        out.append(sent)
        out.append(rng.choice([" ", " ", "  ", "\n", "\n\n", " \n", "   \n\n"]))
    return "".join(out)


def code(rng):
    name = rng.choice(WORDS).lower() + "_" + rng.choice(WORDS).lower()
    arg = rng.choice(WORDS).lower()
    n = rng.randint(0, 999)
    style = rng.randrange(4)
    if style == 0:
        return (f"def {name}({arg}, n={n}):\n    \"\"\"Return the {arg}.\"\"\"\n"
                f"    if {arg} is None:\n        return []\n"
                f"    return [x ** 2 for x in range(n) if x % 3 == 0]  # squares\n")
    if style == 1:
        return (f"int {name}(const char *{arg}, size_t n) {{\n\tfor (size_t i = 0; i < n; ++i) {{\n"
                f"\t\tif ({arg}[i] == '\\n') return -{n};\n\t}}\n\treturn 0x{n:04x};\n}}\n")
    if style == 2:
        return (f'{{"{name}": [{n}, {n / 7:.4f}, null, true], "{arg}": "v{n}\\t"}}\n'
                f"<div class=\"{arg}\">&nbsp;{name}&amp;</div>\n")
    return (f"$ ./{name} --{arg}={n} 2>&1 | grep -E '^[a-z]+$' >> /tmp/{arg}.log\n"
            f"https://example.com/{arg}?q={n}&lang=en#{name} user.{arg}@example.org\n")


def numbers(rng):
    parts = [
        f"{rng.randint(0, 10**9):,}", f"{rng.uniform(-1e6, 1e6):.6f}", f"{rng.random():.3e}",
        f"{rng.randint(1, 12):02d}/{rng.randint(1, 28):02d}/{rng.randint(1950, 2050)}",
        f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}",
        f"{rng.randint(0, 100)}%", f"+1 ({rng.randint(200, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
        f"0x{rng.getrandbits(32):08X}", str(rng.getrandbits(128)), f"v{rng.randint(0, 9)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}",
        f"{rng.randint(1, 99)}th", f"${rng.randint(0, 9999)}.{rng.randint(0, 99):02d}",
    ]
    rng.shuffle(parts)
    return " ".join(parts[: rng.randint(3, len(parts))]) + rng.choice(["", "\n", " "])


SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2028", "\x0b", "\x0c", "\x85",
          "\u180e", "\u2003", "    ", "\t\t", " \n", "\n "]


def whitespace(rng):
    out = []
    for _ in range(rng.randint(4, 24)):
        out.append(rng.choice(SPACES) * rng.randint(1, 3))
        if rng.random() < 0.7:
            out.append(rng.choice(WORDS + ["1", "42", "!", "'s", "...", "é", "中"]))
    return "".join(out)


def unicode_text(rng):
    return rng.choice(PHRASES) + rng.choice(["", " ", "\n", " " + rng.choice(WORDS)])


RANGES = [(0x20, 0x7E, 6), (0xA0, 0x24F, 3), (0x370, 0x52F, 2), (0x590, 0x6FF, 2),
          (0x900, 0xDFF, 2), (0x1100, 0x11FF, 1), (0x2000, 0x2BFF, 2), (0x3000, 0x30FF, 2),
          (0x4E00, 0x9FFF, 2), (0xAC00, 0xD7A3, 1), (0xE000, 0xF8FF, 1), (0xFB00, 0xFFFD, 1),
          (0x10000, 0x1FFFF, 2), (0x20000, 0x3134F, 1), (0xE0000, 0xE01EF, 1)]


def random_codepoints(rng):
    weights = [w for _, _, w in RANGES]
    out = []
    for _ in range(rng.randint(1, 40)):
        lo, hi, _ = rng.choices(RANGES, weights)[0]
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def texts(records, seed):
    rng = random.Random(seed)
    yield from TRICKY
    makers = [prose] * 6 + [code] * 2 + [numbers, whitespace, unicode_text, random_codepoints]
    for _ in range(records):
        yield rng.choice(makers)(rng)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gpt2_dir", help="folder with GPT-2's vocab.json and merges.txt")
    ap.add_argument("out")
    ap.add_argument("--records", type=int, default=420)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    import tokenizers
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer(os.path.join(args.gpt2_dir, "vocab.json"),
                                os.path.join(args.gpt2_dir, "merges.txt"))
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        meta = {"generator": f"tokenizers {tokenizers.__version__}, ByteLevelBPETokenizer "
                             f"(add_prefix_space=False); make_gpt2_reference.py --seed {args.seed} "
                             f"--records {args.records}"}
        f.write(json.dumps(meta) + "\n")
        count = size = 0
        for text in texts(args.records, args.seed):
            ids = tok.encode(text).ids
            f.write(json.dumps({"text": text, "ids": ids}, ensure_ascii=False,
                               separators=(",", ":")) + "\n")
            count += 1
            size += len(text.encode("utf-8"))
    print(f"{args.out}: {count} texts, {size} bytes of UTF-8, tokenizers {tokenizers.__version__}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
