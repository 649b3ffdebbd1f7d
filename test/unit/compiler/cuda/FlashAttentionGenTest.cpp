// compiler/cuda/FlashAttentionGen: its refusals, its launch shapes and ABI; every
// configuration of a matrix (head dim, GQA/MHA, causal, dropout, dtype,
// tensor-parallel shard) compiled with NVRTC for sm_80 and sm_90 when the
// library is present; and the kernels run on the host CUDA emulation
// against runtime/exec/cpu_kernels' attention_fwd/attention_bwd, and where there
// is a GPU on it too (FlashAttentionOnGpu), the whole matrix included. Both
// backward variants (kv64, the default, and kv128) are checked alike.
#include "KernelDevice.h"
#include "compiler/cuda/FlashAttentionGen.h"
#include "runtime/exec/cpu_kernels.h"
#include "runtime/exec/cuda/cuda_api.h"
#include "runtime/exec/cuda/kernel_cache.h"
#include "runtime/exec/cuda/launch_limits.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using mt::FlashAttentionConfig;
using DType = FlashAttentionConfig::DType;

bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

// The matrix: d 64/128 x causal or not x dropout or not x three dtypes, at
// a seq no tile divides, alternating MHA and GQA (they differ only in
// constants), plus a tensor-parallel shard with dropout for f32 and bf16.
std::vector<FlashAttentionConfig> matrix() {
  std::vector<FlashAttentionConfig> all;
  bool gqa = false;
  for (int64_t d : {64, 128})
    for (bool causal : {true, false})
      for (double rate : {0.0, 0.1})
        for (DType t : {DType::F32, DType::BF16, DType::F16}) {
          FlashAttentionConfig c;
          c.batch = 2, c.seq = 200, c.heads = 8, c.groups = gqa ? 2 : 8, c.headDim = d;
          c.causal = causal, c.scale = 1.0 / std::sqrt(double(d)), c.dropoutRate = rate;
          c.stream = 3, c.dtype = t;
          all.push_back(c);
          gqa = !gqa;
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
         " dtype " + std::to_string(int(c.dtype)) + " tp " + std::to_string(c.tensorParallel) + " " +
         mt::flashBackwardName(c.backward);
}

FlashAttentionConfig withBackward(FlashAttentionConfig c, mt::FlashBackward b) {
  c.backward = b;
  return c;
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
  c.seq = (int64_t(1) << 30) + 1, c.heads = c.groups = c.batch = 1;
  EXPECT_FALSE(mt::generateFlashAttentionBackward(c, &error));
  EXPECT_TRUE(contains(error, "seq 1073741825 is above 2^30")) << error;
  c.seq = int64_t(1) << 30;
  EXPECT_TRUE(mt::generateFlashAttentionForward(c, &error)) << error;
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
                                             "const mt_u64 *seed, const mt_u64 *rng_offset, mt_u64 tp_rank, mt_u64 stream)"));
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
  // dQ's atomic adds, in pairs on sm_90.
  EXPECT_TRUE(contains(b->main.source, "red.global.add.v2.f32"));
  EXPECT_EQ(b->dot.source, b->main.source);
  EXPECT_EQ(b->dq.source, b->main.source);
  for (const mt::CudaKernel *k : {&b->dot, &b->main, &b->dq}) {
    EXPECT_TRUE(contains(k->source, k->entry + "(const mt_t *dout, const mt_t *q, const mt_t *k, const mt_t *v, "
                                               "const mt_t *out, const float *lse,\n"));
    EXPECT_EQ(k->scalarArgs, f->kernel.scalarArgs);
  }

  // kv128: 128 key rows a CTA in 8 warps, two stages of query tiles in
  // over 48 KiB of shared memory (the launchers opt in), within the 99 KiB
  // every GPU mt runs on allows; the first and last kernels are kv64's.
  auto b128 = mt::generateFlashAttentionBackward(withBackward(c, mt::FlashBackward::Kv128), &error);
  ASSERT_TRUE(b128) << error;
  EXPECT_EQ(b128->main.grid[0], 2u);
  EXPECT_EQ(b128->main.grid[1], 2u);
  EXPECT_EQ(b128->main.grid[2], 3u);
  EXPECT_EQ(b128->main.block[0], 256u);
  EXPECT_EQ(b128->main.sharedBytes, (128u * 136 + 4 * 32 * 136 + 32 * 136) * 2 + 4 * 32 * 4); // d 128: tiles of 32 queries
  EXPECT_EQ(mt::cu::check_launch(b128->main.entry, b128->main.grid, b128->main.block, b128->main.sharedBytes), "");
  EXPECT_TRUE(contains(b128->main.source, "kW = 8, kThreads = 256, kBr = 32, kBc = 128,"));
  EXPECT_TRUE(contains(b128->main.source, "cp.async.ca.shared.global"));
  EXPECT_FALSE(contains(b->main.source, "cp.async.ca.shared.global")); // kv64 is left as it was
  EXPECT_NE(b128->main.entry, b->main.entry);
  EXPECT_EQ(b128->dqAccumBytes, b->dqAccumBytes);
  EXPECT_EQ(b128->workspaceBytes, b->workspaceBytes);
  for (const mt::CudaKernel *k : {&b128->dot, &b128->dq}) {
    EXPECT_EQ(k->source, b128->main.source);
    EXPECT_EQ(k->scalarArgs, b->main.scalarArgs);
  }
  EXPECT_EQ(b128->dot.grid[0], b->dot.grid[0]);
  EXPECT_EQ(b128->dq.grid[0], b->dq.grid[0]);
  EXPECT_STREQ(mt::flashBackwardName(mt::FlashBackward::Kv128), "kv128");
  EXPECT_EQ(mt::parseFlashBackward("kv64"), mt::FlashBackward::Kv64);
  EXPECT_EQ(mt::parseFlashBackward("kv128"), mt::FlashBackward::Kv128);
  EXPECT_FALSE(mt::parseFlashBackward("kv256"));

  // Head dim 64 in 16 bits: two 16-row slabs a warp, 128 query rows a CTA;
  // f32 keeps one (and its fp32 tiles).
  FlashAttentionConfig d64 = c;
  d64.headDim = 64;
  f = mt::generateFlashAttentionForward(d64, &error);
  ASSERT_TRUE(f) << error;
  EXPECT_EQ(f->kernel.grid[0], 2u);
  EXPECT_EQ(f->kernel.block[0], 128u);
  EXPECT_TRUE(contains(f->kernel.source, ", kBr = 128, kBc = 64,"));
  EXPECT_TRUE(contains(f->kernel.source, ", kSlabs = 2;"));
  d64.dtype = DType::F32;
  f = mt::generateFlashAttentionForward(d64, &error);
  ASSERT_TRUE(f) << error;
  EXPECT_TRUE(contains(f->kernel.source, ", kSlabs = 1;"));

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
    auto w1 = mt::generateFlashAttentionBackward(withBackward(c, mt::FlashBackward::Kv128), &error);
    auto w2 = mt::generateFlashAttentionBackward(withBackward(c, mt::FlashBackward::Kv128), &error);
    ASSERT_TRUE(f1 && f2 && b1 && w1 && w2) << describe(c) << ": " << error;
    EXPECT_EQ(f1->kernel.source, f2->kernel.source);
    EXPECT_EQ(w1->main.source, w2->main.source);
    // The forward and kv64 need no shared-memory opt-in; kv128 needs it
    // and stays within what every GPU mt runs on allows.
    EXPECT_LE(f1->kernel.sharedBytes, 48u * 1024) << describe(c);
    EXPECT_LE(b1->main.sharedBytes, 48u * 1024) << describe(c);
    EXPECT_GT(w1->main.sharedBytes, 48u * 1024) << describe(c);
    EXPECT_EQ(mt::cu::check_launch(w1->main.entry, w1->main.grid, w1->main.block, w1->main.sharedBytes), "")
        << describe(c);
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
  // Every (config, source, arch) on two threads: NVRTC takes a second or
  // two per source.
  struct Job {
    std::string what;
    mt::CudaKernel kernel;
    int arch;
    std::string error;
  };
  // A covering subset of the matrix for NVRTC: every head dim and dtype
  // with causal dropout (the most code), the plain form once per head dim,
  // and the tensor-parallel shards; kv128's backward for every head dim and
  // dtype with causal dropout. The other combinations only change
  // constants and branches these compile; every preset's attention also
  // goes through NVRTC in test/mtc/presets.test.
  std::vector<FlashAttentionConfig> subset;
  for (const FlashAttentionConfig &c : matrix())
    if ((c.causal && c.dropoutRate > 0) || c.tensorParallel > 1 ||
        (!c.causal && c.dropoutRate == 0 && c.dtype == DType::BF16))
      subset.push_back(c);
  std::vector<Job> jobs;
  for (const FlashAttentionConfig &c : subset) {
    auto f = mt::generateFlashAttentionForward(c, &error);
    auto b = mt::generateFlashAttentionBackward(c, &error);
    auto w = mt::generateFlashAttentionBackward(withBackward(c, mt::FlashBackward::Kv128), &error);
    ASSERT_TRUE(f && b && w) << error;
    for (int arch : {80, 90}) {
      jobs.push_back({describe(c) + " forward sm_" + std::to_string(arch), f->kernel, arch, ""});
      jobs.push_back({describe(c) + " backward sm_" + std::to_string(arch), b->main, arch, ""});
      if (c.causal && c.dropoutRate > 0 && c.tensorParallel == 1)
        jobs.push_back({describe(withBackward(c, mt::FlashBackward::Kv128)) + " backward sm_" + std::to_string(arch),
                        w->main, arch, ""});
    }
  }
  auto work = [&](size_t first) {
    for (size_t i = first; i < jobs.size(); i += 2)
      jobs[i].error = compile(jobs[i].kernel, jobs[i].arch);
  };
  std::thread other(work, 1);
  work(0);
  other.join();
  for (const Job &j : jobs)
    EXPECT_EQ(j.error, "") << j.what;
}

} // namespace

// ---- Numerics on the host CUDA emulation and on a GPU ---------------------

using mt::test::KernelDevice;
using mt::test::Mirror;

// A tensor as the kernels see it: logical float values and, for bf16/f16,
// their 16-bit storage.
struct Tensor {
  DType type;
  std::vector<float> value;
  std::vector<uint16_t> bits;

  Tensor(DType t, size_t n) : type(t), value(n), bits(t == DType::F32 ? 0 : n) {}
  void *data() { return type == DType::F32 ? static_cast<void *>(value.data()) : bits.data(); }
  size_t bytes() const { return type == DType::F32 ? value.size() * 4 : bits.size() * 2; }
};

uint16_t toF16(float x) { // x exactly representable in f16
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7FFFFFFFu;
  if (mag >= 0x38800000u) // normal
    return uint16_t(sign | (((mag >> 23) - 112u) << 10) | ((mag >> 13) & 0x3FFu));
  float a;
  std::memcpy(&a, &mag, 4);
  return uint16_t(sign | uint32_t(a * 16777216.0f)); // subnormal: a multiple of 2^-24
}

float fromF16(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  float r;
  if (e == 0) {
    r = float(m) * 0x1p-24f;
    return sign ? -r : r;
  }
  uint32_t u = sign | ((e == 31 ? 255u : e + 112u) << 23) | (m << 13);
  std::memcpy(&r, &u, 4);
  return r;
}

// Rounds `t.value` to the storage type and writes its bits.
void encode(Tensor &t) {
  if (t.type == DType::BF16)
    mt::cpu::round_to_bf16(t.value.data(), int64_t(t.value.size()));
  if (t.type == DType::F16)
    mt::cpu::round_to_fp16(t.value.data(), int64_t(t.value.size()));
  for (size_t i = 0; i < t.bits.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &t.value[i], 4);
    t.bits[i] = t.type == DType::BF16 ? uint16_t(u >> 16) : toF16(t.value[i]);
  }
}

// Reads the kernels' 16-bit results back into `t.value`.
void decode(Tensor &t) {
  for (size_t i = 0; i < t.bits.size(); ++i) {
    if (t.type == DType::BF16) {
      const uint32_t u = uint32_t(t.bits[i]) << 16;
      std::memcpy(&t.value[i], &u, 4);
    } else {
      t.value[i] = fromF16(t.bits[i]);
    }
  }
}

Tensor randomTensor(DType t, size_t n, std::mt19937 &rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  Tensor x(t, n);
  for (float &v : x.value)
    v = normal(rng);
  encode(x);
  return x;
}

struct Rng {
  uint64_t seed = 1234, offset = 77, tpRank = 0;
};

// Device copies of a check's tensors and of its seed and RNG offset (device
// scalars, read through pointers as the runtime passes them).
struct DeviceArrays {
  Mirror mirror;
  Rng rng;

  DeviceArrays(KernelDevice &device, const Rng &r) : mirror(device), rng(r) {}
  // "" or the error of mapping and uploading everything.
  std::string upload(const std::vector<std::pair<void *, size_t>> &arrays) {
    for (const auto &[p, bytes] : arrays)
      if (std::string e = mirror.map(p, bytes); !e.empty())
        return e;
    for (uint64_t *v : {&rng.seed, &rng.offset})
      if (std::string e = mirror.map(v, 8); !e.empty())
        return e;
    return mirror.upload();
  }
};

// Launches `k` on the device copies of `pointers` with its scalar
// arguments; "" or the error.
std::string launch(KernelDevice &device, const DeviceArrays &a, const mt::CudaKernel &k,
                   const std::vector<void *> &pointers) {
  std::vector<uint64_t> args;
  for (void *p : pointers)
    args.push_back(a.mirror.at(p));
  for (const std::string &name : k.scalarArgs)
    args.push_back(name == "seed"         ? a.mirror.at(&a.rng.seed)
                   : name == "rng_offset" ? a.mirror.at(&a.rng.offset)
                   : name == "tp_rank"    ? a.rng.tpRank
                                          : k.streams.at(0));
  return device.launch(k.source, k.entry, k.grid, k.block, k.sharedBytes, args);
}

mt::cpu::AttentionShape shapeOf(const FlashAttentionConfig &c, const Rng &rng) {
  mt::cpu::AttentionShape s{c.batch, c.seq, c.heads, c.groups, c.headDim, c.causal, c.scale, c.dropoutRate};
  s.head_offset = int64_t(rng.tpRank) * c.heads;
  s.total_heads = c.heads * c.tensorParallel;
  return s;
}

// max |got - want| / max |want|.
double relativeError(const std::vector<float> &got, const std::vector<float> &want) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(double(got[i]) - double(want[i])));
    mag = std::max(mag, std::fabs(double(want[i])));
  }
  return mag > 0 ? err / mag : err;
}

// The tolerance relative to the largest magnitude: fp32 rounding for f32;
// for bf16/f16 the probabilities (and dS) enter the tensor-core products
// rounded to 8 (bf16) or 11 (f16) significant bits and the results are
// stored rounded, so a few units of 2^-8 / 2^-11.
double tolerance(DType t) { return t == DType::F32 ? 1e-5 : t == DType::BF16 ? 1e-2 : 4e-3; }

// Forward and backward of `c` on `device` against the CPU reference.
void checkNumerics(KernelDevice &device, const FlashAttentionConfig &c, const Rng &rng, uint32_t seed) {
  SCOPED_TRACE(describe(c) + " seq " + std::to_string(c.seq) + " batch " + std::to_string(c.batch));
  std::string error;
  auto fwd = mt::generateFlashAttentionForward(c, &error);
  auto bwd = mt::generateFlashAttentionBackward(c, &error);
  ASSERT_TRUE(fwd && bwd) << error;
  const size_t nq = size_t(c.batch * c.seq * c.heads * c.headDim), nk = size_t(c.batch * c.seq * c.groups * c.headDim);
  std::mt19937 gen(seed);
  Tensor q = randomTensor(c.dtype, nq, gen), k = randomTensor(c.dtype, nk, gen), v = randomTensor(c.dtype, nk, gen);
  Tensor dout = randomTensor(c.dtype, nq, gen);
  Tensor out(c.dtype, nq), dq(c.dtype, nq), dk(c.dtype, nk), dv(c.dtype, nk);
  std::vector<float> lse(fwd->lseBytes / 4, -1.0f);
  std::vector<float> dqAccum(bwd->dqAccumBytes / 4, 1e30f), delta(bwd->deltaBytes / 4, 1e30f);
  // dq, dk, dv start as garbage: the kernels overwrite them.
  std::fill(dq.value.begin(), dq.value.end(), 1e30f), encode(dq);
  std::fill(dk.value.begin(), dk.value.end(), 1e30f), encode(dk);
  std::fill(dv.value.begin(), dv.value.end(), 1e30f), encode(dv);

  DeviceArrays arrays(device, rng);
  ASSERT_EQ(arrays.upload({{q.data(), q.bytes()}, {k.data(), k.bytes()}, {v.data(), v.bytes()},
                           {dout.data(), dout.bytes()}, {out.data(), out.bytes()},
                           {dq.data(), dq.bytes()}, {dk.data(), dk.bytes()}, {dv.data(), dv.bytes()},
                           {lse.data(), lse.size() * 4}, {dqAccum.data(), dqAccum.size() * 4},
                           {delta.data(), delta.size() * 4}}),
            "");
  ASSERT_EQ(launch(device, arrays, fwd->kernel, {q.data(), k.data(), v.data(), out.data(), lse.data()}), "");
  std::vector<void *> args = {dout.data(), q.data(),  k.data(),  v.data(),       out.data(), lse.data(),
                              dq.data(),   dk.data(), dv.data(), dqAccum.data(), delta.data()};
  for (const mt::CudaKernel *kernel : {&bwd->dot, &bwd->main, &bwd->dq})
    ASSERT_EQ(launch(device, arrays, *kernel, args), "") << kernel->entry;
  ASSERT_EQ(arrays.mirror.download(), "");
  decode(out), decode(dq), decode(dk), decode(dv);

  const mt::cpu::AttentionShape shape = shapeOf(c, rng);
  const mt::cpu::RngKey key{rng.seed, c.stream, rng.offset};
  std::vector<float> refOut(nq), cpuLse(lse.size()), refDq(nq), refDk(nk), refDv(nk);
  mt::cpu::attention_fwd(q.value.data(), k.value.data(), v.value.data(), shape, key, refOut.data(),
                         cpuLse.data());
  mt::cpu::attention_bwd(dout.value.data(), q.value.data(), k.value.data(), v.value.data(),
                         refOut.data(), cpuLse.data(), shape, key, refDq.data(), refDk.data(),
                         refDv.data());
  // lse in double from the same (rounded) inputs.
  std::vector<float> refLse(lse.size());
  const int64_t d = c.headDim, perGroup = c.heads / c.groups;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 0; i < c.seq; ++i) {
        std::vector<double> x;
        for (int64_t j = 0; j < (c.causal ? i + 1 : c.seq); ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e)
            dot += double(q.value[((b * c.seq + i) * c.heads + h) * d + e]) *
                   k.value[((b * c.seq + j) * c.groups + h / perGroup) * d + e];
          x.push_back(c.scale * dot);
        }
        const double m = *std::max_element(x.begin(), x.end());
        double sum = 0;
        for (double e : x)
          sum += std::exp(e - m);
        refLse[(b * c.heads + h) * c.seq + i] = float(m + std::log(sum));
      }

  const double tol = tolerance(c.dtype);
  const double eOut = relativeError(out.value, refOut), eLse = relativeError(lse, refLse);
  const double eDq = relativeError(dq.value, refDq), eDk = relativeError(dk.value, refDk);
  const double eDv = relativeError(dv.value, refDv);
  EXPECT_LE(eOut, tol);
  EXPECT_LE(eLse, c.dtype == DType::F32 ? 1e-5 : 1e-4);
  EXPECT_LE(eDq, tol);
  EXPECT_LE(eDk, tol);
  EXPECT_LE(eDv, tol);
  std::printf("  %-50s out %.2e lse %.2e dq %.2e dk %.2e dv %.2e (tolerance %.0e)\n",
              (describe(c) + " seq " + std::to_string(c.seq)).c_str(), eOut, eLse, eDq, eDk, eDv, tol);
}

FlashAttentionConfig smallConfig(DType t, int64_t d, bool gqa, bool causal, double rate, int64_t seq,
                                 int64_t batch) {
  FlashAttentionConfig c;
  c.batch = batch, c.seq = seq, c.heads = 4, c.groups = gqa ? 2 : 4, c.headDim = d;
  c.causal = causal, c.scale = 1.0 / std::sqrt(double(d)), c.dropoutRate = rate, c.stream = 9, c.dtype = t;
  return c;
}

// Each dtype at both head dims, with GQA and MHA, causal or not, dropout
// on or off, and seqs that are and are not multiples of the tiles.
MT_KERNEL_TEST(FlashAttention, F32MatchesCpu) {
  checkNumerics(device, smallConfig(DType::F32, 64, false, true, 0.0, 128, 2), Rng{}, 1);
  checkNumerics(device, smallConfig(DType::F32, 128, true, false, 0.1, 80, 1), Rng{}, 2);
  checkNumerics(device, smallConfig(DType::F32, 64, true, true, 0.2, 100, 1), Rng{}, 3);
  // Seqs no multiple of 8 (100 above, 70 here): mask rows are not Philox-
  // block aligned (the per-element draws instead of the lanes' shared
  // blocks; at 100 a block straddles two rows).
  checkNumerics(device, smallConfig(DType::F32, 64, false, true, 0.2, 70, 1), Rng{}, 9);
}

MT_KERNEL_TEST(FlashAttention, Bf16MatchesCpu) {
  checkNumerics(device, smallConfig(DType::BF16, 64, true, true, 0.1, 100, 2), Rng{}, 4);
  checkNumerics(device, smallConfig(DType::BF16, 128, false, false, 0.0, 64, 1), Rng{}, 5);
  // Head dim 64's two slabs a warp over three query blocks of 128, the last
  // partial, and five key tiles: tiles each slab masks, tiles it does not,
  // and a tile past the diagonal for the first slabs.
  checkNumerics(device, smallConfig(DType::BF16, 64, false, true, 0.0, 300, 1), Rng{}, 11);
}

MT_KERNEL_TEST(FlashAttention, F16MatchesCpu) {
  checkNumerics(device, smallConfig(DType::F16, 64, false, false, 0.0, 128, 1), Rng{}, 6);
  checkNumerics(device, smallConfig(DType::F16, 128, true, true, 0.1, 72, 1), Rng{}, 7);
}

// The kv128 backward against the CPU: every dtype at both head dims, causal
// or not, dropout on or off (with seqs that are and are not multiples of 8:
// the lanes' shared Philox blocks and the per-element draws), GQA (two
// heads a group: the double-buffered query tiles run on from one head into
// the next) and MHA, and seqs no tile divides: a last key block whose last
// warps hold only keys past seq, partial last query tiles, and (causal)
// warps whose keys follow every query of a tile and skip it.
MT_KERNEL_TEST(FlashAttention, Kv128MatchesCpu) {
  const mt::FlashBackward w = mt::FlashBackward::Kv128;
  checkNumerics(device, withBackward(smallConfig(DType::F32, 64, true, true, 0.1, 150, 1), w), Rng{}, 21);
  checkNumerics(device, withBackward(smallConfig(DType::F32, 128, false, false, 0.0, 70, 1), w), Rng{}, 22);
  checkNumerics(device, withBackward(smallConfig(DType::BF16, 64, true, true, 0.1, 200, 2), w), Rng{}, 23);
  checkNumerics(device, withBackward(smallConfig(DType::BF16, 128, false, false, 0.0, 97, 1), w), Rng{}, 24);
  checkNumerics(device, withBackward(smallConfig(DType::BF16, 128, true, true, 0.0, 161, 1), w), Rng{}, 25);
  checkNumerics(device, withBackward(smallConfig(DType::F16, 64, false, false, 0.1, 130, 1), w), Rng{}, 26);
  checkNumerics(device, withBackward(smallConfig(DType::F16, 128, true, true, 0.0, 161, 1), w), Rng{}, 27);
  checkNumerics(device, withBackward(smallConfig(DType::F16, 64, false, true, 0.0, 300, 1), w), Rng{}, 28);
  FlashAttentionConfig tp = withBackward(smallConfig(DType::BF16, 64, true, true, 0.1, 64, 1), w);
  tp.tensorParallel = 2;
  checkNumerics(device, tp, Rng{99, 5, 1}, 29);
}

// A tensor-parallel shard: rank 1 of 2 draws the second half of the whole
// model's mask.
MT_KERNEL_TEST(FlashAttention, TensorParallelShardMatchesCpu) {
  FlashAttentionConfig c = smallConfig(DType::BF16, 64, true, true, 0.1, 64, 1);
  c.tensorParallel = 2;
  checkNumerics(device, c, Rng{99, 5, 1}, 8);
}

// The dropout mask exactly: with q = 0 every row's probabilities are equal
// and with v = I (seq == head dim) out[i][j] is row i's probability of key
// j after dropout, so each element shows its mask bit; they must equal the
// CPU's element for element. Seq 64 takes the forward's shared Philox
// blocks (the quad's four lanes trade words), seq 62 the per-element draws.
MT_KERNEL_TEST(FlashAttention, DropoutMaskIsTheCpus) {
  for (DType t : {DType::F32, DType::BF16})
    for (bool causal : {false, true})
    for (int64_t seq : {64, 62}) {
      SCOPED_TRACE("seq " + std::to_string(seq));
      FlashAttentionConfig c = smallConfig(t, 64, false, causal, 0.3, seq, 2);
      c.tensorParallel = 2;
      const Rng rng{4242, 3, 1};
      std::string error;
      auto fwd = mt::generateFlashAttentionForward(c, &error);
      ASSERT_TRUE(fwd) << error;
      const size_t n = size_t(c.batch * c.seq * c.heads * c.headDim);
      Tensor q(t, n), k(t, n), v(t, n), out(t, n);
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t j = 0; j < c.seq; ++j)
          for (int64_t h = 0; h < c.heads; ++h)
            v.value[((b * c.seq + j) * c.heads + h) * 64 + j] = 1.0f;
      encode(q), encode(k), encode(v);
      std::vector<float> lse(fwd->lseBytes / 4);
      DeviceArrays arrays(device, rng);
      ASSERT_EQ(arrays.upload({{q.data(), q.bytes()}, {k.data(), k.bytes()}, {v.data(), v.bytes()},
                               {out.data(), out.bytes()}, {lse.data(), lse.size() * 4}}),
                "");
      ASSERT_EQ(launch(device, arrays, fwd->kernel, {q.data(), k.data(), v.data(), out.data(), lse.data()}), "");
      ASSERT_EQ(arrays.mirror.download(), "");
      decode(out);
      std::vector<float> ref(n), refLse(lse.size());
      mt::cpu::attention_fwd(q.value.data(), k.value.data(), v.value.data(), shapeOf(c, rng),
                             mt::cpu::RngKey{rng.seed, c.stream, rng.offset}, ref.data(),
                             refLse.data());
      size_t kept = 0, differ = 0;
      for (size_t i = 0; i < n; ++i) {
        kept += ref[i] != 0;
        differ += (ref[i] != 0) != (out.value[i] != 0);
      }
      EXPECT_EQ(differ, 0u) << "dtype " << int(t) << (causal ? " causal" : "");
      // About 70% of the unmasked probabilities survive a rate of 0.3.
      const size_t unmasked = size_t(c.batch * c.heads * (causal ? c.seq * (c.seq + 1) / 2 : c.seq * c.seq));
      EXPECT_GT(kept, unmasked * 6 / 10);
      EXPECT_LT(kept, unmasked * 8 / 10);
    }
}

// The whole matrix at its real sizes (seq 200, eight heads; the tensor-
// parallel shards as their last rank): too slow for the emulation, whose
// tests above take small configurations of the same code paths.
TEST(FlashAttentionOnGpu, EveryConfigurationMatchesCpu) {
  MT_GPU_OR_SKIP(gpu);
  uint32_t seed = 100;
  for (const FlashAttentionConfig &c : matrix())
    for (mt::FlashBackward b : {mt::FlashBackward::Kv64, mt::FlashBackward::Kv128})
      checkNumerics(*gpu, withBackward(c, b), Rng{1234, 77, uint64_t(c.tensorParallel - 1)}, seed++);
}
