// The CPU reference executor: runs one rank's programs of a verified plan,
// instruction by instruction, over the kernels of cpu_kernels.h.
//
// Storage. Every float value (F32, BF16, F16) is held as 4-byte floats; a
// BF16/F16 result is rounded to its type after it is computed in f32
// (cpu::round_to_bf16 / round_to_fp16), so the numbers are those of the
// reduced type while the bytes stay f32. I32 and I64 values keep their
// widths. The plan's offsets are those of the GPU layout, where a BF16 value
// of n elements takes 2n bytes, so the CPU scales the address space:
//   - When any arena value of the rank (or of a kernel's cpu_values) is BF16
//     or F16, the CPU arena is 2 * arena_bytes and the value at plan offset o
//     lives at CPU byte 2 * o. A value of plan size s then owns [2o, 2o + 2s):
//     a 2-byte float needs exactly 2s as floats, F32/I32/I64 need only s. So
//     values that do not overlap in the plan do not overlap on the CPU, and
//     offsets aligned to the element size stay aligned. Otherwise the scale is
//     1 and the CPU arena is exactly arena_bytes.
//   - The state buffer is scaled the same way, by 2 when any parameter of the
//     rank is BF16/F16 (its weights are then floats), else by 1. Gradients,
//     master copies and Adam moments are f32 in the plan already.
//   - A kernel's scratch is cpu_scratch_bytes times the arena's scale.
//
// FUSED. The instruction's ints[0] names a Kernel; its cpu_values are bound
// positionally: cpu_values[0, in.size()) are the instruction's inputs and the
// next out.size() its outputs (their own region and offset are ignored; the
// reader checks dtype and element count against the operands). Every further
// ARENA value is kernel-local scratch at its offset; WEIGHT/GRAD values refer
// to parameters as everywhere else. The kernel's cpu_instructions then run
// in order.
//
// LR_SCHEDULE is Megatron-LM's OptimizerParamScheduler.get_lr with init_lr 0,
// in iteration units (Megatron counts samples, warmup and decay both scaled by
// the global batch size, which gives the same ratios; inverse-square-root's
// clamps to one sample take the batch, samples_per_step). Its `iteration` input
// is the number of optimizer steps already taken: Megatron calls get_lr from
// OptimizerParamScheduler.step() *after* optimizer.step(), so the update
// number k (from 1) uses get_lr(num_steps = k - 1), and the first update of a
// warm-up runs at lr 0. Skipped iterations do not advance it.
//
// Buckets (REDUCE_GRADS, SHARDED_GRAD_NORM, SHARDED_ADAMW, ALL_GATHER_PARAMS).
// The plan's flat buffers are contiguous on the GPU; here a bucket's range is
// copied from the parameters' buffers into one contiguous staging vector
// (padding as zeros), handed to the collective, and copied back, so the
// state buffer's CPU scaling needs no special case. A reduce-scatter leaves
// the rest of the bucket's gradients unreduced, as on the GPU.
//
// CLIP_COEFF is clip_grad_norm_fp32's max_norm / (norm + 1e-6), used only
// when below 1 (so a NaN norm gives 1, as in Megatron); max_norm <= 0 gives 1.
#ifndef MT_RUNTIME_CPU_EXECUTOR_H
#define MT_RUNTIME_CPU_EXECUTOR_H

#include "plan_generated.h"
#include "runtime/comm/collectives.h"
#include "runtime/exec/executor.h"
#include "runtime/comm/parallel_groups.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mt::rt {

// A parameter's initial weights (its Param.init, rounded to its dtype), as
// floats: a shard gets exactly its slice of the whole parameter's values,
// so every layout starts from the one-device weights. tp_size / tp_rank
// split Param.tp_dim (the tensor-parallel ranks, or for an expert parameter
// the expert tensor-parallel ones), ep_size / ep_rank Param.ep_dim; a size
// of 1 leaves that dimension whole.
void initial_weights(const mt::plan::Param &p, int64_t tp_size, int64_t tp_rank, int64_t ep_size,
                     int64_t ep_rank, uint64_t seed, float *w);
// The same with ep_size 1 (a dense plan's parameters).
void initial_weights(const mt::plan::Param &p, int64_t tp_size, int64_t tp_rank, uint64_t seed,
                     float *w);
// A parameter of `rank`: its sizes and ranks from the plan (tensor parallel
// for dense parameters; expert tensor and expert model parallel, by
// expert_coords, for expert ones). Both executors initialise with this.
void initial_weights(const mt::plan::Plan &plan, const mt::plan::Rank &rank,
                     const mt::plan::Param &p, uint64_t seed, float *w);

class CpuExecutor : public Executor {
public:
  // Allocates the rank's arena and state buffer (sizes as described above).
  // `rank` must be in the plan's rank table (see find_rank); the plan must
  // have been verified by PlanFile and outlive the executor.
  CpuExecutor(const mt::plan::Plan &plan, int rank);
  ~CpuExecutor() override;
  CpuExecutor(const CpuExecutor &) = delete;
  CpuExecutor &operator=(const CpuExecutor &) = delete;

  // Initialises weights from each Param's init (zeros, ones, or normal with
  // init_std via cpu::init_normal(seed, stream = the Param's init_stream)), rounded
  // to the parameter's dtype; copies them to the master copies; zeroes
  // gradients and Adam moments.
  std::string init_params(uint64_t seed) override;
  std::string reset_optimizer_state() override;

  // A parameter's buffers, as floats; null when the rank does not hold it.
  float *weight(int param) override;
  float *grad(int param);
  float *master(int param) override;
  float *exp_avg(int param) override;
  float *exp_avg_sq(int param) override;
  int64_t param_elements(int param) const override;

  // The distributed optimizer's state of this rank's shards (plan.fbs
  // Bucket): shard_elements() floats each, bucket b's part at element
  // begin_b / dp; null (and 0 elements) without it. f32 models have no
  // master shard: their weights are updated in place.
  float *shard_master() override;
  float *shard_exp_avg() override;
  float *shard_exp_avg_sq() override;
  int64_t shard_elements() const override;

  // The bytes of a value of `program` in the CPU layout: the caller writes
  // program inputs (i32 token ids, i64 iteration counts, floats) here before
  // every run() (the arena is shared by all programs, and under
  // --check-memory-plan an input is poisoned after its last reader) and reads
  // outputs after it, before running another program.
  void *value_data(const mt::plan::Program &program, uint32_t value) override;
  std::string load_error() const override;
  const mt::plan::Program *program(const std::string &name) const override; // null if absent
  const mt::plan::Program *program_for_micro_batches(const std::string &name,
                                                     int64_t micro_batches,
                                                     std::string *error) override;

  // Runs one program. `rng_offset` is RngKey.offset of every dropout and
  // attention instruction (RngKey.seed is set_seed's, .stream the
  // instruction's). Returns "" or one error line naming the rank, program,
  // instruction index, its `where` and the problem. Non-finite numbers are
  // not errors: they are the training loop's to detect.
  std::string run(const mt::plan::Program &program, uint64_t rng_offset) override;

  void set_seed(uint64_t seed) override;
  // The RNG offset of each micro-batch of an unrolled pipeline step: an
  // instruction with micro_batch m >= 0 uses offsets[m] instead of run()'s.
  void set_micro_batch_rng_offsets(std::vector<uint64_t> offsets) override;
  // GRAD_SEED multiplies its scale by this (fp16 dynamic loss scaling).
  float loss_scale = 1.0f;
  void set_loss_scale(float scale) override { loss_scale = scale; }
  void zero_grads() override;

  // --check-memory-plan. Before each instruction every arena byte that holds
  // no live value is filled with all-ones bytes (a NaN as float, -1 as an
  // integer). A value is live from the instruction that writes it to its
  // last reader; program inputs from the start, outputs to the end; a RESHAPE
  // whose result has its input's offset, and a CROSS_ENTROPY_GRAD written
  // over its logits, share the input's lifetime. An
  // owner map records which value last wrote each arena byte; an instruction
  // that reads a value whose bytes another value has since overwritten fails
  // run() with a line naming both values and instructions. (A result that
  // overlaps its own instruction's operands is rejected by the plan reader.)
  void set_check_memory_plan(bool on) override;

  // This rank's groups (not owned; must outlive run()): collectives name
  // their group by number (plan.fbs), and a plan of several ranks needs them.
  void set_groups(const ParallelGroups *groups) override;

  // The training log's figures (executor.h); the memory figures are the
  // state buffer and the arena, as allocated here (f32, so twice the plan's
  // bytes where it has 16-bit values).
  std::string params_sum_squares(double *out) override;
  std::string grad_stats(float unscale, float clip, GradStats *out) override;
  MemoryStats memory_stats() const override;

  // Bytes allocated for the CPU arena and state buffer.
  uint64_t cpu_arena_bytes() const;
  uint64_t cpu_state_bytes() const;

  struct Impl;

private:
  std::unique_ptr<Impl> impl_;
};

} // namespace mt::rt

#endif // MT_RUNTIME_CPU_EXECUTOR_H
