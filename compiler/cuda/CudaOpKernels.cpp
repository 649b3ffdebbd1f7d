// CUDA C for plan instructions outside fused regions (see CudaOpKernels.h):
// each kernel is a fixed body specialised by constants (shapes, dtypes,
// floats), after CudaKernelGen's prelude and the reductions below.
#include "compiler/cuda/CudaOpKernels.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

namespace mt {
namespace {

using plan::DType;
using plan::Opcode;

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

int bytesOf(DType d) {
  switch (d) {
  case DType::F32: case DType::I32: return 4;
  case DType::BF16: case DType::F16: return 2;
  case DType::I64: return 8;
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
  }
  return "float";
}
const char *dtypeName(DType d) {
  switch (d) {
  case DType::F32: return "f32";
  case DType::BF16: return "bf16";
  case DType::F16: return "f16";
  case DType::I32: return "i32";
  case DType::I64: return "i64";
  }
  return "?";
}

std::string num(int64_t v) { return std::to_string(v) + "ll"; }
// Exact to float (f) or double precision.
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

// Replaces every ${KEY} of `t`.
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

// Elements per access: 16 bytes of the widest storage type, halved until
// it divides every row length an index is reduced by.
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

// Collects launches, collectives and workspace of one instruction.
class Builder {
public:
  explicit Builder(std::string what) : what(std::move(what)) {}

  uint64_t alloc(uint64_t bytes) {
    uint64_t at = ws;
    ws += (bytes + 255) / 256 * 256;
    return at;
  }

  // `body` holds @ENTRY@ where the entry's name goes: mt_<name>_<hash>.
  void launch(const std::string &name, const std::string &body, uint64_t grid, uint32_t block,
              uint32_t shared, std::vector<OpArg> args, std::vector<std::string> scalars = {},
              std::vector<uint64_t> streams = {}) {
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
    l.args = std::move(args);
    OpStep s;
    s.kind = OpStep::Launch;
    s.launch = out.launches.size();
    out.launches.push_back(std::move(l));
    out.steps.push_back(s);
  }

  void native(std::vector<OpArg> args) {
    OpStep s;
    s.kind = OpStep::Native;
    s.args = std::move(args);
    out.steps.push_back(s);
  }

  void collective(OpStep::Kind kind, int64_t group, uint64_t offset, uint64_t count,
                  OpStep::Type type) {
    OpStep s;
    s.kind = kind;
    s.group = group;
    s.offset = offset;
    s.count = count;
    s.type = type;
    out.steps.push_back(s);
  }

  std::optional<OpKernels> finish(std::string *err) {
    if (!error.empty()) {
      *err = error;
      return std::nullopt;
    }
    out.workspaceBytes = ws;
    return std::move(out);
  }

  std::string what, error;
  OpKernels out;
  uint64_t ws = 0;
};

OpArg in(uint64_t k) { return {OpArg::In, k}; }
OpArg outp(uint64_t k) { return {OpArg::Out, k}; }
OpArg grad(uint64_t k) { return {OpArg::ParamGrad, k}; }
OpArg wsAt(uint64_t o) { return {OpArg::Workspace, o}; }
OpArg state() { return {OpArg::State, 0}; }

// ---------------------------------------------------------------------------
// Elementwise ops and copies: one thread per V consecutive outputs.

// The elementwise kernel: mt_body<V>(params..., i) for lanes i .. i + V - 1,
// a scalar tail when V does not divide the count.
void elementwise(Builder &b, const std::string &name, const std::string &params,
                 const std::string &callArgs, const std::string &body, int64_t n, int v,
                 std::vector<OpArg> args, std::vector<std::string> scalars = {},
                 std::vector<uint64_t> streams = {}) {
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

bool genElementwise(const OpInstruction &ins, Builder &b) {
  const OpTensor &y = ins.out[0];
  const int64_t n = y.elements();
  switch (ins.op) {
  case Opcode::ADD: {
    int v = lanesFor({ins.in[0].dtype, ins.in[1].dtype, y.dtype}, {});
    elementwise(b, "add", ptr(ins.in[0], "a", true) + ", " + ptr(ins.in[1], "b", true) + ", " +
                              ptr(y, "y", false),
                "a, b, y",
                "  float x[V], z[V];\n  mt_load<V>(a, i, x);\n  mt_load<V>(b, i, z);\n"
                "  for (int l = 0; l < V; ++l) x[l] += z[l];\n  mt_store<V>(y, i, x);\n",
                n, v, {in(0), in(1), outp(0)});
    return true;
  }
  case Opcode::BIAS_ADD: {
    const int64_t h = ins.in[0].shape.back();
    int v = lanesFor({ins.in[0].dtype, ins.in[1].dtype, y.dtype}, {h});
    elementwise(b, "bias_add",
                ptr(ins.in[0], "x", true) + ", " + ptr(ins.in[1], "bias", true) + ", " +
                    ptr(y, "y", false),
                "x, bias, y",
                "  float a[V], c[V];\n  mt_load<V>(x, i, a);\n  mt_load<V>(bias, i % " + num(h) +
                    ", c);\n  for (int l = 0; l < V; ++l) a[l] += c[l];\n  mt_store<V>(y, i, a);\n",
                n, v, {in(0), in(1), outp(0)});
    return true;
  }
  case Opcode::GELU: {
    int v = lanesFor({ins.in[0].dtype, y.dtype}, {});
    std::string fn = ins.ints.at(0) ? "mt_gelu_tanh" : "mt_gelu_erf";
    elementwise(b, ins.ints.at(0) ? "gelu_tanh" : "gelu_erf",
                ptr(ins.in[0], "x", true) + ", " + ptr(y, "y", false), "x, y",
                "  float a[V];\n  mt_load<V>(x, i, a);\n  for (int l = 0; l < V; ++l) a[l] = " +
                    fn + "(a[l]);\n  mt_store<V>(y, i, a);\n",
                n, v, {in(0), outp(0)});
    return true;
  }
  case Opcode::GELU_GRAD: {
    int v = lanesFor({ins.in[0].dtype, ins.in[1].dtype, y.dtype}, {});
    std::string fn = ins.ints.at(0) ? "mt_gelu_tanh_grad" : "mt_gelu_erf_grad";
    elementwise(b, ins.ints.at(0) ? "gelu_tanh_grad" : "gelu_erf_grad",
                ptr(ins.in[0], "dy", true) + ", " + ptr(ins.in[1], "x", true) + ", " +
                    ptr(y, "dx", false),
                "dy, x, dx",
                "  float g[V], a[V];\n  mt_load<V>(dy, i, g);\n  mt_load<V>(x, i, a);\n"
                "  for (int l = 0; l < V; ++l) a[l] = " + fn + "(g[l], a[l]);\n"
                "  mt_store<V>(dx, i, a);\n",
                n, v, {in(0), in(1), outp(0)});
    return true;
  }
  case Opcode::SWIGLU: {
    const int64_t f = y.shape.back();
    int v = lanesFor({ins.in[0].dtype, y.dtype}, {f});
    elementwise(b, "swiglu", ptr(ins.in[0], "x", true) + ", " + ptr(y, "y", false), "x, y",
                "  const mt_u64 at = (i / " + num(f) + ") * " + num(2 * f) + " + i % " + num(f) +
                    ";\n  float a[V], c[V];\n  mt_load<V>(x, at, a);\n  mt_load<V>(x, at + " +
                    num(f) + ", c);\n"
                    "  for (int l = 0; l < V; ++l) a[l] = a[l] * mt_sigmoid(a[l]) * c[l];\n"
                    "  mt_store<V>(y, i, a);\n",
                n, v, {in(0), outp(0)});
    return true;
  }
  case Opcode::SWIGLU_GRAD: {
    const int64_t f = ins.in[0].shape.back();
    int v = lanesFor({ins.in[0].dtype, ins.in[1].dtype, y.dtype}, {f});
    // Lanes lie in one half of a row: da for the first f, db for the second.
    elementwise(b, "swiglu_grad",
                ptr(ins.in[0], "dy", true) + ", " + ptr(ins.in[1], "x", true) + ", " +
                    ptr(y, "dx", false),
                "dy, x, dx",
                "  const mt_u64 row = i / " + num(2 * f) + ", j = i % " + num(2 * f) +
                    ", k = j % " + num(f) + ";\n"
                    "  float g[V], a[V], c[V];\n  mt_load<V>(dy, row * " + num(f) +
                    " + k, g);\n  mt_load<V>(x, row * " + num(2 * f) + " + k, a);\n"
                    "  mt_load<V>(x, row * " + num(2 * f) + " + k + " + num(f) + ", c);\n"
                    "  for (int l = 0; l < V; ++l) {\n"
                    "    const float s = mt_sigmoid(a[l]);\n"
                    "    a[l] = j < " + num(f) + " ? g[l] * c[l] * s * (1.0f + a[l] * (1.0f - s)) : g[l] * a[l] * s;\n"
                    "  }\n  mt_store<V>(dx, i, a);\n",
                n, v, {in(0), in(1), outp(0)});
    return true;
  }
  case Opcode::DROPOUT: {
    const double rate = ins.floats.at(0);
    const int64_t stream = ins.ints.at(0), dim = ins.ints.at(1);
    const OpTensor &x = ins.in[0];
    // A tensor-parallel shard along `dim`: outer segments of len elements,
    // segment o being elements o * len * tp + len * tp_rank + j of the whole tensor.
    int64_t len = n;
    const bool sharded = dim >= 0 && ins.tensorParallel > 1 && rate > 0;
    if (sharded) {
      len = 1;
      for (size_t k = size_t(dim); k < x.shape.size(); ++k)
        len *= x.shape[k];
    }
    int v = lanesFor({x.dtype, y.dtype}, {sharded ? len : 1});
    if (!(rate > 0)) {
      elementwise(b, "dropout_copy", ptr(x, "x", true) + ", " + ptr(y, "y", false), "x, y",
                  "  float a[V];\n  mt_load<V>(x, i, a);\n  mt_store<V>(y, i, a);\n", n, v,
                  {in(0), outp(0)});
      return true;
    }
    const uint32_t threshold =
        rate >= 1 ? (1u << 24) : uint32_t(std::ceil(rate * 16777216.0));
    const double scale = rate >= 1 ? 0.0 : 1.0 / (1.0 - rate);
    std::string params = ptr(x, "x", true) + ", " + ptr(y, "y", false) +
                         ", const mt_u64 *seed, const mt_u64 *rng_offset";
    std::string call = "x, y, seed, rng_offset";
    std::vector<std::string> scalars = {"seed", "rng_offset"};
    std::string first = "i";
    if (sharded) {
      params += ", mt_u64 tp_rank";
      call += ", tp_rank";
      scalars.push_back("tp_rank");
      first = "(i / " + num(len) + ") * " + num(len * ins.tensorParallel) + " + " + num(len) +
              " * tp_rank + i % " + num(len);
    }
    params += ", mt_u64 stream";
    call += ", stream";
    scalars.push_back("stream");
    elementwise(b, sharded ? "dropout_shard" : "dropout", params, call,
                "  float a[V];\n  mt_load<V>(x, i, a);\n  mt_dropout<V>(a, " + first +
                    ", *seed, stream, *rng_offset, " + std::to_string(threshold) + "u, " +
                    flt(scale) + ");\n  mt_store<V>(y, i, a);\n",
                n, v, {in(0), outp(0)}, scalars, {uint64_t(stream)});
    return true;
  }
  case Opcode::RESHAPE: {
    if (ins.outAliasesIn0)
      return true; // a view: nothing to copy
    // A byte copy in the widest unit the size allows.
    const int64_t bytes = ins.in[0].elements() * bytesOf(ins.in[0].dtype);
    const int unit = bytes % 16 == 0 ? 16 : bytes % 4 == 0 ? 4 : bytes % 2 == 0 ? 2 : 1;
    const char *type = unit == 16 ? "mt_w4" : unit == 4 ? "unsigned" : unit == 2 ? "unsigned short" : "unsigned char";
    const int64_t units = bytes / unit;
    const uint32_t block = uint32_t(std::min<int64_t>(256, roundWarps(units)));
    std::string src = "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(block) +
                      ") @ENTRY@(const void *x, void *y) {\n"
                      "  const mt_u64 i = (mt_u64)blockIdx.x * blockDim.x + threadIdx.x;\n"
                      "  if (i < " + num(units) + ") static_cast<" + type + " *>(y)[i] = static_cast<const " +
                      type + " *>(x)[i];\n}\n";
    b.launch("copy", src, uint64_t((units + block - 1) / block), block, 0, {in(0), outp(0)});
    return true;
  }
  case Opcode::POSITION_IDS: {
    const int64_t seq = y.shape.back();
    const uint32_t block = uint32_t(std::min<int64_t>(256, roundWarps(n)));
    std::string src = "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(block) +
                      ") @ENTRY@(int *ids) {\n"
                      "  const mt_u64 i = (mt_u64)blockIdx.x * blockDim.x + threadIdx.x;\n"
                      "  if (i < " + num(n) + ") ids[i] = (int)(i % " + num(seq) + ");\n}\n";
    b.launch("position_ids", src, uint64_t((n + block - 1) / block), block, 0, {outp(0)});
    return true;
  }
  default:
    return false;
  }
}

// SPLIT_QKV and its gradient: Megatron's per-group layout [q heads, k, v]
// of d each; one thread per V elements of the qkv row (V divides d).
void genSplitQkv(const OpInstruction &ins, Builder &b, bool grad) {
  const OpTensor &qkv = grad ? ins.out[0] : ins.in[0];
  const OpTensor &q = grad ? ins.in[0] : ins.out[0];
  const OpTensor &k = grad ? ins.in[1] : ins.out[1];
  const OpTensor &vv = grad ? ins.in[2] : ins.out[2];
  const int64_t heads = q.shape[q.shape.size() - 2], d = q.shape.back();
  const int64_t groups = k.shape[k.shape.size() - 2], pg = heads / groups;
  const int64_t n = qkv.elements();
  const int v = lanesFor({qkv.dtype, q.dtype, k.dtype, vv.dtype}, {d});
  const std::string W = num(groups * (pg + 2) * d), GW = num((pg + 2) * d), D = num(d);
  std::string index =
      "  const mt_u64 row = i / " + W + ", r = i % " + W + ", g = r / " + GW + ", s = (r % " + GW +
      ") / " + D + ", e = r % " + D + ";\n  float a[V];\n";
  std::string qAt = "(row * " + num(heads) + " + g * " + num(pg) + " + s) * " + D + " + e";
  std::string kAt = "(row * " + num(groups) + " + g) * " + D + " + e";
  std::string body;
  if (!grad)
    body = index + "  mt_load<V>(qkv, i, a);\n  if (s < " + num(pg) + ") mt_store<V>(q, " + qAt +
           ", a);\n  else if (s == " + num(pg) + ") mt_store<V>(k, " + kAt +
           ", a);\n  else mt_store<V>(v, " + kAt + ", a);\n";
  else
    body = index + "  if (s < " + num(pg) + ") mt_load<V>(q, " + qAt + ", a);\n  else if (s == " +
           num(pg) + ") mt_load<V>(k, " + kAt + ", a);\n  else mt_load<V>(v, " + kAt +
           ", a);\n  mt_store<V>(qkv, i, a);\n";
  std::string params = grad ? ptr(q, "q", true) + ", " + ptr(k, "k", true) + ", " +
                                  ptr(vv, "v", true) + ", " + ptr(qkv, "qkv", false)
                            : ptr(qkv, "qkv", true) + ", " + ptr(q, "q", false) + ", " +
                                  ptr(k, "k", false) + ", " + ptr(vv, "v", false);
  std::string call = grad ? "q, k, v, qkv" : "qkv, q, k, v";
  std::vector<OpArg> args = grad ? std::vector<OpArg>{in(0), in(1), in(2), outp(0)}
                                 : std::vector<OpArg>{in(0), outp(0), outp(1), outp(2)};
  elementwise(b, grad ? "split_qkv_grad" : "split_qkv", params, call, body, n, v, args);
}

// RoPE's rotation of V pairs: a[l] = x[j0 + l], c[l] = x[j0 + l + d/2] at
// position p, angle p * base^(-2 (j0 + l) / d) (negated for the gradient),
// in double like the CPU. Shared by ROPE and the split that rotates.
constexpr const char *kRotatePairs = R"(#pragma unroll
  for (int l = 0; l < ${V}; ++l) {
    const double inv = pow(${BASE}, -2.0 * (double)(j0 + l) / ${DD});
    const double angle = ${SIGN} * p * inv, sn = sin(angle), cs = cos(angle);
    const double x1 = a[l], x2 = c[l];
    a[l] = (float)(x1 * cs - x2 * sn);
    c[l] = (float)(x2 * cs + x1 * sn);
  }
)";

// ROPE and ROPE_GRAD on [b, s, heads, d]: one thread per V pairs (x[j],
// x[j + d/2]) of one head; angle and rotation in double like the CPU. An odd
// d's last element is copied by one more group per head.
void genRope(const OpInstruction &ins, Builder &b, bool grad) {
  const OpTensor &x = ins.in[0], &y = ins.out[0];
  const int64_t seq = x.shape[1], heads = x.shape[2], d = x.shape[3], half = d / 2;
  const int64_t rows = x.shape[0] * seq * heads;
  const int v = lanesFor({x.dtype, y.dtype}, {d, std::max<int64_t>(half, 1)});
  const int64_t groups = half / v + (d % 2), threads = rows * groups;
  const uint32_t block = uint32_t(std::min<int64_t>(256, roundWarps(threads)));
  std::map<std::string, std::string> s = {
      {"TX", storage(x.dtype)}, {"TY", storage(y.dtype)}, {"V", std::to_string(v)},
      {"B", std::to_string(block)}, {"GROUPS", num(groups)}, {"THREADS", num(threads)},
      {"HEADS", num(heads)}, {"SEQ", num(seq)}, {"D", num(d)}, {"HALF", num(half)},
      {"DD", dbl(double(d))}, {"BASE", dbl(ins.floats.at(0))}, {"SIGN", grad ? "-1.0" : "1.0"}};
  std::string src = fill(R"(extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TX} *x, ${TY} *y) {
  const mt_u64 t = (mt_u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= ${THREADS}) return;
  const mt_u64 rh = t / ${GROUPS}, j0 = (t % ${GROUPS}) * ${V};
  const mt_u64 at = rh * ${D};
  if (j0 >= ${HALF}) { // odd d: the last element is not rotated
    float a[1]; mt_load<1>(x, at + ${D} - 1, a); mt_store<1>(y, at + ${D} - 1, a);
    return;
  }
  const double p = (double)((rh / ${HEADS}) % ${SEQ});
  float a[${V}], c[${V}];
  mt_load<${V}>(x, at + j0, a);
  mt_load<${V}>(x, at + j0 + ${HALF}, c);
)" + std::string(kRotatePairs) + R"(  mt_store<${V}>(y, at + j0, a);
  mt_store<${V}>(y, at + j0 + ${HALF}, c);
}
)",
                         s);
  b.launch(grad ? "rope_grad" : "rope", src, uint64_t((threads + block - 1) / block), block, 0,
           {in(0), outp(0)});
}

// SPLIT_QKV_ROPE and its gradient: the split with ROPE's rotation (and
// ROPE_GRAD's) of the query and key heads, so the unrotated q and k are never
// stored. One thread per V pairs (x[j], x[j + d/2]) of one head slot of the
// qkv row (V divides d/2, so both halves are aligned V-lane accesses); value
// slots are copied. Angles and rotation in double, as genRope.
void genSplitQkvRope(const OpInstruction &ins, Builder &b, bool grad) {
  const OpTensor &qkv = grad ? ins.out[0] : ins.in[0];
  const OpTensor &q = grad ? ins.in[0] : ins.out[0];
  const OpTensor &k = grad ? ins.in[1] : ins.out[1];
  const OpTensor &vv = grad ? ins.in[2] : ins.out[2];
  const int64_t seq = q.shape[1], heads = q.shape[2], d = q.shape[3], half = d / 2;
  const int64_t groups = k.shape[2], pg = heads / groups, slots = groups * (pg + 2);
  const int64_t rows = q.shape[0] * seq;
  const int v = lanesFor({qkv.dtype, q.dtype, k.dtype, vv.dtype}, {half});
  const int64_t pairs = half / v, threads = rows * slots * pairs;
  const uint32_t block = uint32_t(std::min<int64_t>(256, roundWarps(threads)));
  std::map<std::string, std::string> s = {
      {"B", std::to_string(block)}, {"V", std::to_string(v)}, {"THREADS", num(threads)},
      {"PAIRS", num(pairs)}, {"SLOTS", num(slots)}, {"PG", num(pg)},
      {"HEADS", num(heads)}, {"GROUPS", num(groups)}, {"SEQ", num(seq)}, {"D", num(d)},
      {"HALF", num(half)}, {"DD", dbl(double(d))}, {"BASE", dbl(ins.floats.at(0))},
      {"SIGN", grad ? "-1.0" : "1.0"}};
  // Where slot `s` of group `g` of row `row` lives in q, k or v.
  std::string where = R"(  const mt_u64 row = hs / ${SLOTS}, r = hs % ${SLOTS};
  const mt_u64 g = r / (${PG} + 2), s = r % (${PG} + 2);
  const mt_u64 at = hs * ${D} + j0;
  const mt_u64 kv = (row * ${GROUPS} + g) * ${D} + j0;
  const mt_u64 qa = (row * ${HEADS} + g * ${PG} + s) * ${D} + j0;
)";
  std::string rotate = "  if (s <= ${PG}) {\n  const double p = (double)(row % ${SEQ});\n" +
                       std::string(kRotatePairs) + "  }\n";
  std::string head = "extern \"C\" __global__ void __launch_bounds__(${B}) @ENTRY@(" +
                     (grad ? ptr(q, "q", true) + ", " + ptr(k, "k", true) + ", " +
                                 ptr(vv, "v", true) + ", " + ptr(qkv, "qkv", false)
                           : ptr(qkv, "qkv", true) + ", " + ptr(q, "q", false) + ", " +
                                 ptr(k, "k", false) + ", " + ptr(vv, "v", false)) +
                     R"() {
  const mt_u64 t = (mt_u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= ${THREADS}) return;
  const mt_u64 hs = t / ${PAIRS}, j0 = (t % ${PAIRS}) * ${V};
)" + where + "  float a[${V}], c[${V}];\n";
  std::string body;
  if (!grad)
    body = R"(  mt_load<${V}>(qkv, at, a);
  mt_load<${V}>(qkv, at + ${HALF}, c);
)" + rotate + R"(  if (s < ${PG}) { mt_store<${V}>(q, qa, a); mt_store<${V}>(q, qa + ${HALF}, c); }
  else if (s == ${PG}) { mt_store<${V}>(k, kv, a); mt_store<${V}>(k, kv + ${HALF}, c); }
  else { mt_store<${V}>(v, kv, a); mt_store<${V}>(v, kv + ${HALF}, c); }
}
)";
  else
    body = R"(  if (s < ${PG}) { mt_load<${V}>(q, qa, a); mt_load<${V}>(q, qa + ${HALF}, c); }
  else if (s == ${PG}) { mt_load<${V}>(k, kv, a); mt_load<${V}>(k, kv + ${HALF}, c); }
  else { mt_load<${V}>(v, kv, a); mt_load<${V}>(v, kv + ${HALF}, c); }
)" + rotate + R"(  mt_store<${V}>(qkv, at, a);
  mt_store<${V}>(qkv, at + ${HALF}, c);
}
)";
  std::vector<OpArg> args = grad ? std::vector<OpArg>{in(0), in(1), in(2), outp(0)}
                                 : std::vector<OpArg>{in(0), outp(0), outp(1), outp(2)};
  b.launch(grad ? "split_qkv_rope_grad" : "split_qkv_rope", fill(head + body, s),
           uint64_t((threads + block - 1) / block), block, 0, args);
}

// ---------------------------------------------------------------------------
// Row kernels: norms, their gradients, column sums.

// A row of h elements over a block: V lanes per access, K accesses per
// thread (lane group k of thread t at column (k * blockDim + t) * V).
struct RowShape {
  int v;
  uint32_t block;
  int k;
};
RowShape rowShape(int64_t h, int v, int64_t perThread, uint32_t maxBlock) {
  const int64_t groups = std::max<int64_t>(1, (h + v - 1) / v);
  const uint32_t block = std::min(maxBlock, roundWarps((groups + perThread - 1) / perThread));
  return {v, block, int((groups + block - 1) / block)};
}

// Blocks of the partial column sums: enough to fill an H100 (132 SMs) a few
// times over, few enough that the second pass reads little.
int64_t partialBlocks(int64_t rows) { return std::max<int64_t>(1, std::min<int64_t>(rows, 528)); }

std::map<std::string, std::string> rowSubs(const RowShape &r, int64_t h, double eps) {
  return {{"V", std::to_string(r.v)}, {"K", std::to_string(r.k)}, {"B", std::to_string(r.block)},
          {"H", num(h)}, {"HF", flt(double(h))}, {"EPS", flt(eps)}};
}

// LAYER_NORM and RMS_NORM: one block per row, the row in registers; fp32
// statistics (the variance in a second pass over the registers).
void genNorm(const OpInstruction &ins, Builder &b, bool layer) {
  const OpTensor &x = ins.in[0], &w = ins.in[1], &y = ins.out[0];
  const int64_t h = x.shape.back(), rows = h ? x.elements() / h : 0;
  const RowShape r = rowShape(h, lanesFor({x.dtype, w.dtype, y.dtype}, {h}), 4, 1024);
  auto s = rowSubs(r, h, ins.floats.at(0));
  s["TX"] = storage(x.dtype);
  s["TW"] = storage(w.dtype);
  s["TY"] = storage(y.dtype);
  s["TB"] = layer ? storage(ins.in[2].dtype) : "float";
  s["BIAS"] = layer ? ", const ${TB} *bias" : "";
  s["STATS"] = layer ? R"(  const float mean = mt_block_sum(s, mt_shared) / ${HF};
  float q = 0.0f;
#pragma unroll
  for (int k = 0; k < ${K}; ++k)
    if (((mt_u64)k * blockDim.x + threadIdx.x) * ${V} < ${H})
      for (int l = 0; l < ${V}; ++l) { const float e = a[k][l] - mean; q += e * e; }
  const float rstd = 1.0f / sqrtf(mt_block_sum(q, mt_shared) / ${HF} + ${EPS});
)"
                     : R"(  const float mean = 0.0f;
  const float rstd = 1.0f / sqrtf(mt_block_sum(s, mt_shared) / ${HF} + ${EPS});
)";
  s["ACC"] = layer ? "s += a[k][l]" : "s += a[k][l] * a[k][l]";
  s["BLOAD"] = layer ? "mt_load<${V}>(bias, c, bv);" : "";
  s["EXPR"] = layer ? "(a[k][l] - mean) * rstd * wv[l] + bv[l]" : "a[k][l] * rstd * wv[l]";
  std::string t = R"(extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TX} *x, const ${TW} *w${BIAS}, ${TY} *y) {
  extern __shared__ float mt_shared[];
  const mt_u64 at = (mt_u64)blockIdx.x * ${H};
  float a[${K}][${V}];
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < ${K}; ++k) {
    const mt_u64 c = ((mt_u64)k * blockDim.x + threadIdx.x) * ${V};
    if (c < ${H}) { mt_load<${V}>(x, at + c, a[k]); for (int l = 0; l < ${V}; ++l) ${ACC}; }
    else for (int l = 0; l < ${V}; ++l) a[k][l] = 0.0f;
  }
${STATS}#pragma unroll
  for (int k = 0; k < ${K}; ++k) {
    const mt_u64 c = ((mt_u64)k * blockDim.x + threadIdx.x) * ${V};
    if (c >= ${H}) continue;
    float wv[${V}], bv[${V}], o[${V}];
    mt_load<${V}>(w, c, wv);
    ${BLOAD}
    for (int l = 0; l < ${V}; ++l) o[l] = ${EXPR};
    mt_store<${V}>(y, at + c, o);
  }
}
)";
  // Two rounds: the substitutions themselves hold ${...}.
  std::string src = fill(fill(t, s), s);
  std::vector<OpArg> args = {in(0), in(1)};
  if (layer)
    args.push_back(in(2));
  args.push_back(outp(0));
  b.launch(layer ? "layer_norm" : "rms_norm", src, uint64_t(rows), r.block, 256, args);
}

// Adds the columns of `arrays` blocks x h partial sums (in double, block
// order) into the f32 gradients: grad[j] = float(grad[j] + sum).
void genColSums(Builder &b, uint64_t wsAt_, int64_t blocks, int64_t h, int arrays) {
  std::map<std::string, std::string> s = {{"G", num(blocks)}, {"H", num(h)}};
  std::string src = fill(R"(extern "C" __global__ void __launch_bounds__(64) @ENTRY@(const float *ws, float *g0)",
                         s);
  if (arrays == 2)
    src += ", float *g1";
  src += fill(R"() {
  const mt_u64 j = (mt_u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= ${H}) return;
  double s = 0.0;
  for (mt_u64 b = 0; b < ${G}; ++b) s += ws[b * ${H} + j];
  g0[j] = (float)((double)g0[j] + s);
)",
              s);
  if (arrays == 2)
    src += fill(R"(  s = 0.0;
  for (mt_u64 b = 0; b < ${G}; ++b) s += ws[(${G} + b) * ${H} + j];
  g1[j] = (float)((double)g1[j] + s);
)",
                s);
  src += "}\n";
  std::vector<OpArg> args = {wsAt(wsAt_), grad(0)};
  if (arrays == 2)
    args.push_back(grad(1));
  b.launch("col_sums", src, uint64_t((h + 63) / 64), 64, 0, args);
}

// LAYER_NORM_GRAD and RMS_NORM_GRAD: blocks take rows blockIdx, blockIdx +
// gridDim, ...; each writes dx per row and keeps its dw (and db) column
// partials in registers, stored to the workspace at the end; col_sums adds
// them into the gradients.
void genNormGrad(const OpInstruction &ins, Builder &b, bool layer) {
  const OpTensor &dy = ins.in[0], &x = ins.in[1], &w = ins.in[2], &dx = ins.out[0];
  const int64_t h = x.shape.back(), rows = h ? x.elements() / h : 0;
  const RowShape r = rowShape(h, lanesFor({dy.dtype, x.dtype, w.dtype, dx.dtype}, {h}), 2, 512);
  const int64_t blocks = partialBlocks(rows);
  const int arrays = layer ? 2 : 1;
  const uint64_t ws = b.alloc(uint64_t(arrays * blocks * h) * 4);
  auto s = rowSubs(r, h, ins.floats.at(0));
  s["TDY"] = storage(dy.dtype);
  s["TX"] = storage(x.dtype);
  s["TW"] = storage(w.dtype);
  s["TDX"] = storage(dx.dtype);
  s["N"] = num(rows);
  s["G"] = num(blocks);
  s["ROW"] = layer ? R"(    const float mean = mt_block_sum(s, mt_shared) / ${HF};
    float q = 0.0f;
    for (int k = 0; k < ${K}; ++k)
      if (((mt_u64)k * blockDim.x + threadIdx.x) * ${V} < ${H})
        for (int l = 0; l < ${V}; ++l) { const float e = a[k][l] - mean; q += e * e; }
    const float rstd = 1.0f / sqrtf(mt_block_sum(q, mt_shared) / ${HF} + ${EPS});
    // dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w.
    float sg = 0.0f, sgx = 0.0f;
    for (int k = 0; k < ${K}; ++k)
      for (int l = 0; l < ${V}; ++l) {
        a[k][l] = (a[k][l] - mean) * rstd;
        const float gw = g[k][l] * wv[k][l];
        sg += gw;
        sgx += gw * a[k][l];
      }
    mt_block_sum2(sg, sgx, mt_shared);
    const float mg = sg / ${HF}, mgx = sgx / ${HF};
    for (int k = 0; k < ${K}; ++k)
      for (int l = 0; l < ${V}; ++l) {
        pw[k][l] += g[k][l] * a[k][l];
        pb[k][l] += g[k][l];
        a[k][l] = rstd * (g[k][l] * wv[k][l] - mg - a[k][l] * mgx);
      }
)"
                    : R"(    const float rstd = 1.0f / sqrtf(mt_block_sum(s, mt_shared) / ${HF} + ${EPS});
    // dx = rstd (g - x rstd^2 mean(g x)), g = dy w.
    float sgx = 0.0f;
    for (int k = 0; k < ${K}; ++k)
      for (int l = 0; l < ${V}; ++l) sgx += g[k][l] * wv[k][l] * a[k][l];
    const float mgx = mt_block_sum(sgx, mt_shared) / ${HF};
    for (int k = 0; k < ${K}; ++k)
      for (int l = 0; l < ${V}; ++l) {
        pw[k][l] += g[k][l] * a[k][l] * rstd;
        a[k][l] = rstd * (g[k][l] * wv[k][l] - a[k][l] * rstd * rstd * mgx);
      }
)";
  s["ACC"] = layer ? "s += a[k][l]" : "s += a[k][l] * a[k][l]";
  s["PB"] = layer ? "mt_store<${V}>(ws + (${G} + blockIdx.x) * ${H}, c, pb[k]);" : "";
  std::string t = R"(extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TDY} *dy, const ${TX} *x, const ${TW} *w, ${TDX} *dx, float *ws) {
  extern __shared__ float mt_shared[];
  float wv[${K}][${V}], pw[${K}][${V}], pb[${K}][${V}];
#pragma unroll
  for (int k = 0; k < ${K}; ++k) {
    const mt_u64 c = ((mt_u64)k * blockDim.x + threadIdx.x) * ${V};
    for (int l = 0; l < ${V}; ++l) { pw[k][l] = 0.0f; pb[k][l] = 0.0f; wv[k][l] = 0.0f; }
    if (c < ${H}) mt_load<${V}>(w, c, wv[k]);
  }
  for (mt_u64 row = blockIdx.x; row < ${N}; row += gridDim.x) {
    const mt_u64 at = row * ${H};
    float a[${K}][${V}], g[${K}][${V}];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < ${K}; ++k) {
      const mt_u64 c = ((mt_u64)k * blockDim.x + threadIdx.x) * ${V};
      if (c < ${H}) {
        mt_load<${V}>(x, at + c, a[k]);
        mt_load<${V}>(dy, at + c, g[k]);
        for (int l = 0; l < ${V}; ++l) ${ACC};
      } else {
        for (int l = 0; l < ${V}; ++l) { a[k][l] = 0.0f; g[k][l] = 0.0f; }
      }
    }
${ROW}#pragma unroll
    for (int k = 0; k < ${K}; ++k) {
      const mt_u64 c = ((mt_u64)k * blockDim.x + threadIdx.x) * ${V};
      if (c < ${H}) mt_store<${V}>(dx, at + c, a[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < ${K}; ++k) {
    const mt_u64 c = ((mt_u64)k * blockDim.x + threadIdx.x) * ${V};
    if (c >= ${H}) continue;
    mt_store<${V}>(ws + (mt_u64)blockIdx.x * ${H}, c, pw[k]);
    ${PB}
  }
}
)";
  std::string src = fill(fill(t, s), s);
  b.launch(layer ? "layer_norm_grad" : "rms_norm_grad", src, uint64_t(blocks), r.block, 256,
           {in(0), in(1), in(2), outp(0), wsAt(ws)});
  genColSums(b, ws, blocks, h, arrays);
}

// BIAS_GRAD: column partials of dy per block of rows, then col_sums.
void genBiasGrad(const OpInstruction &ins, Builder &b) {
  const OpTensor &dy = ins.in[0];
  const int64_t h = dy.shape.back(), rows = h ? dy.elements() / h : 0;
  const RowShape r = rowShape(h, lanesFor({dy.dtype, DType::F32}, {h}), 4, 256);
  const int64_t blocks = partialBlocks(rows);
  const uint64_t ws = b.alloc(uint64_t(blocks * h) * 4);
  auto s = rowSubs(r, h, 0);
  s["TDY"] = storage(dy.dtype);
  s["N"] = num(rows);
  std::string src = fill(R"(extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TDY} *dy, float *ws) {
  float acc[${K}][${V}];
  for (int k = 0; k < ${K}; ++k) for (int l = 0; l < ${V}; ++l) acc[k][l] = 0.0f;
  for (mt_u64 row = blockIdx.x; row < ${N}; row += gridDim.x)
#pragma unroll
    for (int k = 0; k < ${K}; ++k) {
      const mt_u64 c = ((mt_u64)k * blockDim.x + threadIdx.x) * ${V};
      if (c >= ${H}) continue;
      float g[${V}];
      mt_load<${V}>(dy, row * ${H} + c, g);
      for (int l = 0; l < ${V}; ++l) acc[k][l] += g[l];
    }
#pragma unroll
  for (int k = 0; k < ${K}; ++k) {
    const mt_u64 c = ((mt_u64)k * blockDim.x + threadIdx.x) * ${V};
    if (c < ${H}) mt_store<${V}>(ws + (mt_u64)blockIdx.x * ${H}, c, acc[k]);
  }
}
)",
                         s);
  b.launch("bias_partials", src, uint64_t(blocks), r.block, 0, {in(0), wsAt(ws)});
  genColSums(b, ws, blocks, h, 1);
}

// ---------------------------------------------------------------------------
// Embeddings.

void genEmbedding(const OpInstruction &ins, Builder &b) {
  const OpTensor &table = ins.in[0], &y = ins.out[0];
  const int64_t vocab = table.shape[0], h = table.shape[1];
  const bool vp = ins.ints.at(0) != 0;
  const int v = lanesFor({table.dtype, y.dtype}, {h});
  std::map<std::string, std::string> s = {{"H", num(h)}, {"VOCAB", num(vocab)},
                                          {"WHOLE", num(vocab * ins.tensorParallel)},
                                          {"FIRST", vp ? "(long long)tp_rank * " + num(vocab) : "0ll"}};
  // Another rank's id (vocab parallel) gives zeros; an id outside the
  // whole vocabulary gives NaN (the CPU executor stops with an error).
  std::string body = fill(R"(  const mt_u64 row = i / ${H}, c = i % ${H};
  const long long id = ids[row], local = id - ${FIRST};
  float a[V];
  if (local >= 0 && local < ${VOCAB}) mt_load<V>(table, (mt_u64)local * ${H} + c, a);
  else for (int l = 0; l < V; ++l) a[l] = id >= 0 && id < ${WHOLE} ? 0.0f : MT_NAN;
  mt_store<V>(y, i, a);
)",
                          s);
  std::string params = ptr(table, "table", true) + ", const int *ids, " + ptr(y, "y", false);
  std::string call = "table, ids, y";
  std::vector<std::string> scalars;
  if (vp) {
    params += ", mt_u64 tp_rank";
    call += ", tp_rank";
    scalars.push_back("tp_rank");
  }
  elementwise(b, vp ? "embedding_vp" : "embedding", params, call, body, y.elements(), v,
              {in(0), in(1), outp(0)}, scalars);
}

// EMBEDDING_GRAD, deterministic: emb_links gives each token the next token
// with the same (local) row and marks each row's first token; emb_accum
// walks those lists from the first tokens, adding dy rows into the f32
// gradient in token order, exactly as the CPU does. Linking compares every
// pair of tokens (n^2 / 256 shared-memory tiles; ~0.2 ms at n = 32k).
void genEmbeddingGrad(const OpInstruction &ins, Builder &b) {
  const OpTensor &dy = ins.in[0];
  const OpParam &table = ins.params.at(0);
  const int64_t vocab = table.shape[0], h = table.shape[1], n = ins.in[1].elements();
  const bool vp = ins.ints.at(0) != 0;
  const uint64_t ws = b.alloc(uint64_t(2 * n) * 4);
  std::map<std::string, std::string> s = {
      {"H", num(h)}, {"N", num(n)}, {"VOCAB", num(vocab)},
      {"TP", vp ? ", mt_u64 tp_rank" : ""},
      {"FIRST", vp ? "(long long)tp_rank * " + num(vocab) : "0ll"}};
  std::vector<std::string> scalars;
  if (vp)
    scalars.push_back("tp_rank");
  std::string links = fill(R"(extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const int *ids, int *links${TP}) {
  extern __shared__ int mt_ids[];
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long first = ${FIRST};
  const long long mine = i < ${N} ? (long long)ids[i] - first : -1;
  const bool valid = mine >= 0 && mine < ${VOCAB};
  long long next = -1;
  bool lead = valid;
  for (long long t0 = 0; t0 < ${N}; t0 += blockDim.x) {
    __syncthreads();
    if (t0 + threadIdx.x < ${N}) mt_ids[threadIdx.x] = ids[t0 + threadIdx.x];
    __syncthreads();
    const long long count = ${N} - t0 < (long long)blockDim.x ? ${N} - t0 : (long long)blockDim.x;
    if (!valid) continue;
    for (long long j = 0; j < count; ++j) {
      if ((long long)mt_ids[j] - first != mine) continue;
      const long long t = t0 + j;
      if (t < i) lead = false;
      else if (t > i && next < 0) next = t;
    }
  }
  if (i < ${N}) { links[i] = (int)next; links[${N} + i] = lead ? 1 : 0; }
}
)",
                           s);
  b.launch("emb_links", links, uint64_t((n + 255) / 256), 256, 1024, {in(1), wsAt(ws)}, scalars);

  const int v = lanesFor({dy.dtype, DType::F32}, {h});
  const int64_t perRow = h / v, threads = n * perRow;
  const uint32_t block = uint32_t(std::min<int64_t>(256, roundWarps(threads)));
  s["TDY"] = storage(dy.dtype);
  s["V"] = std::to_string(v);
  s["PER"] = num(perRow);
  s["T"] = num(threads);
  s["B"] = std::to_string(block);
  std::string accum = fill(R"(extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TDY} *dy, const int *ids, float *grad, const int *links${TP}) {
  const mt_u64 t = (mt_u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= ${T}) return;
  const long long i = (long long)(t / ${PER});
  const mt_u64 c = (t % ${PER}) * ${V};
  if (!links[${N} + i]) return;
  const mt_u64 at = (mt_u64)((long long)ids[i] - ${FIRST}) * ${H} + c;
  float acc[${V}];
  mt_load<${V}>(grad, at, acc);
  for (long long j = i; j >= 0; j = links[j]) {
    float d[${V}];
    mt_load<${V}>(dy, (mt_u64)j * ${H} + c, d);
    for (int l = 0; l < ${V}; ++l) acc[l] += d[l];
  }
  mt_store<${V}>(grad, at, acc);
}
)",
                           s);
  b.launch("emb_accum", accum, uint64_t((threads + block - 1) / block), block, 0,
           {in(0), in(1), grad(0), wsAt(ws)}, scalars);
}

// ---------------------------------------------------------------------------
// Cross-entropy: one block per row of logits.

// Each thread's online (max, sum of exp) over its lanes, then the block's.
constexpr const char *kLseScan = R"(  float m = MT_NEG_INF, s = 0.0f;
  for (mt_u64 j = (mt_u64)threadIdx.x * ${V}; j < ${VOCAB}; j += (mt_u64)blockDim.x * ${V}) {
    float a[${V}];
    mt_load<${V}>(x, j, a);
    float lm = a[0];
    for (int l = 1; l < ${V}; ++l) lm = fmaxf(lm, a[l]);
    if (lm == MT_NEG_INF) continue;
    float ls = 0.0f;
    for (int l = 0; l < ${V}; ++l) ls += expf(a[l] - lm);
    mt_lse_merge(m, s, lm, ls);
  }
  mt_block_lse(m, s, mt_shared);
)";

void genCrossEntropy(const OpInstruction &ins, Builder &b, bool gradient) {
  const OpTensor &logits = ins.in[0];
  const int64_t vocab = logits.shape.back(), n = ins.in[1].elements();
  const bool vp = ins.ints.at(0) != 0;
  DType outType = gradient ? ins.out[0].dtype : DType::F32;
  const RowShape r = rowShape(vocab, lanesFor({logits.dtype, outType}, {vocab}), 4, 512);
  std::map<std::string, std::string> s = {
      {"TX", storage(logits.dtype)}, {"TY", storage(outType)}, {"V", std::to_string(r.v)},
      {"B", std::to_string(r.block)}, {"VOCAB", num(vocab)}, {"N", num(n)},
      {"ND", dbl(double(n))}, {"WHOLE", num(vocab * ins.tensorParallel)}};
  s["SCAN"] = fill(kLseScan, s);

  if (!vp && !gradient) {
    const uint64_t rowLoss = b.alloc(uint64_t(n) * 8);
    b.launch("ce_rows", fill(R"(extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TX} *logits, const int *labels, double *row_loss) {
  extern __shared__ float mt_shared[];
  const mt_u64 row = blockIdx.x;
  const ${TX} *x = logits + row * ${VOCAB};
${SCAN}  if (threadIdx.x == 0) {
    const int label = labels[row];
    row_loss[row] = label >= 0 && label < ${VOCAB} ? (double)m + log((double)s) - (double)mt_get(x, label) : (double)MT_NAN;
  }
}
)", s), uint64_t(n), r.block, 256, {in(0), in(1), wsAt(rowLoss)});
    b.launch("ce_loss", fill(R"(extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const double *row_loss, float *loss) {
  extern __shared__ double mt_shared_d[];
  double t = 0.0;
  for (mt_u64 i = threadIdx.x; i < ${N}; i += blockDim.x) t += row_loss[i];
  t = mt_block_sum_d(t, mt_shared_d);
  if (threadIdx.x == 0) loss[0] = ${N} ? (float)(t / ${ND}) : 0.0f;
}
)", s), 1, 256, 256, {wsAt(rowLoss), outp(0)});
    return;
  }
  if (!vp) {
    // The label's logit is read before the barriers of the block reduction
    // and each element is read and then written by one thread: in place is safe.
    b.launch("ce_grad", fill(R"(extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TX} *logits, const int *labels, const float *dloss, ${TY} *dlogits) {
  extern __shared__ float mt_shared[];
  const mt_u64 row = blockIdx.x;
  const ${TX} *x = logits + row * ${VOCAB};
  ${TY} *y = dlogits + row * ${VOCAB};
  const long long label = labels[row];
  const float xl = label >= 0 && label < ${VOCAB} ? mt_get(x, label) : 0.0f;
${SCAN}  const double c = (double)dloss[0] / ${ND};
  const double f = c / (double)s;
  for (mt_u64 j = (mt_u64)threadIdx.x * ${V}; j < ${VOCAB}; j += (mt_u64)blockDim.x * ${V}) {
    float a[${V}];
    mt_load<${V}>(x, j, a);
    for (int l = 0; l < ${V}; ++l)
      a[l] = (long long)(j + l) == label ? (float)((double)expf(xl - m) * f - c) : (float)((double)expf(a[l] - m) * f);
    mt_store<${V}>(y, j, a);
  }
}
)", s), uint64_t(n), r.block, 256, {in(0), in(1), in(2), outp(0)});
    return;
  }

  // Vocab parallel: the row statistics over the whole vocabulary come from
  // collectives between the phases (see the header).
  const uint64_t maxAt = b.alloc(uint64_t(n) * 4);
  const uint64_t sumAt = b.alloc(uint64_t(2 * n) * 4); // sum[n] then target[n]
  b.launch("ce_max", fill(R"(extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TX} *logits, float *row_max) {
  extern __shared__ float mt_shared[];
  const ${TX} *x = logits + (mt_u64)blockIdx.x * ${VOCAB};
  float m = MT_NEG_INF;
  for (mt_u64 j = (mt_u64)threadIdx.x * ${V}; j < ${VOCAB}; j += (mt_u64)blockDim.x * ${V}) {
    float a[${V}];
    mt_load<${V}>(x, j, a);
    for (int l = 0; l < ${V}; ++l) m = fmaxf(m, a[l]);
  }
  m = mt_block_max(m, mt_shared);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}
)", s), uint64_t(n), r.block, 256, {in(0), wsAt(maxAt)});
  b.collective(OpStep::AllReduceMax, 1, maxAt, uint64_t(n), OpStep::F32);
  // A label outside the whole vocabulary makes the target NaN on every rank.
  b.launch("ce_sum", fill(R"(extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TX} *logits, const int *labels, const float *row_max, float *sum_target, mt_u64 tp_rank) {
  extern __shared__ float mt_shared[];
  const mt_u64 row = blockIdx.x;
  const ${TX} *x = logits + row * ${VOCAB};
  const float m = row_max[row];
  float s = 0.0f;
  for (mt_u64 j = (mt_u64)threadIdx.x * ${V}; j < ${VOCAB}; j += (mt_u64)blockDim.x * ${V}) {
    float a[${V}];
    mt_load<${V}>(x, j, a);
    for (int l = 0; l < ${V}; ++l) s += expf(a[l] - m);
  }
  s = mt_block_sum(s, mt_shared);
  if (threadIdx.x == 0) {
    const long long label = labels[row], local = label - (long long)tp_rank * ${VOCAB};
    sum_target[row] = s;
    sum_target[${N} + row] = label < 0 || label >= ${WHOLE} ? MT_NAN
                             : local >= 0 && local < ${VOCAB} ? mt_get(x, local) : 0.0f;
  }
}
)", s), uint64_t(n), r.block, 256, {in(0), in(1), wsAt(maxAt), wsAt(sumAt)}, {"tp_rank"});
  b.collective(OpStep::AllReduceSum, 1, sumAt, uint64_t(gradient ? n : 2 * n), OpStep::F32);
  if (!gradient) {
    b.launch("ce_loss_vp", fill(R"(extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const float *row_max, const float *sum_target, float *loss) {
  extern __shared__ double mt_shared_d[];
  double t = 0.0;
  for (mt_u64 i = threadIdx.x; i < ${N}; i += blockDim.x)
    t += (double)row_max[i] + log((double)sum_target[i]) - (double)sum_target[${N} + i];
  t = mt_block_sum_d(t, mt_shared_d);
  if (threadIdx.x == 0) loss[0] = ${N} ? (float)(t / ${ND}) : 0.0f;
}
)", s), 1, 256, 256, {wsAt(maxAt), wsAt(sumAt), outp(0)});
    return;
  }
  b.launch("ce_grad_vp", fill(R"(extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TX} *logits, const int *labels, const float *dloss, const float *row_max, const float *row_sum, ${TY} *dlogits, mt_u64 tp_rank) {
  const mt_u64 row = blockIdx.x;
  const ${TX} *x = logits + row * ${VOCAB};
  ${TY} *y = dlogits + row * ${VOCAB};
  const long long local = (long long)labels[row] - (long long)tp_rank * ${VOCAB};
  const float m = row_max[row];
  const double c = (double)dloss[0] / ${ND};
  const double f = c / (double)row_sum[row];
  for (mt_u64 j = (mt_u64)threadIdx.x * ${V}; j < ${VOCAB}; j += (mt_u64)blockDim.x * ${V}) {
    float a[${V}];
    mt_load<${V}>(x, j, a);
    for (int l = 0; l < ${V}; ++l) {
      const double e = (double)(float)((double)expf(a[l] - m) * f);
      a[l] = (float)((long long)(j + l) == local ? e - c : e);
    }
    mt_store<${V}>(y, j, a);
  }
}
)", s), uint64_t(n), r.block, 0,
           {in(0), in(1), in(2), wsAt(maxAt), wsAt(sumAt), outp(0)}, {"tp_rank"});
}

// ---------------------------------------------------------------------------
// Optimizer and scalars.

// One tensor (or part of one) of the multi-tensor kernels, byte offsets
// into the state buffer.
struct StateTensor {
  int64_t weight = -1, grad = -1, master = -1, m = -1, v = -1, count = 0;
  double weightDecay = 0;
  DType dtype = DType::F32;
  bool replicated = false; // the norm counts it on tp rank 0 only
};

constexpr int64_t kChunk = 4096; // elements per block: 256 threads x 4 lanes x 4

std::string u64(int64_t v) { return std::to_string(uint64_t(v)) + "ull"; }

// Blocks of tensor t start at table entry `first`; the search finds the
// last entry with first <= the chunk.
constexpr const char *kFindTensor = R"(  int lo = ${LO}, hi = ${HI};
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (mt_tensors[mid].first <= chunk) lo = mid; else hi = mid - 1;
  }
)";

// The distributed optimizer: every data-parallel rank's tensors in one
// table, rank r's entries from mt_rank_entry[r], its chunks counted from 0
// (mt_rank_chunks[r]); the kernel takes dp_rank, so one source serves every
// rank of the shared program. One rank: no rank tables, no argument.
struct RankTables {
  std::vector<int64_t> entries{0}, chunks;
  int64_t maxChunks = 0;
  bool ranked() const { return chunks.size() > 1; }
  // The next rank: the table holds `tableEntries` entries after it, and it
  // has `rankChunks` chunks.
  void add(size_t tableEntries, int64_t rankChunks) {
    entries.push_back(int64_t(tableEntries));
    chunks.push_back(rankChunks);
    maxChunks = std::max(maxChunks, rankChunks);
  }
  // Declarations and the search bounds.
  void fill(std::map<std::string, std::string> &s) const {
    if (!ranked()) {
      s["RANKS"] = "";
      s["LO"] = "0";
      s["HI"] = std::to_string(entries.back()) + " - 1";
      s["DP"] = "";
      s["RANK_CHUNKS"] = num(maxChunks);
      return;
    }
    std::string e, c;
    for (int64_t v : entries)
      e += (e.empty() ? "" : ", ") + std::to_string(v);
    for (int64_t v : chunks)
      c += (c.empty() ? "" : ", ") + u64(v);
    s["RANKS"] = "__device__ const int mt_rank_entry[" + std::to_string(entries.size()) + "] = {" +
                 e + "};\n__device__ const mt_u64 mt_rank_chunks[" +
                 std::to_string(chunks.size()) + "] = {" + c + "};\n";
    s["LO"] = "mt_rank_entry[dp_rank]";
    s["HI"] = "mt_rank_entry[dp_rank + 1] - 1";
    s["DP"] = ", mt_u64 dp_rank";
    s["RANK_CHUNKS"] = "mt_rank_chunks[dp_rank]";
  }
  std::vector<std::string> scalars() const {
    return ranked() ? std::vector<std::string>{"dp_rank"} : std::vector<std::string>{};
  }
};

void genAdamW(const std::vector<std::vector<StateTensor>> &byRank,
              const std::vector<double> &floats, Builder &b) {
  std::string table;
  RankTables ranks;
  size_t nt = 0;
  for (const std::vector<StateTensor> &tensors : byRank) {
    int64_t blocks = 0;
    for (const StateTensor &t : tensors) {
      const bool vec = t.weight % 16 == 0 && t.grad % 16 == 0 && t.m % 16 == 0 && t.v % 16 == 0 &&
                       (t.master < 0 || t.master % 16 == 0);
      table += "  {" + u64(t.weight) + ", " + u64(t.grad) + ", " +
               u64(t.master < 0 ? -1 : t.master) + ", " + u64(t.m) + ", " + u64(t.v) + ", " + u64(t.count) + ", " + u64(blocks) + ", " +
               dbl(t.weightDecay) + ", " +
               std::to_string(t.dtype == DType::BF16 ? 1 : t.dtype == DType::F16 ? 2 : 0) + ", " +
               (vec ? "1" : "0") + "},\n";
      blocks += (t.count + kChunk - 1) / kChunk;
    }
    nt += tensors.size();
    ranks.add(nt, blocks);
  }
  if (ranks.maxChunks == 0)
    return;
  std::map<std::string, std::string> s = {
      {"NT", std::to_string(nt)}, {"TABLE", table}, {"CHUNK", num(kChunk)},
      {"B1", dbl(floats.at(0))}, {"B2", dbl(floats.at(1))}, {"EPS", dbl(floats.at(2))}};
  ranks.fill(s);
  s["FIND"] = fill(kFindTensor, s);
  s["GUARD"] = ranks.ranked()
                   ? "  if (chunk >= mt_rank_chunks[dp_rank]) return; // past this rank's shard\n"
                   : "";
  std::string src = fill(R"(// Byte offsets into the state buffer; master ~0: the weights are the f32 copy updated.
struct mt_adam_tensor { mt_u64 weight, grad, master, m, v, count, first; double weight_decay; int dtype, vec; };
__device__ const mt_adam_tensor mt_tensors[${NT}] = {
${TABLE}};
${RANKS}
// cpu::adamw_step on lanes i .. i + V - 1, in double; the weights (or the
// master copy) updated in place, a reduced-precision model copy rounded from it.
template <int V, class TW>
__device__ __forceinline__ void mt_adam(unsigned char *state, const mt_adam_tensor &t, mt_u64 i, double lr, float clip, double c1, double c2) {
  float g[V], p[V], m[V], v[V];
  float *target = (float *)(state + (t.master != ~0ull ? t.master : t.weight));
  mt_load<V>((const float *)(state + t.grad), i, g);
  mt_load<V>(target, i, p);
  mt_load<V>((const float *)(state + t.m), i, m);
  mt_load<V>((const float *)(state + t.v), i, v);
  const double decay = 1.0 - lr * t.weight_decay;
#pragma unroll
  for (int l = 0; l < V; ++l) {
    const double gi = (double)(g[l] * clip);
    const double mi = ${B1} * m[l] + (1.0 - ${B1}) * gi;
    const double vi = ${B2} * v[l] + (1.0 - ${B2}) * gi * gi;
    const double update = (mi / c1) / (sqrt(vi / c2) + ${EPS});
    p[l] = (float)(p[l] * decay - lr * update);
    m[l] = (float)mi;
    v[l] = (float)vi;
  }
  mt_store<V>(target, i, p);
  mt_store<V>((float *)(state + t.m), i, m);
  mt_store<V>((float *)(state + t.v), i, v);
  if (t.master != ~0ull) mt_store<V>((TW *)(state + t.weight), i, p);
}
template <int V>
__device__ __forceinline__ void mt_adam_any(unsigned char *state, const mt_adam_tensor &t, mt_u64 i, double lr, float clip, double c1, double c2) {
  if (t.dtype == 1) mt_adam<V, mt_bf16>(state, t, i, lr, clip, c1, c2);
  else if (t.dtype == 2) mt_adam<V, mt_f16>(state, t, i, lr, clip, c1, c2);
  else mt_adam<V, float>(state, t, i, lr, clip, c1, c2);
}

// Block b updates chunk b - first of its tensor. A step below 1 leaves
// everything as it is (the CPU executor stops with an error).
extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const float *lr_in, const float *clip_in, const long long *step_in, unsigned char *state${DP}) {
  const long long step = step_in[0];
  if (step < 1) return;
  const mt_u64 chunk = blockIdx.x;
${GUARD}${FIND}  const mt_adam_tensor t = mt_tensors[lo];
  const double lr = (double)lr_in[0];
  const float clip = clip_in[0];
  const double c1 = 1.0 - pow(${B1}, (double)step), c2 = 1.0 - pow(${B2}, (double)step);
  const mt_u64 begin = (chunk - t.first) * ${CHUNK};
  const mt_u64 end = begin + ${CHUNK} < t.count ? begin + ${CHUNK} : t.count;
  for (mt_u64 i = begin + threadIdx.x * 4; i < end; i += blockDim.x * 4) {
    if (t.vec && i + 4 <= end) mt_adam_any<4>(state, t, i, lr, clip, c1, c2);
    else for (mt_u64 e = i; e < end && e < i + 4; ++e) mt_adam_any<1>(state, t, e, lr, clip, c1, c2);
  }
}
)",
                         s);
  b.launch("adamw", src, uint64_t(ranks.maxChunks), 256, 0, {in(0), in(1), in(2), state()},
           ranks.scalars());
}

// Gradient norms: squares of the listed f32 gradients in double, per block
// (a fixed share of chunks), the blocks' partials summed by one block, the
// collectives, then the square root.
void genNorm2(const std::vector<std::vector<StateTensor>> &byRank,
              const std::vector<int64_t> &groups, Builder &b) {
  std::string table;
  RankTables ranks;
  bool anyReplicated = false;
  size_t nt = 0;
  for (const std::vector<StateTensor> &tensors : byRank) {
    int64_t chunks = 0;
    for (const StateTensor &t : tensors) {
      if (t.count == 0)
        continue;
      table += "  {" + u64(t.grad) + ", " + u64(t.count) + ", " + u64(chunks) + ", " +
               (t.grad % 16 == 0 ? "1" : "0") + ", " + (t.replicated ? "1" : "0") + "},\n";
      chunks += (t.count + kChunk - 1) / kChunk;
      anyReplicated |= t.replicated;
      ++nt;
    }
    ranks.add(nt, chunks);
  }
  const int64_t chunks = ranks.maxChunks;
  const int64_t blocks = std::min<int64_t>(chunks, 1056);
  const uint64_t partials = b.alloc(uint64_t(std::max<int64_t>(blocks, 1)) * 8);
  const uint64_t total = b.alloc(8);
  std::map<std::string, std::string> s = {{"TABLE", table}, {"CHUNK", num(kChunk)},
                                          {"G", num(blocks)}};
  s["NT"] = std::to_string(std::count(table.begin(), table.end(), '\n'));
  ranks.fill(s);
  s["FIND"] = fill(kFindTensor, s);
  s["TP"] = anyReplicated ? ", mt_u64 tp_rank" : "";
  s["NOT_FIRST"] = anyReplicated ? "tp_rank != 0" : "0";
  if (blocks > 0)
    b.launch("norm_squares", fill(R"(struct mt_norm_tensor { mt_u64 grad, count, first; int vec, replicated; };
__device__ const mt_norm_tensor mt_tensors[${NT}] = {
${TABLE}};
${RANKS}
extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const unsigned char *state, double *partials${TP}${DP}) {
  extern __shared__ double mt_shared_d[];
  double acc = 0.0;
  for (mt_u64 chunk = blockIdx.x; chunk < ${RANK_CHUNKS}; chunk += gridDim.x) {
${FIND}    const mt_norm_tensor t = mt_tensors[lo];
    if (t.replicated && ${NOT_FIRST}) continue; // counted on tp rank 0
    const float *g = (const float *)(state + t.grad);
    const mt_u64 begin = (chunk - t.first) * ${CHUNK};
    const mt_u64 end = begin + ${CHUNK} < t.count ? begin + ${CHUNK} : t.count;
    for (mt_u64 i = begin + threadIdx.x * 4; i < end; i += blockDim.x * 4) {
      if (t.vec && i + 4 <= end) {
        float a[4];
        mt_load<4>(g, i, a);
        for (int l = 0; l < 4; ++l) acc += (double)a[l] * a[l];
      } else {
        for (mt_u64 e = i; e < end && e < i + 4; ++e) acc += (double)g[e] * g[e];
      }
    }
  }
  acc = mt_block_sum_d(acc, mt_shared_d);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}
)", s), uint64_t(blocks), 256, 256, {state(), wsAt(partials)},
             [&] {
               std::vector<std::string> a = ranks.scalars();
               if (anyReplicated)
                 a.insert(a.begin(), "tp_rank");
               return a;
             }());
  b.launch("norm_total", fill(R"(extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const double *partials, double *total) {
  extern __shared__ double mt_shared_d[];
  double t = 0.0;
  for (mt_u64 i = threadIdx.x; i < ${G}; i += blockDim.x) t += partials[i];
  t = mt_block_sum_d(t, mt_shared_d);
  if (threadIdx.x == 0) total[0] = t;
}
)", s), 1, 256, 256, {wsAt(partials), wsAt(total)});
  for (int64_t g : groups)
    b.collective(OpStep::AllReduceSum, g, total, 1, OpStep::F64);
  b.launch("norm_sqrt", R"(extern "C" __global__ void __launch_bounds__(32) @ENTRY@(const double *total, float *norm) {
  if (threadIdx.x == 0) norm[0] = (float)sqrt(total[0]);
}
)", 1, 32, 0, {wsAt(total), outp(0)});
}

// Megatron's OptimizerParamScheduler.get_lr as cpu_executor.cpp's megatron_lr.
void genLrSchedule(const OpInstruction &ins, Builder &b) {
  const int64_t style = ins.ints.at(0), warmup = ins.ints.at(1), decay = ins.ints.at(2),
                samples = ins.ints.at(3), wsdStyle = ins.ints.at(4), wsdDecay = ins.ints.at(5);
  std::map<std::string, std::string> s = {
      {"W", num(warmup)}, {"D", num(decay)}, {"MAX", dbl(ins.floats.at(0))},
      {"MIN", dbl(ins.floats.at(1))}, {"WD", dbl(double(warmup))},
      {"DW", dbl(double(decay - warmup))},
      {"WS1", dbl(double(std::max<int64_t>(warmup * samples, 1)))}, {"G", num(samples)},
      {"START", num(decay - wsdDecay)}, {"WSD", dbl(double(wsdDecay))}, {"PI", dbl(M_PI)}};
  std::string rest;
  const std::string decayed = "  else if (steps > ${D}) lr = ${MIN};\n";
  switch (plan::LrStyle(style)) {
  case plan::LrStyle::CONSTANT:
    rest = "  else lr = ${MAX};\n";
    break;
  case plan::LrStyle::INVERSE_SQUARE_ROOT:
    // In samples, as Megatron counts: the clamps to 1 see the batch.
    rest = decayed + "  else { const long long n = steps * ${G}; lr = ${MAX} * sqrt(${WS1}) / "
                     "sqrt((double)(n > 1 ? n : 1)); if (lr < ${MIN}) lr = ${MIN}; }\n";
    break;
  case plan::LrStyle::LINEAR:
    rest = decayed + "  else lr = ${MIN} + (1.0 - (double)(steps - ${W}) / ${DW}) * (${MAX} - ${MIN});\n";
    break;
  case plan::LrStyle::COSINE:
    rest = decayed + "  else lr = ${MIN} + 0.5 * (cos(${PI} * ((double)(steps - ${W}) / ${DW})) + 1.0) * (${MAX} - ${MIN});\n";
    break;
  case plan::LrStyle::WSD: {
    const char *anneal = "";
    switch (plan::WsdStyle(wsdStyle)) {
    case plan::WsdStyle::EXPONENTIAL: anneal = "2.0 * pow(0.5, r) - 1.0"; break;
    case plan::WsdStyle::LINEAR: anneal = "1.0 - r"; break;
    case plan::WsdStyle::COSINE: anneal = "0.5 * (cos(${PI} * r) + 1.0)"; break;
    case plan::WsdStyle::MINUS_SQRT: anneal = "1.0 - sqrt(r)"; break;
    }
    rest = decayed + "  else if (steps <= ${START}) lr = ${MAX};\n"
                     "  else { const double r = (double)(steps - ${START}) / ${WSD}; lr = ${MIN} + (" +
           std::string(anneal) + ") * (${MAX} - ${MIN}); }\n";
    break;
  }
  }
  std::string src = fill(R"(extern "C" __global__ void __launch_bounds__(32) @ENTRY@(const long long *iteration, float *lr_out) {
  if (threadIdx.x != 0) return;
  const long long steps = iteration[0];
  double lr;
  if (steps < 0) lr = (double)MT_NAN;
  else if (${W} > 0 && steps <= ${W}) lr = ${MAX} * (double)steps / ${WD};
)" + rest + "  lr_out[0] = (float)lr;\n}\n",
                         s);
  b.launch("lr_schedule", src, 1, 32, 0, {in(0), outp(0)});
}

void genClipCoeff(const OpInstruction &ins, Builder &b) {
  const double maxNorm = ins.floats.at(0);
  std::string src = R"(extern "C" __global__ void __launch_bounds__(32) @ENTRY@(const float *norm, const float *grad_scale, float *out) {
  if (threadIdx.x != 0) return;
  double coeff = 1.0;
)";
  if (maxNorm > 0)
    src += "  const double c = " + dbl(maxNorm) + " / ((double)norm[0] + 1e-6);\n  if (c < 1.0) coeff = c;\n";
  src += "  out[0] = (float)((double)grad_scale[0] * coeff);\n}\n";
  b.launch("clip_coeff", src, 1, 32, 0, {in(0), in(1), outp(0)});
}

void genGradSeed(const OpInstruction &ins, Builder &b) {
  std::string src = R"(extern "C" __global__ void __launch_bounds__(32) @ENTRY@(float *seed, const float *loss_scale) {
  if (threadIdx.x == 0) seed[0] = (float)()" + dbl(ins.floats.at(0)) +
                    R"( * (double)loss_scale[0]);
}
)";
  b.launch("grad_seed", src, 1, 32, 0, {outp(0), {OpArg::LossScale, 0}});
}

// ---------------------------------------------------------------------------
// Sequence parallelism: moving rank blocks of [b, s, ...] values.

std::string label(const OpInstruction &ins);

// dst[o] = src[f(o)] in runs of `run` units; `source` maps output run q
// (and tp_rank) to its source run.
void genRunCopy(const std::string &name, uint64_t runs, uint64_t runBytes, const std::string &source,
                bool tpRank, OpArg from, OpArg to, Builder &b) {
  uint64_t unit = 16;
  while (runBytes % unit)
    unit /= 2;
  const char *type = unit == 16 ? "uint4" : unit == 8 ? "uint2" : unit == 4 ? "unsigned" : "unsigned short";
  const uint64_t run = runBytes / unit, n = runs * run;
  std::map<std::string, std::string> s = {{"U", type}, {"N", u64(int64_t(n))},
                                          {"RUN", u64(int64_t(run))}, {"SRC", source},
                                          {"TP", tpRank ? ", mt_u64 tp_rank" : ""}};
  b.launch(name, fill(R"(extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const ${U} *src, ${U} *dst${TP}) {
  const mt_u64 o = (mt_u64)blockIdx.x * 256 + threadIdx.x;
  if (o >= ${N}) return;
  const mt_u64 q = o / ${RUN}, j = o % ${RUN};
  dst[o] = src[(${SRC}) * ${RUN} + j];
}
)", s), (n + 255) / 256, 256, 0, {from, to},
           tpRank ? std::vector<std::string>{"tp_rank"} : std::vector<std::string>{});
}

bool genSequence(const OpInstruction &ins, Builder &b, std::string *error) {
  const bool gather = ins.op == Opcode::SEQ_ALL_GATHER;
  const OpTensor &shard = gather ? ins.in[0] : ins.out[0];
  const OpTensor &whole = gather ? ins.out[0] : ins.in[0];
  const int64_t t = ins.tensorParallel;
  if (shard.shape.size() < 2 || whole.shape.size() != shard.shape.size() ||
      whole.shape[1] != shard.shape[1] * t || shard.dtype != whole.dtype) {
    *error = label(ins) + ": operands are not [b, s, ...] and its " + std::to_string(t) +
             " sequence shards of one type";
    return false;
  }
  const int64_t batch = shard.shape[0];
  const uint64_t runBytes = uint64_t(shard.elements() / batch) * uint64_t(bytesOf(shard.dtype));
  const std::string B = u64(batch), T = u64(t);
  switch (ins.op) {
  case Opcode::SEQ_SPLIT: // output run q = row q: the input's run q * t + tp_rank
    genRunCopy("seq_split", uint64_t(batch), runBytes, "q * " + T + " + tp_rank", true, in(0),
               outp(0), b);
    return true;
  case Opcode::SEQ_ALL_GATHER: {
    if (batch == 1) {
      b.native({in(0), outp(0)});
      return true;
    }
    // Gathered [t, b] runs -> output runs [b, t].
    const uint64_t ws = b.alloc(runBytes * uint64_t(batch * t));
    b.native({in(0), wsAt(ws)});
    genRunCopy("seq_unblock", uint64_t(batch * t), runBytes,
               "(q % " + T + ") * " + B + " + q / " + T, false, wsAt(ws), outp(0), b);
    return true;
  }
  default: { // SEQ_REDUCE_SCATTER
    if (batch == 1) {
      b.native({in(0), outp(0)});
      return true;
    }
    // Input runs [b, t] -> [t, b] blocks, one per rank.
    const uint64_t ws = b.alloc(runBytes * uint64_t(batch * t));
    genRunCopy("seq_block", uint64_t(batch * t), runBytes,
               "(q % " + B + ") * " + T + " + q / " + B, false, in(0), wsAt(ws), b);
    b.native({wsAt(ws), outp(0)});
    return true;
  }
  }
}

// A tied embedding's gradient: the peer stage's copy arrives in the
// workspace (the executor's exchange), then grad += it. Both stages add the
// same two floats, so their copies keep the same bits.
void genTiedGrad(const OpInstruction &ins, Builder &b) {
  int64_t n = 1;
  for (int64_t d : ins.params.at(0).shape)
    n *= d;
  const uint64_t ws = b.alloc(uint64_t(n) * 4);
  b.native({grad(0), wsAt(ws)});
  std::map<std::string, std::string> s = {{"N", u64(n)}};
  b.launch("tied_add", fill(R"(extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const float *peer, float *grad) {
  const mt_u64 i = (mt_u64)blockIdx.x * 256 + threadIdx.x;
  if (i < ${N}) grad[i] += peer[i];
}
)", s), (uint64_t(n) + 255) / 256, 256, 0, {wsAt(ws), grad(0)});
}

// ---------------------------------------------------------------------------
// Operand checks: the counts of the opcode's signature (plan.fbs).

struct Signature {
  size_t in, out, params, ints, floats;
};

std::optional<Signature> signatureOf(Opcode op) {
  switch (op) {
  case Opcode::POSITION_IDS: return Signature{0, 1, 0, 0, 0};
  case Opcode::EMBEDDING: return Signature{2, 1, 0, 1, 0};
  case Opcode::LAYER_NORM: return Signature{3, 1, 0, 0, 1};
  case Opcode::RMS_NORM: return Signature{2, 1, 0, 0, 1};
  case Opcode::BIAS_ADD: return Signature{2, 1, 0, 0, 0};
  case Opcode::ADD: return Signature{2, 1, 0, 0, 0};
  case Opcode::GELU: return Signature{1, 1, 0, 1, 0};
  case Opcode::SWIGLU: return Signature{1, 1, 0, 0, 0};
  case Opcode::DROPOUT: return Signature{1, 1, 0, 2, 1};
  case Opcode::RESHAPE: return Signature{1, 1, 0, 0, 0};
  case Opcode::SPLIT_QKV: return Signature{1, 3, 0, 0, 0};
  case Opcode::ROPE: return Signature{1, 1, 0, 0, 1};
  case Opcode::CROSS_ENTROPY: return Signature{2, 1, 0, 1, 0};
  case Opcode::GRAD_SEED: return Signature{0, 1, 0, 0, 1};
  case Opcode::EMBEDDING_GRAD: return Signature{2, 0, 1, 1, 0};
  case Opcode::BIAS_GRAD: return Signature{1, 0, 1, 0, 0};
  case Opcode::LAYER_NORM_GRAD: return Signature{3, 1, 2, 0, 1};
  case Opcode::RMS_NORM_GRAD: return Signature{3, 1, 1, 0, 1};
  case Opcode::GELU_GRAD: return Signature{2, 1, 0, 1, 0};
  case Opcode::SWIGLU_GRAD: return Signature{2, 1, 0, 0, 0};
  case Opcode::SPLIT_QKV_GRAD: return Signature{3, 1, 0, 0, 0};
  case Opcode::ROPE_GRAD: return Signature{1, 1, 0, 0, 1};
  case Opcode::CROSS_ENTROPY_GRAD: return Signature{3, 1, 0, 1, 0};
  case Opcode::LR_SCHEDULE: return Signature{1, 1, 0, 6, 2};
  case Opcode::CLIP_COEFF: return Signature{2, 1, 0, 0, 1};
  case Opcode::ADAMW: return Signature{3, 0, 1, 0, 4};
  case Opcode::SHARDED_ADAMW: return Signature{3, 0, SIZE_MAX, 1, 4};
  case Opcode::GRAD_NORM: return Signature{0, 1, SIZE_MAX, 0, 0};
  case Opcode::GROUP_GRAD_NORM: return Signature{0, 1, SIZE_MAX, 1, 0};
  case Opcode::SPLIT_QKV_ROPE: return Signature{1, 3, 0, 0, 1};
  case Opcode::SPLIT_QKV_ROPE_GRAD: return Signature{3, 1, 0, 0, 1};
  case Opcode::SHARDED_GRAD_NORM: return Signature{0, 1, SIZE_MAX, 1, 0};
  case Opcode::SEQ_ALL_GATHER:
  case Opcode::SEQ_REDUCE_SCATTER:
  case Opcode::SEQ_SPLIT: return Signature{1, 1, 0, 1, 0};
  case Opcode::ALL_REDUCE_TIED_GRAD: return Signature{0, 0, 1, 2, 0};
  default: return std::nullopt;
  }
}

std::string label(const OpInstruction &ins) {
  std::string s = plan::EnumNameOpcode(ins.op);
  for (const OpTensor &t : ins.in)
    s += " " + shapeText(t);
  return s;
}

StateTensor adamTensor(const OpParam &p, double weightDecay) {
  StateTensor t;
  t.weight = p.weightOffset;
  t.grad = p.gradOffset;
  t.master = p.masterOffset;
  t.m = p.expAvgOffset;
  t.v = p.expAvgSqOffset;
  t.dtype = p.dtype;
  t.weightDecay = weightDecay;
  t.count = 1;
  for (int64_t d : p.shape)
    t.count *= d;
  return t;
}

// The shard's parts of the parameters, offsets advanced to the segment.
// Rank r's owned segments as AdamW/norm tensors (OpInstruction::rankSegments).
std::vector<std::vector<StateTensor>> shardTensors(const OpInstruction &ins, double weightDecay,
                                                   bool normOnly, std::string *error) {
  std::vector<std::vector<StateTensor>> out;
  for (const std::vector<OpSegment> &segments : ins.rankSegments) {
    out.emplace_back();
    for (const OpSegment &g : segments) {
      if (g.param >= ins.params.size()) {
        *error = "segment names parameter " + std::to_string(g.param) + " of " +
                 std::to_string(ins.params.size());
        return {};
      }
      const OpParam &p = ins.params[g.param];
      if (normOnly && !p.countsInNorm)
        continue;
      StateTensor t = adamTensor(p, p.weightDecay ? weightDecay : 0.0);
      t.count = g.count;
      t.weight = p.weightOffset + g.paramBegin * bytesOf(p.dtype);
      t.grad = p.gradOffset + g.paramBegin * 4;
      t.master = ins.shardMasterOffset >= 0 ? ins.shardMasterOffset + g.stateIndex * 4 : -1;
      t.m = ins.shardExpAvgOffset + g.stateIndex * 4;
      t.v = ins.shardExpAvgSqOffset + g.stateIndex * 4;
      t.replicated = p.replicated && ins.tensorParallel > 1;
      out.back().push_back(t);
    }
  }
  if (out.empty())
    *error = "no data-parallel rank's segments";
  return out;
}

} // namespace

int64_t OpTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

std::optional<OpKernels> generateOpKernels(const OpInstruction &ins, std::string *error) {
  const std::optional<Signature> sig = signatureOf(ins.op);
  if (!sig) {
    *error = std::string("no op kernel for ") + plan::EnumNameOpcode(ins.op) +
             " (fused regions, GEMMs, attention and collectives have their own)";
    return std::nullopt;
  }
  if (ins.in.size() != sig->in || ins.out.size() != sig->out ||
      (sig->params != SIZE_MAX && ins.params.size() != sig->params) ||
      ins.ints.size() != sig->ints || ins.floats.size() != sig->floats) {
    *error = std::string(plan::EnumNameOpcode(ins.op)) +
             ": operands do not match the opcode's signature (plan.fbs)";
    return std::nullopt;
  }
  for (const auto *values : {&ins.in, &ins.out})
    for (const OpTensor &t : *values)
      if (t.elements() < 0) {
        *error = label(ins) + ": negative dimension";
        return std::nullopt;
      }
  if (ins.op == Opcode::SPLIT_QKV_ROPE || ins.op == Opcode::SPLIT_QKV_ROPE_GRAD) {
    // The rotation reads positions from q's shape and rotates pairs.
    const auto &qk = ins.op == Opcode::SPLIT_QKV_ROPE ? ins.out : ins.in;
    if (qk[0].shape.size() != 4 || qk[1].shape.size() != 4 || qk[0].shape[3] % 2 != 0 ||
        qk[1].shape[2] < 1) {
      *error = label(ins) + ": needs q and k [b, s, heads, d] with even d";
      return std::nullopt;
    }
  }
  Builder b(label(ins));
  switch (ins.op) {
  case Opcode::LAYER_NORM: genNorm(ins, b, true); break;
  case Opcode::RMS_NORM: genNorm(ins, b, false); break;
  case Opcode::LAYER_NORM_GRAD: genNormGrad(ins, b, true); break;
  case Opcode::RMS_NORM_GRAD: genNormGrad(ins, b, false); break;
  case Opcode::BIAS_GRAD: genBiasGrad(ins, b); break;
  case Opcode::EMBEDDING: genEmbedding(ins, b); break;
  case Opcode::EMBEDDING_GRAD: genEmbeddingGrad(ins, b); break;
  case Opcode::SPLIT_QKV: genSplitQkv(ins, b, false); break;
  case Opcode::SPLIT_QKV_GRAD: genSplitQkv(ins, b, true); break;
  case Opcode::ROPE: genRope(ins, b, false); break;
  case Opcode::ROPE_GRAD: genRope(ins, b, true); break;
  case Opcode::SPLIT_QKV_ROPE: genSplitQkvRope(ins, b, false); break;
  case Opcode::SPLIT_QKV_ROPE_GRAD: genSplitQkvRope(ins, b, true); break;
  case Opcode::CROSS_ENTROPY: genCrossEntropy(ins, b, false); break;
  case Opcode::CROSS_ENTROPY_GRAD: genCrossEntropy(ins, b, true); break;
  case Opcode::LR_SCHEDULE: genLrSchedule(ins, b); break;
  case Opcode::CLIP_COEFF: genClipCoeff(ins, b); break;
  case Opcode::GRAD_SEED: genGradSeed(ins, b); break;
  case Opcode::SEQ_ALL_GATHER:
  case Opcode::SEQ_REDUCE_SCATTER:
  case Opcode::SEQ_SPLIT:
    if (!genSequence(ins, b, error))
      return std::nullopt;
    break;
  case Opcode::ALL_REDUCE_TIED_GRAD: genTiedGrad(ins, b); break;
  case Opcode::ADAMW:
    return generateAdamWGroup({ins}, error);
  case Opcode::SHARDED_ADAMW: {
    std::string e;
    std::vector<std::vector<StateTensor>> t = shardTensors(ins, ins.floats.at(3), false, &e);
    if (!e.empty() && (*error = label(ins) + ": " + e, true))
      return std::nullopt;
    genAdamW(t, ins.floats, b);
    break;
  }
  case Opcode::GRAD_NORM:
  case Opcode::GROUP_GRAD_NORM: {
    std::vector<StateTensor> t;
    for (const OpParam &p : ins.params)
      if (p.countsInNorm && p.gradOffset >= 0) {
        t.push_back(adamTensor(p, 0));
        t.back().replicated = p.replicated && ins.tensorParallel > 1;
      }
    genNorm2({t}, {ins.op == Opcode::GRAD_NORM ? 3 : ins.ints.at(0)}, b);
    break;
  }
  case Opcode::SHARDED_GRAD_NORM: {
    std::string e;
    std::vector<std::vector<StateTensor>> t = shardTensors(ins, 0, true, &e);
    if (!e.empty() && (*error = label(ins) + ": " + e, true))
      return std::nullopt;
    genNorm2(t, {ins.ints.at(0), 3}, b);
    break;
  }
  default:
    if (!genElementwise(ins, b)) {
      *error = label(ins) + ": no op kernel";
      return std::nullopt;
    }
  }
  return b.finish(error);
}

std::optional<OpKernels> generateGradAccumulate(int64_t count, std::string *error) {
  if (count < 1) {
    *error = "a gradient accumulation of " + std::to_string(count) + " values";
    return std::nullopt;
  }
  Builder b("GRAD_ACCUMULATE");
  const uint64_t ws = b.alloc(uint64_t(count) * 4);
  genColSums(b, ws, 1, count, 1);
  return b.finish(error);
}

std::optional<OpKernels> generateAdamWGroup(const std::vector<OpInstruction> &group,
                                            std::string *error) {
  if (group.empty()) {
    *error = "an empty ADAMW group";
    return std::nullopt;
  }
  std::vector<StateTensor> tensors;
  for (const OpInstruction &ins : group) {
    if (ins.op != Opcode::ADAMW || ins.in.size() != 3 || ins.params.size() != 1 ||
        ins.floats.size() != 4) {
      *error = "an ADAMW group holds ADAMW instructions of one parameter and four floats";
      return std::nullopt;
    }
    // beta1, beta2 and eps are the launch's; the weight decay is per tensor.
    if (!std::equal(ins.floats.begin(), ins.floats.begin() + 3, group[0].floats.begin())) {
      *error = "the instructions of an ADAMW group differ in beta1, beta2 or eps";
      return std::nullopt;
    }
    const OpParam &p = ins.params[0];
    if (p.weightOffset < 0 || p.gradOffset < 0 || p.expAvgOffset < 0 || p.expAvgSqOffset < 0) {
      *error = "ADAMW needs the parameter's weight, gradient and moment offsets";
      return std::nullopt;
    }
    tensors.push_back(adamTensor(p, ins.floats[3]));
  }
  Builder b("ADAMW x" + std::to_string(group.size()));
  genAdamW({tensors}, group[0].floats, b);
  return b.finish(error);
}

} // namespace mt
