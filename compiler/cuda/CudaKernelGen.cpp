// CUDA C for an mt.fused region (see CudaKernelGen.h): a fixed prelude of
// device helpers (storage conversions, 128-bit accesses, Philox, block sums)
// and the region's ops emitted as fp32 code over per-thread lanes.
//
// Numerics follow runtime/exec/cpu_kernels.h, the reference: math in fp32, each
// op's result rounded to its type (round half to even) as the CPU executor
// rounds after every instruction, and dropout masks bit-exact
// (Philox4x32-10, same key, counter and threshold).
#include "compiler/cuda/CudaKernelGen.h"

#include "dialects/mt/MtOps.h"
#include "runtime/exec/cuda/launch_limits.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cmath>
#include <cstdio>
#include <map>

using namespace mlir;

namespace mt {
namespace {

// Device helpers every kernel carries, so that a source compiles with NVRTC
// alone (no cuda_fp16.h / cuda_bf16.h, no include path).
constexpr const char *kPrelude = R"(typedef unsigned long long mt_u64;
struct mt_bf16 { unsigned short bits; };
struct mt_f16 { unsigned short bits; };
struct alignas(16) mt_w4 { unsigned w[4]; };
struct alignas(8) mt_w2 { unsigned w[2]; };

// Storage conversions, round half to even (runtime/exec/cpu_kernels.cpp's round_to_*).
// On the GPU (sm_80 and later) one cvt each: the same bits for every number
// as the bit operations below, which the emulation and older targets run (a
// NaN stays a NaN, its payload aside).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MT_CVT16 1
#else
#define MT_CVT16 0
#endif
__device__ __forceinline__ float mt_round_bf16(float x) {
#if MT_CVT16
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return __uint_as_float((unsigned)h << 16);
#else
  unsigned u = __float_as_uint(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return __uint_as_float((u | 0x00400000u) & 0xFFFF0000u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return __uint_as_float(u & 0xFFFF0000u);
#endif
}
__device__ __forceinline__ float mt_round_f16(float x) {
#if MT_CVT16
  unsigned short h;
  float y;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  asm("cvt.f32.f16 %0, %1;" : "=f"(y) : "h"(h));
  return y;
#else
  const unsigned u = __float_as_uint(x), sign = u & 0x80000000u, mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return __uint_as_float((u | 0x00400000u) & 0xFFFFE000u);
  const float a = __uint_as_float(mag);
  float r;
  if (a >= 0x1p-14f) {
    r = __uint_as_float((mag + 0x0FFFu + ((mag >> 13) & 1u)) & 0xFFFFE000u);
    if (r > 65504.0f) r = __uint_as_float(0x7F800000u);
  } else {
    r = rintf(a * 0x1p24f) * 0x1p-24f;
  }
  return __uint_as_float(__float_as_uint(r) | sign);
#endif
}
__device__ __forceinline__ float mt_from_bf16(unsigned h) { return __uint_as_float(h << 16); }
__device__ __forceinline__ unsigned mt_to_bf16(float x) { return __float_as_uint(mt_round_bf16(x)) >> 16; }
__device__ __forceinline__ float mt_from_f16(unsigned h) {
#if MT_CVT16
  float y;
  asm("cvt.f32.f16 %0, %1;" : "=f"(y) : "h"((unsigned short)h));
  return y;
#else
  const unsigned sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 31) return __uint_as_float(sign | 0x7F800000u | (m << 13));
  if (e == 0) return __uint_as_float(__float_as_uint((float)m * 0x1p-24f) | sign);
  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
#endif
}
__device__ __forceinline__ unsigned mt_to_f16(float x) {
#if MT_CVT16
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
#else
  const unsigned u = __float_as_uint(mt_round_f16(x)), sign = (u >> 16) & 0x8000u,
                 mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return sign | 0x7E00u | ((mag >> 13) & 0x3FFu);
  if (mag == 0x7F800000u) return sign | 0x7C00u;
  if (mag >= 0x38800000u) return sign | (((mag >> 23) - 112u) << 10) | ((mag >> 13) & 0x3FFu);
  return sign | (unsigned)(__uint_as_float(mag) * 0x1p24f);
#endif
}

// N 32-bit words at p, aligned to 4N bytes: N = 4 is one 128-bit access.
template <int N> __device__ __forceinline__ void mt_read(const void *p, unsigned (&w)[N]) {
  if constexpr (N == 4) { const mt_w4 t = *static_cast<const mt_w4 *>(p); for (int k = 0; k < 4; ++k) w[k] = t.w[k]; }
  else if constexpr (N == 2) { const mt_w2 t = *static_cast<const mt_w2 *>(p); w[0] = t.w[0]; w[1] = t.w[1]; }
  else { for (int k = 0; k < N; ++k) w[k] = static_cast<const unsigned *>(p)[k]; }
}
template <int N> __device__ __forceinline__ void mt_write(void *p, const unsigned (&w)[N]) {
  if constexpr (N == 4) { mt_w4 t; for (int k = 0; k < 4; ++k) t.w[k] = w[k]; *static_cast<mt_w4 *>(p) = t; }
  else if constexpr (N == 2) { mt_w2 t; t.w[0] = w[0]; t.w[1] = w[1]; *static_cast<mt_w2 *>(p) = t; }
  else { for (int k = 0; k < N; ++k) static_cast<unsigned *>(p)[k] = w[k]; }
}

// V consecutive elements from element i, as floats (i a multiple of V).
template <int V> __device__ __forceinline__ void mt_load(const float *p, mt_u64 i, float (&v)[V]) {
  if constexpr (V == 4 || V == 2) { unsigned w[V]; mt_read<V>(p + i, w); for (int l = 0; l < V; ++l) v[l] = __uint_as_float(w[l]); }
  else { for (int l = 0; l < V; ++l) v[l] = p[i + l]; }
}
template <int V> __device__ __forceinline__ void mt_load(const mt_bf16 *p, mt_u64 i, float (&v)[V]) {
  if constexpr (V == 8 || V == 4 || V == 2) {
    unsigned w[V / 2]; mt_read<V / 2>(p + i, w);
    for (int k = 0; k < V / 2; ++k) { v[2 * k] = mt_from_bf16(w[k] & 0xFFFFu); v[2 * k + 1] = mt_from_bf16(w[k] >> 16); }
  } else { for (int l = 0; l < V; ++l) v[l] = mt_from_bf16(p[i + l].bits); }
}
template <int V> __device__ __forceinline__ void mt_load(const mt_f16 *p, mt_u64 i, float (&v)[V]) {
  if constexpr (V == 8 || V == 4 || V == 2) {
    unsigned w[V / 2]; mt_read<V / 2>(p + i, w);
    for (int k = 0; k < V / 2; ++k) { v[2 * k] = mt_from_f16(w[k] & 0xFFFFu); v[2 * k + 1] = mt_from_f16(w[k] >> 16); }
  } else { for (int l = 0; l < V; ++l) v[l] = mt_from_f16(p[i + l].bits); }
}
template <int V> __device__ __forceinline__ void mt_store(float *p, mt_u64 i, const float (&v)[V]) {
  if constexpr (V == 4 || V == 2) { unsigned w[V]; for (int l = 0; l < V; ++l) w[l] = __float_as_uint(v[l]); mt_write<V>(p + i, w); }
  else { for (int l = 0; l < V; ++l) p[i + l] = v[l]; }
}
template <int V> __device__ __forceinline__ void mt_store(mt_bf16 *p, mt_u64 i, const float (&v)[V]) {
  if constexpr (V == 8 || V == 4 || V == 2) {
    unsigned w[V / 2];
    for (int k = 0; k < V / 2; ++k) w[k] = mt_to_bf16(v[2 * k]) | (mt_to_bf16(v[2 * k + 1]) << 16);
    mt_write<V / 2>(p + i, w);
  } else { for (int l = 0; l < V; ++l) p[i + l].bits = (unsigned short)mt_to_bf16(v[l]); }
}
template <int V> __device__ __forceinline__ void mt_store(mt_f16 *p, mt_u64 i, const float (&v)[V]) {
  if constexpr (V == 8 || V == 4 || V == 2) {
    unsigned w[V / 2];
    for (int k = 0; k < V / 2; ++k) w[k] = mt_to_f16(v[2 * k]) | (mt_to_f16(v[2 * k + 1]) << 16);
    mt_write<V / 2>(p + i, w);
  } else { for (int l = 0; l < V; ++l) p[i + l].bits = (unsigned short)mt_to_f16(v[l]); }
}

// Philox4x32-10 (runtime/exec/cpu_kernels.h): key {seed, stream}, counter
// {block low, block high, offset low, offset high}.
__device__ __forceinline__ void mt_philox(mt_u64 block, mt_u64 seed, mt_u64 stream, mt_u64 offset, unsigned (&out)[4]) {
  unsigned c0 = (unsigned)block, c1 = (unsigned)(block >> 32), c2 = (unsigned)offset, c3 = (unsigned)(offset >> 32);
  unsigned k0 = (unsigned)seed, k1 = (unsigned)stream;
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    const unsigned hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const unsigned hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const unsigned n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c1 = lo1; c3 = lo0; c0 = n0; c2 = n2;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}
// Dropout of lanes holding elements first .. first + V - 1 of the mask: kept
// when (word >> 8) >= threshold (= ceil(rate * 2^24)), then scaled by 1 / (1 - rate).
template <int V> __device__ __forceinline__ void mt_dropout(float (&x)[V], mt_u64 first, mt_u64 seed, mt_u64 stream, mt_u64 offset, unsigned threshold, float scale) {
  if constexpr (V % 4 == 0) { // first % 4 == 0: one Philox block per four lanes
#pragma unroll
    for (int q = 0; q < V / 4; ++q) {
      unsigned w[4]; mt_philox((first >> 2) + q, seed, stream, offset, w);
#pragma unroll
      for (int k = 0; k < 4; ++k) x[4 * q + k] = (w[k] >> 8) >= threshold ? x[4 * q + k] * scale : 0.0f;
    }
  } else {
#pragma unroll
    for (int l = 0; l < V; ++l) {
      const mt_u64 e = first + l;
      unsigned w[4]; mt_philox(e >> 2, seed, stream, offset, w);
      const unsigned word = (e & 3) == 0 ? w[0] : (e & 3) == 1 ? w[1] : (e & 3) == 2 ? w[2] : w[3];
      x[l] = (word >> 8) >= threshold ? x[l] * scale : 0.0f;
    }
  }
}

// GeLU (tanh: Megatron's approximation; erf: exact) and SiLU's sigmoid.
__device__ __forceinline__ float mt_gelu_tanh(float x) {
  return x * (0.5f * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))));
}
__device__ __forceinline__ float mt_gelu_tanh_grad(float dy, float x) {
  const float t = tanhf(0.7978845608f * (x + 0.044715f * x * x * x));
  return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x));
}
__device__ __forceinline__ float mt_gelu_erf(float x) { return x * (0.5f * (1.0f + erff(x * 0.7071067812f))); }
__device__ __forceinline__ float mt_gelu_erf_grad(float dy, float x) {
  return dy * (0.5f * (1.0f + erff(x * 0.7071067812f)) + x * 0.3989422804f * expf(-0.5f * x * x));
}
__device__ __forceinline__ float mt_sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

// Sum over the block (blockDim.x a multiple of 32, `shared` one float per
// warp); every thread gets the total.
__device__ __forceinline__ float mt_block_sum(float v, float *shared) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
  __syncthreads(); // an earlier call's readers are done with `shared`
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < (blockDim.x >> 5) ? shared[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}
)";

enum class Storage { F32, BF16, F16 };

std::optional<Storage> storageOf(Type t) {
  if (t.isF32()) return Storage::F32;
  if (t.isBF16()) return Storage::BF16;
  if (t.isF16()) return Storage::F16;
  return std::nullopt;
}

const char *storageName(Storage s) {
  return s == Storage::F32 ? "float" : s == Storage::BF16 ? "mt_bf16" : "mt_f16";
}

const char *roundFn(Storage s) {
  return s == Storage::BF16 ? "mt_round_bf16" : s == Storage::F16 ? "mt_round_f16" : "";
}

int64_t elements(Value v) { return cast<RankedTensorType>(v.getType()).getNumElements(); }
int64_t lastDim(Value v) { return cast<RankedTensorType>(v.getType()).getShape().back(); }

std::string flt(double v) { return cudaFloatLiteral(v); }

std::string num(int64_t v) { return std::to_string(v) + "ll"; }

uint32_t fnv1a32(const std::string &s) { return cudaSourceHash(s); }

// The region as the generator sees it: arguments' names, the ops' needs.
struct Region {
  Block *body = nullptr;
  std::map<const void *, std::string> argName; // block argument -> "in3"
  Operation *norm = nullptr;                   // row_reduction: the one norm
  std::vector<int64_t> moduli;                 // row lengths index maps divide by
  std::vector<DropoutOp> dropouts;             // rate > 0, in body order
  bool sharded = false;                        // a dropout maps shard indices
  int64_t tp = 1;
  int maxBytes = 2;
};

// Emits the code computing values at an element index, one fp32 array of
// V lanes per (value, index expression), each computed once per function.
class BodyEmitter {
public:
  BodyEmitter(const Region &r, std::string indent) : r(r), indent(std::move(indent)) {}

  // In mt_post: the norm's result at the function's index `i` is `y`.
  void bindNorm(const std::string &name) { normResult = name; }

  // The array holding `v` at element `idx`, or "" with `error` set.
  std::string at(Value v, const std::string &idx) {
    auto key = std::make_pair(v.getAsOpaquePointer(), idx);
    if (auto it = memo.find(key); it != memo.end())
      return it->second;
    std::string name = compute(v, idx);
    if (!name.empty())
      memo[key] = name;
    return name;
  }

  std::string code;
  std::string error;

private:
  std::string fresh() { return "v" + std::to_string(counter++); }

  void line(const std::string &s) { code += indent + s + "\n"; }

  // dst[l] = round(expr) for every lane; `expr` uses `[l]` on arrays.
  std::string lanes(Value result, const std::string &expr) {
    std::string name = fresh();
    Storage s = *storageOf(cast<RankedTensorType>(result.getType()).getElementType());
    std::string rounded = s == Storage::F32 ? expr : std::string(roundFn(s)) + "(" + expr + ")";
    line("float " + name + "[V];");
    line("#pragma unroll");
    line("for (int l = 0; l < V; ++l) " + name + "[l] = " + rounded + ";");
    return name;
  }

  std::string fail(Operation *op, const std::string &what) {
    if (error.empty())
      error = "cannot generate CUDA for '" + op->getName().getStringRef().str() + "': " + what;
    return "";
  }

  std::string compute(Value v, const std::string &idx) {
    if (auto arg = dyn_cast<BlockArgument>(v)) {
      std::string name = fresh();
      line("float " + name + "[V];");
      line("mt_load<V>(" + r.argName.at(arg.getAsOpaquePointer()) + ", " + idx + ", " + name + ");");
      return name;
    }
    Operation *op = v.getDefiningOp();
    if (op == r.norm) {
      if (normResult.empty() || idx != "i")
        return fail(op, "a row's normalised values are only read at their own positions");
      return normResult;
    }
    std::string result;
    llvm::TypeSwitch<Operation *>(op)
        .Case([&](BiasAddOp o) {
          int64_t h = elements(o.getBias());
          std::string x = at(o.getInput(), idx);
          std::string b = at(o.getBias(), "(" + idx + ") % " + num(h));
          if (!x.empty() && !b.empty())
            result = lanes(v, x + "[l] + " + b + "[l]");
        })
        .Case([&](AddOp o) {
          std::string a = at(o.getLhs(), idx), b = at(o.getRhs(), idx);
          if (!a.empty() && !b.empty())
            result = lanes(v, a + "[l] + " + b + "[l]");
        })
        .Case([&](GeluOp o) {
          std::string x = at(o.getInput(), idx);
          bool tanh = o.getApproximation() == GeluApproximation::Tanh;
          if (!x.empty())
            result = lanes(v, std::string(tanh ? "mt_gelu_tanh(" : "mt_gelu_erf(") + x + "[l])");
        })
        .Case([&](GeluGradOp o) {
          std::string dy = at(o.getGrad(), idx), x = at(o.getInput(), idx);
          bool tanh = o.getApproximation() == GeluApproximation::Tanh;
          if (!dy.empty() && !x.empty())
            result = lanes(v, std::string(tanh ? "mt_gelu_tanh_grad(" : "mt_gelu_erf_grad(") +
                                  dy + "[l], " + x + "[l])");
        })
        .Case([&](SwiGLUOp o) {
          // y[r, j] = silu(x[r, j]) * x[r, f + j] over x [.., 2f].
          int64_t f = lastDim(v);
          std::string base = "(" + idx + ") / " + num(f) + " * " + num(2 * f) + " + (" + idx +
                             ") % " + num(f);
          std::string a = at(o.getInput(), base), b = at(o.getInput(), base + " + " + num(f));
          if (!a.empty() && !b.empty())
            result = lanes(v, a + "[l] * mt_sigmoid(" + a + "[l]) * " + b + "[l]");
        })
        .Case([&](SwiGLUGradOp o) {
          // dx [.., 2f]: the first f columns are d/da, the last f d/db.
          int64_t f = lastDim(v) / 2;
          std::string row = "(" + idx + ") / " + num(2 * f), col = "(" + idx + ") % " + num(f);
          std::string a = at(o.getInput(), row + " * " + num(2 * f) + " + " + col);
          std::string b = at(o.getInput(), row + " * " + num(2 * f) + " + " + col + " + " + num(f));
          std::string g = at(o.getGrad(), row + " * " + num(f) + " + " + col);
          if (a.empty() || b.empty() || g.empty())
            return;
          std::string hi = "((" + idx + ") % " + num(2 * f) + " >= " + num(f) + ")";
          std::string sig = "mt_sigmoid(" + a + "[l])";
          result = lanes(v, hi + " ? " + g + "[l] * " + a + "[l] * " + sig + " : " + g + "[l] * " +
                                b + "[l] * " + sig + " * (1.0f + " + a + "[l] * (1.0f - " + sig +
                                "))");
        })
        .Case([&](DropoutOp o) {
          std::string x = at(o.getInput(), idx);
          if (x.empty())
            return;
          double rate = o.getRateAttr().getValueAsDouble();
          if (!(rate > 0)) { // the CPU executor copies
            result = x;
            return;
          }
          size_t k = 0;
          while (k < r.dropouts.size() && r.dropouts[k] != o)
            ++k;
          uint32_t threshold =
              rate >= 1 ? (1u << 24) : static_cast<uint32_t>(std::ceil(rate * 16777216.0));
          double scale = rate >= 1 ? 0.0 : 1.0 / (1.0 - rate);
          std::string first = idx;
          if (auto d = o.getTpShardDim(); d && int64_t(*d) >= 0 && r.tp > 1) {
            // This shard's element e is element o * len * tp + tp_rank * len + e % len
            // of the whole tensor, o = e / len (runtime's dropout_segments).
            auto shape = cast<RankedTensorType>(o.getInput().getType()).getShape();
            int64_t len = 1;
            for (size_t j = size_t(*d); j < shape.size(); ++j)
              len *= shape[j];
            first = "(" + idx + ") / " + num(len) + " * " + num(len * r.tp) + " + tp_rank * " +
                    num(len) + " + (" + idx + ") % " + num(len);
          }
          std::string name = fresh();
          line("float " + name + "[V];");
          line("#pragma unroll");
          line("for (int l = 0; l < V; ++l) " + name + "[l] = " + x + "[l];");
          line("mt_dropout<V>(" + name + ", " + first + ", *seed, stream" + std::to_string(k) +
               ", *rng_offset, " + std::to_string(threshold) + "u, " + flt(scale) + ");");
          Storage s = *storageOf(cast<RankedTensorType>(v.getType()).getElementType());
          result = s == Storage::F32 ? name : lanes(v, name + "[l]");
        })
        .Case([&](ReshapeOp o) { result = at(o.getInput(), idx); })
        .Default([&](Operation *other) {
          fail(other, "not an op of an elementwise or row_reduction kernel");
        });
    return result;
  }

  const Region &r;
  std::string indent;
  std::string normResult;
  std::map<std::pair<const void *, std::string>, std::string> memo;
  int counter = 0;
};

// Records what the generator needs before emitting: names, index moduli,
// dropout streams, the widest storage type.
std::string analyse(FusedOp fused, const CudaKernelOptions &options, Region &r) {
  r.body = &fused.getBodyBlock();
  r.tp = options.tensorParallel;
  auto note = [&](Value v) -> std::string {
    auto t = dyn_cast<RankedTensorType>(v.getType());
    if (!t || !storageOf(t.getElementType()))
      return "value of type " + std::string(t ? "" : "non-tensor ") +
             "that is not f32, bf16 or f16";
    r.maxBytes = std::max<int>(r.maxBytes, t.getElementType().isF32() ? 4 : 2);
    return "";
  };
  for (BlockArgument a : r.body->getArguments()) {
    r.argName[a.getAsOpaquePointer()] = "in" + std::to_string(a.getArgNumber());
    if (std::string e = note(a); !e.empty())
      return "input " + std::to_string(a.getArgNumber()) + " is a " + e;
  }
  for (Operation &op : r.body->without_terminator()) {
    for (Value v : op.getResults())
      if (std::string e = note(v); !e.empty())
        return "'" + op.getName().getStringRef().str() + "' gives a " + e;
    if (FusedOp::isRowReduction(&op))
      r.norm = &op;
    if (auto b = dyn_cast<BiasAddOp>(op))
      r.moduli.push_back(elements(b.getBias()));
    if (isa<SwiGLUOp>(op))
      r.moduli.push_back(lastDim(op.getResult(0)));
    if (isa<SwiGLUGradOp>(op))
      r.moduli.push_back(lastDim(op.getResult(0)) / 2);
    if (auto d = dyn_cast<DropoutOp>(op)) {
      if (!(d.getRateAttr().getValueAsDouble() > 0))
        continue;
      r.dropouts.push_back(d);
      if (auto dim = d.getTpShardDim(); dim && int64_t(*dim) >= 0 && r.tp > 1) {
        r.sharded = true;
        auto shape = cast<RankedTensorType>(d.getInput().getType()).getShape();
        int64_t len = 1;
        for (size_t j = size_t(*dim); j < shape.size(); ++j)
          len *= shape[j];
        r.moduli.push_back(len);
      }
    }
  }
  if (r.norm)
    r.moduli.push_back(lastDim(r.norm->getOperand(0)));
  return "";
}

std::string opNames(Block &body) {
  std::string s;
  for (Operation &op : body.without_terminator())
    s += (s.empty() ? "" : "+") + op.getName().stripDialect().str();
  return s;
}

std::string shapeText(Value v) { return shapeKey(v.getType()); }

} // namespace

std::optional<CudaKernel> generateCudaKernel(Operation *op, const CudaKernelOptions &options,
                                             std::string *error) {
  auto fused = dyn_cast<FusedOp>(op);
  if (!fused) {
    *error = "not an mt.fused op";
    return std::nullopt;
  }
  Region r;
  if (std::string e = analyse(fused, options, r); !e.empty()) {
    *error = "cannot generate CUDA: " + e;
    return std::nullopt;
  }
  Block &body = *r.body;
  auto yield = cast<YieldOp>(body.getTerminator());
  if (yield.getValues().empty()) {
    *error = "cannot generate CUDA: the kernel has no outputs";
    return std::nullopt;
  }
  const int64_t n = elements(yield.getValues()[0]);
  for (Value v : yield.getValues())
    if (elements(v) != n) {
      *error = "cannot generate CUDA: the kernel's outputs differ in element count";
      return std::nullopt;
    }

  // Lanes per thread: 128-bit accesses of the widest type, halved until every
  // row length an index is reduced by divides by it, so a thread's lanes are
  // contiguous in every tensor it touches (and 16-byte aligned, as the arena
  // aligns every value to 256 bytes).
  int vec = 16 / r.maxBytes;
  while (vec > 1 && llvm::any_of(r.moduli, [&](int64_t m) { return m % vec != 0; }))
    vec /= 2;

  CudaKernel k;
  k.vectorWidth = vec;
  if (!r.dropouts.empty()) {
    k.scalarArgs = {"seed", "rng_offset"};
    if (r.sharded)
      k.scalarArgs.push_back("tp_rank");
    for (DropoutOp d : r.dropouts) {
      k.scalarArgs.push_back("stream");
      k.streams.push_back(uint64_t(d.getStream()));
    }
  }

  // Parameters: inputs, outputs (pointers), then the scalars.
  std::string params, callArgs;
  auto param = [&](const std::string &decl, const std::string &name) {
    params += (params.empty() ? "" : ", ") + decl;
    callArgs += (callArgs.empty() ? "" : ", ") + name;
  };
  for (BlockArgument a : body.getArguments()) {
    Storage s = *storageOf(cast<RankedTensorType>(a.getType()).getElementType());
    std::string name = "in" + std::to_string(a.getArgNumber());
    param("const " + std::string(storageName(s)) + " *__restrict__ " + name, name);
  }
  for (auto [i, v] : llvm::enumerate(yield.getValues())) {
    Storage s = *storageOf(cast<RankedTensorType>(v.getType()).getElementType());
    std::string name = "out" + std::to_string(i);
    param(std::string(storageName(s)) + " *__restrict__ " + name, name);
  }
  size_t stream = 0;
  for (const std::string &s : k.scalarArgs) {
    std::string name = s == "stream" ? "stream" + std::to_string(stream++) : s;
    // The seed and the offset are read from the device (plan.fbs Kernel), so
    // a captured CUDA graph sees each step's values.
    const bool onDevice = s == "seed" || s == "rng_offset";
    param((onDevice ? "const mt_u64 *" : "mt_u64 ") + name, name);
  }

  std::string src = "// mt kernel: " + opNames(body) + " (" +
                    stringifyFusionKind(fused.getKind()).str() + ") over " +
                    shapeText(yield.getValues()[0]) + ", " + std::to_string(vec) +
                    " element" + (vec > 1 ? "s" : "") + " per thread\n" + kPrelude + "\n";

  auto storeOutputs = [&](BodyEmitter &e) {
    for (auto [i, v] : llvm::enumerate(yield.getValues())) {
      std::string name = e.at(v, "i");
      if (!name.empty())
        e.code += "  mt_store<V>(out" + std::to_string(i) + ", i, " + name + ");\n";
    }
  };

  if (!r.norm) {
    BodyEmitter e(r, "  ");
    storeOutputs(e);
    if (!e.error.empty()) {
      *error = e.error;
      return std::nullopt;
    }
    const int64_t threads = (n + vec - 1) / vec;
    const int64_t block = std::min<int64_t>(256, std::max<int64_t>(32, (threads + 31) / 32 * 32));
    const int64_t grid = (threads + block - 1) / block;
    if (grid > 0x7FFFFFFF) {
      *error = "cannot generate CUDA: " + std::to_string(n) + " elements need more blocks than a grid holds";
      return std::nullopt;
    }
    k.grid[0] = uint32_t(grid);
    k.block[0] = uint32_t(block);
    src += "// Lanes i .. i + V - 1 of every output.\n";
    src += "template <int V> __device__ __forceinline__ void mt_body(" + params + ", mt_u64 i) {\n" +
           e.code + "}\n\n";
    src += "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(block) +
           ") @ENTRY@(" + params + ") {\n";
    src += "  const mt_u64 i = ((mt_u64)blockIdx.x * blockDim.x + threadIdx.x) * " +
           std::to_string(vec) + ";\n";
    if (n % vec == 0) {
      src += "  if (i < " + num(n) + ") mt_body<" + std::to_string(vec) + ">(" + callArgs +
             ", i);\n";
    } else {
      src += "  if (i + " + std::to_string(vec) + " <= " + num(n) + ") {\n    mt_body<" +
             std::to_string(vec) + ">(" + callArgs + ", i);\n  } else {\n";
      src += "    for (mt_u64 t = i; t < " + num(n) + "; ++t) mt_body<1>(" + callArgs +
             ", t);\n  }\n";
    }
    src += "}\n";
  } else {
    Operation *norm = r.norm;
    const bool layerNorm = isa<LayerNormOp>(norm);
    const int64_t h = lastDim(norm->getOperand(0));
    const int64_t rows = elements(norm->getOperand(0)) / h;
    if (elements(norm->getResult(0)) != n) {
      *error = "cannot generate CUDA: a row_reduction kernel's outputs must have the norm's shape";
      return std::nullopt;
    }
    // The norm's weight (and bias) are kernel inputs read at the column.
    std::string wName, bName;
    auto argOf = [&](Value v, std::string &name) {
      auto a = dyn_cast<BlockArgument>(v);
      if (a)
        name = r.argName.at(a.getAsOpaquePointer());
      return bool(a);
    };
    if (!argOf(norm->getOperand(1), wName) ||
        (layerNorm && !argOf(norm->getOperand(2), bName))) {
      *error = "cannot generate CUDA: the norm's weight and bias must be kernel inputs";
      return std::nullopt;
    }
    double eps = layerNorm ? cast<LayerNormOp>(norm).getEpsilonAttr().getValueAsDouble()
                           : cast<RMSNormOp>(norm).getEpsilonAttr().getValueAsDouble();
    // --apply-layernorm-1p: the stored weight w is applied as 1 + w (fp32).
    const bool zeroCentered = layerNorm ? cast<LayerNormOp>(norm).getZeroCenteredGamma()
                                        : cast<RMSNormOp>(norm).getZeroCenteredGamma();

    // Outputs computed before the norm (the residual stream the norm reads)
    // are stored by mt_pre from the values it computes anyway; the rest by
    // mt_post, from the normalised row.
    DenseSet<Value> afterNorm;
    afterNorm.insert(norm->getResult(0));
    for (Operation &op : body.without_terminator())
      if (llvm::any_of(op.getOperands(), [&](Value v) { return afterNorm.contains(v); }))
        for (Value v : op.getResults())
          afterNorm.insert(v);
    BodyEmitter pre(r, "  ");
    std::string x = pre.at(norm->getOperand(0), "i");
    if (!x.empty())
      pre.code += "#pragma unroll\n  for (int l = 0; l < V; ++l) x[l] = " + x + "[l];\n";
    BodyEmitter post(r, "  ");
    post.bindNorm("y");
    for (auto [i, v] : llvm::enumerate(yield.getValues())) {
      BodyEmitter &e = afterNorm.contains(v) ? post : pre;
      std::string name = e.at(v, "i");
      if (!name.empty())
        e.code += "  mt_store<V>(out" + std::to_string(i) + ", i, " + name + ");\n";
    }
    for (BodyEmitter *e : {&pre, &post})
      if (!e->error.empty()) {
        *error = e->error;
        return std::nullopt;
      }

    // Threads per row: about four groups of V lanes each, a whole number
    // of warps, at most 1024; the row stays in registers.
    const int64_t groups = h / vec;
    const int64_t threads =
        std::min<int64_t>(1024, std::max<int64_t>(32, ((groups + 3) / 4 + 31) / 32 * 32));
    const int64_t per = (groups + threads - 1) / threads;
    if (rows > 0x7FFFFFFF) {
      *error = "cannot generate CUDA: " + std::to_string(rows) + " rows need more blocks than a grid holds";
      return std::nullopt;
    }
    k.grid[0] = uint32_t(rows);
    k.block[0] = uint32_t(threads);
    k.sharedBytes = uint32_t(threads / 32 * 4);
    Storage ys = *storageOf(cast<RankedTensorType>(norm->getResult(0).getType()).getElementType());
    std::string round = ys == Storage::F32 ? "" : roundFn(ys);

    src += "// The norm's input at lanes i .. i + V - 1 (and the outputs before the norm).\n";
    src += "template <int V> __device__ __forceinline__ void mt_pre(" + params +
           ", mt_u64 i, float (&x)[V]) {\n" + pre.code + "}\n\n";
    src += "// Everything after the norm, from its output y at lanes i .. i + V - 1.\n";
    src += "template <int V> __device__ __forceinline__ void mt_post(" + params +
           ", mt_u64 i, const float (&y)[V]) {\n" + post.code + "}\n\n";
    std::string V = std::to_string(vec), P = std::to_string(per), T = std::to_string(threads);
    src += "// One block per row of " + std::to_string(h) + "; each thread keeps " + P +
           " group" + (per > 1 ? "s" : "") + " of " + V + " in registers.\n";
    src += "extern \"C\" __global__ void __launch_bounds__(" + T + ") @ENTRY@(" + params +
           ") {\n";
    src += "  extern __shared__ float mt_shared[]; // one float per warp\n";
    src += "  const mt_u64 row = blockIdx.x;\n";
    src += "  float x[" + P + "][" + V + "];\n";
    src += "  float sum = 0.0f;\n";
    auto forGroups = [&](const std::string &stmt) {
      src += "#pragma unroll\n  for (int k = 0; k < " + P + "; ++k) {\n";
      src += "    const int g = k * " + T + " + (int)threadIdx.x;\n";
      src += "    if (g < " + std::to_string(groups) + ") {\n" + stmt + "    }\n  }\n";
    };
    if (layerNorm) {
      forGroups("      mt_pre<" + V + ">(" + callArgs + ", row * " + num(h) + " + g * " + V +
                ", x[k]);\n#pragma unroll\n      for (int l = 0; l < " + V +
                "; ++l) sum += x[k][l];\n");
      src += "  const float mean = mt_block_sum(sum, mt_shared) / " + flt(double(h)) + ";\n";
      src += "  float sq = 0.0f; // two passes over registers: no E[x^2] - E[x]^2 cancellation\n";
      forGroups("#pragma unroll\n      for (int l = 0; l < " + V +
                "; ++l) sq += (x[k][l] - mean) * (x[k][l] - mean);\n");
    } else {
      forGroups("      mt_pre<" + V + ">(" + callArgs + ", row * " + num(h) + " + g * " + V +
                ", x[k]);\n#pragma unroll\n      for (int l = 0; l < " + V +
                "; ++l) sum += x[k][l] * x[k][l];\n");
      src += "  const float mean = 0.0f;\n  const float sq = sum;\n";
    }
    src += "  const float rstd = 1.0f / sqrtf(mt_block_sum(sq, mt_shared) / " + flt(double(h)) +
           " + " + flt(eps) + ");\n";
    std::string yExpr = std::string("(x[k][l] - mean) * rstd * ") +
                        (zeroCentered ? "(1.0f + w[l])" : "w[l]") + (layerNorm ? " + b[l]" : "");
    if (!round.empty())
      yExpr = round + "(" + yExpr + ")";
    forGroups("      float w[" + V + "], y[" + V + "];\n      mt_load<" + V + ">(" + wName +
              ", (mt_u64)g * " + V + ", w);\n" +
              (layerNorm ? "      float b[" + V + "];\n      mt_load<" + V + ">(" + bName +
                               ", (mt_u64)g * " + V + ", b);\n"
                         : std::string()) +
              "#pragma unroll\n      for (int l = 0; l < " + V + "; ++l) y[l] = " + yExpr +
              ";\n      mt_post<" + V + ">(" + callArgs + ", row * " + num(h) + " + g * " + V +
              ", y);\n");
    src += "}\n";
  }

  // The entry is named after the ops and the source, so identical kernels
  // (every layer's dropout+add) share one source and one compiled binary.
  char hash[16];
  snprintf(hash, sizeof hash, "%08x", fnv1a32(src));
  std::string entry = "mt_";
  for (Operation &o : body.without_terminator())
    entry += o.getName().stripDialect().str() + "_";
  entry += hash;
  size_t at = src.find("@ENTRY@");
  src.replace(at, 7, entry);
  k.entry = entry;
  k.source = std::move(src);
  // Every GPU mt runs on launches it (launch_limits.h).
  if (std::string e = cu::check_launch(k.entry, k.grid, k.block, k.sharedBytes); !e.empty()) {
    *error = "cannot generate CUDA: " + e;
    return std::nullopt;
  }
  return k;
}

const char *cudaKernelPrelude() { return kPrelude; }

std::string cudaFloatLiteral(double v) {
  char buf[48];
  snprintf(buf, sizeof buf, "%.9gf", v);
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos && s.find("inf") == std::string::npos)
    s.insert(s.size() - 1, ".0");
  return s;
}

uint32_t cudaSourceHash(const std::string &source) {
  uint32_t h = 2166136261u; // FNV-1a
  for (unsigned char c : source)
    h = (h ^ c) * 16777619u;
  return h;
}

std::string shapeKey(mlir::Type type) {
  auto t = mlir::cast<mlir::RankedTensorType>(type);
  std::string s;
  for (int64_t d : t.getShape())
    s += std::to_string(d) + "x";
  std::string ty;
  llvm::raw_string_ostream os(ty);
  os << t.getElementType();
  return s + os.str();
}

} // namespace mt
