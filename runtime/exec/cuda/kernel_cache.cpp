// NVRTC compilation with an on-disk CUBIN cache (see kernel_cache.h).
#include "runtime/exec/cuda/kernel_cache.h"

#include "runtime/base/atomic_file.h"
#include "runtime/base/byte_order.h"
#include "runtime/base/sha256.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include <sys/stat.h>

namespace mt::rt {
namespace {

constexpr char kMagic[8] = {'M', 'T', 'C', 'U', 'B', 'I', 'N', '\0'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderBytes = 88;
// A log longer than this is cut: the first errors are the ones to read.
constexpr size_t kMaxLogChars = 2000;

// mkdir -p; "" or the reason.
std::string make_dirs(const std::string &dir) {
  std::string failed;
  int e = 0;
  if (make_directories(dir, &failed, &e))
    return "";
  return e == ENOTDIR && failed == dir ? "not a directory" : std::strerror(e);
}

// NVRTC's log as one line: lines joined with "; ", cut at kMaxLogChars.
std::string one_line(const std::string &log) {
  std::string out;
  std::istringstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos)
      continue;
    size_t e = line.find_last_not_of(" \t\r");
    out += (out.empty() ? "" : "; ") + line.substr(b, e - b + 1);
  }
  if (out.size() > kMaxLogChars)
    out = out.substr(0, kMaxLogChars) + " ... (log cut)";
  return out;
}

std::string arch_name(int arch) { return "sm_" + std::to_string(arch); }

} // namespace

std::string default_kernel_cache_dir() {
  if (const char *v = std::getenv("MT_KERNEL_CACHE"); v && *v)
    return v;
  if (const char *v = std::getenv("XDG_CACHE_HOME"); v && *v)
    return std::string(v) + "/mt/kernels";
  if (const char *v = std::getenv("HOME"); v && *v)
    return std::string(v) + "/.cache/mt/kernels";
  return "";
}

std::vector<std::string> nvrtc_options(int arch) {
  // ptxas already optimises at -O3 by default; the options NVRTC 12.0
  // lacks are left out so that every supported NVRTC takes this list.
  return {"--gpu-architecture=" + arch_name(arch), "--std=c++17", "--fmad=true",
          "--prec-div=true", "--prec-sqrt=true", "--dopt=on"};
}

KernelCache::KernelCache(const cu::Nvrtc *nvrtc, std::string dir,
                         std::function<void(const std::string &)> warn)
    : nvrtc_(nvrtc), dir_(dir.empty() ? default_kernel_cache_dir() : std::move(dir)),
      warn_(std::move(warn)) {
  if (!warn_)
    warn_ = [](const std::string &m) { std::fprintf(stderr, "mtrun: warning: %s\n", m.c_str()); };
}

std::array<uint8_t, 32> KernelCache::key(const std::string &source, int arch,
                                         const std::vector<std::string> &options) const {
  // Every field is length-prefixed, so no two inputs hash the same bytes.
  Sha256 h;
  auto field = [&h](std::string_view s) {
    std::string len;
    put_le<uint64_t>(len, s.size());
    h.update(len);
    h.update(s);
  };
  field("mt kernel cache " + std::to_string(kFormatVersion));
  field(source);
  field(arch_name(arch));
  field("nvrtc " + std::to_string(nvrtc_->major) + "." + std::to_string(nvrtc_->minor));
  for (const std::string &o : options)
    field(o);
  return h.finish();
}

std::string KernelCache::entry_path(const std::string &source, int arch,
                                    const std::vector<std::string> &extra_options) const {
  if (dir_.empty())
    return "";
  std::vector<std::string> options = nvrtc_options(arch);
  options.insert(options.end(), extra_options.begin(), extra_options.end());
  return dir_ + "/" + arch_name(arch) + "-" + to_hex(key(source, arch, options)) + ".cubin";
}

bool KernelCache::ensure_dir() {
  if (dirChecked_)
    return dirUsable_;
  dirChecked_ = true;
  if (dir_.empty()) {
    warn_("no kernel cache directory (MT_KERNEL_CACHE, XDG_CACHE_HOME and HOME are unset); "
          "kernels are compiled on every start: set MT_KERNEL_CACHE to a writable directory");
    return false;
  }
  if (std::string why = make_dirs(dir_); !why.empty()) {
    warn_("cannot create the kernel cache directory " + dir_ + " (" + why +
          "); kernels are compiled on every start: set MT_KERNEL_CACHE to a writable directory");
    return false;
  }
  dirUsable_ = true;
  return true;
}

std::vector<int> nvrtc_supported_archs(const cu::Nvrtc &n) {
  int count = 0;
  if (!n.nvrtcGetNumSupportedArchs || !n.nvrtcGetSupportedArchs ||
      n.nvrtcGetNumSupportedArchs(&count) != cu::NVRTC_SUCCESS || count <= 0 || count > 1024)
    return {};
  std::vector<int> archs(size_t(count), 0);
  if (n.nvrtcGetSupportedArchs(archs.data()) != cu::NVRTC_SUCCESS)
    return {};
  return archs;
}

std::string nvrtc_arch_unsupported(const cu::Nvrtc &n, int arch) {
  std::vector<int> archs = nvrtc_supported_archs(n);
  if (archs.empty() || std::find(archs.begin(), archs.end(), arch) != archs.end())
    return "";
  std::string list;
  for (size_t i = 0; i < archs.size(); ++i)
    list += (i ? ", " : "") + arch_name(archs[i]);
  return "NVRTC " + std::to_string(n.major) + "." + std::to_string(n.minor) + " at " + n.path +
         " cannot compile for " + arch_name(arch) + ": it supports " + list;
}

bool nvrtc_compile(const cu::Nvrtc &n, const std::string &name, const std::string &source,
                   int arch, const std::vector<std::string> &options, std::string *cubin,
                   std::string *error) {
  std::string where = "NVRTC " + std::to_string(n.major) + "." + std::to_string(n.minor) +
                      " could not compile kernel '" + name + "' for " + arch_name(arch);
  cu::nvrtcProgram prog = nullptr;
  std::string file = name + ".cu";
  if (cu::nvrtcResult r =
          n.nvrtcCreateProgram(&prog, source.c_str(), file.c_str(), 0, nullptr, nullptr);
      r != cu::NVRTC_SUCCESS) {
    *error = where + ": nvrtcCreateProgram: " + n.nvrtcGetErrorString(r);
    return false;
  }
  std::vector<const char *> argv;
  for (const std::string &o : options)
    argv.push_back(o.c_str());
  cu::nvrtcResult r = n.nvrtcCompileProgram(prog, int(argv.size()), argv.data());
  std::string log;
  size_t logSize = 0;
  if (n.nvrtcGetProgramLogSize(prog, &logSize) == cu::NVRTC_SUCCESS && logSize > 1) {
    log.resize(logSize);
    if (n.nvrtcGetProgramLog(prog, log.data()) != cu::NVRTC_SUCCESS)
      log.clear();
    while (!log.empty() && log.back() == '\0')
      log.pop_back();
  }
  bool ok = false;
  if (r != cu::NVRTC_SUCCESS) {
    std::string l = one_line(log);
    *error = where + ": " + (l.empty() ? std::string(n.nvrtcGetErrorString(r)) : l);
  } else {
    size_t size = 0;
    if ((r = n.nvrtcGetCUBINSize(prog, &size)) != cu::NVRTC_SUCCESS || size == 0) {
      *error = where + ": nvrtcGetCUBINSize: " +
               (r != cu::NVRTC_SUCCESS ? n.nvrtcGetErrorString(r) : "empty binary");
    } else {
      cubin->resize(size);
      if ((r = n.nvrtcGetCUBIN(prog, cubin->data())) != cu::NVRTC_SUCCESS)
        *error = where + ": nvrtcGetCUBIN: " + n.nvrtcGetErrorString(r);
      else
        ok = true;
    }
  }
  n.nvrtcDestroyProgram(&prog);
  return ok;
}

bool KernelCache::compile(const std::string &name, const std::string &source, int arch,
                          const std::vector<std::string> &options, std::string *cubin,
                          std::string *error) {
  ++stats_.compiles;
  return nvrtc_compile(*nvrtc_, name, source, arch, options, cubin, error);
}

bool KernelCache::get(const std::string &name, const std::string &source, int arch,
                      std::string *cubin, std::string *error,
                      const std::vector<std::string> &extra_options) {
  std::vector<std::string> options = nvrtc_options(arch);
  options.insert(options.end(), extra_options.begin(), extra_options.end());
  if (!ensure_dir())
    return compile(name, source, arch, options, cubin, error);

  std::array<uint8_t, 32> k = key(source, arch, options);
  std::string path = dir_ + "/" + arch_name(arch) + "-" + to_hex(k) + ".cubin";
  std::ifstream in(path, std::ios::binary);
  if (in) {
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto *p = reinterpret_cast<const unsigned char *>(bytes.data());
    std::string problem;
    if (bytes.size() < kHeaderBytes || std::memcmp(p, kMagic, 8) != 0)
      problem = "not a kernel cache entry, or cut short";
    else if (get_le<uint32_t>(p + 8) != kFormatVersion)
      problem = "entry format " + std::to_string(get_le<uint32_t>(p + 8)) + ", expected " +
                std::to_string(kFormatVersion);
    else if (get_le<uint32_t>(p + 12) != uint32_t(arch) || std::memcmp(p + 16, k.data(), 32) != 0)
      problem = "its key does not match its name";
    else if (get_le<uint64_t>(p + 80) != bytes.size() - kHeaderBytes)
      problem = "size " + std::to_string(bytes.size() - kHeaderBytes) + " bytes, header says " +
                std::to_string(get_le<uint64_t>(p + 80));
    else if (std::string_view body(bytes.data() + kHeaderBytes, bytes.size() - kHeaderBytes);
             std::memcmp(sha256(body).data(), p + 48, 32) != 0)
      problem = "checksum mismatch";
    if (problem.empty()) {
      ++stats_.hits;
      *cubin = bytes.substr(kHeaderBytes);
      return true;
    }
    ++stats_.corrupt;
    warn_("kernel cache entry " + path + " for kernel '" + name + "' is corrupt (" + problem +
          "); recompiling it");
  }

  if (!compile(name, source, arch, options, cubin, error))
    return false;
  std::string header(kMagic, 8);
  put_le<uint32_t>(header, kFormatVersion);
  put_le<uint32_t>(header, uint32_t(arch));
  header.append(reinterpret_cast<const char *>(k.data()), 32);
  auto sum = sha256(*cubin);
  header.append(reinterpret_cast<const char *>(sum.data()), 32);
  put_le<uint64_t>(header, cubin->size());
  // A failed write costs only a recompile next time: warn, keep the binary.
  if (std::string e = write_pieces_atomically(path, {header, *cubin}); !e.empty())
    warn_("cannot save kernel '" + name + "' in the kernel cache: " + e +
          "; set MT_KERNEL_CACHE to a writable directory");
  return true;
}

} // namespace mt::rt
