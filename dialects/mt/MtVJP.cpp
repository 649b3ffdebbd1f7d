// Vector-Jacobian products of the model-graph ops (DifferentiableOpInterface),
// the rules mt-autodiff composes into the backward graph.
#include "dialects/mt/MtOps.h"

#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace mt;

#include "dialects/mt/MtInterfaces.cpp.inc"

namespace {
// The parameter a weight operand reads, or null when it is not a parameter.
FlatSymbolRefAttr paramOf(Value v) {
  if (auto ref = v.getDefiningOp<ParamRefOp>())
    return ref.getNameAttr();
  return {};
}

// Weights must be parameters: their gradients go straight into the
// parameter's gradient buffer instead of flowing as values.
LogicalResult needParam(Operation *op, Value v, StringRef what,
                        FlatSymbolRefAttr &sym) {
  sym = paramOf(v);
  if (!sym)
    return op->emitOpError() << "cannot differentiate: its " << what
                             << " is not read from an mt.param";
  return success();
}
} // namespace

LogicalResult EmbeddingOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                    SmallVectorImpl<Value> &out) {
  FlatSymbolRefAttr table;
  if (failed(needParam(*this, getTable(), "table", table)))
    return failure();
  b.create<EmbeddingGradOp>(getLoc(), grads[0], getIds(), table, getVocabParallelAttr());
  out.append({Value(), Value()});
  return success();
}

LogicalResult LayerNormOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                    SmallVectorImpl<Value> &out) {
  FlatSymbolRefAttr w, bias;
  if (failed(needParam(*this, getWeight(), "weight", w)) ||
      failed(needParam(*this, getBias(), "bias", bias)))
    return failure();
  Value dx = b.create<LayerNormGradOp>(getLoc(), getType(), grads[0], getInput(),
                                       getWeight(), w, bias, getEpsilonAttr(),
                                       getZeroCenteredGammaAttr());
  out.append({dx, Value(), Value()});
  return success();
}

LogicalResult RMSNormOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                  SmallVectorImpl<Value> &out) {
  FlatSymbolRefAttr w;
  if (failed(needParam(*this, getWeight(), "weight", w)))
    return failure();
  Value dx = b.create<RMSNormGradOp>(getLoc(), getType(), grads[0], getInput(),
                                     getWeight(), w, getEpsilonAttr(),
                                     getZeroCenteredGammaAttr());
  out.append({dx, Value()});
  return success();
}

LogicalResult MatmulOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                 SmallVectorImpl<Value> &out) {
  FlatSymbolRefAttr w;
  if (failed(needParam(*this, getWeight(), "weight", w)))
    return failure();
  Value dx = b.create<MatmulInputGradOp>(getLoc(), getInput().getType(), grads[0],
                                         getWeight());
  b.create<MatmulWeightGradOp>(getLoc(), grads[0], getInput(), w);
  out.append({dx, Value()});
  return success();
}

LogicalResult BiasAddOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                  SmallVectorImpl<Value> &out) {
  FlatSymbolRefAttr bias;
  if (failed(needParam(*this, getBias(), "bias", bias)))
    return failure();
  b.create<BiasGradOp>(getLoc(), grads[0], bias);
  out.append({grads[0], Value()});
  return success();
}

LogicalResult AddOp::buildVJP(OpBuilder &, ArrayRef<Value> grads,
                              SmallVectorImpl<Value> &out) {
  out.append({grads[0], grads[0]});
  return success();
}

LogicalResult GeluOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                               SmallVectorImpl<Value> &out) {
  out.push_back(b.create<GeluGradOp>(getLoc(), getType(), grads[0], getInput(),
                                     getApproximationAttr()));
  return success();
}

LogicalResult SwiGLUOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                 SmallVectorImpl<Value> &out) {
  out.push_back(b.create<SwiGLUGradOp>(getLoc(), getInput().getType(), grads[0],
                                       getInput()));
  return success();
}

// The mask is a function of (seed, stream, call), so applying the same
// dropout to the gradient multiplies by exactly the forward's mask / (1 - p).
LogicalResult DropoutOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                  SmallVectorImpl<Value> &out) {
  out.push_back(b.create<DropoutOp>(getLoc(), getType(), grads[0], getRateAttr(),
                                    getStreamAttr(), getTpShardDimAttr()));
  return success();
}

LogicalResult ReshapeOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                  SmallVectorImpl<Value> &out) {
  out.push_back(b.create<ReshapeOp>(getLoc(), getInput().getType(), grads[0]));
  return success();
}

LogicalResult SplitQKVOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                   SmallVectorImpl<Value> &out) {
  if (!grads[0] || !grads[1] || !grads[2])
    return emitOpError("cannot differentiate: query, key and value must all reach the loss");
  // Rotated queries and keys: their gradients are rotated back in the merge.
  out.push_back(b.create<SplitQKVGradOp>(getLoc(), getInput().getType(), grads[0],
                                         grads[1], grads[2], getRopeBaseAttr(),
                                         getRopeScalingFactorAttr()));
  return success();
}

LogicalResult RopeOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                               SmallVectorImpl<Value> &out) {
  out.push_back(
      b.create<RopeGradOp>(getLoc(), getType(), grads[0], getBaseAttr(), getScalingFactorAttr()));
  return success();
}

LogicalResult AttentionOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                    SmallVectorImpl<Value> &out) {
  auto g = b.create<AttentionGradOp>(
      getLoc(), TypeRange{getQuery().getType(), getKey().getType(), getValue().getType()},
      grads[0], getQuery(), getKey(), getValue(), getResult(), getLse(), getCausalAttr(),
      getScaleAttr(), getDropoutRateAttr(), getStreamAttr(), getTpShardDimAttr());
  out.append({g.getQueryGrad(), g.getKeyGrad(), g.getValueGrad()});
  return success();
}

LogicalResult CrossEntropyOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                       SmallVectorImpl<Value> &out) {
  out.push_back(b.create<CrossEntropyGradOp>(getLoc(), getLogits().getType(), getLogits(),
                                             getLabels(), grads[0], getVocabParallelAttr()));
  out.push_back(Value());
  return success();
}

// The conjugate pairs of tensor and sequence parallelism (Megatron's
// mappings.py): each op's gradient is its partner applied to the gradient.
LogicalResult TpCopyOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                 SmallVectorImpl<Value> &out) {
  out.push_back(b.create<TpAllReduceOp>(getLoc(), getType(), grads[0], getTpSizeAttr()));
  return success();
}

LogicalResult TpAllReduceOp::buildVJP(OpBuilder &, ArrayRef<Value> grads,
                                      SmallVectorImpl<Value> &out) {
  out.push_back(grads[0]);
  return success();
}

LogicalResult SpGatherOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                   SmallVectorImpl<Value> &out) {
  out.push_back(b.create<SpReduceScatterOp>(getLoc(), getInput().getType(), grads[0],
                                            getTpSizeAttr()));
  return success();
}

LogicalResult SpReduceScatterOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                          SmallVectorImpl<Value> &out) {
  out.push_back(
      b.create<SpGatherOp>(getLoc(), getInput().getType(), grads[0], getTpSizeAttr()));
  return success();
}

LogicalResult SpSplitOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                  SmallVectorImpl<Value> &out) {
  out.push_back(
      b.create<SpGatherOp>(getLoc(), getInput().getType(), grads[0], getTpSizeAttr()));
  return success();
}

// Expert parallelism's pair: the rows' gradient returns the way the rows
// came. The counts and the layout are integers, without a gradient.
LogicalResult MoeDispatchOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                      SmallVectorImpl<Value> &out) {
  out.push_back(grads[0] ? b.create<MoeCombineOp>(getLoc(), getInput().getType(), grads[0],
                                                  getLayout(), getTokensPerExpert(),
                                                  getEpSizeAttr(), getNumLocalExpertsAttr(),
                                                  getDispatcherAttr(), getEtpSizeAttr())
                               .getResult()
                         : Value());
  out.push_back(Value());
  return success();
}

LogicalResult MoeCombineOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                     SmallVectorImpl<Value> &out) {
  Value rows;
  if (grads[0]) {
    auto d = b.create<MoeDispatchOp>(
        getLoc(), TypeRange{getInput().getType(), getLayout().getType().clone(
                                                      {getNumLocalExpertsAttr().getInt()}),
                            getLayout().getType()},
        grads[0], getTokensPerExpert(), getEpSizeAttr(), getNumLocalExpertsAttr(),
        getDispatcherAttr(), getEtpSizeAttr());
    rows = d.getResult();
  }
  out.append({rows, Value(), Value()});
  return success();
}

// Pipeline boundaries: the gradient travels back the way the value came.
LogicalResult SendOp::buildVJP(OpBuilder &b, ArrayRef<Value>, SmallVectorImpl<Value> &out) {
  Value g = b.create<RecvOp>(getLoc(), getInput().getType(), getPeerAttr(),
                             b.getI64IntegerAttr(getTag() + 1));
  out.push_back(g);
  return success();
}

LogicalResult RecvOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                               SmallVectorImpl<Value> &) {
  if (grads[0])
    b.create<SendOp>(getLoc(), grads[0], getPeerAttr(), b.getI64IntegerAttr(getTag() + 1));
  return success();
}

// Mixture of experts. The router's auxiliary losses get their gradient
// inside mt.moe_router_grad, scaled by the step's gradient seed (Megatron's
// MoEAuxLossAutoScaler), so the logged aux_loss and z_loss results need no
// gradient of their own.
LogicalResult MoeRouterOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                    SmallVectorImpl<Value> &out) {
  if (!grads[0])
    return emitOpError("cannot differentiate: its probs do not reach the loss");
  GradSeedOp seed;
  for (Operation &op : *b.getInsertionBlock())
    if ((seed = dyn_cast<GradSeedOp>(op)))
      break;
  if (!seed)
    return emitOpError("cannot differentiate: the backward has no mt.grad_seed to scale "
                       "the auxiliary losses by");
  // The router's own copy of the seed: it belongs to this layer's backward
  // (and pipeline chunk), so a stage without the loss needs no value from
  // another segment, and the step's first seed still marks where the
  // backward begins.
  Value scale = b.create<GradSeedOp>(getLoc(), seed.getType(), seed.getScaleAttr());
  out.push_back(b.create<MoeRouterGradOp>(
      getLoc(), getLogits().getType(), grads[0], getLogits(), getProbs(), getRoutingMap(),
      scale, getTopkAttr(), getScoreFunctionAttr(), getPreSoftmaxAttr(),
      getScalingFactorAttr(), getLoadBalancingAttr(), getAuxLossCoeffAttr(),
      getZLossCoeffAttr(), getCapacityAttr(), getDropPolicyAttr(), getPadToCapacityAttr(),
      getSeqLengthAttr(), getRouterDtypeAttr(), getCountGroupAttr()));
  return success();
}

LogicalResult MoePermuteOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                     SmallVectorImpl<Value> &out) {
  out.push_back(grads[0] ? b.create<MoePermuteGradOp>(getLoc(), getInput().getType(),
                                                      grads[0], getRowIds())
                               .getResult()
                         : Value());
  out.push_back(Value());
  return success();
}

LogicalResult MoeGroupedMatmulOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                           SmallVectorImpl<Value> &out) {
  FlatSymbolRefAttr w;
  if (failed(needParam(*this, getWeight(), "weight", w)))
    return failure();
  Value dx = b.create<MoeGroupedMatmulInputGradOp>(getLoc(), getInput().getType(), grads[0],
                                                   getWeight(), getTokensPerExpert());
  b.create<MoeGroupedMatmulWeightGradOp>(getLoc(), grads[0], getInput(),
                                         getTokensPerExpert(), w);
  out.append({dx, Value(), Value()});
  return success();
}

LogicalResult MoeUnpermuteOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads,
                                       SmallVectorImpl<Value> &out) {
  auto g = b.create<MoeUnpermuteGradOp>(
      getLoc(), TypeRange{getInput().getType(), getProbs().getType()}, grads[0], getInput(),
      getProbs(), getRowIds(), getTokensPerExpert());
  out.append({g.getInputGrad(), g.getProbsGrad(), Value(), Value()});
  return success();
}
