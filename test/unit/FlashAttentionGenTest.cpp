// compiler/FlashAttentionGen: its refusals, its launch shapes and ABI, and
// every configuration of a matrix (head dim, GQA/MHA, causal, dropout,
// dtype, tensor-parallel shard) compiled with NVRTC for sm_80 and sm_90
// when the library is present.
#include "compiler/FlashAttentionGen.h"
#include "runtime/cuda_api.h"
#include "runtime/kernel_cache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace {

using mt::FlashAttentionConfig;
using DType = FlashAttentionConfig::DType;

bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

// The matrix: d 64/128 x MHA/GQA x causal or not x dropout or not x three
// dtypes, plus a tensor-parallel shard with dropout, at a seq no tile divides.
std::vector<FlashAttentionConfig> matrix() {
  std::vector<FlashAttentionConfig> all;
  for (int64_t d : {64, 128})
    for (bool gqa : {false, true})
      for (bool causal : {true, false})
        for (double rate : {0.0, 0.1})
          for (DType t : {DType::F32, DType::BF16, DType::F16}) {
            FlashAttentionConfig c;
            c.batch = 2, c.seq = 200, c.heads = 8, c.groups = gqa ? 2 : 8, c.headDim = d;
            c.causal = causal, c.scale = 1.0 / std::sqrt(double(d)), c.dropoutRate = rate;
            c.stream = 3, c.dtype = t;
            all.push_back(c);
          }
  for (DType t : {DType::F32, DType::BF16}) {
    FlashAttentionConfig c;
    c.seq = 96, c.heads = 4, c.groups = 2, c.dropoutRate = 0.2, c.dtype = t, c.tensorParallel = 2;
    all.push_back(c);
  }
  return all;
}

std::string describe(const FlashAttentionConfig &c) {
  return "d" + std::to_string(c.headDim) + " heads " + std::to_string(c.heads) + "/" +
         std::to_string(c.groups) + (c.causal ? " causal" : "") + " dropout " + std::to_string(c.dropoutRate) +
         " dtype " + std::to_string(int(c.dtype)) + " tp " + std::to_string(c.tensorParallel);
}

TEST(FlashAttentionGen, RefusesWhatItCannotGenerate) {
  std::string error;
  FlashAttentionConfig c;
  c.headDim = 96;
  EXPECT_FALSE(mt::generateFlashAttentionForward(c, &error));
  EXPECT_TRUE(contains(error, "head dimension 96 is not supported; use 64 or 128")) << error;
  c.headDim = 64, c.heads = 6, c.groups = 4;
  EXPECT_FALSE(mt::generateFlashAttentionBackward(c, &error));
  EXPECT_TRUE(contains(error, "heads (6) must be a multiple of groups (4)")) << error;
  c.groups = 3, c.dropoutRate = 1.5;
  EXPECT_FALSE(mt::generateFlashAttentionForward(c, &error));
  EXPECT_TRUE(contains(error, "dropout rate")) << error;
  c.dropoutRate = 0, c.seq = 0;
  EXPECT_FALSE(mt::generateFlashAttentionForward(c, &error));
  EXPECT_TRUE(contains(error, "at least 1")) << error;
}

TEST(FlashAttentionGen, LaunchShapesAndArguments) {
  std::string error;
  FlashAttentionConfig c;
  c.batch = 3, c.seq = 200, c.heads = 8, c.groups = 2, c.headDim = 128, c.dtype = DType::BF16;
  c.dropoutRate = 0.1, c.stream = 5, c.tensorParallel = 4;
  auto f = mt::generateFlashAttentionForward(c, &error);
  ASSERT_TRUE(f) << error;
  EXPECT_EQ(f->kernel.grid[0], 4u); // 64 query rows a CTA
  EXPECT_EQ(f->kernel.grid[1], 8u);
  EXPECT_EQ(f->kernel.grid[2], 3u);
  EXPECT_EQ(f->kernel.block[0], 128u);
  EXPECT_LE(f->kernel.sharedBytes, 48u * 1024);
  EXPECT_EQ(f->lseBytes, 3u * 8 * 200 * 4);
  EXPECT_EQ(f->kernel.scalarArgs, (std::vector<std::string>{"seed", "rng_offset", "tp_rank", "stream"}));
  EXPECT_EQ(f->kernel.streams, (std::vector<uint64_t>{5}));
  EXPECT_TRUE(contains(f->kernel.source, "void __launch_bounds__(kThreads)\n" + f->kernel.entry +
                                             "(const mt_t *q, const mt_t *k, const mt_t *v, mt_t *out, float *lse, "
                                             "mt_u64 seed, mt_u64 rng_offset, mt_u64 tp_rank, mt_u64 stream)"));
  EXPECT_TRUE(contains(f->kernel.source, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));

  auto b = mt::generateFlashAttentionBackward(c, &error);
  ASSERT_TRUE(b) << error;
  EXPECT_EQ(b->dqAccumBytes, 3u * 200 * 8 * 128 * 4);
  EXPECT_EQ(b->deltaBytes, 3u * 8 * 200 * 4);
  EXPECT_EQ(b->workspaceBytes, b->dqAccumBytes + b->deltaBytes);
  EXPECT_EQ(b->main.grid[0], 4u); // 64 key rows a CTA
  EXPECT_EQ(b->main.grid[1], 2u); // one per group: a group's heads accumulate in registers
  EXPECT_EQ(b->dot.grid[0], (3u * 200 * 8 + 3) / 4);
  EXPECT_EQ(b->dq.grid[0], (3u * 200 * 8 * 128 / 4 + 255) / 256);
  EXPECT_EQ(b->dot.source, b->main.source);
  EXPECT_EQ(b->dq.source, b->main.source);
  for (const mt::CudaKernel *k : {&b->dot, &b->main, &b->dq}) {
    EXPECT_TRUE(contains(k->source, k->entry + "(const mt_t *dout, const mt_t *q, const mt_t *k, const mt_t *v, "
                                               "const mt_t *out, const float *lse,\n"));
    EXPECT_EQ(k->scalarArgs, f->kernel.scalarArgs);
  }

  // Without dropout there are no scalar arguments; f32 uses no tensor cores.
  c.dropoutRate = 0, c.dtype = DType::F32;
  f = mt::generateFlashAttentionForward(c, &error);
  ASSERT_TRUE(f) << error;
  EXPECT_TRUE(f->kernel.scalarArgs.empty());
  EXPECT_TRUE(contains(f->kernel.source, "#define MT_FLASH_MMA 0"));
  EXPECT_TRUE(contains(f->kernel.source, "mt_t *out, float *lse) {"));
}

TEST(FlashAttentionGen, EveryConfigurationFitsAndIsDeterministic) {
  for (const FlashAttentionConfig &c : matrix()) {
    std::string error;
    auto f1 = mt::generateFlashAttentionForward(c, &error), f2 = mt::generateFlashAttentionForward(c, &error);
    auto b1 = mt::generateFlashAttentionBackward(c, &error);
    ASSERT_TRUE(f1 && f2 && b1) << describe(c) << ": " << error;
    EXPECT_EQ(f1->kernel.source, f2->kernel.source);
    EXPECT_LE(f1->kernel.sharedBytes, 48u * 1024) << describe(c);
    EXPECT_LE(b1->main.sharedBytes, 48u * 1024) << describe(c);
  }
}

TEST(FlashAttentionGen, CompilesWithNvrtc) {
  std::string error;
  const mt::cu::Nvrtc *nvrtc = mt::cu::load_nvrtc(&error);
  if (!nvrtc)
    GTEST_SKIP() << error;
  auto compile = [&](const mt::CudaKernel &k, int arch) {
    std::string cubin, e;
    mt::rt::nvrtc_compile(*nvrtc, k.entry, k.source, arch, mt::rt::nvrtc_options(arch), &cubin, &e);
    if (e.empty() && cubin.empty())
      e = "no CUBIN";
    return e;
  };
  for (const FlashAttentionConfig &c : matrix()) {
    auto f = mt::generateFlashAttentionForward(c, &error);
    auto b = mt::generateFlashAttentionBackward(c, &error);
    ASSERT_TRUE(f && b) << error;
    for (int arch : {80, 90}) {
      EXPECT_EQ(compile(f->kernel, arch), "") << describe(c) << " sm_" << arch;
      EXPECT_EQ(compile(b->main, arch), "") << describe(c) << " sm_" << arch;
    }
  }
}

} // namespace
