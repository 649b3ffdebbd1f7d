// TikTokenizer: the v1/v2 splits (each expectation is what Python's `regex`
// 2026.11 gives for Megatron's pattern strings, whose semantics tiktoken's
// engine shares), special tokens in text, and the decode round trip.
#include "runtime/data/tokenizers/tiktoken_tokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace {

using Pieces = std::vector<std::string>;

TEST(TiktokenTokenizerTest, SplitV1) {
  auto split = [](std::string_view s) { return mt::rt::tiktoken_pretokens_for_test("v1", s); };
  EXPECT_EQ(split("Hello world's  123 \n\n x"),
            (Pieces{"Hello", " world", "'s", " ", " ", "1", "2", "3", " \n\n", " x"}));
  EXPECT_EQ(split("ABCdef XMLHttpRequest \u01C5ungla"),
            (Pieces{"ABCdef", " XMLHttpRequest", " \u01C5ungla"}));
  EXPECT_EQ(split("don't STOP!!! a/b//\r\n\r\nc"),
            (Pieces{"don", "'t", " STOP", "!!!", " a", "/b", "//\r\n\r\n", "c"}));
  // A mark is not a letter to v1: the possessive [^\r\n\p{L}\p{N}]?+ takes it.
  EXPECT_EQ(split("\u0915\u094D\u0937x  \t y"),
            (Pieces{"\u0915", "\u094D\u0937x", "  \t", " y"}));
  // Garay letters (Unicode 16), which PCRE2 10.42's tables do not know.
  EXPECT_EQ(split("\U00010D50\U00010D70 x\u0897y"),
            (Pieces{"\U00010D50\U00010D70", " x", "\u0897y"}));
}

TEST(TiktokenTokenizerTest, SplitV2) {
  auto split = [](std::string_view s) { return mt::rt::tiktoken_pretokens_for_test("v2", s); };
  EXPECT_EQ(split("Hello world's  123 \n\n x"),
            (Pieces{"Hello", " world", "'s", " ", " ", "1", "2", "3", " \n\n", " x"}));
  EXPECT_EQ(split("ABCdef XMLHttpRequest \u01C5ungla"),
            (Pieces{"ABCdef", " XMLHttp", "Request", " \u01C5ungla"}));
  EXPECT_EQ(split("don't STOP!!! a/b//\r\n\r\nc"),
            (Pieces{"don", "'t", " STOP", "!!!", " a", "/b", "//\r\n\r\n", "c"}));
  EXPECT_EQ(split("\u0915\u094D\u0937x  \t y"), (Pieces{"\u0915\u094D\u0937x", "  \t", " y"}));
  // U+0897 is a mark only since Unicode 16.
  EXPECT_EQ(split("\U00010D50\U00010D70 x\u0897y"),
            (Pieces{"\U00010D50\U00010D70", " x\u0897y"}));
  // Invalid UTF-8: each bad byte is a piece of its own.
  EXPECT_EQ(split("ab\xFF" "cd"), (Pieces{"ab", "\xFF", "cd"}));
}

std::shared_ptr<const mt::rt::Tokenizer> load(bool legacy) {
  mt::rt::TokenizerOptions o;
  o.type = "TikTokenizer";
  o.model = std::string(MT_SOURCE_DIR) + "/test/preprocess/Inputs/tokenizers/tiktoken.json";
  o.vocab_size = 600;
  o.tiktoken_num_special_tokens = 16;
  o.tiktoken_pattern = "v2";
  o.legacy = legacy;
  std::string error;
  EXPECT_EQ(mt::rt::check_tokenizer_options(o), "");
  auto t = mt::rt::load_tokenizer(o, &error);
  EXPECT_TRUE(t) << error;
  return t;
}

TEST(TiktokenTokenizerTest, SpecialTokensAndRoundTrip) {
  auto cur = load(false), old = load(true);
  ASSERT_TRUE(cur && old);
  EXPECT_EQ(cur->vocab_size(), 600u);
  EXPECT_EQ(cur->eod(), 2); // "</s>"
  const std::string text = "x<s>y</s><SPECIAL_15> caf\xC3\xA9 \xF0\x9F\x98\x80 \xFF!";
  std::vector<int32_t> a, b;
  cur->encoder()->encode(text, a);
  old->encoder()->encode(text, b);
  // Current: <s> is id 1, </s> id 2, the last filler id 15.
  ASSERT_GE(a.size(), 6u);
  EXPECT_EQ(a[0], 16 + 'x');
  EXPECT_EQ(a[1], 1);
  EXPECT_EQ(a[2], 16 + 'y');
  EXPECT_EQ(a[3], 2);
  EXPECT_EQ(a[4], 15);
  // Legacy: plain text, every id past the special tokens.
  for (int32_t id : b)
    EXPECT_GE(id, 16);
  EXPECT_EQ(cur->decode(a.data(), a.size()), text);
  EXPECT_EQ(old->decode(b.data(), b.size()), text);
  EXPECT_EQ(cur->decode(std::vector<int32_t>{600}.data(), 1), "<id 600>");
}

TEST(TiktokenTokenizerTest, EncodersRunInParallel) {
  auto t = load(false);
  ASSERT_TRUE(t);
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "Hello world " + std::to_string(i) + " caf\xC3\xA9 <s> ";
  std::vector<int32_t> one;
  t->encoder()->encode(text, one);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (auto &g : got)
    threads.emplace_back([&] {
      auto enc = t->encoder();
      for (int rep = 0; rep < 3; ++rep) {
        g.clear();
        enc->encode(text, g);
      }
    });
  for (auto &th : threads)
    th.join();
  for (auto &g : got)
    EXPECT_EQ(g, one);
}

} // namespace
