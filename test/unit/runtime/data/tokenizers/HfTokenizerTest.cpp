// HuggingFaceTokenizer through the Tokenizer interface: the stored test
// tokenizers (test/preprocess/Inputs/hf, trained by HF tokenizers 0.23.3)
// give the library's ids (their expected.txt) from encoders used by several
// threads at once, each reused over the documents in a shuffled order (the
// per-encoder cache must not change an id); byte-level ones decode back to
// the text; vocabulary size and eod are the library's.
#include "runtime/data/tokenizers/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Ids = std::vector<int32_t>;

const std::string kDir = std::string(MT_SOURCE_DIR) + "/test/preprocess/Inputs/hf/";

// The "text" string of one corpus.jsonl line ({"text": "..."}), unescaped
// as JSON says (\uXXXX with surrogate pairs included).
std::string jsonText(const std::string &line) {
  size_t i = line.find(": \"") + 3;
  std::string out;
  auto put = [&](uint32_t cp) {
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
  };
  while (line[i] != '"') {
    if (line[i] != '\\') {
      out += line[i++];
      continue;
    }
    char e = line[i + 1];
    i += 2;
    switch (e) {
    case 'n': out += '\n'; break;
    case 't': out += '\t'; break;
    case 'r': out += '\r'; break;
    case 'b': out += '\b'; break;
    case 'f': out += '\f'; break;
    case 'u': {
      uint32_t cp = std::stoul(line.substr(i, 4), nullptr, 16);
      i += 4;
      if (cp >= 0xD800 && cp < 0xDC00 && line.compare(i, 2, "\\u") == 0) {
        uint32_t lo = std::stoul(line.substr(i + 2, 4), nullptr, 16);
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        i += 6;
      }
      put(cp);
      break;
    }
    default: out += e;
    }
  }
  return out;
}

struct Case {
  std::vector<std::string> texts;
  std::vector<Ids> ids;
  size_t vocab = 0;
  int32_t eod = -1;
};

Case load(const std::string &name) {
  Case c;
  std::ifstream corpus(kDir + "corpus.jsonl");
  for (std::string line; std::getline(corpus, line);)
    c.texts.push_back(jsonText(line));
  std::ifstream expected(kDir + name + "/expected.txt");
  std::string line, word;
  std::getline(expected, line);
  std::istringstream head(line);
  head >> word >> c.vocab >> word >> c.eod;
  while (std::getline(expected, line)) {
    std::istringstream in(line);
    Ids ids;
    for (int32_t id; in >> id;)
      ids.push_back(id);
    c.ids.push_back(ids);
  }
  c.ids.resize(c.texts.size()); // the invalid-UTF-8 lines follow; not used here
  return c;
}

std::shared_ptr<const mt::rt::Tokenizer> open(const std::string &name) {
  mt::rt::TokenizerOptions o;
  o.type = "HuggingFaceTokenizer";
  o.model = kDir + name;
  std::string error;
  auto t = mt::rt::load_tokenizer(o, &error);
  EXPECT_TRUE(t) << error;
  return t;
}

class HfTokenizerTest : public ::testing::TestWithParam<const char *> {};

TEST_P(HfTokenizerTest, ThreadsAndReusedEncodersGiveTheLibrarysIds) {
  Case c = load(GetParam());
  auto tok = open(GetParam());
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->vocab_size(), c.vocab);
  EXPECT_EQ(tok->eod(), c.eod);
  std::vector<std::string> failures(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto enc = tok->encoder();
      std::vector<size_t> order(c.texts.size());
      for (size_t i = 0; i < order.size(); ++i)
        order[i] = i;
      std::mt19937 rng(t);
      for (int round = 0; round < 3; ++round) {
        std::shuffle(order.begin(), order.end(), rng);
        for (size_t i : order) {
          Ids got;
          enc->encode(c.texts[i], got);
          if (got != c.ids[i] && failures[t].empty())
            failures[t] = "document " + std::to_string(i) + " differs in thread " +
                          std::to_string(t) + " round " + std::to_string(round);
        }
      }
    });
  }
  for (auto &th : threads)
    th.join();
  for (const std::string &f : failures)
    EXPECT_EQ(f, "");
}

INSTANTIATE_TEST_SUITE_P(Stored, HfTokenizerTest,
                         ::testing::Values("llama3", "gpt2", "qwen", "llama2", "mistral", "unigram",
                                           "unigram-unk", "falcon", "wordlevel", "bert"));

// Byte-level BPE loses nothing: the ids decode to the text (after the BOS
// the Llama-3 form adds; but for the white space an lstrip/rstrip token
// takes).
TEST(HfTokenizerDecode, ByteLevelRoundTrip) {
  for (const char *name : {"llama3", "gpt2", "falcon"}) {
    Case c = load(name);
    auto tok = open(name);
    ASSERT_TRUE(tok);
    auto enc = tok->encoder();
    std::string bos = std::string(name) == "llama3" ? "<|begin_of_text|>" : "";
    for (const std::string &text : c.texts) {
      // The spaces an lstrip/rstrip added token takes are gone, as in HF.
      if (text.find("[MASK]") != std::string::npos)
        continue;
      Ids ids;
      enc->encode(text, ids);
      EXPECT_EQ(tok->decode(ids.data(), ids.size()), bos + text) << name;
    }
  }
}

} // namespace
