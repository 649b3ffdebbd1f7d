// Compiles generated CUDA C as host C++ against CudaHostEmulation.h and loads
// it (see CudaHostKernel.h).
#include "CudaHostKernel.h"

#include "runtime/base/sha256.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#ifndef MT_EMU_CXX
#error "MT_EMU_CXX (the host C++ compiler) must be defined by the build"
#endif
#ifndef MT_EMU_HEADER
#error "MT_EMU_HEADER (CudaHostEmulation.h's absolute path) must be defined by the build"
#endif
#ifndef MT_EMU_CACHE_DIR
#error "MT_EMU_CACHE_DIR (where compiled kernels are kept) must be defined by the build"
#endif

namespace mt::emu {
namespace {

namespace fs = std::filesystem;

constexpr const char *kFlags = "-std=c++17 -O1 -shared -fPIC -fvisibility=hidden -w";

bool readFile(const std::string &path, std::string *out) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return false;
  std::ostringstream s;
  s << in.rdbuf();
  *out = s.str();
  return true;
}

// `extern __shared__ T name[];` declares one symbol per kernel in CUDA and
// cannot be spelled as host C++ at function scope (`__shared__` is `static`
// there), so each becomes a pointer to the launch's dynamic shared memory.
std::string rewriteDynamicShared(const std::string &source) {
  static const std::regex align(R"((__align__|alignas)\s*\(\s*\d+\s*\))");
  static const std::regex decl(R"(^\s*(.*?)\s*\b([A-Za-z_]\w*)\s*\[\s*\]\s*$)");
  std::string out;
  size_t pos = 0;
  const std::string key = "extern __shared__";
  for (size_t at; (at = source.find(key, pos)) != std::string::npos;) {
    size_t end = source.find(';', at);
    if (end == std::string::npos)
      break;
    out += source.substr(pos, at - pos);
    std::string text = std::regex_replace(source.substr(at + key.size(), end - at - key.size()),
                                          align, "");
    std::smatch m;
    if (std::regex_match(text, m, decl))
      out += m[1].str() + " *const " + m[2].str() + " = reinterpret_cast<" + m[1].str() +
             " *>(::mt_emu::dynamicShared())";
    else
      out += source.substr(at, end - at); // left for the compiler to report
    pos = end;
  }
  return out + source.substr(pos);
}

// The compiler's first diagnostic lines, from the first error on.
std::string firstDiagnostics(const std::string &log) {
  std::istringstream in(log);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  size_t first = 0;
  while (first < lines.size() && lines[first].find("error") == std::string::npos)
    ++first;
  if (first == lines.size())
    first = 0;
  std::string s;
  for (size_t i = first; i < lines.size() && i < first + 4; ++i)
    s += "\n" + lines[i];
  return s.empty() ? " (no compiler output)" : s;
}

// CudaHostEmulation.h precompiled with the kernels' compiler and flags,
// once per header text, in the cache: parsing it was about half of each
// kernel's compile. Returns the path to pass to -include (a copy of the
// header beside its .gch, which GCC then reads instead), or the header
// itself when precompiling fails (kernels then compile as before).
std::string includedHeader(const std::string &command, const std::string &header) {
  rt::Sha256 h;
  h.update(command);
  h.update(std::string_view("\0", 1));
  h.update(header);
  const std::string dir = std::string(MT_EMU_CACHE_DIR) + "/pch-" + rt::to_hex(h.finish());
  const std::string name = "/CudaHostEmulation.h";
  if (fs::exists(dir + name + ".gch"))
    return dir + name;
  std::string tmp = std::string(MT_EMU_CACHE_DIR) + "/pch-build-XXXXXX";
  if (!mkdtemp(tmp.data()))
    return MT_EMU_HEADER;
  std::error_code ec;
  {
    std::ofstream out(tmp + name, std::ios::binary);
    out << header;
  }
  const std::string cmd = command + " -x c++-header -o '" + tmp + name + ".gch' '" + tmp + name +
                          "' > /dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    fs::remove_all(tmp, ec);
    return MT_EMU_HEADER;
  }
  // Atomic: a concurrent test process sees the whole directory or none. If
  // one got there first, its copy is the same.
  fs::rename(tmp, dir, ec);
  if (ec)
    fs::remove_all(tmp, ec);
  return fs::exists(dir + name + ".gch") ? dir + name : std::string(MT_EMU_HEADER);
}

} // namespace

std::unique_ptr<HostKernel> HostKernel::compile(const std::string &source,
                                                const std::string &entry, std::string *error) {
  static const std::regex identifier(R"([A-Za-z_]\w*)");
  if (!std::regex_match(entry, identifier)) {
    *error = "host kernel: entry '" + entry + "' is not an identifier";
    return nullptr;
  }
  std::string header;
  if (!readFile(MT_EMU_HEADER, &header)) {
    *error = std::string("host kernel: cannot read ") + MT_EMU_HEADER;
    return nullptr;
  }
  const std::string command = std::string(MT_EMU_CXX) + " " + kFlags;
  rt::Sha256 h;
  const std::string *parts[] = {&command, &header, &entry, &source};
  for (const std::string *part : parts) {
    h.update(*part);
    h.update(std::string_view("\0", 1));
  }
  const std::string key = rt::to_hex(h.finish());
  std::error_code ec;
  fs::create_directories(MT_EMU_CACHE_DIR, ec);
  const std::string so = std::string(MT_EMU_CACHE_DIR) + "/" + key + ".so";

  std::unique_ptr<HostKernel> k(new HostKernel);
  k->cached_ = fs::exists(so);
  if (!k->cached_) {
    std::string dir = std::string(MT_EMU_CACHE_DIR) + "/build-XXXXXX";
    if (!mkdtemp(dir.data())) {
      *error = "host kernel: cannot create a directory under " + std::string(MT_EMU_CACHE_DIR);
      return nullptr;
    }
    const std::string src = dir + "/kernel.cpp", obj = dir + "/kernel.so", log = dir + "/log";
    {
      std::ofstream out(src, std::ios::binary);
      out << rewriteDynamicShared(source) << "\n\n"
          << "// Launcher: the kernel's parameter types come from its own signature.\n"
          << "extern \"C\" __attribute__((visibility(\"default\"))) int mt_emu_launch(\n"
          << "    const unsigned *grid, const unsigned *block, unsigned shared, void **params,\n"
          << "    char *error, unsigned long size) {\n"
          << "  const std::string e = ::mt_emu::launchKernel(&" << entry
          << ", grid, block, shared, params);\n"
          << "  std::snprintf(error, size, \"%s\", e.c_str());\n"
          << "  return e.empty() ? 0 : 1;\n"
          << "}\n";
    }
    const std::string cmd = command + " -include '" + includedHeader(command, header) +
                            "' -o '" + obj + "' '" + src + "' > '" + log + "' 2>&1";
    const int rc = std::system(cmd.c_str());
    std::string diagnostics;
    readFile(log, &diagnostics);
    if (rc != 0) {
      *error = "host compile of '" + entry + "' failed:" + firstDiagnostics(diagnostics);
      fs::remove_all(dir, ec);
      return nullptr;
    }
    fs::rename(obj, so, ec); // atomic: a concurrent run sees all of it or nothing
    fs::remove_all(dir, ec);
    if (ec) {
      *error = "host kernel: cannot move the compiled kernel to " + so + ": " + ec.message();
      return nullptr;
    }
  }
  k->library_ = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!k->library_) {
    *error = std::string("host kernel: dlopen: ") + dlerror();
    return nullptr;
  }
  k->launch_ = reinterpret_cast<LaunchFn>(dlsym(k->library_, "mt_emu_launch"));
  if (!k->launch_) {
    *error = "host kernel: " + so + " exports no mt_emu_launch";
    return nullptr;
  }
  return k;
}

HostKernel::~HostKernel() {
  if (library_)
    dlclose(library_);
}

std::string HostKernel::launch(const unsigned grid[3], const unsigned block[3],
                               unsigned sharedBytes, void **params) const {
  char error[1024];
  error[0] = 0;
  launch_(grid, block, sharedBytes, params, error, sizeof error);
  return error;
}

} // namespace mt::emu
