// The launch limits of every GPU mt runs on (compute capability 8.0 or
// newer), as plain numbers: the compiler checks each kernel it generates
// against them, the emulation tests check each launch they run, and the
// CUDA executor checks each kernel again at load against its own GPU's
// figures (cuda_device.h, prepare_launch). A kernel outside them is refused
// with one line naming it, never left to a driver's CUDA_ERROR_INVALID_VALUE.
// Header only: the compiler uses it without linking the runtime.
#ifndef MT_RUNTIME_CUDA_LAUNCH_LIMITS_H
#define MT_RUNTIME_CUDA_LAUNCH_LIMITS_H

#include <cstdint>
#include <string>

namespace mt::cu {

// Threads in a block, and the block's and the grid's dimensions (the CUDA C
// Programming Guide's table of limits per compute capability: the same for
// every one since 3.0).
constexpr uint32_t kMaxThreadsPerBlock = 1024;
constexpr uint32_t kMaxBlockDim[3] = {1024, 1024, 64};
constexpr uint32_t kMaxGridDim[3] = {0x7FFFFFFFu, 65535, 65535};

// Dynamic shared memory a kernel may use without opting in through
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES; more needs the opt-in,
// else the launch fails with CUDA_ERROR_INVALID_VALUE.
constexpr uint32_t kDefaultMaxDynamicSharedBytes = 48 * 1024;

// The most a block may opt in to on every architecture mt runs on: 99 KiB on
// sm_86, sm_89 and sm_120 (163 KiB on sm_80 and sm_87, 227 KiB on sm_90 and
// sm_100). A generated kernel stays within it, so a plan runs on any of
// them; the device's own figure is CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN.
constexpr uint32_t kPortableMaxDynamicSharedBytes = 99 * 1024;

// "" when a launch of `kernel` with this grid, block and dynamic shared
// memory is within the limits (`maxSharedBytes`: the opt-in limit it must
// respect), else one line naming the kernel and the limit it passes.
inline std::string check_launch(const std::string &kernel, const uint32_t grid[3],
                                const uint32_t block[3], uint32_t sharedBytes,
                                uint32_t maxSharedBytes = kPortableMaxDynamicSharedBytes) {
  const char *axis = "xyz";
  const uint64_t threads = uint64_t(block[0]) * block[1] * block[2];
  std::string bad;
  for (int i = 0; i < 3 && bad.empty(); ++i) {
    if (block[i] == 0 || grid[i] == 0)
      bad = std::string(block[i] == 0 ? "block" : "grid") + " dimension " + axis[i] + " is 0";
    else if (block[i] > kMaxBlockDim[i])
      bad = "block dimension " + std::string(1, axis[i]) + " is " + std::to_string(block[i]) +
            ", over the limit of " + std::to_string(kMaxBlockDim[i]);
    else if (grid[i] > kMaxGridDim[i])
      bad = "grid dimension " + std::string(1, axis[i]) + " is " + std::to_string(grid[i]) +
            ", over the limit of " + std::to_string(kMaxGridDim[i]);
  }
  if (bad.empty() && threads > kMaxThreadsPerBlock)
    bad = std::to_string(threads) + " threads a block, over the limit of " +
          std::to_string(kMaxThreadsPerBlock);
  if (bad.empty() && sharedBytes > maxSharedBytes)
    bad = std::to_string(sharedBytes) + " bytes of dynamic shared memory, over the " +
          std::to_string(maxSharedBytes) + " a block may opt in to" +
          (maxSharedBytes == kPortableMaxDynamicSharedBytes
               ? " on every GPU mt runs on (sm_86, sm_89 and sm_120 allow no more)"
               : "");
  return bad.empty() ? "" : "kernel '" + kernel + "' cannot launch: " + bad;
}

} // namespace mt::cu

#endif // MT_RUNTIME_CUDA_LAUNCH_LIMITS_H
