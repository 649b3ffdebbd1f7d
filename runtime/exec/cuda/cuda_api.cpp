// dlopen and dlsym for the CUDA libraries (see cuda_api.h).
#include "runtime/exec/cuda/cuda_api.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>

#include <dlfcn.h>
#include <link.h>

namespace mt::cu {
namespace {

// What one library is called and what to tell a user who lacks it.
struct LibrarySpec {
  const char *what;                // "NVRTC"
  std::vector<const char *> names; // sonames, newest first
  const char *install;             // "install ... or set MT_CUDA_HOME ..."
};

struct Symbol {
  const char *name;
  void **slot;
};

std::string join(const std::vector<const char *> &v, const char *last) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i)
    s += (i == 0 ? "" : i + 1 == v.size() ? last : ", ") + std::string(v[i]);
  return s;
}

// The file a handle came from (dlopen by soname does not say).
std::string loaded_path(void *handle, const std::string &fallback) {
  struct link_map *map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name)
    return map->l_name;
  return fallback;
}

// dlerror() says "No such file or directory" for a name that is simply not
// there; any other reason (a broken or foreign file) is worth repeating.
bool not_found(const char *dlerr) {
  return !dlerr || std::strstr(dlerr, "No such file or directory");
}

void *open_library(const LibrarySpec &spec, const LibrarySearch &search, std::string *path,
                   std::string *error) {
  std::string other; // the first reason that was not "not found"
  auto attempt = [&](const std::string &file) -> void * {
    void *h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h) {
      *path = loaded_path(h, file);
      return h;
    }
    const char *e = dlerror();
    if (!not_found(e) && other.empty())
      other = e;
    return nullptr;
  };
  if (!search.file.empty()) {
    if (void *h = attempt(search.file))
      return h;
    *error = std::string(spec.what) + " not found at " + search.file +
             (other.empty() ? "" : " (" + other + ")") +
             ", the only file MT_NVRTC_LIBRARY lets mt try; point it at the library or unset "
             "it to search the usual places";
    return nullptr;
  }
  for (const std::string &dir : search.dirs)
    for (const char *name : spec.names)
      if (void *h = attempt(dir + "/" + name))
        return h;
  if (search.system)
    for (const char *name : spec.names)
      if (void *h = attempt(name))
        return h;
  for (const std::string &dir : search.fallback_dirs)
    for (const char *name : spec.names)
      if (void *h = attempt(dir + "/" + name))
        return h;
  std::string where;
  for (const std::string &dir : search.dirs)
    where += (where.empty() ? "" : ", ") + dir;
  if (search.system)
    where += (where.empty() ? "" : ", ") +
             std::string("the system library path (LD_LIBRARY_PATH, /etc/ld.so.cache)");
  for (const std::string &dir : search.fallback_dirs)
    where += (where.empty() ? "" : ", ") + dir;
  *error = std::string(spec.what) + " (" + join(spec.names, " or ") + ") not found in " +
           (where.empty() ? std::string("no place") : where) +
           (other.empty() ? "" : " (" + other + ")") + "; " + spec.install;
  return nullptr;
}

bool resolve(void *handle, const std::string &path, const char *what,
             const std::vector<Symbol> &symbols, const char *install, std::string *error) {
  for (const Symbol &s : symbols) {
    *s.slot = dlsym(handle, s.name);
    if (!*s.slot) {
      *error = std::string(what) + " at " + path + " lacks " + s.name +
               " (too old, or not the real library); " + install;
      return false;
    }
  }
  return true;
}

#define MT_SYM(table, name) Symbol{#name, reinterpret_cast<void **>(&(table)->name)}
#define MT_SYM_AS(table, field, abiName) Symbol{abiName, reinterpret_cast<void **>(&(table)->field)}

const char *kToolkitInstall =
    "install the CUDA toolkit 12 or 13, or set MT_CUDA_HOME to the directory that holds its lib64";

} // namespace

LibrarySearch default_library_search() {
  LibrarySearch s;
  for (const char *var : {"MT_CUDA_HOME", "CUDA_HOME"})
    if (const char *v = std::getenv(var); v && *v) {
      s.dirs.push_back(std::string(v) + "/lib64");
      s.dirs.push_back(std::string(v) + "/lib");
    }
  s.system = true;
  s.fallback_dirs.push_back("/usr/local/cuda/lib64");
  return s;
}

LibrarySearch nvrtc_library_search() {
  LibrarySearch s = default_library_search();
  if (const char *f = std::getenv("MT_NVRTC_LIBRARY"); f && *f)
    s.file = f;
  return s;
}

std::string result_name(const Driver *driver, CUresult r) {
  const char *name = nullptr;
  if (driver && driver->cuGetErrorName && driver->cuGetErrorName(r, &name) == CUDA_SUCCESS &&
      name)
    return std::string(name) + " (" + std::to_string(r) + ")";
  // The few results a user meets before a context exists, as cuda.h names them.
  static const std::pair<int, const char *> kNames[] = {
      {1, "CUDA_ERROR_INVALID_VALUE"},
      {2, "CUDA_ERROR_OUT_OF_MEMORY"},
      {3, "CUDA_ERROR_NOT_INITIALIZED"},
      {4, "CUDA_ERROR_DEINITIALIZED"},
      {34, "CUDA_ERROR_STUB_LIBRARY"},
      {46, "CUDA_ERROR_DEVICE_UNAVAILABLE"},
      {100, "CUDA_ERROR_NO_DEVICE"},
      {101, "CUDA_ERROR_INVALID_DEVICE"},
      {209, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
      {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"},
      {304, "CUDA_ERROR_OPERATING_SYSTEM"},
      {36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER"},
      {999, "CUDA_ERROR_UNKNOWN"},
  };
  for (auto &[code, n] : kNames)
    if (code == r)
      return std::string(n) + " (" + std::to_string(r) + ")";
  return "CUresult " + std::to_string(r);
}

const Driver *load_driver(std::string *error) {
  static std::once_flag once;
  static std::unique_ptr<Driver> driver;
  static std::string loadError;
  std::call_once(once, [] {
    LibrarySpec spec{"libcuda.so.1 (the NVIDIA driver)", {"libcuda.so.1"},
                     "run on a machine with an NVIDIA GPU and driver"};
    // Not open_library's message: the driver is not a toolkit library.
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char *e = dlerror();
      loadError = "libcuda.so.1 (the NVIDIA driver) not found in the system library path "
                  "(LD_LIBRARY_PATH, /etc/ld.so.cache)" +
                  (not_found(e) ? std::string() : " (" + std::string(e) + ")");
      return;
    }
    auto d = std::make_unique<Driver>();
    d->path = loaded_path(h, "libcuda.so.1");
    Driver *t = d.get();
    std::vector<Symbol> syms = {
        MT_SYM(t, cuInit),
        MT_SYM(t, cuDriverGetVersion),
        MT_SYM(t, cuGetErrorName),
        MT_SYM(t, cuGetErrorString),
        MT_SYM(t, cuDeviceGetCount),
        MT_SYM(t, cuDeviceGet),
        MT_SYM(t, cuDeviceGetName),
        MT_SYM(t, cuDeviceGetAttribute),
        MT_SYM_AS(t, cuDeviceTotalMem, "cuDeviceTotalMem_v2"),
        MT_SYM(t, cuDevicePrimaryCtxRetain),
        MT_SYM_AS(t, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
        MT_SYM(t, cuCtxSetCurrent),
        MT_SYM(t, cuCtxSynchronize),
        MT_SYM_AS(t, cuMemGetInfo, "cuMemGetInfo_v2"),
        MT_SYM_AS(t, cuMemAlloc, "cuMemAlloc_v2"),
        MT_SYM_AS(t, cuMemFree, "cuMemFree_v2"),
        MT_SYM_AS(t, cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
        MT_SYM_AS(t, cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
        MT_SYM_AS(t, cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
        MT_SYM_AS(t, cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
        MT_SYM_AS(t, cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
        MT_SYM(t, cuMemsetD8Async),
        MT_SYM(t, cuModuleLoadData),
        MT_SYM(t, cuModuleUnload),
        MT_SYM(t, cuModuleGetFunction),
        MT_SYM(t, cuFuncGetAttribute),
        MT_SYM(t, cuFuncSetAttribute),
        MT_SYM(t, cuLaunchKernel),
        MT_SYM(t, cuStreamCreate),
        MT_SYM_AS(t, cuStreamDestroy, "cuStreamDestroy_v2"),
        MT_SYM(t, cuStreamSynchronize), MT_SYM(t, cuStreamQuery),
        MT_SYM(t, cuStreamWaitEvent),
        MT_SYM(t, cuEventCreate),
        MT_SYM_AS(t, cuEventDestroy, "cuEventDestroy_v2"),
        MT_SYM(t, cuEventRecord),
        MT_SYM(t, cuEventQuery),
        MT_SYM_AS(t, cuStreamBeginCapture, "cuStreamBeginCapture_v2"),
        MT_SYM(t, cuStreamEndCapture),
        MT_SYM_AS(t, cuGraphInstantiate, "cuGraphInstantiateWithFlags"),
        MT_SYM(t, cuGraphLaunch),
        MT_SYM(t, cuGraphExecDestroy),
        MT_SYM(t, cuGraphDestroy),
    };
    if (!resolve(h, d->path, spec.what, syms,
                 "update the NVIDIA driver to one for CUDA 12 or newer", &loadError))
      return;
    driver = std::move(d);
  });
  if (!driver)
    *error = loadError;
  return driver.get();
}

Nvrtc *load_nvrtc_from(const LibrarySearch &search, std::string *error) {
  LibrarySpec spec{"NVRTC", {"libnvrtc.so.13", "libnvrtc.so.12"}, kToolkitInstall};
  std::string path;
  void *h = open_library(spec, search, &path, error);
  if (!h)
    return nullptr;
  auto n = std::make_unique<Nvrtc>();
  n->path = path;
  Nvrtc *t = n.get();
  std::vector<Symbol> syms = {
      MT_SYM(t, nvrtcGetErrorString),    MT_SYM(t, nvrtcVersion),
      MT_SYM(t, nvrtcGetNumSupportedArchs), MT_SYM(t, nvrtcGetSupportedArchs),
      MT_SYM(t, nvrtcCreateProgram),     MT_SYM(t, nvrtcDestroyProgram),
      MT_SYM(t, nvrtcCompileProgram),    MT_SYM(t, nvrtcGetCUBINSize),
      MT_SYM(t, nvrtcGetCUBIN),          MT_SYM(t, nvrtcGetPTXSize),
      MT_SYM(t, nvrtcGetPTX),            MT_SYM(t, nvrtcGetProgramLogSize),
      MT_SYM(t, nvrtcGetProgramLog),
  };
  if (!resolve(h, path, "NVRTC", syms, kToolkitInstall, error))
    return nullptr;
  if (t->nvrtcVersion(&t->major, &t->minor) != NVRTC_SUCCESS || t->major < kMinNvrtcMajor) {
    *error = "NVRTC at " + path + " is version " + std::to_string(t->major) + "." +
             std::to_string(t->minor) + "; mt needs " + std::to_string(kMinNvrtcMajor) +
             ".0 or newer: " + kToolkitInstall;
    return nullptr;
  }
  return n.release();
}

CublasLt *load_cublaslt_from(const LibrarySearch &search, std::string *error) {
  LibrarySpec spec{"cuBLASLt", {"libcublasLt.so.13", "libcublasLt.so.12"}, kToolkitInstall};
  std::string path;
  void *h = open_library(spec, search, &path, error);
  if (!h)
    return nullptr;
  auto c = std::make_unique<CublasLt>();
  c->path = path;
  CublasLt *t = c.get();
  std::vector<Symbol> syms = {
      MT_SYM(t, cublasLtGetVersion),
      MT_SYM(t, cublasLtCreate),
      MT_SYM(t, cublasLtDestroy),
      MT_SYM(t, cublasLtMatmulDescCreate),
      MT_SYM(t, cublasLtMatmulDescDestroy),
      MT_SYM(t, cublasLtMatmulDescSetAttribute),
      MT_SYM(t, cublasLtMatrixLayoutCreate),
      MT_SYM(t, cublasLtMatrixLayoutDestroy),
      MT_SYM(t, cublasLtMatmulPreferenceCreate),
      MT_SYM(t, cublasLtMatmulPreferenceDestroy),
      MT_SYM(t, cublasLtMatmulPreferenceSetAttribute),
      MT_SYM(t, cublasLtMatmulAlgoGetHeuristic),
      MT_SYM(t, cublasLtMatmul),
  };
  if (!resolve(h, path, "cuBLASLt", syms, kToolkitInstall, error))
    return nullptr;
  t->version = t->cublasLtGetVersion();
  if (t->version < kMinCublasLtVersion) {
    *error = "cuBLASLt at " + path + " is version " + std::to_string(t->version / 10000) + "." +
             std::to_string(t->version / 100 % 100) + "; mt needs 12.0 or newer: " +
             kToolkitInstall;
    return nullptr;
  }
  return c.release();
}

Nccl *load_nccl_from(const LibrarySearch &search, std::string *error) {
  const char *install = "install NCCL 2.18 or newer (Debian/Ubuntu: libnccl2 from NVIDIA's "
                        "repository), or set MT_CUDA_HOME to a directory whose lib64 holds it";
  LibrarySpec spec{"NCCL", {"libnccl.so.2"}, install};
  std::string path;
  void *h = open_library(spec, search, &path, error);
  if (!h)
    return nullptr;
  auto c = std::make_unique<Nccl>();
  c->path = path;
  Nccl *t = c.get();
  std::vector<Symbol> syms = {
      MT_SYM(t, ncclGetVersion),     MT_SYM(t, ncclGetErrorString),
      MT_SYM(t, ncclGetUniqueId),    MT_SYM(t, ncclCommInitRank),
      MT_SYM(t, ncclCommDestroy),    MT_SYM(t, ncclCommAbort),
      MT_SYM(t, ncclCommGetAsyncError), MT_SYM(t, ncclGroupStart),
      MT_SYM(t, ncclGroupEnd),       MT_SYM(t, ncclAllReduce),
      MT_SYM(t, ncclAllGather),      MT_SYM(t, ncclReduceScatter),
      MT_SYM(t, ncclBroadcast),      MT_SYM(t, ncclSend),
      MT_SYM(t, ncclRecv),           MT_SYM(t, ncclRedOpCreatePreMulSum),
      MT_SYM(t, ncclRedOpDestroy),   MT_SYM(t, ncclReduce),
  };
  if (!resolve(h, path, "NCCL", syms, install, error))
    return nullptr;
  if (t->ncclGetVersion(&t->version) != 0 || t->version < kMinNcclVersion) {
    *error = "NCCL at " + path + " is version " + std::to_string(t->version / 10000) + "." +
             std::to_string(t->version / 100 % 100) + "." + std::to_string(t->version % 100) +
             "; mt needs 2.18 or newer: " + install;
    return nullptr;
  }
  return c.release();
}

namespace {
template <typename T> const T *load_once(T *(*load)(const LibrarySearch &, std::string *),
                                         std::string *error,
                                         LibrarySearch (*search)() = default_library_search) {
  static std::once_flag once;
  static std::unique_ptr<T> table;
  static std::string loadError;
  std::call_once(once, [&] { table.reset(load(search(), &loadError)); });
  if (!table)
    *error = loadError;
  return table.get();
}
} // namespace

const Nvrtc *load_nvrtc(std::string *error) {
  return load_once<Nvrtc>(load_nvrtc_from, error, nvrtc_library_search);
}
const CublasLt *load_cublaslt(std::string *error) {
  return load_once<CublasLt>(load_cublaslt_from, error);
}
const Nccl *load_nccl(std::string *error) { return load_once<Nccl>(load_nccl_from, error); }

} // namespace mt::cu
