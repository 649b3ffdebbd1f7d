// Opening a rank's GPU (see cuda_device.h).
#include "runtime/exec/cuda/cuda_device.h"

#include "runtime/exec/cuda/kernel_cache.h"

#include <cstdio>
#include <cstdlib>

namespace mt::rt {
namespace {

const char *kNoGpuFix = "run on a machine with an NVIDIA GPU and driver, or use --device cpu";

std::string version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string visible_devices_note() {
  const char *v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? std::string(" (CUDA_VISIBLE_DEVICES=") + v + ")" : std::string();
}

} // namespace

int device_for_local_rank(int local_rank, int device_count) {
  if (local_rank >= 0 && local_rank < device_count)
    return local_rank;
  if (device_count == 1)
    return 0;
  return -1;
}

std::string open_cuda_device(int local_rank, CudaDevice *out) {
  std::string err;
  const cu::Driver *d = cu::load_driver(&err);
  if (!d)
    return "no usable GPU: " + err + "; " + kNoGpuFix;
  out->driver = d;
  if (cu::CUresult r = d->cuInit(0); r != cu::CUDA_SUCCESS) {
    std::string why = "no usable GPU: cuInit returned " + cu::result_name(d, r);
    if (r == cu::CUDA_ERROR_STUB_LIBRARY)
      return why + ": " + d->path + " is the CUDA toolkit's stub, not a driver; take its "
                                    "directory out of LD_LIBRARY_PATH, " + kNoGpuFix;
    return why + visible_devices_note() + "; " + kNoGpuFix;
  }
  if (cu::CUresult r = d->cuDriverGetVersion(&out->driver_version); r != cu::CUDA_SUCCESS)
    return "no usable GPU: cuDriverGetVersion returned " + cu::result_name(d, r) + "; " + kNoGpuFix;
  int count = 0;
  if (cu::CUresult r = d->cuDeviceGetCount(&count); r != cu::CUDA_SUCCESS)
    return "no usable GPU: cuDeviceGetCount returned " + cu::result_name(d, r) + "; " + kNoGpuFix;
  if (count == 0)
    return "no usable GPU: the driver sees no device" + visible_devices_note() + "; " + kNoGpuFix;
  int ordinal = device_for_local_rank(local_rank, count);
  if (ordinal < 0)
    return "local rank " + std::to_string(local_rank) + " has no GPU: this node shows " +
           std::to_string(count) + visible_devices_note() +
           "; start at most one rank per GPU on each node";
  out->ordinal = ordinal;
  if (cu::CUresult r = d->cuDeviceGet(&out->device, ordinal); r != cu::CUDA_SUCCESS)
    return "GPU " + std::to_string(ordinal) + ": cuDeviceGet returned " + cu::result_name(d, r) +
           "; check the device with nvidia-smi, or use --device cpu";
  char name[256] = "";
  d->cuDeviceGetName(name, int(sizeof name) - 1, out->device);
  out->name = name;
  int major = 0, minor = 0;
  d->cuDeviceGetAttribute(&major, cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, out->device);
  d->cuDeviceGetAttribute(&minor, cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, out->device);
  out->arch = 10 * major + minor;
  d->cuDeviceTotalMem(&out->total_memory, out->device);
  d->cuDeviceGetAttribute(&out->max_threads_per_block,
                          cu::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, out->device);
  d->cuDeviceGetAttribute(&out->max_shared_optin,
                          cu::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, out->device);
  if (out->arch < kMinComputeCapability)
    return describe(*out) + " has compute capability " + std::to_string(major) + "." +
           std::to_string(minor) + "; mt needs " + std::to_string(kMinComputeCapability / 10) +
           "." + std::to_string(kMinComputeCapability % 10) +
           " or newer (A100, H100 and later): run on such a GPU, or use --device cpu";
  if (cu::CUresult r = d->cuDevicePrimaryCtxRetain(&out->context, out->device);
      r != cu::CUDA_SUCCESS)
    return describe(*out) + ": cuDevicePrimaryCtxRetain returned " + cu::result_name(d, r) +
           "; the GPU may be in exclusive mode and taken by another process (see nvidia-smi)";
  if (cu::CUresult r = d->cuCtxSetCurrent(out->context); r != cu::CUDA_SUCCESS) {
    d->cuDevicePrimaryCtxRelease(out->device);
    out->context = nullptr;
    return describe(*out) + ": cuCtxSetCurrent returned " + cu::result_name(d, r) +
           "; check the device with nvidia-smi";
  }
  return "";
}

void close_cuda_device(CudaDevice *device) {
  if (device->driver && device->context) {
    device->driver->cuDevicePrimaryCtxRelease(device->device);
    device->context = nullptr;
  }
}

std::string prepare_launch(const CudaDevice &device, cu::CUfunction f, const std::string &kernel,
                           const uint32_t grid[3], const uint32_t block[3], uint32_t sharedBytes,
                           uint32_t *allowed) {
  const cu::Driver &d = *device.driver;
  int staticShared = 0, maxThreads = 0;
  d.cuFuncGetAttribute(&staticShared, cu::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f);
  d.cuFuncGetAttribute(&maxThreads, cu::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f);
  // An attribute the driver did not report (0) leaves the portable limit.
  const uint32_t optin = device.max_shared_optin > staticShared
                             ? uint32_t(device.max_shared_optin - staticShared)
                             : cu::kPortableMaxDynamicSharedBytes;
  if (std::string e = cu::check_launch(kernel, grid, block, sharedBytes, optin); !e.empty())
    return e + " on " + describe(device) +
           (staticShared ? " (after its " + std::to_string(staticShared) +
                               " bytes of static shared memory)"
                         : "");
  const uint64_t threads = uint64_t(block[0]) * block[1] * block[2];
  if (maxThreads > 0 && threads > uint64_t(maxThreads))
    return "kernel '" + kernel + "' cannot launch: " + std::to_string(threads) +
           " threads a block, but its registers allow " + std::to_string(maxThreads) + " on " +
           describe(device);
  if (sharedBytes <= cu::kDefaultMaxDynamicSharedBytes || sharedBytes <= *allowed)
    return "";
  if (cu::CUresult r = d.cuFuncSetAttribute(f, cu::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                            int(sharedBytes));
      r != cu::CUDA_SUCCESS)
    return "allowing kernel '" + kernel + "' " + std::to_string(sharedBytes) +
           " bytes of dynamic shared memory failed on " + describe(device) + ": " +
           cu::result_name(device.driver, r);
  *allowed = sharedBytes;
  return "";
}

std::string check_driver_runs_nvrtc(const CudaDevice &device, const cu::Nvrtc &nvrtc) {
  if (device.driver_version / 1000 >= nvrtc.major)
    return "";
  return "the NVIDIA driver supports CUDA " + version_text(device.driver_version) +
         " but NVRTC at " + nvrtc.path + " is " + std::to_string(nvrtc.major) + "." +
         std::to_string(nvrtc.minor) + ", whose binaries that driver cannot load; update the "
         "driver, or set MT_CUDA_HOME to a CUDA " + std::to_string(device.driver_version / 1000) +
         " toolkit";
}

std::string check_nvrtc_targets(const CudaDevice &device, const cu::Nvrtc &nvrtc) {
  std::string why = nvrtc_arch_unsupported(nvrtc, device.arch);
  if (why.empty())
    return "";
  return describe(device) + ": " + why + "; set MT_CUDA_HOME (or MT_NVRTC_LIBRARY) to a newer "
         "CUDA toolkit whose NVRTC lists sm_" + std::to_string(device.arch);
}

std::string describe(const CudaDevice &d) {
  char mem[32];
  std::snprintf(mem, sizeof mem, "%.1f GiB", double(d.total_memory) / double(1ull << 30));
  return "GPU " + std::to_string(d.ordinal) + " (" + d.name + ", sm_" + std::to_string(d.arch) +
         ", " + mem + ", driver " + version_text(d.driver_version) + ")";
}

} // namespace mt::rt
