// The mt pass pipeline: what `mtc compile` runs between import and output.
#ifndef MT_PASSES_PASSES_H
#define MT_PASSES_PASSES_H

#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

#include "dialects/mt/MtDialect.h"

namespace mt {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

// Choices in the training pipeline; the defaults are what `mtc compile` runs.
struct PipelineOptions {
  // mt-fuse. Off, every op is its own kernel (`mtc compile --no-fuse`), to
  // compare a fused plan against one without fusion.
  bool fuse = true;
};

// Appends the training pipeline (`mt-train-pipeline`) to `pm`.
void buildTrainPipeline(mlir::OpPassManager &pm, const PipelineOptions &options = {});

// Registers every mt pass and the named pipeline with MLIR's pass registry,
// for `mtc-opt` and for `--mlir-print-ir-after=PASS` in `mtc`.
void registerMtPasses();

} // namespace mt

#endif // MT_PASSES_PASSES_H
