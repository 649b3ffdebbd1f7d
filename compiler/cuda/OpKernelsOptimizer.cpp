// Op kernels of the optimizer and its scalars: multi-tensor AdamW and SGD
// (also sharded), gradient norms, LR_SCHEDULE, CLIP_COEFF, GRAD_SEED.
#include "compiler/cuda/OpKernelBuilder.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace mt::opk {

constexpr int64_t kChunk = 4096; // elements per block: 256 threads x 4 lanes x 4

// Blocks of tensor t start at table entry `first`; the search finds the
// last entry with first <= the chunk.
constexpr const char *kFindTensor = R"(  int lo = ${LO}, hi = ${HI};
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (mt_tensors[mid].first <= chunk) lo = mid; else hi = mid - 1;
  }
)";

namespace {

// The storage type of the tensors' gradients: a rank's gradients share one
// (f32, or bf16 with --grad-reduce-in-bf16, widened to f32 as they are read).
std::string gradStorage(const std::vector<std::vector<StateTensor>> &byRank) {
  for (const std::vector<StateTensor> &tensors : byRank)
    for (const StateTensor &t : tensors)
      return storage(t.gradDtype);
  return storage(DType::F32);
}

// The distributed optimizer: every data-parallel rank's tensors in one
// table, rank r's entries from mt_rank_entry[r], its chunks counted from 0
// (mt_rank_chunks[r]); the kernel takes dp_rank, so one source serves every
// rank of the shared program. One rank: no rank tables, no argument.
struct RankTables {
  explicit RankTables(const RankIndex &i = {}) : index(i) {}
  RankIndex index;
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
    const std::string r = rank();
    s["LO"] = "mt_rank_entry[" + r + "]";
    s["HI"] = "mt_rank_entry[" + r + " + 1] - 1";
    s["DP"] = index.expert() ? ", mt_u64 mt_tp_r, mt_u64 mt_dp_r" : ", mt_u64 dp_rank";
    s["RANK_CHUNKS"] = "mt_rank_chunks[" + r + "]";
  }
  // The rank whose table the kernel reads: the dp rank, or the expt_dp
  // rank (tp_rank + tp dp_rank) / ep of an expert bucket (etp = 1).
  std::string rank() const {
    if (!index.expert())
      return "dp_rank";
    return "((mt_tp_r + " + u64(index.tp) + " * mt_dp_r) / " + u64(index.ep) + ")";
  }
  std::vector<std::string> scalars() const {
    if (!ranked())
      return {};
    if (index.expert())
      return {"tp_rank", "dp_rank"};
    return {"dp_rank"};
  }
};

} // namespace

void genAdamW(const std::vector<std::vector<StateTensor>> &byRank,
              const std::vector<double> &floats, Builder &b, const RankIndex &index) {
  std::string table;
  RankTables ranks(index);
  size_t nt = 0;
  // --decoupled-lr in a shard: a per-tensor flag picks the launch's fourth
  // input as the rate (absent otherwise, so other sources stay as they were).
  bool twoRates = false;
  for (const std::vector<StateTensor> &tensors : byRank)
    for (const StateTensor &t : tensors)
      twoRates |= t.decoupledLr;
  for (const std::vector<StateTensor> &tensors : byRank) {
    int64_t blocks = 0;
    for (const StateTensor &t : tensors) {
      const bool vec = t.weight % 16 == 0 && t.grad % 16 == 0 && t.m % 16 == 0 && t.v % 16 == 0 &&
                       (t.master < 0 || t.master % 16 == 0);
      table += "  {" + u64(t.weight) + ", " + u64(t.grad) + ", " +
               u64(t.master < 0 ? -1 : t.master) + ", " + u64(t.m) + ", " + u64(t.v) + ", " + u64(t.count) + ", " + u64(blocks) + ", " +
               dbl(t.weightDecay) + ", " +
               std::to_string(t.dtype == DType::BF16 ? 1 : t.dtype == DType::F16 ? 2 : 0) + ", " +
               (vec ? "1" : "0") + (twoRates ? (t.decoupledLr ? ", 1" : ", 0") : "") + "},\n";
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
  s["TG"] = gradStorage(byRank); // bf16 with --grad-reduce-in-bf16, read as f32
  s["LR2_FIELD"] = twoRates ? ", lr2" : "";
  s["LR2_ARG"] = twoRates ? ", const float *lr2_in" : "";
  s["LR"] = twoRates ? "(double)(t.lr2 ? lr2_in[0] : lr_in[0])" : "(double)lr_in[0]";
  s["GUARD"] = ranks.ranked()
                   ? "  if (chunk >= mt_rank_chunks[" + ranks.rank() + "]) return; // past this rank's shard\n"
                   : "";
  std::string src = fill(R"(// Byte offsets into the state buffer; master ~0: the weights are the f32 copy updated.
struct mt_adam_tensor { mt_u64 weight, grad, master, m, v, count, first; double weight_decay; int dtype, vec${LR2_FIELD}; };
__device__ const mt_adam_tensor mt_tensors[${NT}] = {
${TABLE}};
${RANKS}
// cpu::adamw_step on lanes i .. i + V - 1, in double; the weights (or the
// master copy) updated in place, a reduced-precision model copy rounded from it.
template <int V, class TW>
__device__ __forceinline__ void mt_adam(unsigned char *state, const mt_adam_tensor &t, mt_u64 i, double lr, float clip, double c1, double c2) {
  float g[V], p[V], m[V], v[V];
  float *target = (float *)(state + (t.master != ~0ull ? t.master : t.weight));
  mt_load<V>((const ${TG} *)(state + t.grad), i, g);
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
extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const float *lr_in, const float *clip_in, const long long *step_in${LR2_ARG}, unsigned char *state${DP}) {
  const long long step = step_in[0];
  if (step < 1) return;
  const mt_u64 chunk = blockIdx.x;
${GUARD}${FIND}  const mt_adam_tensor t = mt_tensors[lo];
  const double lr = ${LR};
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
  std::vector<OpArg> args = {in(0), in(1), in(2)};
  if (twoRates)
    args.push_back(in(3));
  args.push_back(state());
  b.launch("adamw", src, uint64_t(ranks.maxChunks), 256, 0, args, ranks.scalars());
}

// Multi-tensor SGD with momentum (cpu::sgd_step), laid out as genAdamW:
// one table of tensors (the momentum buffer in `m`), every data-parallel
// rank's in one source, blocks of kChunk elements.
void genSgd(const std::vector<std::vector<StateTensor>> &byRank,
            const std::vector<double> &floats, Builder &b, const RankIndex &index) {
  std::string table;
  RankTables ranks(index);
  size_t nt = 0;
  bool twoRates = false;
  for (const std::vector<StateTensor> &tensors : byRank)
    for (const StateTensor &t : tensors)
      twoRates |= t.decoupledLr;
  for (const std::vector<StateTensor> &tensors : byRank) {
    int64_t blocks = 0;
    for (const StateTensor &t : tensors) {
      const bool vec = t.weight % 16 == 0 && t.grad % 16 == 0 && t.m % 16 == 0 &&
                       (t.master < 0 || t.master % 16 == 0);
      table += "  {" + u64(t.weight) + ", " + u64(t.grad) + ", " +
               u64(t.master < 0 ? -1 : t.master) + ", " + u64(t.m) + ", " + u64(t.count) +
               ", " + u64(blocks) + ", " + dbl(t.weightDecay) + ", " +
               std::to_string(t.dtype == DType::BF16 ? 1 : t.dtype == DType::F16 ? 2 : 0) + ", " +
               (vec ? "1" : "0") + (twoRates ? (t.decoupledLr ? ", 1" : ", 0") : "") + "},\n";
      blocks += (t.count + kChunk - 1) / kChunk;
    }
    nt += tensors.size();
    ranks.add(nt, blocks);
  }
  if (ranks.maxChunks == 0)
    return;
  std::map<std::string, std::string> s = {
      {"NT", std::to_string(nt)}, {"TABLE", table}, {"CHUNK", num(kChunk)},
      {"MOM", dbl(floats.at(0))}};
  ranks.fill(s);
  s["FIND"] = fill(kFindTensor, s);
  s["TG"] = gradStorage(byRank); // bf16 with --grad-reduce-in-bf16, read as f32
  s["LR2_FIELD"] = twoRates ? ", lr2" : "";
  s["LR2_ARG"] = twoRates ? ", const float *lr2_in" : "";
  s["LR"] = twoRates ? "(double)(t.lr2 ? lr2_in[0] : lr_in[0])" : "(double)lr_in[0]";
  s["GUARD"] = ranks.ranked()
                   ? "  if (chunk >= mt_rank_chunks[" + ranks.rank() + "]) return; // past this rank's shard\n"
                   : "";
  std::string src = fill(R"(// Byte offsets into the state buffer; master ~0: the weights are the f32 copy updated.
struct mt_sgd_tensor { mt_u64 weight, grad, master, buf, count, first; double weight_decay; int dtype, vec${LR2_FIELD}; };
__device__ const mt_sgd_tensor mt_tensors[${NT}] = {
${TABLE}};
${RANKS}
// cpu::sgd_step on lanes i .. i + V - 1, in double; the weights (or the
// master copy) updated in place, a reduced-precision model copy rounded from it.
template <int V, class TW>
__device__ __forceinline__ void mt_sgd(unsigned char *state, const mt_sgd_tensor &t, mt_u64 i, double lr, float clip) {
  float g[V], p[V], m[V];
  float *target = (float *)(state + (t.master != ~0ull ? t.master : t.weight));
  mt_load<V>((const ${TG} *)(state + t.grad), i, g);
  mt_load<V>(target, i, p);
  mt_load<V>((const float *)(state + t.buf), i, m);
#pragma unroll
  for (int l = 0; l < V; ++l) {
    const double d = (double)(g[l] * clip) + t.weight_decay * p[l];
    const double bi = ${MOM} * m[l] + d;
    p[l] = (float)(p[l] - lr * bi);
    m[l] = (float)bi;
  }
  mt_store<V>(target, i, p);
  mt_store<V>((float *)(state + t.buf), i, m);
  if (t.master != ~0ull) mt_store<V>((TW *)(state + t.weight), i, p);
}
template <int V>
__device__ __forceinline__ void mt_sgd_any(unsigned char *state, const mt_sgd_tensor &t, mt_u64 i, double lr, float clip) {
  if (t.dtype == 1) mt_sgd<V, mt_bf16>(state, t, i, lr, clip);
  else if (t.dtype == 2) mt_sgd<V, mt_f16>(state, t, i, lr, clip);
  else mt_sgd<V, float>(state, t, i, lr, clip);
}

// Block b updates chunk b - first of its tensor.
extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const float *lr_in, const float *clip_in${LR2_ARG}, unsigned char *state${DP}) {
  const mt_u64 chunk = blockIdx.x;
${GUARD}${FIND}  const mt_sgd_tensor t = mt_tensors[lo];
  const double lr = ${LR};
  const float clip = clip_in[0];
  const mt_u64 begin = (chunk - t.first) * ${CHUNK};
  const mt_u64 end = begin + ${CHUNK} < t.count ? begin + ${CHUNK} : t.count;
  for (mt_u64 i = begin + threadIdx.x * 4; i < end; i += blockDim.x * 4) {
    if (t.vec && i + 4 <= end) mt_sgd_any<4>(state, t, i, lr, clip);
    else for (mt_u64 e = i; e < end && e < i + 4; ++e) mt_sgd_any<1>(state, t, e, lr, clip);
  }
}
)",
                         s);
  std::vector<OpArg> args = {in(0), in(1)};
  if (twoRates)
    args.push_back(in(2));
  args.push_back(state());
  b.launch("sgd", src, uint64_t(ranks.maxChunks), 256, 0, args, ranks.scalars());
}

// Gradient norms: squares of the listed f32 gradients in double, per block
// (a fixed share of chunks), the blocks' partials summed by one block into
// the workspace's f64 `total`, then the collectives over `groups`.
uint64_t genNormPart(const std::vector<std::vector<StateTensor>> &byRank,
                     const std::vector<int64_t> &groups, Builder &b, const RankIndex &index) {
  std::string table;
  RankTables ranks(index);
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
  s["TG"] = gradStorage(byRank);
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
    const ${TG} *g = (const ${TG} *)(state + t.grad);
    const mt_u64 begin = (chunk - t.first) * ${CHUNK};
    const mt_u64 end = begin + ${CHUNK} < t.count ? begin + ${CHUNK} : t.count;
    for (mt_u64 i = begin + threadIdx.x * 4; i < end; i += blockDim.x * 4) {
      if (t.vec && i + 4 <= end) {
        float a[4];
        mt_load<4>(g, i, a);
        for (int l = 0; l < 4; ++l) acc += (double)a[l] * a[l];
      } else {
        for (mt_u64 e = i; e < end && e < i + 4; ++e) acc += (double)mt_get(g, e) * mt_get(g, e);
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
  return total;
}

// The norm of one part: its squares summed over `groups`, then the root.
void genNorm2(const std::vector<std::vector<StateTensor>> &byRank,
              const std::vector<int64_t> &groups, Builder &b) {
  const uint64_t total = genNormPart(byRank, groups, b, {});
  b.launch("norm_sqrt", R"(extern "C" __global__ void __launch_bounds__(32) @ENTRY@(const double *total, float *norm) {
  if (threadIdx.x == 0) norm[0] = (float)sqrt(total[0]);
}
)", 1, 32, 0, {wsAt(total), outp(0)});
}

// The norm of two parts (dense parameters and routed experts), each's
// squares summed over its own groups, then the root of their sum.
void genNorm2Split(const std::vector<std::vector<StateTensor>> &dense,
                   const std::vector<int64_t> &denseGroups,
                   const std::vector<std::vector<StateTensor>> &experts,
                   const std::vector<int64_t> &expertGroups, Builder &b,
                   const RankIndex &expertIndex) {
  const uint64_t a = genNormPart(dense, denseGroups, b, {});
  const uint64_t e = genNormPart(experts, expertGroups, b, expertIndex);
  b.launch("norm_sqrt2", R"(extern "C" __global__ void __launch_bounds__(32) @ENTRY@(const double *dense, const double *experts, float *norm) {
  if (threadIdx.x == 0) norm[0] = (float)sqrt(dense[0] + experts[0]);
}
)", 1, 32, 0, {wsAt(a), wsAt(e), outp(0)});
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

} // namespace mt::opk
