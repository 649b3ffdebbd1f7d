// A generated CUDA C kernel compiled as host C++ against the CUDA emulation
// of CudaHostEmulation.h, so tests run it on the CPU (test only).
#ifndef MT_TEST_CUDA_HOST_KERNEL_H
#define MT_TEST_CUDA_HOST_KERNEL_H

#include <memory>
#include <string>

namespace mt::emu {

class HostKernel {
public:
  // Compiles `source` (CUDA C, as given to NVRTC) with the host C++ compiler,
  // the emulation header force-included, into a shared object exporting a
  // launcher for the extern "C" kernel `entry`, and loads it. Objects are
  // cached by the SHA-256 of the source, the entry, the header and the
  // compiler command, under the build tree, so a rerun compiles nothing.
  // On failure returns null and sets `error` to one message with the
  // compiler's first diagnostic lines.
  static std::unique_ptr<HostKernel> compile(const std::string &source, const std::string &entry,
                                             std::string *error);
  ~HostKernel();
  HostKernel(const HostKernel &) = delete;
  HostKernel &operator=(const HostKernel &) = delete;

  // Runs the kernel over the grid. `params` follows cuLaunchKernel's
  // kernelParams: params[i] points to the i-th argument's value. Returns ""
  // or one error line (divergent synchronisation, an invalid launch).
  std::string launch(const unsigned grid[3], const unsigned block[3], unsigned sharedBytes,
                     void **params) const;

  // Whether the shared object came from the cache rather than the compiler.
  bool cached() const { return cached_; }

private:
  HostKernel() = default;
  void *library_ = nullptr;
  using LaunchFn = int (*)(const unsigned *, const unsigned *, unsigned, void **, char *,
                           unsigned long);
  LaunchFn launch_ = nullptr;
  bool cached_ = false;
};

} // namespace mt::emu

#endif // MT_TEST_CUDA_HOST_KERNEL_H
