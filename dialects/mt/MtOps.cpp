// Verifiers of the mt dialect's operations: every shape and type invariant
// that later passes and the runtime rely on is checked here.
#include "dialects/mt/MtOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"

#include <cmath>

using namespace mlir;
using namespace mt;

#include "dialects/mt/MtEnums.cpp.inc"

#define GET_OP_CLASSES
#include "dialects/mt/MtOps.cpp.inc"

namespace {
RankedTensorType tensorOf(Value v) { return cast<RankedTensorType>(v.getType()); }

std::string shapeStr(ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (auto [i, d] : llvm::enumerate(shape)) {
    if (i)
      s += ", ";
    s += std::to_string(d);
  }
  return s + "]";
}

// A per-feature vector (norm weight, bias) must match the input's last dim.
LogicalResult verifyFeatureVector(Operation *op, StringRef what, Value input,
                                  Value vec) {
  RankedTensorType in = tensorOf(input), v = tensorOf(vec);
  if (v.getRank() != 1)
    return op->emitOpError() << what << " must be rank 1, got "
                             << shapeStr(v.getShape());
  if (in.getRank() < 1 || v.getDimSize(0) != in.getShape().back())
    return op->emitOpError() << what << " has " << v.getDimSize(0)
                             << " elements but the input's last dimension is "
                             << (in.getRank() ? in.getShape().back() : 0);
  if (v.getElementType() != in.getElementType())
    return op->emitOpError() << what << " element type " << v.getElementType()
                             << " differs from the input's " << in.getElementType();
  return success();
}

LogicalResult verifyRate(Operation *op, StringRef name, double rate) {
  if (!(rate >= 0.0 && rate < 1.0))
    return op->emitOpError() << name << " must be in [0, 1), got " << rate;
  return success();
}
} // namespace

LogicalResult ParamOp::verify() {
  auto type = dyn_cast<RankedTensorType>(getType());
  if (!type)
    return emitOpError("type must be a ranked tensor");
  if (type.getNumElements() == 0)
    return emitOpError("parameter has no elements");
  FloatAttr stdAttr = getStdAttr();
  if (getInit() == InitKind::Normal) {
    if (!stdAttr)
      return emitOpError("normal initialisation needs a standard deviation");
    double std = stdAttr.getValueAsDouble();
    if (!(std > 0.0) || !std::isfinite(std))
      return emitOpError() << "standard deviation must be positive and finite, got "
                           << std;
  } else if (stdAttr) {
    return emitOpError() << stringifyInitKind(getInit())
                         << " initialisation takes no standard deviation";
  }
  if (getTpDim() || getTpSize() || getTpBlocks()) {
    if (!getTpDim() || !getTpSize())
      return emitOpError("a tensor-parallel shard needs both tp_dim and tp_size");
    int64_t dim = *getTpDim(), size = *getTpSize(), blocks = getTpBlocks().value_or(1);
    if (dim < 0 || dim >= type.getRank())
      return emitOpError() << "tp_dim " << dim << " is not a dimension of "
                           << shapeStr(type.getShape());
    if (size < 2)
      return emitOpError() << "tp_size must be >= 2, got " << size;
    if (blocks < 1 || type.getDimSize(dim) % blocks != 0)
      return emitOpError() << "tp_blocks " << blocks << " must be >= 1 and divide the shard's "
                           << "dimension " << dim << " (" << type.getDimSize(dim) << ")";
  }
  if (getEpDim() || getEpSize()) {
    if (!getEpDim() || !getEpSize())
      return emitOpError("an expert-parallel shard needs both ep_dim and ep_size");
    if (!isExpert())
      return emitOpError("only a routed expert's weight (mt.expert) is split over "
                         "expert-parallel ranks");
    // I64Attr's getters are unsigned: read the attributes as signed.
    int64_t dim = getEpDimAttr().getInt(), size = getEpSizeAttr().getInt();
    if (dim != 0)
      return emitOpError() << "ep_dim must be 0 (the stacked experts), got " << dim;
    if (size < 2)
      return emitOpError() << "ep_size must be >= 2, got " << size;
    if (getTpDim() && *getTpDim() == 0)
      return emitOpError("dimension 0 cannot be split over both tensor- and expert-parallel "
                         "ranks");
  }
  if (isExpert() && getTpDim() && *getTpDim() == 0)
    return emitOpError("dimension 0 of a routed expert's weight stacks the experts: only "
                       "expert-parallel ranks split it (ep_dim), not tp_dim");
  return success();
}

LogicalResult ParamRefOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  auto param =
      symbolTable.lookupNearestSymbolFrom<ParamOp>(getOperation(), getNameAttr());
  if (!param)
    return emitOpError() << "'" << getName() << "' does not name an mt.param";
  if (param.getType() != getType())
    return emitOpError() << "result type " << getType()
                         << " differs from the parameter's declared type "
                         << param.getType();
  return success();
}

LogicalResult PositionIdsOp::verify() {
  if (getType().getRank() != 2)
    return emitOpError() << "result must be [batch, seq], got "
                         << shapeStr(getType().getShape());
  return success();
}

LogicalResult EmbeddingOp::verify() {
  RankedTensorType table = tensorOf(getTable()), ids = tensorOf(getIds()),
                   result = getType();
  if (table.getRank() != 2)
    return emitOpError() << "table must be [rows, dim], got "
                         << shapeStr(table.getShape());
  SmallVector<int64_t> expected(ids.getShape());
  expected.push_back(table.getDimSize(1));
  if (result.getShape() != ArrayRef<int64_t>(expected))
    return emitOpError() << "result shape " << shapeStr(result.getShape())
                         << " should be the ids' shape followed by the table's dim: "
                         << shapeStr(expected);
  if (result.getElementType() != table.getElementType())
    return emitOpError("result element type differs from the table's");
  return success();
}

LogicalResult LayerNormOp::verify() {
  if (failed(verifyFeatureVector(*this, "weight", getInput(), getWeight())))
    return failure();
  if (!(getEpsilon().convertToDouble() > 0.0))
    return emitOpError("epsilon must be positive");
  return success();
}

LogicalResult RMSNormOp::verify() {
  if (failed(verifyFeatureVector(*this, "weight", getInput(), getWeight())))
    return failure();
  if (!(getEpsilon().convertToDouble() > 0.0))
    return emitOpError("epsilon must be positive");
  return success();
}

LogicalResult MatmulOp::verify() {
  RankedTensorType in = tensorOf(getInput()), w = tensorOf(getWeight()),
                   result = getType();
  if (in.getRank() < 2)
    return emitOpError() << "input must have rank >= 2, got "
                         << shapeStr(in.getShape());
  if (w.getRank() != 2)
    return emitOpError() << "weight must be [out_features, in_features], got "
                         << shapeStr(w.getShape());
  if (w.getDimSize(1) != in.getShape().back())
    return emitOpError() << "weight " << shapeStr(w.getShape())
                         << " expects " << w.getDimSize(1)
                         << " input features but the input's last dimension is "
                         << in.getShape().back();
  SmallVector<int64_t> expected(in.getShape().drop_back());
  expected.push_back(w.getDimSize(0));
  if (result.getShape() != ArrayRef<int64_t>(expected))
    return emitOpError() << "result shape " << shapeStr(result.getShape())
                         << " should be " << shapeStr(expected);
  // A 16-bit product may give an f32 result, and any product an f64 one,
  // computed in that type and not rounded (the router's logits with
  // moe_router_dtype fp32 or fp64, as Megatron's router_gating_linear
  // computes them).
  const bool wideResult = (result.getElementType().isF32() &&
                           in.getElementType().getIntOrFloatBitWidth() == 16) ||
                          result.getElementType().isF64();
  if (in.getElementType() != w.getElementType() ||
      (result.getElementType() != in.getElementType() && !wideResult))
    return emitOpError("input, weight and result must share an element type (or a 16-bit "
                       "input and weight give an f32 result, or any an f64 one)");
  return success();
}

LogicalResult BiasAddOp::verify() {
  return verifyFeatureVector(*this, "bias", getInput(), getBias());
}

LogicalResult SwiGLUOp::verify() {
  RankedTensorType in = tensorOf(getInput()), result = getType();
  if (in.getRank() < 1 || in.getShape().back() % 2 != 0)
    return emitOpError("input's last dimension must be even (two halves)");
  SmallVector<int64_t> expected(in.getShape());
  expected.back() /= 2;
  if (result.getShape() != ArrayRef<int64_t>(expected))
    return emitOpError() << "result shape " << shapeStr(result.getShape())
                         << " should be " << shapeStr(expected);
  if (result.getElementType() != in.getElementType())
    return emitOpError("result element type differs from the input's");
  return success();
}

LogicalResult DropoutOp::verify() {
  return verifyRate(*this, "rate", getRate().convertToDouble());
}

LogicalResult ReshapeOp::verify() {
  RankedTensorType in = tensorOf(getInput()), result = getType();
  if (in.getNumElements() != result.getNumElements())
    return emitOpError() << "cannot reshape " << shapeStr(in.getShape()) << " ("
                         << in.getNumElements() << " elements) to "
                         << shapeStr(result.getShape()) << " ("
                         << result.getNumElements() << " elements)";
  if (in.getElementType() != result.getElementType())
    return emitOpError("reshape cannot change the element type");
  return success();
}

// The rotation that `rope_base` asks of mt.split_qkv and mt.split_qkv_grad:
// mt.rope's own conditions on the base and head_dim.
static LogicalResult verifyRopeBase(Operation *op, std::optional<APFloat> base, int64_t d,
                                    std::optional<APFloat> scaling) {
  if (scaling && !base)
    return op->emitOpError("rope_scaling_factor needs rope_base");
  if (scaling && !(scaling->convertToDouble() >= 1.0))
    return op->emitOpError("rope_scaling_factor must be at least 1");
  if (!base)
    return success();
  if (!(base->convertToDouble() > 1.0))
    return op->emitOpError("rope_base must be greater than 1");
  if (d % 2 != 0)
    return op->emitOpError() << "rope_base needs an even head_dim to rotate pairs, got " << d;
  return success();
}

LogicalResult SplitQKVOp::verify() {
  RankedTensorType in = tensorOf(getInput()), q = tensorOf(getQuery()),
                   k = tensorOf(getKey()), v = tensorOf(getValue());
  if (in.getRank() != 3)
    return emitOpError() << "input must be [batch, seq, features], got "
                         << shapeStr(in.getShape());
  for (auto [name, t] : {std::pair<StringRef, RankedTensorType>{"query", q},
                         {"key", k},
                         {"value", v}}) {
    if (t.getRank() != 4 || t.getDimSize(0) != in.getDimSize(0) ||
        t.getDimSize(1) != in.getDimSize(1))
      return emitOpError() << name << " must be [batch, seq, heads, head_dim] with the "
                           << "input's batch and seq, got " << shapeStr(t.getShape());
    if (t.getElementType() != in.getElementType())
      return emitOpError() << name << " element type differs from the input's";
  }
  if (k != v)
    return emitOpError("key and value must have the same type");
  int64_t heads = q.getDimSize(2), groups = k.getDimSize(2), d = q.getDimSize(3);
  if (k.getDimSize(3) != d)
    return emitOpError("query and key head dims differ");
  if (groups == 0 || heads % groups != 0)
    return emitOpError() << heads << " query heads cannot be split evenly into "
                         << groups << " groups";
  if (in.getDimSize(2) != (heads + 2 * groups) * d)
    return emitOpError() << "input has " << in.getDimSize(2)
                         << " features but (heads + 2 * groups) * head_dim = ("
                         << heads << " + 2 * " << groups << ") * " << d << " = "
                         << (heads + 2 * groups) * d;
  return verifyRopeBase(getOperation(), getRopeBase(), d, getRopeScalingFactor());
}

LogicalResult RopeOp::verify() {
  RankedTensorType t = getType();
  if (t.getRank() != 4)
    return emitOpError() << "input must be [batch, seq, heads, head_dim], got "
                         << shapeStr(t.getShape());
  if (t.getDimSize(3) % 2 != 0)
    return emitOpError("head_dim must be even to rotate pairs");
  if (!(getBase().convertToDouble() > 1.0))
    return emitOpError("base must be greater than 1");
  if (auto f = getScalingFactor(); f && !(f->convertToDouble() >= 1.0))
    return emitOpError("scaling_factor must be at least 1");
  return success();
}

Type mt::attentionLseType(Type query) {
  auto q = dyn_cast<RankedTensorType>(query);
  Type f32 = Float32Type::get(query.getContext());
  if (!q || q.getRank() != 4)
    return UnrankedTensorType::get(f32);
  return RankedTensorType::get({q.getDimSize(0), q.getDimSize(2), q.getDimSize(1)}, f32);
}

LogicalResult AttentionOp::verify() {
  RankedTensorType q = tensorOf(getQuery()), k = tensorOf(getKey());
  if (q.getRank() != 4 || k.getRank() != 4)
    return emitOpError("query, key and value must be [batch, seq, heads, head_dim]");
  if (q.getDimSize(0) != k.getDimSize(0) || q.getDimSize(1) != k.getDimSize(1) ||
      q.getDimSize(3) != k.getDimSize(3))
    return emitOpError() << "query " << shapeStr(q.getShape()) << " and key "
                         << shapeStr(k.getShape())
                         << " must agree in batch, seq and head_dim";
  if (q.getElementType() != k.getElementType())
    return emitOpError("query and key element types differ");
  if (k.getDimSize(2) == 0 || q.getDimSize(2) % k.getDimSize(2) != 0)
    return emitOpError() << q.getDimSize(2) << " query heads cannot share "
                         << k.getDimSize(2) << " key/value groups evenly";
  if (!(getScale().convertToDouble() > 0.0))
    return emitOpError("scale must be positive");
  return verifyRate(*this, "dropout_rate", getDropoutRate().convertToDouble());
}

LogicalResult CrossEntropyOp::verify() {
  RankedTensorType logits = tensorOf(getLogits()), labels = tensorOf(getLabels());
  if (logits.getRank() < 2 ||
      logits.getShape().drop_back() != labels.getShape())
    return emitOpError() << "logits " << shapeStr(logits.getShape())
                         << " must be the labels' shape "
                         << shapeStr(labels.getShape()) << " plus a vocabulary dimension";
  return success();
}

//===----------------------------------------------------------------------===//
// Training-step level
//===----------------------------------------------------------------------===//

namespace {
// The mt.param named `sym`, which must have type `expected` (when given).
LogicalResult verifyParamUse(Operation *op, SymbolTableCollection &symbolTable,
                             FlatSymbolRefAttr sym, Type expected, StringRef what) {
  auto param = symbolTable.lookupNearestSymbolFrom<ParamOp>(op, sym);
  if (!param)
    return op->emitOpError() << what << " '" << sym.getValue()
                             << "' does not name an mt.param";
  if (expected && param.getType() != expected)
    return op->emitOpError() << what << " '" << sym.getValue() << "' has type "
                             << param.getType() << " but the gradient is for "
                             << expected;
  return success();
}

// The parameter type a gradient op accumulates into.
RankedTensorType withShape(RankedTensorType like, ArrayRef<int64_t> shape) {
  return RankedTensorType::get(shape, like.getElementType());
}
} // namespace

LogicalResult EmbeddingGradOp::verify() {
  RankedTensorType g = tensorOf(getGrad()), ids = tensorOf(getIds());
  if (g.getRank() != ids.getRank() + 1 || g.getShape().drop_back() != ids.getShape())
    return emitOpError() << "gradient " << shapeStr(g.getShape())
                         << " must be the ids' shape " << shapeStr(ids.getShape())
                         << " plus the embedding dim";
  return success();
}

LogicalResult EmbeddingGradOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  auto param = symbolTable.lookupNearestSymbolFrom<ParamOp>(*this, getParamAttr());
  if (failed(verifyParamUse(*this, symbolTable, getParamAttr(), {}, "table")))
    return failure();
  RankedTensorType t = param.getTensorType(), g = tensorOf(getGrad());
  if (t.getRank() != 2 || t.getDimSize(1) != g.getShape().back() ||
      t.getElementType() != g.getElementType())
    return emitOpError() << "table " << t << " does not match the gradient " << g;
  return success();
}

LogicalResult MatmulInputGradOp::verify() {
  RankedTensorType dy = tensorOf(getGrad()), w = tensorOf(getWeight()),
                   dx = getType();
  if (w.getRank() != 2 || dy.getRank() < 2)
    return emitOpError("weight must be [out, in] and the gradient of rank >= 2");
  if (dy.getShape().back() != w.getDimSize(0))
    return emitOpError() << "gradient's last dim " << dy.getShape().back()
                         << " differs from the weight's out features " << w.getDimSize(0);
  SmallVector<int64_t> expected(dy.getShape().drop_back());
  expected.push_back(w.getDimSize(1));
  if (dx.getShape() != ArrayRef<int64_t>(expected))
    return emitOpError() << "result shape " << shapeStr(dx.getShape())
                         << " should be " << shapeStr(expected);
  return success();
}

LogicalResult MatmulWeightGradOp::verify() {
  RankedTensorType dy = tensorOf(getGrad()), x = tensorOf(getInput());
  if (dy.getRank() < 2 || dy.getShape().drop_back() != x.getShape().drop_back())
    return emitOpError() << "gradient " << shapeStr(dy.getShape()) << " and input "
                         << shapeStr(x.getShape()) << " must share leading dims";
  return success();
}

LogicalResult MatmulWeightGradOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  RankedTensorType dy = tensorOf(getGrad()), x = tensorOf(getInput());
  return verifyParamUse(*this, symbolTable, getParamAttr(),
                        withShape(x, {dy.getShape().back(), x.getShape().back()}),
                        "weight");
}

LogicalResult BiasGradOp::verify() {
  if (tensorOf(getGrad()).getRank() < 1)
    return emitOpError("gradient must have rank >= 1");
  return success();
}

LogicalResult BiasGradOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  RankedTensorType dy = tensorOf(getGrad());
  return verifyParamUse(*this, symbolTable, getParamAttr(),
                        withShape(dy, {dy.getShape().back()}), "bias");
}

LogicalResult LayerNormGradOp::verify() {
  if (failed(verifyFeatureVector(*this, "weight", getInput(), getWeight())))
    return failure();
  if (!(getEpsilon().convertToDouble() > 0.0))
    return emitOpError("epsilon must be positive");
  return success();
}

LogicalResult LayerNormGradOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  Type w = getWeight().getType();
  if (failed(verifyParamUse(*this, symbolTable, getWeightParamAttr(), w, "weight")))
    return failure();
  return verifyParamUse(*this, symbolTable, getBiasParamAttr(), w, "bias");
}

LogicalResult RMSNormGradOp::verify() {
  if (failed(verifyFeatureVector(*this, "weight", getInput(), getWeight())))
    return failure();
  if (!(getEpsilon().convertToDouble() > 0.0))
    return emitOpError("epsilon must be positive");
  return success();
}

LogicalResult RMSNormGradOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  return verifyParamUse(*this, symbolTable, getWeightParamAttr(),
                        getWeight().getType(), "weight");
}

LogicalResult SwiGLUGradOp::verify() {
  RankedTensorType dy = tensorOf(getGrad()), x = tensorOf(getInput());
  SmallVector<int64_t> expected(x.getShape());
  if (expected.empty() || expected.back() % 2 != 0)
    return emitOpError("input's last dimension must be even");
  expected.back() /= 2;
  if (dy.getShape() != ArrayRef<int64_t>(expected))
    return emitOpError() << "gradient shape " << shapeStr(dy.getShape())
                         << " should be " << shapeStr(expected);
  return success();
}

LogicalResult SplitQKVGradOp::verify() {
  RankedTensorType q = tensorOf(getQueryGrad()), k = tensorOf(getKeyGrad()),
                   v = tensorOf(getValueGrad()), out = getType();
  if (q.getRank() != 4 || k != v || k.getRank() != 4)
    return emitOpError("query, key and value gradients must be [batch, seq, heads, "
                       "head_dim], key and value of one type");
  int64_t heads = q.getDimSize(2), groups = k.getDimSize(2), d = q.getDimSize(3);
  if (groups == 0 || heads % groups != 0 || k.getDimSize(3) != d)
    return emitOpError("query heads must split evenly over key/value groups of the same head_dim");
  SmallVector<int64_t> expected{q.getDimSize(0), q.getDimSize(1), (heads + 2 * groups) * d};
  if (out.getShape() != ArrayRef<int64_t>(expected))
    return emitOpError() << "result shape " << shapeStr(out.getShape())
                         << " should be " << shapeStr(expected);
  return verifyRopeBase(getOperation(), getRopeBase(), d, getRopeScalingFactor());
}

LogicalResult CrossEntropyGradOp::verify() {
  RankedTensorType logits = tensorOf(getLogits()), labels = tensorOf(getLabels());
  if (logits.getRank() < 2 || logits.getShape().drop_back() != labels.getShape())
    return emitOpError() << "logits " << shapeStr(logits.getShape())
                         << " must be the labels' shape "
                         << shapeStr(labels.getShape()) << " plus a vocabulary dimension";
  return success();
}

LogicalResult LrScheduleOp::verify() {
  double lr = getLr().convertToDouble(), minLr = getMinLr().convertToDouble();
  if (!(lr >= 0.0) || !(minLr >= 0.0) || minLr > lr)
    return emitOpError() << "need 0 <= min_lr <= lr, got lr " << lr << " and min_lr " << minLr;
  int64_t warmup = int64_t(getWarmupIters()), decay = int64_t(getDecayIters());
  if (warmup < 0 || decay < 0)
    return emitOpError("warmup_iters and decay_iters must not be negative");
  if (getStyle() != LrStyle::Constant && getStyle() != LrStyle::InverseSquareRoot &&
      decay <= warmup)
    return emitOpError() << "decay_iters (" << decay << ") must exceed warmup_iters ("
                         << warmup << ")";
  if (auto s = getSamplesPerStep(); s && int64_t(*s) < 1)
    return emitOpError() << "samples_per_step must be >= 1, got " << int64_t(*s);
  const bool wsd = getStyle() == LrStyle::WSD;
  if (wsd != getWsdStyle().has_value() || wsd != getWsdDecayIters().has_value())
    return emitOpError("wsd_style and wsd_decay_iters are given with the wsd style, and only "
                       "with it");
  if (wsd && (int64_t(*getWsdDecayIters()) < 1 || int64_t(*getWsdDecayIters()) > decay - warmup))
    return emitOpError() << "wsd_decay_iters (" << int64_t(*getWsdDecayIters())
                         << ") must be in [1, decay_iters - warmup_iters = " << decay - warmup
                         << "]";
  return success();
}

namespace {
// AdamW's hyper-parameters, for mt.adamw and mt.sharded_adamw.
template <class OpT> LogicalResult verifyAdamW(OpT op) {
  double b1 = op.getBeta1().convertToDouble(), b2 = op.getBeta2().convertToDouble();
  if (!(b1 >= 0.0 && b1 < 1.0) || !(b2 >= 0.0 && b2 < 1.0))
    return op.emitOpError("beta1 and beta2 must be in [0, 1)");
  if (!(op.getEpsilon().convertToDouble() > 0.0))
    return op.emitOpError("epsilon must be positive");
  if (!(op.getWeightDecay().convertToDouble() >= 0.0))
    return op.emitOpError("weight_decay must not be negative");
  return success();
}
} // namespace

LogicalResult AdamWOp::verify() { return verifyAdamW(*this); }

namespace {
// SGD's hyper-parameters, for mt.sgd and mt.sharded_sgd.
template <class OpT> LogicalResult verifySgd(OpT op) {
  if (!(op.getMomentum().convertToDouble() >= 0.0))
    return op.emitOpError("momentum must not be negative");
  if (!(op.getWeightDecay().convertToDouble() >= 0.0))
    return op.emitOpError("weight_decay must not be negative");
  return success();
}
} // namespace

LogicalResult SgdOp::verify() { return verifySgd(*this); }

LogicalResult SgdOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  return verifyParamUse(*this, symbolTable, getParamAttr(), {}, "parameter");
}

LogicalResult AdamWOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  return verifyParamUse(*this, symbolTable, getParamAttr(), {}, "parameter");
}

//===----------------------------------------------------------------------===//
// Kernel level
//===----------------------------------------------------------------------===//

bool FusedOp::isRowReduction(Operation *op) { return isa<LayerNormOp, RMSNormOp>(op); }

bool FusedOp::isFusible(Operation *op, FusionKind kind) {
  if (kind == FusionKind::Gemm)
    return isa<MatmulOp, BiasAddOp>(op) ||
           (isa<GeluOp>(op) && cast<GeluOp>(op).getApproximation() == GeluApproximation::Tanh);
  if (kind == FusionKind::GemmGrad)
    return isa<MatmulInputGradOp, MatmulWeightGradOp, BiasGradOp>(op) ||
           (isa<GeluGradOp>(op) &&
            cast<GeluGradOp>(op).getApproximation() == GeluApproximation::Tanh);
  if (isa<BiasAddOp, AddOp, GeluOp, GeluGradOp, SwiGLUOp, SwiGLUGradOp, DropoutOp>(op))
    return true;
  if (isa<ReshapeOp>(op))
    return kind == FusionKind::Elementwise;
  return kind == FusionKind::RowReduction && isRowReduction(op);
}

// mt.fused KIND "NAME" (%arg = %operand, ...) : (types) -> types
//     attributes {...} { body }
ParseResult FusedOp::parse(OpAsmParser &parser, OperationState &result) {
  MLIRContext *ctx = parser.getContext();
  SMLoc kindLoc = parser.getCurrentLocation();
  StringRef kindWord;
  if (parser.parseKeyword(&kindWord))
    return failure();
  std::optional<FusionKind> kind = symbolizeFusionKind(kindWord);
  if (!kind)
    return parser.emitError(kindLoc, "expected 'elementwise', 'row_reduction', 'gemm' or "
                                     "'gemm_grad', got '")
           << kindWord << "'";
  result.addAttribute(getKindAttrName(result.name), FusionKindAttr::get(ctx, *kind));
  StringAttr name;
  if (parser.parseAttribute(name, getNameAttrName(result.name).getValue(),
                            result.attributes))
    return failure();

  SmallVector<OpAsmParser::Argument> args;
  SmallVector<OpAsmParser::UnresolvedOperand> operands;
  if (parser.parseCommaSeparatedList(OpAsmParser::Delimiter::Paren, [&]() -> ParseResult {
        OpAsmParser::Argument arg;
        OpAsmParser::UnresolvedOperand operand;
        if (parser.parseArgument(arg) || parser.parseEqual() ||
            parser.parseOperand(operand))
          return failure();
        args.push_back(arg);
        operands.push_back(operand);
        return success();
      }))
    return failure();
  SMLoc typeLoc = parser.getCurrentLocation();
  FunctionType type;
  if (parser.parseColonType(type))
    return failure();
  if (type.getNumInputs() != operands.size())
    return parser.emitError(typeLoc) << "the type lists " << type.getNumInputs()
                                     << " inputs but " << operands.size() << " are bound";
  for (auto [arg, t] : llvm::zip(args, type.getInputs()))
    arg.type = t;
  if (parser.resolveOperands(operands, type.getInputs(), typeLoc, result.operands))
    return failure();
  result.addTypes(type.getResults());
  if (parser.parseOptionalAttrDictWithKeyword(result.attributes))
    return failure();
  Region *body = result.addRegion();
  return parser.parseRegion(*body, args);
}

void FusedOp::print(OpAsmPrinter &p) {
  p << ' ' << stringifyFusionKind(getKind()) << ' ';
  p.printAttributeWithoutType(getNameAttr());
  p << " (";
  llvm::interleaveComma(llvm::zip(getBodyBlock().getArguments(), getInputs()), p,
                        [&](auto pair) {
                          p << std::get<0>(pair) << " = " << std::get<1>(pair);
                        });
  p << ") : ";
  p.printFunctionalType(getInputs().getTypes(), getResultTypes());
  p.printOptionalAttrDictWithKeyword((*this)->getAttrs(),
                                     {getNameAttrName(), getKindAttrName()});
  p << ' ';
  p.printRegion(getBody(), /*printEntryBlockArgs=*/false);
}

// The two forms of cuBLASLt's backward epilogues (mt.fused): the input
// gradient with DGELU (and DGELU_BGRAD), or the weight gradient with BGRADB.
LogicalResult FusedOp::verifyGemmGrad() {
  SmallVector<Operation *> ops;
  for (Operation &op : getBodyBlock().without_terminator())
    ops.push_back(&op);
  auto at = [&](size_t i) { return i < ops.size() ? ops[i] : nullptr; };
  if (auto mig = dyn_cast_or_null<MatmulInputGradOp>(at(0))) {
    auto gelu = dyn_cast_or_null<GeluGradOp>(at(1));
    auto bias = dyn_cast_or_null<BiasGradOp>(at(2));
    if (!gelu || gelu.getGrad() != mig.getResult() || ops.size() > 3 ||
        (ops.size() == 3 && (!bias || bias.getGrad() != gelu.getResult())))
      return emitOpError("a gemm_grad kernel on mt.matmul_input_grad is that op, the tanh "
                         "mt.gelu_grad of its result, and optionally the mt.bias_grad of "
                         "that, in this order");
    if (!mig.getResult().hasOneUse())
      return emitOpError("a gemm_grad kernel's matmul_input_grad result feeds only its "
                         "gelu_grad");
    auto yield = dyn_cast<YieldOp>(getBodyBlock().getTerminator());
    if (getNumResults() != 1 || !yield || yield.getNumOperands() != 1 ||
        yield.getValues()[0] != gelu.getResult())
      return emitOpError("a gemm_grad kernel on mt.matmul_input_grad has one result, the "
                         "gelu_grad's");
    return success();
  }
  auto wg = dyn_cast_or_null<MatmulWeightGradOp>(at(0));
  auto bias = dyn_cast_or_null<BiasGradOp>(at(1));
  if (!wg || !bias || ops.size() != 2)
    return emitOpError("a gemm_grad kernel is an mt.matmul_input_grad with its tanh "
                       "mt.gelu_grad (and optionally mt.bias_grad), or an "
                       "mt.matmul_weight_grad and one mt.bias_grad, in this order");
  if (bias.getGrad() != wg.getGrad())
    return emitOpError("a gemm_grad kernel's mt.bias_grad sums the output gradient its "
                       "mt.matmul_weight_grad reads");
  if (getNumResults() != 0)
    return emitOpError("a gemm_grad kernel on mt.matmul_weight_grad has no results; it adds "
                       "into parameter gradients only");
  return success();
}

LogicalResult FusedOp::verifyRegions() {
  Block &body = getBodyBlock();
  if (body.getNumArguments() != getNumOperands())
    return emitOpError() << "body has " << body.getNumArguments()
                         << " arguments but the op has " << getNumOperands() << " operands";
  for (auto [i, arg, operand] : llvm::enumerate(body.getArguments(), getInputs()))
    if (arg.getType() != operand.getType())
      return emitOpError() << "body argument #" << i << " has type " << arg.getType()
                           << " but operand #" << i << " has type " << operand.getType();
  const FusionKind kind = getKind();
  // Only a weight-gradient GEMM with its bias gradient computes nothing but
  // parameter gradients.
  const bool gradOnly = kind == FusionKind::GemmGrad && !body.empty() &&
                        isa<MatmulWeightGradOp>(body.front());
  if (getNumResults() == 0 && !gradOnly)
    return emitOpError("has no results; a kernel must compute at least one value");

  int rowOps = 0;
  for (Operation &op : body.without_terminator()) {
    if (!isFusible(&op, kind))
      return op.emitOpError() << "cannot be part of a kernel of kind '"
                              << stringifyFusionKind(kind) << "'"
                              << (isRowReduction(&op)
                                      ? "; a row-wise op needs kind row_reduction"
                                  : isa<ReshapeOp>(op)
                                      ? "; a reshape may change what a row is"
                                      : "; see mt.fused for the ops a kernel can hold");
    rowOps += isRowReduction(&op);
  }
  if (kind == FusionKind::Gemm) {
    // matmul, bias_add of its result, optionally the gelu of that: the
    // order of cuBLASLt's epilogue.
    SmallVector<Operation *> ops;
    for (Operation &op : body.without_terminator())
      ops.push_back(&op);
    auto mm = ops.empty() ? MatmulOp() : dyn_cast<MatmulOp>(ops[0]);
    auto bias = ops.size() < 2 ? BiasAddOp() : dyn_cast<BiasAddOp>(ops[1]);
    auto gelu = ops.size() < 3 ? GeluOp() : dyn_cast<GeluOp>(ops[2]);
    if (!mm || !bias || bias.getInput() != mm.getResult() || ops.size() > 3 ||
        (ops.size() == 3 && (!gelu || gelu.getInput() != bias.getResult())))
      return emitOpError("a gemm kernel is an mt.matmul, the mt.bias_add of its result, "
                         "and optionally the tanh mt.gelu of that, in this order");
    if (!mm.getResult().hasOneUse())
      return emitOpError("a gemm kernel's matmul result feeds only its bias add");
  }
  if (kind == FusionKind::GemmGrad) {
    if (failed(verifyGemmGrad()))
      return failure();
  }
  if (kind == FusionKind::RowReduction && rowOps != 1)
    return emitOpError() << "a row_reduction kernel holds exactly one mt.layer_norm or "
                            "mt.rms_norm, found "
                         << rowOps;

  auto yield = dyn_cast<YieldOp>(body.getTerminator());
  if (!yield)
    return emitOpError("body must end in mt.yield");
  if (yield.getNumOperands() != getNumResults())
    return yield.emitOpError() << "yields " << yield.getNumOperands()
                               << " values but the kernel has " << getNumResults()
                               << " results";
  llvm::SmallDenseSet<Value, 4> seen;
  for (auto [i, v, r] : llvm::enumerate(yield.getValues(), getResults())) {
    if (v.getType() != r.getType())
      return yield.emitOpError() << "value #" << i << " has type " << v.getType()
                                 << " but result #" << i << " has type " << r.getType();
    if (isa<BlockArgument>(v))
      return yield.emitOpError() << "value #" << i
                                 << " is a body argument; results must be computed by the kernel";
    if (!seen.insert(v).second)
      return yield.emitOpError() << "value #" << i
                                 << " is yielded twice; each result must be its own value";
  }
  return success();
}

// The number of buckets in the enclosing module's mt.grad_buckets, or -1.
static int64_t gradBucketCount(Operation *op) {
  auto module = op->getParentOfType<ModuleOp>();
  auto buckets = module ? module->getAttrOfType<ArrayAttr>("mt.grad_buckets") : ArrayAttr();
  return buckets ? int64_t(buckets.size()) : -1;
}

static LogicalResult verifyBucket(Operation *op, int64_t bucket) {
  int64_t n = gradBucketCount(op);
  if (n < 0)
    return op->emitOpError() << "needs the module's mt.grad_buckets (run mt-data-parallel)";
  if (bucket < 0 || bucket >= n)
    return op->emitOpError() << "bucket " << bucket << " is not one of the module's " << n
                             << " mt.grad_buckets";
  return success();
}

// A bucket's collective runs over the bucket's own group: "dp", or
// "expt_dp" for expert parameters' buckets (mt.grad_buckets' `group`,
// "dp" when absent).
static LogicalResult verifyBucketGroup(Operation *op, int64_t bucket, StringRef group) {
  if (group != "dp" && group != "expt_dp")
    return op->emitOpError() << "group must be \"dp\" or \"expt_dp\", got \"" << group << "\"";
  if (failed(verifyBucket(op, bucket)))
    return failure();
  auto buckets = op->getParentOfType<ModuleOp>()->getAttrOfType<ArrayAttr>("mt.grad_buckets");
  StringRef own = "dp";
  if (auto d = dyn_cast<DictionaryAttr>(buckets[bucket]))
    if (auto g = d.getAs<StringAttr>("group"))
      own = g.getValue();
  if (group != own)
    return op->emitOpError() << "bucket " << bucket << " is reduced over \"" << own
                             << "\" (mt.grad_buckets), not \"" << group << "\"";
  return success();
}

static LogicalResult verifyDpGroup(Operation *op, StringRef group) {
  if (group != "dp")
    return op->emitOpError() << "group must be \"dp\", got \"" << group << "\"";
  return success();
}

LogicalResult ReduceGradsOp::verify() {
  double scale = getScale().convertToDouble();
  if (!(scale > 0.0 && scale <= 1.0))
    return emitOpError() << "scale must be in (0, 1], got " << scale;
  return verifyBucketGroup(*this, getBucket(), getGroup());
}

LogicalResult ShardedGradNormOp::verify() { return verifyDpGroup(*this, getGroup()); }

LogicalResult ShardedAdamWOp::verify() {
  if (failed(verifyAdamW(*this)))
    return failure();
  return verifyBucket(*this, getBucket());
}

LogicalResult ShardedSgdOp::verify() {
  if (failed(verifySgd(*this)))
    return failure();
  return verifyBucket(*this, getBucket());
}

LogicalResult AllGatherParamsOp::verify() {
  return verifyBucketGroup(*this, getBucket(), getGroup());
}

LogicalResult AllReduceGradsOp::verify() {
  if (getGroup() != "dp" && getGroup() != "tp")
    return emitOpError() << "group must be \"dp\" or \"tp\", got \"" << getGroup() << "\"";
  double scale = getScale().convertToDouble();
  if (!(scale > 0.0 && scale <= 1.0))
    return emitOpError() << "scale must be in (0, 1], got " << scale;
  return success();
}

//===----------------------------------------------------------------------===//
// Tensor- and sequence-parallel communication
//===----------------------------------------------------------------------===//

namespace {
// `seqDiv` is how the result's dimension 1 relates to the input's: 0 for
// equal shapes, +1 when the result is tp_size times longer (gather), -1 when
// tp_size times shorter (scatter).
LogicalResult verifyTpOp(Operation *op, Value input, Value result, int64_t tp, int seqDiv) {
  auto in = cast<RankedTensorType>(input.getType());
  auto out = cast<RankedTensorType>(result.getType());
  if (tp < 2)
    return op->emitOpError() << "tp_size must be >= 2, got " << tp;
  if (in.getElementType() != out.getElementType())
    return op->emitOpError("result element type differs from the input's");
  SmallVector<int64_t> expected(in.getShape());
  if (seqDiv != 0) {
    if (in.getRank() < 2)
      return op->emitOpError() << "input must be [batch, seq, ...], got "
                               << shapeStr(in.getShape());
    if (seqDiv > 0) {
      expected[1] *= tp;
    } else {
      if (expected[1] % tp != 0)
        return op->emitOpError() << "sequence length " << expected[1]
                                 << " is not divisible by tp_size " << tp;
      expected[1] /= tp;
    }
  }
  if (out.getShape() != ArrayRef<int64_t>(expected))
    return op->emitOpError() << "result shape " << shapeStr(out.getShape()) << " should be "
                             << shapeStr(expected);
  return success();
}
} // namespace

LogicalResult TpCopyOp::verify() {
  return verifyTpOp(*this, getInput(), getResult(), getTpSize(), 0);
}
LogicalResult TpAllReduceOp::verify() {
  return verifyTpOp(*this, getInput(), getResult(), getTpSize(), 0);
}
LogicalResult SpGatherOp::verify() {
  return verifyTpOp(*this, getInput(), getResult(), getTpSize(), +1);
}
LogicalResult SpReduceScatterOp::verify() {
  return verifyTpOp(*this, getInput(), getResult(), getTpSize(), -1);
}
LogicalResult SpSplitOp::verify() {
  return verifyTpOp(*this, getInput(), getResult(), getTpSize(), -1);
}

//===----------------------------------------------------------------------===//
// Pipeline parallelism
//===----------------------------------------------------------------------===//

LogicalResult GradNormOp::verify() {
  if (auto g = getGroup(); g && *g != "mp")
    return emitOpError() << "group must be \"mp\" when given, got \"" << *g << "\"";
  return success();
}

static LogicalResult verifyPeerAndTag(Operation *op, int64_t peer, int64_t tag) {
  if (peer < 0)
    return op->emitOpError() << "peer must be a pipeline rank >= 0, got " << peer;
  if (tag < 0)
    return op->emitOpError() << "tag must be >= 0, got " << tag;
  return success();
}

LogicalResult SendOp::verify() { return verifyPeerAndTag(*this, getPeer(), getTag()); }
LogicalResult RecvOp::verify() { return verifyPeerAndTag(*this, getPeer(), getTag()); }

LogicalResult AllReduceTiedGradOp::verify() {
  return verifyPeerAndTag(*this, getPeer(), getTag());
}

LogicalResult AllReduceTiedGradOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  if (!symbolTable.lookupNearestSymbolFrom<ParamOp>(*this, getParamAttr()))
    return emitOpError() << "'" << getParam() << "' does not name an mt.param";
  return success();
}

//===----------------------------------------------------------------------===//
// Mixture of experts
//===----------------------------------------------------------------------===//

namespace {
// `what` must have exactly `shape`.
LogicalResult expectShape(Operation *op, StringRef what, Value v, ArrayRef<int64_t> shape,
                          StringRef meaning) {
  RankedTensorType t = tensorOf(v);
  if (t.getShape() != shape)
    return op->emitOpError() << what << " must be " << meaning << " " << shapeStr(shape)
                             << ", got " << shapeStr(t.getShape());
  return success();
}

LogicalResult expectSameElementType(Operation *op, StringRef what, Value v, Value like,
                                    StringRef likeName) {
  if (tensorOf(v).getElementType() != tensorOf(like).getElementType())
    return op->emitOpError() << what << " element type " << tensorOf(v).getElementType()
                             << " differs from the " << likeName << "'s "
                             << tensorOf(like).getElementType();
  return success();
}

LogicalResult verifyNonNegative(Operation *op, StringRef name, double v, StringRef zero) {
  if (!(v >= 0.0) || !std::isfinite(v))
    return op->emitOpError() << name << " must be finite and >= 0" << zero << ", got " << v;
  return success();
}

// `tokens` is T: padding to a capacity above it would send every token to
// every expert (Megatron's capacity mask), which mt does not model.
LogicalResult verifyCapacity(Operation *op, int64_t capacity, bool pad, int64_t tokens) {
  if (capacity < 0)
    return op->emitOpError() << "capacity must be >= 0 (0: no capacity), got " << capacity;
  if (pad && capacity == 0)
    return op->emitOpError("pad_to_capacity needs a capacity");
  if (pad && capacity > tokens)
    return op->emitOpError() << "pad_to_capacity needs a capacity of at most the " << tokens
                             << " tokens, got " << capacity;
  return success();
}

// The attributes mt.moe_router and mt.moe_router_grad share, against the
// logits [T, E].
template <typename RouterOp>
LogicalResult verifyRouter(RouterOp op) {
  RankedTensorType logits = tensorOf(op.getLogits());
  if (logits.getRank() != 2)
    return op.emitOpError() << "logits must be [tokens, experts], got "
                            << shapeStr(logits.getShape());
  // I64Attr's getters are unsigned: read the attributes as signed.
  const int64_t tokens = logits.getDimSize(0), experts = logits.getDimSize(1),
                topk = op.getTopkAttr().getInt(), seq = op.getSeqLengthAttr().getInt();
  if (topk < 1 || topk > experts)
    return op.emitOpError() << "topk " << topk << " must be between 1 and the " << experts
                            << " experts";
  if (failed(verifyNonNegative(op, "scaling_factor", op.getScalingFactor().convertToDouble(),
                               " (0: none)")) ||
      failed(verifyNonNegative(op, "aux_loss_coeff", op.getAuxLossCoeff().convertToDouble(),
                               "")) ||
      failed(verifyNonNegative(op, "z_loss_coeff", op.getZLossCoeff().convertToDouble(),
                               " (0: off)")) ||
      failed(verifyCapacity(op, op.getCapacityAttr().getInt(), op.getPadToCapacity(), tokens)))
    return failure();
  if (seq < 1 || tokens % seq != 0)
    return op.emitOpError() << "seq_length " << seq << " must divide the " << tokens
                            << " tokens";
  // fp64 routes f64 logits (router_gating_linear's result), and only it.
  if (logits.getElementType().isF64() != (op.getRouterDtype() == MoeRouterDtype::FP64))
    return op.emitOpError() << "logits of " << logits.getElementType()
                            << " need router dtype fp64 and the reverse, got "
                            << stringifyMoeRouterDtype(op.getRouterDtype());
  if (auto g = op.getCountGroupAttr(); g && g.getValue() != "tp")
    return op.emitOpError() << "count_group must be \"tp\" (the tensor-parallel group of "
                               "sequence parallelism), got \""
                            << g.getValue() << "\"";
  return success();
}
} // namespace

LogicalResult MoeRouterOp::verify() {
  if (failed(verifyRouter(*this)))
    return failure();
  ArrayRef<int64_t> te = tensorOf(getLogits()).getShape();
  if (failed(expectShape(*this, "probs", getProbs(), te, "the logits' shape")) ||
      failed(expectShape(*this, "routing_map", getRoutingMap(), te, "the logits' shape")))
    return failure();
  return success();
}

LogicalResult MoeRouterGradOp::verify() {
  if (failed(verifyRouter(*this)))
    return failure();
  ArrayRef<int64_t> te = tensorOf(getLogits()).getShape();
  if (failed(expectShape(*this, "gradient", getGrad(), te, "the logits' shape")) ||
      failed(expectShape(*this, "probs", getProbs(), te, "the logits' shape")) ||
      failed(expectShape(*this, "routing_map", getRoutingMap(), te, "the logits' shape")))
    return failure();
  return success();
}

LogicalResult MoePermuteOp::verify() {
  RankedTensorType x = tensorOf(getInput()), map = tensorOf(getRoutingMap()),
                   y = tensorOf(getResult());
  if (x.getRank() != 2)
    return emitOpError() << "input must be [tokens, hidden], got " << shapeStr(x.getShape());
  if (map.getRank() != 2 || map.getDimSize(0) != x.getDimSize(0))
    return emitOpError() << "routing_map must be [" << x.getDimSize(0)
                         << ", experts] for the input's tokens, got "
                         << shapeStr(map.getShape());
  const int64_t tokens = x.getDimSize(0), hidden = x.getDimSize(1),
                experts = map.getDimSize(1);
  if (y.getRank() != 2 || y.getDimSize(1) != hidden)
    return emitOpError() << "result must be [rows, " << hidden << "], got "
                         << shapeStr(y.getShape());
  if (failed(expectSameElementType(*this, "result", getResult(), getInput(), "input")) ||
      failed(verifyCapacity(*this, getCapacityAttr().getInt(), getPadToCapacity(),
                                x.getDimSize(0))))
    return failure();
  const int64_t rows = y.getDimSize(0), capacity = getCapacityAttr().getInt();
  if (getPadToCapacity()) {
    if (rows != experts * capacity)
      return emitOpError() << "with pad_to_capacity the result has experts * capacity = "
                           << experts * capacity << " rows, got " << rows;
  } else if (capacity > 0) {
    // min(T * topk, E * C).
    if (rows != experts * capacity &&
        (rows % tokens != 0 || rows / tokens > experts || rows > experts * capacity))
      return emitOpError() << "with capacity " << capacity
                           << " the result has min(tokens * topk, experts * capacity) rows, got "
                           << rows;
  } else if (rows < tokens || rows % tokens != 0 || rows / tokens > experts) {
    return emitOpError() << "without capacity the result has tokens * topk rows (a multiple of "
                         << tokens << " up to " << tokens * experts << "), got " << rows;
  }
  if (failed(expectShape(*this, "row_ids", getRowIds(), {rows}, "one per result row")) ||
      failed(expectShape(*this, "tokens_per_expert", getTokensPerExpert(), {experts},
                         "one per expert")))
    return failure();
  return success();
}

LogicalResult MoePermuteGradOp::verify() {
  RankedTensorType dy = tensorOf(getGrad()), dx = getType();
  if (dy.getRank() != 2 || dx.getRank() != 2 || dx.getDimSize(1) != dy.getDimSize(1))
    return emitOpError() << "gradient [rows, hidden] and result [tokens, hidden] must share "
                            "hidden, got "
                         << shapeStr(dy.getShape()) << " and " << shapeStr(dx.getShape());
  if (failed(expectSameElementType(*this, "result", getResult(), getGrad(), "gradient")) ||
      failed(expectShape(*this, "row_ids", getRowIds(), {dy.getDimSize(0)},
                         "one per gradient row")))
    return failure();
  return success();
}

namespace {
// A grouped matmul's rows `a` [N, K or M] against the stacked weight
// [E, M, K]; `aDim` is the weight dimension a's columns match (2: the
// forward's K, 1: the input gradient's M).
LogicalResult verifyGrouped(Operation *op, Value a, StringRef aName, Value weight,
                            Value tokensPerExpert, Value result, int64_t aDim) {
  RankedTensorType x = tensorOf(a), w = tensorOf(weight), y = tensorOf(result);
  if (x.getRank() != 2)
    return op->emitOpError() << aName << " must be [rows, features], got "
                             << shapeStr(x.getShape());
  if (w.getRank() != 3)
    return op->emitOpError() << "weight must be [experts, out, in], got "
                             << shapeStr(w.getShape());
  if (w.getDimSize(aDim) != x.getDimSize(1))
    return op->emitOpError() << "weight " << shapeStr(w.getShape()) << " expects "
                             << w.getDimSize(aDim) << " features but the " << aName
                             << " has " << x.getDimSize(1);
  if (failed(expectShape(op, "tokens_per_expert", tokensPerExpert, {w.getDimSize(0)},
                         "one per expert")) ||
      failed(expectShape(op, "result", result, {x.getDimSize(0), w.getDimSize(3 - aDim)},
                         "[rows, features]")))
    return failure();
  if (x.getElementType() != w.getElementType() || y.getElementType() != x.getElementType())
    return op->emitOpError() << aName << ", weight and result must share an element type";
  return success();
}
} // namespace

LogicalResult MoeGroupedMatmulOp::verify() {
  return verifyGrouped(*this, getInput(), "input", getWeight(), getTokensPerExpert(),
                       getResult(), 2);
}

LogicalResult MoeGroupedMatmulInputGradOp::verify() {
  return verifyGrouped(*this, getGrad(), "gradient", getWeight(), getTokensPerExpert(),
                       getResult(), 1);
}

LogicalResult MoeGroupedMatmulWeightGradOp::verify() {
  RankedTensorType dy = tensorOf(getGrad()), x = tensorOf(getInput());
  if (dy.getRank() != 2 || x.getRank() != 2 || dy.getDimSize(0) != x.getDimSize(0))
    return emitOpError() << "gradient " << shapeStr(dy.getShape()) << " and input "
                         << shapeStr(x.getShape()) << " must be [rows, features] with the "
                         << "same rows";
  return expectSameElementType(*this, "input", getInput(), getGrad(), "gradient");
}

LogicalResult
MoeGroupedMatmulWeightGradOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  RankedTensorType dy = tensorOf(getGrad()), x = tensorOf(getInput());
  const int64_t experts = tensorOf(getTokensPerExpert()).getNumElements();
  return verifyParamUse(*this, symbolTable, getParamAttr(),
                        withShape(dy, {experts, dy.getDimSize(1), x.getDimSize(1)}),
                        "weight");
}

namespace {
// The operands mt.moe_unpermute and its gradient share: rows `y` [N, H],
// probs [T, E], row_ids [N], tokens_per_expert [E]; `tokens` is T (from
// the result or the gradient).
LogicalResult verifyUnpermute(Operation *op, Value y, Value probs, Value rowIds,
                              Value tokensPerExpert, Value out, StringRef outName) {
  RankedTensorType rows = tensorOf(y), p = tensorOf(probs), o = tensorOf(out);
  if (rows.getRank() != 2)
    return op->emitOpError() << "input must be [rows, hidden], got "
                             << shapeStr(rows.getShape());
  if (o.getRank() != 2 || o.getDimSize(1) != rows.getDimSize(1))
    return op->emitOpError() << outName << " must be [tokens, " << rows.getDimSize(1)
                             << "], got " << shapeStr(o.getShape());
  if (p.getRank() != 2 || p.getDimSize(0) != o.getDimSize(0))
    return op->emitOpError() << "probs must be [" << o.getDimSize(0) << ", experts], got "
                             << shapeStr(p.getShape());
  if (failed(expectShape(op, "row_ids", rowIds, {rows.getDimSize(0)}, "one per input row")) ||
      failed(expectShape(op, "tokens_per_expert", tokensPerExpert, {p.getDimSize(1)},
                         "one per expert")) ||
      failed(expectSameElementType(op, outName, out, y, "input")))
    return failure();
  return success();
}
} // namespace

LogicalResult MoeUnpermuteOp::verify() {
  return verifyUnpermute(*this, getInput(), getProbs(), getRowIds(), getTokensPerExpert(),
                         getResult(), "result");
}

LogicalResult MoeUnpermuteGradOp::verify() {
  return verifyUnpermute(*this, getInput(), getProbs(), getRowIds(), getTokensPerExpert(),
                         getGrad(), "gradient");
}

//===----------------------------------------------------------------------===//
// Expert parallelism
//===----------------------------------------------------------------------===//

namespace {
// What mt.moe_dispatch and mt.moe_combine share: E = ep * L experts' counts,
// the rank's expert-major rows `local` [N, H] and the exchanged rows
// `exchanged` [R, H], the layout [etp * ep, L] (one row per source of the
// tensor-and-expert-parallel group).
LogicalResult verifyExchange(Operation *op, int64_t ep, int64_t etp, int64_t numLocal,
                             Value local, StringRef localName, Value exchanged,
                             StringRef exchangedName, Value tokensPerExpert, Value layout) {
  if (ep < 1)
    return op->emitOpError() << "ep_size must be >= 1, got " << ep;
  if (etp < 1)
    return op->emitOpError() << "etp_size must be >= 1, got " << etp;
  if (ep * etp < 2)
    return op->emitOpError() << "exchanges rows between etp_size * ep_size = " << etp * ep
                             << " ranks; it needs at least 2";
  if (numLocal < 1)
    return op->emitOpError() << "num_local_experts must be >= 1, got " << numLocal;
  RankedTensorType a = tensorOf(local), x = tensorOf(exchanged);
  if (a.getRank() != 2)
    return op->emitOpError() << localName << " must be [rows, hidden], got "
                             << shapeStr(a.getShape());
  if (x.getRank() != 2 || x.getDimSize(1) != a.getDimSize(1))
    return op->emitOpError() << exchangedName << " must be [rows, " << a.getDimSize(1)
                             << "], got " << shapeStr(x.getShape());
  if (failed(expectShape(op, "tokens_per_expert", tokensPerExpert, {ep * numLocal},
                         "one per expert of every rank (ep_size * num_local_experts)")) ||
      failed(expectShape(op, "layout", layout, {etp * ep, numLocal},
                         "[etp_size * ep_size, num_local_experts]")) ||
      failed(expectSameElementType(op, exchangedName, exchanged, local, localName)))
    return failure();
  return success();
}
} // namespace

LogicalResult MoeDispatchOp::verify() {
  // I64Attr's getters are unsigned: read the attributes as signed.
  const int64_t ep = getEpSizeAttr().getInt(), numLocal = getNumLocalExpertsAttr().getInt();
  if (failed(verifyExchange(*this, ep, getEtpSizeAttr().getInt(), numLocal, getInput(),
                            "input", getResult(), "result", getTokensPerExpert(),
                            getLayout())) ||
      failed(expectShape(*this, "local_counts", getLocalCounts(), {numLocal},
                         "one per local expert")))
    return failure();
  return success();
}

LogicalResult MoeCombineOp::verify() {
  return verifyExchange(*this, getEpSizeAttr().getInt(), getEtpSizeAttr().getInt(),
                        getNumLocalExpertsAttr().getInt(), getResult(), "result", getInput(),
                        "input", getTokensPerExpert(), getLayout());
}
