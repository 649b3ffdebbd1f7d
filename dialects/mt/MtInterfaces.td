// Op interfaces of the mt dialect.
#ifndef MT_INTERFACES_TD
#define MT_INTERFACES_TD

include "mlir/IR/OpBase.td"

def Mt_DifferentiableOpInterface : OpInterface<"DifferentiableOpInterface"> {
  let cppNamespace = "::mt";
  let description = [{
    An op that `mt-autodiff` can differentiate. `buildVJP` receives the
    gradient of each result (null when that result does not reach the loss)
    and appends to `operandGrads` one value per operand: the gradient of that
    operand, or null when the operand is not differentiable (token ids) or
    when the rule wrote the gradient straight into a parameter's gradient
    buffer (weights read with `mt.param_ref`, whose gradients are accumulated
    by ops such as `mt.matmul_weight_grad ... into @w`).
  }];
  let methods = [
    InterfaceMethod<
      "Builds the vector-Jacobian product at the builder's insertion point.",
      "::mlir::LogicalResult", "buildVJP",
      (ins "::mlir::OpBuilder &":$builder,
           "::mlir::ArrayRef<::mlir::Value>":$resultGrads,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGrads)>,
  ];
}

#endif // MT_INTERFACES_TD
