// The named pipeline `mt-train-pipeline`. Passes are added here in the order
// DESIGN.md lists them, as they are written (see docs/architecture.md).
#include "passes/Passes.h"

#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

namespace mt {
#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"
} // namespace mt

using namespace mlir;

namespace mt {

void buildTrainPipeline(OpPassManager &pm, const PipelineOptions &options) {
  // The importer reads tied weights once per use; CSE folds the duplicate
  // reads and canonicalisation removes what became dead.
  pm.addPass(createCSEPass());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createMtShardTpPass());
  pm.addPass(createMtShardEpPass());
  pm.addPass(createMtPartitionPPPass());
  pm.addPass(createMtAutodiffPass());
  pm.addPass(createMtOptimizerPass());
  pm.addPass(createMtRecomputePass());
  pm.addPass(createMtDataParallelPass());
  if (options.fuse)
    pm.addPass(createMtFusePass());
  pm.addPass(createMtSchedulePPPass());
  pm.addPass(createMtPlanMemoryPass());
}

void registerMtPasses() {
  registerCSEPass();
  registerCanonicalizerPass();
  registerMtTransformsPasses();
  PassPipelineRegistration<>("mt-train-pipeline",
                             "The full mt training pipeline that `mtc compile` runs",
                             [](OpPassManager &pm) { buildTrainPipeline(pm); });
}

} // namespace mt
