// What the training loop asks of an executor, whichever device runs the
// plan: the CPU reference (cpu_executor.h) or the GPU (gpu_executor.h).
//
// Program inputs and outputs go through host memory: value_data() is a host
// buffer in the CPU layout of that value (cpu_executor.h: f32/i32/i64
// values, which is what programs take and give), written before run() and
// read after it. Parameter state is seen through host views (weight(),
// master(), ...), floats as on the CPU; a device executor fills them in
// state_to_host() and copies them back in state_to_device(), the CPU
// executor's views are its state itself.
#ifndef MT_RUNTIME_EXECUTOR_H
#define MT_RUNTIME_EXECUTOR_H

#include "plan_generated.h"
#include "runtime/comm/parallel_groups.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mt::rt {

class Executor {
public:
  virtual ~Executor() = default;

  // Weights from each Param's init (cpu_executor.h), master copies, zero
  // gradients and moments. "" or one error line.
  virtual std::string init_params(uint64_t seed) = 0;
  // A fresh optimizer for the weights the host views hold (a checkpoint
  // loaded without its optimizer state: Megatron's reload_model_params):
  // the master copies, the distributed optimizer's owned shards included,
  // copied from the weights; gradients and moments zero. Host views only:
  // the caller moves them to the device (state_to_device). "" or one error
  // line.
  virtual std::string reset_optimizer_state() = 0;

  // Host views of a parameter's buffers (null when the rank does not hold
  // that buffer) and of the distributed optimizer's shard state. exp_avg is
  // Adam's first moment or SGD's momentum buffer; SGD has no exp_avg_sq.
  virtual float *weight(int param) = 0;
  virtual float *master(int param) = 0;
  virtual float *exp_avg(int param) = 0;
  virtual float *exp_avg_sq(int param) = 0;
  virtual int64_t param_elements(int param) const = 0;
  virtual float *shard_master() = 0;
  virtual float *shard_exp_avg() = 0;
  virtual float *shard_exp_avg_sq() = 0;
  virtual int64_t shard_elements() const = 0;
  // Device state -> host views (before a checkpoint is written), and host
  // views -> device state (after one is read). "" or one error line.
  virtual std::string state_to_host() { return ""; }
  virtual std::string state_to_device() { return ""; }

  // Why the rank's programs cannot run, or "": the executors run a compact
  // pipelined train_step expanded (runtime/plan/pipeline_expand.h), once,
  // when they are made, and keep the expansion as long as they live.
  virtual std::string load_error() const = 0;

  virtual void *value_data(const mt::plan::Program &program, uint32_t value) = 0;
  // The program `name` as this executor runs it (a pipelined train_step
  // expanded), or null.
  virtual const mt::plan::Program *program(const std::string &name) const = 0;
  // `name` for a step of `micro_batches` micro-batches: program(name) unless
  // it is a pipelined step planned for another count, which is expanded for
  // that count (a batch-size ramp-up's smaller steps) and replaces the
  // previous such expansion. Null and *error when the plan cannot run it.
  virtual const mt::plan::Program *program_for_micro_batches(const std::string &name,
                                                             int64_t micro_batches,
                                                             std::string *error) = 0;
  // Runs one program; "" or one error line naming the instruction.
  virtual std::string run(const mt::plan::Program &program, uint64_t rng_offset) = 0;

  virtual void set_seed(uint64_t seed) = 0;
  virtual void set_micro_batch_rng_offsets(std::vector<uint64_t> offsets) = 0;
  // GRAD_SEED multiplies its scale by this (fp16 dynamic loss scaling).
  virtual void set_loss_scale(float scale) = 0;
  virtual void zero_grads() = 0;
  virtual void set_check_memory_plan(bool on) = 0;
  virtual void set_groups(const ParallelGroups *groups) = 0;

  // The training log's figures of this rank (log_stats.h says which
  // elements count; the training loop sums them over the ranks). "" or one
  // error line.
  // Sum of squares of the parameters: the f32 masters with bf16, the
  // weights (as rounded to their type) otherwise.
  virtual std::string params_sum_squares(double *out) = 0;
  // Over the counted gradient elements: how many are zero after unscaling
  // and clipping (count_zeros_fp32), and how many are NaN or infinite.
  struct GradStats {
    int64_t zeros = 0, nans = 0, infs = 0;
  };
  virtual std::string grad_stats(float unscale, float clip, GradStats *out) = 0;

  // Memory the rank holds, in bytes (Megatron's report_memory figures, from
  // mt's own buffers): `allocated` holds what lives between iterations (the
  // state buffer: weights, gradients, masters, moments), `max_allocated`
  // adds the activation arena at its planned peak and the workspaces,
  // `reserved` is everything allocated (mt allocates once, so max_reserved
  // is the same), `allocations` how many allocations that took.
  struct MemoryStats {
    uint64_t allocated = 0, max_allocated = 0, reserved = 0, max_reserved = 0,
             allocations = 0;
  };
  virtual MemoryStats memory_stats() const = 0;
};

} // namespace mt::rt

#endif // MT_RUNTIME_EXECUTOR_H
