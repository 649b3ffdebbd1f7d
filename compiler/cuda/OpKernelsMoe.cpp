// Op kernels of mixture of experts: the fused router and its gradient,
// permute and unpermute (the row map built on the device) and their
// gradients, and the grouped GEMM of the experts (CudaOpKernels.h has the
// launch sequences; docs/architecture.md the design).
#include "compiler/cuda/OpKernelBuilder.h"

#include <algorithm>
#include <map>

namespace mt::opk {
namespace {

// Helpers every MoE kernel carries: block reductions and scans over ints
// (blocks of whole warps, at most 1024 threads), and the segment of a
// permuted row from the experts' token counts.
constexpr const char *kMoeHelpers = R"(
__device__ __forceinline__ int mt_warp_sum_i(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}
// Sum over the block; every thread gets it. `shared`: 32 ints.
__device__ __forceinline__ int mt_block_sum_i(int v, int *shared) {
  v = mt_warp_sum_i(v);
  const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < (blockDim.x >> 5) ? shared[lane] : 0;
  return mt_warp_sum_i(v);
}
// Exclusive prefix sum over the block in thread order, and the block's
// total. `shared`: 32 ints.
__device__ __forceinline__ int mt_block_scan_i(int v, int *total, int *shared) {
  const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xFFFFFFFFu, incl, o);
    if (lane >= (unsigned)o) incl += u;
  }
  __syncthreads();
  if (lane == 31) shared[warp] = incl;
  __syncthreads();
  int before = 0, all = 0;
  for (unsigned w = 0; w < (blockDim.x >> 5); ++w) {
    const int s = shared[w];
    if (w < warp) before += s;
    all += s;
  }
  *total = all;
  return before + incl - v;
}
)";

// Orderable keys, warp argmax and the scores of the router, in mt_r
// (float, or double for moe_router_dtype fp64).
constexpr const char *kRouterCode = R"(
// The better of two candidates: the larger score, then the lower expert.
// NaN scores count as -inf, so a selection always names an expert.
__device__ __forceinline__ bool mt_better(mt_r a, int ia, mt_r b, int ib) {
  if (a != a) a = MT_NEG_INF;
  if (b != b) b = MT_NEG_INF;
  return a > b || (a == b && ia < ib);
}
// The top kK of the lane-strided row key[] (expert j * 32 + lane), best
// first: idx[r] and val[r] in every lane.
__device__ __forceinline__ void mt_topk(const mt_r (&key)[kEPL], int (&idx)[kK], mt_r (&val)[kK]) {
  const int lane = threadIdx.x & 31;
  unsigned chosen = 0u;
  for (int r = 0; r < kK; ++r) {
    mt_r best = MT_NEG_INF;
    int bi = 0x7FFFFFFF;
#pragma unroll
    for (int j = 0; j < kEPL; ++j) {
      const int e = j * 32 + lane;
      if (e < kE && !((chosen >> j) & 1u) && mt_better(key[j], e, best, bi)) { best = key[j]; bi = e; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const mt_r ob = __shfl_xor_sync(0xFFFFFFFFu, best, o);
      const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
      if (mt_better(ob, oi, best, bi)) { best = ob; bi = oi; }
    }
    idx[r] = bi;
    val[r] = best;
    if ((bi & 31) == lane) chosen |= 1u << (bi >> 5);
  }
}
__device__ __forceinline__ mt_r mt_warp_max_r(mt_r v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) { const mt_r u = __shfl_xor_sync(0xFFFFFFFFu, v, o); v = u > v ? u : v; }
  return v;
}
__device__ __forceinline__ mt_r mt_warp_sum_r(mt_r v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}
// f64 logits (moe_router_dtype fp64) are read as they are.
__device__ __forceinline__ double mt_get(const double *p, mt_u64 i) { return p[i]; }
__device__ __forceinline__ mt_r mt_exp_r(float x) { return expf(x); }
__device__ __forceinline__ mt_r mt_exp_r(double x) { return exp(x); }
__device__ __forceinline__ mt_r mt_log_r(float x) { return logf(x); }
__device__ __forceinline__ mt_r mt_log_r(double x) { return log(x); }

// Megatron's `type_as(logits)` with moe_router_dtype unset: a score or
// weight rounded to a 16-bit logits' type (kRound 1 bf16, 2 f16).
__device__ __forceinline__ mt_r mt_rnd(mt_r v) {
  if (kRound == 1) return (mt_r)mt_round_bf16((float)v);
  if (kRound == 2) return (mt_r)mt_round_f16((float)v);
  return v;
}

// One token's routing, recomputed alike by the forward and the gradient:
// the logits l[], the scores s[] (softmax over every expert, or sigmoid;
// unrounded), the chosen experts idx[] with their routing weights w[]
// before the final rounding, scaling and capacity, the log-sum-exp.
struct mt_route {
  mt_r l[kEPL], s[kEPL];
  int idx[kK];
  mt_r w[kK];
  mt_r lse;
};
__device__ __forceinline__ void mt_route_token(const mt_tl *logits, long long t, mt_route &R) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kEPL; ++j) {
    const int e = j * 32 + lane;
    R.l[j] = e < kE ? (mt_r)mt_get(logits, (mt_u64)t * kE + e) : (mt_r)MT_NEG_INF;
  }
  mt_r m = MT_NEG_INF;
#pragma unroll
  for (int j = 0; j < kEPL; ++j) m = R.l[j] > m ? R.l[j] : m;
  m = mt_warp_max_r(m);
  mt_r sum = 0;
#pragma unroll
  for (int j = 0; j < kEPL; ++j) sum += j * 32 + lane < kE ? mt_exp_r(R.l[j] - m) : (mt_r)0;
  sum = mt_warp_sum_r(sum);
  R.lse = m + mt_log_r(sum);
  mt_r key[kEPL];
#pragma unroll
  for (int j = 0; j < kEPL; ++j) {
    const int e = j * 32 + lane;
    R.s[j] = e >= kE ? (mt_r)0 : kSigmoid ? (mt_r)1 / ((mt_r)1 + mt_exp_r(-R.l[j])) : mt_exp_r(R.l[j] - m) / sum;
    // Softmax after the selection picks by logits; the others by the
    // scores as Megatron stores them.
    key[j] = kSigmoid || kPre ? mt_rnd(R.s[j]) : R.l[j];
  }
  mt_r val[kK];
  mt_topk(key, R.idx, val);
  if (!kSigmoid && !kPre) {
    mt_r z = 0;
    for (int r = 0; r < kK; ++r) z += mt_exp_r(val[r] - val[0]);
    for (int r = 0; r < kK; ++r) R.w[r] = mt_exp_r(val[r] - val[0]) / z;
  } else if (kSigmoid && kK > 1) {
    mt_r z = 0;
    for (int r = 0; r < kK; ++r) z += val[r];
    for (int r = 0; r < kK; ++r) R.w[r] = val[r] / (z + (mt_r)1e-20);
  } else {
    for (int r = 0; r < kK; ++r) R.w[r] = val[r];
  }
}
// The routing weight probs holds (before the capacity): rounded, then
// scaled and rounded again.
__device__ __forceinline__ mt_r mt_final_weight(mt_r w) {
  w = mt_rnd(w);
  return kScaled ? mt_rnd(w * (mt_r)kScaling) : w;
}
// The scores the load-balancing loss reads: softmax over every expert, or
// the (rounded) sigmoids sig[] normalised over the row by den.
__device__ __forceinline__ void mt_aux_scores(const mt_route &R, mt_r (&a)[kEPL], mt_r (&sig)[kEPL], mt_r &den) {
  den = 1;
  if (kSigmoid) {
    mt_r z = 0;
#pragma unroll
    for (int j = 0; j < kEPL; ++j) { sig[j] = mt_rnd(R.s[j]); z += sig[j]; }
    den = mt_warp_sum_r(z) + (mt_r)1e-20;
#pragma unroll
    for (int j = 0; j < kEPL; ++j) a[j] = mt_rnd(sig[j] / den);
  } else {
#pragma unroll
    for (int j = 0; j < kEPL; ++j) a[j] = sig[j] = R.s[j];
  }
}
)";

std::string routerPrelude(const OpInstruction &ins, DType logits) {
  const int64_t e = ins.in[0].shape.back(), k = ins.ints.at(0);
  std::string s;
  s += "typedef " + std::string(ins.ints.at(8) == 2 ? "double" : "float") + " mt_r;\n";
  s += "typedef " + std::string(storage(logits)) + " mt_tl;\n";
  s += "constexpr int kE = " + std::to_string(e) + ";\n";
  s += "constexpr int kEPL = " + std::to_string((e + 31) / 32) + ";\n";
  s += "constexpr int kK = " + std::to_string(k) + ";\n";
  s += std::string("constexpr bool kSigmoid = ") + (ins.ints.at(1) == 1 ? "true" : "false") + ";\n";
  s += std::string("constexpr bool kPre = ") + (ins.ints.at(2) != 0 ? "true" : "false") + ";\n";
  // moe_router_dtype unset: Megatron's type_as rounds to a 16-bit logits' type.
  const int round = ins.ints.at(8) != 0 ? 0 : logits == DType::BF16 ? 1 : logits == DType::F16 ? 2 : 0;
  s += "constexpr int kRound = " + std::to_string(round) + ";\n";
  const double scaling = ins.floats.at(0);
  s += std::string("constexpr bool kScaled = ") + (scaling != 0 ? "true" : "false") + ";\n";
  s += "constexpr double kScaling = " + dbl(scaling) + ";\n";
  return s + kMoeHelpers + kRouterCode;
}

// The router's attributes (plan.fbs MOE_ROUTER) and what follows from them.
struct RouterShape {
  int64_t tokens = 0, experts = 0, topk = 0;
  int64_t capacity = 0;   // 0: none
  bool position = false;  // drop policy
  bool pad = false;
  bool aux = false;       // a load-balancing loss is computed
  int64_t groups = 1;     // sequences of seq_aux_loss (1 for aux_loss)
  int64_t groupTokens = 0;
  bool z = false;
  double scaling = 0, auxCoeff = 0, zCoeff = 0;
  // count_group (ints[9]): the group over which the load-balancing loss's
  // token counts are summed (-1: none; 1: tp, under sequence parallelism),
  // and its ranks: the loss's token total is theirs together.
  int64_t countGroup = -1, countRanks = 1;
};

bool routerShape(const OpInstruction &ins, RouterShape &r, std::string *error) {
  const OpTensor &logits = ins.op == Opcode::MOE_ROUTER ? ins.in[0] : ins.in[1];
  if (logits.shape.size() != 2) {
    *error = label(ins) + ": the logits are not [tokens, experts]";
    return false;
  }
  r.tokens = logits.shape[0];
  r.experts = logits.shape[1];
  r.topk = ins.ints[0];
  if (r.experts < 1 || r.experts > 1024 || r.topk < 1 || r.topk > r.experts) {
    *error = label(ins) + ": needs 1 <= topk <= experts <= 1024";
    return false;
  }
  if (ins.ints[1] < 0 || ins.ints[1] > 1 || ins.ints[3] < 0 || ins.ints[3] > 2 ||
      ins.ints[8] < 0 || ins.ints[8] > 2) {
    *error = label(ins) + ": unknown score function, load balancing or router dtype";
    return false;
  }
  r.capacity = ins.ints[4];
  r.position = ins.ints[5] == 1;
  r.pad = ins.ints[6] != 0;
  r.scaling = ins.floats[0];
  r.auxCoeff = ins.floats[1];
  r.zCoeff = ins.floats[2];
  r.aux = ins.ints[3] != 0 && r.auxCoeff > 0;
  r.z = r.zCoeff > 0;
  r.groupTokens = r.tokens;
  const int64_t seq = ins.ints[7];
  if (seq < 1 || r.tokens % seq != 0) {
    *error = label(ins) + ": needs tokens a multiple of seq_length";
    return false;
  }
  if (r.pad && (r.capacity < 1 || r.capacity > r.tokens)) {
    *error = label(ins) + ": pad_to_capacity needs 1 <= capacity <= tokens";
    return false;
  }
  if (r.aux && ins.ints[3] == 2) {
    r.groups = r.tokens / seq;
    r.groupTokens = seq;
  }
  r.countGroup = ins.ints[9];
  if (r.countGroup != -1 && r.countGroup != 1) {
    *error = label(ins) + ": count_group " + std::to_string(r.countGroup) +
             " (the router sums its counts over tp (1) or nothing (-1))";
    return false;
  }
  if (r.countGroup == 1)
    r.countRanks = std::max<int64_t>(ins.tensorParallel, 1);
  return true;
}

// Workspace of the router: the load-balancing loss's scores and selection
// per token (f32 [T, E] each), its column sums (f64 [groups, E] each), the
// tokens' squared log-sum-exp (f64 [T]).
struct RouterWs {
  uint64_t scores = 0, picks = 0, sums = 0, counts = 0, zs = 0;
};

RouterWs routerWs(Builder &b, const RouterShape &r) {
  RouterWs w;
  const uint64_t te = uint64_t(r.tokens * r.experts);
  w.scores = b.alloc(te * 4);
  w.picks = b.alloc(te * 4);
  w.sums = b.alloc(uint64_t(r.groups * r.experts) * 8);
  w.counts = b.alloc(uint64_t(r.groups * r.experts) * 8);
  w.zs = b.alloc(uint64_t(std::max<int64_t>(r.tokens, 1)) * 8);
  return w;
}

std::map<std::string, std::string> routerSubs(const RouterShape &r, const RouterWs &w) {
  return {{"T", num(r.tokens)},
          {"E", num(r.experts)},
          {"K", num(r.topk)},
          {"C", num(r.capacity)},
          {"G", num(r.groups)},
          {"S", num(r.groupTokens)},
          {"AUX", r.aux ? "true" : "false"},
          {"Z", r.z ? "true" : "false"},
          {"ACOEF", dbl(r.auxCoeff)},
          {"ZCOEF", dbl(r.zCoeff)},
          {"WS_SCORES", u64(int64_t(w.scores))},
          {"WS_PICKS", u64(int64_t(w.picks))},
          {"WS_SUMS", u64(int64_t(w.sums))},
          {"WS_COUNTS", u64(int64_t(w.counts))},
          {"WS_Z", u64(int64_t(w.zs))}};
}

// The per-token pass: a warp a token, eight tokens a block. The forward
// writes probs and routing_map before capacity drops; both passes write the
// load-balancing loss's scores and selection, and the forward the token's
// squared log-sum-exp, into the workspace.
void routerTokens(const OpInstruction &ins, Builder &b, const RouterShape &r, const RouterWs &w,
                  bool forward) {
  const OpTensor &logits = forward ? ins.in[0] : ins.in[1];
  auto s = routerSubs(r, w);
  s["FWD"] = forward ? "true" : "false";
  s["PARAMS"] = forward ? ", float *probs, int *map" : "";
  std::string body = routerPrelude(ins, logits.dtype) + fill(R"(
extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const mt_tl *logits${PARAMS}, unsigned char *ws) {
  const int lane = threadIdx.x & 31;
  const long long t = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
  if (t >= ${T}) return; // a whole warp
  mt_route R;
  mt_route_token(logits, t, R);
#if ${FWD}
  for (int j = 0; j < kEPL; ++j) {
    const int e = j * 32 + lane;
    if (e >= kE) break;
    float p = 0.0f;
    int m = 0;
    for (int r = 0; r < kK; ++r)
      if (R.idx[r] == e) { p = (float)mt_final_weight(R.w[r]); m = 1; }
    probs[(mt_u64)t * kE + e] = p;
    map[(mt_u64)t * kE + e] = m;
  }
  if (${Z} && lane == 0) reinterpret_cast<double *>(ws + ${WS_Z})[t] = (double)R.lse * (double)R.lse;
#endif
  if (${AUX}) {
    mt_r a[kEPL], sig[kEPL], den;
    mt_aux_scores(R, a, sig, den);
    int idx[kK];
    mt_r val[kK];
    mt_topk(a, idx, val);
    float *scores = reinterpret_cast<float *>(ws + ${WS_SCORES}) + (mt_u64)t * kE;
    float *picks = reinterpret_cast<float *>(ws + ${WS_PICKS}) + (mt_u64)t * kE;
    for (int j = 0; j < kEPL; ++j) {
      const int e = j * 32 + lane;
      if (e >= kE) break;
      float m = 0.0f;
      for (int q = 0; q < kK; ++q) m = idx[q] == e ? 1.0f : m;
      scores[e] = (float)a[j];
      picks[e] = m;
    }
  }
}
)",
                                                             s);
  std::vector<OpArg> args = {in(forward ? 0 : 1)};
  if (forward) {
    args.push_back(outp(0));
    args.push_back(outp(1));
  }
  args.push_back(wsAt(0));
  b.launch(forward ? "moe_route" : "moe_route_aux", body, uint64_t((r.tokens + 7) / 8), 256, 0,
           args);
}

// Column sums of the load-balancing loss's scores and selection, per
// (sequence group, expert): one block each, a fixed order (deterministic).
void routerColumns(Builder &b, const RouterShape &r, const RouterWs &w) {
  auto s = routerSubs(r, w);
  std::string body = std::string(kMoeHelpers) + fill(R"(
extern "C" __global__ void __launch_bounds__(256) @ENTRY@(unsigned char *ws) {
  __shared__ double mt_sh[64];
  const long long e = blockIdx.x % ${E}, g = blockIdx.x / ${E};
  const float *scores = reinterpret_cast<const float *>(ws + ${WS_SCORES});
  const float *picks = reinterpret_cast<const float *>(ws + ${WS_PICKS});
  double p = 0.0, f = 0.0;
  for (long long i = threadIdx.x; i < ${S}; i += blockDim.x) {
    const mt_u64 at = (mt_u64)(g * ${S} + i) * ${E} + e;
    p += (double)scores[at];
    f += (double)picks[at];
  }
  p = mt_block_sum_d(p, mt_sh);
  f = mt_block_sum_d(f, mt_sh);
  if (threadIdx.x == 0) {
    reinterpret_cast<double *>(ws + ${WS_SUMS})[g * ${E} + e] = p;
    reinterpret_cast<double *>(ws + ${WS_COUNTS})[g * ${E} + e] = f;
  }
}
)",
                                                     s);
  b.launch("moe_aux_columns", body, uint64_t(r.groups * r.experts), 256, 0, {wsAt(0)});
}

// Capacity drops (Megatron's apply_router_token_dropping): one block per
// expert (of up to 1024 threads: each block walks every token) keeps the `capacity` tokens of the largest keys, the routing
// weight (probs policy) or whether the token is routed there (position),
// ties to the earlier token in Megatron's order (sequence-major: token
// t = i s + j is j b + i). The key of the capacity-th is found by a radix
// select over the keys' bits (32 counting passes over the column), the
// ties kept by a scan in Megatron's order. Without padding the map keeps
// what is routed and kept; with padding it is the kept set (every expert
// exactly `capacity` tokens, unrouted ones with weight 0; a capacity of
// every token sends every token to every expert).
void routerCapacity(Builder &b, const RouterShape &r, int64_t seq) {
  std::map<std::string, std::string> s = {
      {"T", num(r.tokens)}, {"E", num(r.experts)}, {"C", std::to_string(r.capacity)},
      {"S", num(seq)}, {"B", num(r.tokens / seq)},
      {"POSITION", r.position ? "true" : "false"}, {"PAD", r.pad ? "true" : "false"},
      {"TB", std::to_string(roundWarps(r.tokens))}};
  std::string body = std::string(kMoeHelpers) + fill(R"(
__device__ __forceinline__ unsigned mt_key(const float *probs, const int *map, mt_u64 at) {
  const float p = ${POSITION} ? (map[at] != 0 ? 1.0f : 0.0f) : probs[at];
  const unsigned u = __float_as_uint(p);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
extern "C" __global__ void __launch_bounds__(${TB}) @ENTRY@(float *probs, int *map) {
  __shared__ int mt_sh[32];
  const long long e = blockIdx.x;
  if (${C} >= ${T}) { // padding to a capacity of every token
    for (long long t = threadIdx.x; t < ${T}; t += blockDim.x) map[(mt_u64)t * ${E} + e] = 1;
    return;
  }
  unsigned pivot = 0u; // the key of the capacity-th largest
  for (int bit = 31; bit >= 0; --bit) {
    const unsigned cand = pivot | (1u << bit);
    int c = 0;
    for (long long t = threadIdx.x; t < ${T}; t += blockDim.x) c += mt_key(probs, map, (mt_u64)t * ${E} + e) >= cand;
    if (mt_block_sum_i(c, mt_sh) >= ${C}) pivot = cand;
  }
  int above = 0;
  for (long long t = threadIdx.x; t < ${T}; t += blockDim.x) above += mt_key(probs, map, (mt_u64)t * ${E} + e) > pivot;
  const int need = ${C} - mt_block_sum_i(above, mt_sh);
  int seen = 0;
  for (long long q0 = 0; q0 < ${T}; q0 += blockDim.x) {
    const long long q = q0 + threadIdx.x, t = (q % ${B}) * ${S} + q / ${B};
    const mt_u64 at = (mt_u64)t * ${E} + e;
    const unsigned k = q < ${T} ? mt_key(probs, map, at) : 0u;
    const bool tie = q < ${T} && k == pivot;
    int total;
    const int rank = seen + mt_block_scan_i(tie ? 1 : 0, &total, mt_sh);
    seen += total;
    if (q < ${T}) {
      const bool keep = k > pivot || (tie && rank < need);
      const int m = ${PAD} ? (keep ? 1 : 0) : (map[at] != 0 && keep ? 1 : 0);
      map[at] = m;
      if (!m) probs[at] = 0.0f;
    }
  }
}
)",
                                                     s);
  b.launch("moe_capacity", body, uint64_t(r.experts), roundWarps(r.tokens), 0, {outp(0), outp(1)});
}

// Megatron's get_tokens_per_expert_and_token_count under sequence
// parallelism: the selection's column sums (the tokens per expert, f64,
// exact for any count below 2^53) summed over count_group between the
// column pass and the kernels that read them; the scores' sums stay local.
void routerCountSum(Builder &b, const RouterShape &r, const RouterWs &w) {
  b.collective(OpStep::AllReduceSum, r.countGroup, w.counts, uint64_t(r.groups * r.experts),
               OpStep::F64);
}

// The two loss values (without their coefficients; 0 when off).
void routerLosses(Builder &b, const RouterShape &r, const RouterWs &w) {
  auto s = routerSubs(r, w);
  const double total = double(r.groupTokens) * double(r.countRanks);
  const double auxScale = double(r.experts) / (double(r.topk) * total * total) / double(r.groups);
  s["AUXSCALE"] = dbl(auxScale);
  s["GE"] = num(r.groups * r.experts);
  std::string body = std::string(kMoeHelpers) + fill(R"(
extern "C" __global__ void __launch_bounds__(256) @ENTRY@(unsigned char *ws, float *aux, float *zloss) {
  __shared__ double mt_sh[64];
  double a = 0.0, z = 0.0;
  if (${AUX}) {
    const double *p = reinterpret_cast<const double *>(ws + ${WS_SUMS});
    const double *f = reinterpret_cast<const double *>(ws + ${WS_COUNTS});
    for (long long i = threadIdx.x; i < ${GE}; i += blockDim.x) a += p[i] * f[i];
  }
  if (${Z}) {
    const double *zs = reinterpret_cast<const double *>(ws + ${WS_Z});
    for (long long t = threadIdx.x; t < ${T}; t += blockDim.x) z += zs[t];
  }
  a = mt_block_sum_d(a, mt_sh);
  z = mt_block_sum_d(z, mt_sh);
  if (threadIdx.x == 0) {
    aux[0] = ${AUX} ? (float)(a * ${AUXSCALE}) : 0.0f;
    zloss[0] = ${Z} ? (float)(z / (double)${T}) : 0.0f;
  }
}
)",
                                                     s);
  b.launch("moe_losses", body, 1, 256, 0, {wsAt(0), outp(2), outp(3)});
}

// MOE_ROUTER_GRAD's per-token pass: the gradient through the routing
// weights (recomputed from the logits; dropped experts pass nothing), plus
// the load-balancing loss's and the z-loss's, scaled by coefficient x scale.
void routerGrad(const OpInstruction &ins, Builder &b, const RouterShape &r, const RouterWs &w) {
  const OpTensor &logits = ins.in[1], &dlogits = ins.out[0];
  auto s = routerSubs(r, w);
  s["TD"] = storage(dlogits.dtype);
  const double total = double(r.groupTokens) * double(r.countRanks);
  s["AUXSCALE"] = dbl(double(r.experts) / (double(r.topk) * total * total) / double(r.groups));
  std::string body = routerPrelude(ins, logits.dtype) + fill(R"(
__device__ __forceinline__ void mt_put(float *p, mt_u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void mt_put(mt_bf16 *p, mt_u64 i, float v) { p[i].bits = (unsigned short)mt_to_bf16(v); }
__device__ __forceinline__ void mt_put(mt_f16 *p, mt_u64 i, float v) { p[i].bits = (unsigned short)mt_to_f16(v); }
__device__ __forceinline__ void mt_put(double *p, mt_u64 i, double v) { p[i] = v; }
extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const float *dprobs, const mt_tl *logits, const int *map,
                                                        const float *scale, ${TD} *dlogits, const unsigned char *ws) {
  const int lane = threadIdx.x & 31;
  const long long t = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
  if (t >= ${T}) return; // a whole warp
  mt_route R;
  mt_route_token(logits, t, R);
  // The gradient of the chosen experts' weights before the scaling (none
  // where the capacity dropped the expert: probs held the constant 0).
  mt_r g[kK], sel[kK]; // sel: the chosen experts' unrounded scores
  for (int r = 0; r < kK; ++r) {
    const mt_u64 at = (mt_u64)t * kE + R.idx[r];
    g[r] = map[at] != 0 ? (mt_r)dprobs[at] : (mt_r)0;
    if (kScaled) g[r] *= (mt_r)kScaling;
    mt_r mine = 0;
    for (int j = 0; j < kEPL; ++j) mine = j * 32 + lane == R.idx[r] ? R.s[j] : mine;
    sel[r] = mt_warp_sum_r(mine);
  }
  mt_r dl[kEPL];
  for (int j = 0; j < kEPL; ++j) dl[j] = 0;
  if (!kSigmoid && !kPre) {
    // w = softmax of the chosen logits.
    mt_r dot = 0;
    for (int r = 0; r < kK; ++r) dot += g[r] * R.w[r];
    for (int r = 0; r < kK; ++r)
      if ((R.idx[r] & 31) == lane) dl[R.idx[r] >> 5] = R.w[r] * (g[r] - dot);
  } else if (!kSigmoid) {
    // The chosen entries of the softmax over every expert.
    mt_r dot = 0;
    for (int r = 0; r < kK; ++r) dot += g[r] * sel[r];
    for (int j = 0; j < kEPL; ++j) {
      mt_r gs = 0;
      for (int r = 0; r < kK; ++r) gs = j * 32 + lane == R.idx[r] ? g[r] : gs;
      dl[j] = R.s[j] * (gs - dot);
    }
  } else {
    // Sigmoids, normalised over the chosen ones when kK > 1.
    mt_r sum = 0, dot = 0;
    for (int r = 0; r < kK; ++r) { sum += sel[r]; dot += g[r] * sel[r]; }
    const mt_r den = sum + (mt_r)1e-20;
    for (int r = 0; r < kK; ++r)
      if ((R.idx[r] & 31) == lane) {
        const int j = R.idx[r] >> 5;
        const mt_r ds = kK > 1 ? g[r] / den - dot / (den * den) : g[r];
        dl[j] = ds * R.s[j] * ((mt_r)1 - R.s[j]);
      }
  }
  if (${AUX}) {
    // d aux / d score[t, e] = coeff x scale x E f[g, e] / (k S^2 groups).
    const double *f = reinterpret_cast<const double *>(ws + ${WS_COUNTS}) + (t / ${S}) * kE;
    const double c = ${ACOEF} * (double)scale[0] * ${AUXSCALE};
    mt_r a[kEPL], sig[kEPL], den, da[kEPL], dot = 0;
    mt_aux_scores(R, a, sig, den);
    for (int j = 0; j < kEPL; ++j) {
      const int e = j * 32 + lane;
      da[j] = e < kE ? (mt_r)(c * f[e]) : (mt_r)0;
      dot += da[j] * sig[j];
    }
    dot = mt_warp_sum_r(dot);
    for (int j = 0; j < kEPL; ++j) {
      if (kSigmoid) // a = sig / den
        dl[j] += (da[j] / den - dot / (den * den)) * sig[j] * ((mt_r)1 - sig[j]);
      else
        dl[j] += sig[j] * (da[j] - dot);
    }
  }
  if (${Z}) {
    // z = mean over tokens of lse^2.
    const mt_r c = (mt_r)(${ZCOEF} * (double)scale[0] * 2.0 / (double)${T}) * R.lse;
    for (int j = 0; j < kEPL; ++j) {
      const int e = j * 32 + lane;
      if (e < kE) dl[j] += c * mt_exp_r(R.l[j] - R.lse);
    }
  }
  for (int j = 0; j < kEPL; ++j) {
    const int e = j * 32 + lane;
    if (e < kE) mt_put(dlogits, (mt_u64)t * kE + e, dl[j]);
  }
}
)",
                                                             s);
  b.launch("moe_router_grad", body, uint64_t((r.tokens + 7) / 8), 256, 0,
           {in(0), in(1), in(3), in(4), outp(0), wsAt(0)});
}

// A row kernel's threads: whole warps covering h / v lane groups, at most 256.
uint32_t rowBlock(int64_t h, int v) { return std::min<uint32_t>(256, roundWarps((h + v - 1) / v)); }

// The expert-major segments of the permuted rows: mt_pre[e] is where expert
// e's rows start (kPad: e * C), mt_pre[kE] where the used rows end.
// Computed by thread 0 into shared memory; every thread then finds a row's
// expert by binary search (kE for a row past the last segment).
constexpr const char *kSegmentCode = R"(
__device__ __forceinline__ void mt_segments(const int *tpe, long long *pre) {
  if (threadIdx.x == 0) {
    long long at = 0;
    for (int e = 0; e < kE; ++e) { pre[e] = at; at += tpe[e] > 0 ? tpe[e] : 0; }
    pre[kE] = at < kN ? at : kN;
  }
  __syncthreads();
}
__device__ __forceinline__ int mt_segment_of(const long long *pre, long long r) {
  if (r >= pre[kE]) return kE;
  int lo = 0, hi = kE - 1; // the last e with pre[e] <= r
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (pre[mid] <= r) lo = mid; else hi = mid - 1;
  }
  return lo;
}
)";

std::string segmentPrelude(int64_t experts, int64_t rows) {
  return "constexpr int kE = " + std::to_string(experts) + ";\nconstexpr long long kN = " +
         num(rows) + ";\n" + kSegmentCode;
}

} // namespace

// MOE_PERMUTE: moe_count (a block of up to 1024 threads per expert: its
// routed tokens -> tokens_per_expert), moe_rows (one per expert: the expert's first
// row from the counts before it, its tokens' rows in token order by a block
// scan -> row_ids, -1 in the rows it leaves unused), moe_gather (y[r] =
// x[row_ids[r]], zeros for -1).
bool genMoePermute(const OpInstruction &ins, Builder &b, std::string *error) {
  const OpTensor &x = ins.in[0], &map = ins.in[1], &y = ins.out[0];
  const OpTensor &rowIds = ins.out[1], &tpe = ins.out[2];
  if (x.shape.size() != 2 || map.shape.size() != 2 || map.shape[0] != x.shape[0] ||
      y.shape.size() != 2 || y.shape[1] != x.shape[1] || map.dtype != DType::I32 ||
      rowIds.dtype != DType::I32 || tpe.dtype != DType::I32 ||
      rowIds.shape != std::vector<int64_t>{y.shape[0]} ||
      tpe.shape != std::vector<int64_t>{map.shape[1]}) {
    *error = label(ins) + ": needs x [T, H], routing_map i32 [T, E] -> y [N, H], row_ids i32 "
                          "[N], tokens_per_expert i32 [E]";
    return false;
  }
  const int64_t t = x.shape[0], h = x.shape[1], e = map.shape[1], n = y.shape[0];
  const int64_t capacity = ins.ints[0];
  const bool pad = ins.ints[1] != 0;
  if (e < 1 || (pad && (capacity < 1 || n != e * capacity))) {
    *error = label(ins) + ": pad_to_capacity needs N = experts x capacity rows";
    return false;
  }
  std::map<std::string, std::string> s = {
      {"T", num(t)}, {"E", num(e)}, {"N", num(n)}, {"H", num(h)},
      {"C", num(capacity)}, {"PAD", pad ? "true" : "false"},
      {"TB", std::to_string(roundWarps(t))}};
  if (e > 0 && t >= 0) {
    std::string count = std::string(kMoeHelpers) + fill(R"(
extern "C" __global__ void __launch_bounds__(${TB}) @ENTRY@(const int *map, int *tpe) {
  __shared__ int mt_sh[32];
  const long long e = blockIdx.x;
  int n = 0;
  for (long long t = threadIdx.x; t < ${T}; t += blockDim.x) n += map[(mt_u64)t * ${E} + e] != 0;
  n = mt_block_sum_i(n, mt_sh);
  if (threadIdx.x == 0) tpe[e] = ${PAD} ? (int)${C} : n;
}
)",
                                                         s);
    b.launch("moe_count", count, uint64_t(e), roundWarps(t), 0, {in(1), outp(2)});
    std::string rows = std::string(kMoeHelpers) + fill(R"(
extern "C" __global__ void __launch_bounds__(${TB}) @ENTRY@(const int *map, const int *tpe, int *row_ids) {
  __shared__ int mt_sh[32];
  __shared__ long long mt_first;
  const long long e = blockIdx.x;
  if (threadIdx.x == 0) {
    long long at = 0;
    for (long long q = 0; q < e; ++q) at += tpe[q];
    mt_first = ${PAD} ? e * ${C} : at;
  }
  __syncthreads();
  const long long first = mt_first;
  // The rows this expert may fill: its capacity, or up to the last row.
  const long long end = ${PAD} ? first + ${C} : ${N};
  long long seen = 0;
  for (long long t0 = 0; t0 < ${T}; t0 += blockDim.x) {
    const long long t = t0 + threadIdx.x;
    const bool routed = t < ${T} && map[(mt_u64)t * ${E} + e] != 0;
    int total;
    const long long r = first + seen + mt_block_scan_i(routed ? 1 : 0, &total, mt_sh);
    seen += total;
    if (routed && r < end) row_ids[r] = (int)t;
  }
  // Unused rows: the rest of a padded expert's, or past the last expert's.
  const long long used = first + seen < end ? first + seen : end;
  if (${PAD} || e == ${E} - 1)
    for (long long r = used + threadIdx.x; r < end; r += blockDim.x) row_ids[r] = -1;
}
)",
                                                        s);
    b.launch("moe_rows", rows, uint64_t(e), roundWarps(t), 0, {in(1), outp(2), outp(1)});
  }
  if (n == 0 || h == 0)
    return true;
  const int v = lanesFor({x.dtype, y.dtype}, {h});
  const uint32_t block = rowBlock(h, v);
  s["V"] = std::to_string(v);
  s["TX"] = storage(x.dtype);
  s["TY"] = storage(y.dtype);
  std::string gather = fill(R"(
extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TX} *x, const int *row_ids, ${TY} *y) {
  const long long r = blockIdx.x;
  const int src = row_ids[r];
  for (mt_u64 c = (mt_u64)threadIdx.x * ${V}; c < ${H}; c += (mt_u64)blockDim.x * ${V}) {
    float a[${V}];
    if (src >= 0) mt_load<${V}>(x, (mt_u64)src * ${H} + c, a);
    else for (int l = 0; l < ${V}; ++l) a[l] = 0.0f;
    mt_store<${V}>(y, (mt_u64)r * ${H} + c, a);
  }
}
)",
                            [&] { auto m = s; m["B"] = std::to_string(block); return m; }());
  b.launch("moe_gather", gather, uint64_t(n), block, 0, {in(0), outp(1), outp(0)});
  return true;
}

// MOE_PERMUTE_GRAD: dx[t] = the sum of dy over the rows of token t, in row
// order (deterministic), f32, rounded once. The rows are grouped by token
// in the workspace: pg_zero, pg_count (atomic counts), pg_scan (one block:
// the starts), pg_place (atomic slots, any order), then pg_sum (a block per
// token sorts its few rows, then adds them).
bool genMoePermuteGrad(const OpInstruction &ins, Builder &b, std::string *error) {
  const OpTensor &dy = ins.in[0], &rowIds = ins.in[1], &dx = ins.out[0];
  if (dy.shape.size() != 2 || dx.shape.size() != 2 || dy.shape[1] != dx.shape[1] ||
      rowIds.dtype != DType::I32 || rowIds.shape != std::vector<int64_t>{dy.shape[0]}) {
    *error = label(ins) + ": needs dy [N, H], row_ids i32 [N] -> dx [T, H]";
    return false;
  }
  const int64_t n = dy.shape[0], h = dy.shape[1], t = dx.shape[0];
  if (t == 0 || h == 0)
    return true;
  const uint64_t counts = b.alloc(uint64_t(t) * 4), starts = b.alloc(uint64_t(t + 1) * 4),
                 cursor = b.alloc(uint64_t(t) * 4), list = b.alloc(uint64_t(std::max<int64_t>(n, 1)) * 4);
  const int v = lanesFor({dy.dtype, dx.dtype}, {h});
  const uint32_t block = rowBlock(h, v);
  std::map<std::string, std::string> s = {
      {"T", num(t)}, {"N", num(n)}, {"H", num(h)}, {"V", std::to_string(v)},
      {"B", std::to_string(block)}, {"TDY", storage(dy.dtype)}, {"TDX", storage(dx.dtype)}};
  const uint32_t tb = 256;
  b.launch("moe_pg_zero", fill(R"(
extern "C" __global__ void __launch_bounds__(256) @ENTRY@(int *counts) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < ${T}) counts[i] = 0;
}
)",
                               s),
           uint64_t((t + tb - 1) / tb), tb, 0, {wsAt(counts)});
  if (n > 0) {
    b.launch("moe_pg_count", fill(R"(
extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const int *row_ids, int *counts) {
  const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= ${N}) return;
  const int t = row_ids[r];
  if (t >= 0 && t < ${T}) atomicAdd(&counts[t], 1);
}
)",
                                    s),
             uint64_t((n + tb - 1) / tb), tb, 0, {in(1), wsAt(counts)});
  }
  b.launch("moe_pg_scan", std::string(kMoeHelpers) + fill(R"(
extern "C" __global__ void __launch_bounds__(1024) @ENTRY@(const int *counts, int *starts, int *cursor) {
  __shared__ int mt_sh[32];
  int seen = 0;
  for (long long t0 = 0; t0 < ${T}; t0 += blockDim.x) {
    const long long t = t0 + threadIdx.x;
    const int c = t < ${T} ? counts[t] : 0;
    int total;
    const int at = seen + mt_block_scan_i(c, &total, mt_sh);
    if (t < ${T}) { starts[t] = at; cursor[t] = at; }
    seen += total;
  }
  if (threadIdx.x == 0) starts[${T}] = seen;
}
)",
                                                          s),
           1, 1024, 0, {wsAt(counts), wsAt(starts), wsAt(cursor)});
  if (n > 0) {
    b.launch("moe_pg_place", fill(R"(
extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const int *row_ids, int *cursor, int *list) {
  const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= ${N}) return;
  const int t = row_ids[r];
  if (t >= 0 && t < ${T}) list[atomicAdd(&cursor[t], 1)] = (int)r;
}
)",
                                    s),
             uint64_t((n + tb - 1) / tb), tb, 0, {in(1), wsAt(cursor), wsAt(list)});
  }
  b.launch("moe_pg_sum", fill(R"(
extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TDY} *dy, const int *starts, int *list, ${TDX} *dx) {
  const long long t = blockIdx.x;
  const int first = starts[t], last = starts[t + 1];
  if (threadIdx.x == 0) // a token's few rows, sorted: the sum's order is the rows'
    for (int i = first + 1; i < last; ++i) {
      const int r = list[i];
      int j = i - 1;
      while (j >= first && list[j] > r) { list[j + 1] = list[j]; --j; }
      list[j + 1] = r;
    }
  __syncthreads();
  for (mt_u64 c = (mt_u64)threadIdx.x * ${V}; c < ${H}; c += (mt_u64)blockDim.x * ${V}) {
    float acc[${V}];
    for (int l = 0; l < ${V}; ++l) acc[l] = 0.0f;
    for (int i = first; i < last; ++i) {
      float d[${V}];
      mt_load<${V}>(dy, (mt_u64)list[i] * ${H} + c, d);
      for (int l = 0; l < ${V}; ++l) acc[l] += d[l];
    }
    mt_store<${V}>(dx, (mt_u64)t * ${H} + c, acc);
  }
}
)",
                              s),
           uint64_t(t), block, 0, {in(0), wsAt(starts), wsAt(list), outp(0)});
  return true;
}

namespace {

bool unpermuteShapes(const OpInstruction &ins, size_t y, size_t probs, int64_t &t, int64_t &h,
                     int64_t &e, int64_t &n, std::string *error) {
  const OpTensor &Y = ins.in[y], &P = ins.in[probs], &R = ins.in[probs + 1],
                 &C = ins.in[probs + 2];
  if (Y.shape.size() != 2 || P.shape.size() != 2 || P.dtype != DType::F32 ||
      R.dtype != DType::I32 || C.dtype != DType::I32 ||
      R.shape != std::vector<int64_t>{Y.shape[0]} || C.shape != std::vector<int64_t>{P.shape[1]}) {
    *error = label(ins) + ": needs y [N, H], probs f32 [T, E], row_ids i32 [N], "
                          "tokens_per_expert i32 [E]";
    return false;
  }
  n = Y.shape[0];
  h = Y.shape[1];
  t = P.shape[0];
  e = P.shape[1];
  if (e < 1 || e > 1024) {
    *error = label(ins) + ": needs 1 to 1024 experts";
    return false;
  }
  return true;
}

} // namespace

// MOE_UNPERMUTE: moe_inv_clear (the [T, E] row table to -1), moe_inv_set (a
// thread per row: its token's entry at its expert), moe_combine (a block
// per token: the sum over its experts in order of probs x y, f32, rounded
// once).
bool genMoeUnpermute(const OpInstruction &ins, Builder &b, std::string *error) {
  int64_t t, h, e, n;
  if (!unpermuteShapes(ins, 0, 1, t, h, e, n, error))
    return false;
  const OpTensor &y = ins.in[0], &out = ins.out[0];
  if (out.shape != std::vector<int64_t>{t, h}) {
    *error = label(ins) + ": out is not [T, H]";
    return false;
  }
  if (t == 0 || h == 0)
    return true;
  const uint64_t inv = b.alloc(uint64_t(t * e) * 4);
  const int v = lanesFor({y.dtype, out.dtype}, {h});
  const uint32_t block = rowBlock(h, v), tb = 256;
  std::map<std::string, std::string> s = {
      {"T", num(t)}, {"N", num(n)}, {"H", num(h)}, {"E", num(e)}, {"TE", num(t * e)},
      {"V", std::to_string(v)}, {"B", std::to_string(block)}, {"TY", storage(y.dtype)},
      {"TO", storage(out.dtype)}};
  b.launch("moe_inv_clear", fill(R"(
extern "C" __global__ void __launch_bounds__(256) @ENTRY@(int *inv) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < ${TE}) inv[i] = -1;
}
)",
                                 s),
           uint64_t((t * e + tb - 1) / tb), tb, 0, {wsAt(inv)});
  if (n > 0)
    b.launch("moe_inv_set", segmentPrelude(e, n) + fill(R"(
extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const int *row_ids, const int *tpe, int *inv) {
  __shared__ long long mt_pre[kE + 1];
  mt_segments(tpe, mt_pre);
  const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= ${N}) return;
  const int t = row_ids[r], e = mt_segment_of(mt_pre, r);
  if (t >= 0 && t < ${T} && e < kE) inv[(mt_u64)t * kE + e] = (int)r;
}
)",
                                                        s),
             uint64_t((n + tb - 1) / tb), tb, 0, {in(2), in(3), wsAt(inv)});
  b.launch("moe_combine", fill(R"(
extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TY} *y, const float *probs, const int *inv, ${TO} *out) {
  const long long t = blockIdx.x;
  for (mt_u64 c = (mt_u64)threadIdx.x * ${V}; c < ${H}; c += (mt_u64)blockDim.x * ${V}) {
    float acc[${V}];
    for (int l = 0; l < ${V}; ++l) acc[l] = 0.0f;
    for (long long e = 0; e < ${E}; ++e) {
      const int r = inv[(mt_u64)t * ${E} + e];
      if (r < 0) continue;
      const float p = probs[(mt_u64)t * ${E} + e];
      float a[${V}];
      mt_load<${V}>(y, (mt_u64)r * ${H} + c, a);
      for (int l = 0; l < ${V}; ++l) acc[l] += p * a[l];
    }
    mt_store<${V}>(out, (mt_u64)t * ${H} + c, acc);
  }
}
)",
                               s),
           uint64_t(t), block, 0, {in(0), in(1), wsAt(inv), outp(0)});
  return true;
}

// MOE_UNPERMUTE_GRAD: moe_dprobs_clear (dprobs to 0), moe_unpermute_grad (a
// block per row: dy[r] = probs[t, e] dout[t], and dprobs[t, e] = y[r] .
// dout[t] summed in f32 over the block; 0 for unused rows).
bool genMoeUnpermuteGrad(const OpInstruction &ins, Builder &b, std::string *error) {
  int64_t t, h, e, n;
  if (!unpermuteShapes(ins, 1, 2, t, h, e, n, error))
    return false;
  const OpTensor &dout = ins.in[0], &y = ins.in[1], &dy = ins.out[0], &dprobs = ins.out[1];
  if (dout.shape != std::vector<int64_t>{t, h} || dy.shape != y.shape ||
      dprobs.dtype != DType::F32 || dprobs.shape != ins.in[2].shape) {
    *error = label(ins) + ": needs dout [T, H] -> dy [N, H], dprobs f32 [T, E]";
    return false;
  }
  const uint32_t tb = 256;
  std::map<std::string, std::string> s = {{"TE", num(t * e)}, {"N", num(n)}, {"H", num(h)},
                                          {"T", num(t)}};
  if (t * e > 0)
    b.launch("moe_dprobs_clear", fill(R"(
extern "C" __global__ void __launch_bounds__(256) @ENTRY@(float *dprobs) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < ${TE}) dprobs[i] = 0.0f;
}
)",
                                      s),
             uint64_t((t * e + tb - 1) / tb), tb, 0, {outp(1)});
  if (n == 0 || h == 0)
    return true;
  const int v = lanesFor({dout.dtype, y.dtype, dy.dtype}, {h});
  const uint32_t block = rowBlock(h, v);
  s["V"] = std::to_string(v);
  s["B"] = std::to_string(block);
  s["TD"] = storage(dout.dtype);
  s["TY"] = storage(y.dtype);
  s["TDY"] = storage(dy.dtype);
  b.launch("moe_unpermute_grad", segmentPrelude(e, n) + fill(R"(
extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TD} *dout, const ${TY} *y, const float *probs,
                                                         const int *row_ids, const int *tpe, ${TDY} *dy, float *dprobs) {
  __shared__ long long mt_pre[kE + 1];
  __shared__ float mt_sh[32];
  mt_segments(tpe, mt_pre);
  const long long r = blockIdx.x;
  const int t = row_ids[r], e = mt_segment_of(mt_pre, r);
  const bool used = t >= 0 && t < ${T} && e < kE;
  const float p = used ? probs[(mt_u64)t * kE + e] : 0.0f;
  float dot = 0.0f;
  for (mt_u64 c = (mt_u64)threadIdx.x * ${V}; c < ${H}; c += (mt_u64)blockDim.x * ${V}) {
    float d[${V}], a[${V}], o[${V}];
    if (used) {
      mt_load<${V}>(dout, (mt_u64)t * ${H} + c, d);
      mt_load<${V}>(y, (mt_u64)r * ${H} + c, a);
      for (int l = 0; l < ${V}; ++l) { o[l] = p * d[l]; dot += a[l] * d[l]; }
    } else {
      for (int l = 0; l < ${V}; ++l) o[l] = 0.0f;
    }
    mt_store<${V}>(dy, (mt_u64)r * ${H} + c, o);
  }
  dot = mt_block_sum(dot, mt_sh);
  if (used && threadIdx.x == 0) dprobs[(mt_u64)t * kE + e] = dot;
}
)",
                                                            s),
           uint64_t(n), block, 0, {in(0), in(1), in(2), in(3), in(4), outp(0), outp(1)});
  return true;
}

namespace {

// The grouped GEMM's tile code. A block computes a kBM x kBN tile of one
// expert's product, 8 warps as 2 x 4, each warp 64 x 32 in mma.sync's m16n8
// accumulator layout (lane 4g + c: rows g and g + 8 of each 16-row slab,
// columns 2c, 2c + 1 of each 8-column tile). The shared tiles keep the
// global layout (kAKM: A stored [k][m], kBKN: B stored [k][n]), so loads
// are 16-byte copies (cp.async on the GPU), and fragments come from
// ldmatrix, transposing where the layout asks. 16-bit types run on tensor
// cores (fp32 accumulation), f32 on fp32 FMAs over the same layout.
constexpr const char *kGroupedCode = R"mtcuda(
#if MT_GG_MMA
__device__ __forceinline__ void mt_cp16(void *dst, const void *src) {
#if defined(__CUDA_ARCH__)
  asm volatile("{\n .reg .u64 a;\n .reg .u32 s;\n cvta.to.shared.u64 a, %0;\n cvt.u32.u64 s, a;\n"
               " cp.async.cg.shared.global [s], [%1], 16;\n}\n" ::"l"(dst), "l"(src) : "memory");
#else
  *static_cast<mt_w4 *>(dst) = *static_cast<const mt_w4 *>(src);
#endif
}
__device__ __forceinline__ void mt_cp_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}
template <bool Trans> __device__ __forceinline__ void mt_ldsm4(unsigned (&r)[4], const void *row) {
#if defined(__CUDA_ARCH__)
  if constexpr (Trans)
    asm volatile("{\n .reg .u64 a;\n .reg .u32 s;\n cvta.to.shared.u64 a, %4;\n cvt.u32.u64 s, a;\n"
                 " ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [s];\n}\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(row));
  else
    asm volatile("{\n .reg .u64 a;\n .reg .u32 s;\n cvta.to.shared.u64 a, %4;\n cvt.u32.u64 s, a;\n"
                 " ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [s];\n}\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(row));
#else
  mt_host_ldmatrix(r, 4, Trans, row);
#endif
}
__device__ __forceinline__ void mt_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__)
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.@MMA@.@MMA@.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  const unsigned b[2] = {b0, b1};
  mt_host_mma_@MMA@_m16n8k16(d, a, b, d);
#endif
}
#else
__device__ __forceinline__ void mt_cp16(void *dst, const void *src) {
  *static_cast<mt_w4 *>(dst) = *static_cast<const mt_w4 *>(src);
}
__device__ __forceinline__ void mt_cp_wait() {}
#endif

// Rows r0 .. r0 + R - 1 (those below rEnd) and columns c0 .. c0 + C - 1
// (below cEnd) of a row-major matrix with row stride ld, into shared rows of
// LDS elements; zeros elsewhere. kVec: every row is whole 16-byte chunks.
template <int R, int C, int LDS>
__device__ __forceinline__ void mt_tile(mt_s *dst, const mt_s *src, mt_u64 ld, long long r0, long long rEnd,
                                        long long c0, long long cEnd) {
  if (kVec) {
    constexpr int kW = 16 / (int)sizeof(mt_s), kChunks = C / kW;
    for (int i = threadIdx.x; i < R * kChunks; i += 256) {
      const int r = i / kChunks, c = (i % kChunks) * kW;
      mt_s *d = dst + r * LDS + c;
      if (r0 + r < rEnd && c0 + c < cEnd) mt_cp16(d, src + (mt_u64)(r0 + r) * ld + c0 + c);
      else { const mt_w4 zero = {{0u, 0u, 0u, 0u}}; *reinterpret_cast<mt_w4 *>(d) = zero; }
    }
  } else {
    for (int i = threadIdx.x; i < R * C; i += 256) {
      const int r = i / C, c = i % C;
      dst[r * LDS + c] = r0 + r < rEnd && c0 + c < cEnd ? src[(mt_u64)(r0 + r) * ld + c0 + c] : (mt_s)0;
    }
  }
}

// A stored [m][k] (kAKM false) or [k][m]; B stored [n][k] (kBKN false) or [k][n].
constexpr int kLdA = (kAKM ? kBM : kBK) + kPad, kLdB = (kBKN ? kBN : kBK) + kPad;
constexpr int kSizeA = (kAKM ? kBK : kBM) * kLdA, kSizeB = (kBKN ? kBK : kBN) * kLdB;

// acc += A B^T over the kBK columns of one stage.
__device__ __forceinline__ void mt_tile_mma(float (&acc)[4][4][4], const mt_s *As, const mt_s *Bs) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int m0 = (warp >> 2) * 64, n0 = (warp & 3) * 32;
#if MT_GG_MMA
#pragma unroll
  for (int kk = 0; kk < kBK; kk += 16) {
    unsigned a[4][4];
#pragma unroll
    for (int ms = 0; ms < 4; ++ms) {
      if (kAKM) {
        const int j = lane >> 3;
        mt_ldsm4<true>(a[ms], As + (kk + (j >> 1) * 8 + (lane & 7)) * kLdA + m0 + ms * 16 + (j & 1) * 8);
      } else {
        mt_ldsm4<false>(a[ms], As + (m0 + ms * 16 + (lane & 15)) * kLdA + kk + ((lane >> 4) << 3));
      }
    }
#pragma unroll
    for (int t = 0; t < 4; t += 2) {
      unsigned b[4];
      if (kBKN) mt_ldsm4<true>(b, Bs + (kk + (lane & 15)) * kLdB + n0 + 8 * t + ((lane >> 4) << 3));
      else mt_ldsm4<false>(b, Bs + (n0 + 8 * t + (lane & 7) + ((lane >> 4) << 3)) * kLdB + kk + (((lane >> 3) & 1) << 3));
#pragma unroll
      for (int ms = 0; ms < 4; ++ms) {
        mt_mma(acc[ms][t], a[ms], b[0], b[1]);
        mt_mma(acc[ms][t + 1], a[ms], b[2], b[3]);
      }
    }
  }
#else
  const int g = lane >> 2, c = lane & 3;
  for (int k = 0; k < kBK; ++k) {
    float x[4][2], y[4][2];
#pragma unroll
    for (int ms = 0; ms < 4; ++ms)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + ms * 16 + g + 8 * h;
        x[ms][h] = kAKM ? As[k * kLdA + m] : As[m * kLdA + k];
      }
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = n0 + 8 * t + 2 * c + h;
        y[t][h] = kBKN ? Bs[k * kLdB + n] : Bs[n * kLdB + k];
      }
#pragma unroll
    for (int ms = 0; ms < 4; ++ms)
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        acc[ms][t][0] = fmaf(x[ms][0], y[t][0], acc[ms][t][0]);
        acc[ms][t][1] = fmaf(x[ms][0], y[t][1], acc[ms][t][1]);
        acc[ms][t][2] = fmaf(x[ms][1], y[t][0], acc[ms][t][2]);
        acc[ms][t][3] = fmaf(x[ms][1], y[t][1], acc[ms][t][3]);
      }
  }
#endif
}

// The product over k in [0, kRed) with kStages buffers: the next stage's
// copies are in flight while this one is multiplied.
template <typename LoadA, typename LoadB>
__device__ __forceinline__ void mt_mainloop(float (&acc)[4][4][4], long long kRed, mt_s *As, mt_s *Bs,
                                            LoadA loadA, LoadB loadB) {
  const long long tiles = (kRed + kBK - 1) / kBK;
  if (tiles == 0) return;
  loadA(As, 0ll);
  loadB(Bs, 0ll);
  mt_cp_wait();
  __syncthreads();
  for (long long kt = 0; kt < tiles; ++kt) {
    const int cur = kStages == 1 ? 0 : (int)(kt & 1);
    if (kStages == 2 && kt + 1 < tiles) {
      loadA(As + (1 - cur) * kSizeA, (kt + 1) * kBK);
      loadB(Bs + (1 - cur) * kSizeB, (kt + 1) * kBK);
    }
    mt_tile_mma(acc, As + cur * kSizeA, Bs + cur * kSizeB);
    if (kStages == 1 && kt + 1 < tiles) {
      __syncthreads();
      loadA(As, (kt + 1) * kBK);
      loadB(Bs, (kt + 1) * kBK);
    }
    mt_cp_wait();
    __syncthreads();
  }
}

// Where each expert's rows start (kE: the used rows' end), by thread 0.
__device__ __forceinline__ void mt_expert_starts(const int *tpe, int *pre) {
  if (threadIdx.x == 0) {
    long long at = 0;
    for (int e = 0; e < kE; ++e) { pre[e] = (int)(at < kRows ? at : kRows); at += tpe[e] > 0 ? tpe[e] : 0; }
    pre[kE] = (int)(at < kRows ? at : kRows);
  }
  __syncthreads();
}

__device__ __forceinline__ void mt_put(float *p, mt_u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void mt_put(mt_bf16 *p, mt_u64 i, float v) { p[i].bits = (unsigned short)mt_to_bf16(v); }
__device__ __forceinline__ void mt_put(mt_f16 *p, mt_u64 i, float v) { p[i].bits = (unsigned short)mt_to_f16(v); }
)mtcuda";

// The three forms: the forward and the input gradient walk row tiles of the
// segments (the tile's expert found from the counts), the weight gradient
// one block per (expert, output tile) walks the expert's rows.
constexpr const char *kGroupedRowsKernel = R"mtcuda(
extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const mt_ta *a_, const mt_tb *b_, const int *tpe, mt_to *out) {
  __shared__ __align__(16) mt_s mt_As[kStages * kSizeA];
  __shared__ __align__(16) mt_s mt_Bs[kStages * kSizeB];
  __shared__ int mt_pre[kE + 1];
  __shared__ long long mt_tile_at[3]; // first row, row end, expert (kE: the zero rows)
  mt_expert_starts(tpe, mt_pre);
  if (threadIdx.x == 0) {
    long long tile = blockIdx.x, e = 0, first = -1, end = 0;
    for (; e <= kE; ++e) {
      const long long lo = e < kE ? mt_pre[e] : mt_pre[kE];
      long long hi = e < kE ? lo + (tpe[e] > 0 ? tpe[e] : 0) : kRows;
      hi = hi < kRows ? hi : kRows;
      const long long n = hi > lo ? (hi - lo + kBM - 1) / kBM : 0;
      if (tile < n) { first = lo + tile * kBM; end = hi; break; }
      tile -= n;
    }
    mt_tile_at[0] = first;
    mt_tile_at[1] = end;
    mt_tile_at[2] = e;
  }
  __syncthreads();
  const long long first = mt_tile_at[0], end = mt_tile_at[1], e = mt_tile_at[2];
  if (first < 0) return;
  const long long n0 = (long long)blockIdx.y * kBN;
  const mt_s *A = reinterpret_cast<const mt_s *>(a_);
  const mt_s *B = reinterpret_cast<const mt_s *>(b_) + (mt_u64)(e < kE ? e : 0) * kWStride;
  float acc[4][4][4];
  for (int i = 0; i < 4; ++i) for (int j = 0; j < 4; ++j) for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
  if (e < kE) {
    mt_mainloop(acc, kRed, mt_As, mt_Bs,
                [&](mt_s *d, long long k0) { mt_tile<kBM, kBK, kLdA>(d, A, kRed, first, end, k0, kRed); },
                [&](mt_s *d, long long k0) {
                  if (kBKN) mt_tile<kBK, kBN, kLdB>(d, B, kCols, k0, kRed, n0, kCols);
                  else mt_tile<kBN, kBK, kLdB>(d, B, kRed, n0, kCols, k0, kRed);
                });
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long m0 = first + (warp >> 2) * 64, c0 = n0 + (warp & 3) * 32;
#pragma unroll
  for (int ms = 0; ms < 4; ++ms)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long long r = m0 + ms * 16 + (lane >> 2) + 8 * h;
      if (r >= end) continue;
#pragma unroll
      for (int t = 0; t < 4; ++t)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const long long c = c0 + 8 * t + 2 * (lane & 3) + q;
          if (c < kCols) mt_put(out, (mt_u64)r * kCols + c, acc[ms][t][2 * h + q]);
        }
    }
}
)mtcuda";

constexpr const char *kGroupedWeightKernel = R"mtcuda(
extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const mt_ta *a_, const mt_tb *b_, const int *tpe, mt_to *grad) {
  __shared__ __align__(16) mt_s mt_As[kStages * kSizeA];
  __shared__ __align__(16) mt_s mt_Bs[kStages * kSizeB];
  __shared__ int mt_pre[kE + 1];
  mt_expert_starts(tpe, mt_pre);
  const long long e = blockIdx.y;
  const long long first = mt_pre[e];
  long long end = first + (tpe[e] > 0 ? tpe[e] : 0);
  end = end < kRows ? end : kRows;
  if (end <= first) return; // nothing to add
  const long long mTiles = (kM + kBM - 1) / kBM;
  const long long m0 = (long long)(blockIdx.x % mTiles) * kBM, n0 = (long long)(blockIdx.x / mTiles) * kBN;
  const mt_s *A = reinterpret_cast<const mt_s *>(a_); // dy [rows][kM]
  const mt_s *B = reinterpret_cast<const mt_s *>(b_); // x [rows][kCols]
  float acc[4][4][4];
  for (int i = 0; i < 4; ++i) for (int j = 0; j < 4; ++j) for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
  mt_mainloop(acc, end - first, mt_As, mt_Bs,
              [&](mt_s *d, long long k0) { mt_tile<kBK, kBM, kLdA>(d, A, kM, first + k0, end, m0, kM); },
              [&](mt_s *d, long long k0) { mt_tile<kBK, kBN, kLdB>(d, B, kCols, first + k0, end, n0, kCols); });
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long r0 = m0 + (warp >> 2) * 64, c0 = n0 + (warp & 3) * 32;
  mt_to *g = grad + (mt_u64)e * kM * kCols;
#pragma unroll
  for (int ms = 0; ms < 4; ++ms)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long long r = r0 + ms * 16 + (lane >> 2) + 8 * h;
      if (r >= kM) continue;
#pragma unroll
      for (int t = 0; t < 4; ++t)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const long long c = c0 + 8 * t + 2 * (lane & 3) + q;
          if (c < kCols) {
            const mt_u64 at = (mt_u64)r * kCols + c;
            mt_put(g, at, mt_get(g, at) + acc[ms][t][2 * h + q]);
          }
        }
    }
}
)mtcuda";

} // namespace

bool genMoeRouter(const OpInstruction &ins, Builder &b, bool grad, std::string *error) {
  RouterShape r;
  if (!routerShape(ins, r, error))
    return false;
  const OpTensor &map = grad ? ins.in[3] : ins.out[1];
  const OpTensor &probs = grad ? ins.in[2] : ins.out[0];
  if (map.dtype != DType::I32 || probs.dtype != DType::F32 || map.shape != probs.shape ||
      probs.shape != (grad ? ins.in[1] : ins.in[0]).shape) {
    *error = label(ins) + ": probs (f32) and routing_map (i32) are not [tokens, experts]";
    return false;
  }
  if (grad && (ins.in[0].shape != probs.shape || ins.in[0].dtype != DType::F32 ||
               ins.out[0].shape != probs.shape || ins.in[4].dtype != DType::F32 ||
               ins.in[4].elements() != 1)) {
    *error = label(ins) + ": needs dprobs f32 [tokens, experts], scale f32[] -> dlogits [tokens, "
                          "experts]";
    return false;
  }
  if (r.tokens == 0)
    return true;
  const RouterWs w = routerWs(b, r);
  if (!grad) {
    routerTokens(ins, b, r, w, true);
    if (r.capacity > 0 && (r.capacity < r.tokens || r.pad))
      routerCapacity(b, r, ins.ints[7]);
    if (r.aux)
      routerColumns(b, r, w);
    if (r.aux && r.countGroup >= 0)
      routerCountSum(b, r, w);
    routerLosses(b, r, w);
    return true;
  }
  if (r.aux) {
    routerTokens(ins, b, r, w, false);
    routerColumns(b, r, w);
    if (r.countGroup >= 0)
      routerCountSum(b, r, w);
  }
  routerGrad(ins, b, r, w);
  return true;
}


// GROUPED_MATMUL (x [N, K], w [E, M, K] -> y [N, M]), its input gradient
// (dy [N, M], w -> dx [N, K]) and weight gradient (dy, x -> grad w += , in
// the gradient's type). One launch each; rows past the last segment give
// zeros. See kGroupedCode for the tiles.
bool genGroupedMatmul(const OpInstruction &ins, Builder &b, std::string *error) {
  const bool weight = ins.op == Opcode::GROUPED_MATMUL_WEIGHT_GRAD;
  const bool input = ins.op == Opcode::GROUPED_MATMUL_INPUT_GRAD;
  const OpTensor &a = ins.in[0], &bm = ins.in[1], &tpe = ins.in[2];
  // Shapes: rows N; the stacked weight [E, M, K].
  std::vector<int64_t> w3;
  if (weight)
    w3 = ins.params.at(0).shape;
  else
    w3 = bm.shape;
  const char *sig = weight  ? "dy [N, M], x [N, K], tokens_per_expert i32 [E]; params: w [E, M, K]"
                    : input ? "dy [N, M], w [E, M, K], tokens_per_expert i32 [E] -> dx [N, K]"
                            : "x [N, K], w [E, M, K], tokens_per_expert i32 [E] -> y [N, M]";
  bool ok = a.shape.size() == 2 && w3.size() == 3 && tpe.dtype == DType::I32 &&
            tpe.shape == std::vector<int64_t>{w3.size() == 3 ? w3[0] : -1} && w3[0] >= 1;
  int64_t n = 0, e = 0, m = 0, k = 0;
  if (ok) {
    n = a.shape[0];
    e = w3[0];
    m = w3[1];
    k = w3[2];
    if (weight)
      ok = a.shape[1] == m && bm.shape == std::vector<int64_t>{n, k} && a.dtype == bm.dtype;
    else if (input)
      ok = a.shape[1] == m && ins.out[0].shape == std::vector<int64_t>{n, k} && a.dtype == bm.dtype;
    else
      ok = a.shape[1] == k && ins.out[0].shape == std::vector<int64_t>{n, m} && a.dtype == bm.dtype;
  }
  if (!ok) {
    *error = label(ins) + ": needs " + sig + ", both operands of one type";
    return false;
  }
  if (e > 1024 || n > 0x7FFFFFFF || (m + 127) / 128 > 65535 || (k + 127) / 128 > 65535) {
    *error = label(ins) + ": over 1024 experts, 2^31 rows or 8M columns";
    return false;
  }
  const DType t = a.dtype;
  const bool mma = t == DType::BF16 || t == DType::F16;
  // The output's columns and the reduction's length.
  const int64_t cols = weight ? k : input ? k : m, red = weight ? n : input ? m : k;
  const int chunk = mma ? 8 : 4;
  const bool vec = weight ? (m % chunk == 0 && k % chunk == 0)
                          : input ? (m % chunk == 0 && k % chunk == 0) : k % chunk == 0;
  const int bk = 32, stages = mma ? 2 : 1, pad = mma ? 8 : 4, bmTile = 128, bnTile = 128;
  std::string src = "#define MT_GG_MMA " + std::string(mma ? "1" : "0") + "\n";
  src += std::string("typedef ") + (mma ? "unsigned short" : "float") + " mt_s;\n";
  src += "typedef " + std::string(storage(a.dtype)) + " mt_ta;\n";
  src += "typedef " + std::string(storage(bm.dtype)) + " mt_tb;\n";
  const DType outType = weight ? ins.params[0].gradDtype : ins.out[0].dtype;
  src += "typedef " + std::string(storage(outType)) + " mt_to;\n";
  src += "constexpr int kE = " + std::to_string(e) + ";\n";
  src += "constexpr long long kRows = " + num(n) + ", kM = " + num(m) + ", kCols = " + num(cols) +
         ", kRed = " + num(red) + ", kWStride = " + num(m * k) + ";\n";
  src += "constexpr int kBM = " + std::to_string(bmTile) + ", kBN = " + std::to_string(bnTile) +
         ", kBK = " + std::to_string(bk) + ", kPad = " + std::to_string(pad) +
         ", kStages = " + std::to_string(stages) + ";\n";
  src += std::string("constexpr bool kVec = ") + (vec ? "true" : "false") + ";\n";
  src += std::string("constexpr bool kAKM = ") + (weight ? "true" : "false") + ";\n";
  src += std::string("constexpr bool kBKN = ") + (weight || input ? "true" : "false") + ";\n";
  std::string code = kGroupedCode;
  const char *mmaType = t == DType::F16 ? "f16" : "bf16";
  for (size_t at = code.find("@MMA@"); at != std::string::npos; at = code.find("@MMA@", at))
    code.replace(at, 5, mmaType);
  src += code;
  src += weight ? kGroupedWeightKernel : kGroupedRowsKernel;
  const std::string name = weight ? "grouped_wgrad" : input ? "grouped_dgrad" : "grouped_gemm";
  if (weight) {
    if (n == 0 || m == 0 || k == 0)
      return true;
    const uint64_t tiles = uint64_t((m + bmTile - 1) / bmTile) * uint64_t((k + bnTile - 1) / bnTile);
    b.launch(name, src, tiles, 256, 0, {in(0), in(1), in(2), grad(0)});
    b.out.launches.back().kernel.grid[1] = uint32_t(e);
    return true;
  }
  if (n == 0 || cols == 0)
    return true;
  // Row tiles: every segment's, and the zero rows' after them.
  const uint64_t rowTiles = uint64_t((n + bmTile - 1) / bmTile + e + 1);
  b.launch(name, src, rowTiles, 256, 0, {in(0), in(1), in(2), outp(0)});
  b.out.launches.back().kernel.grid[1] = uint32_t((cols + bnTile - 1) / bnTile);
  return true;
}

} // namespace mt::opk
