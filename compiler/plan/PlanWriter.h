// Lowers the planned training IR (after mt-plan-memory) to plan.bin's
// FlatBuffer (schema: runtime/plan/plan.fbs).
#ifndef MT_COMPILER_PLANWRITER_H
#define MT_COMPILER_PLANWRITER_H

#include "compiler/cuda/GpuSteps.h"
#include "spec/Spec.h"

#include "mlir/IR/BuiltinOps.h"

#include <string>

namespace mt {

// The plan's FlatBuffer payload (without the file header), or failure with a
// diagnostic emitted on the op that could not be lowered. `kernels`: the
// kernel choices the spec leaves open (mtc compile's --flash-backward).
mlir::FailureOr<std::string> buildPlanPayload(mlir::ModuleOp module,
                                              const spec::Spec &spec,
                                              const GpuKernelOptions &kernels = {});

// A fingerprint of every parameter's name, shape and type: checkpoints carry
// it, so a checkpoint of another model is refused by name.
std::string modelFingerprint(mlir::ModuleOp module);

} // namespace mt

#endif // MT_COMPILER_PLANWRITER_H
