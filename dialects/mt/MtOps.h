// Operations of the mt dialect.
#ifndef MT_DIALECTS_MT_MTOPS_H
#define MT_DIALECTS_MT_MTOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialects/mt/MtDialect.h"
#include "dialects/mt/MtEnums.h.inc"

namespace mt {
// Side-effect resources: the gradient buffers that backward ops add into, and
// the weights and optimizer state that mt.adamw updates.
struct GradBuffersResource
    : public mlir::SideEffects::Resource::Base<GradBuffersResource> {
  llvm::StringRef getName() final { return "mt.grad_buffers"; }
};
struct ParamStateResource
    : public mlir::SideEffects::Resource::Base<ParamStateResource> {
  llvm::StringRef getName() final { return "mt.param_state"; }
};

// The type of mt.attention's log-sum-exp for a query of type `query`
// ([batch, seq, heads, head_dim]): f32 [batch, heads, seq]. Any other query
// type gives an unranked tensor, which no lse matches, so the op's type
// constraint fails and its verifier names the bad query.
mlir::Type attentionLseType(mlir::Type query);
} // namespace mt

#include "dialects/mt/MtInterfaces.h.inc"

#define GET_OP_CLASSES
#include "dialects/mt/MtOps.h.inc"

#endif // MT_DIALECTS_MT_MTOPS_H
