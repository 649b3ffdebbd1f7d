// `mtrun --power-log FILE`: this rank's GPU sampled through NVML on a side
// thread (power, clocks, temperature, utilisation, memory) into a CSV, with
// a mark at each phase of each iteration so power transients line up with
// the training step; the averages go to TensorBoard.
//
// NVML (libnvidia-ml.so.1, part of the NVIDIA driver) is opened with dlopen
// like the CUDA libraries, so mtrun runs without it unless a power log is
// asked for. MT_NVML_LIBRARY names the one file to try instead (tests use a
// stub library with it).
//
// The CSV (one header line, then one row per sample or mark, in time order):
//   time_s,iteration,phase,kind,power_w,sm_clock_mhz,mem_clock_mhz,
//   temperature_c,gpu_util_pct,mem_util_pct,memory_used_mib
// time_s counts from the start of the log; `iteration` is the iteration in
// progress (1-based, Megatron's numbering; 0 before the first); `phase` is
// the phase in progress (setup, forward-backward, grad-norm, optimizer,
// logging, evaluation, checkpoint); `kind` is "sample" for a reading (its
// phase is the one in progress when it was read) or "mark" for the start of
// a phase (no readings). A reading NVML does not support on the GPU is left
// empty.
#ifndef MT_RUNTIME_POWER_LOG_H
#define MT_RUNTIME_POWER_LOG_H

#include <cstdint>
#include <memory>
#include <string>

namespace mt::rt {

// One reading; a field below 0 is one NVML does not support on this GPU.
struct PowerSample {
  double power_w = -1, sm_clock_mhz = -1, mem_clock_mhz = -1, temperature_c = -1,
         gpu_util_pct = -1, mem_util_pct = -1, memory_used_mib = -1;
};

// The samples' means (and power's maximum) since the last averages() call.
struct PowerAverages {
  int64_t samples = 0;
  PowerSample mean;
  double power_max_w = -1;
};

class PowerLog {
public:
  // Opens NVML, finds the GPU of this process's `local_rank` (through
  // CUDA_VISIBLE_DEVICES when it is set: indices or GPU-/MIG- UUIDs, as
  // CUDA numbers them), creates `path` and starts sampling every
  // `interval_ms`. Null with *error one line naming what is missing and the
  // fix.
  static std::unique_ptr<PowerLog> start(const std::string &path, int64_t interval_ms,
                                         int local_rank, std::string *error);
  ~PowerLog(); // stops the thread and closes the file

  // A phase of `iteration` starts now (a mark row; samples from now on carry it).
  void mark(int64_t iteration, const char *phase);
  // The means since the last call (TensorBoard's averages).
  PowerAverages averages();
  // "" or the first error the sampling thread met (a write that failed).
  std::string error() const;
  // The GPU sampled, for the start-up line: "NVIDIA H100 (NVML index 0)".
  const std::string &device() const;
  // Stops sampling, flushes and closes the file; "" or the error.
  std::string finish();

  struct Impl;

private:
  explicit PowerLog(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The path rank `rank` of `world` ranks writes: `path` itself for one rank;
// otherwise "%r" in it replaced by the rank, or ".rankN" put before the
// extension ("power.csv" -> "power.rank3.csv").
std::string power_log_path(const std::string &path, int rank, int world);

} // namespace mt::rt

#endif // MT_RUNTIME_POWER_LOG_H
