// The CUDA loading layer and NVRTC's kernel cache. Tests that compile need
// NVRTC (the CUDA toolkit; no GPU) and are skipped, saying why, without it.
#include "runtime/exec/cuda/cuda_api.h"
#include "runtime/exec/cuda/cuda_device.h"
#include "runtime/exec/cuda/kernel_cache.h"
#include "runtime/base/sha256.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace mt;
using namespace mt::rt;

namespace {

std::string read_file(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_file(const std::string &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A fresh directory per test, removed afterwards.
class TempDir {
public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "mt-cuda-test.XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path); }
  std::string path;
};

const cu::Nvrtc *nvrtc_or_null(std::string *why) { return cu::load_nvrtc(why); }

#define REQUIRE_NVRTC(var)                                                                       \
  std::string nvrtcWhy;                                                                          \
  const cu::Nvrtc *var = nvrtc_or_null(&nvrtcWhy);                                               \
  if (!var)                                                                                      \
    GTEST_SKIP() << "NVRTC is not installed, so nothing can be compiled here: " << nvrtcWhy;

const char *kSaxpy = R"(
extern "C" __global__ void saxpy(float a, const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    y[i] = a * x[i] + y[i];
}
)";

} // namespace

TEST(Sha256, KnownDigests) {
  // FIPS 180-4 examples.
  EXPECT_EQ(to_hex(sha256("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(to_hex(sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 pieces;
  std::string million(1000000, 'a');
  for (size_t i = 0; i < million.size(); i += 777)
    pieces.update(std::string_view(million).substr(i, 777));
  EXPECT_EQ(to_hex(pieces.finish()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(CudaApi, MissingLibrariesSayWhatToInstall) {
  cu::LibrarySearch nowhere{{"/nonexistent/cuda/lib64"}, false, {}};
  std::string err;
  EXPECT_EQ(cu::load_nvrtc_from(nowhere, &err), nullptr);
  EXPECT_EQ(err, "NVRTC (libnvrtc.so.13 or libnvrtc.so.12) not found in /nonexistent/cuda/lib64; "
                 "install the CUDA toolkit 12 or 13, or set MT_CUDA_HOME to the directory that "
                 "holds its lib64");
  err.clear();
  EXPECT_EQ(cu::load_cublaslt_from(nowhere, &err), nullptr);
  EXPECT_NE(err.find("cuBLASLt (libcublasLt.so.13 or libcublasLt.so.12) not found in "
                     "/nonexistent/cuda/lib64; install the CUDA toolkit"),
            std::string::npos)
      << err;
  err.clear();
  EXPECT_EQ(cu::load_nccl_from(nowhere, &err), nullptr);
  EXPECT_NE(err.find("NCCL (libnccl.so.2) not found in /nonexistent/cuda/lib64; install NCCL 2.18"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find('\n'), std::string::npos);
}

TEST(CudaApi, DefaultSearchOrder) {
  ::setenv("MT_CUDA_HOME", "/opt/mt-cuda", 1);
  ::unsetenv("CUDA_HOME");
  cu::LibrarySearch s = cu::default_library_search();
  ::unsetenv("MT_CUDA_HOME");
  ASSERT_EQ(s.dirs.size(), 2u);
  EXPECT_EQ(s.dirs[0], "/opt/mt-cuda/lib64");
  EXPECT_EQ(s.dirs[1], "/opt/mt-cuda/lib");
  EXPECT_TRUE(s.system);
  EXPECT_EQ(s.fallback_dirs, std::vector<std::string>{"/usr/local/cuda/lib64"});
}

TEST(CudaApi, WrongLibraryNamesTheMissingSymbol) {
  // A real shared library under NVRTC's name: found, but not NVRTC.
  TempDir dir;
  std::string libm;
  for (const char *p : {"/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6",
                        "/lib64/libm.so.6", "/usr/lib64/libm.so.6"})
    if (fs::exists(p)) {
      libm = p;
      break;
    }
  if (libm.empty())
    GTEST_SKIP() << "no libm.so.6 in the usual places to stand in for a wrong library";
  fs::create_symlink(libm, dir.path + "/libnvrtc.so.13");
  std::string err;
  EXPECT_EQ(cu::load_nvrtc_from({{dir.path}, false, {}}, &err), nullptr);
  EXPECT_NE(err.find(" lacks nvrtcGetErrorString (too old, or not the real library); install "
                     "the CUDA toolkit"),
            std::string::npos)
      << err;
}

TEST(CudaDevice, DeviceForLocalRank) {
  EXPECT_EQ(device_for_local_rank(0, 8), 0);
  EXPECT_EQ(device_for_local_rank(7, 8), 7);
  EXPECT_EQ(device_for_local_rank(3, 1), 0); // one GPU shown per rank
  EXPECT_EQ(device_for_local_rank(8, 8), -1);
  EXPECT_EQ(device_for_local_rank(2, 2), -1);
}

// Named NoGpu*: it skips where a GPU is usable, and tools/device-kit.sh
// expects that skip on a GPU machine (any other skip fails its unit step).
TEST(CudaDevice, NoGpuIsOneLine) {
  CudaDevice dev;
  std::string err = open_cuda_device(0, &dev);
  if (err.empty()) {
    close_cuda_device(&dev);
    GTEST_SKIP() << "this machine has a usable GPU: " << describe(dev);
  }
  EXPECT_EQ(err.find('\n'), std::string::npos);
  EXPECT_NE(err.find("use --device cpu"), std::string::npos) << err;
}

namespace {
// An NVRTC that lists sm_80 and sm_90 only, and one that cannot list.
cu::nvrtcResult twoArchCount(int *n) {
  *n = 2;
  return cu::NVRTC_SUCCESS;
}
cu::nvrtcResult twoArchList(int *archs) {
  archs[0] = 80;
  archs[1] = 90;
  return cu::NVRTC_SUCCESS;
}
cu::nvrtcResult cannotList(int *) { return cu::NVRTC_ERROR_COMPILATION; }
} // namespace

TEST(CudaDevice, GpuNewerThanNvrtcSaysWhichToolkitToUse) {
  cu::Nvrtc n{};
  n.path = "/opt/cuda-12.4/lib64/libnvrtc.so.12";
  n.major = 12;
  n.minor = 4;
  n.nvrtcGetNumSupportedArchs = twoArchCount;
  n.nvrtcGetSupportedArchs = twoArchList;
  EXPECT_EQ(nvrtc_supported_archs(n), (std::vector<int>{80, 90}));
  CudaDevice dev;
  dev.ordinal = 0;
  dev.name = "NVIDIA B200";
  dev.arch = 100;
  dev.driver_version = 13000;
  dev.total_memory = size_t(180) << 30;
  EXPECT_EQ(check_nvrtc_targets(dev, n),
            "GPU 0 (NVIDIA B200, sm_100, 180.0 GiB, driver 13.0): NVRTC 12.4 at "
            "/opt/cuda-12.4/lib64/libnvrtc.so.12 cannot compile for sm_100: it supports sm_80, "
            "sm_90; set MT_CUDA_HOME (or MT_NVRTC_LIBRARY) to a newer CUDA toolkit whose NVRTC "
            "lists sm_100");
  dev.arch = 90;
  EXPECT_EQ(check_nvrtc_targets(dev, n), "");
  // An NVRTC that cannot say what it supports is left to compile (and to
  // fail with its own message if it must).
  n.nvrtcGetSupportedArchs = cannotList;
  dev.arch = 100;
  EXPECT_TRUE(nvrtc_supported_archs(n).empty());
  EXPECT_EQ(check_nvrtc_targets(dev, n), "");
}

TEST(KernelCache, ToolkitNvrtcListsTheArchitecturesMtCompilesFor) {
  REQUIRE_NVRTC(nvrtc);
  std::vector<int> archs = nvrtc_supported_archs(*nvrtc);
  ASSERT_FALSE(archs.empty());
  for (int arch : {80, 90}) {
    EXPECT_NE(std::find(archs.begin(), archs.end(), arch), archs.end()) << arch;
    EXPECT_EQ(nvrtc_arch_unsupported(*nvrtc, arch), "");
  }
  EXPECT_NE(nvrtc_arch_unsupported(*nvrtc, 99).find("cannot compile for sm_99: it supports "),
            std::string::npos);
}

TEST(KernelCache, DefaultDirectory) {
  ::setenv("MT_KERNEL_CACHE", "/a/b", 1);
  ::setenv("XDG_CACHE_HOME", "/x", 1);
  EXPECT_EQ(default_kernel_cache_dir(), "/a/b");
  ::unsetenv("MT_KERNEL_CACHE");
  EXPECT_EQ(default_kernel_cache_dir(), "/x/mt/kernels");
  ::unsetenv("XDG_CACHE_HOME");
  std::string home = std::getenv("HOME") ? std::getenv("HOME") : "";
  ::setenv("HOME", "/h", 1);
  EXPECT_EQ(default_kernel_cache_dir(), "/h/.cache/mt/kernels");
  if (home.empty())
    ::unsetenv("HOME");
  else
    ::setenv("HOME", home.c_str(), 1);
}

TEST(KernelCache, CompilesForSm80AndSm90ThenWarmStartCompilesNothing) {
  REQUIRE_NVRTC(nvrtc);
  TempDir dir;
  std::string cubin80, cubin90, err;
  {
    KernelCache cache(nvrtc, dir.path);
    ASSERT_TRUE(cache.get("saxpy", kSaxpy, 80, &cubin80, &err)) << err;
    ASSERT_TRUE(cache.get("saxpy", kSaxpy, 90, &cubin90, &err)) << err;
    EXPECT_EQ(cache.stats().compiles, 2);
    EXPECT_EQ(cache.stats().hits, 0);
  }
  // CUBINs are ELF files, one per architecture.
  ASSERT_GT(cubin80.size(), 4u);
  EXPECT_EQ(cubin80.substr(0, 4), "\x7f" "ELF");
  EXPECT_EQ(cubin90.substr(0, 4), "\x7f" "ELF");
  EXPECT_NE(cubin80, cubin90);

  // A new cache over the same directory, as a later mtrun would make.
  KernelCache warm(nvrtc, dir.path);
  std::string again80, again90;
  ASSERT_TRUE(warm.get("saxpy", kSaxpy, 80, &again80, &err)) << err;
  ASSERT_TRUE(warm.get("saxpy", kSaxpy, 90, &again90, &err)) << err;
  EXPECT_EQ(warm.stats().compiles, 0);
  EXPECT_EQ(warm.stats().hits, 2);
  EXPECT_EQ(again80, cubin80);
  EXPECT_EQ(again90, cubin90);
  // No temporary files left behind.
  int files = 0;
  for (auto &e : fs::directory_iterator(dir.path)) {
    ++files;
    EXPECT_EQ(e.path().extension(), ".cubin") << e.path();
  }
  EXPECT_EQ(files, 2);
}

TEST(KernelCache, KeyCoversSourceArchAndOptions) {
  REQUIRE_NVRTC(nvrtc);
  KernelCache cache(nvrtc, "/unused");
  std::string a = cache.entry_path(kSaxpy, 80);
  EXPECT_EQ(a.rfind("/unused/sm_80-", 0), 0u) << a;
  EXPECT_NE(a, cache.entry_path(kSaxpy, 90));
  EXPECT_NE(a, cache.entry_path(std::string(kSaxpy) + " ", 80));
  EXPECT_NE(a, cache.entry_path(kSaxpy, 80, {"--use_fast_math"}));
  EXPECT_EQ(a, cache.entry_path(kSaxpy, 80));
}

TEST(KernelCache, CorruptEntryIsRecompiledWithAWarning) {
  REQUIRE_NVRTC(nvrtc);
  TempDir dir;
  std::string cubin, err;
  {
    KernelCache cache(nvrtc, dir.path);
    ASSERT_TRUE(cache.get("saxpy", kSaxpy, 80, &cubin, &err)) << err;
  }
  KernelCache probe(nvrtc, dir.path);
  std::string path = probe.entry_path(kSaxpy, 80);
  std::string good = read_file(path);
  ASSERT_GT(good.size(), 100u);

  struct Case {
    const char *what;
    std::string bytes;
    const char *reason;
  };
  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x40;
  std::string wrongKey = good;
  wrongKey[20] ^= 1;
  std::vector<Case> cases = {
      {"flipped byte", flipped, "(checksum mismatch)"},
      {"truncated", good.substr(0, good.size() - 10), "header says"},
      {"too short", good.substr(0, 40), "(not a kernel cache entry, or cut short)"},
      {"wrong key", wrongKey, "(its key does not match its name)"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.what);
    write_file(path, c.bytes);
    std::vector<std::string> warnings;
    KernelCache cache(nvrtc, dir.path, [&](const std::string &w) { warnings.push_back(w); });
    std::string out;
    ASSERT_TRUE(cache.get("saxpy", kSaxpy, 80, &out, &err)) << err;
    EXPECT_EQ(out, cubin);
    EXPECT_EQ(cache.stats().compiles, 1);
    EXPECT_EQ(cache.stats().corrupt, 1);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_EQ(warnings[0].rfind("kernel cache entry " + path + " for kernel 'saxpy' is corrupt ", 0),
              0u)
        << warnings[0];
    EXPECT_NE(warnings[0].find(c.reason), std::string::npos) << warnings[0];
    EXPECT_NE(warnings[0].find("; recompiling it"), std::string::npos) << warnings[0];
    // Rewritten: the next start trusts it again.
    EXPECT_EQ(read_file(path), good);
  }
}

TEST(KernelCache, CompileErrorIsNvrtcLogOnOneLine) {
  REQUIRE_NVRTC(nvrtc);
  TempDir dir;
  KernelCache cache(nvrtc, dir.path);
  std::string cubin, err;
  const char *bad = "extern \"C\" __global__ void bad(float *y) {\n  y[0] = undefined_thing;\n}\n";
  EXPECT_FALSE(cache.get("bad", bad, 80, &cubin, &err));
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  EXPECT_EQ(err.rfind("NVRTC " + std::to_string(nvrtc->major) + "." +
                          std::to_string(nvrtc->minor) +
                          " could not compile kernel 'bad' for sm_80: bad.cu(2): error: ",
                      0),
            0u)
      << err;
  EXPECT_NE(err.find("identifier \"undefined_thing\" is undefined"), std::string::npos) << err;
  EXPECT_EQ(cache.stats().compiles, 1);
  // Nothing is cached for a failed compile.
  EXPECT_TRUE(fs::is_empty(dir.path));
}

TEST(KernelCache, UnusableDirectoryStillCompiles) {
  REQUIRE_NVRTC(nvrtc);
  TempDir dir;
  std::string file = dir.path + "/not-a-dir";
  write_file(file, "x");
  std::vector<std::string> warnings;
  KernelCache cache(nvrtc, file + "/kernels", [&](const std::string &w) { warnings.push_back(w); });
  std::string cubin, err;
  ASSERT_TRUE(cache.get("saxpy", kSaxpy, 80, &cubin, &err)) << err;
  ASSERT_TRUE(cache.get("saxpy", kSaxpy, 80, &cubin, &err)) << err;
  EXPECT_EQ(cache.stats().compiles, 2);
  ASSERT_EQ(warnings.size(), 1u); // said once, not per kernel
  EXPECT_EQ(warnings[0].rfind("cannot create the kernel cache directory " + file + "/kernels (", 0),
            0u)
      << warnings[0];
  EXPECT_NE(warnings[0].find("set MT_KERNEL_CACHE to a writable directory"), std::string::npos);
}

TEST(CudaApi, ToolkitLibrariesLoadWithTheirVersions) {
  std::string err;
  const cu::Nvrtc *n = cu::load_nvrtc(&err);
  if (!n)
    GTEST_SKIP() << "no CUDA toolkit here: " << err;
  EXPECT_GE(n->major, cu::kMinNvrtcMajor);
  EXPECT_NE(n->path.find("libnvrtc.so.1"), std::string::npos) << n->path;
  // cuBLASLt and NCCL come separately from NVRTC on some systems.
  if (const cu::CublasLt *c = cu::load_cublaslt(&err))
    EXPECT_GE(c->version, cu::kMinCublasLtVersion);
  else
    std::printf("cuBLASLt not checked: %s\n", err.c_str());
  err.clear();
  if (const cu::Nccl *c = cu::load_nccl(&err))
    EXPECT_GE(c->version, cu::kMinNcclVersion);
  else
    std::printf("NCCL not checked: %s\n", err.c_str());
}

// The whole path on a GPU: NVRTC's CUBIN from the cache, loaded and run
// through the driver table. Skipped, with the reason, where there is no GPU.
TEST(CudaDevice, CachedKernelRunsOnTheGpu) {
  REQUIRE_NVRTC(nvrtc);
  CudaDevice dev;
  if (std::string e = open_cuda_device(0, &dev); !e.empty())
    GTEST_SKIP() << "no GPU to run on: " << e;
  const cu::Driver &d = *dev.driver;
  ASSERT_EQ(check_driver_runs_nvrtc(dev, *nvrtc), "");
  TempDir dir;
  KernelCache cache(nvrtc, dir.path);
  std::string cubin, err;
  ASSERT_TRUE(cache.get("saxpy", kSaxpy, dev.arch, &cubin, &err)) << err;
  cu::CUmodule module = nullptr;
  ASSERT_EQ(d.cuModuleLoadData(&module, cubin.data()), cu::CUDA_SUCCESS);
  cu::CUfunction fn = nullptr;
  ASSERT_EQ(d.cuModuleGetFunction(&fn, module, "saxpy"), cu::CUDA_SUCCESS);
  const int n = 1000;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i)
    x[i] = float(i), y[i] = 1.0f;
  cu::CUdeviceptr dx = 0, dy = 0;
  ASSERT_EQ(d.cuMemAlloc(&dx, n * sizeof(float)), cu::CUDA_SUCCESS);
  ASSERT_EQ(d.cuMemAlloc(&dy, n * sizeof(float)), cu::CUDA_SUCCESS);
  ASSERT_EQ(d.cuMemcpyHtoD(dx, x.data(), n * sizeof(float)), cu::CUDA_SUCCESS);
  ASSERT_EQ(d.cuMemcpyHtoD(dy, y.data(), n * sizeof(float)), cu::CUDA_SUCCESS);
  float a = 2.0f;
  int count = n;
  void *params[] = {&a, &dx, &dy, &count};
  ASSERT_EQ(d.cuLaunchKernel(fn, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr),
            cu::CUDA_SUCCESS);
  ASSERT_EQ(d.cuCtxSynchronize(), cu::CUDA_SUCCESS);
  ASSERT_EQ(d.cuMemcpyDtoH(y.data(), dy, n * sizeof(float)), cu::CUDA_SUCCESS);
  for (int i = 0; i < n; ++i)
    ASSERT_EQ(y[i], 2.0f * float(i) + 1.0f) << "at " << i;
  d.cuMemFree(dx);
  d.cuMemFree(dy);
  d.cuModuleUnload(module);
  close_cuda_device(&dev);
}
