// Op kernels of elementwise ops, dropout, copies and the attention glue:
// SPLIT_QKV, ROPE, SPLIT_QKV_ROPE and their gradients.
#include "compiler/cuda/OpKernelBuilder.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace mt::opk {

// Elementwise ops and copies: one thread per V consecutive outputs.

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
    // Lanes of 16 bytes; a shard's segments must hold whole lane groups.
    int v = sharded ? lanesFor({x.dtype, y.dtype}, {len}) : lanesFor({x.dtype, y.dtype}, {});
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
// the frequency scaled by ${SCALE} (Llama 3.1's rule, or nothing), in double
// like the CPU. Shared by ROPE and the split that rotates.
constexpr const char *kRotatePairs = R"(#pragma unroll
  for (int l = 0; l < ${V}; ++l) {
    double inv = pow(${BASE}, -2.0 * (double)(j0 + l) / ${DD});
${SCALE}    const double angle = ${SIGN} * p * inv, sn = sin(angle), cs = cos(angle);
    const double x1 = a[l], x2 = c[l];
    a[l] = (float)(x1 * cs - x2 * sn);
    c[l] = (float)(x2 * cs + x1 * sn);
  }
)";

// RoPE's floats[1], Llama 3.1's scaling factor (0: none), as code that scales
// `inv` in place: cpu::rope_inv_freq's rule and order of operations (low and
// high frequency factors 1 and 4, 8192 original positions).
std::string ropeScaling(const OpInstruction &ins) {
  const double factor = ins.floats.size() > 1 ? ins.floats[1] : 0.0;
  if (factor <= 0.0)
    return "";
  std::map<std::string, std::string> s = {{"F", dbl(factor)}};
  return fill(R"(    {
      const double wl = 2.0 * 3.14159265358979323846 / inv;
      if (wl > 8192.0) inv = inv / ${F};
      else if (wl >= 2048.0) {
        const double sm = (8192.0 / wl - 1.0) / (4.0 - 1.0);
        inv = (1.0 - sm) * inv / ${F} + sm * inv;
      }
    }
)",
              s);
}

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
      {"DD", dbl(double(d))}, {"BASE", dbl(ins.floats.at(0))}, {"SIGN", grad ? "-1.0" : "1.0"},
      {"SCALE", ropeScaling(ins)}};
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
      {"SIGN", grad ? "-1.0" : "1.0"}, {"SCALE", ropeScaling(ins)}};
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

} // namespace mt::opk
