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

#define GET_OP_CLASSES
#include "dialects/mt/MtOps.h.inc"

#endif // MT_DIALECTS_MT_MTOPS_H
