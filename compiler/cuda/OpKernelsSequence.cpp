// Op kernels of sequence parallelism (SEQ_ALL_GATHER, SEQ_REDUCE_SCATTER,
// SEQ_SPLIT: moving rank blocks of [b, s, ...] values) and ALL_REDUCE_TIED_GRAD.
#include "compiler/cuda/OpKernelBuilder.h"

#include <map>

namespace mt::opk {

namespace {

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

} // namespace

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
  // bf16 gradients (--grad-reduce-in-bf16) travel as bf16; the sum is
  // rounded once.
  const DType g = gradType(ins);
  std::map<std::string, std::string> s = {
      {"N", u64(n)},
      {"TG", storage(g)},
      {"ADD", g == DType::F32 ? "grad[i] += peer[i];"
                              : "{ const float sum[1] = {mt_get(grad, i) + mt_get(peer, i)}; "
                                "mt_store<1>(grad, i, sum); }"}};
  b.launch("tied_add", fill(R"(extern "C" __global__ void __launch_bounds__(256) @ENTRY@(const ${TG} *peer, ${TG} *grad) {
  const mt_u64 i = (mt_u64)blockIdx.x * 256 + threadIdx.x;
  if (i < ${N}) ${ADD}
}
)", s), (uint64_t(n) + 255) / 256, 256, 0, {wsAt(ws), grad(0)});
}

} // namespace mt::opk
