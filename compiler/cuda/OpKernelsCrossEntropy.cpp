// Op kernels of CROSS_ENTROPY and its gradient: one block per row of logits,
// vocabulary-parallel with the all-reduces between the kernels. Each
// instruction reads the logits once for the row statistics (an online
// softmax: max and sum of exp in one pass); the gradient keeps the row in
// shared memory from that pass for its write pass (as much of it as fits),
// so the loss and its gradient read the logits twice in all, not three
// times. Vocabulary-parallel, where the row statistics are all-reduced
// between kernels, three times, not five.
#include "compiler/cuda/OpKernelBuilder.h"
#include "runtime/exec/cuda/launch_limits.h"

#include <algorithm>
#include <map>

namespace mt::opk {

// The gradient's row cache with the reductions' 256 bytes: the most dynamic
// shared memory a block may opt in to on every GPU mt runs on (99 KiB:
// sm_86, sm_89 and sm_120 allow no more; launch_limits.h), whatever the
// vocabulary. Two CTAs fit an H100 SM (228 KiB, 1 KiB reserved a CTA), one
// an A100's; a bf16 row of 50,560 logits (GPT-2's padded 50,304) fits
// whole, an f32 one half of it; a longer row reads the rest twice.
constexpr int64_t kRowCacheBytes = cu::kPortableMaxDynamicSharedBytes - 256;
static_assert(256 + kRowCacheBytes <= cu::kPortableMaxDynamicSharedBytes);

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
    // and each element is read and then written by one thread: in place is
    // safe. The scan copies the row's first CACHE elements to shared memory
    // in their storage type (exact), and the write pass reads them from
    // there; only a row longer than the cache reads the rest twice.
    const int64_t cache = std::min<int64_t>(vocab, (kRowCacheBytes / bytesOf(logits.dtype)) / r.v * r.v);
    s["CACHE"] = num(cache);
    const uint32_t shared = uint32_t(256 + cache * bytesOf(logits.dtype));
    b.launch("ce_grad", fill(R"(extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TX} *logits, const int *labels, const float *dloss, ${TY} *dlogits) {
  extern __shared__ float mt_shared[]; // 64 floats for the reductions, then the row
  ${TX} *row_cache = reinterpret_cast<${TX} *>(mt_shared + 64);
  const mt_u64 row = blockIdx.x;
  const ${TX} *x = logits + row * ${VOCAB};
  ${TY} *y = dlogits + row * ${VOCAB};
  const long long label = labels[row];
  const float xl = label >= 0 && label < ${VOCAB} ? mt_get(x, label) : 0.0f;
  float m = MT_NEG_INF, s = 0.0f;
  for (mt_u64 j = (mt_u64)threadIdx.x * ${V}; j < ${VOCAB}; j += (mt_u64)blockDim.x * ${V}) {
    float a[${V}];
    mt_load<${V}>(x, j, a);
    if (j < ${CACHE}) mt_store<${V}>(row_cache, j, a);
    float lm = a[0];
    for (int l = 1; l < ${V}; ++l) lm = fmaxf(lm, a[l]);
    if (lm == MT_NEG_INF) continue;
    float ls = 0.0f;
    for (int l = 0; l < ${V}; ++l) ls += expf(a[l] - lm);
    mt_lse_merge(m, s, lm, ls);
  }
  mt_block_lse(m, s, mt_shared);
  const double c = (double)dloss[0] / ${ND};
  const double f = c / (double)s;
  for (mt_u64 j = (mt_u64)threadIdx.x * ${V}; j < ${VOCAB}; j += (mt_u64)blockDim.x * ${V}) {
    float a[${V}];
    if (j < ${CACHE}) mt_load<${V}>(row_cache, j, a);
    else mt_load<${V}>(x, j, a);
    for (int l = 0; l < ${V}; ++l)
      a[l] = (long long)(j + l) == label ? (float)((double)expf(xl - m) * f - c) : (float)((double)expf(a[l] - m) * f);
    mt_store<${V}>(y, j, a);
  }
}
)", s), uint64_t(n), r.block, shared, {in(0), in(1), in(2), outp(0)});
    return;
  }

  // Vocab parallel: the row statistics over the whole vocabulary come from
  // collectives between the phases (see the header). One pass gives each
  // row's local max and sum of exp (and the target's logit); after the
  // max's all-reduce a tiny kernel rescales the local sums to the global
  // max for the sum's all-reduce.
  const uint64_t maxAt = b.alloc(uint64_t(n) * 4);
  const uint64_t sumAt = b.alloc(uint64_t(2 * n) * 4); // sum[n] then target[n]
  const uint64_t localAt = b.alloc(uint64_t(2 * n) * 4); // local max[n] then local sum[n]
  // A label outside the whole vocabulary makes the target NaN on every rank.
  b.launch("ce_stats", fill(R"(extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TX} *logits, const int *labels, float *row_max, float *sum_target, float *local, mt_u64 tp_rank) {
  extern __shared__ float mt_shared[];
  const mt_u64 row = blockIdx.x;
  const ${TX} *x = logits + row * ${VOCAB};
${SCAN}  if (threadIdx.x == 0) {
    const long long label = labels[row], lo = label - (long long)tp_rank * ${VOCAB};
    row_max[row] = m;
    local[row] = m;
    local[${N} + row] = s;
    sum_target[${N} + row] = label < 0 || label >= ${WHOLE} ? MT_NAN
                             : lo >= 0 && lo < ${VOCAB} ? mt_get(x, lo) : 0.0f;
  }
}
)", s), uint64_t(n), r.block, 256, {in(0), in(1), wsAt(maxAt), wsAt(sumAt), wsAt(localAt)}, {"tp_rank"});
  b.collective(OpStep::AllReduceMax, 1, maxAt, uint64_t(n), OpStep::F32);
  const uint32_t rb = uint32_t(std::min<int64_t>(256, roundWarps(n)));
  b.launch("ce_rescale", fill(R"(extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const float *row_max, const float *local, float *sum_target) {
  const mt_u64 row = (mt_u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= ${N}) return;
  const float lm = local[row], ls = local[${N} + row];
  sum_target[row] = lm == MT_NEG_INF ? 0.0f : ls * expf(lm - row_max[row]);
}
)", s), uint64_t((n + rb - 1) / rb), rb, 0, {wsAt(maxAt), wsAt(localAt), wsAt(sumAt)});
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

} // namespace mt::opk
