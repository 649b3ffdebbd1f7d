// NullTokenizer: text of token ids in, the ids out, as Megatron-LM's
// NullTokenizer.text_to_ids does it: [int(x) for x in text.split(' ')].
//
// So the separator is one space, not any whitespace: "1  2" has an empty
// word, which int() refuses (as does an empty document); each word is read
// as Python's int() reads a string: surrounding whitespace stripped
// ("7\n" is 7), an optional sign, decimal digits with single underscores
// between them ("1_000"), leading zeros allowed. Megatron writes whatever
// integers it gets; mt refuses an id outside [0, vocab_size), which would
// index past the embedding at training time, and digits other than ASCII's
// (int() also reads "٣" and "１" as 3 and 1).
#include "runtime/data/tokenizers/null_tokenizer.h"

#include <cstdio>
#include <cstring>

namespace mt::rt {

namespace {

// The UTF-8 length of the whitespace character Python's int() strips at
// text[i], or 0: ASCII's \t\n\v\f\r and space, and Unicode's White_Space
// (U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F,
// U+3000) -- not \x1c..\x1f, which str.isspace() accepts and int() refuses
// (CPython 3.11, checked).
size_t space_at(std::string_view s, size_t i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || (c >= '\t' && c <= '\r'))
    return 1;
  auto cp_at = [&](size_t n) -> uint32_t {
    if (i + n > s.size())
      return 0;
    uint32_t cp = n == 2 ? (c & 0x1f) : (c & 0x0f);
    for (size_t k = 1; k < n; ++k) {
      unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80)
        return 0;
      cp = (cp << 6) | (d & 0x3f);
    }
    return cp;
  };
  if (c >= 0xc2 && c <= 0xdf) {
    uint32_t cp = cp_at(2);
    return cp == 0x85 || cp == 0xa0 ? 2 : 0;
  }
  if (c >= 0xe0 && c <= 0xef) {
    uint32_t cp = cp_at(3);
    bool space = cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
                 cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
    return space ? 3 : 0;
  }
  return 0;
}

// Python's int(word) for a word without spaces; "" or what is wrong.
std::string parse_word(std::string_view word, int64_t &value) {
  size_t b = 0, e = word.size();
  for (size_t n; b < e && (n = space_at(word, b)) != 0;)
    b += n;
  // Strip from the end: step back over a trailing whitespace character.
  while (e > b) {
    size_t start = e - 1;
    while (start > b && (static_cast<unsigned char>(word[start]) & 0xc0) == 0x80)
      --start;
    size_t n = space_at(word, start);
    if (n == 0 || start + n != e)
      break;
    e = start;
  }
  std::string_view w = word.substr(b, e - b);
  bool negative = false;
  size_t i = 0;
  if (i < w.size() && (w[i] == '+' || w[i] == '-'))
    negative = w[i++] == '-';
  if (i == w.size())
    return "is not a whole number";
  // Digits, each underscore between two digits; saturate far outside any
  // vocabulary (the range check below reports it).
  constexpr int64_t kCap = int64_t(1) << 62;
  int64_t v = 0;
  bool prev_digit = false;
  for (; i < w.size(); ++i) {
    char ch = w[i];
    if (ch >= '0' && ch <= '9') {
      v = v >= kCap / 10 ? kCap : v * 10 + (ch - '0');
      prev_digit = true;
    } else if (ch == '_' && prev_digit && i + 1 < w.size() && w[i + 1] >= '0' &&
               w[i + 1] <= '9') {
      prev_digit = false;
    } else {
      return "is not a whole number";
    }
  }
  value = negative ? -v : v;
  return "";
}

std::string shown(std::string_view word) {
  std::string out = "'";
  for (size_t i = 0; i < word.size() && i < 40; ++i) {
    unsigned char c = static_cast<unsigned char>(word[i]);
    if (c < 0x20 || c == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + (word.size() > 40 ? "...'" : "'");
}

class NullEncoder final : public TokenEncoder {
public:
  explicit NullEncoder(int64_t vocab) : vocab_(vocab) {}

  void encode(std::string_view text, std::vector<int32_t> &out) override {
    std::string error;
    try_encode(text, out, &error);
  }

  bool try_encode(std::string_view text, std::vector<int32_t> &out,
                  std::string *error) override {
    const size_t before = out.size();
    size_t word = 0, at = 0;
    while (true) {
      ++word;
      size_t sp = text.find(' ', at);
      std::string_view w = text.substr(at, sp == std::string_view::npos ? sp : sp - at);
      int64_t v = 0;
      std::string bad = parse_word(w, v);
      if (bad.empty() && (v < 0 || v >= vocab_))
        bad = "is outside the vocabulary [0, " + std::to_string(vocab_) + ")";
      if (!bad.empty()) {
        out.resize(before);
        if (w.empty())
          *error = text.empty() ? "NullTokenizer: the text is empty, and Megatron's "
                                  "NullTokenizer reads no id from it; drop empty documents"
                                : "NullTokenizer: word " + std::to_string(word) +
                                      " is empty (two spaces in a row, or a space at an "
                                      "end); separate ids by single spaces";
        else
          *error = "NullTokenizer: word " + std::to_string(word) + " " + shown(w) + " " + bad +
                   "; the text must be token ids separated by single spaces";
        return false;
      }
      out.push_back(static_cast<int32_t>(v));
      if (sp == std::string_view::npos)
        return true;
      at = sp + 1;
    }
  }

private:
  int64_t vocab_;
};

class NullTokenizer final : public Tokenizer {
public:
  NullTokenizer(int64_t flag, bool legacy)
      : flag_(flag), legacy_(legacy), vocab_(legacy ? flag + 1 : flag),
        eod_(static_cast<int32_t>(legacy ? flag : flag - 1)) {}
  size_t vocab_size() const override { return static_cast<size_t>(vocab_); }
  int32_t eod() const override { return eod_; }
  std::unique_ptr<TokenEncoder> encoder() const override {
    return std::make_unique<NullEncoder>(vocab_);
  }
  // Megatron's ids_to_text: the ids joined by single spaces.
  std::string decode(const int32_t *ids, size_t n) const override {
    std::string out;
    for (size_t i = 0; i < n; ++i) {
      if (i)
        out += ' ';
      out += std::to_string(ids[i]);
    }
    return out;
  }
  std::string describe() const override {
    return "NullTokenizer (--vocab-size " + std::to_string(flag_) +
           (legacy_ ? ", --legacy-tokenizer)" : ")");
  }

private:
  int64_t flag_;
  bool legacy_;
  int64_t vocab_;
  int32_t eod_;
};

} // namespace

std::shared_ptr<const Tokenizer> make_null_tokenizer(int64_t vocab_size_flag, bool legacy) {
  return std::make_shared<NullTokenizer>(vocab_size_flag, legacy);
}

} // namespace mt::rt
