// mt-autodiff: @forward -> @train_step (forward + backward) and @eval_step.
#include "passes/Passes.h"

#include "dialects/mt/MtOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace mt {
#define GEN_PASS_DEF_MTAUTODIFFPASS
#include "passes/Passes.h.inc"
} // namespace mt

using namespace mlir;

namespace mt {
namespace {

// Evaluation runs the model in eval mode: no dropout anywhere.
void removeDropout(func::FuncOp f) {
  f.walk([](Operation *op) {
    if (auto d = dyn_cast<DropoutOp>(op)) {
      d.getResult().replaceAllUsesWith(d.getInput());
      d.erase();
    } else if (auto a = dyn_cast<AttentionOp>(op)) {
      a.setDropoutRateAttr(FloatAttr::get(a.getDropoutRateAttr().getType(), 0.0));
    }
  });
}

LogicalResult buildBackward(func::FuncOp f, double seedScale) {
  Block &body = f.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  if (ret.getNumOperands() != 1)
    return f.emitError("mt-autodiff: @forward must return exactly the loss");
  Value loss = ret.getOperand(0);

  OpBuilder b(ret);
  DenseMap<Value, Value> grads;
  grads[loss] = b.create<GradSeedOp>(ret.getLoc(), loss.getType(),
                                     b.getF64FloatAttr(seedScale));

  SmallVector<Operation *> forward;
  for (Operation &op : body.without_terminator())
    forward.push_back(&op);

  for (Operation *op : llvm::reverse(forward)) {
    SmallVector<Value> resultGrads;
    bool any = false;
    for (Value r : op->getResults()) {
      resultGrads.push_back(grads.lookup(r));
      any |= bool(resultGrads.back());
    }
    if (!any)
      continue;
    auto diff = dyn_cast<DifferentiableOpInterface>(op);
    if (!diff) {
      if (isa<ParamRefOp>(op))
        return op->emitError("mt-autodiff: a gradient reached this parameter "
                             "through an op that does not add into its gradient buffer");
      return op->emitError() << "mt-autodiff: '" << op->getName()
                             << "' has no gradient rule";
    }
    SmallVector<Value> operandGrads;
    Operation *lastBefore = ret->getPrevNode();
    if (failed(diff.buildVJP(b, resultGrads, operandGrads)))
      return failure();
    if (operandGrads.size() != op->getNumOperands())
      return op->emitError("mt-autodiff: gradient rule returned the wrong number of gradients");
    for (auto [operand, g] : llvm::zip(op->getOperands(), operandGrads)) {
      if (!g)
        continue;
      Value &slot = grads[operand];
      slot = slot ? b.create<AddOp>(op->getLoc(), slot, g).getResult() : g;
    }
    // Backward ops belong to their forward op's layer (mt-recompute).
    if (Attribute layer = op->getAttr("mt.layer"))
      for (Operation *n = lastBefore->getNextNode(); n != ret; n = n->getNextNode())
        n->setAttr("mt.layer", layer);
  }
  return success();
}

struct MtAutodiffPass : impl::MtAutodiffPassBase<MtAutodiffPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto forward = module.lookupSymbol<func::FuncOp>("forward");
    if (!forward) {
      module.emitError("mt-autodiff: the module has no func.func @forward");
      return signalPassFailure();
    }
    int64_t microBatches = 1;
    if (auto t = module->getAttrOfType<DictionaryAttr>("mt.training"))
      if (auto m = t.getAs<IntegerAttr>("num_micro_batches"))
        microBatches = m.getInt();
    if (microBatches < 1) {
      module.emitError("mt-autodiff: mt.training.num_micro_batches must be >= 1");
      return signalPassFailure();
    }

    OpBuilder b(forward);
    auto train = cast<func::FuncOp>(b.clone(*forward));
    train.setSymName("train_step");
    auto eval = cast<func::FuncOp>(b.clone(*forward));
    eval.setSymName("eval_step");
    forward.erase();

    removeDropout(eval);
    if (failed(buildBackward(train, 1.0 / double(microBatches))))
      return signalPassFailure();
    // mt.tp_copy is the identity once its gradient (an all-reduce) exists.
    for (func::FuncOp f : {train, eval})
      f.walk([](TpCopyOp c) {
        c.getResult().replaceAllUsesWith(c.getInput());
        c.erase();
      });
  }
};

} // namespace
} // namespace mt
