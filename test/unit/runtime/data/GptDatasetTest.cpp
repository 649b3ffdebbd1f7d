// GPT samples as Megatron builds them: numpy's random streams against numbers
// numpy printed, Megatron's split/blend arithmetic against Megatron's Python
// formulas, sample assembly on hand-built datasets checked by hand, the index
// cache (reuse, corruption), and the errors.
#include "runtime/data/gpt_dataset.h"

#include "runtime/data/indexed_dataset.h"
#include "runtime/data/numpy_random.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

using namespace mt::rt;

namespace {

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

// ---------------------------------------------------------------------------
// numpy's streams. Every expected number below was printed by numpy 1.24.
// ---------------------------------------------------------------------------

// python3 -c "import numpy as np; print(list(np.random.RandomState(1234)._bit_generator.random_raw(6)))"
TEST(NumpyRandomTest, RandomStateRawDraws) {
  NumpyRandomState a(1234);
  for (uint32_t v : {822569775u, 2137449171u, 2671936806u, 3512589365u, 1880026316u, 2629000564u})
    EXPECT_EQ(a.next_uint32(), v);
  NumpyRandomState b(0);
  for (uint32_t v : {2357136044u, 2546248239u, 3071714933u})
    EXPECT_EQ(b.next_uint32(), v);
  NumpyRandomState c(4294967295u);
  for (uint32_t v : {419326371u, 479346978u, 3918654476u})
    EXPECT_EQ(c.next_uint32(), v);
}

// python3 -c "import numpy as np; rs = np.random.RandomState(1234);
//   a = np.arange(10, dtype=np.int32); rs.shuffle(a); print(list(a));
//   b = np.arange(20, dtype=np.uint32); rs.shuffle(b); print(list(b))"
TEST(NumpyRandomTest, ShuffleMatchesRandomState) {
  NumpyRandomState rs(1234);
  std::vector<int32_t> a(10);
  std::iota(a.begin(), a.end(), 0);
  rs.shuffle(a.data(), a.size());
  EXPECT_EQ(a, (std::vector<int32_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
  // The stream goes on, as in Megatron where one RandomState shuffles the
  // document index and then the shuffle index.
  std::vector<uint32_t> b(20);
  std::iota(b.begin(), b.end(), 0u);
  rs.shuffle(b.data(), b.size());
  EXPECT_EQ(b, (std::vector<uint32_t>{8, 1, 15, 4, 3, 7, 18, 10, 14, 13, 2, 6, 19, 0, 5, 17, 16,
                                      12, 11, 9}));
}

// python3 -c "import numpy as np; c = np.arange(1000); np.random.RandomState(5).shuffle(c);
//   print(list(c[:12]), int((c * np.arange(1000)).sum()))"
TEST(NumpyRandomTest, ShuffleOfAThousand) {
  NumpyRandomState rs(5);
  std::vector<int64_t> c(1000);
  std::iota(c.begin(), c.end(), 0);
  rs.shuffle(c.data(), c.size());
  EXPECT_EQ(std::vector<int64_t>(c.begin(), c.begin() + 12),
            (std::vector<int64_t>{544, 515, 193, 11, 279, 653, 643, 763, 198, 721, 236, 500}));
  int64_t weighted = 0;
  for (int64_t i = 0; i < 1000; ++i)
    weighted += c[i] * i;
  EXPECT_EQ(weighted, 243748383);
}

// random_interval switches to 64-bit draws (high word first) above 2^32 - 1;
// legacy randint masks and rejects the same way, so numpy shows the value:
// python3 -c "import numpy as np; rs = np.random.RandomState(1234);
//   print(int(rs.randint(0, 2**33 + 12346, dtype=np.uint64)), rs._bit_generator.random_raw(1))"
TEST(NumpyRandomTest, IntervalAbove32Bits) {
  NumpyRandomState rs(1234);
  EXPECT_EQ(rs.interval((uint64_t(1) << 33) + 12345), 2629000564u);
  EXPECT_EQ(rs.next_uint32(), 3373089432u);
  EXPECT_EQ(rs.interval(0), 0u);
}

// python3 -c "import numpy as np; print(list(np.random.SeedSequence(0).generate_state(8)),
//   list(np.random.SeedSequence(2**40 + 5).generate_state(4)))"
TEST(NumpyRandomTest, SeedSequence) {
  EXPECT_EQ(numpy_seed_sequence_state(0, 8),
            (std::vector<uint32_t>{2968811710u, 3677149159u, 745650761u, 2884920346u, 2642120001u,
                                   549907821u, 574372308u, 742431198u}));
  EXPECT_EQ(numpy_seed_sequence_state((uint64_t(1) << 40) + 5, 4),
            (std::vector<uint32_t>{3767146251u, 3672381269u, 2127416108u, 2216012776u}));
}

// python3 -c "import numpy as np; print(list(np.random.default_rng(0).bit_generator.random_raw(4)),
//   list(np.random.default_rng(1234).bit_generator.random_raw(2)))"
TEST(NumpyRandomTest, Pcg64RawDraws) {
  NumpyDefaultRng a(0);
  for (uint64_t v : {11749869230777074271ull, 4976686463289251617ull, 755828109848996024ull,
                     304881062738325533ull})
    EXPECT_EQ(a.next_uint64(), v);
  NumpyDefaultRng b(1234);
  EXPECT_EQ(b.next_uint64(), 18016930633132456890ull);
  EXPECT_EQ(b.next_uint64(), 7013373421822782593ull);
}

// python3 -c "import numpy as np; g = lambda: np.random.default_rng(3);
//   print(list(g().integers(-5, 7, size=10, dtype=np.int32)),
//         list(g().integers(-2**31, 2**31, size=3, dtype=np.int32)))"
TEST(NumpyRandomTest, IntegersInt32) {
  NumpyDefaultRng a(3);
  std::vector<int32_t> got;
  for (int i = 0; i < 10; ++i)
    got.push_back(a.integers_int32(-5, 7));
  EXPECT_EQ(got, (std::vector<int32_t>{4, -4, -3, -3, -3, 4, 5, 1, -5, -4}));
  NumpyDefaultRng b(3);
  got.clear();
  for (int i = 0; i < 3; ++i)
    got.push_back(b.integers_int32(INT32_MIN, int64_t(1) << 31));
  EXPECT_EQ(got, (std::vector<int32_t>{1337901816, -1779623277, -1376791563}));
  // A one-value range draws nothing.
  NumpyDefaultRng d(3), e(3);
  EXPECT_EQ(d.integers_int32(4, 5), 4);
  EXPECT_EQ(d.next_uint64(), e.next_uint64());
}

// python3 -c "import numpy as np; L = np.random.default_rng(0).integers(1, 4096, size=100000,
//   dtype=np.int32); print(list(L[:10]), int(L.sum()), int(L[-1]))"
TEST(NumpyRandomTest, MegatronMockLengths) {
  NumpyDefaultRng rng(0);
  std::vector<int32_t> lengths(100000);
  for (int32_t &l : lengths)
    l = rng.integers_int32(1, 4096);
  EXPECT_EQ(std::vector<int32_t>(lengths.begin(), lengths.begin() + 10),
            (std::vector<int32_t>{3484, 2609, 2094, 1105, 1261, 168, 309, 68, 718, 3331}));
  EXPECT_EQ(std::accumulate(lengths.begin(), lengths.end(), int64_t(0)), 204637097);
  EXPECT_EQ(lengths.back(), 769);
}

// python3 -c "import numpy as np; v = np.array([0.1*(i+1) + 1e-3*i*i for i in range(300)]);
//   print(float(v.sum()).hex())"  (a left-to-right sum gives ...667p+13)
TEST(NumpyRandomTest, PairwiseSum) {
  std::vector<double> v;
  for (int i = 0; i < 300; ++i)
    v.push_back(0.1 * (i + 1) + 1e-3 * i * i);
  EXPECT_EQ(numpy_sum(v.data(), v.size()), 0x1.a4f0666666666p+13);
  std::vector<double> w{0.1, 0.2, 0.3, 1e16, -1e16, 0.7, 0.11, 0.13, 0.17, 0.19};
  EXPECT_EQ(numpy_sum(w.data(), w.size()), 0x1.70a3d70a3d70ap-2);
  // python3 -c "import numpy as np; w = np.array([0.3, 0.7, 0.1]);
  //   print([x.hex() for x in (w / w.sum()).tolist()])"
  EXPECT_EQ(numpy_normalize({0.3, 0.7, 0.1}),
            (std::vector<double>{0x1.1745d1745d174p-2, 0x1.45d1745d1745cp-1,
                                 0x1.745d1745d1746p-4}));
}

// ---------------------------------------------------------------------------
// Megatron's arithmetic. Expected values from Megatron's Python, e.g.
// python3 -c "import numpy as np, re, functools
// v = list(map(float, re.findall(r'[.0-9]+', '969,30,1'))); v += [0.0] * (3 - len(v))
// v = (np.array(v) / np.sum(np.array(v))).tolist()
// e = functools.reduce(lambda a, b: a + [a[len(a) - 1] + b], [[0], *v])
// print([None if b <= a else (int(round(a * 17.0)), int(round(b * 17.0))) for a, b in zip(e[:-1], e[1:])])"
// ---------------------------------------------------------------------------

using Range = std::optional<std::pair<int64_t, int64_t>>;

std::array<Range, 3> ranges(const std::string &split, int64_t n) {
  std::array<double, 3> w;
  std::string err = parse_megatron_split(split, &w);
  EXPECT_EQ(err, "") << split;
  return megatron_split_ranges(w, n);
}

Range r(int64_t a, int64_t b) { return std::make_pair(a, b); }

TEST(MegatronSplitTest, RangesAsMegatronRoundsThem) {
  const Range none;
  EXPECT_EQ(ranges("969,30,1", 1000), (std::array<Range, 3>{r(0, 969), r(969, 999), r(999, 1000)}));
  EXPECT_EQ(ranges("969,30,1", 17), (std::array<Range, 3>{r(0, 16), r(16, 17), r(17, 17)}));
  EXPECT_EQ(ranges("969,30,1", 100000),
            (std::array<Range, 3>{r(0, 96900), r(96900, 99900), r(99900, 100000)}));
  EXPECT_EQ(ranges("98,2,0", 50), (std::array<Range, 3>{r(0, 49), r(49, 50), none}));
  EXPECT_EQ(ranges("1,1,1", 100000),
            (std::array<Range, 3>{r(0, 33333), r(33333, 66667), r(66667, 100000)}));
  EXPECT_EQ(ranges("1,1,1", 10), (std::array<Range, 3>{r(0, 3), r(3, 7), r(7, 10)}));
  EXPECT_EQ(ranges("100,0,0", 7), (std::array<Range, 3>{r(0, 7), none, none}));
  // Round half to even: 4.5 -> 4, 2.5 -> 2.
  EXPECT_EQ(ranges("0.5/0.25/0.25", 6), (std::array<Range, 3>{r(0, 3), r(3, 4), r(4, 6)}));
  EXPECT_EQ(ranges("2,2", 5), (std::array<Range, 3>{r(0, 2), r(2, 5), none}));
  EXPECT_EQ(ranges("80,10,10", 5), (std::array<Range, 3>{r(0, 4), r(4, 4), r(4, 5)}));
  EXPECT_EQ(ranges("949,50,1", 333), (std::array<Range, 3>{r(0, 316), r(316, 333), r(333, 333)}));
  EXPECT_EQ(ranges("1", 3), (std::array<Range, 3>{r(0, 3), none, none}));
  EXPECT_EQ(ranges("0,1,0", 4), (std::array<Range, 3>{none, r(0, 4), none}));
  EXPECT_EQ(ranges("7,2,1", 45), (std::array<Range, 3>{r(0, 31), r(31, 40), r(40, 45)}));
}

TEST(MegatronSplitTest, BadSplitStrings) {
  std::array<double, 3> w;
  EXPECT_TRUE(contains(parse_megatron_split("abc", &w), "has no numbers"));
  EXPECT_TRUE(contains(parse_megatron_split("1,2,3,4", &w), "has 4 numbers"));
  EXPECT_TRUE(contains(parse_megatron_split("0,0,0", &w), "gives every split 0"));
  EXPECT_TRUE(contains(parse_megatron_split("1.2.3,1", &w), "'1.2.3' is not a number"));
  EXPECT_EQ(parse_megatron_split("969, 30, 1", &w), "");
  EXPECT_EQ(w[0], 0.969);
}

// The greedy blend of helpers.cpp, and core 0.8's ceil(n * w * 1.005) requests;
// expected values from a Python transcription of both.
TEST(MegatronBlendTest, BlendingIndices) {
  std::vector<double> w = numpy_normalize(numpy_normalize({0.3, 0.7}));
  std::vector<int16_t> di(12);
  std::vector<int64_t> dsi(12);
  megatron_blending_indices(w, 12, di.data(), dsi.data());
  EXPECT_EQ(di, (std::vector<int16_t>{1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1}));
  EXPECT_EQ(dsi, (std::vector<int64_t>{0, 0, 1, 2, 1, 3, 4, 2, 5, 6, 3, 7}));
  w = numpy_normalize(numpy_normalize({1, 2, 3}));
  megatron_blending_indices(w, 12, di.data(), dsi.data());
  EXPECT_EQ(di, (std::vector<int16_t>{2, 1, 0, 2, 1, 2, 0, 2, 1, 2, 1, 2}));
  EXPECT_EQ(dsi, (std::vector<int64_t>{0, 0, 0, 1, 1, 2, 1, 3, 2, 4, 3, 5}));

  EXPECT_EQ(megatron_blend_requests(numpy_normalize({0.3, 0.7}), 1000),
            (std::vector<int64_t>{302, 704}));
  EXPECT_EQ(megatron_blend_requests(numpy_normalize({1, 2, 3}), 200),
            (std::vector<int64_t>{34, 67, 101}));
  EXPECT_EQ(megatron_blend_requests(numpy_normalize({1, 1}), 0), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(megatron_blend_requests(numpy_normalize({0.1, 0.2, 0.7}), 1000),
            (std::vector<int64_t>{101, 201, 704}));
}

TEST(MegatronBlendTest, NumSamplesPerSplit) {
  // get_train_valid_test_num_samples: 500 iterations of 8, eval every 100 for 10.
  EXPECT_EQ(megatron_num_samples(500, 8, 100, 10), (std::array<int64_t, 3>{4000, 480, 80}));
  EXPECT_EQ(megatron_num_samples(99, 4, 100, 5), (std::array<int64_t, 3>{396, 20, 20}));
  EXPECT_EQ(megatron_num_samples(10, 2, 0, 3), (std::array<int64_t, 3>{20, 6, 6}));
}

// ---------------------------------------------------------------------------
// Samples from hand-built datasets.
// ---------------------------------------------------------------------------

class GptDatasetTest : public ::testing::Test {
protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mt-gpt-dataset-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  // Documents of one sequence each.
  std::string write(const std::string &name, const std::vector<std::vector<int32_t>> &docs,
                    TokenDtype dtype = TokenDtype::UInt16) {
    std::string prefix = dir_ + "/" + name;
    std::string err;
    auto w = IndexedDatasetWriter::create(prefix, dtype, &err);
    EXPECT_NE(w, nullptr) << err;
    for (const auto &d : docs)
      EXPECT_EQ(w->add_document(d.data(), d.size()), "");
    EXPECT_EQ(w->finish(), "");
    return prefix;
  }

  // Three documents: 100..104, 200..202, 300..306 (15 tokens).
  std::string small() { return write("small", {{100, 101, 102, 103, 104}, {200, 201, 202},
                                               {300, 301, 302, 303, 304, 305, 306}}); }

  GptDataConfig config(const std::string &prefix, int64_t seq_length) {
    GptDataConfig c;
    c.blend = {{1.0, prefix}};
    c.split = "1,0,0";
    c.seq_length = seq_length;
    c.cache_dir = dir_ + "/cache";
    return c;
  }

  std::vector<std::vector<int32_t>> all(const GptDataset &ds) {
    std::vector<std::vector<int32_t>> out;
    for (int64_t i = 0; i < ds.size(); ++i) {
      std::vector<int32_t> t(ds.seq_length() + 1);
      EXPECT_EQ(ds.sample(i, t.data()), "");
      out.push_back(t);
    }
    return out;
  }

  std::vector<std::string> cache_files() {
    std::vector<std::string> out;
    if (DIR *d = ::opendir((dir_ + "/cache").c_str())) {
      while (dirent *e = ::readdir(d))
        if (e->d_name[0] != '.')
          out.push_back(dir_ + "/cache/" + e->d_name);
      ::closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  std::string dir_;
};

TEST_F(GptDatasetTest, OneEpochSamplesByHand) {
  // 3 samples of 4 + 1 tokens need 13 of the 15 tokens: one epoch, and
  // (15 - 1) / 4 = 3 samples. RandomState(1234) orders the documents [0, 1, 2]
  // and the samples [1, 2, 0]:
  // python3 -c "import numpy as np; rs = np.random.RandomState(1234);
  //   d = np.arange(3, dtype=np.int32); rs.shuffle(d); s = np.arange(3, dtype=np.uint32);
  //   rs.shuffle(s); print(list(d), list(s))"
  std::string err;
  auto ds = GptDataset::build(config(small(), 4), DataSplit::Train, 3, &err);
  ASSERT_NE(ds, nullptr) << err;
  EXPECT_EQ(ds->size(), 3);
  // Unshuffled, sample k is tokens [4k, 4k + 5) of 100..104 200..202 300..306.
  EXPECT_EQ(all(*ds), (std::vector<std::vector<int32_t>>{{104, 200, 201, 202, 300},
                                                         {300, 301, 302, 303, 304},
                                                         {100, 101, 102, 103, 104}}));
  EXPECT_TRUE(contains(ds->describe(), "1 epoch"));
}

TEST_F(GptDatasetTest, SeparateFinalEpochByHand) {
  // 4 samples need 17 tokens: 2 epochs. The final epoch would serve
  // 4 - (15 - 1) / 4 = 1 sample, under int(0.8 * 3) = 2, so it is shuffled
  // apart: documents [0, 1, 2] then [1, 2, 0], samples [2, 1, 0] then
  // [3, 5, 4, 6]:
  // python3 -c "import numpy as np; rs = np.random.RandomState(1234)
  //   for a in [np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int32),
  //             np.arange(3, dtype=np.uint32), np.arange(3, 7, dtype=np.uint32)]:
  //       rs.shuffle(a); print(list(a))"
  std::string err;
  auto ds = GptDataset::build(config(small(), 4), DataSplit::Train, 4, &err);
  ASSERT_NE(ds, nullptr) << err;
  EXPECT_EQ(ds->size(), 7); // (2 * 15 - 1) / 4
  // Stream: 100..104 200..202 300..306 | 200..202 300..306 100..104.
  const std::vector<std::vector<int32_t>> unshuffled{
      {100, 101, 102, 103, 104}, {104, 200, 201, 202, 300}, {300, 301, 302, 303, 304},
      {304, 305, 306, 200, 201}, {201, 202, 300, 301, 302}, {302, 303, 304, 305, 306},
      {306, 100, 101, 102, 103}};
  std::vector<std::vector<int32_t>> expected;
  for (int k : {2, 1, 0, 3, 5, 4, 6})
    expected.push_back(unshuffled[k]);
  EXPECT_EQ(all(*ds), expected);
  EXPECT_TRUE(contains(ds->describe(), "2 epochs (the last shuffled apart)"));
}

TEST_F(GptDatasetTest, OrderHashFollowsWhatTheSamplesHold) {
  // The indices of OneEpochSamplesByHand (3 samples: unshuffled 1, 2, 0) and
  // SeparateFinalEpochByHand (4 samples: 2, 1, 0, 3, ...).
  std::string err;
  auto three = GptDataset::build(config(small(), 4), DataSplit::Train, 3, &err);
  auto four = GptDataset::build(config(small(), 4), DataSplit::Train, 4, &err);
  auto again = GptDataset::build(config(small(), 4), DataSplit::Train, 4, &err);
  ASSERT_TRUE(three && four && again) << err;
  const uint64_t s = GptDataset::kOrderHashStart;
  // The same index, built twice: the same hash.
  EXPECT_EQ(four->order_hash(s, 0, 7), again->order_hash(s, 0, 7));
  // The same three pieces of text in another order: another hash.
  EXPECT_NE(three->order_hash(s, 0, 3), four->order_hash(s, 0, 3));
  // Sample 2 is unshuffled sample 0 in both: the same piece, the same step.
  EXPECT_EQ(three->order_hash(s, 2, 3), four->order_hash(s, 2, 3));
  // It continues: [0, 2) then [2, 7) is [0, 7); and past the end it wraps
  // as the training loop reads samples (i % size()).
  EXPECT_EQ(four->order_hash(four->order_hash(s, 0, 2), 2, 7), four->order_hash(s, 0, 7));
  EXPECT_EQ(three->order_hash(three->order_hash(s, 0, 3), 3, 6),
            three->order_hash(three->order_hash(s, 0, 3), 0, 3));
  EXPECT_NE(four->order_hash(s, 0, 7), four->order_hash(s, 0, 6));
}

TEST_F(GptDatasetTest, TwoEpochsShuffledTogether) {
  // 5 samples: 2 epochs; the final one serves 5 - 3 = 2 >= 2 samples, so both
  // epochs are shuffled as one: documents [2, 1, 2, 0, 1, 0], samples
  // [5, 0, 3, 4, 2, 6, 1] (numpy, as above with one shuffle each).
  std::string err;
  auto ds = GptDataset::build(config(small(), 4), DataSplit::Train, 5, &err);
  ASSERT_NE(ds, nullptr) << err;
  ASSERT_EQ(ds->size(), 7);
  // Stream: 300..306 200..202 300..306 100..104 200..202 100..104.
  const std::vector<std::vector<int32_t>> unshuffled{
      {300, 301, 302, 303, 304}, {304, 305, 306, 200, 201}, {201, 202, 300, 301, 302},
      {302, 303, 304, 305, 306}, {306, 100, 101, 102, 103}, {103, 104, 200, 201, 202},
      {202, 100, 101, 102, 103}};
  std::vector<std::vector<int32_t>> expected;
  for (int k : {5, 0, 3, 4, 2, 6, 1})
    expected.push_back(unshuffled[k]);
  EXPECT_EQ(all(*ds), expected);
}

TEST_F(GptDatasetTest, SamplesSpanEmptyAndShortDocuments) {
  // Documents 0 and 2 are empty, 3 has one token; every sample is a window of
  // the stream in document index order whatever the shuffle, so check the
  // multiset of samples against all windows.
  std::string prefix = write("gaps", {{}, {1, 2, 3}, {}, {4}, {5, 6, 7, 8, 9, 10}});
  std::string err;
  auto ds = GptDataset::build(config(prefix, 3), DataSplit::Train, 3, &err);
  ASSERT_NE(ds, nullptr) << err;
  EXPECT_EQ(ds->size(), 3); // (10 - 1) / 3
  auto got = all(*ds);
  for (const auto &s : got) {
    ASSERT_EQ(s.size(), 4u);
    // Consecutive ids of one document stream: each is a window of 4 tokens.
    std::vector<int32_t> sorted = s;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
  }
}

TEST_F(GptDatasetTest, ValidAndTestSplits) {
  // 10 documents of 4 tokens, split "6,2,2": valid is documents [6, 8).
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 10; ++d)
    docs.push_back({d * 10, d * 10 + 1, d * 10 + 2, d * 10 + 3});
  std::string prefix = write("ten", docs);
  GptDataConfig c = config(prefix, 3);
  c.split = "6,2,2";
  std::string err;
  auto valid = GptDataset::build(c, DataSplit::Valid, 2, &err);
  ASSERT_NE(valid, nullptr) << err;
  EXPECT_EQ(valid->size(), 2); // (8 - 1) / 3
  for (const auto &s : all(*valid))
    for (int32_t t : s)
      EXPECT_TRUE(t >= 60 && t < 80) << t;
  auto test = GptDataset::build(c, DataSplit::Test, 0, &err);
  ASSERT_NE(test, nullptr) << err;
  EXPECT_EQ(test->size(), 2); // 0 asked still builds one epoch, as Megatron does
  EXPECT_TRUE(contains(valid->describe(), "valid documents [6, 8) of 10"));
}

TEST_F(GptDatasetTest, CacheIsReusedAndCorruptionRebuilt) {
  std::string prefix = small();
  GptDataConfig c = config(prefix, 4);
  std::string err;
  auto first = GptDataset::build(c, DataSplit::Train, 4, &err);
  ASSERT_NE(first, nullptr) << err;
  EXPECT_FALSE(first->loaded_from_cache());
  auto files = cache_files();
  ASSERT_EQ(files.size(), 1u);
  EXPECT_TRUE(contains(files[0], "-GPTDataset-train.mtidx"));
  struct stat st1 {};
  ASSERT_EQ(::stat(files[0].c_str(), &st1), 0);
  const auto expected = all(*first);

  auto second = GptDataset::build(c, DataSplit::Train, 4, &err);
  ASSERT_NE(second, nullptr) << err;
  EXPECT_TRUE(second->loaded_from_cache());
  EXPECT_TRUE(contains(second->describe(), "loaded"));
  EXPECT_EQ(all(*second), expected);
  struct stat st2 {};
  ASSERT_EQ(::stat(files[0].c_str(), &st2), 0);
  EXPECT_EQ(st1.st_ino, st2.st_ino); // not rewritten

  // Truncated: detected by size, rebuilt, same samples.
  ASSERT_EQ(::truncate(files[0].c_str(), st1.st_size - 8), 0);
  auto third = GptDataset::build(c, DataSplit::Train, 4, &err);
  ASSERT_NE(third, nullptr) << err;
  EXPECT_FALSE(third->loaded_from_cache());
  EXPECT_TRUE(contains(third->describe(), "cached in " + files[0] +
                                              "; rebuilt because the index file there was "
                                              "unusable: it has"))
      << third->describe();
  EXPECT_EQ(all(*third), expected);
  struct stat st3 {};
  ASSERT_EQ(::stat(files[0].c_str(), &st3), 0);
  EXPECT_EQ(st3.st_size, st1.st_size);

  // A flipped header byte: detected by the checksum.
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(60);
    f.put('\x7f');
  }
  auto fourth = GptDataset::build(c, DataSplit::Train, 4, &err);
  ASSERT_NE(fourth, nullptr) << err;
  EXPECT_FALSE(fourth->loaded_from_cache());
  EXPECT_EQ(all(*fourth), expected);
  EXPECT_TRUE(GptDataset::build(c, DataSplit::Train, 4, &err)->loaded_from_cache());

  // One byte of the last array (the shuffle index) changed so that every
  // entry stays in range: the arrays' checksum catches it.
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const std::streamoff end = f.tellg();
    // The shuffle index (uint32 entries) ends the file: a byte of one entry
    // becomes the byte of the next, a sample number the index has.
    f.seekg(end - 16 + 4);
    const char other = static_cast<char>(f.get());
    f.seekp(end - 16);
    f.put(other);
  }
  auto fifth = GptDataset::build(c, DataSplit::Train, 4, &err);
  ASSERT_NE(fifth, nullptr) << err;
  EXPECT_FALSE(fifth->loaded_from_cache());
  EXPECT_TRUE(contains(fifth->describe(), "its arrays do not match their checksum"))
      << fifth->describe();
  EXPECT_EQ(all(*fifth), expected);

  // Another seed or sample count is another file.
  c.seed = 7;
  ASSERT_NE(GptDataset::build(c, DataSplit::Train, 4, &err), nullptr);
  ASSERT_NE(GptDataset::build(c, DataSplit::Train, 5, &err), nullptr);
  EXPECT_EQ(cache_files().size(), 3u);
  for (const auto &f : cache_files())
    EXPECT_FALSE(contains(f, ".tmp.")) << f;
}

TEST_F(GptDatasetTest, DefaultCacheFolderIsMegatrons) {
  std::string prefix = small();
  GptDataConfig c = config(prefix, 4);
  c.cache_dir = "";
  std::string err;
  auto ds = GptDataset::build(c, DataSplit::Train, 3, &err);
  ASSERT_NE(ds, nullptr) << err;
  EXPECT_TRUE(contains(ds->describe(), prefix + "/cache/GPTDataset_indices/"));
  struct stat st {};
  EXPECT_EQ(::stat((prefix + "/cache/GPTDataset_indices").c_str(), &st), 0);
}

TEST_F(GptDatasetTest, BlendTakesMegatronsSamplesFromEachDataset) {
  std::vector<std::vector<int32_t>> a, b;
  for (int d = 0; d < 20; ++d) {
    a.push_back(std::vector<int32_t>(3 + d % 5, 1000 + d));
    b.push_back(std::vector<int32_t>(2 + d % 7, 2000 + d));
  }
  std::string pa = write("a", a), pb = write("b", b);
  GptDataConfig c = config(pa, 4);
  c.blend = {{0.3, pa}, {0.7, pb}};
  std::string err;
  auto blend = GptDataset::build(c, DataSplit::Train, 10, &err);
  ASSERT_NE(blend, nullptr) << err;
  // Requests ceil(10 * w * 1.005) = 4 and 8; the blend's size is their sum.
  EXPECT_EQ(blend->size(), 12);
  auto pa_ds = GptDataset::build(config(pa, 4), DataSplit::Train, 4, &err);
  auto pb_ds = GptDataset::build(config(pb, 4), DataSplit::Train, 8, &err);
  ASSERT_TRUE(pa_ds && pb_ds) << err;
  auto sa = all(*pa_ds), sb = all(*pb_ds);
  auto got = all(*blend);
  const std::vector<int> which{1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1};
  const std::vector<int> index{0, 0, 1, 2, 1, 3, 4, 2, 5, 6, 3, 7};
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i], which[i] ? sb[index[i]] : sa[index[i]]) << i;
  EXPECT_TRUE(contains(blend->describe(), "blend of 2 datasets"));
  // With a cache folder the blend indices are cached too.
  auto again = GptDataset::build(c, DataSplit::Train, 10, &err);
  ASSERT_NE(again, nullptr) << err;
  EXPECT_TRUE(again->loaded_from_cache());
  EXPECT_EQ(all(*again), got);
}

TEST_F(GptDatasetTest, MockDataLooksLikeMegatrons) {
  GptDataConfig c;
  c.mock = true;
  c.seq_length = 64;
  c.vocab_size = 50257;
  std::string err;
  auto ds = GptDataset::build(c, DataSplit::Train, 20, &err);
  ASSERT_NE(ds, nullptr) << err;
  EXPECT_TRUE(contains(ds->describe(), "train documents [0, 33,333) of 100,000 (split '1,1,1')"));
  // Mock documents are 1, 2, ..., n - 1 and then EOD (vocab - 1).
  std::vector<int32_t> s(65);
  for (int64_t i = 0; i < 2000; ++i) {
    ASSERT_EQ(ds->sample(i, s.data()), "");
    for (size_t k = 0; k + 1 < s.size(); ++k) {
      if (s[k] == 50256)
        EXPECT_TRUE(s[k + 1] == 1 || s[k + 1] == 50256);
      else
        EXPECT_TRUE(s[k + 1] == s[k] + 1 || s[k + 1] == 50256);
    }
  }
}

// A sample outside the index is an error line, never an abort (a negative
// one came from a damaged consumed_train_samples before the checkpoint's
// numbers were range-checked).
TEST_F(GptDatasetTest, SampleOutsideTheIndexIsAnError) {
  std::string err;
  auto ds = GptDataset::build(config(small(), 4), DataSplit::Train, 3, &err);
  ASSERT_NE(ds, nullptr) << err;
  std::vector<int32_t> t(5);
  const std::string n = std::to_string(ds->size());
  EXPECT_EQ(ds->sample(-506, t.data()),
            "data: error: sample -506 asked of a train split of " + n + " samples");
  EXPECT_EQ(ds->sample(ds->size(), t.data()),
            "data: error: sample " + n + " asked of a train split of " + n + " samples");
  EXPECT_EQ(ds->sample(INT64_MIN, t.data()).rfind("data: error: sample -9223372036854775808", 0),
            0u);
  EXPECT_EQ(ds->sample(0, t.data()), "");
}

TEST_F(GptDatasetTest, Errors) {
  std::string prefix = small();
  std::string err;
  GptDataConfig c = config(prefix, 4);

  c.split = "969,30,1"; // 3 documents: valid is [3, 3)
  EXPECT_EQ(GptDataset::build(c, DataSplit::Valid, 8, &err), nullptr);
  EXPECT_EQ(err, "data: split 'valid' of " + prefix +
                     " has 0 documents; change [data] split '969,30,1' or add data");

  c.split = "100,0,0";
  EXPECT_EQ(GptDataset::build(c, DataSplit::Test, 8, &err), nullptr);
  EXPECT_TRUE(contains(err, "split 'test' of " + prefix + " gets no share of [data] split "
                            "'100,0,0'")) << err;
  auto none = GptDataset::build(c, DataSplit::Test, 0, &err);
  ASSERT_NE(none, nullptr) << err;
  EXPECT_EQ(none->size(), 0);

  c.split = "1,0,0";
  EXPECT_EQ(GptDataset::build(c, DataSplit::Train, int64_t(1) << 40, &err), nullptr);
  EXPECT_TRUE(contains(err, prefix + " has 15 tokens, too few for 1,099,511,627,776 samples "
                                     "of 5 tokens")) << err;

  std::string tiny = write("tiny", {{7}});
  EXPECT_EQ(GptDataset::build(config(tiny, 4), DataSplit::Train, 1, &err), nullptr);
  EXPECT_TRUE(contains(err, "has 1 document but 1 token, too few")) << err;

  c.vocab_size = 300; // ids 300..306 are out
  EXPECT_EQ(GptDataset::build(c, DataSplit::Train, 3, &err), nullptr);
  EXPECT_EQ(err, "data: " + prefix + " has token id 300 (document 2, sequence 2, position 0), "
                 "outside the vocabulary [0, 300); re-run mt-preprocess with the model's "
                 "tokenizer or fix [model] vocab_size");
  c.vocab_size = 307;
  EXPECT_NE(GptDataset::build(c, DataSplit::Train, 3, &err), nullptr) << err;
  c.vocab_size = 300; // the check holds for indices from the cache too
  EXPECT_EQ(GptDataset::build(c, DataSplit::Train, 3, &err), nullptr);
  EXPECT_TRUE(contains(err, "token id 300")) << err;
  c.vocab_size = 0;

  c.seq_length = 1;
  EXPECT_EQ(GptDataset::build(c, DataSplit::Train, 3, &err), nullptr);
  EXPECT_TRUE(contains(err, "seq_length 1 is out of range")) << err;
  c.seq_length = 4;
  c.seed = uint64_t(1) << 32;
  EXPECT_EQ(GptDataset::build(c, DataSplit::Train, 3, &err), nullptr);
  EXPECT_TRUE(contains(err, "does not fit numpy's RandomState")) << err;
  c.seed = 1234;
  c.split = "1,2,3,4";
  EXPECT_EQ(GptDataset::build(c, DataSplit::Train, 3, &err), nullptr);
  EXPECT_TRUE(contains(err, "has 4 numbers")) << err;
  c.split = "1,0,0";

  GptDataConfig m;
  m.mock = true;
  m.seq_length = 8;
  EXPECT_EQ(GptDataset::build(m, DataSplit::Train, 3, &err), nullptr);
  EXPECT_TRUE(contains(err, "mock data needs the vocabulary size")) << err;
  m.blend = {{1.0, prefix}};
  m.vocab_size = 10;
  EXPECT_EQ(GptDataset::build(m, DataSplit::Train, 3, &err), nullptr);
  EXPECT_TRUE(contains(err, "both mock data and a data path")) << err;

  EXPECT_EQ(GptDataset::build(config(dir_ + "/missing", 4), DataSplit::Train, 3, &err), nullptr);
  EXPECT_TRUE(contains(err, dir_ + "/missing.idx: error: cannot open")) << err;
}

} // namespace
