// struct CpuExecutor::Impl and the types its files share; internal to runtime/exec.
#ifndef MT_RUNTIME_CPU_EXECUTOR_IMPL_H
#define MT_RUNTIME_CPU_EXECUTOR_IMPL_H

#include "runtime/exec/cpu_executor.h"
#include "runtime/exec/cpu_kernels_moe.h"

#include "runtime/plan/grad_buckets.h"
#include "runtime/plan/pipeline_expand.h"
#include "runtime/plan/plan_reader.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mt::rt {

namespace pl = mt::plan;

namespace cpu_exec_detail {

using Values = flatbuffers::Vector<flatbuffers::Offset<pl::Value>>;

template <class T> size_t vsize(const flatbuffers::Vector<T> *v) { return v ? v->size() : 0; }

inline bool is_half(pl::DType d) { return d == pl::DType::BF16 || d == pl::DType::F16; }

// Bytes per element in the CPU layout: every float type is held as f32.
inline size_t cpu_element_bytes(pl::DType d) { return is_float_dtype(d) ? 4 : element_bytes(d); }

// A 64-byte-aligned, zero-filled allocation. One the machine cannot give is
// not fatal: failed() says so and the executor reports it (load_error).
class Buffer {
public:
  explicit Buffer(uint64_t bytes, const char *what) : size_(bytes), what_(what) {
    if (bytes == 0)
      return;
    // The plan reader caps every buffer far below this; the rounding cannot wrap.
    if (bytes > (uint64_t(1) << 62))
      return;
    uint64_t rounded = (bytes + 63) / 64 * 64;
    data_ = static_cast<uint8_t *>(std::aligned_alloc(64, rounded));
    if (data_)
      std::memset(data_, 0, rounded);
  }
  bool failed() const { return size_ > 0 && !data_; }
  const char *what() const { return what_; }
  ~Buffer() { std::free(data_); }
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;
  uint8_t *data() const { return data_; }
  uint64_t size() const { return size_; }

private:
  uint8_t *data_ = nullptr;
  uint64_t size_ = 0;
  const char *what_;
};

// Values of one instruction stream and where their bytes are on the CPU.
struct Frame {
  const Values *values = nullptr;
  std::vector<uint8_t *> ptr;
  const pl::Value &value(uint32_t v) const { return *values->Get(v); }
};

// Which value last wrote each arena byte (plan address space), as disjoint
// intervals keyed by their first byte.
class OwnerMap {
public:
  struct Owner {
    uint64_t end;
    uint32_t value, root;
    int64_t instruction; // -1: a program input, written before run()
  };
  void clear() { map_.clear(); }
  void assign(uint64_t begin, uint64_t end, Owner o);
  // The first part of [begin, end) not owned by `root`: its owner, or null
  // with *unwritten set when no value owns that byte.
  const Owner *foreign(uint64_t begin, uint64_t end, uint32_t root, bool *unwritten) const;

private:
  std::map<uint64_t, Owner> map_;
};

// LR_SCHEDULE's ints and floats (plan.fbs).
struct LrSchedule {
  pl::LrStyle style;
  int64_t warmup, decay, samples_per_step;
  pl::WsdStyle wsd_style;
  int64_t wsd_decay;
  double max_lr, min_lr;
};

LrSchedule lr_schedule_of(const pl::Instruction &ins);

// Megatron-LM's OptimizerParamScheduler.get_lr (init_lr 0) at `steps`
// optimizer steps taken; see cpu_executor.h for the convention. Megatron
// counts samples (`samples_per_step` a step): only inverse-square-root's
// clamps to 1 see them, every other style depends on ratios of steps.
double megatron_lr(const LrSchedule &s, int64_t steps);

} // namespace cpu_exec_detail

struct CpuExecutor::Impl {
  // Per program: CPU addresses of its values and, for --check-memory-plan,
  // the lifetime of each arena value.
  struct ProgramState {
    const pl::Program *program = nullptr;
    std::string name;
    cpu_exec_detail::Frame frame;
    std::vector<uint32_t> root;              // RESHAPE aliases -> the value owning the bytes
    std::vector<std::vector<uint32_t>> dead; // dead[i]: roots whose last reader is #i - 1
    std::vector<uint32_t> input_roots;
  };

  const pl::Plan &plan;
  const pl::Rank &rank;
  // Some rank holds an expert parameter: the norms have an expert part.
  const bool has_experts = plan_has_experts(plan);
  std::string rank_name;
  uint64_t arena_scale = 1, state_scale = 1;
  cpu_exec_detail::Buffer arena, state, scratch;
  RankPrograms rank_programs; // the programs that run (a pipelined step expanded)
  std::string load_error;
  std::vector<ProgramState> programs;
  std::unordered_map<const pl::Program *, size_t> program_index;
  // The ramp-up's expansion of the pipelined step for a smaller batch
  // (always the last of `programs`), or null.
  const pl::Program *resized = nullptr;
  int64_t resized_micro_batches = 0;
  std::string resized_name;
  void add_program(const pl::Program *prog);
  uint64_t seed = 0;
  float loss_scale = 1.0f;
  const ParallelGroups *groups = nullptr;
  std::vector<uint64_t> micro_rng_offsets;
  std::vector<float> peer_grad; // ALL_REDUCE_TIED_GRAD's incoming copy
  bool check = false;
  cpu_exec_detail::OwnerMap owners;
  std::vector<float> clipped; // ADAMW's grad * clip_coeff
  std::vector<float> exchange; // sequence-parallel gathers and scatters
  std::vector<int64_t> local_row; // vocab-parallel embeddings' rows

  // Data-parallel buckets: every segment of each bucket and those of the
  // shard this rank owns (distributed optimizer), from the plan's layout.
  struct BucketState {
    int64_t begin = 0, end = 0, state_at = 0;
    int ranks = 1;       // its group's size: dp, or expert dp (Bucket.group 6)
    bool expert = false; // an expert bucket (group 6)
    FlatRange shard{0, 0};
    std::vector<FlatSegment> all, own;
  };
  std::vector<BucketState> buckets;
  std::vector<float> packed, gathered, summed; // contiguous staging for collectives
  int dp = 1, dp_rank = 0;

  // This rank's place in its tensor-parallel group, from the plan's table.
  int64_t tp_size() const { return std::max(1, plan.tensor_parallel()); }
  int64_t tp_rank() const { return rank.tp_rank(); }

  const pl::Param &param(uint32_t i) const { return *rank.params()->Get(i); }
  // --grad-reduce-in-bf16: the rank's gradients are bf16 (the verifier
  // gives every parameter of a rank one gradient type).
  bool bf16_grads() const {
    return rank.params() && rank.params()->size() && param(0).grad_dtype() == pl::DType::BF16;
  }

  float *state_floats(int64_t offset) const {
    return offset < 0 ? nullptr
                      : reinterpret_cast<float *>(state.data() + uint64_t(offset) * state_scale);
  }

  // This rank's shard state (distributed optimizer), null when absent.
  float *shard_floats(int64_t offset) const {
    return rank.distributed_optimizer() ? state_floats(offset) : nullptr;
  }
  // The shard state element of flat element `e` of bucket `b`'s shard.
  int64_t shard_index(const BucketState &b, int64_t e) const {
    return b.state_at + (e - b.shard.begin);
  }

  bool in_arena(const cpu_exec_detail::Frame &f, uint32_t v) const {
    return f.value(v).region() == pl::Region::ARENA;
  }

  // Plan-space byte range of an arena value.
  static std::pair<uint64_t, uint64_t> range(const cpu_exec_detail::Frame &f, uint32_t v) {
    const pl::Value &val = f.value(v);
    return {val.offset(), val.offset() + plan_bytes(val)};
  }

  // cpu_executor.cpp: the buffers in the CPU layout, the groups, the program loop.
  Impl(const pl::Plan &p, const pl::Rank &r);
  static uint64_t scale_for_arena(const pl::Plan &plan, const pl::Rank &rank);
  static uint64_t scale_for_state(const pl::Rank &rank);
  static uint64_t max_scratch(const pl::Plan &plan);
  uint8_t *address(const pl::Value &v, uint8_t *base) const;
  Communicator *group(int64_t g, std::string *error) const;
  std::string all_reduce_doubles(Communicator *c, std::vector<double> &v);
  std::string run(const ProgramState &ps, uint64_t rng_offset);
  std::string run_kernel(const pl::Instruction &ins, const cpu_exec_detail::Frame &outer,
                         uint64_t rng_offset);

  // cpu_executor_check.cpp: --check-memory-plan.
  void plan_lifetimes(ProgramState &ps);
  void poison(uint64_t begin, uint64_t end);
  void poison_all_but_inputs(const ProgramState &ps);
  std::string check_before(const ProgramState &ps, const pl::Instruction &ins, size_t i);
  void record_after(const ProgramState &ps, const pl::Instruction &ins, size_t i);

  // cpu_executor_ops.cpp: every instruction, and the tensor-parallel exchanges of some.
  std::string execute(const pl::Instruction &ins, const cpu_exec_detail::Frame &f,
                      uint64_t rng_offset);
  std::string vocab_parallel_stats(const float *logits, const int32_t *labels, int64_t n,
                                   int64_t v, std::vector<float> &max, std::vector<double> &sum,
                                   std::vector<double> *target);
  static void sequence_blocks(const float *src, float *dst, int64_t b, int64_t s_local,
                              int64_t rest, int64_t t, bool to_blocks);

  // cpu_executor_moe.cpp: expert parallelism's token exchange, and the
  // router's counts over tensor-parallel ranks.
  std::string moe_dispatch(const pl::Instruction &ins, const cpu_exec_detail::Frame &f);
  std::string moe_combine(const pl::Instruction &ins, const cpu_exec_detail::Frame &f);
  std::string gather_expert_counts(Communicator *c, const int32_t *tpe, int64_t experts,
                                   int64_t rows, std::vector<int32_t> &all);
  // T: float, or double for f64 logits (moe_router_dtype fp64).
  template <class T>
  std::string router_group_counts(const pl::Instruction &ins, const T *logits,
                                  cpu::MoeRouterConfig &c, std::vector<double> &global);

  // cpu_executor_optimizer.cpp (with lr_schedule_of and megatron_lr): the data-parallel
  // buckets, gradient norms, AdamW.
  void plan_buckets();
  void pack(const std::vector<FlatSegment> &segs, bool weights, int64_t base,
            std::vector<float> &out, int64_t n);
  void unpack(const std::vector<FlatSegment> &segs, bool weights, int64_t base,
              const float *in);
  std::string reduce_grads(const pl::Instruction &ins);
  std::string sum_in_bf16(Communicator *c, float *data, int64_t n, float scale);
  std::string all_gather_params(const pl::Instruction &ins);
  bool counts_in_norm(uint32_t p) const;
  std::string grad_norm(float *out);
  std::string model_norm(double dense, double expert, float *out);
  std::string sharded_grad_norm(const pl::Instruction &ins, float *out);
  std::string adamw(const pl::Instruction &ins, float lr, float clip, int64_t step);
  std::string sgd(const pl::Instruction &ins, float lr, float clip);
  std::string sharded_sgd(const pl::Instruction &ins, float lr, float clip, float decoupled_lr);
  std::string sharded_adamw(const pl::Instruction &ins, float lr, float clip, int64_t step,
                            float decoupled_lr);
  static void round_weights(const pl::Param &p, float *w);
};

} // namespace mt::rt

#endif // MT_RUNTIME_CPU_EXECUTOR_IMPL_H
