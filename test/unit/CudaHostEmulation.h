// Host emulation of the CUDA C that generated kernels use, so tests run them
// numerically on a machine without a GPU. test/unit/CudaHostKernel.cpp
// force-includes this header before a generated source and compiles it as
// host C++17 into a shared object; each object carries its own copy of the
// scheduler below (everything here is inline and hidden).
//
// Execution model. Blocks run one after another. The threads of a block run
// as fibers (ucontext, 64 KiB stack each, a guard page below) on the calling
// OS thread and switch only at synchronisation points, so code between two
// of them runs without interleaving and atomics are plain operations.
// __CUDA_ARCH__ is not defined: a kernel's `#if defined(__CUDA_ARCH__)` PTX
// takes its `#else` branch, which calls the host hooks at the end of this
// list.
//
// Supported, exactly:
//   - Qualifiers: __global__, __device__, __host__, __forceinline__,
//     __noinline__, __launch_bounds__(...), __restrict__, __align__(n);
//     `#pragma unroll` is ignored.
//   - __shared__ at function scope becomes `static`: one copy shared by the
//     block's fibers (and kept from block to block, which kernels must not
//     rely on). `extern __shared__ T name[];` (dynamic shared memory) is
//     rewritten by CudaHostKernel.cpp into a pointer to the launch's
//     shared_bytes, 16-byte aligned and filled with 0xFF bytes before every
//     block so that reading it before writing shows.
//   - threadIdx, blockIdx, blockDim, gridDim (uint3/dim3), warpSize (32).
//   - __syncthreads(); warp collectives, full mask only (every lane of the
//     warp that exists, 0xFFFFFFFF for a whole warp): __syncwarp,
//     __shfl_sync, __shfl_xor_sync, __shfl_down_sync, __shfl_up_sync (any
//     4- or 8-byte arithmetic type, optional width), __ballot_sync,
//     __any_sync, __all_sync.
//   - Atomics (plain read-modify-write, returning the old value): atomicAdd
//     on float, double, int, unsigned, unsigned long long; atomicMax and
//     atomicMin on int and unsigned; atomicCAS and atomicExch on int,
//     unsigned and unsigned long long (atomicExch also on float).
//     __threadfence() and __threadfence_block() do nothing.
//   - Math: expf __expf exp2f logf __logf log1pf sqrtf rsqrtf tanhf erff
//     fmaxf fminf fabsf fmaf rintf powf __fdividef __frcp_rn (the <cmath>
//     functions, so host precision, not CUDA's ulp bounds) and the double
//     forms exp log log1p sqrt rsqrt tanh erf fmax fmin fabs fma rint pow;
//     INFINITY and NAN; min and max on int, unsigned, long long, unsigned
//     long long, float and double.
//   - Bits: __float_as_uint __uint_as_float __float_as_int __int_as_float
//     __double_as_longlong __longlong_as_double __umulhi __popc __popcll
//     __clz __clzll.
//   - Vectors: float2 float4 int2 int4 uint2 uint4 (CUDA's alignment) with
//     make_float2 ... make_uint4, and dim3.
//   - Host hooks for PTX, warp-collective (all lanes of the warp call them
//     together; full warps only):
//       mt_host_mma_bf16_m16n8k16 / mt_host_mma_f16_m16n8k16(d, a, b, c):
//         mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32
//         with the PTX ISA's per-lane fragments; fp32 accumulation in k
//         order starting from c; d may alias c.
//       mt_host_ldmatrix(r, count, trans, row_address):
//         ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16; lane i
//         gives row i % 8 of matrix i / 8 (16-byte aligned), lanes from
//         8 * count on are ignored.
//     cp.async needs no hook: a kernel's #else branch copies directly.
//
// Errors end the launch with one line (mt_emu::launch_kernel's result):
// threads waiting at __syncthreads while others have exited or wait at a
// warp collective; a warp collective that some lanes of the warp never
// reach (they exited or wait at __syncthreads); lanes of a warp meeting at
// different collectives; a mask other than the full one; a misaligned
// ldmatrix row. The scheduler detects the deadlock instead of hanging.
#ifndef MT_TEST_CUDA_HOST_EMULATION_H
#define MT_TEST_CUDA_HOST_EMULATION_H

#include <sys/mman.h>
#include <ucontext.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#pragma GCC visibility push(hidden)

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x = 1, unsigned y = 1, unsigned z = 1) : x(x), y(y), z(z) {}
};

struct float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

namespace mt_emu {

constexpr int kWarp = 32;
constexpr size_t kStackBytes = 64 * 1024;

enum class State { Ready, AtBarrier, AtWarp, Done };

struct Fiber {
  ucontext_t context;
  State state = State::Ready;
  uint3 thread;
  unsigned linear = 0;       // x fastest, as CUDA numbers lanes and warps
  void *warpArgs = nullptr;  // this lane's operands of the pending warp collective
  const char *warpOp = "";   // its name, to match lanes and for errors
};

// A warp collective: called once with every lane's `args` (nullptr for lanes
// that do not exist) after the whole warp has arrived.
using WarpFn = void (*)(void **args, int lanes);

struct Launch {
  ucontext_t scheduler;
  std::vector<Fiber> fibers;
  Fiber *current = nullptr;
  dim3 grid, block;
  uint3 blockIndex;
  void (*body)(void *) = nullptr;
  void *bodyArg = nullptr;
  unsigned char *dynamicShared = nullptr;
  std::string error;
  std::vector<WarpFn> warpFns; // per warp: the pending collective's function
};

inline Launch *&active() {
  static Launch *launch = nullptr;
  return launch;
}

// Ends the launch from inside a fiber: the scheduler returns `message`.
inline void fail(const std::string &message) {
  Launch &l = *active();
  if (l.error.empty())
    l.error = message;
  l.current->state = State::Done;
  swapcontext(&l.current->context, &l.scheduler);
  std::abort(); // never resumed
}

inline std::string blockName(const Launch &l) {
  return "block (" + std::to_string(l.blockIndex.x) + ", " + std::to_string(l.blockIndex.y) +
         ", " + std::to_string(l.blockIndex.z) + ")";
}

inline void fiberMain() {
  Launch &l = *active();
  l.body(l.bodyArg);
  l.current->state = State::Done;
  swapcontext(&l.current->context, &l.scheduler);
}

inline void syncThreads() {
  Launch &l = *active();
  l.current->state = State::AtBarrier;
  swapcontext(&l.current->context, &l.scheduler);
}

inline unsigned lanesOfWarp(const Launch &l, unsigned warp) {
  unsigned n = unsigned(l.fibers.size());
  return n - warp * kWarp < unsigned(kWarp) ? n - warp * kWarp : unsigned(kWarp);
}

inline unsigned fullMask(const Launch &l, unsigned warp) {
  unsigned n = lanesOfWarp(l, warp);
  return n == 32 ? 0xFFFFFFFFu : (1u << n) - 1u;
}

// Deposits this lane's operands and waits until the whole warp has; `fn`
// then computes every lane's result before any lane resumes.
inline void warpCollective(const char *name, unsigned mask, void *args, WarpFn fn) {
  Launch &l = *active();
  Fiber &f = *l.current;
  const unsigned warp = f.linear / kWarp;
  if (mask != fullMask(l, warp)) {
    char buf[32];
    snprintf(buf, sizeof buf, "0x%08X", mask);
    fail(blockName(l) + ", thread " + std::to_string(f.linear) + ": " + name + " with mask " +
         buf + ": only full-mask warp collectives are emulated");
  }
  f.warpArgs = args;
  f.warpOp = name;
  l.warpFns[warp] = fn;
  f.state = State::AtWarp;
  swapcontext(&f.context, &l.scheduler);
}

// Releases warps whose lanes all wait at a collective; returns whether any was.
inline bool releaseWarps(Launch &l) {
  bool any = false;
  const unsigned warps = unsigned((l.fibers.size() + kWarp - 1) / kWarp);
  for (unsigned w = 0; w < warps && l.error.empty(); ++w) {
    const unsigned n = lanesOfWarp(l, w);
    Fiber *lane = &l.fibers[w * kWarp];
    bool all = true;
    for (unsigned i = 0; i < n; ++i)
      all = all && lane[i].state == State::AtWarp;
    if (!all)
      continue;
    void *args[kWarp] = {};
    for (unsigned i = 0; i < n; ++i) {
      if (std::strcmp(lane[i].warpOp, lane[0].warpOp) != 0) {
        l.error = blockName(l) + ", warp " + std::to_string(w) + ": lane 0 is at " +
                  lane[0].warpOp + " but lane " + std::to_string(i) + " at " + lane[i].warpOp;
        return false;
      }
      args[i] = lane[i].warpArgs;
    }
    l.warpFns[w](args, int(n));
    for (unsigned i = 0; i < n; ++i)
      lane[i].state = State::Ready;
    any = true;
  }
  return any;
}

// Why no thread of the block can go on: one line.
inline std::string deadlock(const Launch &l) {
  size_t barrier = 0, warp = 0, done = 0;
  std::string warpDetail;
  for (const Fiber &f : l.fibers) {
    barrier += f.state == State::AtBarrier;
    done += f.state == State::Done;
    if (f.state == State::AtWarp && warp++ == 0)
      warpDetail = " (first: thread " + std::to_string(f.linear) + " at " + f.warpOp + ")";
  }
  std::string s = blockName(l) + ": divergent synchronisation: " + std::to_string(barrier) +
                  " thread(s) wait at __syncthreads, " + std::to_string(warp) +
                  " wait at a warp collective" + warpDetail + ", " + std::to_string(done) +
                  " have exited";
  if (warp)
    s += "; a warp collective needs every lane of its warp";
  else
    s += "; __syncthreads needs every thread of the block";
  return s;
}

// Runs one block to completion; "" or the error.
inline std::string runBlock(Launch &l, std::vector<char *> &stacks) {
  const size_t n = l.fibers.size();
  for (size_t t = 0; t < n; ++t) {
    Fiber &f = l.fibers[t];
    f.state = State::Ready;
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = stacks[t];
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = nullptr;
    makecontext(&f.context, fiberMain, 0);
  }
  for (;;) {
    bool ran = false;
    for (size_t t = 0; t < n; ++t) {
      Fiber &f = l.fibers[t];
      if (f.state != State::Ready)
        continue;
      l.current = &f;
      swapcontext(&l.scheduler, &f.context);
      l.current = nullptr;
      if (!l.error.empty())
        return l.error;
      ran = true;
    }
    if (ran)
      continue;
    if (releaseWarps(l))
      continue;
    if (!l.error.empty())
      return l.error;
    size_t barrier = 0, done = 0;
    for (const Fiber &f : l.fibers) {
      barrier += f.state == State::AtBarrier;
      done += f.state == State::Done;
    }
    if (done == n)
      return "";
    if (barrier == n) {
      for (Fiber &f : l.fibers)
        f.state = State::Ready;
      continue;
    }
    return deadlock(l);
  }
}

// Runs body(arg) as every thread of a grid; "" or one error line.
inline std::string runGrid(const unsigned grid[3], const unsigned block[3], unsigned sharedBytes,
                           void (*body)(void *), void *arg) {
  const uint64_t threads = uint64_t(block[0]) * block[1] * block[2];
  if (threads == 0 || threads > 1024 || grid[0] == 0 || grid[1] == 0 || grid[2] == 0)
    return "invalid launch: grid (" + std::to_string(grid[0]) + ", " + std::to_string(grid[1]) +
           ", " + std::to_string(grid[2]) + ") of blocks (" + std::to_string(block[0]) + ", " +
           std::to_string(block[1]) + ", " + std::to_string(block[2]) +
           "): a block has 1 to 1024 threads and the grid at least one block";
  if (active())
    return "a kernel launched from inside a running kernel";
  Launch l;
  l.grid = dim3(grid[0], grid[1], grid[2]);
  l.block = dim3(block[0], block[1], block[2]);
  l.body = body;
  l.bodyArg = arg;
  l.fibers.resize(threads);
  l.warpFns.resize((threads + kWarp - 1) / kWarp);
  for (unsigned z = 0, t = 0; z < block[2]; ++z)
    for (unsigned y = 0; y < block[1]; ++y)
      for (unsigned x = 0; x < block[0]; ++x, ++t)
        l.fibers[t].thread = {x, y, z}, l.fibers[t].linear = t;
  // Stacks with a PROT_NONE page below each, so an overflow faults.
  const size_t page = 4096, span = kStackBytes + page;
  char *map = static_cast<char *>(
      mmap(nullptr, span * threads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (map == MAP_FAILED)
    return "cannot map " + std::to_string(threads) + " fiber stacks";
  std::vector<char *> stacks(threads);
  for (size_t t = 0; t < threads; ++t) {
    mprotect(map + t * span, page, PROT_NONE);
    stacks[t] = map + t * span + page;
  }
  std::vector<uint4> shared((sharedBytes + 15) / 16 + 1);
  l.dynamicShared = reinterpret_cast<unsigned char *>(shared.data());
  active() = &l;
  std::string error;
  for (unsigned bz = 0; bz < grid[2] && error.empty(); ++bz)
    for (unsigned by = 0; by < grid[1] && error.empty(); ++by)
      for (unsigned bx = 0; bx < grid[0] && error.empty(); ++bx) {
        l.blockIndex = {bx, by, bz};
        std::memset(l.dynamicShared, 0xFF, shared.size() * sizeof(uint4));
        error = runBlock(l, stacks);
      }
  active() = nullptr;
  munmap(map, span * threads);
  return error;
}

// The kernel's arguments from cuLaunchKernel-style `params` (one pointer to
// each argument's value), deduced from the entry's own parameter types.
template <class... A> struct Call {
  void (*fn)(A...);
  void **params;
  template <size_t... I> void invoke(std::index_sequence<I...>) {
    fn(*static_cast<std::remove_cv_t<std::remove_reference_t<A>> *>(params[I])...);
  }
  static void run(void *self) {
    static_cast<Call *>(self)->invoke(std::index_sequence_for<A...>{});
  }
};

template <class... A>
std::string launchKernel(void (*fn)(A...), const unsigned grid[3], const unsigned block[3],
                         unsigned sharedBytes, void **params) {
  Call<A...> call{fn, params};
  return runGrid(grid, block, sharedBytes, &Call<A...>::run, &call);
}

inline unsigned char *dynamicShared() { return active()->dynamicShared; }
inline const Fiber &self() { return *active()->current; }

// ---- Warp collectives -----------------------------------------------------

struct ShuffleArgs {
  uint64_t value;
  int source; // lane to read, or -1 for the own value
  uint64_t result;
};
inline void shuffleFn(void **args, int lanes) {
  for (int i = 0; i < lanes; ++i) {
    auto *a = static_cast<ShuffleArgs *>(args[i]);
    const int s = a->source;
    a->result = s >= 0 && s < lanes ? static_cast<ShuffleArgs *>(args[s])->value : a->value;
  }
}

template <class T> T shuffle(const char *name, unsigned mask, T value, int source) {
  static_assert(std::is_arithmetic_v<T> && (sizeof(T) == 4 || sizeof(T) == 8),
                "shuffles take 4- or 8-byte arithmetic values");
  ShuffleArgs a{0, source, 0};
  std::memcpy(&a.value, &value, sizeof(T));
  warpCollective(name, mask, &a, shuffleFn);
  T r;
  std::memcpy(&r, &a.result, sizeof(T));
  return r;
}

inline int laneId() { return int(self().linear % kWarp); }

struct VoteArgs {
  int predicate;
  unsigned result;
};
inline void voteFn(void **args, int lanes) {
  unsigned ballot = 0;
  for (int i = 0; i < lanes; ++i)
    ballot |= static_cast<VoteArgs *>(args[i])->predicate ? 1u << i : 0u;
  for (int i = 0; i < lanes; ++i)
    static_cast<VoteArgs *>(args[i])->result = ballot;
}
inline unsigned ballot(const char *name, unsigned mask, int predicate) {
  VoteArgs a{predicate, 0};
  warpCollective(name, mask, &a, voteFn);
  return a.result;
}

inline void syncWarpFn(void **, int) {}

// ---- Tensor-core hooks ----------------------------------------------------

inline float bf16ToFloat(unsigned h) {
  const uint32_t u = (h & 0xFFFFu) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float f16ToFloat(unsigned h) {
  const unsigned sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  uint32_t u;
  if (e == 31)
    u = sign | 0x7F800000u | (m << 13);
  else if (e == 0) {
    float f = float(m) * 0x1p-24f;
    std::memcpy(&u, &f, 4);
    u |= sign;
  } else
    u = sign | ((e + 112u) << 23) | (m << 13);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct MmaArgs {
  float *d;
  const unsigned *a, *b;
  const float *c;
  bool bf16;
};
// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type":
// g = lane >> 2, t = lane % 4. A (16x16, row): reg 0 holds A[g][2t, 2t+1],
// reg 1 A[g+8][2t, 2t+1], reg 2 A[g][2t+8, 2t+9], reg 3 A[g+8][2t+8, 2t+9],
// the lower column in the low 16 bits. B (16x8, col): reg 0 holds
// B[2t, 2t+1][g], reg 1 B[2t+8, 2t+9][g]. C and D (16x8): c0 = [g][2t],
// c1 = [g][2t+1], c2 = [g+8][2t], c3 = [g+8][2t+1].
inline void mmaFn(void **args, int lanes) {
  float A[16][16], B[16][8], C[16][8];
  const bool bf16 = static_cast<MmaArgs *>(args[0])->bf16;
  auto cvt = [&](unsigned h) { return bf16 ? bf16ToFloat(h) : f16ToFloat(h); };
  for (int lane = 0; lane < lanes; ++lane) {
    const auto *m = static_cast<MmaArgs *>(args[lane]);
    const int g = lane >> 2, t = lane % 4;
    for (int r = 0; r < 4; ++r) {
      const int row = g + (r & 1) * 8, col = 2 * t + (r >> 1) * 8;
      A[row][col] = cvt(m->a[r] & 0xFFFFu);
      A[row][col + 1] = cvt(m->a[r] >> 16);
    }
    for (int r = 0; r < 2; ++r) {
      B[2 * t + 8 * r][g] = cvt(m->b[r] & 0xFFFFu);
      B[2 * t + 8 * r + 1][g] = cvt(m->b[r] >> 16);
    }
    for (int i = 0; i < 4; ++i)
      C[g + (i >> 1) * 8][2 * t + (i & 1)] = m->c[i];
  }
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j)
      for (int k = 0; k < 16; ++k)
        C[i][j] += A[i][k] * B[k][j]; // exact products (8- or 11-bit significands)
  for (int lane = 0; lane < lanes; ++lane) {
    auto *m = static_cast<MmaArgs *>(args[lane]);
    const int g = lane >> 2, t = lane % 4;
    for (int i = 0; i < 4; ++i)
      m->d[i] = C[g + (i >> 1) * 8][2 * t + (i & 1)];
  }
}

inline void mma(const char *name, bool bf16, float *d, const unsigned *a, const unsigned *b,
                const float *c) {
  Launch &l = *active();
  if (lanesOfWarp(l, l.current->linear / kWarp) != unsigned(kWarp))
    fail(blockName(l) + ": " + name + " in a warp of fewer than 32 threads");
  MmaArgs m{d, a, b, c, bf16};
  warpCollective(name, 0xFFFFFFFFu, &m, mmaFn);
}

struct LdmatrixArgs {
  unsigned *r;
  int count;
  bool trans;
  const unsigned short *row;
};
// PTX ISA, ldmatrix: lane l receives, in register j, elements
// (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of matrix j, or with .trans
// elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4); the first in the
// low 16 bits.
inline void ldmatrixFn(void **args, int lanes) {
  const auto *first = static_cast<LdmatrixArgs *>(args[0]);
  unsigned out[kWarp][4];
  for (int l = 0; l < lanes; ++l)
    for (int j = 0; j < first->count; ++j) {
      auto row = [&](int r) { return static_cast<LdmatrixArgs *>(args[j * 8 + r])->row; };
      const int q = l / 4, p = 2 * (l % 4);
      const unsigned lo = first->trans ? row(p)[q] : row(q)[p];
      const unsigned hi = first->trans ? row(p + 1)[q] : row(q)[p + 1];
      out[l][j] = lo | (hi << 16);
    }
  for (int l = 0; l < lanes; ++l)
    for (int j = 0; j < first->count; ++j)
      static_cast<LdmatrixArgs *>(args[l])->r[j] = out[l][j];
}

} // namespace mt_emu

#define threadIdx (::mt_emu::self().thread)
#define blockIdx (::mt_emu::active()->blockIndex)
#define blockDim (::mt_emu::active()->block)
#define gridDim (::mt_emu::active()->grid)
#define warpSize 32

inline void __syncthreads() { mt_emu::syncThreads(); }
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) {
  mt_emu::warpCollective("__syncwarp", mask, nullptr, mt_emu::syncWarpFn);
}
inline void __threadfence() {}
inline void __threadfence_block() {}

template <class T> T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const int lane = mt_emu::laneId(), base = lane / width * width;
  return mt_emu::shuffle("__shfl_sync", mask, v, base + ((src % width) + width) % width);
}
template <class T> T __shfl_xor_sync(unsigned mask, T v, int laneMask, int width = 32) {
  const int lane = mt_emu::laneId(), base = lane / width * width, s = lane ^ laneMask;
  return mt_emu::shuffle("__shfl_xor_sync", mask, v, s >= base && s < base + width ? s : -1);
}
template <class T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = mt_emu::laneId(), base = lane / width * width, s = lane + int(delta);
  return mt_emu::shuffle("__shfl_down_sync", mask, v, s < base + width ? s : -1);
}
template <class T> T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = mt_emu::laneId(), base = lane / width * width, s = lane - int(delta);
  return mt_emu::shuffle("__shfl_up_sync", mask, v, s >= base ? s : -1);
}
inline unsigned __ballot_sync(unsigned mask, int p) { return mt_emu::ballot("__ballot_sync", mask, p); }
inline int __any_sync(unsigned mask, int p) { return mt_emu::ballot("__any_sync", mask, p) != 0; }
inline int __all_sync(unsigned mask, int p) {
  return mt_emu::ballot("__all_sync", mask, p) == mask;
}

inline float atomicAdd(float *p, float v) { float o = *p; *p = o + v; return o; }
inline double atomicAdd(double *p, double v) { double o = *p; *p = o + v; return o; }
inline int atomicAdd(int *p, int v) { int o = *p; *p = int(unsigned(o) + unsigned(v)); return o; }
inline unsigned atomicAdd(unsigned *p, unsigned v) { unsigned o = *p; *p = o + v; return o; }
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
  unsigned long long o = *p; *p = o + v; return o;
}
inline int atomicMax(int *p, int v) { int o = *p; *p = o > v ? o : v; return o; }
inline unsigned atomicMax(unsigned *p, unsigned v) { unsigned o = *p; *p = o > v ? o : v; return o; }
inline int atomicMin(int *p, int v) { int o = *p; *p = o < v ? o : v; return o; }
inline unsigned atomicMin(unsigned *p, unsigned v) { unsigned o = *p; *p = o < v ? o : v; return o; }
template <class T> T atomicCAS(T *p, T compare, T v) {
  static_assert(std::is_same_v<T, int> || std::is_same_v<T, unsigned> ||
                std::is_same_v<T, unsigned long long>, "atomicCAS on int, unsigned or unsigned long long");
  T o = *p;
  if (o == compare)
    *p = v;
  return o;
}
template <class T> T atomicExch(T *p, T v) {
  static_assert(std::is_same_v<T, int> || std::is_same_v<T, unsigned> ||
                std::is_same_v<T, unsigned long long> || std::is_same_v<T, float>,
                "atomicExch on int, unsigned, unsigned long long or float");
  T o = *p;
  *p = v;
  return o;
}

inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
using std::erf;
using std::exp;
using std::fabs;
using std::fma;
using std::fmax;
using std::fmin;
using std::log;
using std::log1p;
using std::pow;
using std::rint;
using std::sqrt;
using std::tanh;

inline unsigned __float_as_uint(float x) { unsigned u; std::memcpy(&u, &x, 4); return u; }
inline float __uint_as_float(unsigned u) { float x; std::memcpy(&x, &u, 4); return x; }
inline int __float_as_int(float x) { int u; std::memcpy(&u, &x, 4); return u; }
inline float __int_as_float(int u) { float x; std::memcpy(&x, &u, 4); return x; }
inline long long __double_as_longlong(double x) { long long u; std::memcpy(&u, &x, 8); return u; }
inline double __longlong_as_double(long long u) { double x; std::memcpy(&x, &u, 8); return x; }
inline unsigned __umulhi(unsigned a, unsigned b) { return unsigned((uint64_t(a) * b) >> 32); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }

#define MT_EMU_MINMAX(T)                                                                 \
  inline T min(T a, T b) { return a < b ? a : b; }                                       \
  inline T max(T a, T b) { return a > b ? a : b; }
MT_EMU_MINMAX(int)
MT_EMU_MINMAX(unsigned)
MT_EMU_MINMAX(long long)
MT_EMU_MINMAX(unsigned long long)
#undef MT_EMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

inline void mt_host_mma_bf16_m16n8k16(float *d, const unsigned *a, const unsigned *b,
                                      const float *c) {
  mt_emu::mma("mma.m16n8k16.bf16", true, d, a, b, c);
}
inline void mt_host_mma_f16_m16n8k16(float *d, const unsigned *a, const unsigned *b,
                                     const float *c) {
  mt_emu::mma("mma.m16n8k16.f16", false, d, a, b, c);
}
inline void mt_host_ldmatrix(unsigned *r, int count, bool trans, const void *rowAddress) {
  mt_emu::Launch &l = *mt_emu::active();
  const int lane = mt_emu::laneId();
  if (count != 1 && count != 2 && count != 4)
    mt_emu::fail("ldmatrix: count " + std::to_string(count) + " is not 1, 2 or 4");
  if (mt_emu::lanesOfWarp(l, l.current->linear / mt_emu::kWarp) != unsigned(mt_emu::kWarp))
    mt_emu::fail(mt_emu::blockName(l) + ": ldmatrix in a warp of fewer than 32 threads");
  if (lane < 8 * count && reinterpret_cast<uintptr_t>(rowAddress) % 16 != 0)
    mt_emu::fail(mt_emu::blockName(l) + ", thread " + std::to_string(l.current->linear) +
                 ": ldmatrix row address is not 16-byte aligned");
  mt_emu::LdmatrixArgs a{r, count, trans, static_cast<const unsigned short *>(rowAddress)};
  // Lanes of one warp must agree on the shape: the name carries it.
  static const char *names[2][5] = {
      {"", "ldmatrix.x1", "ldmatrix.x2", "", "ldmatrix.x4"},
      {"", "ldmatrix.x1.trans", "ldmatrix.x2.trans", "", "ldmatrix.x4.trans"}};
  mt_emu::warpCollective(names[trans][count], 0xFFFFFFFFu, &a, mt_emu::ldmatrixFn);
}

#pragma GCC visibility pop

#endif // MT_TEST_CUDA_HOST_EMULATION_H
