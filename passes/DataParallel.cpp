// mt-data-parallel: gradient all-reduce over data-parallel ranks.
#include "passes/Passes.h"

#include "dialects/mt/MtOps.h"

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
    ModuleOp module = getOperation();
    auto par = module->getAttrOfType<DictionaryAttr>("mt.parallel");
    auto i64 = [&](StringRef name) -> int64_t {
      auto a = par ? par.getAs<IntegerAttr>(name) : IntegerAttr();
      return a ? a.getInt() : 1;
    };
    int64_t dp = i64("data_parallel_size");
    if (dp < 1) {
      module.emitError("mt-data-parallel: mt.parallel.data_parallel_size must be >= 1");
      return signalPassFailure();
    }
    auto distOpt = par ? par.getAs<BoolAttr>("use_distributed_optimizer") : BoolAttr();
    // Plain data parallelism only: with tensor or pipeline parallelism or
    // the distributed optimizer the gradients are sharded first, which the
    // sharding passes will do; until then the plan stays a one-rank program.
    if (dp == 1 || i64("tensor_model_parallel_size") != 1 ||
        i64("pipeline_model_parallel_size") != 1 || (distOpt && distOpt.getValue()))
      return;
    auto norm = module.lookupSymbol<func::FuncOp>("grad_norm");
    if (!norm) {
      module.emitError("mt-data-parallel: the module has no @grad_norm; run mt-optimizer first");
      return signalPassFailure();
    }
    // The reduction runs once per step, after the last micro-batch's backward
    // and before the norm, so the norm, the clipping and the update see the
    // global batch's gradient on every rank.
    OpBuilder b(&norm.getBody().front(), norm.getBody().front().begin());
    b.create<AllReduceGradsOp>(norm.getLoc(), b.getStringAttr("dp"),
                               b.getF64FloatAttr(1.0 / double(dp)), ArrayAttr());
    module->setAttr("mt.data_parallel", b.getI64IntegerAttr(dp));
  }
};

} // namespace
} // namespace mt
