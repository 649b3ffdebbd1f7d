// GPT-2's byte-level BPE: the pre-token split, merges on a hand-made
// vocabulary, the round trip on arbitrary bytes, loader errors, and GPT-2's
// real files against ids from HF tokenizers (when the files are present).
#include "runtime/data/tokenizers/gpt2_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

namespace mt::rt {
// Defined in gpt2_tokenizer.cpp for this test: the pre-tokens of a text.
std::vector<std::string> gpt2_pretokens_for_test(std::string_view text);
} // namespace mt::rt

namespace {

using mt::rt::Gpt2Encoder;
using mt::rt::Gpt2Vocabulary;
using Ids = std::vector<int32_t>;
using Strings = std::vector<std::string>;

// GPT-2's bytes_to_unicode, written out independently of the library.
std::string byteSymbol(unsigned char b) {
  auto printable = [](int x) {
    return (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
  };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int x = 0; x < b; ++x)
      cp += !printable(x);
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::string symbols(const std::string &bytes) {
  std::string s;
  for (unsigned char c : bytes)
    s += byteSymbol(c);
  return s;
}

// JSON string with every non-ASCII character as \uXXXX, as Python's
// json.dump writes by default: exercises the reader's escapes.
std::string jsonString(const std::string &utf8) {
  std::string o = "\"";
  for (size_t i = 0; i < utf8.size();) {
    unsigned char c = static_cast<unsigned char>(utf8[i]);
    uint32_t cp;
    size_t len;
    if (c < 0x80) {
      cp = c, len = 1;
    } else if (c < 0xE0) {
      cp = ((c & 0x1Fu) << 6) | (utf8[i + 1] & 0x3F), len = 2;
    } else if (c < 0xF0) {
      cp = ((c & 0x0Fu) << 12) | ((utf8[i + 1] & 0x3F) << 6) | (utf8[i + 2] & 0x3F), len = 3;
    } else {
      cp = ((c & 0x07u) << 18) | ((utf8[i + 1] & 0x3F) << 12) | ((utf8[i + 2] & 0x3F) << 6) |
           (utf8[i + 3] & 0x3F),
      len = 4;
    }
    i += len;
    char buf[16];
    if (cp == '"' || cp == '\\') {
      o += '\\';
      o += static_cast<char>(cp);
    } else if (cp >= 0x20 && cp < 0x7F) {
      o += static_cast<char>(cp);
    } else if (cp < 0x10000) {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      o += buf;
    } else {
      cp -= 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      o += buf;
    }
  }
  return o + "\"";
}

std::string makeTempDir() {
  std::string tmpl = testing::TempDir() + "gpt2tok.XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const char *dir = mkdtemp(buf.data());
  return dir ? std::string(dir) : std::string();
}

void writeFile(const std::string &path, const std::string &text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

std::string readFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The hand-made vocabulary: id = byte value for 0..255, then the merges below
// in order (id 256 + rank), then "<|endoftext|>".
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"h", "e"},                  // 256 he
    {"l", "l"},                  // 257 ll
    {"he", "ll"},                // 258 hell
    {"hell", "o"},               // 259 hello
    {" ", "w"},                  // 260 " w"
    {"o", "r"},                  // 261 or
    {" w", "or"},                // 262 " wor"
    {"l", "d"},                  // 263 ld
    {" wor", "ld"},              // 264 " world"
    {"'", "t"},                  // 265 't
    {" ", " "},                  // 266 two spaces
    {"\n", "\n"},                // 267 two newlines
    {"2", "0"},                  // 268 20
    {"20", "2"},                 // 269 202
    {"xy", "x"},                 // 270 xyx: ranked before "x y" on purpose
    {"x", "y"},                  // 271 xy
    {"\xF0", "\x9F"},            // 272
    {"\xF0\x9F", "\x98"},        // 273
    {"\xF0\x9F\x98", "\x80"},    // 274 U+1F600 as one token
};
constexpr int32_t kEod = 275;

struct SmallVocab {
  std::string dir;
  std::string vocab, merges;
};

SmallVocab writeSmallVocab() {
  SmallVocab v;
  v.dir = makeTempDir();
  v.vocab = v.dir + "/vocab.json";
  v.merges = v.dir + "/merges.txt";
  std::string json = "{";
  for (int b = 0; b < 256; ++b)
    json += jsonString(byteSymbol(static_cast<unsigned char>(b))) + ": " + std::to_string(b) + ",\n";
  std::string txt = "#version: 0.2\n";
  for (size_t i = 0; i < kMerges.size(); ++i) {
    json += jsonString(symbols(kMerges[i].first + kMerges[i].second)) + ": " +
            std::to_string(256 + i) + ",\n";
    txt += symbols(kMerges[i].first) + " " + symbols(kMerges[i].second) + "\n";
  }
  json += "\"<|endoftext|>\": " + std::to_string(kEod) + "}\n";
  writeFile(v.vocab, json);
  writeFile(v.merges, txt);
  return v;
}

class SmallVocabTest : public testing::Test {
protected:
  static void SetUpTestSuite() {
    files_ = new SmallVocab(writeSmallVocab());
    std::string error;
    vocab_ = new std::shared_ptr<const Gpt2Vocabulary>(
        Gpt2Vocabulary::load(files_->vocab, files_->merges, &error));
    ASSERT_TRUE(*vocab_) << error;
  }
  static void TearDownTestSuite() {
    delete vocab_;
    delete files_;
  }

  Ids encode(const std::string &text) {
    Gpt2Encoder enc(*vocab_);
    Ids ids;
    enc.encode(text, ids);
    return ids;
  }
  std::string roundTrip(const std::string &text) {
    Gpt2Encoder enc(*vocab_);
    Ids ids;
    enc.encode(text, ids);
    return enc.decode(ids.data(), ids.size());
  }

  static SmallVocab *files_;
  static std::shared_ptr<const Gpt2Vocabulary> *vocab_;
};
SmallVocab *SmallVocabTest::files_ = nullptr;
std::shared_ptr<const Gpt2Vocabulary> *SmallVocabTest::vocab_ = nullptr;

// ---------------------------------------------------------------------------
// Pre-tokenisation. Expected splits follow the pattern's semantics by hand;
// those on valid UTF-8 are also what HF tokenizers' ByteLevel pre-tokenizer
// gives.

struct SplitCase {
  std::string text;
  Strings pieces;
};

const std::vector<SplitCase> kSplits = {
    // Contractions: lower case only, and only right after the apostrophe.
    {"don't", {"don", "'t"}},
    {"I'll", {"I", "'ll"}},
    {"they're", {"they", "'re"}},
    {"'s start", {"'s", " start"}},
    {"It's", {"It", "'s"}},
    {"DON'T", {"DON", "'", "T"}},
    {"we've I'm he'd you'll", {"we", "'ve", " I", "'m", " he", "'d", " you", "'ll"}},
    {"'", {"'"}},
    {"''s", {"''", "s"}},
    {" 's", {" '", "s"}},
    // Whitespace: a run keeps its last character for the next word, unless it
    // ends the text; a single space joins the word after it.
    {"a  b", {"a", " ", " b"}},
    {"hello   world", {"hello", "  ", " world"}},
    {"x\n", {"x", "\n"}},
    {"a\n\n b", {"a", "\n\n", " b"}},
    {"end   ", {"end", "   "}},
    {"\t", {"\t"}},
    {"a\tb", {"a", "\t", "b"}},
    {"\r\n", {"\r\n"}},
    {"line1\r\nline2", {"line", "1", "\r", "\n", "line", "2"}},
    {"   ", {"   "}},
    {" ", {" "}},
    {"  a", {" ", " a"}},
    {"\n\n\n", {"\n\n\n"}},
    {"a  !", {"a", " ", " !"}},
    {"  \n  x", {"  \n ", " x"}},
    {"a \n", {"a", " \n"}},
    {"a\xC2\xA0" "b", {"a", "\xC2\xA0", "b"}},                  // U+00A0 is space, not ' '
    {"a \xE3\x80\x80" "b", {"a", " ", "\xE3\x80\x80", "b"}},     // U+3000
    {"x\xE2\x80\xA8y", {"x", "\xE2\x80\xA8", "y"}},             // U+2028
    {"a\xE1\xA0\x8E b", {"a", "\xE1\xA0\x8E", " b"}},           // U+180E is not space
    // Numbers.
    {"2024", {"2024"}},
    {" 3.14", {" 3", ".", "14"}},
    {"12345 apples", {"12345", " apples"}},
    {"abc123def", {"abc", "123", "def"}},
    {"$100", {"$", "100"}},
    {"-5", {"-", "5"}},
    {"a 1", {"a", " 1"}},
    {"\xE2\x85\xAB \xC2\xBD \xC2\xB2", {"\xE2\x85\xAB", " \xC2\xBD", " \xC2\xB2"}}, // Ⅻ ½ ²
    {"\xD9\xA3\xD9\xA4 \xDB\xB5", {"\xD9\xA3\xD9\xA4", " \xDB\xB5"}},               // ٣٤ ۵
    // Punctuation runs.
    {"Hello!!! ...?", {"Hello", "!!!", " ...?"}},
    {"foo()->bar", {"foo", "()->", "bar"}},
    {"x = y;", {"x", " =", " y", ";"}},
    {std::string("a\0b", 3), {"a", std::string(1, '\0'), "b"}},
    // Emoji and other scripts.
    {"hi \xF0\x9F\x98\x80\xF0\x9F\x98\x80!", {"hi", " \xF0\x9F\x98\x80\xF0\x9F\x98\x80!"}},
    {"\xF0\x9F\x98\x80 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xF0\x9F\x87\xA9\xF0\x9F\x87\xAA",
     {"\xF0\x9F\x98\x80", " \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD", " \xF0\x9F\x87\xA9\xF0\x9F\x87\xAA"}},
    {"\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 \xD0\xBC\xD0\xB8\xD1\x80",
     {"\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82", " \xD0\xBC\xD0\xB8\xD1\x80"}}, // Привет мир
    {"\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88",
     {"\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88"}}, // 日本語テキスト
    {"\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xD8\xA8\xD8\xA7\xD9\x84\xD8\xB9\xD8\xA7\xD9\x84\xD9\x85",
     {"\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7",
      " \xD8\xA8\xD8\xA7\xD9\x84\xD8\xB9\xD8\xA7\xD9\x84\xD9\x85"}}, // مرحبا بالعالم
    {"na\xC3\xAFve", {"na\xC3\xAFve"}},                     // precomposed ï is a letter
    {"nai\xCC\x88ve", {"nai", "\xCC\x88", "ve"}},           // a combining mark is not
    {"\xF0\x91\xBC\x84\xF0\x91\xBC\x85", {"\xF0\x91\xBC\x84\xF0\x91\xBC\x85"}}, // Kawi (Unicode 15) letters
    {"", {}},
    // Invalid UTF-8: each bad byte alone; the valid runs around it split on
    // their own, as if each were a whole text.
    {"\xFF", {"\xFF"}},
    {"a\xFF" "b", {"a", "\xFF", "b"}},
    {"\xE2\x82x", {"\xE2", "\x82", "x"}},                   // truncated sequence
    {"\x80\x80", {"\x80", "\x80"}},                         // lone continuation bytes
    {"\xC0\xAF", {"\xC0", "\xAF"}},                         // overlong '/'
    {"\xED\xA0\x80", {"\xED", "\xA0", "\x80"}},             // a surrogate
    {"\xF4\x90\x80\x80", {"\xF4", "\x90", "\x80", "\x80"}}, // above U+10FFFF
    {"\xE2\x82\xAC", {"\xE2\x82\xAC"}},                     // '€' is fine
    {"h\xC3\xA9llo\xFF w\xC3\xB6rld", {"h\xC3\xA9llo", "\xFF", " w\xC3\xB6rld"}},
    {"a  \xFF", {"a", "  ", "\xFF"}},
    {"\xF0\x9F\x98", {"\xF0", "\x9F", "\x98"}},             // emoji cut short
};

std::string printable(const std::string &s) {
  std::string o;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      o += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      o += buf;
    }
  }
  return o;
}

TEST(Gpt2PreTokens, SplitsLikeGpt2Pattern) {
  for (const SplitCase &c : kSplits)
    EXPECT_EQ(mt::rt::gpt2_pretokens_for_test(c.text), c.pieces) << "text: " << printable(c.text);
}

TEST(Gpt2PreTokens, PiecesTileTheText) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string text;
    size_t len = rng() % 40;
    for (size_t k = 0; k < len; ++k)
      text += static_cast<char>(rng() % 4 == 0 ? ' ' : rng() % 256);
    std::string joined;
    for (const std::string &p : mt::rt::gpt2_pretokens_for_test(text)) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, text);
  }
}

// ---------------------------------------------------------------------------
// Encoding with the hand-made merges.

TEST_F(SmallVocabTest, Tables) {
  const Gpt2Vocabulary &v = **vocab_;
  EXPECT_EQ(v.size(), 276u);
  EXPECT_EQ(v.eod_id(), kEod);
  EXPECT_EQ(v.token_bytes(' '), " ");
  EXPECT_EQ(v.token_bytes(0), std::string(1, '\0'));
  EXPECT_EQ(v.token_bytes(0xFF), "\xFF");
  EXPECT_EQ(v.token_bytes(264), " world");
  EXPECT_EQ(v.token_bytes(274), "\xF0\x9F\x98\x80");
  EXPECT_EQ(v.token_bytes(kEod), "<|endoftext|>");
  EXPECT_EQ(v.token_bytes(-1), "");
  EXPECT_EQ(v.token_bytes(276), "");
}

TEST_F(SmallVocabTest, Merges) {
  EXPECT_EQ(encode("hello world"), (Ids{259, 264}));
  EXPECT_EQ(encode("hello"), (Ids{259}));
  EXPECT_EQ(encode("help"), (Ids{256, 'l', 'p'}));
  EXPECT_EQ(encode("hellohello"), (Ids{259, 259}));
  EXPECT_EQ(encode("lll"), (Ids{257, 'l'})); // leftmost pair first
  EXPECT_EQ(encode("llll"), (Ids{257, 257}));
  EXPECT_EQ(encode(""), (Ids{}));
}

TEST_F(SmallVocabTest, PreTokensBoundMerges) {
  EXPECT_EQ(encode("don't"), (Ids{'d', 'o', 'n', 265}));
  EXPECT_EQ(encode("DON'T"), (Ids{'D', 'O', 'N', '\'', 'T'}));
  EXPECT_EQ(encode("a  b"), (Ids{'a', ' ', ' ', 'b'}));
  EXPECT_EQ(encode("hello   world"), (Ids{259, 266, 264}));
  EXPECT_EQ(encode("a\n\n b"), (Ids{'a', 267, ' ', 'b'}));
  EXPECT_EQ(encode("x\n"), (Ids{'x', '\n'}));
  EXPECT_EQ(encode("end    "), (Ids{'e', 'n', 'd', 266, 266}));
  EXPECT_EQ(encode("2024"), (Ids{269, '4'}));
  EXPECT_EQ(encode(" 3.14"), (Ids{' ', '3', '.', '1', '4'}));
  EXPECT_EQ(encode("hi \xF0\x9F\x98\x80!"), (Ids{'h', 'i', ' ', 274, '!'}));
}

// encoder.py merges every occurrence of the best pair before it looks again:
// "xyxy" becomes xy|xy although "xy x" ranks above "x y"; merging one pair at
// a time would give xyx|y.
TEST_F(SmallVocabTest, MergesWholeSweepsLikeGpt2) {
  EXPECT_EQ(encode("xyxy"), (Ids{271, 271}));
  EXPECT_EQ(encode("xyx"), (Ids{270}));
  EXPECT_EQ(encode("xyxyx"), (Ids{271, 270}));
}

TEST_F(SmallVocabTest, EndOfTextIsOrdinaryText) {
  Ids ids = encode("<|endoftext|>");
  EXPECT_EQ(ids, (Ids{'<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't', '|', '>'}));
}

TEST_F(SmallVocabTest, InvalidUtf8) {
  EXPECT_EQ(encode("\xFF"), (Ids{0xFF}));
  EXPECT_EQ(encode("hello\xFFworld"), (Ids{259, 0xFF, 'w', 261, 263}));
  EXPECT_EQ(encode("\xF0\x9F\x98"), (Ids{0xF0, 0x9F, 0x98})); // no merge across bad bytes
  EXPECT_EQ(encode("\xF0\x9F\x98\x80"), (Ids{274}));
}

TEST_F(SmallVocabTest, RoundTripTrickyStrings) {
  for (const SplitCase &c : kSplits)
    EXPECT_EQ(roundTrip(c.text), c.text) << "text: " << printable(c.text);
}

// Random byte strings, most of them invalid UTF-8, plus random code points.
std::vector<std::string> randomTexts(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  const char *pieces[] = {" ", "  ", "\n", "\t", "'s", "'t", "he", "ll", "o", "world", "2", "0",
                          "xy", "\xF0\x9F\x98\x80", "\xC3\xA9", "\xE4\xB8\xAD", "!", "\r\n"};
  for (int i = 0; i < count; ++i) {
    std::string s;
    size_t len = rng() % 48;
    int mode = i % 3;
    while (s.size() < len) {
      if (mode == 0) {
        s += static_cast<char>(rng() % 256);
      } else if (mode == 1) {
        s += pieces[rng() % (sizeof pieces / sizeof *pieces)];
        if (rng() % 8 == 0)
          s += static_cast<char>(0x80 + rng() % 128);
      } else {
        uint32_t cp = rng() % 4 == 0 ? rng() % 0x110000 : rng() % 0x800;
        if (cp >= 0xD800 && cp <= 0xDFFF)
          cp = 'x';
        if (cp < 0x80) {
          s += static_cast<char>(cp);
        } else if (cp < 0x800) {
          s += static_cast<char>(0xC0 | (cp >> 6));
          s += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
          s += static_cast<char>(0xE0 | (cp >> 12));
          s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          s += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
          s += static_cast<char>(0xF0 | (cp >> 18));
          s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
          s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          s += static_cast<char>(0x80 | (cp & 0x3F));
        }
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

TEST_F(SmallVocabTest, RoundTripRandomBytes) {
  Gpt2Encoder enc(*vocab_);
  for (const std::string &text : randomTexts(6000, 1234)) {
    Ids ids;
    enc.encode(text, ids);
    ASSERT_EQ(enc.decode(ids.data(), ids.size()), text) << "text: " << printable(text);
    // The cache must not change the answer.
    Ids again;
    enc.encode(text, again);
    ASSERT_EQ(again, ids);
    ASSERT_EQ(again, encode(text));
  }
}

// A long run of one letter is one pre-token: the merge loop must not be
// quadratic in it.
TEST_F(SmallVocabTest, LongPreToken) {
  std::string text(400000, 'l');
  Ids ids = encode(text);
  EXPECT_EQ(ids, Ids(200000, 257));
  text = std::string(300001, 'x') + "y";
  EXPECT_EQ(roundTrip(text), text);
}

// One encoder per thread over one shared vocabulary.
TEST_F(SmallVocabTest, EncodersOnThreads) {
  std::vector<std::string> texts = randomTexts(3000, 99);
  std::vector<Ids> expected;
  for (const std::string &t : texts)
    expected.push_back(encode(t));
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Gpt2Encoder enc(*vocab_);
      int good = 0;
      for (size_t i = 0; i < texts.size(); ++i) {
        Ids ids;
        enc.encode(texts[(i + t * 500) % texts.size()], ids);
        good += ids == expected[(i + t * 500) % texts.size()];
      }
      ok[t] = good;
    });
  }
  for (std::thread &th : threads)
    th.join();
  for (int t = 0; t < 4; ++t)
    EXPECT_EQ(ok[t], static_cast<int>(texts.size()));
}

// ---------------------------------------------------------------------------
// Loader errors: one line, naming the file (and line) and the fix.

class LoaderErrorTest : public testing::Test {
protected:
  void SetUp() override {
    files_ = writeSmallVocab();
    goodVocab_ = readFile(files_.vocab);
    goodMerges_ = readFile(files_.merges);
  }

  // The error from loading with vocab.json / merges.txt replaced by the given
  // text (null keeps the good file).
  std::string loadError(const char *vocab, const char *merges) {
    writeFile(files_.vocab, vocab ? std::string(vocab) : goodVocab_);
    writeFile(files_.merges, merges ? std::string(merges) : goodMerges_);
    std::string error;
    auto v = Gpt2Vocabulary::load(files_.vocab, files_.merges, &error);
    EXPECT_FALSE(v) << "loaded";
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    return error;
  }

  SmallVocab files_;
  std::string goodVocab_, goodMerges_;
};

TEST_F(LoaderErrorTest, MissingFiles) {
  std::string error;
  EXPECT_FALSE(Gpt2Vocabulary::load(files_.dir + "/none.json", files_.merges, &error));
  EXPECT_EQ(error, files_.dir + "/none.json: error: cannot read: No such file or directory; "
                                "check the path");
  EXPECT_FALSE(Gpt2Vocabulary::load(files_.vocab, files_.dir + "/none.txt", &error));
  EXPECT_EQ(error, files_.dir + "/none.txt: error: cannot read: No such file or directory; "
                                "check the path");
}

TEST_F(LoaderErrorTest, MalformedJson) {
  const std::string fix = "; vocab.json must be GPT-2's JSON object of token -> id";
  const std::string v = files_.vocab;
  EXPECT_EQ(loadError("{\"a\": 0, \"b\" 1}", nullptr),
            v + ":1:14: error: malformed JSON: expected ':' after the token string" + fix);
  EXPECT_EQ(loadError("{\n  \"a\": 0,\n  \"b\": x\n}", nullptr),
            v + ":3:8: error: malformed JSON: expected a token id (a whole number)" + fix);
  EXPECT_EQ(loadError("{\"a\": 0,}", nullptr),
            v + ":1:9: error: malformed JSON: expected a token string in double quotes" + fix);
  EXPECT_EQ(loadError("", nullptr),
            v + ":1:1: error: malformed JSON: expected '{': vocab.json is a JSON object of token -> "
                "id (the file ends here)" + fix);
  EXPECT_EQ(loadError("{\"a\": 0", nullptr),
            v + ":1:8: error: malformed JSON: expected ',' or '}' after the id (the file ends here)" +
                fix);
  EXPECT_EQ(loadError("{\"a\": 0} x", nullptr),
            v + ":1:10: error: malformed JSON: unexpected text after the closing '}'" + fix);
  EXPECT_EQ(loadError("{\"a\": 1.5}", nullptr),
            v + ":1:7: error: malformed JSON: ids must be whole numbers" + fix);
  EXPECT_EQ(loadError("{\"a\": -1}", nullptr),
            v + ":1:7: error: malformed JSON: negative id; ids are whole numbers from 0" + fix);
  EXPECT_EQ(loadError("{\"a\": 01}", nullptr),
            v + ":1:7: error: malformed JSON: leading zero in a number" + fix);
  EXPECT_EQ(loadError("{\"a\": 99999999999}", nullptr),
            v + ":1:7: error: malformed JSON: id too large for a 32-bit token id" + fix);
  EXPECT_EQ(loadError("{\"a\": \"1\"}", nullptr),
            v + ":1:7: error: malformed JSON: expected a token id (a whole number)" + fix);
  EXPECT_EQ(loadError("{\"a\\q\": 0}", nullptr),
            v + ":1:4: error: malformed JSON: unknown escape in a string" + fix);
  EXPECT_EQ(loadError("{\"\\ud800\": 0}", nullptr),
            v + ":1:3: error: malformed JSON: high surrogate \\u escape without a low surrogate "
                "after it" + fix);
  EXPECT_EQ(loadError("{\"\\udc00\": 0}", nullptr),
            v + ":1:3: error: malformed JSON: low surrogate \\u escape without a high surrogate "
                "before it" + fix);
  EXPECT_EQ(loadError("{\"\\u12g4\": 0}", nullptr),
            v + ":1:7: error: malformed JSON: expected four hex digits after \\u" + fix);
  EXPECT_EQ(loadError("{\"a\xFF\": 0}", nullptr),
            v + ":1:4: error: malformed JSON: invalid UTF-8" + fix);
  EXPECT_EQ(loadError("{\"a\tb\": 0}", nullptr),
            v + ":1:4: error: malformed JSON: control character in a string (write it as "
                "\\u00XX)" + fix);
  EXPECT_EQ(loadError("{\"ab: 0}", nullptr),
            v + ":1:2: error: malformed JSON: unterminated string" + fix);
}

// Replaces the first occurrence of `from` in the good vocab.json.
std::string edited(std::string text, const std::string &from, const std::string &to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos)
    text.replace(at, from.size(), to);
  return text;
}

TEST_F(LoaderErrorTest, BadVocabulary) {
  const std::string v = files_.vocab;
  // One entry per line: "b" (id 98) is on line 99.
  std::string text = edited(goodVocab_, "\"b\": 98", "\"b\": 97");
  EXPECT_EQ(loadError(text.c_str(), nullptr),
            v + ":99:6: error: id 97 is given to both \"a\" and \"b\"; each token needs its own id");
  text = edited(goodVocab_, "\"b\": 98", "\"a\": 98");
  EXPECT_EQ(loadError(text.c_str(), nullptr),
            v + ":99:6: error: token \"a\" appears twice; each token needs exactly one id");
  text = edited(goodVocab_, "\"<|endoftext|>\": 275", "\"<|endoftext|>\": 276");
  EXPECT_EQ(loadError(text.c_str(), nullptr),
            v + ": error: no token has id 275 (ids go up to 276); ids must run from 0 to 275 "
                "without gaps");
  text = edited(goodVocab_, "\"<|endoftext|>\": 275", "\"<|endoftext|\": 275");
  EXPECT_EQ(loadError(text.c_str(), nullptr),
            v + ": error: no \"<|endoftext|>\" token; GPT-2's vocab.json has it (id 50256), check "
                "that this is a GPT-2 vocabulary");
  text = edited(goodVocab_, "\"a\": 97", "\"aa\": 97");
  EXPECT_EQ(loadError(text.c_str(), nullptr),
            v + ": error: no token for byte 0x61 (spelled \"a\"); a byte-level BPE vocabulary "
                "needs all 256 byte tokens");
  EXPECT_EQ(loadError(" { } ", nullptr),
            v + ": error: the vocabulary is empty; check that this is GPT-2's vocab.json");
}

TEST_F(LoaderErrorTest, BadMerges) {
  const std::string m = files_.merges;
  const std::string fix = "; the two files must come from the same tokenizer";
  EXPECT_EQ(loadError(nullptr, "#version: 0.2\nh e\nabc\n"),
            m + ":3: error: expected two symbols separated by one space, got \"abc\"; each line of "
                "merges.txt is a pair such as \"\xC4\xA0 t\"");
  EXPECT_EQ(loadError(nullptr, "h e\nh  e\n"),
            m + ":2: error: expected two symbols separated by one space, got \"h  e\"; each line "
                "of merges.txt is a pair such as \"\xC4\xA0 t\"");
  EXPECT_EQ(loadError(nullptr, "h e\n\nhel lo\n"),
            m + ":3: error: symbol \"hel\" is not in vocab.json" + fix);
  EXPECT_EQ(loadError(nullptr, "h e\nq z\n"),
            m + ":2: error: the merged symbol \"qz\" is not in vocab.json" + fix);
  EXPECT_EQ(loadError(nullptr, "h e\nl l\nh e\n"),
            m + ":3: error: the pair \"h e\" was already listed; each merge appears once");
  EXPECT_EQ(loadError(nullptr, "h e\n\xFF x\n"),
            m + ":2: error: invalid UTF-8; merges.txt must be UTF-8 text");
}

// What the loader accepts besides GPT-2's exact layout.
TEST_F(LoaderErrorTest, Accepted) {
  std::string error;
  // CRLF line endings, no "#version" line, no final newline.
  writeFile(files_.merges, "h e\r\nl l\r\nhe ll");
  auto v = Gpt2Vocabulary::load(files_.vocab, files_.merges, &error);
  ASSERT_TRUE(v) << error;
  Gpt2Encoder enc(v);
  Ids ids;
  enc.encode("hell", ids);
  EXPECT_EQ(ids, (Ids{258}));
  // No merges at all: bytes only.
  writeFile(files_.merges, "#version: 0.2\n");
  v = Gpt2Vocabulary::load(files_.vocab, files_.merges, &error);
  ASSERT_TRUE(v) << error;
  // A token outside the byte alphabet (spelled with a surrogate pair) stands
  // for its own UTF-8 bytes.
  writeFile(files_.vocab, edited(goodVocab_, "\"<|endoftext|>\": 275",
                                 "\"<|endoftext|>\": 275, \"\\ud83d\\ude00\": 276"));
  v = Gpt2Vocabulary::load(files_.vocab, files_.merges, &error);
  ASSERT_TRUE(v) << error;
  EXPECT_EQ(v->size(), 277u);
  EXPECT_EQ(v->token_bytes(276), "\xF0\x9F\x98\x80");
}

// ---------------------------------------------------------------------------
// GPT-2's real files, when present: $MT_SHARED_DATA/gpt2, else
// ../shared/data/gpt2 beside the source root.

bool exists(const std::string &path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string parentDir(const std::string &path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return "";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The source root: this file is five levels below it. __FILE__ may be
// relative (ccache's base_dir rewrites it relative to the build folder), so
// also walk up from the test binary and the working directory.
std::string sourceRoot() {
  std::vector<std::string> starts;
#ifdef MT_SOURCE_DIR
  starts.push_back(MT_SOURCE_DIR);
#endif
  std::string self = __FILE__;
  std::string fileRoot = self;
  for (int up = 0; up < 6; ++up) // test/unit/runtime/data/tokenizers/this.cpp
    fileRoot = parentDir(fileRoot);
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  std::string exeDir = n > 0 ? parentDir(std::string(buf, static_cast<size_t>(n))) : "";
  std::string cwd = getcwd(buf, sizeof buf) ? std::string(buf) : "";
  if (!self.empty() && self[0] == '/') {
    starts.push_back(fileRoot);
  } else {
    // Relative to wherever the compiler ran: the build folder, usually.
    for (std::string base = exeDir; !base.empty() && base != "/"; base = parentDir(base))
      starts.push_back(base + "/" + (fileRoot.empty() ? "." : fileRoot));
  }
  starts.push_back(exeDir);
  starts.push_back(cwd);
  for (std::string dir : starts) {
    for (int up = 0; up < 8 && !dir.empty(); ++up) {
      if (exists(dir + "/runtime/data/tokenizers/gpt2_tokenizer.h") &&
          exists(dir + "/test/unit/Inputs/gpt2_reference.jsonl"))
        return dir;
      dir = parentDir(dir);
    }
  }
  return "";
}

std::string gpt2Dir() {
  if (const char *env = std::getenv("MT_SHARED_DATA")) {
    for (std::string dir : {std::string(env) + "/gpt2", std::string(env)})
      if (exists(dir + "/vocab.json") && exists(dir + "/merges.txt"))
        return dir;
  }
  std::string root = sourceRoot();
  std::string dir = root + "/../shared/data/gpt2";
  if (!root.empty() && exists(dir + "/vocab.json") && exists(dir + "/merges.txt"))
    return dir;
  return "";
}

class Gpt2FilesTest : public testing::Test {
protected:
  static void SetUpTestSuite() {
    std::string dir = gpt2Dir();
    if (dir.empty())
      return;
    std::string error;
    vocab_ = new std::shared_ptr<const Gpt2Vocabulary>(
        Gpt2Vocabulary::load(dir + "/vocab.json", dir + "/merges.txt", &error));
    if (!*vocab_)
      loadError_ = new std::string(error);
  }
  static void TearDownTestSuite() {
    delete vocab_;
    delete loadError_;
    vocab_ = nullptr;
    loadError_ = nullptr;
  }
  void SetUp() override {
    if (!vocab_)
      GTEST_SKIP() << "GPT-2's vocab.json/merges.txt not found (set MT_SHARED_DATA to the folder "
                      "holding gpt2/, or put them in ../shared/data/gpt2 beside the checkout)";
    ASSERT_TRUE(*vocab_) << *loadError_;
  }

  Ids encode(const std::string &text) {
    Gpt2Encoder enc(*vocab_);
    Ids ids;
    enc.encode(text, ids);
    return ids;
  }

  static std::shared_ptr<const Gpt2Vocabulary> *vocab_;
  static std::string *loadError_;
};
std::shared_ptr<const Gpt2Vocabulary> *Gpt2FilesTest::vocab_ = nullptr;
std::string *Gpt2FilesTest::loadError_ = nullptr;

TEST_F(Gpt2FilesTest, Tables) {
  EXPECT_EQ((*vocab_)->size(), 50257u);
  EXPECT_EQ((*vocab_)->eod_id(), 50256);
  EXPECT_EQ((*vocab_)->token_bytes(50256), "<|endoftext|>");
  EXPECT_EQ((*vocab_)->token_bytes(220), " ");
  EXPECT_EQ((*vocab_)->token_bytes(995), " world");
}

// Ids from HF tokenizers 0.23.3 (and GPT-2's encoder.py).
TEST_F(Gpt2FilesTest, KnownIds) {
  EXPECT_EQ(encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(encode(" Hello world"), (Ids{18435, 995}));
  EXPECT_EQ(encode("<|endoftext|>"), (Ids{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(encode("hello   world"), (Ids{31373, 220, 220, 995}));
  EXPECT_EQ(encode("The quick brown fox jumps over the lazy dog."),
            (Ids{464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13}));
  EXPECT_EQ(encode("I'm"), (Ids{40, 1101}));
  EXPECT_EQ(encode(" \t\n"), (Ids{220, 197, 198}));
}

// A byte that is not UTF-8 becomes that byte's token, whatever surrounds it.
TEST_F(Gpt2FilesTest, InvalidBytes) {
  for (int b = 0x80; b < 0x100; ++b) {
    Ids ids = encode(std::string(1, static_cast<char>(b)));
    ASSERT_EQ(ids.size(), 1u) << b;
    EXPECT_EQ((*vocab_)->token_bytes(ids[0]), std::string(1, static_cast<char>(b)));
  }
  EXPECT_EQ(encode("Hello\xFF world"), (Ids{15496, 187, 995}));
}

TEST_F(Gpt2FilesTest, RoundTripRandomBytes) {
  Gpt2Encoder enc(*vocab_);
  for (const std::string &text : randomTexts(4000, 4321)) {
    Ids ids;
    enc.encode(text, ids);
    ASSERT_EQ(enc.decode(ids.data(), ids.size()), text) << "text: " << printable(text);
  }
  for (const SplitCase &c : kSplits) {
    Ids ids;
    enc.encode(c.text, ids);
    EXPECT_EQ(enc.decode(ids.data(), ids.size()), c.text) << "text: " << printable(c.text);
  }
}

// Just enough JSON for gpt2_reference.jsonl: {"text": "...", "ids": [...]}.
class ReferenceLine {
public:
  explicit ReferenceLine(const std::string &line) : s_(line) {}

  bool parse(std::string &text, Ids &ids, bool &hasIds) {
    hasIds = false;
    ws();
    if (!eat('{'))
      return false;
    for (;;) {
      ws();
      std::string key;
      if (!str(key))
        return false;
      ws();
      if (!eat(':'))
        return false;
      ws();
      if (key == "ids") {
        hasIds = true;
        if (!eat('['))
          return false;
        ws();
        if (!eat(']')) {
          for (;;) {
            ws();
            long v = 0;
            size_t start = i_;
            while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9')
              v = v * 10 + (s_[i_++] - '0');
            if (i_ == start)
              return false;
            ids.push_back(static_cast<int32_t>(v));
            ws();
            if (eat(']'))
              break;
            if (!eat(','))
              return false;
          }
        }
      } else {
        std::string value;
        if (!str(value))
          return false;
        if (key == "text")
          text = value;
      }
      ws();
      if (eat('}'))
        return true;
      if (!eat(','))
        return false;
    }
  }

private:
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r'))
      ++i_;
  }
  bool eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool hex4(uint32_t &v) {
    if (i_ + 4 > s_.size())
      return false;
    v = static_cast<uint32_t>(std::stoul(s_.substr(i_, 4), nullptr, 16));
    i_ += 4;
    return true;
  }
  bool str(std::string &out) {
    if (!eat('"'))
      return false;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size())
        return false;
      char e = s_[i_++];
      switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'u': {
        uint32_t cp;
        if (!hex4(cp))
          return false;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          uint32_t lo;
          if (!eat('\\') || !eat('u') || !hex4(lo))
            return false;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp < 0x80) {
          out += static_cast<char>(cp);
        } else if (cp < 0x800) {
          out += static_cast<char>(0xC0 | (cp >> 6));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
          out += static_cast<char>(0xE0 | (cp >> 12));
          out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
          out += static_cast<char>(0xF0 | (cp >> 18));
          out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
          out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        }
        break;
      }
      default: out += e; break; // \" \\ \/
      }
    }
    return eat('"');
  }

  const std::string &s_;
  size_t i_ = 0;
};

// Every text of gpt2_reference.jsonl (written by make_gpt2_reference.py with
// HF tokenizers) must get exactly HF's ids. One encoder for all, so cached
// pieces are exercised too.
TEST_F(Gpt2FilesTest, MatchesHfTokenizers) {
  std::string root = sourceRoot();
  ASSERT_FALSE(root.empty()) << "cannot find the source tree (test/unit/Inputs)";
  std::string path = root + "/test/unit/Inputs/gpt2_reference.jsonl";
  std::ifstream f(path, std::ios::binary);
  ASSERT_TRUE(f) << "cannot read " << path;
  Gpt2Encoder enc(*vocab_);
  std::string line;
  size_t lineNo = 0, compared = 0, bytes = 0;
  while (std::getline(f, line)) {
    ++lineNo;
    std::string text;
    Ids expected;
    bool hasIds;
    ASSERT_TRUE(ReferenceLine(line).parse(text, expected, hasIds)) << path << ":" << lineNo;
    if (!hasIds)
      continue; // the generator's note
    Ids ids;
    enc.encode(text, ids);
    EXPECT_EQ(ids, expected) << path << ":" << lineNo << ": text: " << printable(text);
    ++compared;
    bytes += text.size();
  }
  EXPECT_GT(compared, 400u);
  std::printf("compared %zu texts (%zu bytes) with HF tokenizers\n", compared, bytes);
}

} // namespace
