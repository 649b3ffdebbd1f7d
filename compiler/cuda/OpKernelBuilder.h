// What the op kernel generators share (internal to compiler/cuda).
#ifndef MT_COMPILER_OPKERNELBUILDER_H
#define MT_COMPILER_OPKERNELBUILDER_H

#include "compiler/cuda/CudaOpKernels.h"

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mt::opk {

using plan::DType;
using plan::Opcode;

int bytesOf(DType d);
const char *storage(DType d);

std::string num(int64_t v);
// Exact to float (f) or double precision.
std::string flt(double v);
std::string dbl(double v);
std::string u64(int64_t v);

// Replaces every ${KEY} of `t`.
std::string fill(std::string t, const std::map<std::string, std::string> &subs);

uint32_t roundWarps(int64_t threads);

// Elements per access: 16 bytes of the widest storage type, halved until
// it divides every row length an index is reduced by.
int lanesFor(std::initializer_list<DType> types, std::initializer_list<int64_t> moduli);

// The opcode and input shapes, as messages and kernel comments name an instruction.
std::string label(const OpInstruction &ins);

// A row of h elements over a block: V lanes per access, K accesses per
// thread (lane group k of thread t at column (k * blockDim + t) * V).
struct RowShape {
  int v;
  uint32_t block;
  int k;
};
RowShape rowShape(int64_t h, int v, int64_t perThread, uint32_t maxBlock);

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
              std::vector<uint64_t> streams = {});

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

inline OpArg in(uint64_t k) { return {OpArg::In, k}; }
inline OpArg outp(uint64_t k) { return {OpArg::Out, k}; }
inline OpArg grad(uint64_t k) { return {OpArg::ParamGrad, k}; }
inline OpArg wsAt(uint64_t o) { return {OpArg::Workspace, o}; }
inline OpArg state() { return {OpArg::State, 0}; }

// The type of the gradients an instruction adds into (its first parameter's).
inline DType gradType(const OpInstruction &ins) {
  return ins.params.empty() ? DType::F32 : ins.params[0].gradDtype;
}

// The elementwise kernel: mt_body<V>(params..., i) for lanes i .. i + V - 1,
// a scalar tail when V does not divide the count.
void elementwise(Builder &b, const std::string &name, const std::string &params,
                 const std::string &callArgs, const std::string &body, int64_t n, int v,
                 std::vector<OpArg> args, std::vector<std::string> scalars = {},
                 std::vector<uint64_t> streams = {});
std::string ptr(const OpTensor &t, const std::string &name, bool isConst);

// One tensor (or part of one) of the multi-tensor kernels, byte offsets
// into the state buffer.
struct StateTensor {
  int64_t weight = -1, grad = -1, master = -1, m = -1, v = -1, count = 0;
  double weightDecay = 0;
  bool decoupledLr = false; // AdamW's second rate (the launch's fourth input)
  DType dtype = DType::F32;
  DType gradDtype = DType::F32; // the gradient's (bf16 with --grad-reduce-in-bf16)
  bool replicated = false; // the norm counts it on tp rank 0 only
  bool expert = false;     // a routed expert's (the norm sums it over its own groups)
};

// The generators of each family, in the dispatch's order of files.

// OpKernelsElementwise.cpp. genElementwise: false for an opcode it does not cover.
bool genElementwise(const OpInstruction &ins, Builder &b);
void genSplitQkv(const OpInstruction &ins, Builder &b, bool grad);
void genRope(const OpInstruction &ins, Builder &b, bool grad);
void genSplitQkvRope(const OpInstruction &ins, Builder &b, bool grad);

// OpKernelsNorms.cpp.
void genNorm(const OpInstruction &ins, Builder &b, bool layer);
void genNormGrad(const OpInstruction &ins, Builder &b, bool layer);
void genBiasGrad(const OpInstruction &ins, Builder &b);
// Also GRAD_ACCUMULATE's kernel. `grad`: the gradients' type (f32, or bf16
// with --grad-reduce-in-bf16: the sum rounded once to nearest even).
void genColSums(Builder &b, uint64_t wsAt_, int64_t blocks, int64_t h, int arrays,
                DType grad = DType::F32);

// OpKernelsEmbedding.cpp.
void genEmbedding(const OpInstruction &ins, Builder &b);
void genEmbeddingGrad(const OpInstruction &ins, Builder &b);

// OpKernelsCrossEntropy.cpp.
void genCrossEntropy(const OpInstruction &ins, Builder &b, bool gradient);

// Which rank's table of a sharded kernel a rank reads: its dp rank, or
// (ep > 0: an expert bucket sharded over expt_dp, etp = 1) its expt_dp rank
// (tp_rank + tp dp_rank) / ep, from the kernel's tp_rank and dp_rank.
struct RankIndex {
  int64_t tp = 1, ep = 0;
  bool expert() const { return ep > 0; }
};

// OpKernelsOptimizer.cpp. byRank: each data-parallel rank's tensors (one
// entry: no rank tables); groups: the norm's all-reduce groups in order.
void genAdamW(const std::vector<std::vector<StateTensor>> &byRank,
              const std::vector<double> &floats, Builder &b, const RankIndex &index = {});
void genSgd(const std::vector<std::vector<StateTensor>> &byRank,
            const std::vector<double> &floats, Builder &b, const RankIndex &index = {});
void genNorm2(const std::vector<std::vector<StateTensor>> &byRank,
              const std::vector<int64_t> &groups, Builder &b);
// The routed experts' squares apart (plan.fbs Param.expert): the dense
// part summed over denseGroups, the experts' over expertGroups.
void genNorm2Split(const std::vector<std::vector<StateTensor>> &dense,
                   const std::vector<int64_t> &denseGroups,
                   const std::vector<std::vector<StateTensor>> &experts,
                   const std::vector<int64_t> &expertGroups, Builder &b,
                   const RankIndex &expertIndex = {});
void genLrSchedule(const OpInstruction &ins, Builder &b);
void genClipCoeff(const OpInstruction &ins, Builder &b);
void genGradSeed(const OpInstruction &ins, Builder &b);

// OpKernelsSequence.cpp. genSequence: false with `error` set for operands
// that are not [b, s, ...] sequence shards.
bool genSequence(const OpInstruction &ins, Builder &b, std::string *error);
void genTiedGrad(const OpInstruction &ins, Builder &b);

// OpKernelsMoe.cpp: false with `error` set for operands that do not have
// the shapes the opcode's signature (plan.fbs) describes.
bool genMoeRouter(const OpInstruction &ins, Builder &b, bool grad, std::string *error);
bool genMoePermute(const OpInstruction &ins, Builder &b, std::string *error);
bool genMoePermuteGrad(const OpInstruction &ins, Builder &b, std::string *error);
bool genMoeUnpermute(const OpInstruction &ins, Builder &b, std::string *error);
bool genMoeUnpermuteGrad(const OpInstruction &ins, Builder &b, std::string *error);
bool genGroupedMatmul(const OpInstruction &ins, Builder &b, std::string *error);

} // namespace mt::opk

#endif // MT_COMPILER_OPKERNELBUILDER_H
