// The GpuDevice of a real GPU: the driver API, NVRTC through the kernel
// cache, and cuBLASLt, all loaded at run time (runtime/cuda_api.h). One
// stream per rank; everything is asynchronous on it until synchronize().
#include "runtime/cuda_gpu_device.h"

#include "runtime/kernel_cache.h"

#include <map>
#include <set>
#include <tuple>

namespace mt::rt {

namespace pl = mt::plan;

namespace {

// cublasLt.h, library_types.h and cublas_api.h values (the declarations test,
// test/unit/CudaApiHeaderTest.cpp, checks the functions; these enumerators
// are stable parts of the CUDA 12 and 13 ABI).
constexpr int CUBLAS_COMPUTE_32F = 68;
constexpr int CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14;
constexpr int CUBLAS_OP_N = 0, CUBLAS_OP_T = 1;
constexpr int CUBLASLT_MATMUL_DESC_TRANSA = 3, CUBLASLT_MATMUL_DESC_TRANSB = 4,
              CUBLASLT_MATMUL_DESC_EPILOGUE = 7, CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
              CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,
              CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,
              CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26;
constexpr int CUBLASLT_EPILOGUE_DEFAULT = 1, CUBLASLT_EPILOGUE_BIAS = 4,
              CUBLASLT_EPILOGUE_GELU_BIAS = 32 | 4, CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 32 | 128 | 4;
constexpr int CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1;

// cuBLASLt's workspace: the figure mtc's memory plan states.
constexpr uint64_t kCublasWorkspaceBytes = 32ull << 20;

int cuda_type(pl::DType t) {
  return t == pl::DType::BF16 ? CUDA_R_16BF : t == pl::DType::F16 ? CUDA_R_16F : CUDA_R_32F;
}

class CudaGpuDevice : public GpuDevice {
public:
  ~CudaGpuDevice() override {
    if (!dev_.driver)
      return;
    for (auto &[key, g] : gemms_) {
      lt_->cublasLtMatmulDescDestroy(g.desc);
      for (cu::cublasLtMatrixLayout_t l : {g.a, g.b, g.d})
        lt_->cublasLtMatrixLayoutDestroy(l);
    }
    for (cu::CUgraphExec g : graphs_)
      dev_.driver->cuGraphExecDestroy(g);
    if (handle_)
      lt_->cublasLtDestroy(handle_);
    for (cu::CUmodule m : modules_)
      dev_.driver->cuModuleUnload(m);
    for (cu::CUdeviceptr p : allocations_)
      dev_.driver->cuMemFree(p);
    if (stream_)
      dev_.driver->cuStreamDestroy(stream_);
    close_cuda_device(&dev_);
  }

  std::string open(int local_rank, const std::string &cache_dir) {
    if (std::string e = open_cuda_device(local_rank, &dev_); !e.empty())
      return e;
    std::string err;
    if (!(nvrtc_ = cu::load_nvrtc(&err)))
      return err;
    if (std::string e = check_driver_runs_nvrtc(dev_, *nvrtc_); !e.empty())
      return e;
    if (!(lt_ = cu::load_cublaslt(&err)))
      return err;
    cache_ = std::make_unique<KernelCache>(nvrtc_, cache_dir);
    if (std::string e = drv(dev_.driver->cuStreamCreate(&stream_, cu::CU_STREAM_NON_BLOCKING),
                            "cuStreamCreate");
        !e.empty())
      return e;
    if (lt_->cublasLtCreate(&handle_) != 0)
      return "cublasLtCreate failed on " + describe(dev_);
    return allocate(kCublasWorkspaceBytes, &lt_workspace_);
  }

  std::string allocate(uint64_t bytes, uint64_t *base) override {
    cu::CUdeviceptr p = 0;
    cu::CUresult r = dev_.driver->cuMemAlloc(&p, bytes ? bytes : 1);
    if (r != cu::CUDA_SUCCESS)
      return "cannot allocate " + std::to_string(bytes) + " bytes on " + describe(dev_) + ": " +
             error_name(r) + "; the memory plan (mtc compile) says what this rank needs";
    allocations_.push_back(p);
    *base = p;
    return "";
  }
  // Copies on the stream, then a wait: ordered after the work before them
  // and before the work after them. (A synchronous cuMemcpy runs on the
  // legacy default stream, which a non-blocking stream does not wait for,
  // and may return before a pageable upload has landed.)
  std::string to_device(uint64_t dst, const void *src, uint64_t bytes) override {
    if (std::string e = drv(dev_.driver->cuMemcpyHtoDAsync(dst, src, bytes, stream_),
                            "cuMemcpyHtoDAsync");
        !e.empty())
      return e;
    return drv(dev_.driver->cuStreamSynchronize(stream_), "cuStreamSynchronize");
  }
  std::string to_host(void *dst, uint64_t src, uint64_t bytes) override {
    if (std::string e = drv(dev_.driver->cuMemcpyDtoHAsync(dst, src, bytes, stream_),
                            "cuMemcpyDtoHAsync");
        !e.empty())
      return e;
    return drv(dev_.driver->cuStreamSynchronize(stream_), "cuStreamSynchronize");
  }
  std::string fill(uint64_t dst, uint8_t byte, uint64_t bytes) override {
    return drv(dev_.driver->cuMemsetD8Async(dst, byte, bytes, stream_), "cuMemsetD8Async");
  }

  std::string load_kernel(uint32_t index, const pl::Kernel &kernel) override {
    const std::string source = kernel.cuda_source()->str(), entry = kernel.entry()->str();
    auto known = by_source_.find({source, entry});
    if (known != by_source_.end()) {
      functions_[index] = known->second;
      return "";
    }
    std::string cubin, err;
    const std::string name = kernel.name() ? kernel.name()->str() : entry;
    if (!cache_->get(entry, source, dev_.arch, &cubin, &err))
      return "kernel " + std::to_string(index) + " '" + name + "': " + err;
    cu::CUmodule module = nullptr;
    if (std::string e = drv(dev_.driver->cuModuleLoadData(&module, cubin.data()),
                            "cuModuleLoadData of kernel '" + name + "'");
        !e.empty())
      return e;
    modules_.push_back(module);
    cu::CUfunction f = nullptr;
    if (std::string e = drv(dev_.driver->cuModuleGetFunction(&f, module, entry.c_str()),
                            "cuModuleGetFunction '" + entry + "'");
        !e.empty())
      return e;
    functions_[index] = f;
    by_source_[{source, entry}] = f;
    return "";
  }

  std::string launch(uint32_t index, const pl::Kernel &k, void **params, uint32_t) override {
    auto g = k.grid(), b = k.block();
    return drv(dev_.driver->cuLaunchKernel(functions_.at(index), g->Get(0), g->Get(1), g->Get(2),
                                           b->Get(0), b->Get(1), b->Get(2), k.shared_bytes(),
                                           stream_, params, nullptr),
               "cuLaunchKernel '" + k.entry()->str() + "'");
  }

  std::string gemm(const pl::Gemm &g, const uint64_t *ptr) override {
    if (g.batch() != 1)
      return "batched GEMMs are not supported by this mtrun";
    Gemm *plan = nullptr;
    if (std::string e = gemm_plan(g, &plan); !e.empty())
      return e;
    if (g.epilogue() != pl::GemmEpilogue::NONE) {
      const void *bias = reinterpret_cast<const void *>(ptr[3]);
      lt_->cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                          sizeof bias);
    }
    if (g.epilogue() == pl::GemmEpilogue::GELU_AUX_BIAS) {
      const void *aux = reinterpret_cast<const void *>(ptr[4]);
      lt_->cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                          &aux, sizeof aux);
    }
    const float alpha = 1.0f, beta = g.accumulate() ? 1.0f : 0.0f;
    void *d = reinterpret_cast<void *>(ptr[2]);
    cu::cublasStatus_t s = lt_->cublasLtMatmul(
        handle_, plan->desc, &alpha, reinterpret_cast<const void *>(ptr[0]), plan->a,
        reinterpret_cast<const void *>(ptr[1]), plan->b, &beta, d, plan->d, d, plan->d,
        &plan->algo, reinterpret_cast<void *>(lt_workspace_), kCublasWorkspaceBytes, stream_);
    if (s != 0)
      return "cublasLtMatmul failed (status " + std::to_string(s) + ") for m " +
             std::to_string(g.m()) + ", n " + std::to_string(g.n()) + ", k " +
             std::to_string(g.k());
    return "";
  }

  std::string synchronize() override {
    return drv(dev_.driver->cuStreamSynchronize(stream_), "cuStreamSynchronize");
  }

  // Stream capture in thread-local mode: only this thread's unsafe calls
  // (a synchronous copy, an allocation) invalidate the capture. cuBLASLt
  // is captured as well: its workspace is preallocated (lt_workspace_) and
  // its algorithms were chosen in the eager run before, so it allocates
  // nothing under capture.
  std::string begin_capture() override {
    return drv(dev_.driver->cuStreamBeginCapture(stream_, cu::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
               "cuStreamBeginCapture");
  }
  std::string end_capture(uint64_t *graph) override {
    *graph = 0;
    cu::CUgraph g = nullptr;
    if (std::string e = drv(dev_.driver->cuStreamEndCapture(stream_, &g), "cuStreamEndCapture");
        !e.empty()) {
      if (g)
        dev_.driver->cuGraphDestroy(g);
      return e;
    }
    cu::CUgraphExec exec = nullptr;
    std::string e = drv(dev_.driver->cuGraphInstantiate(&exec, g, 0), "cuGraphInstantiate");
    dev_.driver->cuGraphDestroy(g); // the executable graph is independent of it
    if (!e.empty())
      return e;
    graphs_.insert(exec);
    *graph = reinterpret_cast<uint64_t>(exec);
    return "";
  }
  std::string launch_graph(uint64_t graph) override {
    return drv(dev_.driver->cuGraphLaunch(reinterpret_cast<cu::CUgraphExec>(graph), stream_),
               "cuGraphLaunch");
  }
  void destroy_graph(uint64_t graph) override {
    auto it = graphs_.find(reinterpret_cast<cu::CUgraphExec>(graph));
    if (it == graphs_.end())
      return;
    dev_.driver->cuGraphExecDestroy(*it);
    graphs_.erase(it);
  }

private:
  // A GEMM shape's descriptor, layouts and algorithm, chosen once by
  // cuBLASLt's heuristic and kept for every later call of that shape.
  struct Gemm {
    cu::cublasLtMatmulDesc_t desc = nullptr;
    cu::cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cu::cublasLtMatmulAlgo_t algo{};
  };

  std::string gemm_plan(const pl::Gemm &g, Gemm **out) {
    auto key = std::make_tuple(g.m(), g.n(), g.k(), g.trans_a(), g.trans_b(), g.lda(), g.ldb(),
                               g.ldd(), int(g.a_type()), int(g.b_type()), int(g.d_type()),
                               g.accumulate(), int(g.epilogue()), int(g.bias_type()));
    auto it = gemms_.find(key);
    if (it != gemms_.end()) {
      *out = &it->second;
      return "";
    }
    Gemm p;
    const std::string what = "cuBLASLt GEMM m " + std::to_string(g.m()) + ", n " +
                             std::to_string(g.n()) + ", k " + std::to_string(g.k());
    if (lt_->cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != 0)
      return what + ": cublasLtMatmulDescCreate failed";
    const int ta = g.trans_a() ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b() ? CUBLAS_OP_T : CUBLAS_OP_N;
    lt_->cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    lt_->cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    int epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    switch (g.epilogue()) {
    case pl::GemmEpilogue::NONE: break;
    case pl::GemmEpilogue::BIAS: epilogue = CUBLASLT_EPILOGUE_BIAS; break;
    case pl::GemmEpilogue::GELU_BIAS: epilogue = CUBLASLT_EPILOGUE_GELU_BIAS; break;
    case pl::GemmEpilogue::GELU_AUX_BIAS: epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS; break;
    }
    lt_->cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                        sizeof epilogue);
    if (g.epilogue() != pl::GemmEpilogue::NONE) {
      const int bt = cuda_type(g.bias_type());
      lt_->cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                          sizeof bt);
    }
    if (g.epilogue() == pl::GemmEpilogue::GELU_AUX_BIAS) {
      const int64_t ld = g.ldd();
      lt_->cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                          sizeof ld);
    }
    // Stored shapes, column-major: A is k x m when transposed, else m x k.
    const uint64_t ar = g.trans_a() ? g.k() : g.m(), ac = g.trans_a() ? g.m() : g.k();
    const uint64_t br = g.trans_b() ? g.n() : g.k(), bc = g.trans_b() ? g.k() : g.n();
    if (lt_->cublasLtMatrixLayoutCreate(&p.a, cuda_type(g.a_type()), ar, ac, g.lda()) != 0 ||
        lt_->cublasLtMatrixLayoutCreate(&p.b, cuda_type(g.b_type()), br, bc, g.ldb()) != 0 ||
        lt_->cublasLtMatrixLayoutCreate(&p.d, cuda_type(g.d_type()), g.m(), g.n(), g.ldd()) != 0)
      return what + ": cublasLtMatrixLayoutCreate failed";
    cu::cublasLtMatmulPreference_t pref = nullptr;
    lt_->cublasLtMatmulPreferenceCreate(&pref);
    const uint64_t ws = kCublasWorkspaceBytes;
    lt_->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                              sizeof ws);
    cu::cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cu::cublasStatus_t s = lt_->cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d,
                                                               p.d, pref, 1, &result, &found);
    lt_->cublasLtMatmulPreferenceDestroy(pref);
    if (s != 0 || found == 0)
      return what + ": cuBLASLt has no algorithm for it (status " + std::to_string(s) + ")";
    p.algo = result.algo;
    *out = &(gemms_[key] = p);
    return "";
  }

  std::string error_name(cu::CUresult r) const {
    const char *name = nullptr;
    dev_.driver->cuGetErrorName(r, &name);
    return (name ? name : "CUDA error") + std::string(" (") + std::to_string(r) + ")";
  }
  std::string drv(cu::CUresult r, const std::string &what) const {
    return r == cu::CUDA_SUCCESS ? "" : what + " failed on " + describe(dev_) + ": " + error_name(r);
  }

  CudaDevice dev_;
  const cu::Nvrtc *nvrtc_ = nullptr;
  const cu::CublasLt *lt_ = nullptr;
  std::unique_ptr<KernelCache> cache_;
  cu::CUstream stream_ = nullptr;
  cu::cublasLtHandle_t handle_ = nullptr;
  uint64_t lt_workspace_ = 0;
  std::vector<cu::CUdeviceptr> allocations_;
  std::vector<cu::CUmodule> modules_;
  std::set<cu::CUgraphExec> graphs_;
  std::map<uint32_t, cu::CUfunction> functions_;
  std::map<std::pair<std::string, std::string>, cu::CUfunction> by_source_;
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, bool, int64_t, int64_t, int64_t, int, int,
                      int, bool, int, int>,
           Gemm>
      gemms_;
};

} // namespace

std::unique_ptr<GpuDevice> open_cuda_gpu_device(int local_rank, const std::string &cache_dir,
                                                std::string *error) {
  auto d = std::make_unique<CudaGpuDevice>();
  if (std::string e = d->open(local_rank, cache_dir); !e.empty()) {
    *error = e;
    return nullptr;
  }
  return d;
}

} // namespace mt::rt
