// The shared pieces of the op kernel generators (OpKernelBuilder.h): the
// reductions every op kernel source carries, number formatting, lane widths,
// and the Builder that names, hashes and collects the launches.
#include "compiler/cuda/OpKernelBuilder.h"

#include "runtime/exec/cuda/launch_limits.h"

#include <algorithm>
#include <cstdio>

namespace mt::opk {
namespace {

// Reductions of the op kernels. Blocks are whole warps; `shared` holds 64
// values (two per warp); every thread gets the result.
constexpr const char *kOpHelpers = R"(
#define MT_NEG_INF __uint_as_float(0xFF800000u)
#define MT_NAN __uint_as_float(0x7FC00000u)
__device__ __forceinline__ float mt_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}
__device__ __forceinline__ double mt_warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}
__device__ __forceinline__ float mt_block_max(float v, float *shared) {
  v = mt_warp_max(v);
  const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < (blockDim.x >> 5) ? shared[lane] : MT_NEG_INF;
  return mt_warp_max(v);
}
__device__ __forceinline__ double mt_block_sum_d(double v, double *shared) {
  v = mt_warp_sum_d(v);
  const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < (blockDim.x >> 5) ? shared[lane] : 0.0;
  return mt_warp_sum_d(v);
}
// Two sums at once (one pair of barriers).
__device__ __forceinline__ void mt_block_sum2(float &a, float &b, float *shared) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) { a += __shfl_xor_sync(0xFFFFFFFFu, a, o); b += __shfl_xor_sync(0xFFFFFFFFu, b, o); }
  const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
  __syncthreads();
  if (lane == 0) { shared[warp] = a; shared[32 + warp] = b; }
  __syncthreads();
  a = lane < (blockDim.x >> 5) ? shared[lane] : 0.0f;
  b = lane < (blockDim.x >> 5) ? shared[32 + lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) { a += __shfl_xor_sync(0xFFFFFFFFu, a, o); b += __shfl_xor_sync(0xFFFFFFFFu, b, o); }
}
// Online softmax statistics: (m, s) becomes the max of both and the sum of
// exp(x - m) over both sets; an empty set is (-inf, 0).
__device__ __forceinline__ void mt_lse_merge(float &m, float &s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  if (mm == MT_NEG_INF) return;
  s = (m == MT_NEG_INF ? 0.0f : s * expf(m - mm)) + (m2 == MT_NEG_INF ? 0.0f : s2 * expf(m2 - mm));
  m = mm;
}
__device__ __forceinline__ void mt_block_lse(float &m, float &s, float *shared) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xFFFFFFFFu, m, o), s2 = __shfl_xor_sync(0xFFFFFFFFu, s, o);
    mt_lse_merge(m, s, m2, s2);
  }
  const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
  __syncthreads();
  if (lane == 0) { shared[warp] = m; shared[32 + warp] = s; }
  __syncthreads();
  m = lane < (blockDim.x >> 5) ? shared[lane] : MT_NEG_INF;
  s = lane < (blockDim.x >> 5) ? shared[32 + lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xFFFFFFFFu, m, o), s2 = __shfl_xor_sync(0xFFFFFFFFu, s, o);
    mt_lse_merge(m, s, m2, s2);
  }
}
// One element of any float storage type at index i.
__device__ __forceinline__ float mt_get(const float *p, mt_u64 i) { return p[i]; }
__device__ __forceinline__ float mt_get(const mt_bf16 *p, mt_u64 i) { return mt_from_bf16(p[i].bits); }
__device__ __forceinline__ float mt_get(const mt_f16 *p, mt_u64 i) { return mt_from_f16(p[i].bits); }
)";

const char *dtypeName(DType d) {
  switch (d) {
  case DType::F32: return "f32";
  case DType::BF16: return "bf16";
  case DType::F16: return "f16";
  case DType::I32: return "i32";
  case DType::I64: return "i64";
  case DType::F64: return "f64";
  }
  return "?";
}

std::string shapeText(const OpTensor &t) {
  std::string s;
  for (int64_t d : t.shape)
    s += std::to_string(d) + "x";
  return s + dtypeName(t.dtype);
}

uint32_t fnv1a32(const std::string &s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s)
    h = (h ^ c) * 16777619u;
  return h;
}

} // namespace

int bytesOf(DType d) {
  switch (d) {
  case DType::F32: case DType::I32: return 4;
  case DType::BF16: case DType::F16: return 2;
  case DType::I64: case DType::F64: return 8;
  }
  return 4;
}
const char *storage(DType d) {
  switch (d) {
  case DType::F32: return "float";
  case DType::BF16: return "mt_bf16";
  case DType::F16: return "mt_f16";
  case DType::I32: return "int";
  case DType::I64: return "long long";
  case DType::F64: return "double";
  }
  return "float";
}

std::string num(int64_t v) { return std::to_string(v) + "ll"; }
std::string flt(double v) {
  char buf[48];
  snprintf(buf, sizeof buf, "%.9g", v);
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos)
    s += ".0";
  return s + "f";
}
std::string dbl(double v) {
  char buf[48];
  snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos)
    s += ".0";
  return s;
}

std::string u64(int64_t v) { return std::to_string(uint64_t(v)) + "ull"; }

std::string fill(std::string t, const std::map<std::string, std::string> &subs) {
  for (size_t at = t.find("${"); at != std::string::npos; at = t.find("${", at)) {
    size_t end = t.find('}', at);
    std::string key = t.substr(at + 2, end - at - 2);
    auto it = subs.find(key);
    std::string value = it != subs.end() ? it->second : "@MISSING:" + key + "@";
    t.replace(at, end - at + 1, value);
    at += value.size();
  }
  return t;
}

uint32_t roundWarps(int64_t threads) {
  return uint32_t(std::min<int64_t>(1024, std::max<int64_t>(32, (threads + 31) / 32 * 32)));
}

int lanesFor(std::initializer_list<DType> types, std::initializer_list<int64_t> moduli) {
  int widest = 2;
  for (DType d : types)
    widest = std::max(widest, bytesOf(d));
  int v = 16 / widest;
  for (int64_t m : moduli)
    while (v > 1 && m % v != 0)
      v /= 2;
  return v;
}

std::string label(const OpInstruction &ins) {
  std::string s = plan::EnumNameOpcode(ins.op);
  for (const OpTensor &t : ins.in)
    s += " " + shapeText(t);
  return s;
}

RowShape rowShape(int64_t h, int v, int64_t perThread, uint32_t maxBlock) {
  const int64_t groups = std::max<int64_t>(1, (h + v - 1) / v);
  const uint32_t block = std::min(maxBlock, roundWarps((groups + perThread - 1) / perThread));
  return {v, block, int((groups + block - 1) / block)};
}

void Builder::launch(const std::string &name, const std::string &body, uint64_t grid,
                     uint32_t block, uint32_t shared, std::vector<OpArg> args,
                     std::vector<std::string> scalars, std::vector<uint64_t> streams) {
  OpLaunch l;
  std::string src = "// " + what + ": " + name + "\n" + cudaKernelPrelude() + kOpHelpers +
                    "\n" + body;
  char hash[16];
  snprintf(hash, sizeof hash, "%08x", fnv1a32(src));
  l.kernel.entry = "mt_" + name + "_" + hash;
  for (size_t at = src.find("@ENTRY@"); at != std::string::npos; at = src.find("@ENTRY@", at))
    src.replace(at, 7, l.kernel.entry);
  l.kernel.source = std::move(src);
  if (grid > 0x7FFFFFFF) {
    error = what + ": " + name + " needs " + std::to_string(grid) +
            " blocks, more than a grid holds";
    grid = 1;
  }
  l.kernel.grid[0] = uint32_t(std::max<uint64_t>(grid, 1));
  l.kernel.block[0] = block;
  l.kernel.sharedBytes = shared;
  l.kernel.scalarArgs = std::move(scalars);
  l.kernel.streams = std::move(streams);
  // Every GPU mt runs on launches it (launch_limits.h), else no GPU form.
  if (std::string e = cu::check_launch(l.kernel.entry, l.kernel.grid, l.kernel.block, shared);
      !e.empty() && error.empty())
    error = what + ": " + e;
  l.args = std::move(args);
  OpStep s;
  s.kind = OpStep::Launch;
  s.launch = out.launches.size();
  out.launches.push_back(std::move(l));
  out.steps.push_back(s);
}

void elementwise(Builder &b, const std::string &name, const std::string &params,
                 const std::string &callArgs, const std::string &body, int64_t n, int v,
                 std::vector<OpArg> args, std::vector<std::string> scalars,
                 std::vector<uint64_t> streams) {
  const int64_t threads = (n + v - 1) / v;
  const uint32_t block = uint32_t(std::min<int64_t>(256, roundWarps(threads)));
  std::string src = "template <int V> __device__ __forceinline__ void mt_body(" + params +
                    ", mt_u64 i) {\n" + body + "}\n\n";
  src += "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(block) +
         ") @ENTRY@(" + params + ") {\n";
  src += "  const mt_u64 i = ((mt_u64)blockIdx.x * blockDim.x + threadIdx.x) * " +
         std::to_string(v) + ";\n";
  if (n % v == 0)
    src += "  if (i < " + num(n) + ") mt_body<" + std::to_string(v) + ">(" + callArgs + ", i);\n";
  else
    src += "  if (i + " + std::to_string(v) + " <= " + num(n) + ") mt_body<" + std::to_string(v) +
           ">(" + callArgs + ", i);\n  else for (mt_u64 t = i; t < " + num(n) +
           "; ++t) mt_body<1>(" + callArgs + ", t);\n";
  src += "}\n";
  b.launch(name, src, uint64_t((threads + block - 1) / block), block, 0, std::move(args),
           std::move(scalars), std::move(streams));
}

std::string ptr(const OpTensor &t, const std::string &name, bool isConst) {
  return std::string(isConst ? "const " : "") + storage(t.dtype) + " *" + name;
}

} // namespace mt::opk
