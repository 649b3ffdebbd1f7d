// Generated CUDA C run on the CPU: the host emulation's primitives on small
// hand-written kernels, then every generated mt.fused kernel (hand-written
// regions and the tiny preset's, f32 and bf16) against the CPU executor's
// FUSED instruction on random inputs.
#include "CudaHostKernel.h"

#include "compiler/cuda/CudaKernelGen.h"
#include "compiler/import/ImportSpec.h"
#include "compiler/plan/PlanWriter.h"
#include "dialects/mt/MtOps.h"
#include "passes/Passes.h"
#include "runtime/exec/cpu_kernels.h"
#include "runtime/exec/cpu_executor.h"
#include "runtime/plan/plan_reader.h"
#include "spec/Spec.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

using mt::emu::HostKernel;

std::unique_ptr<HostKernel> build(const std::string &source, const std::string &entry) {
  std::string error;
  std::unique_ptr<HostKernel> k = HostKernel::compile(source, entry, &error);
  EXPECT_TRUE(k) << error;
  return k;
}

std::string run(const HostKernel &k, unsigned grid, unsigned block, unsigned shared,
                std::vector<void *> params, unsigned blockY = 1) {
  const unsigned g[3] = {grid, 1, 1}, b[3] = {block, blockY, 1};
  return k.launch(g, b, shared, params.data());
}

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

// ---- Primitives -----------------------------------------------------------

// Each block reverses its slice through static shared memory: without a
// working barrier thread 0 would read buf[last] before its writer ran.
TEST(CudaEmulation, BlockBarrierAndStaticShared) {
  auto k = build(R"(
extern "C" __global__ void __launch_bounds__(128) reverse(const float *__restrict__ in, float *__restrict__ out) {
  __shared__ float buf[128];
  const unsigned t = threadIdx.y * blockDim.x + threadIdx.x, n = blockDim.x * blockDim.y;
  buf[t] = in[blockIdx.x * n + t];
  __syncthreads();
  out[blockIdx.x * n + t] = buf[n - 1 - t] + (float)gridDim.x * 1000.0f;
}
)", "reverse");
  ASSERT_TRUE(k);
  std::vector<float> in(3 * 128), out(in.size(), -1.0f);
  for (size_t i = 0; i < in.size(); ++i)
    in[i] = float(i);
  const float *pin = in.data();
  float *pout = out.data();
  ASSERT_EQ(run(*k, 3, 32, 0, {&pin, &pout}, 4), ""); // 32 x 4 threads: y counts slower
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 128; ++t)
      ASSERT_EQ(out[b * 128 + t], float(b * 128 + 127 - t) + 3000.0f) << b << " " << t;
}

// Every shuffle, with and without `width`, on int, float and double, and the
// votes; two warps so lane numbers restart at 32.
TEST(CudaEmulation, WarpShufflesAndVotes) {
  auto k = build(R"(
extern "C" __global__ void shuffles(int *out, double *dout) {
  const int t = threadIdx.x, lane = t & 31, n = blockDim.x;
  const int v = 100 * t + 7;
  const unsigned full = 0xFFFFFFFFu;
  out[0 * n + t] = __shfl_sync(full, v, (lane * 7 + 3) % 32);
  out[1 * n + t] = __shfl_xor_sync(full, v, 5);
  out[2 * n + t] = __shfl_down_sync(full, v, 3);
  out[3 * n + t] = __shfl_up_sync(full, v, 3);
  out[4 * n + t] = __shfl_xor_sync(full, v, 2, 8);
  out[5 * n + t] = __shfl_down_sync(full, v, 2, 8);
  out[6 * n + t] = (int)__ballot_sync(full, lane % 3 == 0);
  out[7 * n + t] = __any_sync(full, t == 40) + 2 * __all_sync(full, lane < 32) + 4 * __all_sync(full, lane < 31);
  float s = (float)t;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(full, s, o);
  out[8 * n + t] = (int)s;
  out[9 * n + t] = __shfl_sync(full, v, 1, 16);
  dout[t] = __shfl_up_sync(full, 0.5 * t, 1);
  __syncwarp();
}
)", "shuffles");
  ASSERT_TRUE(k);
  const int n = 64;
  std::vector<int> out(10 * n, -1);
  std::vector<double> dout(n);
  int *p = out.data();
  double *d = dout.data();
  ASSERT_EQ(run(*k, 1, n, 0, {&p, &d}), "");
  auto v = [](int t) { return 100 * t + 7; };
  for (int t = 0; t < n; ++t) {
    const int lane = t % 32, w = t - lane;
    EXPECT_EQ(out[0 * n + t], v(w + (lane * 7 + 3) % 32)) << t;
    EXPECT_EQ(out[1 * n + t], v(w + (lane ^ 5))) << t;
    EXPECT_EQ(out[2 * n + t], v(lane + 3 < 32 ? t + 3 : t)) << t;
    EXPECT_EQ(out[3 * n + t], v(lane >= 3 ? t - 3 : t)) << t;
    EXPECT_EQ(out[4 * n + t], v(w + (lane ^ 2))) << t;
    EXPECT_EQ(out[5 * n + t], v(lane % 8 + 2 < 8 ? t + 2 : t)) << t;
    EXPECT_EQ(unsigned(out[6 * n + t]), 0x49249249u) << t; // lanes 0, 3, 6, ...
    EXPECT_EQ(out[7 * n + t], (w == 32 ? 1 : 0) + 2) << t;
    EXPECT_EQ(out[8 * n + t], 32 * w + 496) << t; // sum of the warp's t
    EXPECT_EQ(out[9 * n + t], v(w + lane / 16 * 16 + 1)) << t;
    EXPECT_EQ(dout[t], 0.5 * (lane >= 1 ? t - 1 : t)) << t;
  }
}

// Dynamic shared memory: sized by the launch, 16-byte aligned, shared by
// the block, and filled with 0xFF bytes at each block's start.
TEST(CudaEmulation, DynamicSharedMemory) {
  auto k = build(R"(
extern "C" __global__ void rotate(const float *in, float *out, unsigned *flags) {
  extern __shared__ __align__(16) float dyn[];
  const unsigned t = threadIdx.x, n = blockDim.x;
  if (t == 0) flags[blockIdx.x] = ((unsigned long long)dyn % 16 == 0) + 2 * (__float_as_uint(dyn[n]) == 0xFFFFFFFFu);
  __syncthreads();
  dyn[t] = in[blockIdx.x * n + t];
  dyn[n] = 1.0f;
  __syncthreads();
  out[blockIdx.x * n + t] = dyn[(t + 1) % n];
}
)", "rotate");
  ASSERT_TRUE(k);
  const unsigned n = 96, blocks = 2;
  std::vector<float> in(n * blocks), out(n * blocks);
  std::vector<unsigned> flags(blocks);
  for (size_t i = 0; i < in.size(); ++i)
    in[i] = 0.25f * float(i);
  const float *pi = in.data();
  float *po = out.data();
  unsigned *pf = flags.data();
  ASSERT_EQ(run(*k, blocks, n, (n + 1) * 4, {&pi, &po, &pf}), "");
  for (unsigned b = 0; b < blocks; ++b) {
    EXPECT_EQ(flags[b], 3u) << "block " << b << ": aligned and refilled";
    for (unsigned t = 0; t < n; ++t)
      EXPECT_EQ(out[b * n + t], in[b * n + (t + 1) % n]);
  }
}

TEST(CudaEmulation, Atomics) {
  auto k = build(R"(
extern "C" __global__ void atomics(float *f, double *d, int *i, unsigned *u, unsigned long long *ull) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(f, 0.5f);
  atomicAdd(d, 0.25);
  atomicAdd(&i[0], 2);
  atomicAdd(&u[0], 3u);
  atomicAdd(ull, 1ull << 33);
  atomicMax(&i[1], t * 3 - 100);
  atomicMin(&i[2], 50 - t);
  atomicMax(&u[1], (unsigned)t);
  atomicMin(&u[2], (unsigned)t + 5u);
  int old = i[3], seen;
  while ((seen = atomicCAS(&i[3], old, old + t)) != old) old = seen;
  if (t == 77) { u[3] = atomicExch(&u[4], 9u); atomicExch(&f[1], 2.5f); }
  atomicCAS(&ull[1], 0ull, 42ull);
  __threadfence();
}
)", "atomics");
  ASSERT_TRUE(k);
  float f[2] = {0, 0};
  double d = 0;
  int i[4] = {0, 1 << 30, 0, 0};
  unsigned u[5] = {0, 0, 1000, 0, 4};
  unsigned long long ull[2] = {0, 0};
  float *pf = f;
  double *pd = &d;
  int *pi = i;
  unsigned *pu = u;
  unsigned long long *pl = ull;
  ASSERT_EQ(run(*k, 4, 64, 0, {&pf, &pd, &pi, &pu, &pl}), "");
  EXPECT_EQ(f[0], 128.0f);
  EXPECT_EQ(f[1], 2.5f);
  EXPECT_EQ(d, 64.0);
  EXPECT_EQ(i[0], 512);
  EXPECT_EQ(i[1], 1 << 30);
  EXPECT_EQ(i[2], 50 - 255);
  EXPECT_EQ(i[3], 255 * 256 / 2);
  EXPECT_EQ(u[0], 768u);
  EXPECT_EQ(u[1], 255u);
  EXPECT_EQ(u[2], 5u);
  EXPECT_EQ(u[3], 4u);
  EXPECT_EQ(u[4], 9u);
  EXPECT_EQ(ull[0], 256ull << 33);
  EXPECT_EQ(ull[1], 42ull);
}

// Divergent synchronisation ends the launch with one line instead of hanging,
// and the next launch of the same object runs normally.
TEST(CudaEmulation, DivergenceIsAnError) {
  auto k = build(R"(
extern "C" __global__ void diverge(int mode, int *out) {
  const unsigned t = threadIdx.x;
  int v = (int)t;
  if (mode == 1) { if (t < 16) __syncthreads(); }
  if (mode == 2) { if (t != 5) v = __shfl_xor_sync(0xFFFFFFFFu, v, 1); }
  if (mode == 3) { if ((t & 31) < 16) __syncthreads(); else __syncwarp(); }
  if (mode == 4) { v = __shfl_xor_sync(0x0000FFFFu, v, 1); }
  if (mode == 5) { if (t & 1) v = __shfl_xor_sync(0xFFFFFFFFu, v, 1); else v = (int)__ballot_sync(0xFFFFFFFFu, 1); }
  __syncthreads();
  out[t] = v;
}
)", "diverge");
  ASSERT_TRUE(k);
  std::vector<int> out(64);
  int *p = out.data();
  for (int mode : {1, 2, 3, 4, 5, 0}) {
    std::string e = run(*k, 2, 64, 0, {&mode, &p});
    SCOPED_TRACE("mode " + std::to_string(mode) + ": " + e);
    switch (mode) {
    case 1:
      EXPECT_TRUE(contains(e, "block (0, 0, 0): divergent synchronisation: 16 thread(s) wait at "
                              "__syncthreads, 0 wait at a warp collective, 48 have exited"));
      break;
    case 2:
      EXPECT_TRUE(contains(e, "divergent synchronisation"));
      EXPECT_TRUE(contains(e, "wait at a warp collective (first: thread 0 at __shfl_xor_sync)"));
      break;
    case 3:
      EXPECT_TRUE(contains(e, "at __syncwarp"));
      EXPECT_TRUE(contains(e, "needs every lane of its warp"));
      break;
    case 4:
      EXPECT_TRUE(contains(e, "mask 0x0000FFFF: only full-mask warp collectives are emulated"));
      break;
    case 5:
      EXPECT_TRUE(contains(e, "lane 0 is at __ballot_sync but lane 1 at __shfl_xor_sync"));
      break;
    default:
      EXPECT_EQ(e, "");
      for (int t = 0; t < 64; ++t)
        EXPECT_EQ(out[t], t);
    }
  }
  unsigned g[3] = {1, 1, 1}, b[3] = {2048, 1, 1};
  int mode = 0;
  void *params[] = {&mode, &p};
  EXPECT_TRUE(contains(k->launch(g, b, 0, params), "invalid launch"));
}

TEST(CudaEmulation, CompileErrorsNameTheDiagnostic) {
  std::string error;
  auto k = HostKernel::compile("extern \"C\" __global__ void bad() { undefined_name = 1; }",
                               "bad", &error);
  EXPECT_FALSE(k);
  EXPECT_TRUE(contains(error, "host compile of 'bad' failed")) << error;
  EXPECT_TRUE(contains(error, "undefined_name")) << error;
}

// ---- Tensor-core hooks ----------------------------------------------------

// Random 16-bit floats of moderate range: bf16 from a float's upper half,
// f16 from its fields (exponent 10..20: values 2^-5 .. 2^5).
uint16_t randomHalf(std::mt19937 &rng, bool bf16) {
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  if (bf16) {
    float f = u(rng);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return uint16_t(b >> 16);
  }
  return uint16_t((rng() & 0x8000u) | ((10 + rng() % 11) << 10) | (rng() & 0x3FFu));
}
double halfValue(uint16_t h, bool bf16) {
  if (bf16) {
    uint32_t b = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  const int e = (h >> 10) & 31, m = h & 0x3FF;
  double v = e ? std::ldexp(1024 + m, e - 25) : std::ldexp(m, -24);
  return (h & 0x8000) ? -v : v;
}

const char *kMma = R"(
extern "C" __global__ void mma(const unsigned *a, const unsigned *b, const float *c, float *d, int bf16) {
  const unsigned lane = threadIdx.x;
  unsigned ra[4], rb[2];
  float acc[4];
  for (int i = 0; i < 4; ++i) { ra[i] = a[lane * 4 + i]; acc[i] = c[lane * 4 + i]; }
  for (int i = 0; i < 2; ++i) rb[i] = b[lane * 2 + i];
#if defined(__CUDA_ARCH__)
  asm volatile("this PTX must not be compiled on the host");
#else
  if (bf16) mt_host_mma_bf16_m16n8k16(acc, ra, rb, acc); // d aliases c
  else mt_host_mma_f16_m16n8k16(acc, ra, rb, acc);
#endif
  for (int i = 0; i < 4; ++i) d[lane * 4 + i] = acc[i];
}
)";

// D = A B + C for random 16x16 A, 16x8 B and C, with the fragments of each
// lane assembled from the PTX ISA's formulas for mma.m16n8k16 (element i of
// a lane's a0..a7: row g + 8 for 2 <= i < 4 or i >= 6, column 2t + (i & 1),
// + 8 for i >= 4; b0..b3: row 2t + (i & 1), + 8 for i >= 2, column g;
// c0..c3: row g, + 8 for i >= 2, column 2t + (i & 1)).
// Tolerance: fp32 accumulation of 16 exact products, |error| <= 17 * 2^-24 *
// (|c| + sum |a b|).
TEST(CudaEmulation, MmaM16n8k16) {
  auto k = build(kMma, "mma");
  ASSERT_TRUE(k);
  std::mt19937 rng(5);
  for (int bf16 : {1, 0}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f16");
    uint16_t A[16][16], B[16][8];
    float C[16][8];
    for (auto &row : A)
      for (auto &x : row)
        x = randomHalf(rng, bf16);
    for (auto &row : B)
      for (auto &x : row)
        x = randomHalf(rng, bf16);
    for (auto &row : C)
      for (auto &x : row)
        x = std::uniform_real_distribution<float>(-8, 8)(rng);
    std::vector<unsigned> a(32 * 4, 0), b(32 * 2, 0);
    std::vector<float> c(32 * 4), d(32 * 4);
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane % 4;
      for (int i = 0; i < 8; ++i) {
        const int row = g + (((i >= 2 && i < 4) || i >= 6) ? 8 : 0);
        const int col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
        a[lane * 4 + i / 2] |= unsigned(A[row][col]) << (16 * (i % 2));
      }
      for (int i = 0; i < 4; ++i)
        b[lane * 2 + i / 2] |= unsigned(B[2 * t + (i & 1) + (i >= 2 ? 8 : 0)][g]) << (16 * (i % 2));
      for (int i = 0; i < 4; ++i)
        c[lane * 4 + i] = C[g + (i >= 2 ? 8 : 0)][2 * t + (i & 1)];
    }
    const unsigned *pa = a.data(), *pb = b.data();
    const float *pc = c.data();
    float *pd = d.data();
    ASSERT_EQ(run(*k, 1, 32, 0, {&pa, &pb, &pc, &pd, &bf16}), "");
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i) {
        const int row = (lane >> 2) + (i >= 2 ? 8 : 0), col = 2 * (lane % 4) + (i & 1);
        double ref = C[row][col], mag = std::fabs(C[row][col]);
        for (int q = 0; q < 16; ++q) {
          const double p = halfValue(A[row][q], bf16) * halfValue(B[q][col], bf16);
          ref += p;
          mag += std::fabs(p);
        }
        EXPECT_NEAR(d[lane * 4 + i], ref, 17 * 0x1p-24 * mag) << "D[" << row << "][" << col << "]";
      }
  }
}

const char *kLdmatrix = R"(
// Four 8x8 matrices of 16-bit values in shared memory, rows 24 elements
// (48 bytes) apart; lane i points at row i % 8 of matrix i / 8.
extern "C" __global__ void ld(const unsigned short *in, unsigned *out, int count, int trans) {
  __shared__ __align__(16) unsigned short tile[4 * 8 * 24];
  const unsigned lane = threadIdx.x;
  for (int e = lane; e < 4 * 8 * 24; e += 32) tile[e] = in[e];
  __syncwarp();
  const void *row = lane < 8u * count ? &tile[(lane / 8) * 8 * 24 + (lane % 8) * 24] : nullptr;
  unsigned r[4] = {0, 0, 0, 0};
  mt_host_ldmatrix(r, count, trans != 0, row);
  for (int j = 0; j < 4; ++j) out[lane * 4 + j] = r[j];
}
)";

// ldmatrix per the PTX ISA: lane l's register j holds row l / 4, columns
// 2 (l % 4) and 2 (l % 4) + 1 of matrix j (of its transpose with .trans),
// the first in the low half; lanes from 8 * count on give no address.
TEST(CudaEmulation, Ldmatrix) {
  auto k = build(kLdmatrix, "ld");
  ASSERT_TRUE(k);
  std::vector<uint16_t> in(4 * 8 * 24);
  for (size_t e = 0; e < in.size(); ++e)
    in[e] = uint16_t(e * 37 + 11);
  auto at = [&](int m, int r, int c) { return unsigned(in[m * 8 * 24 + r * 24 + c]); };
  for (int count : {1, 2, 4})
    for (int trans : {0, 1}) {
      SCOPED_TRACE("x" + std::to_string(count) + (trans ? ".trans" : ""));
      std::vector<unsigned> out(32 * 4, 0xDEADBEEF);
      const uint16_t *pi = in.data();
      unsigned *po = out.data();
      ASSERT_EQ(run(*k, 1, 32, 0, {&pi, &po, &count, &trans}), "");
      for (int l = 0; l < 32; ++l)
        for (int j = 0; j < 4; ++j) {
          const int q = l / 4, p = 2 * (l % 4);
          unsigned want = 0;
          if (j < count)
            want = trans ? at(j, p, q) | at(j, p + 1, q) << 16 : at(j, q, p) | at(j, q, p + 1) << 16;
          EXPECT_EQ(out[l * 4 + j], want) << "lane " << l << " register " << j;
        }
    }
}

// The usual pairing: ldmatrix.x4 of a row-major 16x16 A tile and
// ldmatrix.x2.trans of a row-major 16x8 B (K x N) give mma's fragments, so
// D = A B through both hooks; f16 values k / 8 make every sum exact.
TEST(CudaEmulation, LdmatrixFeedsMma) {
  auto k = build(R"(
extern "C" __global__ void gemm(const unsigned short *a, const unsigned short *b, float *d) {
  __shared__ __align__(16) unsigned short sa[16 * 16], sb[16 * 8];
  const unsigned lane = threadIdx.x;
  for (int e = lane; e < 256; e += 32) sa[e] = a[e];
  for (int e = lane; e < 128; e += 32) sb[e] = b[e];
  __syncthreads();
  unsigned ra[4], rb[2];
  mt_host_ldmatrix(ra, 4, false, &sa[(lane % 16) * 16 + (lane / 16) * 8]);
  mt_host_ldmatrix(rb, 2, true, &sb[(lane % 16) * 8]);
  float acc[4] = {0, 0, 0, 0};
  mt_host_mma_f16_m16n8k16(acc, ra, rb, acc);
  const int g = lane >> 2, t = lane % 4;
  for (int i = 0; i < 4; ++i) d[(g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)] = acc[i];
}
)", "gemm");
  ASSERT_TRUE(k);
  auto f16 = [](int v) { // v / 8 for |v| < 64, exactly: 2^(e - 3) (1 + fraction)
    if (v == 0)
      return uint16_t(0);
    const int m = std::abs(v);
    int e = 0;
    while ((2 << e) <= m)
      ++e;
    return uint16_t((v < 0 ? 0x8000 : 0) | ((e - 3 + 15) << 10) | ((m << (10 - e)) & 0x3FF));
  };
  std::mt19937 rng(9);
  int A[16][16], B[16][8];
  std::vector<uint16_t> a(256), b(128);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j)
      a[i * 16 + j] = f16(A[i][j] = int(rng() % 63) - 31);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j)
      b[i * 8 + j] = f16(B[i][j] = int(rng() % 63) - 31);
  std::vector<float> d(128);
  const uint16_t *pa = a.data(), *pb = b.data();
  float *pd = d.data();
  ASSERT_EQ(run(*k, 1, 32, 0, {&pa, &pb, &pd}), "");
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      int ref = 0;
      for (int q = 0; q < 16; ++q)
        ref += A[i][q] * B[q][j];
      EXPECT_EQ(d[i * 8 + j], float(ref) / 64.0f) << i << " " << j;
    }
}

// ---- Generated kernels against the CPU executor ----------------------------

namespace pl = mt::plan;

constexpr const char *kSpec = R"toml(
[model]
num_layers = 4
hidden_size = 32
num_attention_heads = 4
seq_length = 4
vocab_size = 256

[training]
micro_batch_size = 2
train_iters = 1
lr = 1e-3

[data]
mock_data = true
)toml";

// One mt.fused per function (each becomes a program with one FUSED
// instruction): f32, bf16 and f16; elementwise with and without a scalar
// tail; LayerNorm and RMSNorm rows of one warp and of several with more
// than one group of lanes per thread (a last group only some threads
// hold); residual + dropout + norm with both outputs; the gradient's
// add + dropout with both outputs (a scalar tail, and 9 blocks); dropout
// last, so its zeros are visible in the output.
constexpr const char *kRegions = R"mlir(
func.func @f32_bias_gelu_dropout(%y: tensor<2x4x32xf32>, %b: tensor<32xf32>) -> tensor<2x4x32xf32> {
  %0 = mt.fused elementwise "bias_add+gelu+dropout" (%a = %y, %bb = %b) : (tensor<2x4x32xf32>, tensor<32xf32>) -> tensor<2x4x32xf32> {
    %1 = mt.bias_add %a, %bb : tensor<2x4x32xf32>, tensor<32xf32>
    %2 = mt.gelu %1 tanh : tensor<2x4x32xf32>
    %3 = mt.dropout %2 {rate = 2.500000e-01 : f64, stream = 3 : i64} : tensor<2x4x32xf32>
    mt.yield %3 : tensor<2x4x32xf32>
  }
  return %0 : tensor<2x4x32xf32>
}
func.func @f32_swiglu_grad_gelu_grad(%dy: tensor<4x48xf32>, %xf: tensor<4x96xf32>) -> tensor<4x96xf32> {
  %0 = mt.fused elementwise "swiglu_grad+gelu_grad" (%g = %dy, %in = %xf) : (tensor<4x48xf32>, tensor<4x96xf32>) -> tensor<4x96xf32> {
    %1 = mt.swiglu_grad %g, %in : (tensor<4x48xf32>, tensor<4x96xf32>) -> tensor<4x96xf32>
    %2 = mt.gelu_grad %1, %in erf : tensor<4x96xf32>
    mt.yield %2 : tensor<4x96xf32>
  }
  return %0 : tensor<4x96xf32>
}
func.func @f32_tail_gelu_dropout(%h: tensor<3x5x7xf32>) -> tensor<3x5x7xf32> {
  %0 = mt.fused elementwise "gelu+dropout" (%hh = %h) : (tensor<3x5x7xf32>) -> tensor<3x5x7xf32> {
    %1 = mt.gelu %hh erf : tensor<3x5x7xf32>
    %2 = mt.dropout %1 {rate = 5.000000e-01 : f64, stream = 1 : i64} : tensor<3x5x7xf32>
    mt.yield %2 : tensor<3x5x7xf32>
  }
  return %0 : tensor<3x5x7xf32>
}
func.func @f32_bias_swiglu(%x: tensor<4x96xf32>, %b: tensor<96xf32>) -> tensor<4x48xf32> {
  %0 = mt.fused elementwise "bias_add+swiglu" (%a = %x, %bb = %b) : (tensor<4x96xf32>, tensor<96xf32>) -> tensor<4x48xf32> {
    %1 = mt.bias_add %a, %bb : tensor<4x96xf32>, tensor<96xf32>
    %2 = mt.swiglu %1 : (tensor<4x96xf32>) -> tensor<4x48xf32>
    mt.yield %2 : tensor<4x48xf32>
  }
  return %0 : tensor<4x48xf32>
}
func.func @f32_dropout_add_layer_norm(%x: tensor<6x64xf32>, %r: tensor<6x64xf32>, %w: tensor<64xf32>, %lb: tensor<64xf32>) -> (tensor<6x64xf32>, tensor<6x64xf32>) {
  %0:2 = mt.fused row_reduction "dropout+add+layer_norm" (%p = %x, %q = %r, %ww = %w, %bl = %lb) : (tensor<6x64xf32>, tensor<6x64xf32>, tensor<64xf32>, tensor<64xf32>) -> (tensor<6x64xf32>, tensor<6x64xf32>) {
    %1 = mt.dropout %p {rate = 1.000000e-01 : f64, stream = 2 : i64} : tensor<6x64xf32>
    %2 = mt.add %1, %q : tensor<6x64xf32>
    %3 = mt.layer_norm %2, %ww, %bl {epsilon = 1.000000e-05 : f64} : tensor<6x64xf32>, tensor<64xf32>
    mt.yield %2, %3 : tensor<6x64xf32>, tensor<6x64xf32>
  }
  return %0#0, %0#1 : tensor<6x64xf32>, tensor<6x64xf32>
}
func.func @f32_add_rms_norm_wide(%x: tensor<3x4104xf32>, %r: tensor<3x4104xf32>, %w: tensor<4104xf32>) -> tensor<3x4104xf32> {
  %0 = mt.fused row_reduction "add+rms_norm" (%p = %x, %q = %r, %ww = %w) : (tensor<3x4104xf32>, tensor<3x4104xf32>, tensor<4104xf32>) -> tensor<3x4104xf32> {
    %1 = mt.add %p, %q : tensor<3x4104xf32>
    %2 = mt.rms_norm %1, %ww {epsilon = 1.000000e-06 : f64} : tensor<3x4104xf32>, tensor<4104xf32>
    mt.yield %2 : tensor<3x4104xf32>
  }
  return %0 : tensor<3x4104xf32>
}
func.func @bf16_bias_swiglu_dropout_add(%x: tensor<4x96xbf16>, %b: tensor<96xbf16>, %r: tensor<4x48xbf16>) -> tensor<4x48xbf16> {
  %0 = mt.fused elementwise "bias_add+swiglu+dropout+add" (%a = %x, %bb = %b, %rr = %r) : (tensor<4x96xbf16>, tensor<96xbf16>, tensor<4x48xbf16>) -> tensor<4x48xbf16> {
    %1 = mt.bias_add %a, %bb : tensor<4x96xbf16>, tensor<96xbf16>
    %2 = mt.swiglu %1 : (tensor<4x96xbf16>) -> tensor<4x48xbf16>
    %3 = mt.dropout %2 {rate = 1.000000e-01 : f64, stream = 7 : i64} : tensor<4x48xbf16>
    %4 = mt.add %3, %rr : tensor<4x48xbf16>
    mt.yield %4 : tensor<4x48xbf16>
  }
  return %0 : tensor<4x48xbf16>
}
func.func @bf16_tail_gelu_dropout(%h: tensor<3x5x7xbf16>) -> tensor<3x5x7xbf16> {
  %0 = mt.fused elementwise "gelu+dropout" (%hh = %h) : (tensor<3x5x7xbf16>) -> tensor<3x5x7xbf16> {
    %1 = mt.gelu %hh tanh : tensor<3x5x7xbf16>
    %2 = mt.dropout %1 {rate = 3.000000e-01 : f64, stream = 5 : i64} : tensor<3x5x7xbf16>
    mt.yield %2 : tensor<3x5x7xbf16>
  }
  return %0 : tensor<3x5x7xbf16>
}
func.func @bf16_add_layer_norm_dropout(%x: tensor<4x96xbf16>, %t: tensor<4x96xbf16>, %w: tensor<96xbf16>, %lb: tensor<96xbf16>) -> tensor<4x96xbf16> {
  %0 = mt.fused row_reduction "add+layer_norm+dropout" (%p = %x, %q = %t, %ww = %w, %bl = %lb) : (tensor<4x96xbf16>, tensor<4x96xbf16>, tensor<96xbf16>, tensor<96xbf16>) -> tensor<4x96xbf16> {
    %1 = mt.add %p, %q : tensor<4x96xbf16>
    %2 = mt.layer_norm %1, %ww, %bl {epsilon = 1.000000e-05 : f64} : tensor<4x96xbf16>, tensor<96xbf16>
    %3 = mt.dropout %2 {rate = 1.000000e-01 : f64, stream = 4 : i64} : tensor<4x96xbf16>
    mt.yield %3 : tensor<4x96xbf16>
  }
  return %0 : tensor<4x96xbf16>
}
func.func @bf16_dropout_add_rms_norm(%x: tensor<8x2048xbf16>, %r: tensor<8x2048xbf16>, %w: tensor<2048xbf16>) -> (tensor<8x2048xbf16>, tensor<8x2048xbf16>) {
  %0:2 = mt.fused row_reduction "dropout+add+rms_norm" (%p = %x, %q = %r, %ww = %w) : (tensor<8x2048xbf16>, tensor<8x2048xbf16>, tensor<2048xbf16>) -> (tensor<8x2048xbf16>, tensor<8x2048xbf16>) {
    %1 = mt.dropout %p {rate = 1.000000e-01 : f64, stream = 9 : i64} : tensor<8x2048xbf16>
    %2 = mt.add %1, %q : tensor<8x2048xbf16>
    %3 = mt.rms_norm %2, %ww {epsilon = 1.000000e-05 : f64} : tensor<8x2048xbf16>, tensor<2048xbf16>
    mt.yield %2, %3 : tensor<8x2048xbf16>, tensor<8x2048xbf16>
  }
  return %0#0, %0#1 : tensor<8x2048xbf16>, tensor<8x2048xbf16>
}
func.func @f16_tail_gelu_dropout(%h: tensor<3x5x7xf16>) -> tensor<3x5x7xf16> {
  %0 = mt.fused elementwise "gelu+dropout" (%hh = %h) : (tensor<3x5x7xf16>) -> tensor<3x5x7xf16> {
    %1 = mt.gelu %hh tanh : tensor<3x5x7xf16>
    %2 = mt.dropout %1 {rate = 5.000000e-01 : f64, stream = 1 : i64} : tensor<3x5x7xf16>
    mt.yield %2 : tensor<3x5x7xf16>
  }
  return %0 : tensor<3x5x7xf16>
}
func.func @f16_bias_gelu_grad(%dy: tensor<16x40xf16>, %x: tensor<16x40xf16>, %b: tensor<40xf16>) -> tensor<16x40xf16> {
  %0 = mt.fused elementwise "bias_add+gelu_grad" (%g = %dy, %a = %x, %bb = %b) : (tensor<16x40xf16>, tensor<16x40xf16>, tensor<40xf16>) -> tensor<16x40xf16> {
    %1 = mt.bias_add %a, %bb : tensor<16x40xf16>, tensor<40xf16>
    %2 = mt.gelu_grad %g, %1 tanh : tensor<16x40xf16>
    mt.yield %2 : tensor<16x40xf16>
  }
  return %0 : tensor<16x40xf16>
}
func.func @bf16_add_dropout_both(%g: tensor<3x5x7xbf16>, %n: tensor<3x5x7xbf16>) -> (tensor<3x5x7xbf16>, tensor<3x5x7xbf16>) {
  %0:2 = mt.fused elementwise "add+dropout" (%gg = %g, %nn = %n) : (tensor<3x5x7xbf16>, tensor<3x5x7xbf16>) -> (tensor<3x5x7xbf16>, tensor<3x5x7xbf16>) {
    %1 = mt.add %gg, %nn : tensor<3x5x7xbf16>
    %2 = mt.dropout %1 {rate = 2.000000e-01 : f64, stream = 8 : i64} : tensor<3x5x7xbf16>
    mt.yield %1, %2 : tensor<3x5x7xbf16>, tensor<3x5x7xbf16>
  }
  return %0#0, %0#1 : tensor<3x5x7xbf16>, tensor<3x5x7xbf16>
}
func.func @f32_add_dropout_both(%g: tensor<9x1000xf32>, %n: tensor<9x1000xf32>) -> (tensor<9x1000xf32>, tensor<9x1000xf32>) {
  %0:2 = mt.fused elementwise "add+dropout" (%gg = %g, %nn = %n) : (tensor<9x1000xf32>, tensor<9x1000xf32>) -> (tensor<9x1000xf32>, tensor<9x1000xf32>) {
    %1 = mt.add %gg, %nn : tensor<9x1000xf32>
    %2 = mt.dropout %1 {rate = 1.000000e-01 : f64, stream = 2 : i64} : tensor<9x1000xf32>
    mt.yield %1, %2 : tensor<9x1000xf32>, tensor<9x1000xf32>
  }
  return %0#0, %0#1 : tensor<9x1000xf32>, tensor<9x1000xf32>
}
func.func @f16_dropout_add_layer_norm(%x: tensor<5x1000xf16>, %r: tensor<5x1000xf16>, %w: tensor<1000xf16>, %lb: tensor<1000xf16>) -> (tensor<5x1000xf16>, tensor<5x1000xf16>) {
  %0:2 = mt.fused row_reduction "dropout+add+layer_norm" (%p = %x, %q = %r, %ww = %w, %bl = %lb) : (tensor<5x1000xf16>, tensor<5x1000xf16>, tensor<1000xf16>, tensor<1000xf16>) -> (tensor<5x1000xf16>, tensor<5x1000xf16>) {
    %1 = mt.dropout %p {rate = 2.000000e-01 : f64, stream = 6 : i64} : tensor<5x1000xf16>
    %2 = mt.add %1, %q : tensor<5x1000xf16>
    %3 = mt.layer_norm %2, %ww, %bl {epsilon = 1.000000e-05 : f64} : tensor<5x1000xf16>, tensor<1000xf16>
    mt.yield %2, %3 : tensor<5x1000xf16>, tensor<5x1000xf16>
  }
  return %0#0, %0#1 : tensor<5x1000xf16>, tensor<5x1000xf16>
}
)mlir";

mt::spec::Spec testSpec(std::vector<mt::spec::Override> overrides = {}) {
  absl::StatusOr<mt::spec::Spec> spec = mt::spec::parseSpecString(kSpec, "emulation.toml", overrides);
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  return *spec;
}

// The plan of `module` (mt-plan-memory, then the plan writer).
std::unique_ptr<mt::rt::PlanFile> planOf(mlir::ModuleOp module, const mt::spec::Spec &spec) {
  mlir::PassManager pm(module.getContext());
  pm.addPass(mt::createMtPlanMemoryPass());
  EXPECT_TRUE(mlir::succeeded(pm.run(module)));
  mlir::FailureOr<std::string> payload = mt::buildPlanPayload(module, spec);
  EXPECT_TRUE(mlir::succeeded(payload));
  if (mlir::failed(payload))
    return nullptr;
  std::string error;
  auto file = mt::rt::PlanFile::from_bytes(
      mt::rt::wrap_plan_payload(reinterpret_cast<const uint8_t *>(payload->data()), payload->size()),
      "emulation.plan", &error);
  EXPECT_TRUE(file) << error;
  return file;
}

int64_t count(const pl::Value &v) {
  int64_t n = 1;
  for (int64_t d : *v.shape())
    n *= d;
  return n;
}

// The bf16 / f16 bits of a float the CPU executor has already rounded to the
// type, so exact.
uint16_t toBits(float x, pl::DType t) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (t == pl::DType::BF16)
    return uint16_t(u >> 16);
  const uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u)
    return uint16_t(sign | 0x7E00u);
  if (mag >= 0x47800000u)
    return uint16_t(sign | 0x7C00u);
  if (mag >= 0x38800000u)
    return uint16_t(sign | (((mag >> 23) - 112u) << 10) | ((mag >> 13) & 0x3FFu));
  return uint16_t(sign | uint32_t(std::fabs(x) * 0x1p24f));
}
float fromBits(uint16_t h, pl::DType t) {
  if (t == pl::DType::BF16) {
    uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  if ((h & 0x7C00) == 0x7C00) // infinities and NaN
    return (h & 0x3FF) ? NAN : (h & 0x8000) ? -INFINITY : INFINITY;
  return float(halfValue(h, false));
}

// One unit in the last place of `t` at |x|'s binade.
double ulp(double x, pl::DType t) {
  const int bits = t == pl::DType::F32 ? 24 : t == pl::DType::BF16 ? 8 : 11;
  int e;
  std::frexp(std::fabs(x) > 0 ? std::fabs(x) : 1e-30, &e);
  return std::ldexp(1.0, e - bits);
}

struct KernelStats {
  int kernels = 0;
  int64_t elements = 0, dropped = 0, identical = 0;
};

// Runs every program of `file` (each one FUSED instruction over its inputs)
// on the CPU executor and the kernel's cuda_source on the emulation, from
// the same random inputs, and compares every output.
//
// Tolerances. Both sides compute in fp32 and round each op's result to its
// type, but the emulation's math functions are the host's while the order of
// a row's sums differs (warp shuffles and per-warp partials against the
// CPU's loop), so:
//   - f32: |gpu - cpu| <= 2^-20 max(|cpu|, 1), about 1e-6 relative (inputs
//     are N(0, 1), so a kernel's values are O(1)).
//   - bf16 / f16: a different fp32 value may round to the neighbouring
//     16-bit number, in the output or in an intermediate rounding, which then
//     carries at the intermediate's magnitude; so |gpu - cpu| <= 2 ulp of the
//     stored type at max(|cpu|, 4) (values past 4 are rare for N(0, 1)
//     inputs, and a kernel with a bug is off by far more).
//   - dropout: the positions of exact zeros agree bit for bit (both use
//     Philox4x32-10 with the same key, counter and threshold; a kept value
//     is never exactly zero for these inputs).
void compareAll(const mt::rt::PlanFile &file, uint64_t inputSeed, KernelStats *stats,
                std::set<std::string> *sources = nullptr) {
  const pl::Plan &plan = *file.plan();
  mt::rt::CpuExecutor ex(plan, 0);
  ex.init_params(1);
  const uint64_t seed = 1234, rngOffset = 5;
  ex.set_seed(seed);
  std::mt19937_64 rng(inputSeed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const pl::Program *prog : *plan.ranks()->Get(0)->programs()) {
    const std::string name = prog->name()->str();
    SCOPED_TRACE(name);
    std::map<uint32_t, std::vector<float>> inputs;
    for (uint32_t v : *prog->inputs()) {
      const pl::Value &val = *prog->values()->Get(v);
      std::vector<float> x(size_t(count(val)));
      for (float &f : x)
        f = normal(rng);
      if (val.dtype() == pl::DType::BF16)
        mt::cpu::round_to_bf16(x.data(), int64_t(x.size()));
      if (val.dtype() == pl::DType::F16)
        mt::cpu::round_to_fp16(x.data(), int64_t(x.size()));
      std::memcpy(ex.value_data(*prog, v), x.data(), x.size() * sizeof(float));
      inputs[v] = std::move(x);
    }
    ASSERT_EQ(ex.run(*prog, rngOffset), "");

    ASSERT_EQ(prog->instructions()->size(), 1u);
    const pl::Instruction &ins = *prog->instructions()->Get(0);
    ASSERT_EQ(ins.op(), pl::Opcode::FUSED);
    const pl::Kernel &k = *plan.kernels()->Get(uint32_t(ins.ints()->Get(0)));
    if (sources)
      sources->insert(k.cuda_source()->str());
    auto kernel = build(k.cuda_source()->str(), k.entry()->str());
    ASSERT_TRUE(kernel);

    // Device buffers in the storage types; outputs start as all-ones bytes
    // (NaN) so an element the kernel does not write shows.
    std::vector<std::vector<uint8_t>> buffers;
    std::vector<void *> pointers, params;
    auto bytesOf = [](pl::DType t) { return t == pl::DType::F32 ? 4 : 2; };
    for (uint32_t v : *ins.in()) {
      const pl::Value &val = *prog->values()->Get(v);
      ASSERT_TRUE(inputs.count(v)) << "kernel input " << v << " is not a program input";
      const std::vector<float> &x = inputs[v];
      std::vector<uint8_t> b(x.size() * bytesOf(val.dtype()));
      for (size_t i = 0; i < x.size(); ++i) {
        if (val.dtype() == pl::DType::F32) {
          std::memcpy(&b[4 * i], &x[i], 4);
        } else {
          uint16_t h = toBits(x[i], val.dtype());
          ASSERT_EQ(fromBits(h, val.dtype()), x[i]);
          std::memcpy(&b[2 * i], &h, 2);
        }
      }
      buffers.push_back(std::move(b));
    }
    for (uint32_t v : *ins.out()) {
      const pl::Value &val = *prog->values()->Get(v);
      buffers.emplace_back(size_t(count(val)) * bytesOf(val.dtype()), 0xFF);
    }
    pointers.reserve(buffers.size());
    for (auto &b : buffers)
      pointers.push_back(b.data());
    std::vector<unsigned long long> scalars;
    scalars.reserve(k.scalar_args()->size());
    uint32_t stream = 0;
    for (const auto *s : *k.scalar_args()) {
      const std::string a = s->str();
      // The seed and the offset are device scalars: pointers to them.
      scalars.push_back(a == "seed"         ? reinterpret_cast<uintptr_t>(&seed)
                        : a == "rng_offset" ? reinterpret_cast<uintptr_t>(&rngOffset)
                        : a == "tp_rank"    ? 0
                                            : k.streams()->Get(stream++));
    }
    for (void *&p : pointers)
      params.push_back(&p);
    for (unsigned long long &s : scalars)
      params.push_back(&s);
    const unsigned grid[3] = {k.grid()->Get(0), k.grid()->Get(1), k.grid()->Get(2)};
    const unsigned block[3] = {k.block()->Get(0), k.block()->Get(1), k.block()->Get(2)};
    ASSERT_EQ(kernel->launch(grid, block, k.shared_bytes(), params.data()), "");

    ++stats->kernels;
    for (uint32_t o = 0; o < ins.out()->size(); ++o) {
      const uint32_t v = ins.out()->Get(o);
      const pl::Value &val = *prog->values()->Get(v);
      const float *cpu = static_cast<const float *>(ex.value_data(*prog, v));
      const std::vector<uint8_t> &b = buffers[ins.in()->size() + o];
      int bad = 0;
      for (int64_t i = 0; i < count(val); ++i) {
        float gpu;
        if (val.dtype() == pl::DType::F32) {
          std::memcpy(&gpu, &b[4 * i], 4);
        } else {
          uint16_t h;
          std::memcpy(&h, &b[2 * i], 2);
          gpu = fromBits(h, val.dtype());
        }
        const double c = cpu[i];
        const double tol = val.dtype() == pl::DType::F32
                               ? 0x1p-20 * std::max(std::fabs(c), 1.0)
                               : 2 * ulp(std::max(std::fabs(c), 4.0), val.dtype());
        ++stats->elements;
        stats->dropped += c == 0;
        stats->identical += std::memcmp(&gpu, &cpu[i], 4) == 0;
        if (!(std::fabs(gpu - c) <= tol) || (gpu == 0) != (c == 0)) {
          if (++bad <= 5)
            ADD_FAILURE() << name << " output " << o << " element " << i << ": emulated " << gpu
                          << ", CPU " << c << " (tolerance " << tol << ")";
        }
      }
      EXPECT_EQ(bad, 0) << name << " output " << o << " of " << count(val);
    }
  }
}

TEST(CudaEmulation, GeneratedKernelsMatchTheCpuExecutor) {
  mlir::MLIRContext context;
  context.loadDialect<mt::MtDialect, mlir::func::FuncDialect>();
  mlir::OwningOpRef<mlir::ModuleOp> module = mlir::parseSourceString<mlir::ModuleOp>(kRegions, &context);
  ASSERT_TRUE(module);
  auto file = planOf(*module, testSpec());
  ASSERT_TRUE(file);
  KernelStats stats;
  compareAll(*file, 17, &stats);
  EXPECT_EQ(stats.kernels, 15);
  EXPECT_GT(stats.dropped, 100); // the dropout checks saw dropped elements
  std::printf("[ stats    ] %d kernels, %lld elements, %lld bit-identical, %lld dropped\n",
              stats.kernels, (long long)stats.elements, (long long)stats.identical,
              (long long)stats.dropped);
}

// A preset's kernels: every mt.fused of the compiled training IR, one of
// each distinct source, moved into a function of its own (its operands
// become the function's arguments) and compared as above. The set of
// sources compared must be exactly the preset plan's Kernel sources.
void comparePreset(const std::vector<mt::spec::Override> &overrides, uint64_t inputSeed) {
  absl::StatusOr<mt::spec::Spec> spec =
      mt::spec::parseSpecFile(std::string(MT_SOURCE_DIR) + "/models/tiny.toml", overrides);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  mlir::MLIRContext context;
  context.loadDialect<mt::MtDialect, mlir::func::FuncDialect>();
  mlir::OwningOpRef<mlir::ModuleOp> module = mt::importSpec(context, *spec);
  ASSERT_TRUE(module);
  mlir::PassManager pm(&context);
  mt::buildTrainPipeline(pm);
  ASSERT_TRUE(mlir::succeeded(pm.run(*module)));
  mlir::FailureOr<std::string> payload = mt::buildPlanPayload(*module, *spec);
  ASSERT_TRUE(mlir::succeeded(payload));
  const pl::Plan *whole = pl::GetPlan(reinterpret_cast<const uint8_t *>(payload->data()));
  std::set<std::string> presetSources;
  // The mt.fused kernels (those with a CPU form), less gemm kernels, which
  // cuBLASLt runs; the other instructions' kernels are mt-opkernel-tests'.
  for (const pl::Kernel *k : *whole->kernels())
    if (k->cuda_source() && k->cuda_source()->size() && k->cpu_instructions() &&
        k->cpu_instructions()->size())
      presetSources.insert(k->cuda_source()->str());

  mlir::OpBuilder b(&context);
  mlir::OwningOpRef<mlir::ModuleOp> kernels = mlir::ModuleOp::create(b.getUnknownLoc());
  b.setInsertionPointToEnd(kernels->getBody());
  std::set<std::string> seen;
  module->walk([&](mt::FusedOp fused) {
    if (fused.getKind() == mt::FusionKind::Gemm || fused.getKind() == mt::FusionKind::GemmGrad)
      return;
    std::string error;
    mt::CudaKernelOptions options;
    options.tensorParallel = spec->parallel.tensor_model_parallel_size;
    std::optional<mt::CudaKernel> k = mt::generateCudaKernel(fused, options, &error);
    ASSERT_TRUE(k) << error;
    if (!seen.insert(k->source).second)
      return;
    auto fn = b.create<mlir::func::FuncOp>(
        fused.getLoc(), "kernel" + std::to_string(seen.size()),
        b.getFunctionType(fused->getOperandTypes(), fused->getResultTypes()));
    mlir::OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToEnd(fn.addEntryBlock());
    mlir::IRMapping map;
    map.map(fused->getOperands(), fn.getArguments());
    mlir::Operation *copy = b.clone(*fused, map);
    b.create<mlir::func::ReturnOp>(fused.getLoc(), copy->getResults());
  });
  auto file = planOf(*kernels, *spec);
  ASSERT_TRUE(file);
  KernelStats stats;
  std::set<std::string> compared;
  compareAll(*file, inputSeed, &stats, &compared);
  EXPECT_EQ(compared, presetSources);
  EXPECT_GT(stats.dropped, 0);
  std::printf("[ stats    ] %d distinct kernels, %lld elements, %lld bit-identical\n",
              stats.kernels, (long long)stats.elements, (long long)stats.identical);
}

TEST(CudaEmulation, TinyPresetKernelsF32) { comparePreset({}, 23); }

TEST(CudaEmulation, TinyPresetKernelsBf16) {
  comparePreset({{"training.precision=\"bf16\""}}, 29);
}

// --apply-layernorm-1p's row kernels (the norm applies 1 + w), LayerNorm and
// the Llama-style RMSNorm with SwiGLU and RoPE.
TEST(CudaEmulation, TinyPresetKernelsLayerNorm1p) {
  comparePreset({{"model.apply_layernorm_1p=true"}}, 31);
  comparePreset({{"model.apply_layernorm_1p=true"},
                 {"model.normalization=\"RMSNorm\""},
                 {"model.swiglu=true"},
                 {"model.position_embedding_type=\"rope\""},
                 {"model.use_rope_scaling=true"},
                 {"training.precision=\"bf16\""}},
                37);
}

} // namespace
