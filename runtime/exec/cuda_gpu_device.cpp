// The GpuDevice of a real GPU: the driver API, NVRTC through the kernel
// cache, cuBLASLt and NCCL, all loaded at run time (runtime/exec/cuda/cuda_api.h). Two
// streams per rank: the compute stream runs the kernels, the GEMMs, the
// copies and most collectives; the side stream runs the collectives the
// executor puts there (begin_side .. end_side), ordered against the compute
// stream by events. Everything is asynchronous until synchronize().
#include "runtime/exec/cuda_gpu_device.h"

#include "runtime/exec/cpu_kernels.h"
#include "runtime/exec/cuda/kernel_cache.h"
#include "runtime/plan/plan_reader.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

namespace mt::rt {

namespace pl = mt::plan;

namespace {

// cuBLASLt's workspace: the figure mtc's memory plan states.
constexpr uint64_t kCublasWorkspaceBytes = 32ull << 20;

int cuda_type(pl::DType t) {
  return t == pl::DType::BF16  ? cu::CUDA_R_16BF
         : t == pl::DType::F16 ? cu::CUDA_R_16F
         : t == pl::DType::F64 ? cu::CUDA_R_64F
                               : cu::CUDA_R_32F;
}

cu::ncclDataType_t nccl_type(CommElement t) {
  switch (t) {
  case CommElement::F32: return cu::ncclFloat32;
  case CommElement::F64: return cu::ncclFloat64;
  case CommElement::BF16: return cu::ncclBfloat16;
  case CommElement::F16: return cu::ncclFloat16;
  }
  return cu::ncclFloat32;
}

class NcclComm;
// The device's live communicators, which its waits watch; shared with them
// so either may go first.
using CommSet = std::shared_ptr<std::set<NcclComm *>>;

// One group's NCCL communicator. Its calls go to the stream `*stream`
// names when they are made: the device's compute stream, or its side
// stream between begin_side and end_side.
class NcclComm : public DeviceComm {
public:
  NcclComm(const cu::Nccl *nccl, cu::ncclComm_t comm, const cu::CUstream *stream, int rank,
           int size, std::string name, CommSet live)
      : nccl_(nccl), comm_(comm), stream_(stream), rank_(rank), size_(size),
        name_(std::move(name)), live_(std::move(live)) {
    live_->insert(this);
  }
  ~NcclComm() override {
    live_->erase(this);
    if (cu::ncclComm_t c = comm_.load()) {
      for (const auto &[key, op] : scaled_ops_)
        nccl_->ncclRedOpDestroy(op, c);
      nccl_->ncclCommDestroy(c);
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // An error NCCL found while its kernels run (a peer rank that died, a
  // broken connection) leaves them waiting forever; it is reported through
  // the communicator. Then the communicator is aborted, which ends its
  // kernels, and the error is returned.
  std::string async_error() {
    cu::ncclComm_t c = comm_.load();
    if (!c)
      return "";
    cu::ncclResult_t state = cu::ncclSuccess;
    cu::ncclResult_t r = nccl_->ncclCommGetAsyncError(c, &state);
    if (r == cu::ncclSuccess && (state == cu::ncclSuccess || state == cu::ncclInProgress))
      return "";
    const cu::ncclResult_t why = r != cu::ncclSuccess ? r : state;
    abort();
    return "a collective on the " + name_ + " group (" + std::to_string(size_) +
           " GPUs) failed: " + nccl_->ncclGetErrorString(why) + " (NCCL error " +
           std::to_string(why) + "; another rank of the group may have stopped: its log " +
           "says why; NCCL_DEBUG=WARN says more)";
  }
  // Ends the communicator's kernels (after another group's failure, or
  // from the watchdog's thread after a timeout: ncclCommAbort is the call
  // NCCL makes for ending a communicator whose operations hang). The
  // handle is taken once, so two aborts never free it twice.
  void abort() override {
    if (cu::ncclComm_t c = comm_.exchange(nullptr))
      nccl_->ncclCommAbort(c);
  }
  bool aborted() const { return comm_.load() == nullptr; }

  std::string all_reduce(uint64_t in, uint64_t out, uint64_t count, CommElement t, ReduceOp op,
                         double scale) override {
    cu::ncclRedOp_t o = op == ReduceOp::Max ? cu::ncclMax : cu::ncclSum;
    cu::ncclComm_t c = nullptr;
    if (std::string e = live(&c); !e.empty())
      return e;
    if (std::string e = scaled(op, scale, t, c, &o); !e.empty())
      return e;
    return check(nccl_->ncclAllReduce(ptr(in), ptr(out), count, nccl_type(t), o, c, *stream_),
                 "ncclAllReduce");
  }
  std::string all_gather(uint64_t in, uint64_t out, uint64_t count, CommElement t) override {
    cu::ncclComm_t c = nullptr;
    if (std::string e = live(&c); !e.empty())
      return e;
    return check(nccl_->ncclAllGather(ptr(in), ptr(out), count, nccl_type(t), c, *stream_),
                 "ncclAllGather");
  }
  std::string reduce_scatter(uint64_t in, uint64_t out, uint64_t count, CommElement t,
                             double scale) override {
    cu::ncclRedOp_t o = cu::ncclSum;
    cu::ncclComm_t c = nullptr;
    if (std::string e = live(&c); !e.empty())
      return e;
    if (std::string e = scaled(ReduceOp::Sum, scale, t, c, &o); !e.empty())
      return e;
    return check(nccl_->ncclReduceScatter(ptr(in), ptr(out), count, nccl_type(t), o, c, *stream_),
                 "ncclReduceScatter");
  }
  std::string reduce(uint64_t in, uint64_t out, uint64_t count, CommElement t,
                     int root) override {
    cu::ncclComm_t c = nullptr;
    if (std::string e = live(&c); !e.empty())
      return e;
    return check(nccl_->ncclReduce(ptr(in), ptr(out), count, nccl_type(t), cu::ncclSum, root, c,
                                   *stream_),
                 "ncclReduce");
  }
  std::string group_start() override { return check(nccl_->ncclGroupStart(), "ncclGroupStart"); }
  std::string group_end() override { return check(nccl_->ncclGroupEnd(), "ncclGroupEnd"); }
  std::string send(uint64_t buf, uint64_t count, CommElement t, int peer) override {
    cu::ncclComm_t c = nullptr;
    if (std::string e = live(&c); !e.empty())
      return e;
    return check(nccl_->ncclSend(ptr(buf), count, nccl_type(t), peer, c, *stream_), "ncclSend");
  }
  std::string recv(uint64_t buf, uint64_t count, CommElement t, int peer) override {
    cu::ncclComm_t c = nullptr;
    if (std::string e = live(&c); !e.empty())
      return e;
    return check(nccl_->ncclRecv(ptr(buf), count, nccl_type(t), peer, c, *stream_), "ncclRecv");
  }

private:
  static void *ptr(uint64_t a) { return reinterpret_cast<void *>(a); }
  std::string live(cu::ncclComm_t *c) const {
    *c = comm_.load();
    if (*c)
      return "";
    return "the " + name_ + " group's NCCL communicator was aborted (a collective failed or "
           "timed out)";
  }
  // A sum times 1/size is NCCL's average; any other factor (an expert
  // bucket's 1/dp over an expert data-parallel group of another size, e.g.
  // tp 2 x dp 2 at expert_tensor_parallel 1: 1/2 over 4 GPUs) is a
  // pre-multiplied sum, ncclRedOpCreatePreMulSum's operator with the factor
  // in the reduction's type, made once per (type, factor) and kept until
  // the communicator goes (a few per run: the plans' scales are per group).
  std::string scaled(ReduceOp op, double scale, CommElement t, cu::ncclComm_t c,
                     cu::ncclRedOp_t *o) {
    if (scale == 1.0)
      return "";
    if (op == ReduceOp::Sum && std::fabs(scale * size_ - 1.0) < 1e-12) {
      *o = cu::ncclAvg;
      return "";
    }
    if (op != ReduceOp::Sum)
      return "a maximum scaled by " + std::to_string(scale) + " over the " + name_ +
             " group; NCCL scales sums only";
    uint64_t bits = 0;
    if (std::string e = scalar_bits(scale, t, &bits); !e.empty())
      return e;
    const std::pair<int, uint64_t> key{int(t), bits};
    if (auto it = scaled_ops_.find(key); it != scaled_ops_.end()) {
      *o = it->second;
      return "";
    }
    cu::ncclRedOp_t made = 0;
    if (std::string e = check(nccl_->ncclRedOpCreatePreMulSum(&made, &bits, nccl_type(t),
                                                              cu::ncclScalarHostImmediate, c),
                              "ncclRedOpCreatePreMulSum");
        !e.empty())
      return e;
    scaled_ops_.emplace(key, made);
    *o = made;
    return "";
  }
  // The factor as NCCL reads it for a reduction of type t (little-endian:
  // the value's bytes start at the scalar's address).
  std::string scalar_bits(double scale, CommElement t, uint64_t *bits) const {
    float f = float(scale);
    uint32_t u = 0;
    switch (t) {
    case CommElement::F64: std::memcpy(bits, &scale, 8); return "";
    case CommElement::F32: std::memcpy(&u, &f, 4); *bits = u; return "";
    case CommElement::BF16:
      cpu::round_to_bf16(&f, 1);
      std::memcpy(&u, &f, 4);
      *bits = u >> 16;
      return "";
    case CommElement::F16: {
      cpu::round_to_fp16(&f, 1);
      std::memcpy(&u, &f, 4);
      const uint32_t mag = u & 0x7FFFFFFFu;
      if (mag < 0x38800000u || mag >= 0x47800000u) // outside fp16's normal range
        break;
      *bits = ((u >> 16) & 0x8000u) | (((mag >> 23) - 112u) << 10) | ((mag >> 13) & 0x3FFu);
      return "";
    }
    }
    return "a reduction scaled by " + std::to_string(scale) + " over the " + name_ +
           " group, a factor fp16 cannot hold";
  }
  std::string check(cu::ncclResult_t r, const char *what) const {
    if (r == 0)
      return "";
    return std::string(what) + " on the " + name_ + " group (" + std::to_string(size_) +
           " GPUs) failed: " + nccl_->ncclGetErrorString(r) + " (NCCL error " +
           std::to_string(r) + "; NCCL_DEBUG=WARN says more)";
  }
  const cu::Nccl *nccl_;
  std::atomic<cu::ncclComm_t> comm_;
  const cu::CUstream *stream_;
  int rank_, size_;
  std::string name_;
  CommSet live_;
  std::map<std::pair<int, uint64_t>, cu::ncclRedOp_t> scaled_ops_;
};

class CudaGpuDevice : public GpuDevice {
public:
  ~CudaGpuDevice() override {
    if (!dev_.driver)
      return;
    // Nothing below may go while the streams still run work that uses it.
    for (cu::CUstream s : {side_, stream_})
      if (s)
        dev_.driver->cuStreamSynchronize(s);
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
    if (forked_)
      dev_.driver->cuEventDestroy(forked_);
    for (cu::CUevent e : side_done_)
      dev_.driver->cuEventDestroy(e);
    for (cu::CUevent e : free_events_)
      dev_.driver->cuEventDestroy(e);
    for (cu::CUstream s : {side_, stream_})
      if (s)
        dev_.driver->cuStreamDestroy(s);
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
    if (std::string e = check_nvrtc_targets(dev_, *nvrtc_); !e.empty())
      return e;
    if (!(lt_ = cu::load_cublaslt(&err)))
      return err;
    cache_ = std::make_unique<KernelCache>(nvrtc_, cache_dir);
    for (cu::CUstream *s : {&stream_, &side_})
      if (std::string e = drv(dev_.driver->cuStreamCreate(s, cu::CU_STREAM_NON_BLOCKING),
                              "cuStreamCreate");
          !e.empty())
        return e;
    if (std::string e = drv(dev_.driver->cuEventCreate(&forked_, cu::CU_EVENT_DISABLE_TIMING),
                            "cuEventCreate");
        !e.empty())
      return e;
    nccl_stream_ = stream_;
    if (lt_->cublasLtCreate(&handle_) != 0)
      return "cublasLtCreate failed on " + describe(dev_);
    return allocate(kCublasWorkspaceBytes, &lt_workspace_);
  }

  uint64_t own_bytes() const override { return lt_workspace_ ? kCublasWorkspaceBytes : 0; }
  uint64_t own_allocations() const override { return lt_workspace_ ? 1 : 0; }

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
  std::string copy(uint64_t dst, uint64_t src, uint64_t bytes) override {
    return drv(dev_.driver->cuMemcpyDtoDAsync(dst, src, bytes, stream_), "cuMemcpyDtoDAsync");
  }
  std::string fill(uint64_t dst, uint8_t byte, uint64_t bytes) override {
    return drv(dev_.driver->cuMemsetD8Async(dst, byte, bytes, stream_), "cuMemsetD8Async");
  }

  std::string load_kernel(uint32_t index, const pl::Kernel &kernel) override {
    const std::string source = kernel.cuda_source()->str(), entry = kernel.entry()->str();
    auto known = by_source_.find({source, entry});
    if (known != by_source_.end()) {
      functions_[index] = known->second;
      return allow_shared(known->second, kernel);
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
    return allow_shared(f, kernel);
  }

  // The kernel's launch checked against this GPU's limits (a plan from
  // another mtc, or a GPU below the limits mtc generates for, is refused
  // naming the kernel), and more than 48 KiB of dynamic shared memory opted
  // in to per function (cuda_device.h, prepare_launch). Entries that share
  // a function get the largest they ask.
  std::string allow_shared(cu::CUfunction f, const pl::Kernel &kernel) {
    uint32_t grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
    for (uint32_t i = 0; i < 3; ++i) {
      if (kernel.grid() && i < kernel.grid()->size())
        grid[i] = kernel.grid()->Get(i);
      if (kernel.block() && i < kernel.block()->size())
        block[i] = kernel.block()->Get(i);
    }
    const std::string entry = kernel.entry()->str();
    const std::string name =
        kernel.name() && kernel.name()->str() != entry ? kernel.name()->str() + " (" + entry + ")"
                                                       : entry;
    return rt::prepare_launch(dev_, f, name, grid, block, kernel.shared_bytes(),
                              &shared_allowed_[f]);
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
    if (std::string e = gemm_plan(g, ptr, &plan); !e.empty())
      return e;
    if (!set_epilogue_pointers(plan->desc, g, ptr))
      return gemm_what(g) + ": cublasLtMatmulDescSetAttribute of the bias or aux pointer failed";
    // The scales have the compute type's scale type (f64 for f64 GEMMs).
    const float alpha = 1.0f, beta = g.accumulate() ? 1.0f : 0.0f;
    const double alpha64 = 1.0, beta64 = g.accumulate() ? 1.0 : 0.0;
    const bool f64 = g.a_type() == pl::DType::F64;
    void *d = reinterpret_cast<void *>(ptr[2]);
    cu::cublasStatus_t s = lt_->cublasLtMatmul(
        handle_, plan->desc, f64 ? static_cast<const void *>(&alpha64) : &alpha,
        reinterpret_cast<const void *>(ptr[0]), plan->a, reinterpret_cast<const void *>(ptr[1]),
        plan->b, f64 ? static_cast<const void *>(&beta64) : &beta, d, plan->d, d, plan->d,
        &plan->algo, reinterpret_cast<void *>(lt_workspace_), kCublasWorkspaceBytes, stream_);
    if (s != 0)
      return "cublasLtMatmul failed (status " + std::to_string(s) + ") for m " +
             std::to_string(g.m()) + ", n " + std::to_string(g.n()) + ", k " +
             std::to_string(g.k());
    return "";
  }

  // Without communicators, a plain wait. With them, the stream is polled
  // and the communicators watched between polls, so a failed collective
  // ends the wait with its error instead of blocking it forever.
  std::string synchronize() override {
    if (comms_->empty())
      return drv(dev_.driver->cuStreamSynchronize(stream_), "cuStreamSynchronize");
    for (int polls = 0;; ++polls) {
      const cu::CUresult r = dev_.driver->cuStreamQuery(stream_);
      if (r != cu::CUDA_ERROR_NOT_READY)
        return drv(r, "waiting for the GPU's stream");
      for (NcclComm *c : *comms_)
        if (c->aborted()) {
          // Aborted from the watchdog's thread (a collective timed out):
          // the kernels end, the streams drain, and the executor says why.
          for (NcclComm *other : *comms_)
            other->abort();
          for (cu::CUstream s : {side_, stream_})
            dev_.driver->cuStreamSynchronize(s);
          return "the collectives were aborted (a collective timed out)";
        }
      for (NcclComm *c : *comms_)
        if (std::string e = c->async_error(); !e.empty()) {
          // Aborting one communicator can leave the others' kernels waiting
          // on it: end them all, then let the stream drain.
          for (NcclComm *other : *comms_)
            other->abort();
          for (cu::CUstream s : {side_, stream_})
            dev_.driver->cuStreamSynchronize(s);
          return e;
        }
      // Spin briefly (a step's tail), then yield the core in 50 us naps.
      if (polls < 256)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // The watchdog's events: recorded where the NCCL calls go now, queried
  // and released from the watchdog's thread, which the device's context
  // is made current on first. Released events are kept for reuse.
  std::string record_event(uint64_t *event) override {
    *event = 0;
    cu::CUevent ev = nullptr;
    {
      std::lock_guard<std::mutex> lock(events_mu_);
      if (!free_events_.empty()) {
        ev = free_events_.back();
        free_events_.pop_back();
      }
    }
    if (!ev)
      if (std::string e = drv(dev_.driver->cuEventCreate(&ev, cu::CU_EVENT_DISABLE_TIMING),
                              "cuEventCreate");
          !e.empty())
        return e;
    if (std::string e = drv(dev_.driver->cuEventRecord(ev, nccl_stream_), "cuEventRecord");
        !e.empty()) {
      release_event(reinterpret_cast<uint64_t>(ev));
      return e;
    }
    *event = reinterpret_cast<uint64_t>(ev);
    return "";
  }
  bool event_done(uint64_t event, std::string *error) override {
    bind_context();
    const cu::CUresult r = dev_.driver->cuEventQuery(reinterpret_cast<cu::CUevent>(event));
    if (r == cu::CUDA_ERROR_NOT_READY)
      return false;
    *error = drv(r, "cuEventQuery");
    return true;
  }
  void release_event(uint64_t event) override {
    std::lock_guard<std::mutex> lock(events_mu_);
    free_events_.push_back(reinterpret_cast<cu::CUevent>(event));
  }

  // NCCL's bootstrap: group rank 0's unique id reaches the others over the
  // host group (Gloo, or threads), then every member joins.
  std::unique_ptr<DeviceComm> connect(Communicator &group, std::string *error) override {
    const cu::Nccl *nccl = cu::load_nccl(error);
    if (!nccl)
      return nullptr;
    cu::ncclUniqueId id{};
    if (group.rank() == 0)
      if (cu::ncclResult_t r = nccl->ncclGetUniqueId(&id); r != 0) {
        *error = std::string("ncclGetUniqueId failed: ") + nccl->ncclGetErrorString(r);
        return nullptr;
      }
    static_assert(sizeof id % sizeof(float) == 0, "the id travels as floats");
    std::vector<float> bytes(sizeof id / sizeof(float));
    std::memcpy(bytes.data(), &id, sizeof id);
    if (std::string e = group.broadcast(bytes.data(), bytes.size(), 0); !e.empty()) {
      *error = e;
      return nullptr;
    }
    std::memcpy(&id, bytes.data(), sizeof id);
    cu::ncclComm_t comm = nullptr;
    if (cu::ncclResult_t r = nccl->ncclCommInitRank(&comm, group.size(), id, group.rank());
        r != 0) {
      *error = std::string("ncclCommInitRank on ") + describe(dev_) + " failed: " +
               nccl->ncclGetErrorString(r) + " (NCCL_DEBUG=WARN says more)";
      return nullptr;
    }
    return std::make_unique<NcclComm>(nccl, comm, &nccl_stream_, group.rank(), group.size(),
                                      group.name(), comms_);
  }

  // The side stream waits for an event recorded on the compute stream
  // (fork); each batch of side work ends with an event of its own, and a
  // join makes the compute stream wait for the youngest batch it needs
  // (the side stream is in order). Under capture the first fork takes the
  // side stream into the capture and the joins bring it back, as
  // cuStreamEndCapture requires. A wait takes an event's latest record, so
  // one fork event serves every fork, and a joined batch's event is
  // recorded again by a later batch. A program's first run is eager, so
  // the events a captured run needs exist before its capture.
  bool has_side_stream() const override { return true; }
  std::string begin_side() override {
    if (std::string e = drv(dev_.driver->cuEventRecord(forked_, stream_), "cuEventRecord");
        !e.empty())
      return e;
    if (std::string e = drv(dev_.driver->cuStreamWaitEvent(side_, forked_, 0),
                            "cuStreamWaitEvent");
        !e.empty())
      return e;
    nccl_stream_ = side_;
    return "";
  }
  std::string end_side() override {
    nccl_stream_ = stream_;
    if (side_open_ == side_done_.size()) {
      cu::CUevent ev = nullptr;
      if (std::string e = drv(dev_.driver->cuEventCreate(&ev, cu::CU_EVENT_DISABLE_TIMING),
                              "cuEventCreate");
          !e.empty())
        return e;
      side_done_.push_back(ev);
    }
    if (std::string e = drv(dev_.driver->cuEventRecord(side_done_[side_open_], side_),
                            "cuEventRecord");
        !e.empty())
      return e;
    ++side_open_;
    return "";
  }
  std::string join_side(size_t batches) override {
    const size_t n = std::min(batches, side_open_);
    if (n == 0)
      return "";
    if (std::string e = drv(dev_.driver->cuStreamWaitEvent(stream_, side_done_[n - 1], 0),
                            "cuStreamWaitEvent");
        !e.empty())
      return e;
    // The open batches' events first again, in order.
    std::rotate(side_done_.begin(), side_done_.begin() + long(n),
                side_done_.begin() + long(side_open_));
    side_open_ -= n;
    return "";
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

  static std::string gemm_what(const pl::Gemm &g) {
    return "cuBLASLt GEMM m " + std::to_string(g.m()) + ", n " + std::to_string(g.n()) + ", k " +
           std::to_string(g.k());
  }

  // The bias (read, or for the bias gradients written) and aux pointers
  // change from call to call; the descriptor is per shape. cuBLASLt's
  // heuristic reads them too, for their alignment (cublasLt.h,
  // CUBLASLT_MATMUL_DESC_BIAS_POINTER), so gemm_plan sets them first.
  bool set_epilogue_pointers(cu::cublasLtMatmulDesc_t desc, const pl::Gemm &g,
                             const uint64_t *ptr) const {
    bool ok = true;
    if (gemm_epilogue_has_bias(g.epilogue())) {
      const void *bias = reinterpret_cast<const void *>(ptr[3]);
      ok &= lt_->cublasLtMatmulDescSetAttribute(desc, cu::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                &bias, sizeof bias) == 0;
    }
    if (gemm_epilogue_has_aux(g.epilogue())) {
      const void *aux = reinterpret_cast<const void *>(ptr[4]);
      ok &= lt_->cublasLtMatmulDescSetAttribute(
                desc, cu::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux) == 0;
    }
    return ok;
  }

  std::string gemm_plan(const pl::Gemm &g, const uint64_t *ptr, Gemm **out) {
    auto key = std::make_tuple(g.m(), g.n(), g.k(), g.trans_a(), g.trans_b(), g.lda(), g.ldb(),
                               g.ldd(), int(g.a_type()), int(g.b_type()), int(g.d_type()),
                               g.accumulate(), int(g.epilogue()), int(g.bias_type()));
    auto it = gemms_.find(key);
    if (it != gemms_.end()) {
      *out = &it->second;
      return "";
    }
    Gemm p;
    const std::string what = gemm_what(g);
    // Frees what was created so far when a later step fails.
    auto fail = [&](const std::string &why) {
      for (cu::cublasLtMatrixLayout_t l : {p.a, p.b, p.d})
        if (l)
          lt_->cublasLtMatrixLayoutDestroy(l);
      if (p.desc)
        lt_->cublasLtMatmulDescDestroy(p.desc);
      return what + ": " + why;
    };
    // f64 operands (the MoE router's GEMMs with moe_router_dtype fp64)
    // multiply in f64 with f64 scales; every other GEMM in f32.
    const bool f64 = g.a_type() == pl::DType::F64;
    if (lt_->cublasLtMatmulDescCreate(&p.desc, f64 ? cu::CUBLAS_COMPUTE_64F : cu::CUBLAS_COMPUTE_32F,
                                      f64 ? cu::CUDA_R_64F : cu::CUDA_R_32F) != 0)
      return fail("cublasLtMatmulDescCreate failed");
    auto set = [&](cu::cublasLtMatmulDescAttributes_t attr, const void *value, size_t size) {
      return lt_->cublasLtMatmulDescSetAttribute(p.desc, attr, value, size) == 0;
    };
    const int32_t ta = g.trans_a() ? cu::CUBLAS_OP_T : cu::CUBLAS_OP_N;
    const int32_t tb = g.trans_b() ? cu::CUBLAS_OP_T : cu::CUBLAS_OP_N;
    uint32_t epilogue = cu::CUBLASLT_EPILOGUE_DEFAULT;
    switch (g.epilogue()) {
    case pl::GemmEpilogue::NONE: break;
    case pl::GemmEpilogue::BIAS: epilogue = cu::CUBLASLT_EPILOGUE_BIAS; break;
    case pl::GemmEpilogue::GELU_BIAS: epilogue = cu::CUBLASLT_EPILOGUE_GELU_BIAS; break;
    case pl::GemmEpilogue::GELU_AUX_BIAS: epilogue = cu::CUBLASLT_EPILOGUE_GELU_AUX_BIAS; break;
    case pl::GemmEpilogue::DGELU: epilogue = cu::CUBLASLT_EPILOGUE_DGELU; break;
    case pl::GemmEpilogue::DGELU_BGRAD: epilogue = cu::CUBLASLT_EPILOGUE_DGELU_BGRAD; break;
    case pl::GemmEpilogue::BGRADB: epilogue = cu::CUBLASLT_EPILOGUE_BGRADB; break;
    }
    bool ok = set(cu::CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) &&
              set(cu::CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) &&
              set(cu::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
    // The bias or bias-gradient type (the plan states D's type for the
    // gradients, cuBLASLt's default for them); aux has D's type and layout.
    if (ok && gemm_epilogue_has_bias(g.epilogue())) {
      const int32_t bt = cuda_type(g.bias_type());
      ok = set(cu::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
    }
    if (ok && gemm_epilogue_has_aux(g.epilogue())) {
      const int64_t ld = g.ldd();
      ok = set(cu::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
    }
    if (!ok || !set_epilogue_pointers(p.desc, g, ptr))
      return fail("cublasLtMatmulDescSetAttribute failed");
    // Stored shapes, column-major: A is k x m when transposed, else m x k.
    const uint64_t ar = g.trans_a() ? g.k() : g.m(), ac = g.trans_a() ? g.m() : g.k();
    const uint64_t br = g.trans_b() ? g.n() : g.k(), bc = g.trans_b() ? g.k() : g.n();
    if (lt_->cublasLtMatrixLayoutCreate(&p.a, cuda_type(g.a_type()), ar, ac, g.lda()) != 0 ||
        lt_->cublasLtMatrixLayoutCreate(&p.b, cuda_type(g.b_type()), br, bc, g.ldb()) != 0 ||
        lt_->cublasLtMatrixLayoutCreate(&p.d, cuda_type(g.d_type()), g.m(), g.n(), g.ldd()) != 0)
      return fail("cublasLtMatrixLayoutCreate failed");
    cu::cublasLtMatmulPreference_t pref = nullptr;
    if (lt_->cublasLtMatmulPreferenceCreate(&pref) != 0)
      return fail("cublasLtMatmulPreferenceCreate failed");
    const uint64_t ws = kCublasWorkspaceBytes;
    cu::cublasStatus_t s = lt_->cublasLtMatmulPreferenceSetAttribute(
        pref, cu::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cu::cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (s == 0)
      s = lt_->cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1,
                                              &result, &found);
    lt_->cublasLtMatmulPreferenceDestroy(pref);
    if (s != 0 || found == 0)
      return fail("cuBLASLt has no algorithm for it (status " + std::to_string(s) + ")");
    p.algo = result.algo;
    *out = &(gemms_[key] = p);
    return "";
  }

  std::string error_name(cu::CUresult r) const {
    const char *name = nullptr;
    dev_.driver->cuGetErrorName(r, &name);
    return (name ? name : "CUDA error") + std::string(" (") + std::to_string(r) + ")";
  }
  // The calling thread gets the device's context (once per thread).
  void bind_context() const {
    thread_local cu::CUcontext bound = nullptr;
    if (bound != dev_.context && dev_.driver->cuCtxSetCurrent(dev_.context) == cu::CUDA_SUCCESS)
      bound = dev_.context;
  }
  std::string drv(cu::CUresult r, const std::string &what) const {
    return r == cu::CUDA_SUCCESS ? "" : what + " failed on " + describe(dev_) + ": " + error_name(r);
  }

  CudaDevice dev_;
  const cu::Nvrtc *nvrtc_ = nullptr;
  const cu::CublasLt *lt_ = nullptr;
  std::unique_ptr<KernelCache> cache_;
  cu::CUstream stream_ = nullptr, side_ = nullptr;
  cu::CUevent forked_ = nullptr;
  // One event per batch of side work; the first side_open_ are not joined.
  std::vector<cu::CUevent> side_done_;
  size_t side_open_ = 0;
  cu::CUstream nccl_stream_ = nullptr; // where NcclComm calls go now
  cu::cublasLtHandle_t handle_ = nullptr;
  uint64_t lt_workspace_ = 0;
  std::vector<cu::CUdeviceptr> allocations_;
  std::vector<cu::CUmodule> modules_;
  std::set<cu::CUgraphExec> graphs_;
  std::map<uint32_t, cu::CUfunction> functions_;
  std::map<std::pair<std::string, std::string>, cu::CUfunction> by_source_;
  std::map<cu::CUfunction, uint32_t> shared_allowed_; // opted in to, beyond the default 48 KiB
  CommSet comms_ = std::make_shared<std::set<NcclComm *>>();
  std::mutex events_mu_;
  std::vector<cu::CUevent> free_events_; // the watchdog's, for reuse
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
