// An emulated GPU for the GPU executor's tests (runtime/exec/gpu_executor.h):
// memory is host memory (device addresses are host pointers), kernels are
// the generated CUDA C compiled as host C++ under the CUDA emulation
// (CudaHostKernel.h), and GEMMs are a double-precision reference of
// plan.fbs's Gemm (column-major, transposes, accumulate, the bias and GeLU
// epilogues and their gradients) rounded to the output's type. Also the
// helpers the tests share: compiling a spec into a plan in memory and
// filling program inputs as the training loop does.
#ifndef MT_TEST_UNIT_EMULATEDGPUDEVICE_H
#define MT_TEST_UNIT_EMULATEDGPUDEVICE_H

#include "CudaHostKernel.h"

#include "compiler/import/ImportSpec.h"
#include "compiler/plan/PlanWriter.h"
#include "dialects/mt/MtOps.h"
#include "passes/Passes.h"
#include "runtime/exec/cpu_kernels.h"
#include "runtime/exec/cuda/launch_limits.h"
#include "runtime/exec/executor.h"
#include "runtime/exec/gpu_executor.h"
#include "runtime/plan/plan_reader.h"
#include "spec/Spec.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace mt::emu {

namespace pl = mt::plan;
using mt::rt::GpuDevice;

// Values are float but for f64 (the MoE router's fp64 GEMMs), which is
// read and written as it is.
inline double load(const void *p, pl::DType t, int64_t i) {
  if (t == pl::DType::F64)
    return static_cast<const double *>(p)[i];
  if (t == pl::DType::F32)
    return static_cast<const float *>(p)[i];
  uint16_t h;
  std::memcpy(&h, static_cast<const uint8_t *>(p) + 2 * i, 2);
  uint32_t u;
  if (t == pl::DType::BF16) {
    u = uint32_t(h) << 16;
  } else { // f16
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 31) {
      u = sign | 0x7F800000u | (m << 13);
    } else if (e == 0) {
      float f = float(m) * 0x1p-24f;
      std::memcpy(&u, &f, 4);
      u |= sign;
    } else {
      u = sign | ((e + 112u) << 23) | (m << 13);
    }
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline void store(void *p, pl::DType t, int64_t i, double wide) {
  if (t == pl::DType::F64) {
    static_cast<double *>(p)[i] = wide;
    return;
  }
  float x = float(wide);
  if (t == pl::DType::F32) {
    static_cast<float *>(p)[i] = x;
    return;
  }
  if (t == pl::DType::BF16) {
    mt::cpu::round_to_bf16(&x, 1);
    uint32_t u;
    std::memcpy(&u, &x, 4);
    const uint16_t h = uint16_t(u >> 16);
    std::memcpy(static_cast<uint8_t *>(p) + 2 * i, &h, 2);
    return;
  }
  mt::cpu::round_to_fp16(&x, 1);
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7FFFFFFFu;
  uint16_t h;
  if (mag > 0x7F800000u)
    h = uint16_t(sign | 0x7E00u);
  else if (mag == 0x7F800000u)
    h = uint16_t(sign | 0x7C00u);
  else if (mag >= 0x38800000u)
    h = uint16_t(sign | (((mag >> 23) - 112u) << 10) | ((mag >> 13) & 0x3FFu));
  else {
    float a;
    std::memcpy(&a, &mag, 4);
    h = uint16_t(sign | uint32_t(a * 0x1p24f));
  }
  std::memcpy(static_cast<uint8_t *>(p) + 2 * i, &h, 2);
}

inline double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

// The emulation runs a kernel's blocks on fibers sharing static
// __shared__ arrays, so ranks on threads (multi-rank tests) take turns.
inline std::mutex &emulationMutex() {
  static std::mutex m;
  return m;
}

inline size_t elementBytes(mt::rt::CommElement t) {
  return t == mt::rt::CommElement::F64 ? 8 : t == mt::rt::CommElement::F32 ? 4 : 2;
}
inline pl::DType dtypeOf(mt::rt::CommElement t) {
  return t == mt::rt::CommElement::BF16 ? pl::DType::BF16
         : t == mt::rt::CommElement::F16 ? pl::DType::F16
                                          : pl::DType::F32;
}

// NCCL's semantics over a host communicator: device memory is host memory,
// elements are widened to float for the host collective and rounded back to
// their type (f64 values sum in double, in rank order). Point-to-point
// messages between two ranks match by order, as NCCL's do (no tags): a plan
// whose sends and receives a pair issues in different orders fails here.
//
// Under graph capture a collective is recorded (its arguments by value, as
// NCCL's captured kernels hold them) and runs when the graph replays.
//
// abort() (any thread) makes every later call fail. With `abortable` set,
// each host collective also runs on a thread of its own while the caller
// waits for it or for an abort, which then ends the wait as ncclCommAbort
// ends NCCL's kernels; the thread itself finishes when the host
// communicator's timeout passes, and the destructor waits for it.
class EmulatedComm : public mt::rt::DeviceComm {
public:
  // `record`: takes the work and returns true when the device is capturing.
  using Recorder = std::function<bool(std::function<std::string()>)>;
  EmulatedComm(mt::rt::Communicator &c, Recorder record, bool abortable = false)
      : c_(c), record_(std::move(record)), abortable_(abortable) {}
  ~EmulatedComm() override {
    for (std::thread &t : stranded_)
      t.join();
  }
  void abort() override {
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      aborted_ = true;
    }
    abort_cv_.notify_all();
  }
  bool aborted() const {
    std::lock_guard<std::mutex> lock(abort_mu_);
    return aborted_;
  }
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }

  std::string all_reduce(uint64_t in, uint64_t out, uint64_t count, mt::rt::CommElement t,
                         mt::rt::ReduceOp op, double scale) override {
    return now([=] { return all_reduce_now(in, out, count, t, op, scale); });
  }
  std::string all_gather(uint64_t in, uint64_t out, uint64_t count,
                         mt::rt::CommElement t) override {
    return now([=] { return all_gather_now(in, out, count, t); });
  }
  std::string reduce_scatter(uint64_t in, uint64_t out, uint64_t count, mt::rt::CommElement t,
                             double scale) override {
    return now([=] { return reduce_scatter_now(in, out, count, t, scale); });
  }
  std::string reduce(uint64_t in, uint64_t out, uint64_t count, mt::rt::CommElement t,
                     int root) override {
    return now([=] { return reduce_now(in, out, count, t, root); });
  }
  std::string group_start() override { return ""; }
  std::string group_end() override { return ""; }
  std::string send(uint64_t buf, uint64_t count, mt::rt::CommElement t, int peer) override {
    return now([=] {
      ++calls;
      sent_elements += count;
      return c_.send(ptr(buf), count * elementBytes(t), peer, sent_[peer]++);
    });
  }
  std::string recv(uint64_t buf, uint64_t count, mt::rt::CommElement t, int peer) override {
    return now([=] {
      ++calls;
      return c_.recv(ptr(buf), count * elementBytes(t), peer, received_[peer]++);
    });
  }

  // The host communicator's all_to_all_v on the bytes (a move: no
  // widening), as NCCL's grouped sends and receives move them.
  std::string all_to_all_v(uint64_t send, const std::vector<uint64_t> &send_counts,
                           const std::vector<uint64_t> &send_displs, uint64_t recv,
                           const std::vector<uint64_t> &recv_counts,
                           const std::vector<uint64_t> &recv_displs,
                           mt::rt::CommElement t) override {
    auto sizes = [](const std::vector<uint64_t> &v) { return std::vector<size_t>(v.begin(), v.end()); };
    return now([=, this] {
      ++calls;
      ++all_to_alls;
      for (size_t p = 0; p < send_counts.size(); ++p)
        if (int(p) != rank())
          sent_elements += send_counts[p];
      return c_.all_to_all_v(ptr(send), sizes(send_counts), sizes(send_displs), ptr(recv),
                             sizes(recv_counts), sizes(recv_displs), elementBytes(t));
    });
  }

  int calls = 0; // collectives run (graph replays included)
  int all_to_alls = 0;
  // The elements this rank puts on the wire, as NCCL's ring algorithms
  // move them on n ranks: an all-reduce of c elements 2 (n - 1) c / n, an
  // all-gather or reduce-scatter (n - 1) c (c a block), a reduce c from
  // every rank but the root, a send or all-to-all what goes to the others.
  uint64_t sent_elements = 0;

private:
  std::string now(std::function<std::string()> f) {
    std::function<std::string()> run = [this, f] { return guarded(f); };
    if (record_ && record_(run))
      return "";
    return run();
  }
  std::string guarded(const std::function<std::string()> &f) {
    const std::string aborted = "the emulated communicator was aborted";
    if (this->aborted())
      return aborted;
    if (!abortable_)
      return f();
    struct Result {
      bool done = false;
      std::string error;
    };
    auto result = std::make_shared<Result>();
    std::thread t([this, f, result] {
      std::string e = f();
      std::lock_guard<std::mutex> lock(abort_mu_);
      result->error = e;
      result->done = true;
      abort_cv_.notify_all();
    });
    std::unique_lock<std::mutex> lock(abort_mu_);
    abort_cv_.wait(lock, [&] { return result->done || aborted_; });
    if (!result->done) {
      stranded_.push_back(std::move(t));
      return aborted;
    }
    lock.unlock();
    t.join();
    return result->error;
  }
  std::string all_reduce_now(uint64_t in, uint64_t out, uint64_t count, mt::rt::CommElement t,
                             mt::rt::ReduceOp op, double scale) {
    ++calls;
    sent_elements += 2 * uint64_t(size() - 1) * count / uint64_t(size());
    if (t == mt::rt::CommElement::F64) {
      std::vector<double> mine(count), all(count * size_t(size()));
      std::memcpy(mine.data(), ptr(in), count * 8);
      if (std::string e = c_.all_gather(reinterpret_cast<const float *>(mine.data()), 2 * count,
                                        reinterpret_cast<float *>(all.data()));
          !e.empty())
        return e;
      for (uint64_t i = 0; i < count; ++i) {
        double acc = all[i];
        for (int r = 1; r < size(); ++r) {
          const double x = all[size_t(r) * count + i];
          acc = op == mt::rt::ReduceOp::Max ? std::max(acc, x) : acc + x;
        }
        mine[i] = acc * scale;
      }
      std::memcpy(ptr(out), mine.data(), count * 8);
      return "";
    }
    std::vector<float> v = read(in, count, t);
    if (std::string e = c_.all_reduce(v.data(), count, op); !e.empty())
      return e;
    if (scale != 1.0)
      mt::cpu::scale(v.data(), int64_t(count), scale);
    write(out, v, t);
    return "";
  }
  std::string all_gather_now(uint64_t in, uint64_t out, uint64_t count, mt::rt::CommElement t) {
    ++calls;
    sent_elements += uint64_t(size() - 1) * count;
    std::vector<float> v = read(in, count, t), all(count * size_t(size()));
    if (std::string e = c_.all_gather(v.data(), count, all.data()); !e.empty())
      return e;
    write(out, all, t);
    return "";
  }
  std::string reduce_scatter_now(uint64_t in, uint64_t out, uint64_t count,
                                 mt::rt::CommElement t, double scale) {
    ++calls;
    sent_elements += uint64_t(size() - 1) * count;
    std::vector<float> v = read(in, count * size_t(size()), t), mine(count);
    if (std::string e = c_.reduce_scatter(v.data(), count, mine.data()); !e.empty())
      return e;
    if (scale != 1.0)
      mt::cpu::scale(mine.data(), int64_t(count), scale);
    write(out, mine, t);
    return "";
  }
  // The host's reduce_scatter_v with every block but the root's empty.
  std::string reduce_now(uint64_t in, uint64_t out, uint64_t count, mt::rt::CommElement t,
                         int root) {
    ++calls;
    if (t == mt::rt::CommElement::F64)
      return "reduce: f64 is not emulated";
    if (root < 0 || root >= size())
      return "reduce: root " + std::to_string(root) + " is not a rank of the group";
    if (root != rank())
      sent_elements += count;
    std::vector<size_t> counts(size_t(size()), 0);
    counts[size_t(root)] = size_t(count);
    std::vector<float> v = read(in, count, t), mine(root == rank() ? count : 0);
    if (std::string e = c_.reduce_scatter_v(v.data(), counts, mine.data()); !e.empty())
      return e;
    if (root == rank())
      write(out, mine, t);
    return "";
  }
  static void *ptr(uint64_t a) { return reinterpret_cast<void *>(a); }
  static std::vector<float> read(uint64_t at, uint64_t count, mt::rt::CommElement t) {
    std::vector<float> v(count);
    for (uint64_t i = 0; i < count; ++i)
      v[i] = float(load(ptr(at), dtypeOf(t), int64_t(i)));
    return v;
  }
  static void write(uint64_t at, const std::vector<float> &v, mt::rt::CommElement t) {
    for (size_t i = 0; i < v.size(); ++i)
      store(ptr(at), dtypeOf(t), int64_t(i), v[i]);
  }
  mt::rt::Communicator &c_;
  Recorder record_;
  std::map<int, int> sent_, received_;
  bool abortable_ = false;
  mutable std::mutex abort_mu_;
  std::condition_variable abort_cv_;
  bool aborted_ = false;
  std::vector<std::thread> stranded_; // collectives still waiting after an abort
};

// d gelu_tanh / dx.
inline double gelu_tanh_grad(double x) {
  const double c = 0.7978845608028654, t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

// CUDA graphs as CUDA makes them: while capturing, launches, GEMMs and
// fills are recorded with copies of their argument values and run nothing;
// launching a graph replays the records. So a step that only works because
// an argument is read at launch time (a per-step value passed by value)
// goes wrong here as on a GPU, and host copies, synchronisation and kernel
// loads inside a capture are errors, as stream capture makes them.
class EmulatedDevice : public GpuDevice {
public:
  std::unique_ptr<mt::rt::DeviceComm> connect(mt::rt::Communicator &group,
                                              std::string *) override {
    auto c = std::make_unique<EmulatedComm>(group, [this](std::function<std::string()> f) {
      if (side_) {
        ++sideCalls;
        side_queue_.push_back(std::move(f));
        return true;
      }
      if (!capturing_)
        return false;
      Node n;
      n.kind = Node::Call;
      n.call = std::move(f);
      recording_.push_back(std::move(n));
      return true;
    }, abortable);
    comms.push_back(c.get());
    return c;
  }
  std::vector<EmulatedComm *> comms;
  bool abortable = false; // EmulatedComm's abortable mode for the communicators connected after

  // The watchdog's events: passed at once on the compute stream (its work
  // ran as it was issued), when the side stream's work before them runs
  // (join_side) there.
  std::string record_event(uint64_t *event) override {
    if (capturing_)
      return "an event recorded while capturing a graph";
    std::lock_guard<std::mutex> lock(events_mu_);
    *event = ++lastEvent_;
    events_[*event] = !side_;
    if (side_) {
      const uint64_t e = *event;
      side_queue_.push_back([this, e] {
        std::lock_guard<std::mutex> l(events_mu_);
        if (auto it = events_.find(e); it != events_.end())
          it->second = true;
        return std::string();
      });
    }
    ++eventsRecorded;
    return "";
  }
  bool event_done(uint64_t event, std::string *error) override {
    std::lock_guard<std::mutex> lock(events_mu_);
    auto it = events_.find(event);
    if (it == events_.end()) {
      *error = "no such event";
      return true;
    }
    return it->second;
  }
  void release_event(uint64_t event) override {
    std::lock_guard<std::mutex> lock(events_mu_);
    events_.erase(event);
  }
  size_t liveEvents() const {
    std::lock_guard<std::mutex> lock(events_mu_);
    return events_.size();
  }
  int eventsRecorded = 0;
  uint64_t allocated = 0; // bytes asked of allocate()
  uint64_t memory_limit = UINT64_MAX; // a larger allocate() fails, as on a full GPU

  // The side stream at its slowest: its collectives run only when the
  // compute stream joins it, so a kernel that reads or overwrites their
  // bytes before the join sees them unreduced (or changes what they
  // send), as a GPU might. Work issued to it outside begin_side/end_side,
  // host copies and waits with work unjoined are errors.
  bool has_side_stream() const override { return true; }
  std::string begin_side() override {
    if (side_)
      return "begin_side inside begin_side";
    side_ = true;
    return "";
  }
  std::string end_side() override {
    if (!side_)
      return "end_side outside begin_side";
    side_ = false;
    batch_ends_.push_back(side_queue_.size());
    return "";
  }
  // The oldest `batches` batches run now (the side stream is in order);
  // younger ones wait for a later join.
  std::string join_side(size_t batches) override {
    if (side_)
      return "join_side inside begin_side";
    const size_t n = std::min(batches, batch_ends_.size());
    if (n == 0)
      return "";
    ++joins;
    if (n < batch_ends_.size())
      ++partialJoins;
    const size_t count = batch_ends_[n - 1];
    std::vector<std::function<std::string()>> work(
        std::make_move_iterator(side_queue_.begin()),
        std::make_move_iterator(side_queue_.begin() + long(count)));
    side_queue_.erase(side_queue_.begin(), side_queue_.begin() + long(count));
    batch_ends_.erase(batch_ends_.begin(), batch_ends_.begin() + long(n));
    for (size_t &e : batch_ends_)
      e -= count;
    for (std::function<std::string()> &f : work) {
      if (capturing_) {
        Node n;
        n.kind = Node::Call;
        n.call = std::move(f);
        recording_.push_back(std::move(n));
      } else if (std::string e = f(); !e.empty()) {
        return e;
      }
    }
    return "";
  }
  // Collectives issued to the side stream; joins; joins that left younger
  // batches running.
  int sideCalls = 0, joins = 0, partialJoins = 0;

  std::string allocate(uint64_t bytes, uint64_t *base) override {
    if (capturing_)
      return "allocate while capturing a graph";
    if (bytes > memory_limit)
      return "cannot allocate " + std::to_string(bytes) + " bytes on the emulated GPU (" +
             std::to_string(memory_limit) + " bytes): out of memory";
    allocated += bytes;
    blocks_.emplace_back(bytes + 256, 0xFF); // poisoned: NaN floats until written
    uint64_t p = reinterpret_cast<uint64_t>(blocks_.back().data());
    *base = (p + 255) / 256 * 256;
    return "";
  }
  std::string to_device(uint64_t dst, const void *src, uint64_t bytes) override {
    if (capturing_)
      return "a host-to-device copy while capturing a graph";
    if (!side_queue_.empty())
      return "a host-to-device copy while the side stream has work not joined";
    std::memcpy(reinterpret_cast<void *>(dst), src, bytes);
    return "";
  }
  std::string to_host(void *dst, uint64_t src, uint64_t bytes) override {
    if (capturing_)
      return "a device-to-host copy while capturing a graph";
    if (!side_queue_.empty())
      return "a device-to-host copy while the side stream has work not joined";
    std::memcpy(dst, reinterpret_cast<const void *>(src), bytes);
    return "";
  }
  std::string copy(uint64_t dst, uint64_t src, uint64_t bytes) override {
    if (side_)
      return "a copy on the side stream, which runs collectives only";
    if (capturing_)
      return "a device-to-device copy of counts the host read, while capturing a graph";
    ++copies;
    std::memmove(reinterpret_cast<void *>(dst), reinterpret_cast<const void *>(src), bytes);
    return "";
  }
  int copies = 0;
  std::string fill(uint64_t dst, uint8_t byte, uint64_t bytes) override {
    if (side_)
      return "a fill on the side stream, which runs collectives only";
    if (capturing_) {
      Node n;
      n.kind = Node::Fill;
      n.ptr[0] = dst;
      n.ptr[1] = byte;
      n.ptr[2] = bytes;
      recording_.push_back(n);
      return "";
    }
    std::memset(reinterpret_cast<void *>(dst), byte, bytes);
    return "";
  }
  std::string load_kernel(uint32_t index, const pl::Kernel &k) override {
    std::lock_guard<std::mutex> lock(emulationMutex());
    if (capturing_)
      return "a kernel load while capturing a graph";
    // The launch limits of every GPU mt runs on (launch_limits.h), as the
    // CUDA executor checks its own GPU's at load.
    const unsigned kg[3] = {k.grid()->Get(0), k.grid()->Get(1), k.grid()->Get(2)};
    const unsigned kb[3] = {k.block()->Get(0), k.block()->Get(1), k.block()->Get(2)};
    if (std::string e = mt::cu::check_launch(k.entry()->str(), kg, kb, k.shared_bytes());
        !e.empty())
      return e;
    const std::string key = k.entry()->str() + '\n' + k.cuda_source()->str();
    auto it = compiled_.find(key);
    if (it == compiled_.end()) {
      std::string error;
      auto hk = mt::emu::HostKernel::compile(k.cuda_source()->str(), k.entry()->str(), &error);
      if (!hk)
        return "kernel '" + k.entry()->str() + "': " + error;
      it = compiled_.emplace(key, std::move(hk)).first;
    }
    kernels_[index] = it->second.get();
    return "";
  }
  std::string launch(uint32_t index, const pl::Kernel &k, void **params,
                     uint32_t count) override {
    if (side_)
      return "a kernel launch on the side stream, which runs collectives only";
    if (capturing_) {
      Node n;
      n.kind = Node::Launch;
      n.index = index;
      n.kernel = &k;
      for (uint32_t i = 0; i < count; ++i) // the values, as cuLaunchKernel copies them
        n.args.push_back(*static_cast<const uint64_t *>(params[i]));
      recording_.push_back(std::move(n));
      return "";
    }
    const unsigned grid[3] = {k.grid()->Get(0), k.grid()->Get(1), k.grid()->Get(2)};
    const unsigned block[3] = {k.block()->Get(0), k.block()->Get(1), k.block()->Get(2)};
    ++launches;
    std::lock_guard<std::mutex> lock(emulationMutex());
    return kernels_.at(index)->launch(grid, block, k.shared_bytes(), params);
  }
  // plan.fbs Gemm, column-major, in double. The bias gradients, as cuBLASLt
  // defines them: DGELU_BGRAD sums each row of D's epilogue values before
  // they are rounded to D's type; BGRADB sums each column of op(B) (the
  // stored B values) over k. Both overwrite the bias output.
  std::string gemm(const pl::Gemm &g, const uint64_t *ptr) override {
    if (side_)
      return "a GEMM on the side stream, which runs collectives only";
    if (capturing_) {
      Node n;
      n.kind = Node::Gemm;
      n.gemm = &g;
      std::copy(ptr, ptr + 5, n.ptr);
      recording_.push_back(n);
      return "";
    }
    ++gemms;
    const void *a = reinterpret_cast<const void *>(ptr[0]);
    const void *b = reinterpret_cast<const void *>(ptr[1]);
    void *d = reinterpret_cast<void *>(ptr[2]);
    void *bias = reinterpret_cast<void *>(ptr[3]);
    void *aux = reinterpret_cast<void *>(ptr[4]);
    const pl::GemmEpilogue e = g.epilogue();
    const bool addBias = e == pl::GemmEpilogue::BIAS || e == pl::GemmEpilogue::GELU_AUX_BIAS ||
                         e == pl::GemmEpilogue::GELU_BIAS;
    const bool dgelu = e == pl::GemmEpilogue::DGELU || e == pl::GemmEpilogue::DGELU_BGRAD;
    std::vector<double> rowSums(e == pl::GemmEpilogue::DGELU_BGRAD ? size_t(g.m()) : 0, 0.0);
    auto bAt = [&](int64_t l, int64_t j) { // op(B)[l, j]
      return double(load(b, g.b_type(), g.trans_b() ? j + l * g.ldb() : l + j * g.ldb()));
    };
    for (int64_t j = 0; j < g.n(); ++j)
      for (int64_t i = 0; i < g.m(); ++i) {
        double acc = 0;
        for (int64_t l = 0; l < g.k(); ++l) {
          const int64_t ai = g.trans_a() ? l + i * g.lda() : i + l * g.lda();
          acc += double(load(a, g.a_type(), ai)) * bAt(l, j);
        }
        const int64_t di = i + j * g.ldd();
        if (g.accumulate())
          acc += double(load(d, g.d_type(), di));
        if (addBias)
          acc += double(load(bias, g.bias_type(), i));
        if (e == pl::GemmEpilogue::GELU_AUX_BIAS)
          store(aux, g.d_type(), di, float(acc));
        if (e == pl::GemmEpilogue::GELU_AUX_BIAS || e == pl::GemmEpilogue::GELU_BIAS)
          acc = gelu_tanh(acc);
        if (dgelu)
          acc *= gelu_tanh_grad(double(load(aux, g.d_type(), di)));
        if (!rowSums.empty())
          rowSums[size_t(i)] += acc;
        store(d, g.d_type(), di, g.d_type() == pl::DType::F64 ? acc : double(float(acc)));
      }
    for (size_t i = 0; i < rowSums.size(); ++i)
      store(bias, g.bias_type(), int64_t(i), float(rowSums[i]));
    if (e == pl::GemmEpilogue::BGRADB)
      for (int64_t j = 0; j < g.n(); ++j) {
        double sum = 0;
        for (int64_t l = 0; l < g.k(); ++l)
          sum += bAt(l, j);
        store(bias, g.bias_type(), j, float(sum));
      }
    return "";
  }
  std::string synchronize() override {
    if (!side_queue_.empty())
      return "synchronize while the side stream has work not joined";
    return capturing_ ? "synchronize while capturing a graph" : "";
  }

  std::string begin_capture() override {
    if (capturing_)
      return "a capture is already under way";
    capturing_ = true;
    recording_.clear();
    return "";
  }
  std::string end_capture(uint64_t *graph) override {
    *graph = 0;
    if (!capturing_)
      return "no capture under way";
    capturing_ = false;
    if (!side_queue_.empty())
      return "the capture ended with the side stream not joined";
    graphs_[++lastGraph_] = std::move(recording_);
    recording_.clear();
    *graph = lastGraph_;
    ++captures;
    return "";
  }
  std::string launch_graph(uint64_t graph) override {
    auto it = graphs_.find(graph);
    if (capturing_ || it == graphs_.end())
      return capturing_ ? "a graph launch while capturing" : "no such graph";
    ++graphLaunches;
    for (const Node &n : it->second) {
      std::string e;
      if (n.kind == Node::Launch) {
        std::vector<uint64_t> values = n.args; // the recorded values, never the caller's
        std::vector<void *> params(values.size());
        for (size_t i = 0; i < values.size(); ++i)
          params[i] = &values[i];
        e = launch(n.index, *n.kernel, params.data(), uint32_t(params.size()));
      } else if (n.kind == Node::Gemm) {
        e = gemm(*n.gemm, n.ptr);
      } else if (n.kind == Node::Call) {
        e = n.call();
      } else {
        e = fill(n.ptr[0], uint8_t(n.ptr[1]), n.ptr[2]);
      }
      if (!e.empty())
        return e;
    }
    return "";
  }
  void destroy_graph(uint64_t graph) override { graphs_.erase(graph); }

  // Executed work (graph replays included), captures and graph launches.
  int launches = 0, gemms = 0, captures = 0, graphLaunches = 0;
  size_t liveGraphs() const { return graphs_.size(); }

private:
  struct Node {
    enum Kind { Launch, Gemm, Fill, Call } kind = Launch;
    std::function<std::string()> call; // a collective (EmulatedComm)
    uint32_t index = 0;
    const pl::Kernel *kernel = nullptr;
    std::vector<uint64_t> args;
    const pl::Gemm *gemm = nullptr;
    uint64_t ptr[5] = {0, 0, 0, 0, 0}; // GEMM pointers; a fill's dst, byte, bytes
  };
  bool capturing_ = false, side_ = false;
  mutable std::mutex events_mu_;
  std::map<uint64_t, bool> events_; // passed or not
  uint64_t lastEvent_ = 0;
  std::vector<std::function<std::string()>> side_queue_;
  std::vector<size_t> batch_ends_; // side_queue_'s size at each batch's end_side
  std::vector<Node> recording_;
  std::map<uint64_t, std::vector<Node>> graphs_;
  uint64_t lastGraph_ = 0;

  std::vector<std::vector<uint8_t>> blocks_;
  std::map<std::string, std::unique_ptr<mt::emu::HostKernel>> compiled_;
  std::map<uint32_t, const mt::emu::HostKernel *> kernels_;
};

// A small GPT whose heads are 64 wide (flash attention's smallest), with
// every feature of a Megatron GPT layer: biases, GeLU, dropout everywhere.
// `kernels`: mtc compile's kernel choices (--flash-backward).
inline std::unique_ptr<mt::rt::PlanFile> compilePlan(const std::vector<mt::spec::Override> &extra,
                                                     const mt::GpuKernelOptions &kernels = {}) {
  std::vector<mt::spec::Override> overrides = {
      {"model.num_layers=2"},       {"model.hidden_size=128"},
      {"model.num_attention_heads=2"}, {"model.seq_length=64"},
      {"model.vocab_size=500"},     {"model.make_vocab_size_divisible_by=128"},
      {"training.micro_batch_size=2"}};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  absl::StatusOr<mt::spec::Spec> spec =
      mt::spec::parseSpecFile(std::string(MT_SOURCE_DIR) + "/models/tiny.toml", overrides);
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  if (!spec.ok())
    return nullptr;
  mlir::MLIRContext context;
  context.loadDialect<mt::MtDialect, mlir::func::FuncDialect>();
  mlir::OwningOpRef<mlir::ModuleOp> module = mt::importSpec(context, *spec);
  mlir::PassManager pm(&context);
  mt::buildTrainPipeline(pm);
  EXPECT_TRUE(mlir::succeeded(pm.run(*module)));
  mlir::FailureOr<std::string> payload = mt::buildPlanPayload(*module, *spec, kernels);
  EXPECT_TRUE(mlir::succeeded(payload));
  if (mlir::failed(payload))
    return nullptr;
  std::string error;
  auto file = mt::rt::PlanFile::from_bytes(
      mt::rt::wrap_plan_payload(reinterpret_cast<const uint8_t *>(payload->data()),
                                payload->size()),
      "gpu.plan", &error);
  EXPECT_TRUE(file) << error;
  return file;
}

inline uint32_t inputNamed(const pl::Program &p, const std::string &name) {
  for (uint32_t i = 0; i < p.inputs()->size(); ++i)
    if (p.input_names()->Get(i)->str() == name)
      return p.inputs()->Get(i);
  return UINT32_MAX;
}

// Fills a program's inputs the way the training loop does.
inline void fillInputs(mt::rt::Executor &ex, const pl::Program &p, int64_t vocab, uint64_t seed,
                int64_t step, float gradNorm, float gradScale = 1.0f) {
  std::mt19937_64 rng(seed);
  for (uint32_t i = 0; i < p.inputs()->size(); ++i) {
    const std::string name = p.input_names()->Get(i)->str();
    const pl::Value &v = *p.values()->Get(p.inputs()->Get(i));
    const int64_t n = mt::rt::element_count(v);
    void *data = ex.value_data(p, p.inputs()->Get(i));
    ASSERT_NE(data, nullptr) << name;
    // "tokens", or "tokens.3" (a pipeline stage's micro-batch 3).
    if (name.rfind("tokens", 0) == 0 || name.rfind("labels", 0) == 0) {
      for (int64_t k = 0; k < n; ++k)
        static_cast<int32_t *>(data)[k] = int32_t(rng() % uint64_t(vocab));
    } else if (name == "steps") {
      *static_cast<int64_t *>(data) = step - 1;
    } else if (name == "step") {
      *static_cast<int64_t *>(data) = step;
    } else if (name == "grad_norm") {
      *static_cast<float *>(data) = gradNorm;
    } else if (name == "grad_scale") {
      *static_cast<float *>(data) = gradScale;
    } else {
      FAIL() << "unexpected program input '" << name << "'";
    }
  }
}

inline float output(mt::rt::Executor &ex, const pl::Program &p) {
  return *static_cast<float *>(ex.value_data(p, p.outputs()->Get(0)));
}

// Relative difference of two arrays against the larger magnitude.
inline double relDiff(const float *a, const float *b, int64_t n) {
  double diff = 0, mag = 1e-30;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i]))
      return INFINITY; // NaN where the other has a number
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    mag = std::max(mag, std::fabs(double(b[i])));
  }
  return diff / mag;
}

// Where a gradient is above 1e-3 of its parameter's largest: AdamW moves
// every element by about lr whatever its gradient's size, so where a
// gradient is rounding noise (the key bias's is exactly zero in exact
// arithmetic: softmax ignores a constant per row) two runs that round
// differently may update in opposite directions. Weights are compared
// there only.
inline std::vector<char> significant(const float *grad, int64_t n) {
  float top = 0;
  for (int64_t k = 0; k < n; ++k)
    top = std::max(top, std::fabs(grad[k]));
  std::vector<char> mask;
  for (int64_t k = 0; k < n; ++k)
    mask.push_back(std::fabs(grad[k]) > 1e-3f * top);
  return mask;
}

} // namespace mt::emu

#endif // MT_TEST_UNIT_EMULATEDGPUDEVICE_H
