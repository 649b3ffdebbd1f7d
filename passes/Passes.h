// The mt pass pipeline: what `mtc compile` runs between import and output.
#ifndef MT_PASSES_PASSES_H
#define MT_PASSES_PASSES_H

#include "mlir/Pass/PassManager.h"

namespace mt {

// Appends the training pipeline (`mt-train-pipeline`) to `pm`.
void buildTrainPipeline(mlir::OpPassManager &pm);

// Registers every mt pass and the named pipeline with MLIR's pass registry,
// for `mtc-opt` and for `--mlir-print-ir-after=PASS` in `mtc`.
void registerMtPasses();

} // namespace mt

#endif // MT_PASSES_PASSES_H
