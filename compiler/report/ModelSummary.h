// What `mtc compile` prints about the model: parameters per component (counted
// from the IR's mt.param ops), the analytic count beside them, and key shapes.
#ifndef MT_COMPILER_MODELSUMMARY_H
#define MT_COMPILER_MODELSUMMARY_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include "spec/Spec.h"

#include <string>
#include <vector>

namespace mt {

struct ModelSummary {
  struct Component {
    std::string name;
    int64_t params = 0;
  };
  std::vector<Component> components; // in model order
  int64_t totalParams = 0;           // from the IR
  // The parameters one token uses: with experts, each MoE layer's routed
  // experts count moe_router_topk of num_experts (equal to totalParams for a
  // dense model).
  int64_t activeParams = 0;
  int64_t analyticParams = 0;        // spec::countParameters
  int64_t analyticActiveParams = 0;
  int64_t numParamTensors = 0;
  int64_t numOps = 0;                // operations in the forward graph (one micro-batch's)
  int64_t numTrainOps = 0;           // operations in @train_step (forward + backward)
  int64_t numStages = 1;             // pipeline stages the counts are summed over
  struct Shape {
    std::string name;
    std::vector<int64_t> dims;
    std::string dtype;
  };
  std::vector<Shape> shapes;         // representative activations
};

ModelSummary summarizeModel(mlir::ModuleOp module, const spec::Spec &spec);

void printSummaryText(llvm::raw_ostream &os, const ModelSummary &summary,
                      const spec::Spec &spec);
void printSummaryJson(llvm::raw_ostream &os, const ModelSummary &summary,
                      const spec::Spec &spec);

} // namespace mt

#endif // MT_COMPILER_MODELSUMMARY_H
