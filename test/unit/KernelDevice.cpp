// The two KernelDevices (KernelDevice.h): the host emulation and GPU 0.
#include "KernelDevice.h"

#include "CudaHostKernel.h"

#include "runtime/exec/cuda/cuda_api.h"
#include "runtime/exec/cuda/cuda_device.h"
#include "runtime/exec/cuda/kernel_cache.h"
#include "runtime/exec/cuda/launch_limits.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

namespace mt::test {

namespace {

// Device memory is host memory, kernels the host-compiled sources.
class EmulatedKernelDevice : public KernelDevice {
public:
  std::string allocate(size_t bytes, uint64_t *address) override {
    std::vector<uint8_t> block(bytes + 256, 0xFF); // poisoned: NaN floats until written
    const uint64_t p = reinterpret_cast<uint64_t>(block.data());
    *address = (p + 255) / 256 * 256;
    blocks_[*address] = std::move(block);
    return "";
  }
  void release(uint64_t address) override { blocks_.erase(address); }
  std::string to_device(uint64_t dst, const void *src, size_t bytes) override {
    std::memcpy(reinterpret_cast<void *>(dst), src, bytes);
    return "";
  }
  std::string to_host(void *dst, uint64_t src, size_t bytes) override {
    std::memcpy(dst, reinterpret_cast<const void *>(src), bytes);
    return "";
  }
  std::string launch(const std::string &source, const std::string &entry, const uint32_t grid[3],
                     const uint32_t block[3], uint32_t sharedBytes,
                     std::vector<uint64_t> args) override {
    // The limits every GPU mt runs on has (launch_limits.h), so a kernel
    // the GPU would refuse fails here too, on the CPU.
    if (std::string e = mt::cu::check_launch(entry, grid, block, sharedBytes); !e.empty())
      return e;
    auto &slot = kernels_[{entry, source}];
    if (!slot) {
      std::string error;
      slot = mt::emu::HostKernel::compile(source, entry, &error);
      if (!slot)
        return "compiling '" + entry + "' for the emulation: " + error;
    }
    std::vector<void *> params;
    for (uint64_t &a : args)
      params.push_back(&a);
    const unsigned g[3] = {grid[0], grid[1], grid[2]}, b[3] = {block[0], block[1], block[2]};
    return slot->launch(g, b, sharedBytes, params.data());
  }
  std::string time(const std::vector<Launch> &launches, int repeats, double *ms) override {
    // The host runs each launch to its end: the same sequence, host speed.
    auto run = [&] {
      for (const Launch &l : launches)
        if (std::string e = launch(l.source, l.entry, l.grid, l.block, l.sharedBytes, l.args); !e.empty())
          return e;
      return std::string();
    };
    if (std::string e = run(); !e.empty())
      return e;
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < repeats; ++r)
      if (std::string e = run(); !e.empty())
        return e;
    *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
          std::max(repeats, 1);
    return "";
  }

private:
  std::map<uint64_t, std::vector<uint8_t>> blocks_;
  std::map<std::pair<std::string, std::string>, std::unique_ptr<mt::emu::HostKernel>> kernels_;
};

// GPU 0 through the driver API on the legacy default stream: synchronous
// copies, and a context synchronisation after each launch so a fault is
// reported by the launch that caused it. Each function is readied as
// runtime/exec/cuda_gpu_device.cpp readies it (cuda_device.h,
// prepare_launch: this GPU's limits checked, more than 48 KiB of dynamic
// shared memory opted in to), then launched with cuLaunchKernel.
class GpuKernelDevice : public KernelDevice {
public:
  ~GpuKernelDevice() override {
    if (!dev_.driver)
      return;
    for (cu::CUdeviceptr p : live_)
      dev_.driver->cuMemFree(p);
    for (cu::CUmodule m : modules_)
      dev_.driver->cuModuleUnload(m);
    mt::rt::close_cuda_device(&dev_);
  }

  std::string open() {
    if (std::string e = mt::rt::open_cuda_device(0, &dev_); !e.empty())
      return e;
    std::string error;
    const cu::Nvrtc *nvrtc = cu::load_nvrtc(&error);
    if (!nvrtc)
      return error;
    if (std::string e = mt::rt::check_driver_runs_nvrtc(dev_, *nvrtc); !e.empty())
      return e;
    cache_ = std::make_unique<mt::rt::KernelCache>(nvrtc, "");
    return "";
  }

  std::string allocate(size_t bytes, uint64_t *address) override {
    cu::CUdeviceptr p = 0;
    if (std::string e = check(dev_.driver->cuMemAlloc(&p, bytes ? bytes : 1),
                              "cuMemAlloc of " + std::to_string(bytes) + " bytes");
        !e.empty())
      return e;
    live_.push_back(p);
    *address = p;
    return "";
  }
  void release(uint64_t address) override {
    for (size_t i = 0; i < live_.size(); ++i)
      if (live_[i] == address) {
        dev_.driver->cuMemFree(address);
        live_.erase(live_.begin() + long(i));
        return;
      }
  }
  std::string to_device(uint64_t dst, const void *src, size_t bytes) override {
    return check(dev_.driver->cuMemcpyHtoD(dst, src, bytes), "cuMemcpyHtoD");
  }
  std::string to_host(void *dst, uint64_t src, size_t bytes) override {
    return check(dev_.driver->cuMemcpyDtoH(dst, src, bytes), "cuMemcpyDtoH");
  }

  std::string launch(const std::string &source, const std::string &entry, const uint32_t grid[3],
                     const uint32_t block[3], uint32_t sharedBytes,
                     std::vector<uint64_t> args) override {
    cu::CUfunction f = nullptr;
    if (std::string e = function(source, entry, &f); !e.empty())
      return e;
    if (std::string e = mt::rt::prepare_launch(dev_, f, entry, grid, block, sharedBytes,
                                               &sharedAllowed_[f]);
        !e.empty())
      return e;
    std::vector<void *> params;
    for (uint64_t &a : args)
      params.push_back(&a);
    if (std::string e = check(dev_.driver->cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0],
                                                          block[1], block[2], sharedBytes, nullptr,
                                                          params.data(), nullptr),
                              "cuLaunchKernel '" + entry + "'");
        !e.empty())
      return e;
    return check(dev_.driver->cuCtxSynchronize(), "cuCtxSynchronize after '" + entry + "'");
  }

  std::string time(const std::vector<Launch> &launches, int repeats, double *ms) override {
    std::vector<cu::CUfunction> functions;
    for (const Launch &l : launches) {
      cu::CUfunction f = nullptr;
      if (std::string e = function(l.source, l.entry, &f); !e.empty())
        return e;
      // Readied as launch() readies it: a kernel timed before it was ever
      // launched (kv128's backward in mt-flash-bench) needs its opt-in too.
      if (std::string e = mt::rt::prepare_launch(dev_, f, l.entry, l.grid, l.block, l.sharedBytes,
                                                 &sharedAllowed_[f]);
          !e.empty())
        return e;
      functions.push_back(f);
    }
    // Launched without a wait in between; a fault shows at the synchronisation.
    auto run = [&] {
      for (size_t i = 0; i < launches.size(); ++i) {
        const Launch &l = launches[i];
        std::vector<uint64_t> args = l.args;
        std::vector<void *> params;
        for (uint64_t &a : args)
          params.push_back(&a);
        if (std::string e = check(dev_.driver->cuLaunchKernel(functions[i], l.grid[0], l.grid[1], l.grid[2],
                                                              l.block[0], l.block[1], l.block[2], l.sharedBytes,
                                                              nullptr, params.data(), nullptr),
                                  "cuLaunchKernel '" + l.entry + "'");
            !e.empty())
          return e;
      }
      return std::string();
    };
    if (std::string e = run(); !e.empty())
      return e;
    if (std::string e = check(dev_.driver->cuCtxSynchronize(), "cuCtxSynchronize after the warm-up run"); !e.empty())
      return e;
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < repeats; ++r)
      if (std::string e = run(); !e.empty())
        return e;
    if (std::string e = check(dev_.driver->cuCtxSynchronize(), "cuCtxSynchronize after the timed runs"); !e.empty())
      return e;
    *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
          std::max(repeats, 1);
    return "";
  }

private:
  std::string function(const std::string &source, const std::string &entry, cu::CUfunction *f) {
    auto known = functions_.find({entry, source});
    if (known != functions_.end()) {
      *f = known->second;
      return "";
    }
    std::string cubin, error;
    if (!cache_->get(entry, source, dev_.arch, &cubin, &error))
      return error;
    cu::CUmodule module = nullptr;
    if (std::string e = check(dev_.driver->cuModuleLoadData(&module, cubin.data()),
                              "cuModuleLoadData of '" + entry + "'");
        !e.empty())
      return e;
    modules_.push_back(module);
    if (std::string e = check(dev_.driver->cuModuleGetFunction(f, module, entry.c_str()),
                              "cuModuleGetFunction '" + entry + "'");
        !e.empty())
      return e;
    functions_[{entry, source}] = *f;
    return "";
  }

  std::string check(cu::CUresult r, const std::string &what) const {
    return r == cu::CUDA_SUCCESS ? ""
                                 : what + " failed on " + mt::rt::describe(dev_) + ": " +
                                       cu::result_name(dev_.driver, r);
  }

  mt::rt::CudaDevice dev_;
  std::unique_ptr<mt::rt::KernelCache> cache_;
  std::vector<cu::CUdeviceptr> live_;
  std::vector<cu::CUmodule> modules_;
  std::map<std::pair<std::string, std::string>, cu::CUfunction> functions_;
  std::map<cu::CUfunction, uint32_t> sharedAllowed_; // opted in to, beyond the default 48 KiB
};

} // namespace

KernelDevice &emulatedKernelDevice() {
  static EmulatedKernelDevice device;
  return device;
}

KernelDevice *gpuKernelDevice(std::string *error) {
  // Opened once: a process without a GPU says why in every test it skips.
  static std::string why;
  static std::unique_ptr<GpuKernelDevice> device = [] {
    auto d = std::make_unique<GpuKernelDevice>();
    why = d->open();
    return why.empty() ? std::move(d) : nullptr;
  }();
  *error = why;
  return device.get();
}

Mirror::~Mirror() {
  for (auto &[host, copy] : copies_)
    device_.release(copy.address);
}

std::string Mirror::map(const void *host, size_t bytes) {
  auto it = copies_.find(host);
  if (it != copies_.end()) {
    if (it->second.bytes >= bytes)
      return "";
    device_.release(it->second.address);
    copies_.erase(it);
  }
  Copy c;
  c.bytes = bytes;
  if (std::string e = device_.allocate(bytes, &c.address); !e.empty())
    return e;
  copies_[host] = c;
  return "";
}

uint64_t Mirror::at(const void *host, uint64_t offset) const {
  auto it = copies_.find(host);
  return it == copies_.end() ? 0 : it->second.address + offset;
}

std::string Mirror::upload(const void *host) {
  auto it = copies_.find(host);
  if (it == copies_.end())
    return "upload of an array that was never mapped";
  return device_.to_device(it->second.address, host, it->second.bytes);
}

std::string Mirror::download(void *host) {
  auto it = copies_.find(host);
  if (it == copies_.end())
    return "download of an array that was never mapped";
  return device_.to_host(host, it->second.address, it->second.bytes);
}

std::string Mirror::upload() {
  for (auto &[host, copy] : copies_)
    if (std::string e = device_.to_device(copy.address, host, copy.bytes); !e.empty())
      return e;
  return "";
}

std::string Mirror::download() {
  for (auto &[host, copy] : copies_)
    if (std::string e = device_.to_host(const_cast<void *>(host), copy.address, copy.bytes);
        !e.empty())
      return e;
  return "";
}

} // namespace mt::test
