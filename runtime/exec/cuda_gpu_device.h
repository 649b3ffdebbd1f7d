// The GpuDevice (gpu_executor.h) of a real GPU: the rank's device through
// the driver API, kernels from NVRTC through the on-disk kernel cache, GEMMs
// through cuBLASLt with an algorithm chosen once per shape, a compute stream
// and a side stream for the data-parallel collectives.
#ifndef MT_RUNTIME_CUDA_GPU_DEVICE_H
#define MT_RUNTIME_CUDA_GPU_DEVICE_H

#include "runtime/exec/cuda/cuda_device.h"
#include "runtime/exec/gpu_executor.h"

#include <memory>
#include <string>

namespace mt::rt {

// Opens the GPU of `local_rank` (cuda_device.h), NVRTC and cuBLASLt, and
// allocates cuBLASLt's 32 MiB workspace. `cache_dir` as KernelCache's ("":
// the default). Null with *error one line when anything is missing.
std::unique_ptr<GpuDevice> open_cuda_gpu_device(int local_rank, const std::string &cache_dir,
                                                std::string *error);

} // namespace mt::rt

#endif // MT_RUNTIME_CUDA_GPU_DEVICE_H
