// Op kernels of EMBEDDING and EMBEDDING_GRAD (deterministic, bit-equal to the CPU).
#include "compiler/cuda/OpKernelBuilder.h"

#include <algorithm>
#include <map>

namespace mt::opk {

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

// EMBEDDING_GRAD, deterministic and bit-equal to the CPU: each vocabulary
// row adds its tokens' dy rows into the f32 gradient in token order. The
// tokens are sorted by the key (row << 32 | token), unique, so the order is
// the same every run: emb_sort sorts tiles of T keys in shared memory
// (bitonic), emb_merge merges pairs of sorted runs of w = T, 2T, ... keys
// (each thread finds where its eight outputs start by a binary search on
// the merge path, then merges them), and emb_accum walks each row's run of
// keys from its first one. O(n log n) in all (n = tokens); the keys of
// tokens outside this rank's rows sort last and add nothing.
void genEmbeddingGrad(const OpInstruction &ins, Builder &b) {
  const OpTensor &dy = ins.in[0];
  const OpParam &table = ins.params.at(0);
  const int64_t vocab = table.shape[0], h = table.shape[1], n = ins.in[1].elements();
  const bool vp = ins.ints.at(0) != 0;
  if (n == 0 || h == 0)
    return;
  int64_t tile = 64;
  while (tile < n && tile < 2048)
    tile *= 2;
  constexpr int64_t kPerThread = 8; // merge outputs a thread
  const uint64_t keys[2] = {b.alloc(uint64_t(n) * 8), b.alloc(uint64_t(n) * 8)};
  std::map<std::string, std::string> s = {
      {"H", num(h)}, {"N", num(n)}, {"VOCAB", num(vocab)}, {"T", num(tile)},
      {"TB", std::to_string(tile / 2)}, {"C", num(kPerThread)},
      {"TP", vp ? ", mt_u64 tp_rank" : ""},
      {"FIRST", vp ? "(long long)tp_rank * " + num(vocab) : "0ll"}};
  std::vector<std::string> scalars;
  if (vp)
    scalars.push_back("tp_rank");
  std::string sort = fill(R"(extern "C" __global__ void __launch_bounds__(${TB}) @ENTRY@(const int *ids, mt_u64 *keys${TP}) {
  extern __shared__ mt_u64 mt_keys[]; // ${T} keys
  const mt_u64 base = (mt_u64)blockIdx.x * ${T};
  for (unsigned k = threadIdx.x; k < ${T}; k += blockDim.x) {
    const mt_u64 i = base + k;
    mt_u64 key = ~0ull;
    if (i < ${N}) {
      const long long local = (long long)ids[i] - ${FIRST};
      key = ((local >= 0 && local < ${VOCAB} ? (mt_u64)local : 0xFFFFFFFFull) << 32) | i;
    }
    mt_keys[k] = key;
  }
  for (unsigned size = 2; size <= ${T}; size <<= 1)
    for (unsigned stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      const unsigned t = threadIdx.x, lo = 2 * stride * (t / stride) + t % stride, hi = lo + stride;
      const mt_u64 a = mt_keys[lo], c = mt_keys[hi];
      if ((a > c) == ((lo & size) == 0)) { mt_keys[lo] = c; mt_keys[hi] = a; }
    }
  __syncthreads();
  for (unsigned k = threadIdx.x; k < ${T}; k += blockDim.x)
    if (base + k < ${N}) keys[base + k] = mt_keys[k];
}
)",
                          s);
  b.launch("emb_sort", sort, uint64_t((n + tile - 1) / tile), uint32_t(tile / 2),
           uint32_t(tile * 8), {in(1), wsAt(keys[0])}, scalars);

  int cur = 0;
  const int64_t mergeThreads = (n + kPerThread - 1) / kPerThread;
  const uint32_t mergeBlock = uint32_t(std::min<int64_t>(256, roundWarps(mergeThreads)));
  for (int64_t w = tile; w < n; w *= 2) {
    s["W"] = num(w);
    std::string merge = fill(R"(extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const mt_u64 *src, mt_u64 *dst) {
  const long long p = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * ${C};
  if (p >= ${N}) return;
  const long long s = p / (2 * ${W}) * (2 * ${W}), d = p - s;
  const long long la = ${N} - s < ${W} ? ${N} - s : ${W};
  const long long lb = ${N} - s - la < ${W} ? ${N} - s - la : ${W};
  const mt_u64 *A = src + s, *B = src + s + la;
  // The merge path: a of the first d outputs come from A.
  long long lo = d > lb ? d - lb : 0, hi = d < la ? d : la;
  while (lo < hi) {
    const long long mid = (lo + hi) >> 1;
    if (A[mid] < B[d - mid - 1]) lo = mid + 1; else hi = mid;
  }
  long long a = lo, b = d - lo;
  for (long long q = p; q < p + ${C} && q < s + la + lb; ++q) {
    const bool fromA = a < la && (b >= lb || A[a] < B[b]);
    dst[q] = fromA ? A[a++] : B[b++];
  }
}
)",
                             s);
    b.launch("emb_merge", merge, uint64_t((mergeThreads + mergeBlock - 1) / mergeBlock),
             mergeBlock, 0, {wsAt(keys[cur]), wsAt(keys[1 - cur])});
    cur = 1 - cur;
  }

  const int v = lanesFor({dy.dtype, gradType(ins)}, {h});
  const int64_t perRow = h / v, threads = n * perRow;
  const uint32_t block = uint32_t(std::min<int64_t>(256, roundWarps(threads)));
  s["TDY"] = storage(dy.dtype);
  s["TG"] = storage(gradType(ins)); // bf16: the row's sum rounded once
  s["V"] = std::to_string(v);
  s["PER"] = num(perRow);
  s["THREADS"] = num(threads);
  s["B"] = std::to_string(block);
  std::string accum = fill(R"(extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TDY} *dy, ${TG} *grad, const mt_u64 *keys) {
  const mt_u64 t = (mt_u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= ${THREADS}) return;
  const mt_u64 p = t / ${PER}, c = (t % ${PER}) * ${V};
  const mt_u64 row = keys[p] >> 32;
  if (row == 0xFFFFFFFFull || (p > 0 && (keys[p - 1] >> 32) == row)) return;
  const mt_u64 at = row * ${H} + c;
  float acc[${V}];
  mt_load<${V}>(grad, at, acc);
  for (mt_u64 q = p; q < ${N} && (keys[q] >> 32) == row; ++q) {
    float d[${V}];
    mt_load<${V}>(dy, (keys[q] & 0xFFFFFFFFull) * ${H} + c, d);
    for (int l = 0; l < ${V}; ++l) acc[l] += d[l];
  }
  mt_store<${V}>(grad, at, acc);
}
)",
                           s);
  b.launch("emb_accum", accum, uint64_t((threads + block - 1) / block), block, 0,
           {in(0), grad(0), wsAt(keys[cur])});
}

} // namespace mt::opk
