// mtrun: executes a plan.bin (runtime/train/train_loop.cpp); no MLIR or LLVM inside.
#include "runtime/train/train_loop.h"

int main(int argc, char **argv) { return mt::rt::mtrun_main(argc, argv); }
