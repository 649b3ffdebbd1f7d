// Verifiers of the mt dialect's operations: every shape and type invariant
// that later passes and the runtime rely on is checked here.
#include "dialects/mt/MtOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
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
  if (in.getElementType() != w.getElementType() ||
      result.getElementType() != in.getElementType())
    return emitOpError("input, weight and result must share an element type");
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
  return success();
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
  return success();
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
