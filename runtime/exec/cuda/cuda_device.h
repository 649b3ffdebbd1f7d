// Opening one GPU for a rank through the driver API: load libcuda.so.1,
// cuInit, pick the rank's device, check it can run mt's kernels, and make
// its primary context current (the context cuBLASLt and NCCL also use).
#ifndef MT_RUNTIME_CUDA_DEVICE_H
#define MT_RUNTIME_CUDA_DEVICE_H

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/exec/cuda/cuda_api.h"

namespace mt::rt {

// mt's kernels use bf16 tensor cores and asynchronous copies: Ampere or newer.
constexpr int kMinComputeCapability = 80;

struct CudaDevice {
  const cu::Driver *driver = nullptr;
  int ordinal = -1;          // among the devices this process sees
  cu::CUdevice device = 0;
  cu::CUcontext context = nullptr;
  std::string name;          // "NVIDIA H100 80GB HBM3"
  int arch = 0;              // 10 * major + minor compute capability
  int driver_version = 0;    // cuDriverGetVersion: 1000 * major + 10 * minor
  size_t total_memory = 0;
  // Launch limits (cuDeviceGetAttribute): threads a block, and the dynamic
  // plus static shared memory a block may opt in to.
  int max_threads_per_block = 0;
  int max_shared_optin = 0;
};

// Which device a rank uses: its local rank when that many devices are
// visible; device 0 when exactly one is (SLURM's --gpus-per-task and
// per-rank CUDA_VISIBLE_DEVICES show each rank only its own GPU); otherwise
// -1 (more ranks on the node than GPUs).
int device_for_local_rank(int local_rank, int device_count);

// Opens the device for `local_rank`. Returns "" or one line that says what
// is missing and what to do, e.g. "no usable GPU: cuInit returned
// CUDA_ERROR_NO_DEVICE (100); run on a machine with an NVIDIA GPU and
// driver, or use --device cpu".
std::string open_cuda_device(int local_rank, CudaDevice *out);

// Releases the primary context open_cuda_device retained.
void close_cuda_device(CudaDevice *device);

// "" when the driver can load CUBINs from this NVRTC (the driver's CUDA
// major version is at least NVRTC's), else one line saying which to change.
std::string check_driver_runs_nvrtc(const CudaDevice &device, const cu::Nvrtc &nvrtc);

// "" when this NVRTC can compile for the device's architecture, else one line
// saying so and what to change (a GPU newer than the toolkit).
std::string check_nvrtc_targets(const CudaDevice &device, const cu::Nvrtc &nvrtc);

// Readies function `f` (entry `kernel`) of a module loaded on `device` for
// launches with this grid, block and dynamic shared memory: "" or one line
// naming the kernel and the limit it passes (launch_limits.h's, this GPU's
// opt-in shared memory less the function's static shared memory, the
// threads its registers allow). Over 48 KiB it opts the function in
// (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) unless `*allowed`, the
// most this function was allowed before (0 at first), already covers it;
// `*allowed` is then raised, never lowered, so entries sharing a function
// each get what they ask. The CUDA executor and the GPU kernel tests both
// launch through it.
std::string prepare_launch(const CudaDevice &device, cu::CUfunction f, const std::string &kernel,
                           const uint32_t grid[3], const uint32_t block[3], uint32_t sharedBytes,
                           uint32_t *allowed);

// "GPU 0 (NVIDIA H100 80GB HBM3, sm_90, 79.1 GiB, driver 13.0)"
std::string describe(const CudaDevice &device);

} // namespace mt::rt

#endif // MT_RUNTIME_CUDA_DEVICE_H
