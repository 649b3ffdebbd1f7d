// The mt dialect class.
#ifndef MT_DIALECTS_MT_MTDIALECT_H
#define MT_DIALECTS_MT_MTDIALECT_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Dialect.h"

#include "dialects/mt/MtDialect.h.inc"

#endif // MT_DIALECTS_MT_MTDIALECT_H
