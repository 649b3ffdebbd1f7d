// Training checkpoints: round trips, the tracker, one clear error per kind of
// damage, and crash safety (a child killed at every step of a save, and at
// random moments).
#include "runtime/ckpt/checkpoint.h"
#include "runtime/base/crc32c.h"
#include "runtime/ckpt/checkpoint_layout.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

using mt::rt::CheckpointMeta;
using mt::rt::CheckpointReader;
using mt::rt::CheckpointTensor;

namespace {

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

std::string readFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void writeFile(const std::string &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}
std::vector<std::string> listDir(const std::string &dir) {
  std::vector<std::string> names;
  if (DIR *d = opendir(dir.c_str())) {
    while (dirent *e = readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..")
        names.push_back(e->d_name);
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Bit-at-a-time CRC32C, independent of the code under test.
uint32_t referenceCrc32c(const unsigned char *p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

// A set of tensors that owns its bytes; contents depend on seed.
struct Model {
  std::vector<std::vector<unsigned char>> storage;
  std::vector<CheckpointTensor> tensors;

  void add(const std::string &name, const std::string &dtype, std::vector<int64_t> shape,
           size_t elem, uint32_t seed) {
    size_t n = elem;
    for (int64_t d : shape)
      n *= static_cast<size_t>(d);
    std::vector<unsigned char> bytes(n);
    std::mt19937 rng(seed);
    for (auto &b : bytes)
      b = static_cast<unsigned char>(rng());
    storage.push_back(std::move(bytes));
    tensors.push_back({name, dtype, shape, nullptr, n});
  }
  // Pointers are taken once storage stops moving.
  const std::vector<CheckpointTensor> &list() {
    for (size_t i = 0; i < tensors.size(); ++i)
      tensors[i].data = storage[i].data();
    return tensors;
  }
};

Model smallModel(uint32_t seed) {
  Model m;
  m.add("embedding.word_embeddings.weight", "f32", {16, 8}, 4, seed + 1);
  m.add("decoder.layers.0.mlp.linear_fc1.weight", "bf16", {32, 8}, 2, seed + 2);
  m.add("decoder.layers.0.input_layernorm.weight", "f16", {8}, 2, seed + 3);
  m.add("optimizer.step", "i64", {}, 8, seed + 4);
  m.add("data.shuffle", "i32", {2, 3, 5}, 4, seed + 5);
  m.add("rng.philox", "u64", {2}, 8, seed + 6);
  m.add("empty", "f32", {0, 4}, 4, seed + 7);
  m.add("raw", "u8", {3}, 1, seed + 8);
  return m;
}

CheckpointMeta sampleMeta(int64_t iteration) {
  CheckpointMeta m;
  m.iteration = iteration;
  m.consumed_train_samples = iteration * 8;
  m.consumed_valid_samples = 3;
  m.spec_toml = "[model]\nnum_layers = 2\nname = \"tiny \\\"gpt\\\"\"\t# caf\xc3\xa9 \x01\n";
  m.model_fingerprint = "gpt:h8:l2:v16";
  m.rng_state = {1, 0xFFFFFFFFFFFFFFFFull, 1234567890123456789ull};
  m.loss_scale = 65536.0 / 3.0;
  m.loss_scale_growth_tracker = 17;
  m.loss_scale_hysteresis_tracker = 2;
  m.values = {{"lr", "0.00029999999999999997"}, {"quote\"key", "line\nbreak"}};
  return m;
}

class CheckpointTest : public ::testing::Test {
protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mt-checkpoint-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
    save = dir + "/save";
  }
  void TearDown() override {
    mt::rt::set_checkpoint_step_hook(nullptr);
    std::system(("rm -rf '" + dir + "'").c_str());
  }

  std::string saveModel(Model &m, int64_t iteration, const std::string &where = "") {
    return mt::rt::save_checkpoint(where.empty() ? save : where, sampleMeta(iteration), m.list());
  }
  std::unique_ptr<CheckpointReader> open(int64_t iteration, std::string *err,
                                         const std::string &where = "") {
    return CheckpointReader::open(where.empty() ? save : where, iteration, 0, 0, 1, err);
  }
  std::string openError(int64_t iteration = -1) {
    std::string err;
    auto r = open(iteration, &err);
    EXPECT_EQ(r, nullptr) << "opened although an error was expected";
    return err;
  }
  // Every tensor of m reads back bit for bit.
  void expectTensors(const CheckpointReader &r, Model &m) {
    for (const CheckpointTensor &t : m.list()) {
      std::vector<unsigned char> got(t.bytes + 1, 0xAB);
      ASSERT_EQ(r.read(t.name, t.dtype, t.shape, got.data(), t.bytes), "") << t.name;
      if (t.bytes) {
        EXPECT_EQ(0, std::memcmp(got.data(), t.data, t.bytes)) << t.name;
      }
      EXPECT_EQ(got[t.bytes], 0xAB) << t.name << ": wrote past the end";
    }
  }
  std::string rankFile(int64_t iteration) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "/iter_%07lld", static_cast<long long>(iteration));
    return save + buf + "/mp_rank_00.mtckpt";
  }

  std::string dir, save;
};

TEST(Crc32cTest, KnownValueAndReference) {
  EXPECT_EQ(mt::rt::crc32c("123456789", 9), 0xE3069283u); // RFC 3720's check value
  EXPECT_EQ(mt::rt::crc32c("", 0), 0u);
  // RFC 3720 B.4: 32 bytes of zeros, of ones, ascending, descending.
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[size_t(i)] = uint8_t(i);
    down[size_t(i)] = uint8_t(31 - i);
  }
  EXPECT_EQ(mt::rt::crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(mt::rt::crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(mt::rt::crc32c(up.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(mt::rt::crc32c(down.data(), 32), 0x113FDB5Cu);
  std::vector<unsigned char> buf(4096 + 16);
  std::mt19937 rng(7);
  for (auto &b : buf)
    b = static_cast<unsigned char>(rng());
  for (size_t start : {0, 1, 3, 7})
    for (size_t n : {0, 1, 7, 8, 9, 63, 64, 1000, 4096}) {
      EXPECT_EQ(mt::rt::crc32c(buf.data() + start, n), referenceCrc32c(buf.data() + start, n))
          << start << "+" << n;
      // Continuing a CRC over two pieces equals one pass.
      size_t half = n / 3;
      uint32_t c = mt::rt::crc32c(buf.data() + start, half);
      EXPECT_EQ(mt::rt::crc32c(buf.data() + start + half, n - half, c),
                referenceCrc32c(buf.data() + start, n));
    }
}

TEST(CheckpointNames, MegatronRankNames) {
  EXPECT_EQ(mt::rt::checkpoint_rank_name(0, 0, 1), "mp_rank_00");
  EXPECT_EQ(mt::rt::checkpoint_rank_name(7, 0, 1), "mp_rank_07");
  EXPECT_EQ(mt::rt::checkpoint_rank_name(3, 5, 8), "mp_rank_03_005");
  EXPECT_EQ(mt::rt::checkpoint_rank_name(0, 0, 2), "mp_rank_00_000");
}

TEST_F(CheckpointTest, RoundTripTensorsAndMetadata) {
  Model m = smallModel(1);
  ASSERT_EQ(saveModel(m, 100), "");
  EXPECT_TRUE(mt::rt::checkpoint_exists(save));
  EXPECT_EQ(listDir(save),
            (std::vector<std::string>{"iter_0000100", "latest_checkpointed_iteration.txt"}));
  EXPECT_EQ(listDir(save + "/iter_0000100"), std::vector<std::string>{"mp_rank_00.mtckpt"});

  std::string err;
  auto r = open(-1, &err);
  ASSERT_NE(r, nullptr) << err;
  EXPECT_EQ(r->path(), rankFile(100));
  const CheckpointMeta want = sampleMeta(100), &got = r->meta();
  EXPECT_EQ(got.iteration, 100);
  EXPECT_EQ(got.consumed_train_samples, want.consumed_train_samples);
  EXPECT_EQ(got.consumed_valid_samples, want.consumed_valid_samples);
  EXPECT_EQ(got.spec_toml, want.spec_toml);
  EXPECT_EQ(got.model_fingerprint, want.model_fingerprint);
  EXPECT_EQ(got.rng_state, want.rng_state);
  EXPECT_EQ(got.loss_scale, want.loss_scale); // bit-exact, not approximately
  EXPECT_EQ(got.loss_scale_growth_tracker, 17);
  EXPECT_EQ(got.loss_scale_hysteresis_tracker, 2);
  EXPECT_EQ(got.values, want.values);

  std::vector<std::string> names;
  for (const CheckpointTensor &t : m.list())
    names.push_back(t.name);
  EXPECT_EQ(r->tensor_names(), names);
  EXPECT_TRUE(r->has("raw"));
  EXPECT_FALSE(r->has("nope"));
  expectTensors(*r, m);

  // Tensor data starts 64-byte aligned, and the file starts with the magic.
  std::string bytes = readFile(rankFile(100));
  EXPECT_EQ(bytes.substr(0, 8), std::string("MTCKPT\0\0", 8));
}

TEST_F(CheckpointTest, NoTensorsAndDefaults) {
  CheckpointMeta meta;
  ASSERT_EQ(mt::rt::save_checkpoint(save, meta, {}), "");
  std::string err;
  auto r = open(-1, &err);
  ASSERT_NE(r, nullptr) << err;
  EXPECT_EQ(r->meta().iteration, 0);
  EXPECT_EQ(r->meta().loss_scale, 1.0);
  EXPECT_TRUE(r->tensor_names().empty());
  EXPECT_TRUE(r->meta().values.empty());
}

TEST_F(CheckpointTest, TrackerPointsToLatestAndIterationsLoad) {
  for (int64_t it : {10, 20, 30}) {
    Model m = smallModel(static_cast<uint32_t>(it));
    ASSERT_EQ(saveModel(m, it), "");
    // Exactly what Megatron writes: the number, no newline.
    EXPECT_EQ(readFile(save + "/latest_checkpointed_iteration.txt"), std::to_string(it));
  }
  std::string err;
  auto latest = open(-1, &err);
  ASSERT_NE(latest, nullptr) << err;
  EXPECT_EQ(latest->meta().iteration, 30);
  Model m30 = smallModel(30);
  expectTensors(*latest, m30);

  auto older = open(20, &err);
  ASSERT_NE(older, nullptr) << err;
  EXPECT_EQ(older->meta().iteration, 20);
  Model m20 = smallModel(20);
  expectTensors(*older, m20);

  // Megatron's reader strips whitespace; so does ours.
  writeFile(save + "/latest_checkpointed_iteration.txt", "10\n");
  auto ten = open(-1, &err);
  ASSERT_NE(ten, nullptr) << err;
  EXPECT_EQ(ten->meta().iteration, 10);

  EXPECT_EQ(openError(25), "no checkpoint for iteration 25 in " + save +
                               " (iter_0000025 does not exist; there are 10, 20, 30); name one "
                               "of those iterations");
}

TEST_F(CheckpointTest, SavingAnIterationAgainReplacesIt) {
  Model a = smallModel(1), b = smallModel(2);
  ASSERT_EQ(saveModel(a, 5), "");
  ASSERT_EQ(saveModel(b, 5), "");
  std::string err;
  auto r = open(5, &err);
  ASSERT_NE(r, nullptr) << err;
  expectTensors(*r, b);
  EXPECT_EQ(listDir(save),
            (std::vector<std::string>{"iter_0000005", "latest_checkpointed_iteration.txt"}));
}

TEST_F(CheckpointTest, PipelineRankFileNames) {
  Model m = smallModel(3);
  ASSERT_EQ(mt::rt::save_checkpoint(save, sampleMeta(4), m.list(), 1, 2, 4), "");
  EXPECT_EQ(listDir(save + "/iter_0000004"), std::vector<std::string>{"mp_rank_01_002.mtckpt"});
  std::string err;
  auto r = CheckpointReader::open(save, -1, 1, 2, 4, &err);
  ASSERT_NE(r, nullptr) << err;
  expectTensors(*r, m);

  // Opening as another rank names the files that are there.
  EXPECT_EQ(CheckpointReader::open(save, -1, 0, 0, 1, &err), nullptr);
  EXPECT_EQ(err, save + "/iter_0000004: error: has no mp_rank_00.mtckpt (it has "
                        "mp_rank_01_002.mtckpt); the checkpoint was saved with a different "
                        "tensor/pipeline parallel layout: convert it with 'mtc reshard', or load "
                        "it with the layout it was saved with");

  // A file of the same naming (mp_rank_TT_PPP) is missing from the layout
  // that is there: a save that did not finish, not another layout.
  EXPECT_EQ(CheckpointReader::open(save, -1, 0, 2, 4, &err), nullptr);
  EXPECT_EQ(err, save + "/iter_0000004: error: has no mp_rank_00_002.mtckpt (it has "
                        "mp_rank_01_002.mtckpt); the save that made it did not finish or the "
                        "file was deleted: load an earlier iteration instead, or start from "
                        "scratch");

  // A file renamed to another rank's name is caught by its metadata.
  ASSERT_EQ(0, rename((save + "/iter_0000004/mp_rank_01_002.mtckpt").c_str(),
                      (save + "/iter_0000004/mp_rank_00_002.mtckpt").c_str()));
  EXPECT_EQ(CheckpointReader::open(save, -1, 0, 2, 4, &err), nullptr);
  EXPECT_TRUE(contains(err, "was saved by mp_rank_01_002 (pipeline size 4); files were renamed "
                            "or copied between ranks"))
      << err;
}

// The steps a multi-rank save is made of: every rank's file goes into one
// staging directory, and the commit renames it only when all are there.
TEST_F(CheckpointTest, StagedSaveOfSeveralRanks) {
  Model a = smallModel(1), b = smallModel(2);
  ASSERT_EQ(saveModel(a, 1), "");
  std::string staging;
  ASSERT_EQ(mt::rt::begin_checkpoint_save(save, 2, &staging), "");
  EXPECT_EQ(staging.rfind(save + "/.tmp.iter_0000002.", 0), 0u) << staging;
  ASSERT_EQ(mt::rt::write_checkpoint_files(staging, sampleMeta(2), b.list(), 0, 0, 2), "");
  ASSERT_EQ(mt::rt::write_checkpoint_files(staging, sampleMeta(2), b.list(), 0, 1, 2), "");

  // A rank's file is missing: nothing moves, the staging directory goes.
  std::vector<std::string> files = {"mp_rank_00_000.mtckpt", "mp_rank_00_001.mtckpt",
                                    "mp_rank_01_000.mtckpt"};
  std::string err = mt::rt::commit_checkpoint_save(save, 2, staging, files);
  EXPECT_TRUE(contains(err, "lacks mp_rank_01_000.mtckpt after every rank reported its files "
                            "written")) << err;
  EXPECT_EQ(listDir(save),
            (std::vector<std::string>{"iter_0000001", "latest_checkpointed_iteration.txt"}));

  // All there: the iteration is in place and the tracker names it.
  ASSERT_EQ(mt::rt::begin_checkpoint_save(save, 2, &staging), "");
  for (int tp = 0; tp < 2; ++tp)
    for (int pp = 0; pp < 2; ++pp)
      ASSERT_EQ(mt::rt::write_checkpoint_files(staging, sampleMeta(2), b.list(), tp, pp, 2), "");
  files.push_back("mp_rank_01_001.mtckpt");
  ASSERT_EQ(mt::rt::commit_checkpoint_save(save, 2, staging, files), "");
  EXPECT_EQ(listDir(save + "/iter_0000002"), files);
  auto r = CheckpointReader::open(save, -1, 1, 1, 2, &err);
  ASSERT_NE(r, nullptr) << err;
  expectTensors(*r, b);
  auto first = CheckpointReader::open_first(save, -1, &err);
  ASSERT_NE(first, nullptr) << err;
  EXPECT_EQ(first->pp_size(), 2);
  EXPECT_EQ(first->path(), save + "/iter_0000002/mp_rank_00_000.mtckpt");

  // An aborted save leaves nothing behind.
  ASSERT_EQ(mt::rt::begin_checkpoint_save(save, 3, &staging), "");
  mt::rt::abort_checkpoint_save(staging);
  EXPECT_EQ(listDir(save), (std::vector<std::string>{"iter_0000001", "iter_0000002",
                                                     "latest_checkpointed_iteration.txt"}));
}

TEST_F(CheckpointTest, MismatchMessages) {
  Model m = smallModel(1);
  ASSERT_EQ(saveModel(m, 1), "");
  std::string err;
  auto r = open(-1, &err);
  ASSERT_NE(r, nullptr) << err;
  std::vector<unsigned char> buf(1 << 16);
  const std::string file = rankFile(1);
  EXPECT_EQ(r->read("decoder.layers.0.mlp.linear_fc1.weight", "bf16", {64, 8}, buf.data(), 1024),
            "checkpoint " + file +
                " has decoder.layers.0.mlp.linear_fc1.weight as [32, 8] bf16 but the plan "
                "expects [64, 8] bf16; this checkpoint is from a different model shape");
  EXPECT_EQ(r->read("decoder.layers.0.mlp.linear_fc1.weight", "f32", {32, 8}, buf.data(), 1024),
            "checkpoint " + file +
                " has decoder.layers.0.mlp.linear_fc1.weight as [32, 8] bf16 but the plan "
                "expects [32, 8] f32; this checkpoint was saved at a different precision");
  EXPECT_EQ(r->read("decoder.layers.1.mlp.linear_fc1.weight", "bf16", {32, 8}, buf.data(), 512),
            "checkpoint " + file +
                " has no tensor 'decoder.layers.1.mlp.linear_fc1.weight' (it holds 8 tensors: "
                "'embedding.word_embeddings.weight', 'decoder.layers.0.mlp.linear_fc1.weight', "
                "'decoder.layers.0.input_layernorm.weight', ...); this checkpoint is from a "
                "different model");
  EXPECT_EQ(r->read("optimizer.step", "i64", {}, buf.data(), 4),
            "checkpoint " + file +
                ": reading optimizer.step [] i64 (8 bytes) into a buffer of 4 "
                "bytes");
  EXPECT_TRUE(contains(r->read("raw", "fp8", {3}, buf.data(), 3), "unknown dtype 'fp8'"));
}

TEST_F(CheckpointTest, SaveRejectsBadInput) {
  std::vector<float> w(4);
  auto one = [&](CheckpointTensor t) { return mt::rt::save_checkpoint(save, sampleMeta(1), {t}); };
  EXPECT_TRUE(contains(one({"w", "f64", {4}, w.data(), 16}),
                       "tensor 'w' has unknown dtype 'f64'; use f32, bf16"));
  EXPECT_TRUE(contains(one({"w", "f32", {4}, w.data(), 12}),
                       "tensor 'w' is [4] f32 (16 bytes) but 12 bytes were given"));
  EXPECT_TRUE(contains(one({"w", "f32", {-4}, w.data(), 16}), "invalid shape [-4]"));
  EXPECT_TRUE(contains(one({"", "f32", {4}, w.data(), 16}), "must be 1 to 65535 bytes"));
  EXPECT_TRUE(contains(one({"/etc/w", "f32", {4}, w.data(), 16}),
                       "tensor name '/etc/w' starts with '/' or contains '..'"));
  EXPECT_TRUE(contains(one({"a/../w", "f32", {4}, w.data(), 16}),
                       "tensor name 'a/../w' starts with '/' or contains '..'"));
  EXPECT_TRUE(contains(
      mt::rt::save_checkpoint(save, sampleMeta(1),
                              {{"w", "f32", {4}, w.data(), 16}, {"w", "f32", {4}, w.data(), 16}}),
      "tensor 'w' is given twice"));
  EXPECT_TRUE(contains(mt::rt::save_checkpoint(save, sampleMeta(-1), {}), "iterations are >= 0"));
  CheckpointMeta bad = sampleMeta(1);
  bad.values["k"] = "\xff";
  EXPECT_TRUE(contains(mt::rt::save_checkpoint(save, bad, {}), "'k' is not valid UTF-8"));
  bad = sampleMeta(1);
  bad.loss_scale = 1.0 / 0.0;
  EXPECT_TRUE(contains(mt::rt::save_checkpoint(save, bad, {}), "is not finite"));
  EXPECT_TRUE(contains(mt::rt::save_checkpoint("", sampleMeta(1), {}), "set --save"));
  // Nothing was written by any of them.
  EXPECT_FALSE(mt::rt::checkpoint_exists(save));
}

TEST_F(CheckpointTest, MissingTrackerAndDirectories) {
  EXPECT_EQ(openError(), "no checkpoint in " + save +
                             " (the directory does not exist); check --load, or start without it "
                             "to train from scratch");
  mkdir(save.c_str(), 0755);
  EXPECT_FALSE(mt::rt::checkpoint_exists(save));
  EXPECT_EQ(openError(), "no checkpoint in " + save +
                             " (latest_checkpointed_iteration.txt is missing); check --load, or "
                             "start without it to train from scratch");

  Model m = smallModel(1);
  ASSERT_EQ(saveModel(m, 7), "");
  ASSERT_EQ(0, unlink((save + "/latest_checkpointed_iteration.txt").c_str()));
  EXPECT_EQ(openError(), "no checkpoint in " + save +
                             " (latest_checkpointed_iteration.txt is missing, but there are "
                             "iter_ directories for iterations 7); load one of them by its "
                             "iteration");
  std::string err;
  EXPECT_NE(open(7, &err), nullptr) << err;

  writeFile(save + "/latest_checkpointed_iteration.txt", "9");
  EXPECT_EQ(openError(), save +
                             "/latest_checkpointed_iteration.txt: error: names iteration 9 "
                             "but " +
                             save +
                             "/iter_0000009 does not exist (there are 7); restore that "
                             "directory, or write the number of a complete one into the "
                             "tracker");

  writeFile(save + "/latest_checkpointed_iteration.txt", "release");
  std::string release = openError();
  EXPECT_TRUE(contains(release, "latest_checkpointed_iteration.txt: error: says 'release': this "
                                "is a converted Megatron-LM checkpoint"))
      << release;
  EXPECT_TRUE(contains(release, "which mt cannot read")) << release;

  writeFile(save + "/latest_checkpointed_iteration.txt", "12abc");
  EXPECT_TRUE(contains(openError(), "expected an iteration number, found '12abc'"));
  writeFile(save + "/latest_checkpointed_iteration.txt", "");
  EXPECT_TRUE(contains(openError(), "expected an iteration number, found ''"));

  // An iteration directory without our file, and one of Megatron's.
  writeFile(save + "/latest_checkpointed_iteration.txt", "7");
  ASSERT_EQ(0, unlink(rankFile(7).c_str()));
  EXPECT_TRUE(contains(openError(), "has no mp_rank_00.mtckpt (no mt checkpoint files at all)"));
  mkdir((save + "/iter_0000007/mp_rank_00").c_str(), 0755);
  writeFile(save + "/iter_0000007/mp_rank_00/model_optim_rng.pt", "PK\x03\x04");
  EXPECT_EQ(openError(), save + "/iter_0000007: error: this is a Megatron-LM checkpoint (it holds "
                                "mp_rank_00), which mt cannot read; load a checkpoint that mt "
                                "saved, or start from scratch");
}

TEST_F(CheckpointTest, EachCorruptionHasItsOwnError) {
  Model m = smallModel(1);
  ASSERT_EQ(saveModel(m, 1), "");
  const std::string file = rankFile(1), good = readFile(file);
  const std::string prefix = file + ": error: ";
  auto with = [&](const std::string &bytes) {
    writeFile(file, bytes);
    std::string err = openError(1);
    EXPECT_EQ(err.rfind(prefix, 0), 0u) << err;
    return err;
  };

  // Truncation anywhere: within the magic, the header, the metadata, the
  // table, the data, and one byte short.
  for (size_t len : {size_t(0), size_t(5), size_t(8), size_t(11), size_t(40), size_t(64),
                     size_t(300), good.size() / 2, good.size() - 1}) {
    std::string err = with(good.substr(0, len));
    EXPECT_TRUE(contains(err, "truncated: ")) << len << ": " << err;
    EXPECT_TRUE(contains(err, "the save was cut short or the file was copied incompletely")) << err;
  }
  EXPECT_EQ(with(good.substr(0, good.size() / 2)),
            prefix + "truncated: the file has " + std::to_string(good.size() / 2) +
                " bytes but its header says " + std::to_string(good.size()) +
                "; the save was cut short or the file was copied incompletely: copy it again or "
                "load an earlier iteration instead, or start from scratch");
  EXPECT_TRUE(contains(with(good + "x"), "bytes but its header says " +
                                             std::to_string(good.size()) +
                                             "; something was appended"));

  // A flipped byte in each tensor's data names that tensor.
  std::string err;
  auto r = [&] {
    writeFile(file, good);
    return open(1, &err);
  }();
  ASSERT_NE(r, nullptr) << err;
  for (const std::string &name : r->tensor_names()) {
    if (name == "empty")
      continue;
    // Find the tensor's bytes in the file (contents are random, so unique).
    const CheckpointTensor *t = nullptr;
    for (const CheckpointTensor &c : m.list())
      if (c.name == name)
        t = &c;
    size_t at = good.find(std::string(static_cast<const char *>(t->data), t->bytes));
    ASSERT_NE(at, std::string::npos) << name;
    EXPECT_EQ(at % 64, 0u) << name << " is not 64-byte aligned";
    std::string bad = good;
    bad[at + t->bytes / 2] ^= 0x10;
    err = with(bad);
    EXPECT_TRUE(contains(err, "tensor '" + name + "' is corrupt (CRC32C ")) << err;
    EXPECT_TRUE(contains(err, "the file was damaged after it was written")) << err;
  }

  // A flipped byte in the metadata or the table.
  std::string bad = good;
  bad[good.find("gpt:h8")] ^= 1;
  EXPECT_TRUE(contains(with(bad), "the header, metadata or tensor table is corrupt (CRC32C "));
  bad = good;
  bad[good.find("raw") + 1] ^= 1;
  EXPECT_TRUE(contains(with(bad), "the header, metadata or tensor table is corrupt (CRC32C "));

  // Bad magic, a torch file, a newer and a nonsense version.
  bad = good;
  bad[0] = 'X';
  EXPECT_EQ(with(bad), prefix + "not an mt checkpoint (it does not start with \"MTCKPT\"); the "
                                "file is damaged or is something else: load an earlier iteration "
                                "instead, or start from scratch");
  EXPECT_TRUE(contains(with(std::string("PK\x03\x04", 4) + good.substr(4)),
                       "this is a PyTorch file (torch.save), not an mt checkpoint"));
  bad = good;
  bad[8] = 2;
  EXPECT_EQ(with(bad), prefix + "format version 2 is newer than this mt reads (version 1); load "
                                "it with the mt that saved it, or update mt");
  bad[8] = 0;
  EXPECT_TRUE(contains(with(bad), "format version 0 does not exist"));
}

// Damage that keeps the header checksum valid, as a buggy writer would make:
// the table's own checks must catch it.
TEST_F(CheckpointTest, TableBoundsAreCheckedBeyondTheChecksum) {
  Model m;
  m.add("w", "f32", {4}, 4, 1);
  ASSERT_EQ(saveModel(m, 1), "");
  const std::string file = rankFile(1), good = readFile(file);
  uint64_t meta_size, table_off, table_size;
  std::memcpy(&meta_size, &good[32], 8);
  std::memcpy(&table_off, &good[40], 8);
  std::memcpy(&table_size, &good[48], 8);
  // Entry: u16 1, "w", u8 dtype, u8 rank 1, i64 4, u64 offset, u64 bytes, u32 crc.
  const size_t dtype_at = table_off + 3, offset_at = table_off + 13;
  auto resealed = [&](std::string bytes) {
    uint32_t c = mt::rt::crc32c(bytes.data() + 16, 48);
    c = mt::rt::crc32c(bytes.data() + 64, meta_size, c);
    c = mt::rt::crc32c(bytes.data() + table_off, table_size, c);
    std::memcpy(&bytes[12], &c, 4);
    writeFile(file, bytes);
    return openError(1);
  };
  std::string bad = good;
  bad[dtype_at] = 99;
  EXPECT_TRUE(contains(resealed(bad), "tensor table entry 0 ('w') has unknown dtype code 99"));
  bad = good;
  uint64_t off = good.size(); // past the end
  std::memcpy(&bad[offset_at], &off, 8);
  EXPECT_TRUE(contains(resealed(bad), "('w') has data at [" + std::to_string(off) +
                                          ", +16), outside the file's data area"));
  bad = good;
  off = 0; // over the header
  std::memcpy(&bad[offset_at], &off, 8);
  EXPECT_TRUE(contains(resealed(bad), "outside the file's data area"));
  bad = good;
  bad[offset_at - 8] = 5; // shape [5] but 16 bytes
  EXPECT_TRUE(contains(resealed(bad), "('w') has shape [5] f32 but 16 bytes"));
}

// A name read from inside a checkpoint is never a path: an absolute one or
// one with ".." is refused at load, even with valid checksums.
TEST_F(CheckpointTest, AbsoluteOrDotDotTensorNamesAreRefused) {
  for (const char *name : {"/bad", "a..b", "..x"}) {
    Model m;
    m.add("xyzw", "f32", {4}, 4, 1);
    ASSERT_EQ(saveModel(m, 1), "");
    const std::string file = rankFile(1);
    std::string bytes = readFile(file);
    uint64_t meta_size, table_off, table_size;
    std::memcpy(&meta_size, &bytes[32], 8);
    std::memcpy(&table_off, &bytes[40], 8);
    std::memcpy(&table_size, &bytes[48], 8);
    ASSERT_EQ(bytes.compare(table_off + 2, 4, "xyzw"), 0);
    std::string padded = std::string(name) + std::string(4 - std::strlen(name), 'q');
    bytes.replace(table_off + 2, 4, padded);
    uint32_t c = mt::rt::crc32c(bytes.data() + 16, 48);
    c = mt::rt::crc32c(bytes.data() + 64, meta_size, c);
    c = mt::rt::crc32c(bytes.data() + table_off, table_size, c);
    std::memcpy(&bytes[12], &c, 4);
    writeFile(file, bytes);
    EXPECT_TRUE(contains(openError(1), "tensor table entry 0 has the name '" + padded +
                                           "', which starts with '/' or contains '..'"))
        << openError(1);
  }
}

// --- Crash safety ------------------------------------------------------------

int g_kill_at = 0, g_steps = 0;
void killAtStep(const char *) {
  if (++g_steps == g_kill_at)
    raise(SIGKILL);
}
void countStep(const char *) { ++g_steps; }

// Runs fn in a child process; returns its wait status.
template <typename Fn> int inChild(Fn fn) {
  pid_t pid = fork();
  if (pid == 0) {
    fn();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

// A model with a tensor over one write piece (8 MiB), so the data is written
// in several steps.
Model bigModel(uint32_t seed) {
  Model m = smallModel(seed);
  m.add("big", "f32", {(9 << 20) / 4}, 4, seed + 100);
  return m;
}

TEST_F(CheckpointTest, CrashAtEveryStepKeepsThePreviousCheckpoint) {
  Model first = smallModel(1), second = bigModel(2);
  // How many steps a save of the second checkpoint takes.
  {
    ASSERT_EQ(saveModel(first, 1, dir + "/count"), "");
    g_steps = 0;
    mt::rt::set_checkpoint_step_hook(countStep);
    ASSERT_EQ(saveModel(second, 2, dir + "/count"), "");
    mt::rt::set_checkpoint_step_hook(nullptr);
  }
  const int steps = g_steps;
  ASSERT_GE(steps, 7); // mkdir, write x3, fsync x2, rename, fsync, tracker
  for (int k = 1; k <= steps; ++k) {
    SCOPED_TRACE("killed at step " + std::to_string(k) + " of " + std::to_string(steps));
    std::system(("rm -rf '" + save + "'").c_str());
    ASSERT_EQ(saveModel(first, 1), "");
    int status = inChild([&] {
      g_kill_at = k;
      g_steps = 0;
      mt::rt::set_checkpoint_step_hook(killAtStep);
      saveModel(second, 2);
    });
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    // The tracker still names iteration 1, which loads intact.
    std::string err;
    auto r = open(-1, &err);
    ASSERT_NE(r, nullptr) << err;
    EXPECT_EQ(r->meta().iteration, 1);
    expectTensors(*r, first);
    r.reset();
    // The next save succeeds and leaves no temporaries behind.
    ASSERT_EQ(saveModel(second, 2), "");
    EXPECT_EQ(listDir(save), (std::vector<std::string>{"iter_0000001", "iter_0000002",
                                                       "latest_checkpointed_iteration.txt"}));
    r = open(-1, &err);
    ASSERT_NE(r, nullptr) << err;
    expectTensors(*r, second);
  }
}

TEST_F(CheckpointTest, CrashWhileReplacingAnIterationKeepsOneWholeCopy) {
  Model old_model = bigModel(1), new_model = bigModel(2);
  g_steps = 0;
  ASSERT_EQ(saveModel(old_model, 3), "");
  mt::rt::set_checkpoint_step_hook(countStep);
  ASSERT_EQ(saveModel(new_model, 3), "");
  mt::rt::set_checkpoint_step_hook(nullptr);
  const int steps = g_steps;
  bool saw_old = false, saw_new = false;
  for (int k = 1; k <= steps; ++k) {
    SCOPED_TRACE("killed at step " + std::to_string(k) + " of " + std::to_string(steps));
    std::system(("rm -rf '" + save + "'").c_str());
    ASSERT_EQ(saveModel(old_model, 3), "");
    int status = inChild([&] {
      g_kill_at = k;
      g_steps = 0;
      mt::rt::set_checkpoint_step_hook(killAtStep);
      saveModel(new_model, 3);
    });
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    std::string err;
    auto r = open(-1, &err);
    ASSERT_NE(r, nullptr) << err;
    std::vector<unsigned char> big(9 << 20);
    ASSERT_EQ(r->read("big", "f32", {(9 << 20) / 4}, big.data(), big.size()), "");
    bool is_old = std::memcmp(big.data(), old_model.storage.back().data(), big.size()) == 0;
    bool is_new = std::memcmp(big.data(), new_model.storage.back().data(), big.size()) == 0;
    EXPECT_TRUE(is_old || is_new);
    expectTensors(*r, is_old ? old_model : new_model);
    saw_old |= is_old;
    saw_new |= is_new;
  }
  EXPECT_TRUE(saw_old && saw_new); // both sides of the exchange were hit
}

// Kills a child that saves one checkpoint after another at random moments.
TEST_F(CheckpointTest, RandomKillsNeverLeaveABrokenLatest) {
  std::mt19937 rng(11);
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    pid_t pid = fork();
    if (pid == 0) {
      for (int64_t it = 1;; ++it) {
        Model m = bigModel(static_cast<uint32_t>(it));
        mt::rt::save_checkpoint(save, sampleMeta(it), m.list());
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + rng() % 400));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!mt::rt::checkpoint_exists(save))
      continue; // killed before the first save finished
    std::string err;
    auto r = open(-1, &err);
    ASSERT_NE(r, nullptr) << err;
    Model m = bigModel(static_cast<uint32_t>(r->meta().iteration));
    expectTensors(*r, m);
  }
  Model m = smallModel(5);
  ASSERT_EQ(saveModel(m, 1000000), "");
  for (const std::string &n : listDir(save))
    EXPECT_TRUE(n.rfind("iter_", 0) == 0 || n == "latest_checkpointed_iteration.txt") << n;
}

// Timing for 500 MB of tensors; run with --gtest_also_run_disabled_tests.
TEST_F(CheckpointTest, DISABLED_SaveLoadSpeed500MB) {
  const size_t n = 500ull << 20, pieces = 10;
  std::vector<float> data(n / 4);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<float>(i);
  std::vector<CheckpointTensor> tensors;
  for (size_t i = 0; i < pieces; ++i)
    tensors.push_back({"t" + std::to_string(i),
                       "f32",
                       {int64_t(n / pieces / 4)},
                       data.data() + i * (n / pieces / 4),
                       n / pieces});
  auto now = [] { return std::chrono::steady_clock::now(); };
  auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::vector<float> back(data.size());
  auto t0 = now();
  ASSERT_EQ(mt::rt::save_checkpoint(save, sampleMeta(1), tensors), "");
  auto t1 = now();
  for (bool cold : {true, false}) {
    if (cold) { // drop the file's (clean, fsync'd) pages from the page cache
      int fd = ::open(rankFile(1).c_str(), O_RDONLY);
      ASSERT_GE(fd, 0);
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
    auto t2 = now();
    std::string err;
    auto r = open(-1, &err);
    ASSERT_NE(r, nullptr) << err;
    auto t3 = now();
    for (size_t i = 0; i < pieces; ++i)
      ASSERT_EQ(r->read(tensors[i].name, "f32", tensors[i].shape,
                        back.data() + i * (n / pieces / 4), n / pieces),
                "");
    auto t4 = now();
    EXPECT_EQ(back, data);
    std::printf("%s: open+verify %.3f s, read %.3f s, load %.2f GB/s\n",
                cold ? "cold page cache" : "warm page cache", secs(t2, t3), secs(t3, t4),
                n / secs(t2, t4) / 1e9);
  }
  std::printf("save %.3f s (%.2f GB/s, fsync'd)\n", secs(t0, t1), n / secs(t0, t1) / 1e9);
}

// The lit test test/checkpoint/inspect.test runs this to get a checkpoint
// written by the C++ writer for tools/mt_checkpoint.py to read. Disabled, so
// the unit suite does not run it (and report it skipped) on its own.
TEST(CheckpointSample, DISABLED_Write) {
  const char *out = std::getenv("MT_CHECKPOINT_SAMPLE_DIR");
  ASSERT_NE(out, nullptr) << "set MT_CHECKPOINT_SAMPLE_DIR to the directory to write";
  for (int64_t it : {50, 100}) {
    CheckpointMeta meta = sampleMeta(it);
    std::vector<float> w(12);
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = 0.5f * static_cast<float>(i) - 1.0f;
    std::vector<uint16_t> bf16 = {0x3F80, 0xC000, 0x4049, 0x0000}; // 1, -2, 3.140625, 0
    std::vector<uint16_t> f16 = {0x3C00, 0xC000};                  // 1, -2
    std::vector<int32_t> i32 = {-1, 2, 300000};
    std::vector<int64_t> i64 = {it};
    std::vector<uint64_t> u64 = {0xFFFFFFFFFFFFFFFFull};
    std::vector<unsigned char> big(200000);
    for (size_t i = 0; i < big.size(); ++i)
      big[i] = static_cast<unsigned char>(i * 7 + i / 251);
    ASSERT_EQ(mt::rt::save_checkpoint(out, meta,
                                      {{"decoder.weight", "f32", {3, 4}, w.data(), 48},
                                       {"decoder.bias_bf16", "bf16", {4}, bf16.data(), 8},
                                       {"norm.f16", "f16", {2}, f16.data(), 4},
                                       {"data.i32", "i32", {3}, i32.data(), 12},
                                       {"optimizer.step", "i64", {}, i64.data(), 8},
                                       {"rng.u64", "u64", {1}, u64.data(), 8},
                                       {"blob", "u8", {200000}, big.data(), big.size()}}),
              "");
  }
}

// Megatron's names with an expert-parallel rank, and which (tp, ep) files a
// stage has: every tp rank's dense parameters and every ep rank's experts,
// each in exactly one file.
TEST(CheckpointNames, ExpertParallelFiles) {
  EXPECT_EQ(mt::rt::checkpoint_rank_name(0, 0, 1, 1, 2), "mp_rank_00_001");
  EXPECT_EQ(mt::rt::checkpoint_rank_name(1, 2, 4, 3, 8), "mp_rank_01_002_003");
  EXPECT_EQ(mt::rt::checkpoint_rank_name(1, 2, 4, 0, 1), "mp_rank_01_002");
  EXPECT_EQ(mt::rt::checkpoint_file_name(0, 0, 1, true, 1, 2), "mp_rank_00_001.distrib_optim.mtckpt");
  using F = std::vector<std::pair<int, int>>;
  EXPECT_EQ(mt::rt::checkpoint_stage_files(1, 1), (F{{0, 0}}));
  EXPECT_EQ(mt::rt::checkpoint_stage_files(2, 1), (F{{0, 0}, {1, 0}}));
  EXPECT_EQ(mt::rt::checkpoint_stage_files(1, 2), (F{{0, 0}, {0, 1}}));
  EXPECT_EQ(mt::rt::checkpoint_stage_files(2, 2), (F{{0, 0}, {1, 1}}));
  EXPECT_EQ(mt::rt::checkpoint_stage_files(2, 4), (F{{0, 0}, {0, 2}, {1, 1}, {1, 3}}));
  EXPECT_EQ(mt::rt::checkpoint_stage_files(4, 2), (F{{0, 0}, {1, 1}, {2, 0}, {3, 1}}));
  // Every (tp, ep) pair of a stage's ranks i = tp_rank + tp dp_rank: each
  // tp rank's dense writer (dp 0) and each ep rank's expert writer (edp 0)
  // has its file in the list.
  for (int tp : {1, 2, 4})
    for (int ep : {1, 2, 4, 8})
      for (int dp : {1, 2, 4, 8}) {
        if ((tp * dp) % ep != 0)
          continue;
        const F files = mt::rt::checkpoint_stage_files(tp, ep);
        size_t writers = 0;
        for (int i = 0; i < tp * dp; ++i) {
          const bool dense = i < tp, experts = i < ep;
          if (!dense && !experts)
            continue;
          ++writers;
          EXPECT_NE(std::find(files.begin(), files.end(), std::make_pair(i % tp, i % ep)),
                    files.end())
              << tp << " " << ep << " " << dp << " " << i;
        }
        EXPECT_EQ(writers, files.size()) << tp << " " << ep << " " << dp;
      }
}

// With expert tensor parallelism each (etp, ep) rank pair's expert shard
// has its own file: the writers (dp rank 0, or expert-dp rank 0) of every
// layout have distinct names, one per file of checkpoint_stage_files.
TEST(CheckpointNames, ExpertTensorParallelFiles) {
  using F = std::vector<std::pair<int, int>>;
  EXPECT_EQ(mt::rt::checkpoint_stage_files(1, 1, 2), (F{{0, 0}, {1, 0}}));
  EXPECT_EQ(mt::rt::checkpoint_stage_files(1, 2, 2), (F{{0, 0}, {0, 1}, {1, 0}, {1, 1}}));
  EXPECT_EQ(mt::rt::checkpoint_stage_files(2, 2, 2), (F{{0, 0}, {0, 1}, {1, 0}, {1, 1}}));
  EXPECT_EQ(mt::rt::checkpoint_stage_files(4, 1, 2), (F{{0, 0}, {1, 0}, {2, 0}, {3, 0}}));
  EXPECT_EQ(mt::rt::checkpoint_stage_files(2, 1, 4), (F{{0, 0}, {1, 0}, {2, 0}, {3, 0}}));
  for (int tp : {1, 2, 4})
    for (int etp : {1, 2, 4})
      for (int ep : {1, 2, 4})
        for (int dp : {1, 2, 4, 8}) {
          if ((tp * dp) % (etp * ep) != 0)
            continue;
          const F files = mt::rt::checkpoint_stage_files(tp, ep, etp);
          std::set<std::pair<int, int>> names;
          for (int i = 0; i < tp * dp; ++i) {
            const mt::rt::ExpertCoords c = mt::rt::expert_coords(tp, ep, etp, i % tp, i / tp);
            if (i / tp != 0 && c.edp_rank != 0)
              continue;
            const std::pair<int, int> name{i % std::max(tp, etp), int(c.ep_rank)};
            EXPECT_TRUE(names.insert(name).second) << tp << " " << etp << " " << ep << " " << dp;
            EXPECT_NE(std::find(files.begin(), files.end(), name), files.end())
                << tp << " " << etp << " " << ep << " " << dp << " " << i;
          }
          EXPECT_EQ(names.size(), files.size()) << tp << " " << etp << " " << ep << " " << dp;
        }
}

// tp1 x dp4 with ep 2 and etp 2: every rank writes its experts' shard (expert
// dp 1), rank 0 the dense parameters too; files by (etp rank, ep rank); an
// expert's tp_dim is recorded as a shard over etp.
TEST(CheckpointLayout, ExpertTensorParallelRoles) {
  flatbuffers::FlatBufferBuilder b;
  const std::vector<int64_t> fc1 = {2, 8, 4}, dense = {4, 4};
  std::vector<flatbuffers::Offset<mt::plan::Rank>> ranks;
  for (int r = 0; r < 4; ++r) {
    std::vector<flatbuffers::Offset<mt::plan::Param>> params;
    params.push_back(mt::plan::CreateParamDirect(b, "dense.weight", &dense));
    auto name = b.CreateString("experts.linear_fc1.weight");
    auto shape = b.CreateVector(fc1);
    mt::plan::ParamBuilder pb(b);
    pb.add_name(name);
    pb.add_shape(shape);
    pb.add_tp_dim(1);
    pb.add_tp_blocks(2);
    pb.add_ep_dim(0);
    pb.add_expert(true);
    params.push_back(pb.Finish());
    ranks.push_back(mt::plan::CreateRankDirect(b, r, 0, 0, r, &params));
  }
  b.Finish(mt::plan::CreatePlanDirect(b, "mtc test", "", "", 4, 1, 1, 4, 0, nullptr, &ranks, 2, 2),
           mt::plan::PlanIdentifier());
  const mt::plan::Plan &plan = *mt::plan::GetPlan(b.GetBufferPointer());
  const std::vector<std::string> want = {"mp_rank_00_000.mtckpt", "mp_rank_01_000.mtckpt",
                                         "mp_rank_00_001.mtckpt", "mp_rank_01_001.mtckpt"};
  for (int r = 0; r < 4; ++r) {
    const mt::plan::Rank &rank = *plan.ranks()->Get(uint32_t(r));
    const mt::rt::CheckpointRole role = mt::rt::checkpoint_role(plan, rank);
    EXPECT_EQ(role.dense, r == 0);
    EXPECT_TRUE(role.experts);
    EXPECT_EQ(mt::rt::checkpoint_name_rank(plan, rank), r % 2);
    EXPECT_EQ(mt::rt::rank_checkpoint_file(plan, rank, false), want[size_t(r)]);
    EXPECT_EQ(mt::rt::checkpoint_writer(plan, rank, true), &rank);
    EXPECT_EQ(mt::rt::checkpoint_writer(plan, rank, false), plan.ranks()->Get(0));
  }
  EXPECT_EQ(mt::rt::param_layout(plan, *plan.ranks()->Get(0)),
            "dense.weight -1 1 -1 4x4;experts.linear_fc1.weight 1 2 -1 2x8x4 0 etp");
  EXPECT_EQ(mt::rt::param_layout(plan, *plan.ranks()->Get(3)),
            "experts.linear_fc1.weight 1 2 -1 2x8x4 0 etp");
  std::vector<std::string> all = want;
  std::sort(all.begin(), all.end());
  EXPECT_EQ(mt::rt::checkpoint_files_of(plan), all);
  mt::rt::CheckpointMeta meta;
  mt::rt::add_layout_values(plan, *plan.ranks()->Get(1), &meta);
  EXPECT_EQ(meta.values["expert_tensor_parallel"], "2");
  EXPECT_EQ(meta.values["expert_model_parallel"], "2");
}

// The distributed optimizer's shards of an expert-parallel rank by group:
// dp4 x ep2 (expert data parallel 2), a dense bucket over dp and an expert
// bucket over expt_dp, placed by shard_offset. The metadata names both
// groups, each group's shards pack in shard-state order, and the rank's
// role and files follow its expert coordinates.
TEST(CheckpointLayout, ExpertShardsByGroup) {
  flatbuffers::FlatBufferBuilder b;
  const std::vector<uint32_t> none;
  std::vector<flatbuffers::Offset<mt::plan::Bucket>> buckets = {
      mt::plan::CreateBucketDirect(b, &none, 8, 24, 0, 4),  // dense: 16 / dp 4 at 4
      mt::plan::CreateBucketDirect(b, &none, 0, 8, 6, 0)}; // experts: 8 / edp 2 at 0
  std::vector<flatbuffers::Offset<mt::plan::Rank>> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.push_back(mt::plan::CreateRankDirect(b, r, 0, 0, r, nullptr, 0, 0, nullptr, 0,
                                               &buckets, 24, true, 8));
  b.Finish(mt::plan::CreatePlanDirect(b, "mtc test", "", "", 4, 1, 1, 4, 0, nullptr, &ranks, 2, 1),
           mt::plan::PlanIdentifier());
  const mt::plan::Plan &plan = *mt::plan::GetPlan(b.GetBufferPointer());
  const mt::plan::Rank &r1 = *plan.ranks()->Get(1);
  EXPECT_EQ(mt::rt::shard_layout(plan, r1),
            "dp 4, edp 2, flat 24, shard 8, buckets [8, 24) dp@4 [0, 8) edp@0");
  EXPECT_EQ(mt::rt::packed_shard_elements(plan, r1, false), 4);
  EXPECT_EQ(mt::rt::packed_shard_elements(plan, r1, true), 4);
  const std::vector<float> shard = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<float> dense(4), experts(4), back(8, -1.0f);
  mt::rt::pack_shard(plan, r1, false, shard.data(), dense.data());
  mt::rt::pack_shard(plan, r1, true, shard.data(), experts.data());
  EXPECT_EQ(dense, (std::vector<float>{4, 5, 6, 7}));
  EXPECT_EQ(experts, (std::vector<float>{0, 1, 2, 3}));
  mt::rt::unpack_shard(plan, r1, false, dense.data(), back.data());
  mt::rt::unpack_shard(plan, r1, true, experts.data(), back.data());
  EXPECT_EQ(back, shard);
  // Rank 1: dp rank 1, ep rank 1, expert-dp rank 0: it writes its experts
  // alone, into mp_rank_00_001; its dense parameters are rank 0's to write.
  const mt::rt::CheckpointRole role = mt::rt::checkpoint_role(plan, r1);
  EXPECT_FALSE(role.dense);
  EXPECT_TRUE(role.experts);
  EXPECT_EQ(mt::rt::rank_checkpoint_file(plan, r1, true), "mp_rank_00_001.distrib_optim.mtckpt");
  EXPECT_EQ(mt::rt::checkpoint_writer(plan, r1, false), plan.ranks()->Get(0));
  EXPECT_EQ(mt::rt::checkpoint_writer(plan, r1, true), &r1);
  // Rank 3 (ep rank 1, expert-dp rank 1) writes nothing; its experts are rank 1's.
  const mt::plan::Rank &r3 = *plan.ranks()->Get(3);
  EXPECT_FALSE(mt::rt::checkpoint_role(plan, r3).writes());
  EXPECT_EQ(mt::rt::checkpoint_writer(plan, r3, true), &r1);
  EXPECT_EQ(mt::rt::checkpoint_files_of(plan),
            (std::vector<std::string>{"mp_rank_00_000.distrib_optim.mtckpt", "mp_rank_00_000.mtckpt",
                                      "mp_rank_00_001.distrib_optim.mtckpt",
                                      "mp_rank_00_001.mtckpt"}));
}

} // namespace
