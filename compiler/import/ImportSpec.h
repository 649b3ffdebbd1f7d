// Spec -> mt IR: the forward graph and loss of one micro-batch, layers unrolled.
#ifndef MT_COMPILER_IMPORTSPEC_H
#define MT_COMPILER_IMPORTSPEC_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"

#include "spec/Spec.h"

namespace mt {

// Builds `func.func @forward(%tokens, %labels) -> tensor<f32>` and one
// `mt.param` per parameter. The caller has loaded the mt and func dialects.
mlir::OwningOpRef<mlir::ModuleOp> importSpec(mlir::MLIRContext &context,
                                             const spec::Spec &spec);

} // namespace mt

#endif // MT_COMPILER_IMPORTSPEC_H
