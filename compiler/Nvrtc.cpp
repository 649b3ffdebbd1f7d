// NVRTC through dlopen (see Nvrtc.h). The few entry points are declared here
// with NVRTC's documented C signatures, so no CUDA header is needed to build.
#include "compiler/Nvrtc.h"

#include <dlfcn.h>

#include <cstdlib>

namespace mt {

struct Nvrtc::Api {
  using Program = void *;
  int (*version)(int *, int *) = nullptr;
  int (*createProgram)(Program *, const char *, const char *, int, const char *const *,
                       const char *const *) = nullptr;
  int (*destroyProgram)(Program *) = nullptr;
  int (*compileProgram)(Program, int, const char *const *) = nullptr;
  int (*getProgramLogSize)(Program, size_t *) = nullptr;
  int (*getProgramLog)(Program, char *) = nullptr;
  const char *(*getErrorString)(int) = nullptr;
};

namespace {

std::vector<std::string> candidates() {
  if (const char *forced = std::getenv("MT_NVRTC_LIBRARY"); forced && *forced)
    return {forced};
  const char *names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
  std::vector<std::string> out(std::begin(names), std::end(names));
  for (const char *var : {"CUDA_HOME", "CUDA_PATH"})
    if (const char *dir = std::getenv(var); dir && *dir)
      for (const char *n : names)
        out.push_back(std::string(dir) + "/lib64/" + n);
  for (const char *n : names)
    out.push_back(std::string("/usr/local/cuda/lib64/") + n);
  return out;
}

// The first log line that reports an error, else the first line.
std::string firstError(const std::string &log) {
  std::string first;
  size_t at = 0;
  while (at < log.size()) {
    size_t end = log.find('\n', at);
    std::string line = log.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? log.size() : end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    if (first.empty())
      first = line;
    if (line.find("error") != std::string::npos)
      return line;
  }
  return first;
}

} // namespace

std::unique_ptr<Nvrtc> Nvrtc::load(std::string *error) {
  std::vector<std::string> tried = candidates();
  for (const std::string &path : tried) {
    void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h)
      continue;
    std::unique_ptr<Nvrtc> n(new Nvrtc);
    n->handle_ = h;
    n->path_ = path;
    n->api_ = std::make_unique<Api>();
    Api &a = *n->api_;
    bool ok = true;
    auto sym = [&](auto &fn, const char *name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      ok &= fn != nullptr;
    };
    sym(a.version, "nvrtcVersion");
    sym(a.createProgram, "nvrtcCreateProgram");
    sym(a.destroyProgram, "nvrtcDestroyProgram");
    sym(a.compileProgram, "nvrtcCompileProgram");
    sym(a.getProgramLogSize, "nvrtcGetProgramLogSize");
    sym(a.getProgramLog, "nvrtcGetProgramLog");
    sym(a.getErrorString, "nvrtcGetErrorString");
    if (ok)
      return n;
    *error = "'" + path + "' is not a usable NVRTC library (missing entry points)";
    return nullptr;
  }
  std::string list;
  for (const std::string &p : tried)
    list += (list.empty() ? "" : ", ") + p;
  *error = "NVRTC was not found (tried " + list +
           "); install the CUDA toolkit's NVRTC (e.g. the cuda-nvrtc package) or set "
           "MT_NVRTC_LIBRARY to the path of libnvrtc.so";
  return nullptr;
}

Nvrtc::~Nvrtc() {
  if (handle_)
    dlclose(handle_);
}

std::string Nvrtc::version() const {
  int major = 0, minor = 0;
  api_->version(&major, &minor);
  return std::to_string(major) + "." + std::to_string(minor);
}

std::string Nvrtc::compile(const std::string &source, const std::string &name,
                           const std::string &arch) const {
  const Api &a = *api_;
  Api::Program prog = nullptr;
  if (int rc = a.createProgram(&prog, source.c_str(), name.c_str(), 0, nullptr, nullptr))
    return a.getErrorString(rc);
  // sm_XX (not compute_XX): NVRTC assembles a binary, so ptxas checks the
  // kernel too (registers, shared memory, launch bounds).
  const std::string archOpt = "--gpu-architecture=" + arch;
  const char *opts[] = {archOpt.c_str(), "--std=c++17"};
  int rc = a.compileProgram(prog, 2, opts);
  std::string result;
  if (rc != 0) {
    size_t size = 0;
    std::string log;
    if (a.getProgramLogSize(prog, &size) == 0 && size > 1) {
      log.resize(size);
      a.getProgramLog(prog, log.data());
      log.resize(size - 1);
    }
    result = firstError(log);
    if (result.empty())
      result = a.getErrorString(rc);
  }
  a.destroyProgram(&prog);
  return result;
}

} // namespace mt
