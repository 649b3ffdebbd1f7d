// mt-autodiff: @forward -> @train_step (forward + backward) and @eval_step.
#include "passes/Passes.h"

#include "dialects/mt/MtOps.h"
#include "passes/StageModules.h"

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

LogicalResult buildBackward(func::FuncOp f, double seedScale, bool stage) {
  Block &body = f.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  // The loss is the one result without `mt.name`. Named results (an MoE
  // model's load_balancing_loss and z_loss sums) are outputs for the log:
  // they are not seeded, since mt.moe_router_grad adds the auxiliary
  // losses' gradients itself, scaled as Megatron scales them.
  Value loss;
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    if (f.getResultAttrOfType<StringAttr>(i, "mt.name")) {
      auto t = dyn_cast<RankedTensorType>(v.getType());
      if (!t || t.getRank() != 0 || !t.getElementType().isF32())
        return f.emitError() << "mt-autodiff: @forward's named result #" << i
                             << " must be an f32 scalar, got " << v.getType();
      continue;
    }
    if (loss)
      return f.emitError("mt-autodiff: @forward must return exactly one loss (its other "
                         "results are named with mt.name)");
    loss = v;
  }
  // A pipeline stage without the loss returns no loss: its backward starts
  // at the gradients its mt.send ops receive back.
  if (!loss && !stage)
    return f.emitError("mt-autodiff: @forward must return exactly one loss (its other "
                       "results are named with mt.name)");

  OpBuilder b(ret);
  DenseMap<Value, Value> grads;
  // The seed also marks where the backward begins (mt-recompute,
  // mt-schedule-pp), so a stage without the loss gets one too, unused.
  auto seed = b.create<GradSeedOp>(ret.getLoc(), RankedTensorType::get({}, b.getF32Type()),
                                   b.getF64FloatAttr(seedScale));
  if (loss) {
    grads[loss] = seed;
    if (Operation *def = loss.getDefiningOp())
      if (Attribute chunk = def->getAttr("mt.chunk"))
        seed->setAttr("mt.chunk", chunk);
  }

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
    // A send has no results: its gradient comes back from its peer.
    if (!any && !isa<SendOp>(op))
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
    // Backward ops belong to their forward op's layer (mt-recompute) and
    // pipeline chunk (mt-schedule-pp).
    for (StringRef name : {"mt.layer", "mt.chunk"})
      if (Attribute a = op->getAttr(name))
        for (Operation *n = lastBefore->getNextNode(); n != ret; n = n->getNextNode())
          n->setAttr(name, a);
  }
  return success();
}

struct MtAutodiffPass : impl::MtAutodiffPassBase<MtAutodiffPass> {
  void runOnOperation() override {
    for (ModuleOp stage : stageModules(getOperation()))
      if (failed(runOnStage(stage)))
        return signalPassFailure();
  }

  LogicalResult runOnStage(ModuleOp module) {
    auto forward = module.lookupSymbol<func::FuncOp>("forward");
    if (!forward) {
      return module.emitError("mt-autodiff: the module has no func.func @forward");
    }
    int64_t microBatches = 1;
    if (auto t = moduleAttr(module, "mt.training"))
      if (auto m = t.getAs<IntegerAttr>("num_micro_batches"))
        microBatches = m.getInt();
    if (microBatches < 1) {
      return module.emitError("mt-autodiff: mt.training.num_micro_batches must be >= 1");
    }

    // Megatron's default: each micro-batch's mean loss over the micro-batch
    // count, then the data-parallel mean. --calculate-per-token-loss: the
    // token losses summed over the global batch, over its token count; the
    // seed of a rank's mean-loss backward is then its micro-batch's tokens
    // times dp (the data-parallel reduction averages) over the global
    // batch's. With every label counted (mt has no loss mask) that is the
    // same number.
    double seedScale = 1.0 / double(microBatches);
    if (auto t = moduleAttr(module, "mt.training")) {
      auto mbTokens = t.getAs<IntegerAttr>("loss_tokens_per_micro_batch");
      auto iterTokens = t.getAs<IntegerAttr>("loss_tokens_per_iteration");
      if (mbTokens || iterTokens) {
        IntegerAttr dp;
        if (auto p = moduleAttr(module, "mt.parallel"))
          dp = p.getAs<IntegerAttr>("data_parallel_size");
        if (!mbTokens || !iterTokens || mbTokens.getInt() < 1 || iterTokens.getInt() < 1)
          return module.emitError("mt-autodiff: per-token loss needs both "
                                  "mt.training.loss_tokens_per_micro_batch and "
                                  "loss_tokens_per_iteration, each >= 1");
        int64_t dpSize = dp ? dp.getInt() : 1;
        if (mbTokens.getInt() * dpSize * microBatches != iterTokens.getInt())
          return module.emitError()
                 << "mt-autodiff: per-token loss: " << microBatches << " micro-batches of "
                 << mbTokens.getInt() << " tokens on " << dpSize
                 << " data-parallel ranks are not the iteration's " << iterTokens.getInt()
                 << " tokens";
        seedScale = double(mbTokens.getInt() * dpSize) / double(iterTokens.getInt());
      }
    }

    OpBuilder b(forward);
    auto train = cast<func::FuncOp>(b.clone(*forward));
    train.setSymName("train_step");
    auto eval = cast<func::FuncOp>(b.clone(*forward));
    eval.setSymName("eval_step");
    forward.erase();

    removeDropout(eval);
    if (failed(buildBackward(train, seedScale, module->hasAttr("mt.stage"))))
      return failure();
    // mt.tp_copy is the identity once its gradient (an all-reduce) exists.
    for (func::FuncOp f : {train, eval})
      f.walk([](TpCopyOp c) {
        c.getResult().replaceAllUsesWith(c.getInput());
        c.erase();
      });
    return success();
  }
};

} // namespace
} // namespace mt
