// NVRTC, loaded at run time: compiles generated kernels without a GPU, and
// lets mtc build and run on machines without CUDA.
#ifndef MT_COMPILER_NVRTC_H
#define MT_COMPILER_NVRTC_H

#include <memory>
#include <string>
#include <vector>

namespace mt {

class Nvrtc {
public:
  // Opens libnvrtc: $MT_NVRTC_LIBRARY when set (that file only), else
  // libnvrtc.so.13, .so.12, .so on the loader's path, then under $CUDA_HOME,
  // $CUDA_PATH and /usr/local/cuda (lib64/). Null, with `error` saying what
  // was tried and how to get it, when none loads.
  static std::unique_ptr<Nvrtc> load(std::string *error);
  ~Nvrtc();

  // "13.0" and the file that was loaded.
  std::string version() const;
  const std::string &path() const { return path_; }

  // Compiles `source` to a binary for `arch` ("sm_80"). Empty on success,
  // else NVRTC's error: the first line of its log that says "error" (or the
  // first line, or the result code).
  std::string compile(const std::string &source, const std::string &name,
                      const std::string &arch) const;

  struct Api;

private:
  Nvrtc() = default;
  void *handle_ = nullptr;
  std::string path_;
  std::unique_ptr<Api> api_;
};

} // namespace mt

#endif // MT_COMPILER_NVRTC_H
