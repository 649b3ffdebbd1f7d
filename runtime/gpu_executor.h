// The GPU executor: runs one rank's programs by their instructions' GPU
// steps (plan.fbs GpuStep) on a GpuDevice. It makes no decision of its own:
// kernels, launch geometry, arguments, GEMM descriptors and collectives all
// come from the plan.
//
// Memory. One device allocation holds, in order, the state buffer
// (state_bytes: weights in their dtype, f32 gradients, masters, moments, at
// the plan's offsets), the activation arena (arena_bytes), the kernel
// workspace (kernel_workspace_bytes) and the device scalars
// (gpu_scalar_bytes, plan_reader.h: 256 bytes unless a pipeline schedule
// has more than 29 micro-batches): the loss scale (an f32, read by
// GRAD_SEED's kernel), the seed, the program's RNG offset and one RNG offset
// per micro-batch (u64 each; SEED and RNG_OFFSET arguments point at them).
// That is exactly what `mtc` printed, plus the stated cuBLASLt workspace the
// device allocates itself.
//
// CUDA graphs. Everything a step varies (inputs, the loss scale, the seed,
// the RNG offsets) is in device memory at fixed addresses and every
// argument is an address or a constant of the plan, so a program's steps
// can be captured once and replayed. A program's first run is eager
// (kernels load, cuBLASLt chooses its algorithms), its second is captured
// into a graph and launched, later runs launch the graph. Host copies (the
// scalars, inputs, outputs) stay outside the graph, around the launch.
// set_cuda_graphs(false) keeps every run eager (mtrun --no-cuda-graph).
//
// Host side. Program inputs and outputs are staged in host buffers
// (value_data), uploaded before run() and downloaded after it; they are
// f32, i32 and i64 values, so host and device bytes are the same.
// Parameter state has host views of floats (executor.h), filled by
// state_to_host() and written back by state_to_device(), converting 16-bit
// weights.
//
// Collectives. ALL_REDUCE steps over a group of one rank do nothing; NATIVE
// steps (tensor, pipeline and data parallelism over NCCL) are not built yet,
// so plans of several ranks are refused at open().
#ifndef MT_RUNTIME_GPU_EXECUTOR_H
#define MT_RUNTIME_GPU_EXECUTOR_H

#include "runtime/executor.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mt::rt {

// What the executor needs from a device. Addresses are device addresses as
// integers. Every call returns "" or one error line.
class GpuDevice {
public:
  virtual ~GpuDevice() = default;
  virtual std::string allocate(uint64_t bytes, uint64_t *base) = 0;
  virtual std::string to_device(uint64_t dst, const void *src, uint64_t bytes) = 0;
  virtual std::string to_host(void *dst, uint64_t src, uint64_t bytes) = 0;
  virtual std::string fill(uint64_t dst, uint8_t byte, uint64_t bytes) = 0;
  // Compiles (or finds in a cache) and loads plan kernel `index`.
  virtual std::string load_kernel(uint32_t index, const mt::plan::Kernel &kernel) = 0;
  // cuLaunchKernel's convention: params[i] points at argument i's value
  // (`count` of them, 8 bytes each).
  virtual std::string launch(uint32_t index, const mt::plan::Kernel &kernel, void **params,
                             uint32_t count) = 0;
  // ptr: A, B, D, then the epilogue's bias and aux (plan.fbs Gemm).
  virtual std::string gemm(const mt::plan::Gemm &g, const uint64_t *ptr) = 0;
  virtual std::string synchronize() = 0;
  // CUDA graphs. Between begin_capture and end_capture, launch and gemm
  // record their work with the argument values they were given, running
  // nothing; end_capture makes the record an executable graph (*graph, not
  // 0). launch_graph runs it again, as recorded, in stream order.
  virtual std::string begin_capture() = 0;
  virtual std::string end_capture(uint64_t *graph) = 0;
  virtual std::string launch_graph(uint64_t graph) = 0;
  virtual void destroy_graph(uint64_t graph) = 0;
};

class GpuExecutor : public Executor {
public:
  // The plan must have been verified by PlanFile and outlive the executor.
  GpuExecutor(const mt::plan::Plan &plan, int rank, std::unique_ptr<GpuDevice> device);
  ~GpuExecutor() override;

  // Checks that every instruction has a GPU form, allocates device memory
  // and loads every kernel. "" or one error line naming what is missing.
  std::string open();

  std::string init_params(uint64_t seed) override;
  float *weight(int param) override;
  float *master(int param) override;
  float *exp_avg(int param) override;
  float *exp_avg_sq(int param) override;
  float *grad(int param); // host view, current after state_to_host()
  int64_t param_elements(int param) const override;
  float *shard_master() override { return nullptr; }
  float *shard_exp_avg() override { return nullptr; }
  float *shard_exp_avg_sq() override { return nullptr; }
  int64_t shard_elements() const override { return 0; }
  std::string state_to_host() override;
  std::string state_to_device() override;

  void *value_data(const mt::plan::Program &program, uint32_t value) override;
  const mt::plan::Program *program(const std::string &name) const override;
  std::string run(const mt::plan::Program &program, uint64_t rng_offset) override;

  void set_seed(uint64_t seed) override { seed_ = seed; }
  void set_micro_batch_rng_offsets(std::vector<uint64_t> offsets) override {
    micro_offsets_ = std::move(offsets);
  }
  void set_loss_scale(float scale) override;
  void zero_grads() override;
  void set_check_memory_plan(bool) override {}
  void set_groups(const ParallelGroups *groups) override { groups_ = groups; }

  // Whether steady-state runs replay a captured CUDA graph (default on).
  void set_cuda_graphs(bool on);
  // Runs that launched a captured graph (tests).
  int64_t graph_launches() const { return graph_launches_; }

  // Device addresses (tests).
  uint64_t state_base() const { return base_; }
  uint64_t arena_base() const { return base_ + rank_.state_bytes(); }

private:
  struct HostState; // host views of every parameter
  std::string step(const mt::plan::Program &program, const mt::plan::Instruction &ins,
                   const mt::plan::GpuStep &s);
  uint64_t address(const mt::plan::Program &program, const mt::plan::GpuArg &a) const;
  std::string staged(const mt::plan::Program &program, bool upload);
  std::string write_scalars(uint64_t rng_offset);
  std::string run_steps(const mt::plan::Program &program);
  uint64_t rng_offset_at(int32_t micro_batch) const;
  void drop_graphs();

  const mt::plan::Plan &plan_;
  const mt::plan::Rank &rank_;
  std::unique_ptr<GpuDevice> device_;
  const ParallelGroups *groups_ = nullptr;
  uint64_t base_ = 0, workspace_ = 0, loss_scale_at_ = 0, seed_at_ = 0;
  uint64_t seed_ = 0;
  std::vector<uint64_t> micro_offsets_;
  uint64_t micro_slots_ = 0; // RNG offset slots after the program's
  // Per program: runs so far and its captured graph (0: none yet).
  struct Graph {
    int64_t runs = 0;
    uint64_t handle = 0;
  };
  std::map<const mt::plan::Program *, Graph> graphs_;
  bool use_graphs_ = true;
  int64_t graph_launches_ = 0;
  std::unique_ptr<HostState> host_;
  std::string pending_error_; // from calls that cannot return one (zero_grads)
};

} // namespace mt::rt

#endif // MT_RUNTIME_GPU_EXECUTOR_H
