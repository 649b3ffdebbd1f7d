// CUDA C for an mt.fused region: one self-contained kernel per region,
// specialised for its exact shapes and dtypes (docs/architecture.md, "Kernels").
#ifndef MT_COMPILER_CUDAKERNELGEN_H
#define MT_COMPILER_CUDAKERNELGEN_H

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mlir {
class Operation;
class Type;
} // namespace mlir

namespace mt {

// "4x128x64xbf16": a ranked tensor type's shape and element type, the
// spelling kernel names, comments and the model fingerprint use.
std::string shapeKey(mlir::Type tensorType);

// What the plan's Kernel entry records about the CUDA form of a kernel
// (runtime/plan/plan.fbs documents the argument order).
struct CudaKernel {
  std::string entry;  // the extern "C" __global__ function in `source`
  std::string source; // compiles with NVRTC alone: no includes, no options needed
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t sharedBytes = 0; // dynamic shared memory of the launch
  // After the pointer arguments, in order: "seed" and "rng_offset" (each a
  // `const unsigned long long *` to the value on the device), "tp_rank" or
  // "stream" (each an `unsigned long long`; values in `streams`).
  std::vector<std::string> scalarArgs;
  std::vector<uint64_t> streams;
  int vectorWidth = 1; // elements per thread and access (8 halfs or 4 floats: 128 bits)
};

struct CudaKernelOptions {
  int64_t tensorParallel = 1; // tensor-parallel size: dropout of a shard maps its indices
};

// The device helpers every generated source starts with: mt_u64, the 16-bit
// storage structs mt_bf16 / mt_f16 and their conversions (round half to
// even), 128-bit accesses (mt_load / mt_store of V lanes), Philox4x32-10
// (mt_philox) and dropout, GeLU and sigmoid, block sums, so that a source
// compiles with NVRTC alone. The other generators (CudaOpKernels,
// FlashAttentionGen) build on it so that every kernel rounds and draws
// random numbers the same way.
const char *cudaKernelPrelude();

// A float constant as CUDA C, exact to float precision ("0.125f").
std::string cudaFloatLiteral(double v);

// FNV-1a of a source: generated entries are named after it, so identical
// sources share one name and one compiled binary.
uint32_t cudaSourceHash(const std::string &source);

// Generates the kernel of `fused`, an mt.fused op. On failure returns
// nothing and sets `error` to what the generator cannot express.
std::optional<CudaKernel> generateCudaKernel(mlir::Operation *fused,
                                             const CudaKernelOptions &options,
                                             std::string *error);

} // namespace mt

#endif // MT_COMPILER_CUDAKERNELGEN_H
