// NullTokenizer: Megatron's vocab_size and EOD in both versions, and words
// read as Python's int() reads them (each expectation below is what
// `[int(x) for x in text.split(' ')]` gives in CPython 3.11, or its error).
#include "runtime/data/tokenizers/tokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using mt::rt::TokenizerOptions;
using Ids = std::vector<int32_t>;

std::shared_ptr<const mt::rt::Tokenizer> null_tokenizer(int64_t n, bool legacy) {
  TokenizerOptions o;
  o.type = "NullTokenizer";
  o.vocab_size = n;
  o.legacy = legacy;
  std::string error;
  auto t = mt::rt::load_tokenizer(o, &error);
  EXPECT_TRUE(t) << error;
  return t;
}

TEST(NullTokenizerTest, VocabularyAndEod) {
  // megatron/core/tokenizers (core 0.18+): vocab_size N, eod N - 1.
  auto cur = null_tokenizer(70000, false);
  EXPECT_EQ(cur->vocab_size(), 70000u);
  EXPECT_EQ(cur->eod(), 69999);
  // megatron/training/tokenizer's _NullTokenizer: N + 1 and N.
  auto old = null_tokenizer(70000, true);
  EXPECT_EQ(old->vocab_size(), 70001u);
  EXPECT_EQ(old->eod(), 70000);
}

Ids encode(const std::string &text, std::string *error = nullptr) {
  auto enc = null_tokenizer(2000, false)->encoder();
  Ids out = {42}; // kept on success and on failure
  std::string err;
  bool ok = enc->try_encode(text, out, &err);
  if (error)
    *error = ok ? "" : err;
  EXPECT_EQ(ok, err.empty());
  if (!ok) {
    EXPECT_EQ(out, Ids{42});
    return {};
  }
  return Ids(out.begin() + 1, out.end());
}

TEST(NullTokenizerTest, WordsAsPythonIntReadsThem) {
  EXPECT_EQ(encode("7"), (Ids{7}));
  EXPECT_EQ(encode("1 2 3"), (Ids{1, 2, 3}));
  EXPECT_EQ(encode("+7 -0 007 1_000 1_9_9"), (Ids{7, 0, 7, 1000, 199}));
  EXPECT_EQ(encode("5\n \t6\r 7\v\f"), (Ids{5, 6, 7}));
  EXPECT_EQ(encode("\u30005\u2028 \u00a06 \u00857"), (Ids{5, 6, 7}));
  EXPECT_EQ(encode("1999"), (Ids{1999}));
}

TEST(NullTokenizerTest, WordsPythonRefuses) {
  for (const char *bad : {"", " ", "1  2", " 1", "1 ", "1__0", "_1", "1_", "0x10", "1.0",
                          "\x1c" "9", "5\u200b", "+", "-", "1 x"}) {
    std::string error;
    encode(bad, &error);
    EXPECT_NE(error, "") << "'" << bad << "'";
  }
  std::string error;
  encode("3 x4", &error);
  EXPECT_EQ(error, "NullTokenizer: word 2 'x4' is not a whole number; the text must be token "
                   "ids separated by single spaces");
}

TEST(NullTokenizerTest, IdsOutsideTheVocabulary) {
  std::string error;
  encode("2000", &error);
  EXPECT_EQ(error, "NullTokenizer: word 1 '2000' is outside the vocabulary [0, 2000); the text "
                   "must be token ids separated by single spaces");
  encode("-1", &error);
  EXPECT_NE(error, "");
  encode("99999999999999999999999999", &error);
  EXPECT_NE(error, "");
}

TEST(NullTokenizerTest, DecodeAndEncodeWithoutErrors) {
  auto t = null_tokenizer(100, true);
  Ids ids = {0, 99, 100};
  EXPECT_EQ(t->decode(ids.data(), ids.size()), "0 99 100");
  auto enc = t->encoder();
  Ids out;
  enc->encode("4 5", out);
  EXPECT_EQ(out, (Ids{4, 5}));
  enc->encode("4 x", out); // refused: nothing appended
  EXPECT_EQ(out, (Ids{4, 5}));
  EXPECT_EQ(t->describe(), "NullTokenizer (--vocab-size 100, --legacy-tokenizer)");
}

TEST(NullTokenizerTest, Options) {
  TokenizerOptions o;
  o.type = "NullTokenizer";
  EXPECT_EQ(mt::rt::check_tokenizer_options(o), "NullTokenizer needs --vocab-size N (its vocabulary)");
  std::vector<std::string> args = {"--tokenizer-type", "NullTokenizer", "--vocab-size", "5"};
  TokenizerOptions p;
  std::string error;
  for (size_t i = 0; i < args.size(); ++i)
    ASSERT_TRUE(mt::rt::parse_tokenizer_flag(args, i, p, &error)) << args[i];
  EXPECT_EQ(p.type, "NullTokenizer");
  EXPECT_EQ(p.vocab_size, 5);
  EXPECT_EQ(mt::rt::check_tokenizer_options(p), "");
}

} // namespace
