// mt-preprocess end to end on a small hand-made vocabulary: Megatron's
// document semantics, order kept across worker counts, bad input refused with
// nothing written.
#include "runtime/data/indexed_dataset.h"
#include "runtime/data/preprocess.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace {

// GPT-2's byte -> printable code point map (bytes_to_unicode).
std::string byteSymbol(int b) {
  int cp;
  bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  if (printable) {
    cp = b;
  } else {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      bool p = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
      if (!p)
        ++n;
    }
    cp = 256 + n;
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

std::string jsonEscape(const std::string &s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o;
}

class PreprocessTest : public ::testing::Test {
protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mt-preprocess-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
    // Ids 0..255: byte b is id b. Merges: "h e" (256 "he"), "l l" (257 "ll"),
    // "he ll" (258 "hell"); then <|endoftext|> = 259.
    std::ostringstream vocab;
    vocab << "{";
    for (int b = 0; b < 256; ++b)
      vocab << "\"" << jsonEscape(byteSymbol(b)) << "\": " << b << ", ";
    vocab << "\"he\": 256, \"ll\": 257, \"hell\": 258, \"<|endoftext|>\": 259}";
    write("vocab.json", vocab.str());
    write("merges.txt", "#version: 0.2\nh e\nl l\nhe ll\n");
  }
  void TearDown() override { std::system(("rm -rf '" + dir + "'").c_str()); }

  void write(const std::string &name, const std::string &text) {
    std::ofstream(dir + "/" + name, std::ios::binary) << text;
  }
  bool exists(const std::string &name) {
    struct stat st {};
    return ::stat((dir + "/" + name).c_str(), &st) == 0;
  }
  std::string read(const std::string &name) {
    std::ifstream f(dir + "/" + name, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  int run(std::vector<std::string> extra) {
    std::vector<std::string> args = {"--vocab-file", dir + "/vocab.json", "--merge-file",
                                     dir + "/merges.txt", "--quiet"};
    args.insert(args.end(), extra.begin(), extra.end());
    return mt::rt::run_mt_preprocess(args);
  }
  std::unique_ptr<mt::rt::IndexedDataset> open(const std::string &prefix) {
    std::string err;
    auto ds = mt::rt::IndexedDataset::open(dir + "/" + prefix, &err);
    EXPECT_TRUE(ds) << err;
    return ds;
  }
  std::vector<int32_t> sequence(const mt::rt::IndexedDataset &ds, uint64_t i) {
    std::vector<int32_t> out(static_cast<size_t>(ds.sequence_length(i)));
    ds.read(i, 0, out.size(), out.data());
    return out;
  }

  std::string dir;
};

TEST_F(PreprocessTest, MegatronDocumentSemantics) {
  // A string, an empty string (a document with no sequences, as Megatron
  // records it), and a list of sentences (one sequence each, empty ones
  // dropped, EOD on the last).
  write("in.jsonl", "{\"text\": \"hello\"}\n"
                    "{\"text\": \"\"}\n"
                    "{\"text\": [\"hell\", \"\", \"he\"], \"id\": 7}\n");
  ASSERT_EQ(run({"--input", dir + "/in.jsonl", "--output-prefix", dir + "/out",
                 "--append-eod", "--workers", "1"}),
            0);
  auto ds = open("out_text_document");
  ASSERT_TRUE(ds);
  EXPECT_EQ(ds->dtype(), mt::rt::TokenDtype::UInt16);
  EXPECT_EQ(ds->num_documents(), 3u);
  ASSERT_EQ(ds->num_sequences(), 3u);
  std::vector<int64_t> docs;
  for (uint64_t i = 0; i <= ds->num_documents(); ++i)
    docs.push_back(ds->document_index(i));
  EXPECT_EQ(docs, (std::vector<int64_t>{0, 1, 1, 3}));
  // Sequence 1 opens document 2: document 1 is empty.
  EXPECT_EQ(ds->document_of_sequence(1), 2u);
  // "hello" -> he, ll, o via hell: [258, 'o'] + EOD.
  EXPECT_EQ(sequence(*ds, 0), (std::vector<int32_t>{258, 'o', 259}));
  EXPECT_EQ(sequence(*ds, 1), (std::vector<int32_t>{258}));
  EXPECT_EQ(sequence(*ds, 2), (std::vector<int32_t>{256, 259}));
}

TEST_F(PreprocessTest, SameOutputForAnyWorkerCount) {
  std::string text;
  for (int i = 0; i < 5000; ++i)
    text += "{\"text\": \"hello doc " + std::to_string(i) + std::string(i % 37, 'l') + "\"}\n";
  write("in.jsonl", text);
  for (const char *w : {"1", "2", "5"})
    ASSERT_EQ(run({"--input", dir + "/in.jsonl", "--output-prefix", dir + "/w" + w,
                   "--append-eod", "--workers", w}),
              0);
  for (const char *ext : {".bin", ".idx"}) {
    std::string one = read(std::string("w1_text_document") + ext);
    EXPECT_FALSE(one.empty());
    EXPECT_EQ(one, read(std::string("w2_text_document") + ext)) << ext;
    EXPECT_EQ(one, read(std::string("w5_text_document") + ext)) << ext;
  }
  auto ds = open("w5_text_document");
  ASSERT_TRUE(ds);
  EXPECT_EQ(ds->num_documents(), 5000u);
}

TEST_F(PreprocessTest, SeveralKeysWriteOneDatasetEach) {
  write("in.jsonl", "{\"text\": \"hell\", \"title\": \"he\"}\n");
  ASSERT_EQ(run({"--input", dir + "/in.jsonl", "--output-prefix", dir + "/out",
                 "--json-keys", "text", "title"}),
            0);
  auto text = open("out_text_document"), title = open("out_title_document");
  ASSERT_TRUE(text && title);
  EXPECT_EQ(sequence(*text, 0), (std::vector<int32_t>{258}));
  EXPECT_EQ(sequence(*title, 0), (std::vector<int32_t>{256}));
}

TEST_F(PreprocessTest, PlainTextLinesAndFiles) {
  write("a.doc", "hello\n\nhe");
  write("b.doc", "hell\n");
  ASSERT_EQ(run({"--input", dir + "/a.doc", dir + "/b.doc", "--input-format", "text",
                 "--output-prefix", dir + "/lines"}),
            0);
  auto lines = open("lines_text_document");
  ASSERT_TRUE(lines);
  EXPECT_EQ(lines->num_documents(), 4u); // "hello", "", "he", "hell"
  EXPECT_EQ(lines->num_sequences(), 3u);

  ASSERT_EQ(run({"--input", dir + "/*.doc", "--input-format", "text", "--document-per-file",
                 "--output-prefix", dir + "/files"}),
            0);
  auto files = open("files_text_document");
  ASSERT_TRUE(files);
  EXPECT_EQ(files->num_documents(), 2u);
  // a.doc is one document: "hello\n\nhe" -> hell o \n \n he
  EXPECT_EQ(sequence(*files, 0), (std::vector<int32_t>{258, 'o', '\n', '\n', 256}));
}

TEST_F(PreprocessTest, BadLineStopsAndWritesNothing) {
  write("in.jsonl", "{\"text\": \"hello\"}\n{\"text\": \"he\"\n{\"text\": \"hell\"}\n");
  EXPECT_EQ(run({"--input", dir + "/in.jsonl", "--output-prefix", dir + "/out"}), 1);
  EXPECT_FALSE(exists("out_text_document.bin"));
  EXPECT_FALSE(exists("out_text_document.idx"));
  // No temporaries are left either.
  EXPECT_EQ(std::system(("test -z \"$(ls '" + dir + "' | grep out)\"").c_str()), 0);
}

TEST_F(PreprocessTest, SkipBadDocumentsKeepsTheRest) {
  write("in.jsonl", "{\"text\": \"hello\"}\nnot json\n{\"other\": 1}\n[1]\n{\"text\": 5}\n"
                    "{\"text\": \"he\"}\n");
  ASSERT_EQ(run({"--input", dir + "/in.jsonl", "--output-prefix", dir + "/out",
                 "--skip-bad-documents"}),
            0);
  auto ds = open("out_text_document");
  ASSERT_TRUE(ds);
  EXPECT_EQ(ds->num_documents(), 2u);
}

TEST_F(PreprocessTest, UsageErrors) {
  EXPECT_EQ(run({"--output-prefix", dir + "/out"}), 2);                    // no input
  EXPECT_EQ(run({"--input", dir + "/x.jsonl"}), 2);                        // no output
  EXPECT_EQ(run({"--input", dir + "/x", "--output-prefix", "o", "--workers", "0"}), 2);
  EXPECT_EQ(run({"--input", dir + "/x", "--output-prefix", "o", "--split-sentences"}), 2);
  EXPECT_EQ(run({"--input", dir + "/x", "--output-prefix", "o", "--bogus"}), 2);
  EXPECT_EQ(run({"--input", dir + "/missing.jsonl", "--output-prefix", dir + "/o"}), 1);
  EXPECT_EQ(run({"--input", dir + "/*.none", "--output-prefix", dir + "/o"}), 1);
}

} // namespace

// Megatron prints its progress rates with Python's float repr; each string
// below is what `repr(v)` gives in CPython 3.11.
TEST(PythonFloatRepr, MatchesCPython) {
  const std::pair<double, const char *> cases[] = {
      {1.0, "1.0"},
      {0.5, "0.5"},
      {1234.5678901234567, "1234.5678901234567"},
      {1e16, "1e+16"},
      {1.5e16, "1.5e+16"},
      {123456789012345.6, "123456789012345.6"},
      {1e-4, "0.0001"},
      {1.2345e-5, "1.2345e-05"},
      {0.0001234, "0.0001234"},
      {3.0e-300, "3e-300"},
      {2.5e+300, "2.5e+300"},
      {100.0, "100.0"},
      {1e15, "1000000000000000.0"},
      {9999999999999998.0, "9999999999999998.0"},
      {0.1, "0.1"},
      {1.0 / 3, "0.3333333333333333"},
      {2.0 / 3 * 1e-4, "6.666666666666667e-05"},
      {76543.21, "76543.21"},
      {-2.5, "-2.5"},
      {0.0, "0.0"},
  };
  for (const auto &[v, want] : cases)
    EXPECT_EQ(mt::rt::python_float_repr(v), want) << v;
}
