// Registers the mt dialect's operations.
#include "dialects/mt/MtDialect.h"
#include "dialects/mt/MtOps.h"

using namespace mlir;
using namespace mt;

#include "dialects/mt/MtDialect.cpp.inc"

void MtDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/mt/MtOps.cpp.inc"
      >();
}
