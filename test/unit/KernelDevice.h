// Where the kernel tests run generated CUDA kernels: the host emulation of
// CUDA (CudaHostKernel.h, memory on the host) or a real GPU (the driver API,
// NVRTC through the kernel cache, device memory). A test writes its checks
// once against KernelDevice and runs them on both.
#ifndef MT_TEST_UNIT_KERNELDEVICE_H
#define MT_TEST_UNIT_KERNELDEVICE_H

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mt::test {

// Every call returns "" or one error line. Addresses are device addresses
// as integers.
class KernelDevice {
public:
  virtual ~KernelDevice() = default;
  // `bytes` of device memory, 256-byte aligned, contents undefined.
  virtual std::string allocate(size_t bytes, uint64_t *address) = 0;
  virtual void release(uint64_t address) = 0;
  virtual std::string to_device(uint64_t dst, const void *src, size_t bytes) = 0;
  virtual std::string to_host(void *dst, uint64_t src, size_t bytes) = 0;
  // Runs kernel `entry` of `source` and waits for it. `args` are the
  // kernel's arguments in order, each 8 bytes (device addresses and
  // unsigned long long scalars), as cuLaunchKernel's params point at them.
  virtual std::string launch(const std::string &source, const std::string &entry,
                             const uint32_t grid[3], const uint32_t block[3],
                             uint32_t sharedBytes, std::vector<uint64_t> args) = 0;

  // One kernel launch of a sequence that time() runs.
  struct Launch {
    std::string source, entry;
    uint32_t grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
    uint32_t sharedBytes = 0;
    std::vector<uint64_t> args;
  };
  // Runs `launches` in order once (compiling them, warming the GPU), then
  // `repeats` more times back to back without waiting between launches,
  // and sets *ms to the wall-clock milliseconds of one run of the
  // sequence, averaged, from the first of those launches until the device
  // has finished the last. The launch overhead is hidden behind kernels
  // that run longer than it (tens of microseconds).
  virtual std::string time(const std::vector<Launch> &launches, int repeats, double *ms) = 0;
};

// The host emulation, one per process (its compiled kernels are kept for
// the whole run).
KernelDevice &emulatedKernelDevice();

// GPU 0 of this machine, one per process, opened on the first call; null
// with *error one line when there is no usable GPU, driver or NVRTC.
// Kernels go through NVRTC and KernelCache's default directory.
KernelDevice *gpuKernelDevice(std::string *error);

// Device copies of host arrays: map() each array, upload() them, launch
// with at()'s addresses, download() them back. A host pointer mapped twice
// (a kernel's input that is also its output, an array two ranks share) has
// one device copy, so in-place and shared access behave as on the host.
// Device memory is released with the mirror.
class Mirror {
public:
  explicit Mirror(KernelDevice &device) : device_(device) {}
  ~Mirror();
  Mirror(const Mirror &) = delete;
  Mirror &operator=(const Mirror &) = delete;

  // Gives [host, host + bytes) a device copy (the larger size wins when
  // the pointer is mapped again).
  std::string map(const void *host, size_t bytes);
  // The device address of a mapped host pointer plus `offset` bytes; 0 when
  // `host` is not mapped (a kernel then faults, and the test fails).
  uint64_t at(const void *host, uint64_t offset = 0) const;
  // Every mapped array, or only `host`'s.
  std::string upload();
  std::string download();
  std::string upload(const void *host);
  std::string download(void *host);

private:
  struct Copy {
    size_t bytes = 0;
    uint64_t address = 0;
  };
  KernelDevice &device_;
  std::map<const void *, Copy> copies_;
};

} // namespace mt::test

// In a test body: `var`, the GPU, or the test is skipped with one line
// saying why there is none.
#define MT_GPU_OR_SKIP(var)                                                                      \
  std::string var##Error;                                                                        \
  mt::test::KernelDevice *var = mt::test::gpuKernelDevice(&var##Error);                          \
  if (!var)                                                                                      \
  GTEST_SKIP() << "no GPU: " << var##Error

// Defines test `name` of `suite` twice from one body, as
// suite##Emulation.name on the host emulation and suite##OnGpu.name on the
// GPU (skipped where there is none). The body sees
// `mt::test::KernelDevice &device`.
#define MT_KERNEL_TEST(suite, name)                                                              \
  static void suite##_##name(mt::test::KernelDevice &device);                                    \
  TEST(suite##Emulation, name) { suite##_##name(mt::test::emulatedKernelDevice()); }             \
  TEST(suite##OnGpu, name) {                                                                     \
    MT_GPU_OR_SKIP(gpu);                                                                         \
    suite##_##name(*gpu);                                                                        \
  }                                                                                              \
  static void suite##_##name(mt::test::KernelDevice &device)

#endif // MT_TEST_UNIT_KERNELDEVICE_H
