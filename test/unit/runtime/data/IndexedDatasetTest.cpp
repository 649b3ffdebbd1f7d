// Megatron indexed dataset: writer bytes against hand-packed expected bytes,
// writer -> reader round trips, edge cases, and every reader validation error.
#include "runtime/data/indexed_dataset.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

using mt::rt::IndexedDataset;
using mt::rt::IndexedDatasetWriter;
using mt::rt::TokenDtype;

namespace {

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

// Explicit little-endian packing, independent of the code under test.
void packU(std::string &out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out += static_cast<char>((v >> (8 * i)) & 0xFF);
}
void packI32(std::string &out, int32_t v) { packU(out, static_cast<uint32_t>(v), 4); }
void packI64(std::string &out, int64_t v) { packU(out, static_cast<uint64_t>(v), 8); }

// Megatron's _IndexWriter layout, packed field by field.
std::string megatronIdx(uint8_t code, const std::vector<int32_t> &lengths, int itemsize,
                        const std::vector<int64_t> &docs) {
  std::string out("MMIDIDX\0\0", 9);
  packU(out, 1, 8);
  packU(out, code, 1);
  packU(out, lengths.size(), 8);
  packU(out, docs.size(), 8);
  for (int32_t l : lengths)
    packI32(out, l);
  int64_t at = 0;
  for (int32_t l : lengths) {
    packI64(out, at);
    at += int64_t(l) * itemsize;
  }
  for (int64_t d : docs)
    packI64(out, d);
  return out;
}

class IndexedDatasetTest : public ::testing::Test {
protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mt-indexed-dataset-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
    prefix = dir + "/ds";
  }
  void TearDown() override { std::system(("rm -rf '" + dir + "'").c_str()); }

  std::string read(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  void write(const std::string &path, const std::string &bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }
  std::vector<std::string> files() {
    std::vector<std::string> names;
    DIR *d = opendir(dir.c_str());
    while (dirent *e = readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..")
        names.push_back(e->d_name);
    closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }
  std::unique_ptr<IndexedDatasetWriter> writer(TokenDtype dtype) {
    std::string err;
    auto w = IndexedDatasetWriter::create(prefix, dtype, &err);
    EXPECT_TRUE(w) << err;
    return w;
  }
  // Error of opening `prefix` ("" when it opens).
  std::string openError() {
    std::string err;
    auto ds = IndexedDataset::open(prefix, &err);
    return ds ? "" : err;
  }
  std::vector<int32_t> sequence(const IndexedDataset &ds, uint64_t i) {
    std::vector<int32_t> out(static_cast<size_t>(ds.sequence_length(i)));
    ds.read(i, 0, out.size(), out.data());
    return out;
  }
  // A valid small uint16 dataset: 3 sequences, 3 documents (one empty).
  void writeSmall() {
    auto w = writer(TokenDtype::UInt16);
    std::vector<int32_t> a = {1, 2, 3}, b = {4, 5};
    ASSERT_EQ(w->add_document(a.data(), a.size(), {2, 1}), "");
    ASSERT_EQ(w->add_document(nullptr, 0, {}), "");
    ASSERT_EQ(w->add_document(b.data(), b.size()), "");
    ASSERT_EQ(w->finish(), "");
  }
  // Overwrites bytes of PREFIX.idx at `offset`.
  void patchIdx(size_t offset, const std::string &bytes) {
    std::string idx = read(prefix + ".idx");
    idx.replace(offset, bytes.size(), bytes);
    write(prefix + ".idx", idx);
  }

  std::string dir, prefix;
};

// writeSmall()'s .idx offsets: lengths at 34, pointers at 46, documents at 70.
constexpr size_t kLengthsAt = 34, kPointersAt = 46, kDocsAt = 70;

TEST(TokenDtypeTest, SizesNamesAndMegatronChoice) {
  EXPECT_EQ(mt::rt::dtype_size(TokenDtype::UInt16), 2u);
  EXPECT_EQ(mt::rt::dtype_size(TokenDtype::Int32), 4u);
  EXPECT_EQ(mt::rt::dtype_size(TokenDtype::Float64), 8u);
  EXPECT_STREQ(mt::rt::dtype_name(TokenDtype::UInt16), "uint16");
  EXPECT_STREQ(mt::rt::dtype_name(TokenDtype::Int32), "int32");
  EXPECT_EQ(static_cast<int>(TokenDtype::UInt16), 8);
  EXPECT_EQ(mt::rt::dtype_for_vocab_size(50257), TokenDtype::UInt16);
  EXPECT_EQ(mt::rt::dtype_for_vocab_size(65499), TokenDtype::UInt16);
  EXPECT_EQ(mt::rt::dtype_for_vocab_size(65500), TokenDtype::Int32);
  EXPECT_EQ(mt::rt::dtype_for_vocab_size(128256), TokenDtype::Int32);
}

TEST_F(IndexedDatasetTest, ExactBytesUInt16) {
  writeSmall();
  std::string expectedIdx = megatronIdx(8, {2, 1, 2}, 2, {0, 2, 2, 3});
  EXPECT_EQ(expectedIdx.size(), 34u + 3 * 4 + 3 * 8 + 4 * 8);
  EXPECT_EQ(read(prefix + ".idx"), expectedIdx);
  EXPECT_EQ(read(prefix + ".bin"), std::string("\1\0\2\0\3\0\4\0\5\0", 10));
  EXPECT_EQ(files(), (std::vector<std::string>{"ds.bin", "ds.idx"}));
}

TEST_F(IndexedDatasetTest, ExactBytesInt32) {
  auto w = writer(TokenDtype::Int32);
  std::vector<int32_t> a = {70000, 0, 50256};
  ASSERT_EQ(w->add_document(a.data(), 1), "");
  ASSERT_EQ(w->add_document(a.data() + 1, 2, {1, 1}), "");
  ASSERT_EQ(w->finish(), "");
  EXPECT_EQ(read(prefix + ".idx"), megatronIdx(4, {1, 1, 1}, 4, {0, 1, 3}));
  std::string bin;
  for (int32_t t : a)
    packI32(bin, t);
  EXPECT_EQ(read(prefix + ".bin"), bin);
}

TEST_F(IndexedDatasetTest, ReadsHandPackedMegatronFiles) {
  // As Megatron would write 2 documents: [7, 8 | 9] and [65535].
  write(prefix + ".idx", megatronIdx(8, {2, 1, 1}, 2, {0, 2, 3}));
  write(prefix + ".bin", std::string("\7\0\x08\0\x09\0\xff\xff", 8));
  std::string err;
  auto ds = IndexedDataset::open(prefix, &err);
  ASSERT_TRUE(ds) << err;
  EXPECT_EQ(ds->dtype(), TokenDtype::UInt16);
  EXPECT_EQ(ds->num_documents(), 2u);
  EXPECT_EQ(ds->num_sequences(), 3u);
  EXPECT_EQ(ds->num_tokens(), 4u);
  EXPECT_EQ(ds->sequence_offset(2), 6);
  EXPECT_EQ(sequence(*ds, 0), (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(sequence(*ds, 2), (std::vector<int32_t>{65535}));
  EXPECT_EQ((std::vector<int64_t>{ds->document_index(0), ds->document_index(1),
                                  ds->document_index(2)}),
            (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(ds->document_of_sequence(0), 0u);
  EXPECT_EQ(ds->document_of_sequence(1), 0u);
  EXPECT_EQ(ds->document_of_sequence(2), 1u);
}

TEST_F(IndexedDatasetTest, RoundTrip) {
  for (TokenDtype dtype : {TokenDtype::UInt16, TokenDtype::Int32}) {
    std::mt19937 rng(42);
    int32_t maxId = dtype == TokenDtype::UInt16 ? 65535 : 200000;
    std::vector<std::vector<std::vector<int32_t>>> docs(300);
    auto w = writer(dtype);
    uint64_t tokens = 0;
    for (auto &doc : docs) {
      std::vector<int32_t> flat, lengths;
      doc.resize(rng() % 4); // 0..3 sequences
      for (auto &seq : doc) {
        seq.resize(rng() % 50);
        for (int32_t &t : seq)
          t = static_cast<int32_t>(rng() % (uint32_t(maxId) + 1));
        flat.insert(flat.end(), seq.begin(), seq.end());
        lengths.push_back(static_cast<int32_t>(seq.size()));
      }
      tokens += flat.size();
      ASSERT_EQ(w->add_document(flat.data(), flat.size(), lengths), "");
    }
    EXPECT_EQ(w->num_documents(), 300u);
    EXPECT_EQ(w->num_tokens(), tokens);
    ASSERT_EQ(w->finish(), "");

    std::string err;
    auto ds = IndexedDataset::open(prefix, &err);
    ASSERT_TRUE(ds) << err;
    EXPECT_EQ(ds->dtype(), dtype);
    EXPECT_EQ(ds->num_documents(), 300u);
    EXPECT_EQ(ds->num_tokens(), tokens);
    uint64_t s = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
      ASSERT_EQ(ds->document_index(d), static_cast<int64_t>(s));
      for (const auto &seq : docs[d])
        ASSERT_EQ(sequence(*ds, s++), seq);
    }
    EXPECT_EQ(ds->document_index(docs.size()), static_cast<int64_t>(s));
    EXPECT_EQ(ds->num_sequences(), s);
    // A slice from the middle of a sequence.
    for (uint64_t i = 0; i < s; ++i) {
      if (ds->sequence_length(i) < 10)
        continue;
      std::vector<int32_t> all = sequence(*ds, i), part(5);
      ds->read(i, 3, 5, part.data());
      EXPECT_EQ(part, std::vector<int32_t>(all.begin() + 3, all.begin() + 8));
      break;
    }
  }
}

TEST_F(IndexedDatasetTest, EveryDtypeRoundTrips) {
  for (TokenDtype dtype : {TokenDtype::UInt8, TokenDtype::Int8, TokenDtype::Int16,
                           TokenDtype::Int64, TokenDtype::Float32, TokenDtype::Float64}) {
    auto w = writer(dtype);
    std::vector<int32_t> t = {0, 1, 100, 127};
    ASSERT_EQ(w->add_document(t.data(), t.size()), "");
    ASSERT_EQ(w->finish(), "");
    std::string err;
    auto ds = IndexedDataset::open(prefix, &err);
    ASSERT_TRUE(ds) << err;
    EXPECT_EQ(ds->dtype(), dtype);
    EXPECT_EQ(sequence(*ds, 0), t) << mt::rt::dtype_name(dtype);
    EXPECT_EQ(read(prefix + ".bin").size(), 4 * mt::rt::dtype_size(dtype));
  }
}

TEST_F(IndexedDatasetTest, EmptyDatasetIsMegatrons) {
  // IndexedDatasetBuilder with no documents: S = 0, document_indices = [0].
  auto w = writer(TokenDtype::UInt16);
  ASSERT_EQ(w->finish(), "");
  std::string expected("MMIDIDX\0\0", 9);
  packU(expected, 1, 8);
  packU(expected, 8, 1);
  packU(expected, 0, 8);
  packU(expected, 1, 8);
  packI64(expected, 0);
  EXPECT_EQ(read(prefix + ".idx"), expected);
  EXPECT_EQ(read(prefix + ".bin"), "");
  std::string err;
  auto ds = IndexedDataset::open(prefix, &err);
  ASSERT_TRUE(ds) << err;
  EXPECT_EQ(ds->num_documents(), 0u);
  EXPECT_EQ(ds->num_sequences(), 0u);
  EXPECT_EQ(ds->num_tokens(), 0u);
  EXPECT_EQ(ds->document_index(0), 0);
}

TEST_F(IndexedDatasetTest, EmptyDocuments) {
  // No sequences (preprocess_data.py's empty text) vs one empty sequence
  // (add_item of nothing + end_document).
  auto w = writer(TokenDtype::UInt16);
  ASSERT_EQ(w->add_document(nullptr, 0, {}), "");
  ASSERT_EQ(w->add_document(nullptr, 0), "");
  ASSERT_EQ(w->finish(), "");
  EXPECT_EQ(read(prefix + ".idx"), megatronIdx(8, {0}, 2, {0, 0, 1}));
  std::string err;
  auto ds = IndexedDataset::open(prefix, &err);
  ASSERT_TRUE(ds) << err;
  EXPECT_EQ(ds->num_documents(), 2u);
  EXPECT_EQ(ds->num_sequences(), 1u);
  EXPECT_EQ(ds->sequence_length(0), 0);
}

TEST_F(IndexedDatasetTest, TokenOutOfDtypeRangeIsRefused) {
  auto w = writer(TokenDtype::UInt16);
  std::vector<int32_t> ok = {1, 2}, big = {5, 65536}, neg = {-1};
  ASSERT_EQ(w->add_document(ok.data(), ok.size()), "");
  std::string err = w->add_document(big.data(), big.size());
  EXPECT_EQ(err, prefix + ".bin: error: token id 65536 (document 1, position 1) does not fit "
                          "the dataset's dtype uint16 (0..65535); use int32 (Megatron picks "
                          "uint16 only for vocabularies under 65500 ids)");
  EXPECT_PRED2(contains, w->add_document(neg.data(), neg.size()), "token id -1 ");
  // A refused document leaves nothing behind: the writer goes on.
  ASSERT_EQ(w->add_document(ok.data(), ok.size()), "");
  EXPECT_EQ(w->num_documents(), 2u);
  ASSERT_EQ(w->finish(), "");
  EXPECT_EQ(read(prefix + ".bin"), std::string("\1\0\2\0\1\0\2\0", 8));
}

TEST_F(IndexedDatasetTest, LengthsMustAddUp) {
  auto w = writer(TokenDtype::Int32);
  std::vector<int32_t> t = {1, 2, 3};
  EXPECT_EQ(w->add_document(t.data(), t.size(), {1, 1}),
            prefix + ".bin: error: document 0 has 3 tokens but its sequence lengths add up to 2");
  EXPECT_PRED2(contains, w->add_document(t.data(), t.size(), {4, -1}), "negative sequence length");
}

TEST_F(IndexedDatasetTest, UnfinishedWriterLeavesNothing) {
  {
    auto w = writer(TokenDtype::UInt16);
    std::vector<int32_t> t(5000, 7);
    ASSERT_EQ(w->add_document(t.data(), t.size()), "");
    EXPECT_EQ(files().size(), 1u); // the .bin temporary
  }
  EXPECT_TRUE(files().empty());
}

TEST_F(IndexedDatasetTest, FinishReplacesAnOldDataset) {
  write(prefix + ".bin", "old");
  write(prefix + ".idx", "old");
  writeSmall();
  EXPECT_EQ(files(), (std::vector<std::string>{"ds.bin", "ds.idx"}));
  EXPECT_EQ(openError(), "");
  struct stat st {};
  ASSERT_EQ(::stat((prefix + ".idx").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
}

TEST_F(IndexedDatasetTest, WriterInMissingDirectory) {
  std::string err;
  auto w = IndexedDatasetWriter::create(dir + "/no/ds", TokenDtype::UInt16, &err);
  EXPECT_FALSE(w);
  EXPECT_EQ(err, dir + "/no/ds.bin: error: cannot create a temporary file beside it: No such "
                       "file or directory; check the directory exists and is writable");
}

// --- reader validation: one line naming the file, what is wrong, what to do.

const std::string kRerun = "re-run mt-preprocess on the source data";

TEST_F(IndexedDatasetTest, MissingFiles) {
  EXPECT_EQ(openError(), prefix + ".idx: error: cannot open: No such file or directory; check "
                                  "the prefix (PREFIX.bin and PREFIX.idx must both exist)");
  writeSmall();
  ::unlink((prefix + ".bin").c_str());
  EXPECT_PRED2(contains, openError(), prefix + ".bin: error: cannot open: No such file");
}

TEST_F(IndexedDatasetTest, CorruptMagic) {
  writeSmall();
  patchIdx(0, "MMIDIDY");
  EXPECT_EQ(openError(), prefix +
                             ".idx: error: not a Megatron indexed dataset index (no "
                             "\"MMIDIDX\" magic); check the path, or " +
                             kRerun);
  patchIdx(0, std::string("TNTIDX\0\0", 8));
  EXPECT_PRED2(contains, openError(), "legacy 'lazy'/'cached' format (TNTIDX)");
}

TEST_F(IndexedDatasetTest, WrongVersion) {
  writeSmall();
  std::string v;
  packU(v, 2, 8);
  patchIdx(9, v);
  EXPECT_EQ(openError(),
            prefix + ".idx: error: unsupported index version 2 (Megatron writes 1); " + kRerun);
}

TEST_F(IndexedDatasetTest, BadDtypeCode) {
  writeSmall();
  for (char code : {'\0', '\x09'}) {
    patchIdx(17, std::string(1, code));
    EXPECT_EQ(openError(), prefix + ".idx: error: unknown dtype code " + std::to_string(int(code)) +
                               " (Megatron's codes are 1..8); the file is corrupt, " + kRerun);
  }
}

TEST_F(IndexedDatasetTest, TruncatedIdx) {
  writeSmall();
  std::string idx = read(prefix + ".idx");
  write(prefix + ".idx", idx.substr(0, idx.size() - 8));
  EXPECT_EQ(openError(), prefix +
                             ".idx: error: truncated: the header's 3 sequences and 4 "
                             "document indices need 102 bytes, found 94; " +
                             kRerun);
  write(prefix + ".idx", idx.substr(0, 20));
  EXPECT_EQ(openError(), prefix +
                             ".idx: error: truncated: 20 bytes, shorter than the 34-byte "
                             "header; " +
                             kRerun);
  write(prefix + ".idx", idx.substr(0, 4));
  EXPECT_PRED2(contains, openError(), "truncated: 4 bytes");
  write(prefix + ".idx", "");
  EXPECT_PRED2(contains, openError(), "truncated: 0 bytes");
  // Counts so large that their byte size overflows 64 bits.
  std::string huge = idx.substr(0, 34);
  huge.replace(18, 8, std::string(8, '\xff'));
  write(prefix + ".idx", huge);
  EXPECT_PRED2(contains, openError(), "truncated: the header's 18446744073709551615 sequences");
}

TEST_F(IndexedDatasetTest, TrailingBytesInIdx) {
  writeSmall();
  write(prefix + ".idx", read(prefix + ".idx") + std::string(8, '\0'));
  EXPECT_PRED2(contains, openError(), ".idx: error: 8 bytes past the end");
  writeSmall();
  // One extra byte per sequence: a multimodal index's modes.
  write(prefix + ".idx", read(prefix + ".idx") + std::string(3, '\0'));
  EXPECT_PRED2(contains, openError(), "multimodal index");
}

TEST_F(IndexedDatasetTest, TruncatedOrLongerBin) {
  writeSmall();
  write(prefix + ".bin", std::string(8, '\0'));
  EXPECT_EQ(openError(), prefix + ".bin: error: truncated: " + prefix +
                             ".idx describes 10 bytes, found 8; copy the file again or " + kRerun);
  write(prefix + ".bin", std::string(12, '\0'));
  EXPECT_EQ(openError(), prefix + ".bin: error: has 12 bytes but " + prefix +
                             ".idx describes 10; the two files do not belong together, " + kRerun);
}

TEST_F(IndexedDatasetTest, NegativeLength) {
  writeSmall();
  std::string l;
  packI32(l, -2);
  patchIdx(kLengthsAt + 4, l);
  EXPECT_EQ(openError(), prefix +
                             ".idx: error: sequence 1 has negative length -2; the file is "
                             "corrupt, " +
                             kRerun);
}

TEST_F(IndexedDatasetTest, InconsistentPointers) {
  writeSmall();
  std::string p;
  packI64(p, 5);
  patchIdx(kPointersAt + 16, p);
  EXPECT_EQ(openError(), prefix +
                             ".idx: error: sequence 2 starts at byte 5 of the .bin, "
                             "expected 6 (where sequence 1 ends); the file is corrupt, " +
                             kRerun);
  writeSmall();
  patchIdx(kPointersAt, p);
  EXPECT_PRED2(contains, openError(), "sequence 0 starts at byte 5 of the .bin, expected 0;");
  // A length that no longer matches its pointers.
  writeSmall();
  std::string l;
  packI32(l, 1);
  patchIdx(kLengthsAt, l);
  EXPECT_PRED2(contains, openError(), "sequence 1 starts at byte 4 of the .bin, expected 2");
}

TEST_F(IndexedDatasetTest, DocumentIndices) {
  std::string v;
  writeSmall();
  packI64(v, 1);
  patchIdx(kDocsAt, v);
  EXPECT_EQ(openError(), prefix +
                             ".idx: error: document indices start at 1, expected 0; the "
                             "file is corrupt, " +
                             kRerun);
  writeSmall();
  patchIdx(kDocsAt + 16, v); // [0, 2, 1, 3]
  EXPECT_EQ(openError(), prefix +
                             ".idx: error: document index 2 (1) is smaller than the one "
                             "before (2); the file is corrupt, " +
                             kRerun);
  writeSmall();
  v.clear();
  packI64(v, 2);
  patchIdx(kDocsAt + 24, v); // [0, 2, 2, 2]
  EXPECT_EQ(openError(), prefix +
                             ".idx: error: document indices end at 2 but there are 3 "
                             "sequences; the file is corrupt, " +
                             kRerun);
  // No document indices at all (Megatron always writes the leading 0).
  write(prefix + ".idx", megatronIdx(8, {}, 2, {}));
  write(prefix + ".bin", "");
  EXPECT_PRED2(contains, openError(), "no document indices");
}

} // namespace
