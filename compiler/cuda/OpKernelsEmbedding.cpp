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

} // namespace mt::opk
