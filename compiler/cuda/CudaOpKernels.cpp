// CUDA C for plan instructions outside fused regions (see CudaOpKernels.h):
// the operand checks and which generator runs for which opcode. The
// generators live in OpKernels<Family>.cpp, their shared pieces in
// OpKernelBuilder.h: each kernel is a fixed body specialised by constants
// (shapes, dtypes, floats), after CudaKernelGen's prelude and the reductions.
#include "compiler/cuda/CudaOpKernels.h"
#include "compiler/cuda/OpKernelBuilder.h"

#include <algorithm>

namespace mt {

using namespace opk;

namespace {

// ---------------------------------------------------------------------------
// Operand checks: the counts of the opcode's signature (plan.fbs).

struct Signature {
  size_t in, out, params, ints, floats;
};

std::optional<Signature> signatureOf(Opcode op) {
  switch (op) {
  case Opcode::POSITION_IDS: return Signature{0, 1, 0, 0, 0};
  case Opcode::EMBEDDING: return Signature{2, 1, 0, 1, 0};
  case Opcode::LAYER_NORM: return Signature{3, 1, 0, 0, 2};
  case Opcode::RMS_NORM: return Signature{2, 1, 0, 0, 2};
  case Opcode::BIAS_ADD: return Signature{2, 1, 0, 0, 0};
  case Opcode::ADD: return Signature{2, 1, 0, 0, 0};
  case Opcode::GELU: return Signature{1, 1, 0, 1, 0};
  case Opcode::SWIGLU: return Signature{1, 1, 0, 0, 0};
  case Opcode::DROPOUT: return Signature{1, 1, 0, 2, 1};
  case Opcode::RESHAPE: return Signature{1, 1, 0, 0, 0};
  case Opcode::SPLIT_QKV: return Signature{1, 3, 0, 0, 0};
  case Opcode::ROPE: return Signature{1, 1, 0, 0, 2};
  case Opcode::CROSS_ENTROPY: return Signature{2, 1, 0, 1, 0};
  case Opcode::GRAD_SEED: return Signature{0, 1, 0, 0, 1};
  case Opcode::EMBEDDING_GRAD: return Signature{2, 0, 1, 1, 0};
  case Opcode::BIAS_GRAD: return Signature{1, 0, 1, 0, 0};
  case Opcode::LAYER_NORM_GRAD: return Signature{3, 1, 2, 0, 2};
  case Opcode::RMS_NORM_GRAD: return Signature{3, 1, 1, 0, 2};
  case Opcode::GELU_GRAD: return Signature{2, 1, 0, 1, 0};
  case Opcode::SWIGLU_GRAD: return Signature{2, 1, 0, 0, 0};
  case Opcode::SPLIT_QKV_GRAD: return Signature{3, 1, 0, 0, 0};
  case Opcode::ROPE_GRAD: return Signature{1, 1, 0, 0, 2};
  case Opcode::CROSS_ENTROPY_GRAD: return Signature{3, 1, 0, 1, 0};
  case Opcode::LR_SCHEDULE: return Signature{1, 1, 0, 6, 2};
  case Opcode::CLIP_COEFF: return Signature{2, 1, 0, 0, 1};
  case Opcode::ADAMW: return Signature{3, 0, 1, 0, 4};
  case Opcode::SHARDED_ADAMW: return Signature{4, 0, SIZE_MAX, 1, 4};
  case Opcode::SGD: return Signature{2, 0, 1, 0, 2};
  case Opcode::SHARDED_SGD: return Signature{3, 0, SIZE_MAX, 1, 2};
  case Opcode::GRAD_NORM: return Signature{0, 1, SIZE_MAX, 0, 0};
  case Opcode::GROUP_GRAD_NORM: return Signature{0, 1, SIZE_MAX, 1, 0};
  case Opcode::SPLIT_QKV_ROPE: return Signature{1, 3, 0, 0, 2};
  case Opcode::SPLIT_QKV_ROPE_GRAD: return Signature{3, 1, 0, 0, 2};
  case Opcode::SHARDED_GRAD_NORM: return Signature{0, 1, SIZE_MAX, 1, 0};
  case Opcode::SEQ_ALL_GATHER:
  case Opcode::SEQ_REDUCE_SCATTER:
  case Opcode::SEQ_SPLIT: return Signature{1, 1, 0, 1, 0};
  case Opcode::ALL_REDUCE_TIED_GRAD: return Signature{0, 0, 1, 2, 0};
  case Opcode::MOE_ROUTER: return Signature{1, 4, 0, 10, 3};
  case Opcode::MOE_ROUTER_GRAD: return Signature{5, 1, 0, 10, 3};
  case Opcode::MOE_PERMUTE: return Signature{2, 3, 0, 2, 0};
  case Opcode::MOE_PERMUTE_GRAD: return Signature{2, 1, 0, 0, 0};
  case Opcode::GROUPED_MATMUL:
  case Opcode::GROUPED_MATMUL_INPUT_GRAD: return Signature{3, 1, 0, 0, 0};
  case Opcode::GROUPED_MATMUL_WEIGHT_GRAD: return Signature{3, 0, 1, 0, 0};
  case Opcode::MOE_UNPERMUTE: return Signature{4, 1, 0, 0, 0};
  case Opcode::MOE_UNPERMUTE_GRAD: return Signature{5, 2, 0, 0, 0};
  default: return std::nullopt;
  }
}

StateTensor adamTensor(const OpParam &p, double weightDecay) {
  StateTensor t;
  t.weight = p.weightOffset;
  t.grad = p.gradOffset;
  t.master = p.masterOffset;
  t.m = p.expAvgOffset;
  t.v = p.expAvgSqOffset;
  t.dtype = p.dtype;
  t.gradDtype = p.gradDtype;
  t.weightDecay = weightDecay;
  t.count = 1;
  for (int64_t d : p.shape)
    t.count *= d;
  return t;
}

// The shard's parts of the parameters, offsets advanced to the segment.
// Rank r's owned segments as AdamW/norm tensors (OpInstruction::rankSegments).
std::vector<std::vector<StateTensor>> shardTensors(const OpInstruction &ins, double weightDecay,
                                                   bool normOnly, std::string *error,
                                                   bool expertSegments = false) {
  std::vector<std::vector<StateTensor>> out;
  for (const std::vector<OpSegment> &segments :
       expertSegments ? ins.expertRankSegments : ins.rankSegments) {
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
      t.decoupledLr = p.decoupledLr && !normOnly;
      t.count = g.count;
      t.weight = p.weightOffset + g.paramBegin * bytesOf(p.dtype);
      t.grad = p.gradOffset + g.paramBegin * bytesOf(p.gradDtype);
      t.master = ins.shardMasterOffset >= 0 ? ins.shardMasterOffset + g.stateIndex * 4 : -1;
      t.m = ins.shardExpAvgOffset + g.stateIndex * 4;
      t.v = ins.shardExpAvgSqOffset >= 0 ? ins.shardExpAvgSqOffset + g.stateIndex * 4 : -1;
      t.replicated = !p.expert && p.replicated && ins.tensorParallel > 1;
      t.expert = p.expert;
      out.back().push_back(t);
    }
  }
  if (out.empty())
    *error = "no data-parallel rank's segments";
  return out;
}

// The rank index of a SHARDED_ADAMW / _SGD's tables.
RankIndex expertIndex(const OpInstruction &ins) {
  RankIndex index;
  if (ins.expertRanks) {
    index.tp = std::max<int64_t>(ins.tensorParallel, 1);
    index.ep = std::max<int64_t>(ins.expertParallel, 1);
  }
  return index;
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
  case Opcode::MOE_ROUTER:
  case Opcode::MOE_ROUTER_GRAD:
  case Opcode::MOE_PERMUTE:
  case Opcode::MOE_PERMUTE_GRAD:
  case Opcode::GROUPED_MATMUL:
  case Opcode::GROUPED_MATMUL_INPUT_GRAD:
  case Opcode::GROUPED_MATMUL_WEIGHT_GRAD:
  case Opcode::MOE_UNPERMUTE:
  case Opcode::MOE_UNPERMUTE_GRAD: {
    const bool ok = ins.op == Opcode::MOE_ROUTER || ins.op == Opcode::MOE_ROUTER_GRAD
                        ? genMoeRouter(ins, b, ins.op == Opcode::MOE_ROUTER_GRAD, error)
                    : ins.op == Opcode::MOE_PERMUTE      ? genMoePermute(ins, b, error)
                    : ins.op == Opcode::MOE_PERMUTE_GRAD ? genMoePermuteGrad(ins, b, error)
                    : ins.op == Opcode::MOE_UNPERMUTE    ? genMoeUnpermute(ins, b, error)
                    : ins.op == Opcode::MOE_UNPERMUTE_GRAD ? genMoeUnpermuteGrad(ins, b, error)
                                                           : genGroupedMatmul(ins, b, error);
    if (!ok)
      return std::nullopt;
    break;
  }
  case Opcode::ADAMW:
    return generateAdamWGroup({ins}, error);
  case Opcode::SHARDED_ADAMW: {
    std::string e;
    std::vector<std::vector<StateTensor>> t = shardTensors(ins, ins.floats.at(3), false, &e);
    if (!e.empty() && (*error = label(ins) + ": " + e, true))
      return std::nullopt;
    genAdamW(t, ins.floats, b, expertIndex(ins));
    break;
  }
  case Opcode::SGD:
    return generateSgdGroup({ins}, error);
  case Opcode::SHARDED_SGD: {
    std::string e;
    std::vector<std::vector<StateTensor>> t = shardTensors(ins, ins.floats.at(1), false, &e);
    if (!e.empty() && (*error = label(ins) + ": " + e, true))
      return std::nullopt;
    genSgd(t, ins.floats, b, expertIndex(ins));
    break;
  }
  case Opcode::GRAD_NORM:
  case Opcode::GROUP_GRAD_NORM: {
    std::vector<StateTensor> t, experts;
    for (const OpParam &p : ins.params)
      if (p.countsInNorm && p.gradOffset >= 0) {
        (p.expert ? experts : t).push_back(adamTensor(p, 0));
        (p.expert ? experts : t).back().replicated = !p.expert && p.replicated &&
                                                     ins.tensorParallel > 1;
      }
    const int64_t group = ins.op == Opcode::GRAD_NORM ? 3 : ins.ints.at(0);
    if (experts.empty())
      genNorm2({t}, {group}, b);
    else // every expert parameter a rank holds counts there, over tp_ep_pp
      genNorm2Split({t}, {group}, {experts}, {8}, b);
    break;
  }
  case Opcode::SHARDED_GRAD_NORM: {
    std::string e;
    std::vector<std::vector<StateTensor>> t = shardTensors(ins, 0, true, &e);
    if (!e.empty() && (*error = label(ins) + ": " + e, true))
      return std::nullopt;
    // Expert shards apart: by expt_dp rank, over expt_dp then tp_ep_pp.
    if (!ins.expertRankSegments.empty()) {
      std::vector<std::vector<StateTensor>> experts = shardTensors(ins, 0, true, &e, true);
      if (!e.empty() && (*error = label(ins) + ": " + e, true))
        return std::nullopt;
      RankIndex index;
      index.tp = std::max<int64_t>(ins.tensorParallel, 1);
      index.ep = std::max<int64_t>(ins.expertParallel, 1);
      genNorm2Split(t, {ins.ints.at(0), 3}, experts, {6, 8}, b, index);
    } else {
      genNorm2(t, {ins.ints.at(0), 3}, b);
    }
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

std::optional<OpKernels> generateGradAccumulate(int64_t count, plan::DType grad,
                                                std::string *error) {
  if (count < 1) {
    *error = "a gradient accumulation of " + std::to_string(count) + " values";
    return std::nullopt;
  }
  Builder b("GRAD_ACCUMULATE");
  const uint64_t ws = b.alloc(uint64_t(count) * 4);
  genColSums(b, ws, 1, count, 1, grad);
  return b.finish(error);
}

std::optional<OpKernels> generateGradScale(const std::vector<int64_t> &counts, DType dtype,
                                           double scale, std::string *error) {
  if (counts.empty()) {
    *error = "a gradient scale of no gradients";
    return std::nullopt;
  }
  if (!(scale > 0.0)) {
    *error = "a gradient scale of " + dbl(scale);
    return std::nullopt;
  }
  Builder b("GRAD_SCALE");
  const std::string tg = storage(dtype);
  // The CPU executor multiplies by float(scale).
  const std::string factor = flt(double(float(scale)));
  for (size_t k = 0; k < counts.size(); ++k) {
    if (counts[k] < 1) {
      *error = "a gradient scale of " + std::to_string(counts[k]) + " values";
      return std::nullopt;
    }
    const int v = lanesFor({dtype}, {counts[k]});
    elementwise(b, "grad_scale", tg + " *g", "g",
                "  float a[V];\n  mt_load<V>(g, i, a);\n"
                "  for (int l = 0; l < V; ++l) a[l] *= " + factor + ";\n"
                "  mt_store<V>(g, i, a);\n",
                counts[k], v, {grad(k)});
  }
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

std::optional<OpKernels> generateSgdGroup(const std::vector<OpInstruction> &group,
                                          std::string *error) {
  if (group.empty()) {
    *error = "an empty SGD group";
    return std::nullopt;
  }
  std::vector<StateTensor> tensors;
  for (const OpInstruction &ins : group) {
    if (ins.op != Opcode::SGD || ins.in.size() != 2 || ins.params.size() != 1 ||
        ins.floats.size() != 2) {
      *error = "an SGD group holds SGD instructions of one parameter and two floats";
      return std::nullopt;
    }
    // The momentum is the launch's; the weight decay is per tensor.
    if (ins.floats[0] != group[0].floats[0]) {
      *error = "the instructions of an SGD group differ in momentum";
      return std::nullopt;
    }
    const OpParam &p = ins.params[0];
    if (p.weightOffset < 0 || p.gradOffset < 0 || p.expAvgOffset < 0) {
      *error = "SGD needs the parameter's weight, gradient and momentum buffer offsets";
      return std::nullopt;
    }
    tensors.push_back(adamTensor(p, ins.floats[1]));
  }
  Builder b("SGD x" + std::to_string(group.size()));
  genSgd({tensors}, group[0].floats, b);
  return b.finish(error);
}

} // namespace mt
