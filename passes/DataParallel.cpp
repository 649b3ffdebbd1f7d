// mt-data-parallel: gradient all-reduce over data-parallel ranks.
#include "passes/Passes.h"

#include "dialects/mt/MtOps.h"
#include "passes/StageModules.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mt {
#define GEN_PASS_DEF_MTDATAPARALLELPASS
#include "passes/Passes.h.inc"
} // namespace mt

using namespace mlir;

namespace mt {
namespace {

struct MtDataParallelPass : impl::MtDataParallelPassBase<MtDataParallelPass> {
  void runOnOperation() override {
    for (ModuleOp stage : stageModules(getOperation()))
      if (failed(runOnStage(stage)))
        return signalPassFailure();
  }

  LogicalResult runOnStage(ModuleOp module) {
    auto par = moduleAttr(module, "mt.parallel");
    auto i64 = [&](StringRef name) -> int64_t {
      auto a = par ? par.getAs<IntegerAttr>(name) : IntegerAttr();
      return a ? a.getInt() : 1;
    };
    int64_t dp = i64("data_parallel_size");
    if (dp < 1) {
      return module.emitError("mt-data-parallel: mt.parallel.data_parallel_size must be >= 1");
    }
    auto distOpt = par ? par.getAs<BoolAttr>("use_distributed_optimizer") : BoolAttr();
    // Plain data parallelism, also of pipeline stages (each stage's
    // replicas average their gradients): with tensor parallelism or the
    // distributed optimizer the gradients are sharded first, which the
    // sharding passes will do; until then the plan stays a one-rank program.
    if (dp == 1 || i64("tensor_model_parallel_size") != 1 || (distOpt && distOpt.getValue()))
      return success();
    auto norm = module.lookupSymbol<func::FuncOp>("grad_norm");
    if (!norm) {
      return module.emitError(
          "mt-data-parallel: the module has no @grad_norm; run mt-optimizer first");
    }
    // The reduction runs once per step, after the last micro-batch's backward
    // and before the norm, so the norm, the clipping and the update see the
    // global batch's gradient on every rank.
    OpBuilder b(&norm.getBody().front(), norm.getBody().front().begin());
    b.create<AllReduceGradsOp>(norm.getLoc(), b.getStringAttr("dp"),
                               b.getF64FloatAttr(1.0 / double(dp)));
    module->setAttr("mt.data_parallel", b.getI64IntegerAttr(dp));
    return success();
  }
};

} // namespace
} // namespace mt
