// mtc-opt: mlir-opt with the mt dialect and every mt pass, for pass tests.
#include "dialects/mt/MtOps.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mt::registerMtPasses();
  mlir::DialectRegistry registry;
  registry.insert<mt::MtDialect, mlir::func::FuncDialect>();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "mt optimizer driver\n", registry));
}
