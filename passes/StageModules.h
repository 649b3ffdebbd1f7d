// The modules a per-program pass runs on: the pipeline stages that
// mt-partition-pp nests in the top module, or the top module itself when
// there are none (pipeline_model_parallel_size = 1).
#ifndef MT_PASSES_STAGEMODULES_H
#define MT_PASSES_STAGEMODULES_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/SmallVector.h"

#include <optional>

namespace mt {

// Nested `builtin.module @stage<K>` ops carry `mt.stage` (their pipeline rank).
inline llvm::SmallVector<mlir::ModuleOp> stageModules(mlir::ModuleOp top) {
  llvm::SmallVector<mlir::ModuleOp> stages;
  for (auto m : top.getOps<mlir::ModuleOp>())
    if (m->hasAttr("mt.stage"))
      stages.push_back(m);
  if (stages.empty())
    stages.push_back(top);
  return stages;
}

// A module attribute (`mt.training`, `mt.parallel`), looked up on `m` and
// then on the modules around it: stage modules read the top module's.
template <typename AttrT = mlir::DictionaryAttr>
AttrT moduleAttr(mlir::ModuleOp m, llvm::StringRef name) {
  for (mlir::Operation *op = m; op; op = op->getParentOp())
    if (auto a = op->getAttrOfType<AttrT>(name))
      return a;
  return {};
}

// The transformer layer an op belongs to (`mt.layer`, from the importer and
// carried to backward ops by mt-autodiff).
inline std::optional<int64_t> layerOf(mlir::Operation *op) {
  if (auto a = op->getAttrOfType<mlir::IntegerAttr>("mt.layer"))
    return a.getInt();
  return std::nullopt;
}

// The stage's pipeline rank, or 0 for a module that is not a stage.
inline int64_t stageRank(mlir::ModuleOp m) {
  if (auto a = m->getAttrOfType<mlir::IntegerAttr>("mt.stage"))
    return a.getInt();
  return 0;
}

} // namespace mt

#endif // MT_PASSES_STAGEMODULES_H
