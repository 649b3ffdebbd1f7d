// NVML sampling for `mtrun --power-log` (see power_log.h).
#include "runtime/train/power_log.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include <dlfcn.h>

namespace mt::rt {
namespace {

// The slice of NVML's C API (nvml.h) that the log reads. Every function
// returns an nvmlReturn_t: 0 is NVML_SUCCESS, 3 NVML_ERROR_NOT_SUPPORTED.
using nvmlDevice_t = struct nvmlDevice_st *;
struct NvmlUtilization {
  unsigned gpu, memory;
};
struct NvmlMemory {
  unsigned long long total, free, used;
};
constexpr int kNvmlSuccess = 0;
constexpr unsigned kClockSm = 1, kClockMem = 2, kTemperatureGpu = 0;

struct Nvml {
  void *handle = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  const char *(*error_string)(int) = nullptr;
  int (*count)(unsigned *) = nullptr;
  int (*by_index)(unsigned, nvmlDevice_t *) = nullptr;
  int (*by_uuid)(const char *, nvmlDevice_t *) = nullptr;
  int (*name)(nvmlDevice_t, char *, unsigned) = nullptr;
  int (*power)(nvmlDevice_t, unsigned *) = nullptr;
  int (*clock)(nvmlDevice_t, unsigned, unsigned *) = nullptr;
  int (*temperature)(nvmlDevice_t, unsigned, unsigned *) = nullptr;
  int (*utilization)(nvmlDevice_t, NvmlUtilization *) = nullptr;
  int (*memory)(nvmlDevice_t, NvmlMemory *) = nullptr;

  std::string why(int r) const {
    const char *s = error_string ? error_string(r) : nullptr;
    return (s ? std::string(s) : "error") + " (" + std::to_string(r) + ")";
  }
};

const char *kNvmlFix = "install the NVIDIA driver (it ships libnvidia-ml.so.1), point "
                       "MT_NVML_LIBRARY at it, or drop --power-log";

std::string load_nvml(Nvml *n, std::string *where) {
  const char *env = std::getenv("MT_NVML_LIBRARY");
  std::vector<std::string> names;
  if (env && *env)
    names.push_back(env);
  else
    names = {"libnvidia-ml.so.1", "libnvidia-ml.so"};
  std::string reason;
  for (const std::string &name : names) {
    n->handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (n->handle) {
      *where = name;
      break;
    }
    if (const char *e = dlerror(); e && reason.empty() && !std::strstr(e, "No such file"))
      reason = e;
  }
  if (!n->handle)
    return "NVML (" + names.front() + ") not found" +
           (env && *env ? " at MT_NVML_LIBRARY" : " in the system library path") +
           (reason.empty() ? "" : " (" + reason + ")") + "; " + kNvmlFix;
  struct Sym {
    const char *name;
    void **slot;
  };
  const Sym syms[] = {
      {"nvmlInit_v2", reinterpret_cast<void **>(&n->init)},
      {"nvmlShutdown", reinterpret_cast<void **>(&n->shutdown)},
      {"nvmlErrorString", reinterpret_cast<void **>(&n->error_string)},
      {"nvmlDeviceGetCount_v2", reinterpret_cast<void **>(&n->count)},
      {"nvmlDeviceGetHandleByIndex_v2", reinterpret_cast<void **>(&n->by_index)},
      {"nvmlDeviceGetHandleByUUID", reinterpret_cast<void **>(&n->by_uuid)},
      {"nvmlDeviceGetName", reinterpret_cast<void **>(&n->name)},
      {"nvmlDeviceGetPowerUsage", reinterpret_cast<void **>(&n->power)},
      {"nvmlDeviceGetClockInfo", reinterpret_cast<void **>(&n->clock)},
      {"nvmlDeviceGetTemperature", reinterpret_cast<void **>(&n->temperature)},
      {"nvmlDeviceGetUtilizationRates", reinterpret_cast<void **>(&n->utilization)},
      {"nvmlDeviceGetMemoryInfo", reinterpret_cast<void **>(&n->memory)},
  };
  for (const Sym &s : syms)
    if (!(*s.slot = dlsym(n->handle, s.name)))
      return "NVML at " + *where + " lacks " + s.name + " (too old, or not the real library); " +
             kNvmlFix;
  return "";
}

// CUDA_VISIBLE_DEVICES' entries, as CUDA reads them: up to the first
// entry that is not a device (CUDA ignores the rest).
std::vector<std::string> visible_devices(const char *env) {
  std::vector<std::string> out;
  std::stringstream ss(env);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    bool index = !item.empty() && std::all_of(item.begin(), item.end(), ::isdigit);
    bool uuid = item.rfind("GPU-", 0) == 0 || item.rfind("MIG-", 0) == 0;
    if (!index && !uuid)
      break;
    out.push_back(item);
  }
  return out;
}

std::string cell(double v, const char *fmt) {
  if (v < 0)
    return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

} // namespace

struct PowerLog::Impl {
  Nvml nvml;
  nvmlDevice_t device = nullptr;
  std::string device_name;
  std::FILE *file = nullptr;
  std::string path;
  std::chrono::milliseconds interval{100};
  std::chrono::steady_clock::time_point start;

  std::mutex mu; // guards everything below and the file
  std::condition_variable wake;
  bool stop = false;
  int64_t iteration = 0;
  std::string phase = "setup";
  std::string error;
  int64_t n = 0;
  PowerSample sums, counts; // per field: sum of readings, number of readings
  double power_max = -1;
  std::thread thread;

  double now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  PowerSample read() {
    PowerSample s;
    unsigned v = 0;
    if (nvml.power(device, &v) == kNvmlSuccess)
      s.power_w = v / 1000.0;
    if (nvml.clock(device, kClockSm, &v) == kNvmlSuccess)
      s.sm_clock_mhz = v;
    if (nvml.clock(device, kClockMem, &v) == kNvmlSuccess)
      s.mem_clock_mhz = v;
    if (nvml.temperature(device, kTemperatureGpu, &v) == kNvmlSuccess)
      s.temperature_c = v;
    NvmlUtilization u{};
    if (nvml.utilization(device, &u) == kNvmlSuccess) {
      s.gpu_util_pct = u.gpu;
      s.mem_util_pct = u.memory;
    }
    NvmlMemory m{};
    if (nvml.memory(device, &m) == kNvmlSuccess)
      s.memory_used_mib = double(m.used) / (1024.0 * 1024.0);
    return s;
  }

  // Writes one row; the caller holds mu.
  void row(double t, const char *kind, const PowerSample *s) {
    if (!error.empty())
      return;
    std::string line = cell(t, "%.4f") + "," + std::to_string(iteration) + "," + phase + "," +
                       kind;
    const double fields[] = {s ? s->power_w : -1,       s ? s->sm_clock_mhz : -1,
                             s ? s->mem_clock_mhz : -1, s ? s->temperature_c : -1,
                             s ? s->gpu_util_pct : -1,  s ? s->mem_util_pct : -1,
                             s ? s->memory_used_mib : -1};
    const char *formats[] = {"%.3f", "%.0f", "%.0f", "%.0f", "%.0f", "%.0f", "%.1f"};
    for (size_t i = 0; i < 7; ++i)
      line += "," + cell(fields[i], formats[i]);
    line += "\n";
    if (std::fwrite(line.data(), 1, line.size(), file) != line.size())
      error = path + ": cannot write the power log: " + std::strerror(errno) +
              "; check the disk, or drop --power-log";
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu);
    auto next = std::chrono::steady_clock::now();
    while (!stop) {
      lock.unlock();
      const double t = now();
      PowerSample s = read();
      lock.lock();
      row(t, "sample", &s);
      ++n;
      const double fields[] = {s.power_w,      s.sm_clock_mhz, s.mem_clock_mhz,
                               s.temperature_c, s.gpu_util_pct, s.mem_util_pct,
                               s.memory_used_mib};
      double *sum = &sums.power_w, *count = &counts.power_w;
      for (size_t i = 0; i < 7; ++i)
        if (fields[i] >= 0) {
          sum[i] = std::max(sum[i], 0.0) + fields[i];
          count[i] = std::max(count[i], 0.0) + 1;
        }
      power_max = std::max(power_max, s.power_w);
      next += interval;
      if (next < std::chrono::steady_clock::now())
        next = std::chrono::steady_clock::now(); // fell behind: no burst to catch up
      wake.wait_until(lock, next, [&] { return stop; });
    }
  }
};

PowerLog::PowerLog(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PowerLog::~PowerLog() { finish(); }

std::unique_ptr<PowerLog> PowerLog::start(const std::string &path, int64_t interval_ms,
                                          int local_rank, std::string *error) {
  auto impl = std::make_unique<Impl>();
  Nvml &nv = impl->nvml;
  std::string lib;
  if (std::string e = load_nvml(&nv, &lib); !e.empty()) {
    *error = "--power-log: " + e;
    if (nv.handle)
      dlclose(nv.handle);
    return nullptr;
  }
  auto fail = [&](const std::string &e) -> std::unique_ptr<PowerLog> {
    *error = "--power-log: " + e;
    if (impl->file)
      std::fclose(impl->file);
    dlclose(nv.handle);
    return nullptr;
  };
  if (int r = nv.init(); r != kNvmlSuccess)
    return fail("nvmlInit failed: " + nv.why(r) + "; check the driver with nvidia-smi, or drop "
                "--power-log");
  auto failInit = [&](const std::string &e) {
    nv.shutdown();
    return fail(e);
  };
  unsigned count = 0;
  if (int r = nv.count(&count); r != kNvmlSuccess || count == 0)
    return failInit("NVML sees no GPU (" + (r ? nv.why(r) : std::string("0 devices")) +
                    "); check the driver with nvidia-smi, or drop --power-log");
  // The GPU CUDA gives this rank: the local rank's entry of
  // CUDA_VISIBLE_DEVICES, or NVML's index local_rank (0 with one GPU).
  std::vector<std::string> visible;
  const char *env = std::getenv("CUDA_VISIBLE_DEVICES");
  if (env)
    visible = visible_devices(env);
  else
    for (unsigned i = 0; i < count; ++i)
      visible.push_back(std::to_string(i));
  int ordinal = local_rank >= 0 && size_t(local_rank) < visible.size() ? local_rank
                : visible.size() == 1                                  ? 0
                                                                       : -1;
  if (ordinal < 0)
    return failInit("local rank " + std::to_string(local_rank) + " has no GPU to sample: " +
                    std::to_string(visible.size()) + " visible" +
                    (env ? " (CUDA_VISIBLE_DEVICES=" + std::string(env) + ")" : "") +
                    "; start at most one rank per GPU on each node");
  const std::string &entry = visible[size_t(ordinal)];
  int r = std::isdigit(static_cast<unsigned char>(entry[0]))
              ? nv.by_index(unsigned(std::strtoul(entry.c_str(), nullptr, 10)), &impl->device)
              : nv.by_uuid(entry.c_str(), &impl->device);
  if (r != kNvmlSuccess)
    return failInit("NVML has no GPU " + entry + ": " + nv.why(r) +
                    "; check CUDA_VISIBLE_DEVICES against nvidia-smi -L");
  char name[96] = "";
  if (nv.name(impl->device, name, sizeof name) != kNvmlSuccess)
    std::strcpy(name, "GPU");
  impl->device_name = std::string(name) + " (NVML " +
                      (std::isdigit(static_cast<unsigned char>(entry[0])) ? "index " : "") +
                      entry + ", " + lib + ")";
  impl->path = path;
  impl->file = std::fopen(path.c_str(), "w");
  if (!impl->file)
    return failInit(path + ": cannot create the power log: " + std::strerror(errno) +
                    "; check the directory");
  std::fputs("time_s,iteration,phase,kind,power_w,sm_clock_mhz,mem_clock_mhz,temperature_c,"
             "gpu_util_pct,mem_util_pct,memory_used_mib\n",
             impl->file);
  impl->interval = std::chrono::milliseconds(interval_ms);
  impl->start = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(impl->mu);
    impl->row(0.0, "mark", nullptr);
  }
  Impl *raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<PowerLog>(new PowerLog(std::move(impl)));
}

void PowerLog::mark(int64_t iteration, const char *phase) {
  Impl &m = *impl_;
  const double t = m.now();
  std::lock_guard<std::mutex> lock(m.mu);
  m.iteration = iteration;
  m.phase = phase;
  m.row(t, "mark", nullptr);
}

PowerAverages PowerLog::averages() {
  Impl &m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  PowerAverages a;
  a.samples = m.n;
  double *mean = &a.mean.power_w;
  const double *sum = &m.sums.power_w, *count = &m.counts.power_w;
  for (size_t i = 0; i < 7; ++i)
    mean[i] = count[i] > 0 ? sum[i] / count[i] : -1;
  a.power_max_w = m.power_max;
  m.n = 0;
  m.sums = PowerSample{};
  m.counts = PowerSample{};
  m.power_max = -1;
  return a;
}

std::string PowerLog::error() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->error;
}

const std::string &PowerLog::device() const { return impl_->device_name; }

std::string PowerLog::finish() {
  Impl &m = *impl_;
  if (m.thread.joinable()) {
    {
      std::lock_guard<std::mutex> lock(m.mu);
      m.stop = true;
    }
    m.wake.notify_all();
    m.thread.join();
  }
  if (m.file) {
    if ((std::fclose(m.file) != 0) && m.error.empty())
      m.error = m.path + ": cannot write the power log: " + std::strerror(errno) +
                "; check the disk, or drop --power-log";
    m.file = nullptr;
    m.nvml.shutdown();
    dlclose(m.nvml.handle);
  }
  return m.error;
}

std::string power_log_path(const std::string &path, int rank, int world) {
  if (world <= 1)
    return path;
  std::string out = path;
  if (size_t at = out.find("%r"); at != std::string::npos) {
    for (; at != std::string::npos; at = out.find("%r", at))
      out.replace(at, 2, std::to_string(rank));
    return out;
  }
  const size_t slash = out.rfind('/');
  const size_t dot = out.rfind('.');
  const std::string tag = ".rank" + std::to_string(rank);
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) ||
      dot == (slash == std::string::npos ? 0 : slash + 1))
    return out + tag;
  return out.substr(0, dot) + tag + out.substr(dot);
}

} // namespace mt::rt
