// Generated CUDA kernels compiled with NVRTC to CUBIN for one GPU
// architecture, and kept on disk so that a warm start compiles nothing.
//
// An entry is keyed by the SHA-256 of (entry format, source, architecture,
// NVRTC version, options): a new NVRTC, another GPU or other options never
// reuse a stale binary. Entries are written atomically (atomic_file.h), so
// ranks on one node that compile the same kernel at once race harmlessly.
// Each entry carries its key and a SHA-256 of the CUBIN; an entry that fails
// either check is reported in one warning, recompiled and rewritten, never
// loaded.
//
// Entry file <dir>/sm_<arch>-<key hex>.cubin, little-endian:
//    0  char[8]  "MTCUBIN\0"
//    8  u32      format version (1)
//   12  u32      architecture (80, 90, ...)
//   16  u8[32]   key
//   48  u8[32]   SHA-256 of the CUBIN bytes
//   80  u64      CUBIN size in bytes
//   88           CUBIN
#ifndef MT_RUNTIME_KERNEL_CACHE_H
#define MT_RUNTIME_KERNEL_CACHE_H

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/exec/cuda/cuda_api.h"

namespace mt::rt {

// $MT_KERNEL_CACHE, else $XDG_CACHE_HOME/mt/kernels, else
// $HOME/.cache/mt/kernels; "" when none of them is set.
std::string default_kernel_cache_dir();

// The options every kernel is compiled with for sm_<arch>: C++17, fused
// multiply-adds on, IEEE division and square root, device optimisation on
// (ptxas at its default -O3).
std::vector<std::string> nvrtc_options(int arch);

// Compiles `source` with NVRTC to a CUBIN for sm_<arch> with `options`
// (nvrtc_options(arch) unless given). False with *error one line naming the
// kernel and arch and carrying the first error of NVRTC's log. `mtc compile
// --check-kernels` and the kernel cache compile through this one function,
// so what the compiler checks is what mtrun builds.
bool nvrtc_compile(const cu::Nvrtc &nvrtc, const std::string &name, const std::string &source,
                   int arch, const std::vector<std::string> &options, std::string *cubin,
                   std::string *error);

// The architectures `nvrtc` can compile for (nvrtcGetSupportedArchs:
// 75, 80, 86, ..., 121 for NVRTC 13.0); empty when it cannot say.
std::vector<int> nvrtc_supported_archs(const cu::Nvrtc &nvrtc);

// "" when `nvrtc` compiles for sm_<arch> (or cannot list what it supports),
// else "NVRTC 13.0 at PATH cannot compile for sm_70: it supports sm_75,
// sm_80, ..., sm_121" for the caller to finish with what to change.
std::string nvrtc_arch_unsupported(const cu::Nvrtc &nvrtc, int arch);

struct KernelCacheStats {
  int compiles = 0; // NVRTC invocations (misses and corrupt entries)
  int hits = 0;     // binaries served from disk
  int corrupt = 0;  // entries refused by the checks and recompiled
};

// One per process (rank); not for concurrent use from several threads.
class KernelCache {
public:
  // `dir` "" means default_kernel_cache_dir(); when that is "" too, or the
  // directory cannot be created, kernels are still compiled but not kept
  // (one warning says so). `warn` receives one-line warnings; by default
  // they go to stderr as "mtrun: warning: ...".
  KernelCache(const cu::Nvrtc *nvrtc, std::string dir,
              std::function<void(const std::string &)> warn = nullptr);

  // The CUBIN of `source` for sm_<arch> (arch = 10 * major + minor), from
  // disk or compiled now. `name` names the kernel in messages and is the
  // program name NVRTC's log uses. `extra_options` are added to
  // nvrtc_options(arch) and are part of the key. On failure returns false
  // with *error one line: a compile error carries NVRTC's log.
  bool get(const std::string &name, const std::string &source, int arch, std::string *cubin,
           std::string *error, const std::vector<std::string> &extra_options = {});

  // Where get() keeps this kernel's entry ("" without a cache directory).
  std::string entry_path(const std::string &source, int arch,
                         const std::vector<std::string> &extra_options = {}) const;

  const std::string &dir() const { return dir_; }
  const KernelCacheStats &stats() const { return stats_; }

private:
  bool compile(const std::string &name, const std::string &source, int arch,
               const std::vector<std::string> &options, std::string *cubin, std::string *error);
  std::array<uint8_t, 32> key(const std::string &source, int arch,
                              const std::vector<std::string> &options) const;
  bool ensure_dir();

  const cu::Nvrtc *nvrtc_;
  std::string dir_;
  std::function<void(const std::string &)> warn_;
  bool dirChecked_ = false, dirUsable_ = false;
  KernelCacheStats stats_;
};

} // namespace mt::rt

#endif // MT_RUNTIME_KERNEL_CACHE_H
