// plan.bin's semantic verification: every rank, parameter, bucket, program,
// instruction, value and GPU step checked against the schema's rules, so that
// every later index and offset is safe to follow (plan_reader.cpp runs it
// after the FlatBuffers verifier).
#include "runtime/plan/plan_verifier.h"

#include "runtime/base/batch_rampup.h"
#include "runtime/plan/pipeline_expand.h"
#include "runtime/plan/plan_reader.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace mt::rt {

namespace pl = mt::plan;
using detail::grouped;
using detail::vsize;

namespace {

// Dimensions and element counts beyond these are rejected before any
// arithmetic on them can overflow.
constexpr int64_t kMaxElements = int64_t(1) << 48;

// ---------------------------------------------------------------------------
// The operand signature of every opcode, as listed beside it in plan.fbs.
// Operand kinds, one letter per operand:
//   f  a float tensor (F32, BF16 or F16)     i  an I32 tensor (ids, labels)
//   s  an F32 scalar                         l  an I64 scalar
//   a  a value of any dtype but F64         g  a float tensor or an F64 one
// F64 values are the MoE router's logits and their gradient with
// moe_router_dtype fp64: only a `g` operand takes one.
// FUSED takes any number of operands of any kind (in and out are null).
struct OpSignature {
  pl::Opcode op;
  const char *in;
  const char *out;
  int params, ints, floats; // params -1: any number
};

constexpr OpSignature kSignatures[] = {
    {pl::Opcode::POSITION_IDS, "", "i", 0, 0, 0},
    {pl::Opcode::EMBEDDING, "fi", "f", 0, 1, 0},
    {pl::Opcode::LAYER_NORM, "fff", "f", 0, 0, 2},
    {pl::Opcode::RMS_NORM, "ff", "f", 0, 0, 2},
    {pl::Opcode::MATMUL, "ff", "g", 0, 0, 0},
    {pl::Opcode::BIAS_ADD, "ff", "f", 0, 0, 0},
    {pl::Opcode::ADD, "ff", "f", 0, 0, 0},
    {pl::Opcode::GELU, "f", "f", 0, 1, 0},
    {pl::Opcode::SWIGLU, "f", "f", 0, 0, 0},
    {pl::Opcode::DROPOUT, "f", "f", 0, 2, 1},
    {pl::Opcode::RESHAPE, "a", "a", 0, 0, 0},
    {pl::Opcode::SPLIT_QKV, "f", "fff", 0, 0, 0},
    {pl::Opcode::ROPE, "f", "f", 0, 0, 2},
    {pl::Opcode::ATTENTION, "fff", "fF", 0, 3, 2},
    {pl::Opcode::CROSS_ENTROPY, "fi", "s", 0, 1, 0},
    {pl::Opcode::GRAD_SEED, "", "s", 0, 0, 1},
    {pl::Opcode::EMBEDDING_GRAD, "fi", "", 1, 1, 0},
    {pl::Opcode::MATMUL_INPUT_GRAD, "gf", "f", 0, 0, 0},
    {pl::Opcode::MATMUL_WEIGHT_GRAD, "gf", "", 1, 0, 0},
    {pl::Opcode::BIAS_GRAD, "f", "", 1, 0, 0},
    {pl::Opcode::LAYER_NORM_GRAD, "fff", "f", 2, 0, 2},
    {pl::Opcode::RMS_NORM_GRAD, "fff", "f", 1, 0, 2},
    {pl::Opcode::GELU_GRAD, "ff", "f", 0, 1, 0},
    {pl::Opcode::SWIGLU_GRAD, "ff", "f", 0, 0, 0},
    {pl::Opcode::SPLIT_QKV_GRAD, "fff", "f", 0, 0, 0},
    {pl::Opcode::ROPE_GRAD, "f", "f", 0, 0, 2},
    {pl::Opcode::ATTENTION_GRAD, "fffffF", "fff", 0, 3, 2},
    {pl::Opcode::CROSS_ENTROPY_GRAD, "fis", "f", 0, 1, 0},
    {pl::Opcode::GRAD_NORM, "", "s", 0, 0, 0},
    {pl::Opcode::LR_SCHEDULE, "l", "s", 0, 6, 2},
    {pl::Opcode::CLIP_COEFF, "ss", "s", 0, 0, 1},
    {pl::Opcode::ADAMW, "ssl", "", 1, 0, 4},
    {pl::Opcode::FUSED, nullptr, nullptr, 0, 1, 0},
    {pl::Opcode::ALL_REDUCE_GRADS, "", "", -1, 1, 1},
    {pl::Opcode::ALL_REDUCE, "f", "f", 0, 1, 0},
    {pl::Opcode::SEQ_ALL_GATHER, "f", "f", 0, 1, 0},
    {pl::Opcode::SEQ_REDUCE_SCATTER, "f", "f", 0, 1, 0},
    {pl::Opcode::SEQ_SPLIT, "f", "f", 0, 1, 0},
    {pl::Opcode::REDUCE_GRADS, "", "", 0, 3, 1},
    {pl::Opcode::SHARDED_GRAD_NORM, "", "s", 0, 1, 0},
    {pl::Opcode::SHARDED_ADAMW, "ssls", "", 0, 1, 4},
    {pl::Opcode::ALL_GATHER_PARAMS, "", "", 0, 2, 0},
    {pl::Opcode::SEND, "f", "", 0, 2, 0},
    {pl::Opcode::RECV, "", "f", 0, 2, 0},
    {pl::Opcode::ALL_REDUCE_TIED_GRAD, "", "", 1, 2, 0},
    {pl::Opcode::GROUP_GRAD_NORM, "", "s", 0, 1, 0},
    {pl::Opcode::SPLIT_QKV_ROPE, "f", "fff", 0, 0, 2},
    {pl::Opcode::SPLIT_QKV_ROPE_GRAD, "fff", "f", 0, 0, 2},
    {pl::Opcode::SGD, "ss", "", 1, 0, 2},
    {pl::Opcode::SHARDED_SGD, "sss", "", 0, 1, 2},
    {pl::Opcode::MOE_ROUTER, "g", "Fiss", 0, 10, 3},
    {pl::Opcode::MOE_ROUTER_GRAD, "FgFis", "g", 0, 10, 3},
    {pl::Opcode::MOE_PERMUTE, "fi", "fii", 0, 2, 0},
    {pl::Opcode::MOE_PERMUTE_GRAD, "fi", "f", 0, 0, 0},
    {pl::Opcode::GROUPED_MATMUL, "ffi", "f", 0, 0, 0},
    {pl::Opcode::GROUPED_MATMUL_INPUT_GRAD, "ffi", "f", 0, 0, 0},
    {pl::Opcode::GROUPED_MATMUL_WEIGHT_GRAD, "ffi", "", 1, 0, 0},
    {pl::Opcode::MOE_UNPERMUTE, "fFii", "f", 0, 0, 0},
    {pl::Opcode::MOE_UNPERMUTE_GRAD, "ffFii", "fF", 0, 0, 0},
    {pl::Opcode::MOE_DISPATCH, "fi", "fii", 0, 4, 0},
    {pl::Opcode::MOE_COMBINE, "fii", "f", 0, 4, 0},
};
constexpr size_t kNumOpcodes = sizeof(kSignatures) / sizeof(kSignatures[0]);
static_assert(kNumOpcodes == size_t(pl::Opcode::MAX) + 1,
              "every opcode of plan.fbs needs its signature here");

constexpr bool signatures_in_order() {
  for (size_t i = 0; i < kNumOpcodes; ++i)
    if (size_t(kSignatures[i].op) != i)
      return false;
  return true;
}
static_assert(signatures_in_order(), "kSignatures must be in opcode order");

const char *kind_name(char k) {
  switch (k) {
  case 'f': return "a float tensor (f32, bf16 or f16)";
  case 'F': return "an f32 tensor";
  case 'i': return "an i32 tensor";
  case 's': return "an f32 scalar";
  case 'l': return "an i64 scalar";
  case 'g': return "a float tensor (f32, bf16, f16 or f64)";
  case 'a': return "a value of any type but f64";
  default: return "a value";
  }
}

// ---------------------------------------------------------------------------
// Formatting.


// The FlatBuffers verifier aligns vectors only to their 4-byte length; 8-byte
// elements must be 8-aligned to be read in place (an empty vector has none).
template <class T> bool aligned(const flatbuffers::Vector<T> *v) {
  return vsize(v) == 0 || reinterpret_cast<uintptr_t>(v->data()) % alignof(T) == 0;
}


std::string shape_text(const flatbuffers::Vector<int64_t> *shape) {
  std::string s = "[";
  for (size_t i = 0; i < vsize(shape); ++i)
    s += (i ? "," : "") + std::to_string(shape->Get(i));
  return s + "]";
}


// ---------------------------------------------------------------------------
// Semantic checks. Each returns "" or the part of the error line after the
// file name; the caller adds the file name and the remedy.

class Checker {
public:
  explicit Checker(const pl::Plan &plan) : plan_(plan) {}

  std::string check() {
    if (vsize(plan_.ranks()) == 0)
      return "the plan has no ranks";
    if (std::string e = detail::verify_training(plan_); !e.empty())
      return e;
    if (std::string e = check_training(); !e.empty())
      return e;
    std::set<int> seen;
    for (const pl::Rank *rank : *plan_.ranks()) {
      if (!seen.insert(rank->rank()).second)
        return "rank " + std::to_string(rank->rank()) + " appears twice in the rank table";
      if (std::string e = check_rank(*rank); !e.empty())
        return e;
    }
    return detail::verify_loop_io(plan_);
  }

private:
  // The batch sizes the loop divides and multiplies by, and the ramp-up
  // (runtime/base/batch_rampup.h's preconditions).
  std::string check_training() {
    const pl::Training *t = plan_.training();
    if (!t)
      return "";
    const int64_t gbs = t->global_batch_size(), step = t->micro_batch_size() * plan_.data_parallel();
    if (t->micro_batch_size() < 1 || gbs < 1 || step < 1 || gbs % step != 0 ||
        t->num_micro_batches() != gbs / step)
      return "training: global batch " + std::to_string(gbs) + " is not num_micro_batches " +
             std::to_string(t->num_micro_batches()) + " x micro-batch " +
             std::to_string(t->micro_batch_size()) + " x dp " +
             std::to_string(plan_.data_parallel());
    if (t->train_samples() < 0 || t->train_iters() < 0)
      return "training: negative train_iters or train_samples";
    if (t->rampup_start() == 0 && t->rampup_increment() == 0 && t->rampup_samples() == 0)
      return "";
    const int64_t start = t->rampup_start(), incr = t->rampup_increment();
    if (t->train_samples() == 0 || start < 1 || incr < 1 || t->rampup_samples() < 1 ||
        start >= gbs || (gbs - start) % incr != 0)
      return "training: the batch ramp-up [" + std::to_string(start) + ", " +
             std::to_string(incr) + ", " + std::to_string(t->rampup_samples()) +
             "] does not ramp up to global batch " + std::to_string(gbs) +
             " (it needs sample-based training)";
    // The interleaved schedule takes micro-batch counts that are multiples
    // of the stages (Megatron's groups of pipeline_model_parallel_size).
    if (const int64_t stages = interleavedStages(); stages > 0) {
      std::vector<BatchChange> changes;
      rampup_train_iters({start, incr, t->rampup_samples(), gbs}, t->train_samples(), &changes);
      for (const BatchChange &c : changes)
        if (c.batch % step == 0 && (c.batch / step) % stages != 0)
          return "training: the batch ramp-up reaches a global batch of " +
                 std::to_string(c.batch) + " (" + std::to_string(c.batch / step) +
                 " micro-batches), which the interleaved schedule of " +
                 std::to_string(stages) + " stages cannot run (it needs a multiple of " +
                 std::to_string(stages) + ")";
    }
    return "";
  }

  // The stages of the interleaved schedule a rank runs, or 0 (1F1B, or no
  // pipeline).
  int64_t interleavedStages() const {
    if (!plan_.ranks())
      return 0;
    for (const pl::Rank *rank : *plan_.ranks())
      for (size_t p = 0; p < vsize(rank->programs()); ++p)
        if (const auto *ps = rank->programs()->Get(uint32_t(p))->pipeline(); ps && ps->chunks() > 1)
          return ps->stages();
    return 0;
  }

  // Where the instructions being checked live and what their values mean.
  struct Scope {
    std::string name;  // "rank 0, program train_step" / "rank 0, kernel k (...)"
    const flatbuffers::Vector<flatbuffers::Offset<pl::Value>> *values = nullptr;
    uint64_t arena_limit = 0;   // arena_bytes, or a kernel's cpu_scratch_bytes
    size_t bound_in = 0;        // kernel values bound to the FUSED inputs
    size_t bound_out = 0;       // ... and outputs, after the inputs
    bool kernel = false;
    bool pipelined = false;     // a compact train_step (Program.pipeline)
    size_t num_values() const { return vsize(values); }
    const pl::Value *value(uint32_t i) const { return values->Get(i); }
    bool bound(size_t i) const { return kernel && i < bound_in + bound_out; }
  };

  std::string check_rank(const pl::Rank &rank) {
    rank_ = &rank;
    shards_.clear();
    rank_name_ = "rank " + std::to_string(rank.rank());
    if (std::string e = check_params(rank); !e.empty())
      return e;
    if (std::string e = check_buckets(rank); !e.empty())
      return e;
    std::set<std::string> names;
    for (size_t p = 0; p < vsize(rank.programs()); ++p) {
      const pl::Program *prog = rank.programs()->Get(p);
      std::string name = prog->name() ? prog->name()->str() : "";
      if (name.empty())
        return rank_name_ + ": program " + std::to_string(p) + " has no name";
      if (!names.insert(name).second)
        return rank_name_ + ": two programs are named '" + name + "'";
      if (std::string e = check_program(*prog, name); !e.empty())
        return e;
    }
    return "";
  }

  uint64_t param_numel(const pl::Param &p) const { return uint64_t(element_count(p.shape())); }

  std::string check_params(const pl::Rank &rank) {
    struct Range {
      uint64_t begin, end;
      size_t param;
      const char *what;
    };
    std::vector<Range> ranges;
    const uint64_t state = rank.state_bytes();
    for (size_t i = 0; i < vsize(rank.params()); ++i) {
      const pl::Param &p = *rank.params()->Get(i);
      std::string who = rank_name_ + ": parameter " + std::to_string(i) + " (" +
                        (p.name() ? p.name()->str() : std::string("unnamed")) + ")";
      if (std::string e = check_shape(p.shape()); !e.empty())
        return who + ": shape " + e;
      if (!is_float_dtype(p.dtype()))
        return who + " has dtype " + dtype_label(p.dtype()) + "; parameters are f32, bf16 or f16";
      if (p.grad_dtype() != pl::DType::F32 &&
          !(p.grad_dtype() == pl::DType::BF16 && p.dtype() == pl::DType::BF16))
        return who + " has grad_dtype " + dtype_label(p.grad_dtype()) +
               "; gradients are f32, or bf16 for a bf16 parameter (--grad-reduce-in-bf16)";
      // One gradient type a rank: its buckets and norms are reduced in it.
      if (p.grad_dtype() != rank.params()->Get(0)->grad_dtype())
        return who + " has grad_dtype " + dtype_label(p.grad_dtype()) + ", but parameter 0 has " +
               dtype_label(rank.params()->Get(0)->grad_dtype()) +
               "; a rank's gradients share one type";
      if (p.init() > pl::Init::MAX)
        return who + " has unknown init code " + std::to_string(int(p.init()));
      if (!(p.init_std() >= 0) || !std::isfinite(p.init_std()))
        return who + " has init_std " + std::to_string(p.init_std()) + "; it must be finite and >= 0";
      if (p.tp_dim() != -1) {
        if (p.tp_dim() < 0 || p.tp_dim() >= int32_t(vsize(p.shape())))
          return who + " has tp_dim " + std::to_string(p.tp_dim()) + ", not -1 or a dimension of " +
                 shape_text(p.shape());
        // An expert parameter's tp_dim splits it over expert tensor-parallel
        // ranks (plan.fbs Param.tp_dim), a dense one's over tensor-parallel ones.
        if (p.expert() && plan_.expert_tensor_parallel() < 2)
          return who + " is an expert parameter split over expert tensor-parallel ranks (tp_dim " +
                 std::to_string(p.tp_dim()) + "), but the plan has expert_tensor_parallel " +
                 std::to_string(plan_.expert_tensor_parallel());
        if (!p.expert() && plan_.tensor_parallel() < 2)
          return who + " is split over tensor-parallel ranks, but the plan has tensor_parallel " +
                 std::to_string(plan_.tensor_parallel());
        if (p.tp_blocks() < 1 || p.shape()->Get(uint32_t(p.tp_dim())) % p.tp_blocks() != 0)
          return who + " has tp_blocks " + std::to_string(p.tp_blocks()) +
                 ", which must be >= 1 and divide its dimension " + std::to_string(p.tp_dim());
      }
      if (p.ep_dim() != -1) {
        if (p.ep_dim() < 0 || p.ep_dim() >= int32_t(vsize(p.shape())))
          return who + " has ep_dim " + std::to_string(p.ep_dim()) + ", not -1 or a dimension of " +
                 shape_text(p.shape());
        if (plan_.expert_model_parallel() < 2)
          return who + " is split over expert-parallel ranks, but the plan has "
                       "expert_model_parallel " + std::to_string(plan_.expert_model_parallel());
        if (!p.expert())
          return who + " is split over expert-parallel ranks (ep_dim " +
                 std::to_string(p.ep_dim()) + ") but is not an expert parameter";
        if (p.tp_dim() == p.ep_dim())
          return who + " is split over expert tensor- and expert-parallel ranks on the same "
                       "dimension " + std::to_string(p.ep_dim()) + " (tp_dim and ep_dim)";
      }
      const uint64_t n = param_numel(p);
      const std::pair<const char *, std::pair<int64_t, uint64_t>> slots[] = {
          {"weight", {p.weight_offset(), n * element_bytes(p.dtype())}},
          {"grad", {p.grad_offset(), n * element_bytes(p.grad_dtype())}},
          {"master", {p.master_offset(), n * 4}},
          {"exp_avg", {p.exp_avg_offset(), n * 4}},
          {"exp_avg_sq", {p.exp_avg_sq_offset(), n * 4}},
      };
      for (const auto &[what, slot] : slots) {
        auto [offset, bytes] = slot;
        if (offset == -1)
          continue;
        std::string field = std::string(what) + "_offset " + std::to_string(offset);
        if (offset < 0)
          return who + ": " + field + " is negative (only -1, absent, is allowed)";
        if (uint64_t(offset) % kStateAlignment != 0)
          return who + ": " + field + " is not a multiple of " +
                 std::to_string(kStateAlignment) + " bytes";
        if (uint64_t(offset) > state || bytes > state - uint64_t(offset))
          return who + ": " + field + " + " + grouped(bytes) + " bytes ends past state_bytes " +
                 grouped(state);
        if (bytes > 0)
          ranges.push_back({uint64_t(offset), uint64_t(offset) + bytes, i, what});
      }
    }
    std::sort(ranges.begin(), ranges.end(),
              [](const Range &a, const Range &b) { return a.begin < b.begin; });
    for (size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i].begin < ranges[i - 1].end)
        return rank_name_ + ": the " + ranges[i - 1].what + " of parameter " +
               std::to_string(ranges[i - 1].param) + " and the " + ranges[i].what +
               " of parameter " + std::to_string(ranges[i].param) +
               " overlap in the state buffer";
    return "";
  }

  // Buckets: disjoint ranges of the flat buffers that divide by dp, each
  // holding whole parameters; the distributed optimizer's shard state
  // inside the state buffer and clear of every parameter's buffers.
  std::string check_buckets(const pl::Rank &rank) {
    const int64_t dp = std::max(1, plan_.data_parallel());
    const int64_t flat = rank.flat_elements();
    const size_t np = vsize(rank.params());
    std::vector<int> owner(np, -1);
    std::vector<std::pair<int64_t, int64_t>> ranges;
    size_t placed = 0; // buckets with a shard_offset
    for (size_t b = 0; b < vsize(rank.buckets()); ++b) {
      const pl::Bucket &bk = *rank.buckets()->Get(b);
      std::string who = rank_name_ + ": bucket " + std::to_string(b);
      if (bk.begin() < 0 || bk.end() <= bk.begin() || bk.end() > flat)
        return who + " is elements [" + std::to_string(bk.begin()) + ", " +
               std::to_string(bk.end()) + "), not inside the flat buffers' " +
               std::to_string(flat) + "; recompile the plan with mtc";
      if (bk.group() != 0 && bk.group() != 6)
        return who + " is reduced over group " + std::to_string(bk.group()) +
               "; buckets use group 0 (dp) or 6 (expt_dp)";
      const int64_t g = bucket_group_size(plan_, bk);
      if ((bk.end() - bk.begin()) % g != 0)
        return who + " has " + std::to_string(bk.end() - bk.begin()) +
               " elements, which do not divide by its group's " + std::to_string(g) +
               (bk.group() == 0 ? " (data_parallel)" : " (expert data parallel)") +
               " ranks; recompile the plan with mtc";
      if (bk.shard_offset() != -1) {
        if (!rank.distributed_optimizer())
          return who + " has a shard_offset without the distributed optimizer";
        const int64_t n = (bk.end() - bk.begin()) / g;
        if (bk.shard_offset() < 0 || bk.shard_offset() > rank.shard_elements() ||
            n > rank.shard_elements() - bk.shard_offset())
          return who + "'s shard of " + std::to_string(n) + " elements at shard_offset " +
                 std::to_string(bk.shard_offset()) + " is not inside the " +
                 std::to_string(rank.shard_elements()) + " shard_elements";
        shards_.push_back({bk.shard_offset(), bk.shard_offset() + n});
        ++placed;
      } else if (bk.group() != 0 && rank.distributed_optimizer()) {
        return who + " is an expert bucket (group 6) without a shard_offset; recompile the "
                     "plan with mtc";
      }
      ranges.push_back({bk.begin(), bk.end()});
      for (size_t k = 0; k < vsize(bk.params()); ++k) {
        uint32_t i = bk.params()->Get(k);
        if (i >= np)
          return who + " names parameter " + std::to_string(i) + ", but " + rank_name_ +
                 " has " + std::to_string(np);
        const pl::Param &p = *rank.params()->Get(i);
        std::string pw = who + ", parameter " + std::to_string(i) + " (" +
                         (p.name() ? p.name()->str() : std::string("unnamed")) + ")";
        if (owner[i] >= 0)
          return pw + " is also in bucket " + std::to_string(owner[i]);
        owner[i] = int(b);
        if (p.expert() != (bk.group() == 6))
          return pw + (p.expert() ? " is an expert parameter in a dp bucket (group 0); expert "
                                    "gradients are reduced over group 6 (expt_dp)"
                                  : " is a dense parameter in an expert bucket (group 6)");
        const int64_t n = int64_t(param_numel(p));
        if (p.flat_offset() < bk.begin() || p.flat_offset() + n > bk.end())
          return pw + " at flat element " + std::to_string(p.flat_offset()) + " (" +
                 std::to_string(n) + " elements) is not inside the bucket";
        if (p.weight_offset() < 0 || p.grad_offset() < 0)
          return pw + " has no weights or gradient buffer on this rank";
      }
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i].first < ranges[i - 1].second)
        return rank_name_ + ": two buckets overlap in the flat buffers";
    if (!rank.distributed_optimizer())
      return "";
    if (ranges.empty())
      return rank_name_ + ": the distributed optimizer needs buckets; recompile the plan with mtc";
    if (placed == 0) {
      if (rank.shard_elements() != flat / dp || flat % dp != 0)
        return rank_name_ + ": shard_elements " + std::to_string(rank.shard_elements()) +
               " is not flat_elements " + std::to_string(flat) + " / data_parallel " +
               std::to_string(dp);
    } else {
      if (placed != ranges.size())
        return rank_name_ + ": some buckets have a shard_offset and some do not; with one, "
                            "every bucket needs its own";
      std::sort(shards_.begin(), shards_.end());
      for (size_t i = 1; i < shards_.size(); ++i)
        if (shards_[i].first < shards_[i - 1].second)
          return rank_name_ + ": two buckets' shards overlap in the shard state (shard_offset)";
    }
    const uint64_t state = rank.state_bytes(), bytes = uint64_t(rank.shard_elements()) * 4;
    const std::pair<const char *, int64_t> slots[] = {
        {"shard_master_offset", rank.shard_master_offset()},
        {"shard_exp_avg_offset", rank.shard_exp_avg_offset()},
        {"shard_exp_avg_sq_offset", rank.shard_exp_avg_sq_offset()}};
    // SGD keeps one state tensor (the first moment's slot).
    const bool sgd = plan_.training() && plan_.training()->optimizer() &&
                     plan_.training()->optimizer()->str() == "sgd";
    for (const auto &[what, offset] : slots) {
      if (offset == -1 && (std::string(what) == "shard_master_offset" ||
                           (sgd && std::string(what) == "shard_exp_avg_sq_offset")))
        continue;
      if (offset < 0 || uint64_t(offset) % kStateAlignment != 0 || uint64_t(offset) > state ||
          bytes > state - uint64_t(offset))
        return rank_name_ + ": " + what + " " + std::to_string(offset) + " (" + grouped(bytes) +
               " bytes) is not an aligned range of the " + grouped(state) +
               "-byte state buffer; recompile the plan with mtc";
    }
    return "";
  }

  // Dimensions >= 1 and a product that stays far from overflow.
  static std::string check_shape(const flatbuffers::Vector<int64_t> *shape) {
    if (!aligned(shape))
      return "is not 8-byte aligned in the file";
    int64_t n = 1;
    for (size_t i = 0; i < vsize(shape); ++i) {
      int64_t d = shape->Get(i);
      if (d < 1)
        return shape_text(shape) + " has a dimension below 1";
      if (d > kMaxElements || n > kMaxElements / d)
        return shape_text(shape) + " has more than 2^48 elements";
      n *= d;
    }
    return "";
  }

  std::string check_value(const Scope &s, uint32_t i) {
    const pl::Value *v = s.value(i);
    std::string who = s.name + ": value " + std::to_string(i) + " (" + value_label(v, i) + ")";
    if (v->dtype() > pl::DType::MAX)
      return who + " has unknown dtype code " + std::to_string(int(v->dtype()));
    if (v->region() > pl::Region::MAX)
      return who + " has unknown region code " + std::to_string(int(v->region()));
    if (std::string e = check_shape(v->shape()); !e.empty())
      return who + ": shape " + e;
    if (v->slot_offsets() && !s.pipelined)
      return who + " has slot_offsets outside a pipelined train_step (Program.pipeline)";
    if (s.bound(i))
      return ""; // bound to the FUSED operand: its own region and offset are unused
    const uint64_t bytes = plan_bytes(*v);
    switch (v->region()) {
    case pl::Region::ARENA: {
      const uint64_t o = v->offset();
      const char *space = s.kernel ? "cpu_scratch_bytes" : "arena_bytes";
      if (o > s.arena_limit || bytes > s.arena_limit - o)
        return who + " at arena offset " + grouped(o) + " with " + grouped(bytes) +
               " bytes ends past " + space + " " + grouped(s.arena_limit);
      if (o % element_bytes(v->dtype()) != 0)
        return who + " at arena offset " + grouped(o) + " is not aligned to its " +
               std::to_string(element_bytes(v->dtype())) + "-byte elements";
      return "";
    }
    case pl::Region::WEIGHT:
    case pl::Region::GRAD: {
      const bool weight = v->region() == pl::Region::WEIGHT;
      const size_t np = vsize(rank_->params());
      if (v->offset() >= np)
        return who + " refers to parameter " + std::to_string(v->offset()) + ", but " +
               rank_name_ + " has " + std::to_string(np) + " parameters";
      const pl::Param &p = *rank_->params()->Get(uint32_t(v->offset()));
      std::string pname = "parameter " + std::to_string(v->offset());
      if ((weight ? p.weight_offset() : p.grad_offset()) < 0)
        return who + " reads the " + (weight ? "weights" : "gradient") + " of " + pname +
               ", which this rank does not hold";
      if (shape_text(v->shape()) != shape_text(p.shape()))
        return who + " has shape " + shape_text(v->shape()) + ", but " + pname + " has " +
               shape_text(p.shape());
      pl::DType want = weight ? p.dtype() : p.grad_dtype();
      if (v->dtype() != want)
        return who + " has dtype " + dtype_label(v->dtype()) + ", but the " +
               (weight ? "weights" : "gradient") + " of " + pname + " are " + dtype_label(want);
      return "";
    }
    }
    return "";
  }

  std::string check_program(const pl::Program &prog, const std::string &name) {
    Scope s;
    s.name = rank_name_ + ", program " + name;
    s.values = prog.values();
    s.arena_limit = rank_->arena_bytes();
    s.pipelined = prog.pipeline() != nullptr;
    const size_t nv = s.num_values();
    for (uint32_t i = 0; i < nv; ++i)
      if (std::string e = check_value(s, i); !e.empty())
        return e;
    if (s.pipelined) {
      if (std::string e = check_pipeline(s, prog, name); !e.empty())
        return e;
    } else {
      for (size_t i = 0; i < vsize(prog.instructions()); ++i)
        if (const pl::Instruction &ins = *prog.instructions()->Get(uint32_t(i));
            ins.runs_in() != pl::MicroBatches::ALL)
          return s.name + " " + instruction_label(ins, i) + ": runs_in " + runs_in_name(ins) +
                 " outside a pipelined train_step (Program.pipeline); it runs every time";
    }
    // An unrolled schedule's instructions name their micro-batch; one
    // micro-batch's program (run once per micro-batch) names none.
    const int32_t unrolled = prog.unrolled_micro_batches();
    if (unrolled < 0 || unrolled > kMaxMicroBatch + 1)
      return s.name + ": unrolled_micro_batches " + std::to_string(unrolled) +
             " is outside 0 to " + std::to_string(kMaxMicroBatch + 1);
    for (size_t i = 0; i < vsize(prog.instructions()); ++i) {
      const int32_t mb = prog.instructions()->Get(uint32_t(i))->micro_batch();
      if (unrolled == 0 ? mb != -1 : mb >= unrolled)
        return s.name + " " + instruction_label(*prog.instructions()->Get(uint32_t(i)), i) +
               ": micro_batch " + std::to_string(mb) +
               (unrolled == 0 ? " in a program of one micro-batch (unrolled_micro_batches 0)"
                              : " in a schedule unrolled over " + std::to_string(unrolled) +
                                    " micro-batches");
    }
    std::vector<char> written(nv, 0);
    const size_t ni = vsize(prog.inputs());
    if (prog.input_names() && vsize(prog.input_names()) != ni)
      return s.name + " has " + std::to_string(ni) + " inputs but " +
             std::to_string(vsize(prog.input_names())) + " input names";
    for (size_t k = 0; k < ni; ++k) {
      uint32_t v = prog.inputs()->Get(k);
      if (v >= nv)
        return s.name + ": input " + std::to_string(k) + " is value " + std::to_string(v) +
               ", but the program has " + std::to_string(nv) + " values";
      if (s.value(v)->region() != pl::Region::ARENA)
        return s.name + ": input " + std::to_string(k) + " (" + value_label(s.value(v), v) +
               ") is not an arena value; inputs are filled by the runtime";
      written[v] = 1;
    }
    const size_t no = vsize(prog.outputs());
    if (prog.output_names() && vsize(prog.output_names()) != no)
      return s.name + " has " + std::to_string(no) + " outputs but " +
             std::to_string(vsize(prog.output_names())) + " output names";
    for (size_t k = 0; k < no; ++k)
      if (prog.outputs()->Get(k) >= nv)
        return s.name + ": output " + std::to_string(k) + " is value " +
               std::to_string(prog.outputs()->Get(k)) + ", but the program has " +
               std::to_string(nv) + " values";
    if (std::string e = check_instructions(s, prog.instructions(), written); !e.empty())
      return e;
    for (size_t k = 0; k < no; ++k) {
      uint32_t v = prog.outputs()->Get(k);
      if (!written[v] && s.value(v)->region() == pl::Region::ARENA)
        return s.name + ": output " + std::to_string(k) + " (" + value_label(s.value(v), v) +
               ") is never written";
    }
    return "";
  }

  static std::string runs_in_name(const pl::Instruction &ins) {
    return ins.runs_in() > pl::MicroBatches::MAX ? "code " + std::to_string(int(ins.runs_in()))
                                                 : pl::EnumNameMicroBatches(ins.runs_in());
  }

  // A compact pipelined train_step (plan.fbs PipelineSchedule): the
  // schedule is this rank's, of the plan's stages and micro-batches, it
  // expands (pipeline_expand.h), and every value slot lies in the arena.
  std::string check_pipeline(const Scope &s, const pl::Program &prog, const std::string &name) {
    const pl::PipelineSchedule &ps = *prog.pipeline();
    auto n = [](int64_t v) { return std::to_string(v); };
    if (name != "train_step")
      return s.name + " has a pipeline schedule; only train_step may";
    if (ps.stages() != plan_.pipeline_parallel())
      return s.name + ": pipeline.stages " + n(ps.stages()) + " is not the plan's " +
             "pipeline_parallel " + n(plan_.pipeline_parallel());
    if (ps.rank() != rank_->pp_rank())
      return s.name + ": pipeline.rank " + n(ps.rank()) + " is not " + rank_name_ +
             "'s pipeline rank " + n(rank_->pp_rank());
    const pl::Training *t = plan_.training();
    if (!t)
      return s.name + " has a pipeline schedule but the plan has no training table (its "
                      "num_micro_batches)";
    if (ps.micro_batches() != t->num_micro_batches())
      return s.name + ": pipeline.micro_batches " + n(ps.micro_batches()) +
             " is not training.num_micro_batches " + n(t->num_micro_batches());
    std::vector<ScheduledSegment> order;
    if (std::string e = check_pipeline_schedule(prog, &order); !e.empty())
      return s.name + ": " + e;
    for (uint32_t v = 0; v < s.num_values(); ++v) {
      const pl::Value &val = *s.value(v);
      const uint64_t bytes = plan_bytes(val);
      for (uint32_t k = 1; k < vsize(val.slot_offsets()); ++k) {
        const uint64_t o = val.slot_offsets()->Get(k);
        const std::string who = s.name + ": value " + n(v) + " (" + value_label(&val, v) +
                                ") slot_offsets[" + n(k) + "] " + grouped(o);
        if (o > s.arena_limit || bytes > s.arena_limit - o)
          return who + " with " + grouped(bytes) + " bytes ends past arena_bytes " +
                 grouped(s.arena_limit);
        if (o % element_bytes(val.dtype()) != 0)
          return who + " is not aligned to its " + n(int64_t(element_bytes(val.dtype()))) +
                 "-byte elements";
      }
    }
    return "";
  }

  std::string check_instructions(
      const Scope &s, const flatbuffers::Vector<flatbuffers::Offset<pl::Instruction>> *instrs,
      std::vector<char> &written) {
    for (size_t i = 0; i < vsize(instrs); ++i) {
      const pl::Instruction &ins = *instrs->Get(i);
      std::string who = s.name + " " + instruction_label(ins, i);
      if (std::string e = check_instruction(s, ins, written); !e.empty())
        return who + ": " + e;
    }
    return "";
  }

  // A value's description for messages: "%x [2,3] f32".
  static std::string describe(const Scope &s, uint32_t v) {
    const pl::Value *val = s.value(v);
    return value_label(val, v) + " " + shape_text(val->shape()) + " " + dtype_label(val->dtype());
  }

  bool kind_matches(const pl::Value &v, char kind) const {
    switch (kind) {
    case 'f': return is_float_dtype(v.dtype());
    case 'F': return v.dtype() == pl::DType::F32;
    case 'i': return v.dtype() == pl::DType::I32;
    case 's': return v.dtype() == pl::DType::F32 && element_count(v) == 1;
    case 'l': return v.dtype() == pl::DType::I64 && element_count(v) == 1;
    case 'g': return is_float_dtype(v.dtype()) || v.dtype() == pl::DType::F64;
    default: return v.dtype() != pl::DType::F64;
    }
  }

  std::string check_instruction(const Scope &s, const pl::Instruction &ins,
                                std::vector<char> &written) {
    if (ins.op() > pl::Opcode::MAX)
      return "unknown opcode; this mtrun knows opcodes 0 to " + std::to_string(kNumOpcodes - 1);
    const OpSignature &sig = kSignatures[size_t(ins.op())];
    if (!aligned(ins.ints()) || !aligned(ins.floats()))
      return "its ints or floats are not 8-byte aligned in the file";
    const size_t nin = vsize(ins.in()), nout = vsize(ins.out()), npar = vsize(ins.params());
    auto count = [](const char *what, size_t got, size_t want) {
      return std::string("has ") + std::to_string(got) + " " + what + ", its signature has " +
             std::to_string(want);
    };
    if (sig.in && nin != std::strlen(sig.in))
      return count("inputs", nin, std::strlen(sig.in));
    if (sig.out && nout != std::strlen(sig.out))
      return count("outputs", nout, std::strlen(sig.out));
    if (sig.params >= 0 && npar != size_t(sig.params))
      return count("parameters", npar, sig.params);
    if (vsize(ins.ints()) != size_t(sig.ints))
      return count("ints", vsize(ins.ints()), sig.ints);
    if (vsize(ins.floats()) != size_t(sig.floats))
      return count("floats", vsize(ins.floats()), sig.floats);

    const size_t nv = s.num_values();
    for (size_t k = 0; k < nin + nout; ++k) {
      const bool is_in = k < nin;
      const size_t j = is_in ? k : k - nin;
      uint32_t v = is_in ? ins.in()->Get(j) : ins.out()->Get(j);
      std::string slot = std::string(is_in ? "in[" : "out[") + std::to_string(j) + "]";
      if (v >= nv)
        return slot + " is value " + std::to_string(v) + ", but " +
               (s.kernel ? "the kernel" : "the program") + " has " + std::to_string(nv) +
               " values";
      const char *kinds = is_in ? sig.in : sig.out;
      if (kinds && !kind_matches(*s.value(v), kinds[j]))
        return slot + " (" + describe(s, v) + ") must be " + kind_name(kinds[j]);
      if (!kinds && s.value(v)->dtype() == pl::DType::F64)
        return slot + " (" + describe(s, v) +
               ") is f64, which only the MoE router's logits and their gradient are";
    }
    const size_t np = vsize(rank_->params());
    for (size_t k = 0; k < npar; ++k)
      if (ins.params()->Get(k) >= np)
        return "params[" + std::to_string(k) + "] is parameter " +
               std::to_string(ins.params()->Get(k)) + ", but " + rank_name_ + " has " +
               std::to_string(np) + " parameters";

    // Dataflow: a value is read only after it is written, and written once.
    for (size_t k = 0; k < nin; ++k) {
      uint32_t v = ins.in()->Get(k);
      // Kernel inputs are marked written before the kernel's instructions.
      if ((s.bound(v) || s.value(v)->region() == pl::Region::ARENA) && !written[v])
        return "in[" + std::to_string(k) + "] (" + value_label(s.value(v), v) +
               ") is read before any instruction writes it";
    }
    for (size_t k = 0; k < nout; ++k) {
      uint32_t v = ins.out()->Get(k);
      if (!s.bound(v) && s.value(v)->region() != pl::Region::ARENA)
        return "out[" + std::to_string(k) + "] (" + value_label(s.value(v), v) +
               ") is not an arena value; instructions write only activations";
      if (s.bound(v) && v < s.bound_in)
        return "out[" + std::to_string(k) + "] (" + value_label(s.value(v), v) +
               ") overwrites a kernel input";
      if (written[v])
        return "out[" + std::to_string(k) + "] (" + value_label(s.value(v), v) +
               ") is written a second time";
      written[v] = 1;
    }

    if (std::string e = check_disjoint(s, ins); !e.empty())
      return e;
    if (std::string e = check_params_held(ins); !e.empty())
      return e;
    if (std::string e = check_attributes(ins); !e.empty())
      return e;
    if (std::string e = check_gpu_steps(s, ins); !e.empty())
      return e;
    if (s.kernel && ins.runs_in() != pl::MicroBatches::ALL)
      return "runs_in " + runs_in_name(ins) + " in a kernel's cpu_instructions";
    if (ins.micro_batch() < -1 || ins.micro_batch() > kMaxMicroBatch)
      return "micro_batch " + std::to_string(ins.micro_batch()) + " is outside -1 to " +
             std::to_string(kMaxMicroBatch);
    if (ins.op() == pl::Opcode::FUSED)
      return check_fused(s, ins);
    return check_shapes(s, ins);
  }

  // GPU steps (plan.fbs GpuStep): every index they hold is in range, so the
  // CUDA executor can resolve arguments without checks of its own. Whether
  // every instruction has steps is the CUDA executor's question, not the
  // file's: the CPU runs plans without them.
  std::string check_gpu_steps(const Scope &s, const pl::Instruction &ins) {
    const size_t n = vsize(ins.gpu());
    if (n && s.kernel)
      return "a kernel's cpu_instructions carry GPU steps";
    const size_t np = vsize(rank_->params());
    for (size_t i = 0; i < n; ++i) {
      const pl::GpuStep &step = *ins.gpu()->Get(i);
      const std::string at = "GPU step " + std::to_string(i) + ": ";
      if (step.kind() > pl::GpuStepKind::MAX)
        return at + "unknown kind " + std::to_string(int(step.kind()));
      for (size_t a = 0; a < vsize(step.args()); ++a) {
        const pl::GpuArg &arg = *step.args()->Get(a);
        const std::string which = at + "args[" + std::to_string(a) + "] ";
        const uint64_t ix = arg.index();
        switch (arg.kind()) {
        case pl::GpuArgKind::VALUE:
          if (ix >= s.num_values())
            return which + "is value " + std::to_string(ix) + ", but the program has " +
                   std::to_string(s.num_values());
          break;
        case pl::GpuArgKind::WEIGHT:
        case pl::GpuArgKind::GRAD:
        case pl::GpuArgKind::MASTER:
        case pl::GpuArgKind::EXP_AVG:
        case pl::GpuArgKind::EXP_AVG_SQ: {
          if (ix >= np)
            return which + "is parameter " + std::to_string(ix) + ", but " + rank_name_ +
                   " has " + std::to_string(np);
          const pl::Param &p = *rank_->params()->Get(uint32_t(ix));
          const int64_t off = arg.kind() == pl::GpuArgKind::WEIGHT ? p.weight_offset()
                              : arg.kind() == pl::GpuArgKind::GRAD ? p.grad_offset()
                              : arg.kind() == pl::GpuArgKind::MASTER ? p.master_offset()
                              : arg.kind() == pl::GpuArgKind::EXP_AVG ? p.exp_avg_offset()
                                                                      : p.exp_avg_sq_offset();
          if (off < 0)
            return which + "names a buffer parameter " + std::to_string(ix) + " does not have";
          break;
        }
        case pl::GpuArgKind::WORKSPACE:
          if (ix >= rank_->kernel_workspace_bytes())
            return which + "is workspace byte " + std::to_string(ix) + ", but " + rank_name_ +
                   " has " + std::to_string(rank_->kernel_workspace_bytes());
          break;
        default:
          if (arg.kind() > pl::GpuArgKind::MAX)
            return which + "has unknown kind " + std::to_string(int(arg.kind()));
          break;
        }
      }
      switch (step.kind()) {
      case pl::GpuStepKind::KERNEL: {
        const int k = step.kernel();
        if (k < 0 || size_t(k) >= vsize(plan_.kernels()))
          return at + "launches kernel " + std::to_string(k) + ", but the plan has " +
                 std::to_string(vsize(plan_.kernels()));
        const pl::Kernel &kern = *plan_.kernels()->Get(uint32_t(k));
        if (!kern.cuda_source() || !kern.cuda_source()->size() || !kern.entry() ||
            !kern.entry()->size())
          return at + "launches kernel " + std::to_string(k) + ", which has no CUDA source";
        if (vsize(kern.grid()) != 3 || vsize(kern.block()) != 3)
          return at + "kernel " + std::to_string(k) + " has no 3-dimensional grid and block";
        break;
      }
      case pl::GpuStepKind::GEMM: {
        const pl::Gemm *g = step.gemm();
        if (!g)
          return at + "is a GEMM without its description";
        if (g->epilogue() > pl::GemmEpilogue::MAX)
          return at + "has unknown GEMM epilogue " + std::to_string(int(g->epilogue()));
        const bool bias = gemm_epilogue_has_bias(g->epilogue());
        const size_t want = 3 + bias + gemm_epilogue_has_aux(g->epilogue());
        if (vsize(step.args()) != want)
          return at + "has " + std::to_string(vsize(step.args())) + " arguments, its GEMM takes " +
                 std::to_string(want);
        if (g->m() <= 0 || g->n() <= 0 || g->k() <= 0 || g->batch() <= 0)
          return at + "has a GEMM with a dimension below 1";
        // cuBLASLt's types (compute f32, or f64 for f64 operands): A and
        // B of one type; f32 operands give an f32 result, f64 ones an f64
        // result without an epilogue, and only they do.
        const bool f64 = g->a_type() == pl::DType::F64;
        if (g->a_type() != g->b_type() ||
            (g->a_type() == pl::DType::F32 && g->d_type() != pl::DType::F32) ||
            f64 != (g->d_type() == pl::DType::F64) ||
            (f64 && g->epilogue() != pl::GemmEpilogue::NONE))
          return at + "has a GEMM of " + pl::EnumNameDType(g->a_type()) + " x " +
                 pl::EnumNameDType(g->b_type()) + " into " + pl::EnumNameDType(g->d_type()) +
                 ", which cuBLASLt does not multiply; recompile the spec with this mtc";
        const int64_t rows_a = g->trans_a() ? g->k() : g->m();
        const int64_t rows_b = g->trans_b() ? g->n() : g->k();
        if (g->lda() < rows_a || g->ldb() < rows_b || g->ldd() < g->m())
          return at + "has a GEMM leading dimension smaller than its rows";
        for (size_t a = 0; a < vsize(step.args()); ++a)
          if (step.args()->Get(a)->kind() > pl::GpuArgKind::WORKSPACE)
            return at + "GEMM argument " + std::to_string(a) + " is not a tensor";
        if (bias && !is_float_dtype(g->bias_type()))
          return at + "has a GEMM bias type that is not F32, BF16 or F16";
        // A bias gradient is written to the workspace (a kernel step adds it
        // into the gradient): one value per row of D (DGELU_BGRAD) or per
        // column (BGRADB), all inside the workspace.
        if (gemm_epilogue_writes_bias(g->epilogue())) {
          const pl::GpuArg &out = *step.args()->Get(3);
          const int64_t count =
              g->epilogue() == pl::GemmEpilogue::BGRADB ? g->n() : g->m();
          if (out.kind() != pl::GpuArgKind::WORKSPACE ||
              out.index() + uint64_t(count) * element_bytes(g->bias_type()) >
                  rank_->kernel_workspace_bytes())
            return at + "writes its bias gradient (" + std::to_string(count) +
                   " values) outside the kernel workspace";
          if (g->batch() != 1)
            return at + "has a batched GEMM with a bias gradient";
        }
        break;
      }
      case pl::GpuStepKind::ALL_REDUCE: {
        if (vsize(step.args()) != 1 || step.args()->Get(0)->kind() != pl::GpuArgKind::WORKSPACE ||
            step.group() < 0 || step.group() > 8 || step.reduce() < 0 || step.reduce() > 1 ||
            step.element() > pl::ReduceElement::MAX)
          return at + "is an all-reduce without one workspace buffer, a group 0-8, a "
                      "reduction 0-1 and an element type";
        const uint64_t bytes = step.count() * (step.element() == pl::ReduceElement::F64 ? 8 : 4);
        if (step.args()->Get(0)->index() + bytes > rank_->kernel_workspace_bytes())
          return at + "all-reduces past the end of the workspace";
        break;
      }
      default:
        break;
      }
    }
    return "";
  }

  // An instruction's results share no arena bytes with its operands or with
  // each other (the kernels are not written for aliasing); a RESHAPE result
  // at its operand's very offset is a view of it, not a copy, and
  // CROSS_ENTROPY_GRAD may write the logits' gradient over the logits.
  std::string check_disjoint(const Scope &s, const pl::Instruction &ins) {
    auto arena = [&](uint32_t v) {
      return !s.bound(v) && s.value(v)->region() == pl::Region::ARENA;
    };
    auto overlap = [&](uint32_t a, uint32_t b) {
      const pl::Value &x = *s.value(a), &y = *s.value(b);
      return arena(a) && arena(b) && x.offset() < y.offset() + plan_bytes(y) &&
             y.offset() < x.offset() + plan_bytes(x);
    };
    for (size_t k = 0; k < vsize(ins.out()); ++k) {
      const uint32_t y = ins.out()->Get(uint32_t(k));
      for (size_t j = 0; j < vsize(ins.in()); ++j) {
        const uint32_t x = ins.in()->Get(uint32_t(j));
        if (out0_may_alias_in0(ins.op()) && j == 0 && k == 0 &&
            s.value(x)->offset() == s.value(y)->offset() &&
            plan_bytes(*s.value(x)) == plan_bytes(*s.value(y)))
          continue;
        if (overlap(x, y))
          return "out[" + std::to_string(k) + "] (" + value_label(s.value(y), y) +
                 ") shares arena bytes with in[" + std::to_string(j) + "] (" +
                 value_label(s.value(x), x) + "); results must not overlap their operands";
      }
      for (size_t j = 0; j < k; ++j) {
        const uint32_t x = ins.out()->Get(uint32_t(j));
        if (overlap(x, y))
          return "out[" + std::to_string(k) + "] (" + value_label(s.value(y), y) +
                 ") shares arena bytes with out[" + std::to_string(j) + "] (" +
                 value_label(s.value(x), x) + ")";
      }
    }
    return "";
  }

  // Parameters an instruction updates must have the buffers it updates.
  std::string check_params_held(const pl::Instruction &ins) {
    for (size_t k = 0; k < vsize(ins.params()); ++k) {
      const pl::Param &p = *rank_->params()->Get(ins.params()->Get(k));
      std::string who = "params[" + std::to_string(k) + "] (" +
                        (p.name() ? p.name()->str() : std::string("unnamed")) + ")";
      if (p.grad_offset() < 0)
        return who + " has no gradient buffer on this rank";
      if (ins.op() == pl::Opcode::ADAMW &&
          (p.weight_offset() < 0 || p.exp_avg_offset() < 0 || p.exp_avg_sq_offset() < 0))
        return who + " lacks weights or Adam moments on this rank";
      if (ins.op() == pl::Opcode::SGD && (p.weight_offset() < 0 || p.exp_avg_offset() < 0))
        return who + " lacks weights or an SGD momentum buffer on this rank";
    }
    return "";
  }

  std::string check_attributes(const pl::Instruction &ins) {
    auto ints = [&](size_t k) { return ins.ints()->Get(k); };
    auto floats = [&](size_t k) { return ins.floats()->Get(k); };
    auto rate_ok = [](double r) { return r >= 0 && r < 1; };
    for (size_t k = 0; k < vsize(ins.floats()); ++k)
      if (!std::isfinite(floats(k)))
        return "floats[" + std::to_string(k) + "] is not finite";
    switch (ins.op()) {
    case pl::Opcode::GELU:
    case pl::Opcode::GELU_GRAD:
      if (ints(0) != 0 && ints(0) != 1)
        return "ints[0] (tanh) is " + std::to_string(ints(0)) + "; it must be 0 or 1";
      break;
    case pl::Opcode::DROPOUT:
      if (ints(0) < 0)
        return "ints[0] (stream) is negative";
      if (ints(1) < -1 || ints(1) > 7)
        return "ints[1] (tp_shard_dim) is " + std::to_string(ints(1)) +
               "; it must be -1 (none) or a dimension";
      if (!rate_ok(floats(0)))
        return "floats[0] (rate) is " + std::to_string(floats(0)) + "; it must be in [0, 1)";
      break;
    case pl::Opcode::ATTENTION:
    case pl::Opcode::ATTENTION_GRAD:
      if (ints(0) != 0 && ints(0) != 1)
        return "ints[0] (causal) is " + std::to_string(ints(0)) + "; it must be 0 or 1";
      if (ints(1) < 0)
        return "ints[1] (stream) is negative";
      if (ints(2) != -1 && ints(2) != 2)
        return "ints[2] (tp_shard_dim) is " + std::to_string(ints(2)) +
               "; attention is split over tensor-parallel ranks by heads (2) or not (-1)";
      if (!rate_ok(floats(1)))
        return "floats[1] (dropout) is " + std::to_string(floats(1)) + "; it must be in [0, 1)";
      break;
    case pl::Opcode::LR_SCHEDULE: {
      int64_t style = ints(0), warmup = ints(1), decay = ints(2);
      if (style < 0 || style > int64_t(pl::LrStyle::MAX))
        return "ints[0] (style) is " + std::to_string(style) + "; LrStyle has codes 0 to " +
               std::to_string(int(pl::LrStyle::MAX));
      if (warmup < 0)
        return "ints[1] (warmup) is negative";
      // Megatron's OptimizerParamScheduler asserts both.
      bool decays = style == int64_t(pl::LrStyle::LINEAR) ||
                    style == int64_t(pl::LrStyle::COSINE) || style == int64_t(pl::LrStyle::WSD);
      if (decays && decay <= warmup)
        return "ints[2] (decay_iters " + std::to_string(decay) +
               ") must exceed ints[1] (warmup " + std::to_string(warmup) + ")";
      if (ints(3) < 1)
        return "ints[3] (samples_per_step) is " + std::to_string(ints(3)) + "; it must be >= 1";
      if (ints(4) < 0 || ints(4) > int64_t(pl::WsdStyle::MAX))
        return "ints[4] (wsd_style) is " + std::to_string(ints(4)) + "; WsdStyle has codes 0 to " +
               std::to_string(int(pl::WsdStyle::MAX));
      if (style == int64_t(pl::LrStyle::WSD) && (ints(5) < 1 || ints(5) > decay - warmup))
        return "ints[5] (wsd_decay_iters " + std::to_string(ints(5)) +
               ") must be in [1, decay_iters - warmup]";
      if (floats(1) < 0 || floats(0) < floats(1))
        return "needs 0 <= min_lr <= lr, got lr " + std::to_string(floats(0)) + ", min_lr " +
               std::to_string(floats(1));
      break;
    }
    case pl::Opcode::ALL_REDUCE_GRADS: {
      if (ints(0) != 0 && ints(0) != 1 && ints(0) != 6)
        return "ints[0] is group " + std::to_string(ints(0)) +
               "; gradients are reduced over group 0 (dp), 1 (tp) or 6 (expt_dp)";
      if (!(floats(0) > 0.0 && floats(0) <= 1.0))
        return "floats[0] (scale) is " + std::to_string(floats(0)) + ", outside (0, 1]";
      if (ints(0) == 0 && plan_.data_parallel() < 2)
        return "reduces over data-parallel ranks, but the plan has data_parallel " +
               std::to_string(plan_.data_parallel());
      if (ints(0) == 1 && plan_.tensor_parallel() < 2)
        return "reduces over tensor-parallel ranks, but the plan has tensor_parallel " +
               std::to_string(plan_.tensor_parallel());
      if (ints(0) == 6 && expert_data_parallel(plan_) < 2)
        return "reduces over expert data-parallel ranks, but the plan has one (tensor x data "
               "parallel / expert_model_parallel x expert_tensor_parallel)";
      // Expert gradients are reduced over group 6 only, dense ones never
      // there; "every parameter" (no params) only in a rank without experts.
      const size_t np = vsize(ins.params());
      bool any_expert = false;
      for (size_t k = 0; k < vsize(rank_->params()); ++k)
        any_expert = any_expert || rank_->params()->Get(uint32_t(k))->expert();
      if (np == 0 && any_expert)
        return "reduces every parameter over group " + std::to_string(ints(0)) + ", but " +
               rank_name_ + " has expert parameters (reduced over group 6, expt_dp); name the "
               "parameters; recompile the plan with mtc";
      for (size_t k = 0; k < np; ++k) {
        const pl::Param &p = *rank_->params()->Get(ins.params()->Get(uint32_t(k)));
        if (p.expert() != (ints(0) == 6))
          return "params[" + std::to_string(k) + "] (" + plan_string(p.name()) + ") is " +
                 (p.expert() ? "an expert parameter; expert gradients are reduced over group 6 "
                               "(expt_dp)"
                             : "a dense parameter; group 6 (expt_dp) reduces expert gradients");
      }
      break;
    }
    case pl::Opcode::EMBEDDING:
    case pl::Opcode::EMBEDDING_GRAD:
    case pl::Opcode::CROSS_ENTROPY:
    case pl::Opcode::CROSS_ENTROPY_GRAD:
      if (ints(0) != 0 && ints(0) != 1)
        return "ints[0] (vocab_parallel) is " + std::to_string(ints(0)) + "; it must be 0 or 1";
      if (ints(0) == 1 && plan_.tensor_parallel() < 2)
        return "is vocab parallel, but the plan has tensor_parallel " +
               std::to_string(plan_.tensor_parallel());
      break;
    case pl::Opcode::ALL_REDUCE:
    case pl::Opcode::SEQ_ALL_GATHER:
    case pl::Opcode::SEQ_REDUCE_SCATTER:
    case pl::Opcode::SEQ_SPLIT:
      if (ints(0) != 1)
        return "ints[0] is group " + std::to_string(ints(0)) +
               "; activations are exchanged within group 1 (tp)";
      if (plan_.tensor_parallel() < 2)
        return "exchanges activations between tensor-parallel ranks, but the plan has "
               "tensor_parallel " + std::to_string(plan_.tensor_parallel());
      break;
    case pl::Opcode::REDUCE_GRADS:
    case pl::Opcode::SHARDED_GRAD_NORM:
    case pl::Opcode::SHARDED_ADAMW:
    case pl::Opcode::SHARDED_SGD:
    case pl::Opcode::ALL_GATHER_PARAMS: {
      const bool has_group =
          ins.op() != pl::Opcode::SHARDED_ADAMW && ins.op() != pl::Opcode::SHARDED_SGD;
      const bool has_bucket = ins.op() != pl::Opcode::SHARDED_GRAD_NORM;
      const bool sharded = ins.op() != pl::Opcode::REDUCE_GRADS || ints(2) != 0;
      if (has_group && ints(0) != 0 && (ins.op() == pl::Opcode::SHARDED_GRAD_NORM || ints(0) != 6))
        return "ints[0] is group " + std::to_string(ints(0)) + "; this mtrun knows group 0 (dp)" +
               (ins.op() == pl::Opcode::SHARDED_GRAD_NORM ? "" : " and 6 (expt_dp)");
      if (has_bucket) {
        const int64_t b = ints(has_group ? 1 : 0);
        if (b < 0 || uint64_t(b) >= vsize(rank_->buckets()))
          return "names bucket " + std::to_string(b) + ", but " + rank_name_ + " has " +
                 std::to_string(vsize(rank_->buckets())) + " buckets";
        const int bucket_group = rank_->buckets()->Get(uint32_t(b))->group();
        if (has_group && ints(0) != bucket_group)
          return "ints[0] is group " + std::to_string(ints(0)) + ", but bucket " +
                 std::to_string(b) + " is reduced over group " + std::to_string(bucket_group);
      }
      if (ins.op() == pl::Opcode::REDUCE_GRADS) {
        if (ints(2) != 0 && ints(2) != 1)
          return "ints[2] (scatter) is " + std::to_string(ints(2)) + "; it must be 0 or 1";
        if (!(floats(0) > 0.0 && floats(0) <= 1.0))
          return "floats[0] (scale) is " + std::to_string(floats(0)) + ", outside (0, 1]";
      }
      if (sharded && !rank_->distributed_optimizer())
        return "works on shards of the distributed optimizer, which " + rank_name_ +
               " does not use; recompile the plan with mtc";
      if (ins.op() == pl::Opcode::SHARDED_ADAMW && rank_->shard_exp_avg_sq_offset() < 0)
        return "updates Adam's moments, but " + rank_name_ +
               " keeps one optimizer state tensor (SGD's); recompile the plan with mtc";
      break;
    }
    case pl::Opcode::SEND:
    case pl::Opcode::RECV:
    case pl::Opcode::ALL_REDUCE_TIED_GRAD: {
      const int64_t peer = ints(0), pp = std::max(1, plan_.pipeline_parallel());
      if (peer < 0 || peer >= pp || peer == rank_->pp_rank())
        return "ints[0] is pipeline rank " + std::to_string(peer) + ", but " + rank_name_ +
               " is pipeline rank " + std::to_string(rank_->pp_rank()) + " of " +
               std::to_string(pp) + "; the peer must be another of them";
      if (ints(1) < 0)
        return "ints[1] (tag) is negative";
      break;
    }
    case pl::Opcode::ROPE:
    case pl::Opcode::ROPE_GRAD:
    case pl::Opcode::SPLIT_QKV_ROPE:
    case pl::Opcode::SPLIT_QKV_ROPE_GRAD:
      if (!(floats(0) > 1.0))
        return "floats[0] (base) is " + std::to_string(floats(0)) + "; it must exceed 1";
      if (!(floats(1) == 0.0 || floats(1) >= 1.0))
        return "floats[1] (RoPE scaling factor) is " + std::to_string(floats(1)) +
               "; it must be 0 (no scaling) or at least 1";
      break;
    case pl::Opcode::LAYER_NORM:
    case pl::Opcode::RMS_NORM:
    case pl::Opcode::LAYER_NORM_GRAD:
    case pl::Opcode::RMS_NORM_GRAD:
      if (floats(1) != 0.0 && floats(1) != 1.0)
        return "floats[1] (weight offset) is " + std::to_string(floats(1)) +
               "; it must be 0, or 1 (weights applied as 1 + w)";
      break;
    case pl::Opcode::MOE_ROUTER:
    case pl::Opcode::MOE_ROUTER_GRAD: {
      // plan.fbs: topk, score_function, pre_softmax, load_balancing,
      // capacity, drop_policy, pad_to_capacity, seq_length, router_dtype.
      struct Range {
        const char *name;
        int64_t lo, hi;
        const char *meaning;
      };
      static constexpr Range kRouterInts[] = {
          {"topk", 1, kMaxElements, "at least 1"},
          {"score_function", 0, 1, "0 (softmax) or 1 (sigmoid)"},
          {"pre_softmax", 0, 1, "0 or 1"},
          {"load_balancing", 0, 2, "0 (none), 1 (aux_loss) or 2 (seq_aux_loss)"},
          {"capacity", 0, kMaxElements, "0 (no capacity) or a token count"},
          {"drop_policy", 0, 1, "0 (probs) or 1 (position)"},
          {"pad_to_capacity", 0, 1, "0 or 1"},
          {"seq_length", 1, kMaxElements, "at least 1"},
          {"router_dtype", 0, 2, "0 (the logits' type), 1 (fp32) or 2 (fp64)"}};
      for (size_t k = 0; k < std::size(kRouterInts); ++k)
        if (ints(k) < kRouterInts[k].lo || ints(k) > kRouterInts[k].hi)
          return "ints[" + std::to_string(k) + "] (" + kRouterInts[k].name + ") is " +
                 std::to_string(ints(k)) + "; it must be " + kRouterInts[k].meaning;
      if (ints(6) == 1 && ints(4) == 0)
        return "ints[6] (pad_to_capacity) is 1 without a capacity (ints[4] is 0)";
      if (ints(9) != -1 && ints(9) != 1)
        return "ints[9] (count_group) is " + std::to_string(ints(9)) +
               "; it must be -1 (none) or 1 (tp)";
      if (ints(9) == 1 && plan_.tensor_parallel() < 2)
        return "sums its token counts over tensor-parallel ranks (ints[9] count_group 1), but "
               "the plan has tensor_parallel " + std::to_string(plan_.tensor_parallel());
      static constexpr const char *kRouterFloats[] = {"scaling_factor", "aux_loss_coeff",
                                                      "z_loss_coeff"};
      for (size_t k = 0; k < 3; ++k)
        if (floats(k) < 0)
          return "floats[" + std::to_string(k) + "] (" + kRouterFloats[k] + ") is " +
                 std::to_string(floats(k)) + "; it must be >= 0 (0: off)";
      break;
    }
    case pl::Opcode::MOE_PERMUTE:
      if (ints(0) < 0 || ints(0) > kMaxElements)
        return "ints[0] (capacity) is " + std::to_string(ints(0)) +
               "; it must be 0 (no capacity) or a token count";
      if (ints(1) != 0 && ints(1) != 1)
        return "ints[1] (pad_to_capacity) is " + std::to_string(ints(1)) + "; it must be 0 or 1";
      if (ints(1) == 1 && ints(0) == 0)
        return "ints[1] (pad_to_capacity) is 1 without a capacity (ints[0] is 0)";
      break;
    case pl::Opcode::MOE_DISPATCH:
    case pl::Opcode::MOE_COMBINE: {
      // The exchange's ranks: etp x ep of them, group 4 (ep) at etp 1 and
      // group 7 (tp_ep, the same ranks there) at any etp.
      const int64_t etp = plan_.expert_tensor_parallel(), ep = plan_.expert_model_parallel();
      if (ints(3) != etp)
        return "ints[3] (etp) is " + std::to_string(ints(3)) + ", but the plan has "
               "expert_tensor_parallel " + std::to_string(etp);
      if (ints(0) != 4 && ints(0) != 7)
        return "ints[0] is group " + std::to_string(ints(0)) +
               "; tokens travel within group 4 (ep) or 7 (tp_ep)";
      if (ints(0) == 4 && etp != 1)
        return "ints[0] is group 4 (ep), but with expert_tensor_parallel " + std::to_string(etp) +
               " tokens travel within group 7 (tp_ep)";
      if (ep * etp < 2)
        return "exchanges tokens between expert-parallel ranks, but the plan has "
               "expert_model_parallel " + std::to_string(ep) + " x expert_tensor_parallel " +
               std::to_string(etp);
      if (ints(1) < 1 || ints(1) > kMaxElements)
        return "ints[1] (num_local_experts) is " + std::to_string(ints(1)) + "; it must be >= 1";
      if (ints(2) != 0 && ints(2) != 1)
        return "ints[2] (dispatcher) is " + std::to_string(ints(2)) +
               "; it must be 0 (alltoall) or 1 (allgather)";
      break;
    }
    case pl::Opcode::GROUP_GRAD_NORM:
      if (ints(0) != 3)
        return "ints[0] is group " + std::to_string(ints(0)) +
               "; this mtrun sums gradient norms over group 3 (mp)";
      break;
    case pl::Opcode::FUSED: {
      int64_t k = ints(0);
      if (k < 0 || uint64_t(k) >= vsize(plan_.kernels()))
        return "ints[0] is kernel " + std::to_string(k) + ", but the plan has " +
               std::to_string(vsize(plan_.kernels())) + " kernels";
      break;
    }
    default:
      break;
    }
    return "";
  }

  std::string check_fused(const Scope &outer, const pl::Instruction &ins) {
    if (outer.kernel)
      return "a kernel's cpu_instructions cannot contain FUSED";
    const uint32_t index = uint32_t(ins.ints()->Get(0));
    const pl::Kernel &kern = *plan_.kernels()->Get(index);
    const size_t nin = vsize(ins.in()), nout = vsize(ins.out());
    Scope s;
    s.name = rank_name_ + ", kernel " + std::to_string(index) + " (" +
             (kern.name() ? kern.name()->str() : std::string("unnamed")) + ")";
    s.values = kern.cpu_values();
    s.arena_limit = kern.cpu_scratch_bytes();
    s.bound_in = nin;
    s.bound_out = nout;
    s.kernel = true;
    if (s.num_values() < nin + nout)
      return "binds " + std::to_string(nin + nout) + " operands, but kernel " +
             std::to_string(index) + " has " + std::to_string(s.num_values()) + " cpu_values";
    // The scratch holds the kernel's interior values, each aligned: it can
    // need no more than their sizes plus alignment (a bound that keeps a
    // corrupt size from turning into an allocation).
    uint64_t interior = 0;
    for (uint32_t i = uint32_t(nin + nout); i < s.num_values(); ++i) {
      const pl::Value &v = *s.values->Get(i);
      if (v.region() == pl::Region::ARENA)
        interior += uint64_t(element_count(v)) * element_bytes(v.dtype()) + 256;
    }
    if (kern.cpu_scratch_bytes() > interior)
      return "kernel " + std::to_string(index) + " asks for " +
             std::to_string(kern.cpu_scratch_bytes()) + " scratch bytes, more than its " +
             "interior values can use (" + std::to_string(interior) + ")";
    // A kernel is checked once per binding arity in this rank.
    const bool first = checked_kernels_.insert({rank_, index, nin, nout}).second;
    if (first)
      for (uint32_t i = 0; i < s.num_values(); ++i)
        if (std::string e = check_value(s, i); !e.empty())
          return e;
    for (size_t k = 0; k < nin + nout; ++k) {
      uint32_t v = k < nin ? ins.in()->Get(k) : ins.out()->Get(k - nin);
      const pl::Value &outer_v = *outer.value(v);
      const pl::Value &kv = *s.value(uint32_t(k));
      if (kv.dtype() != outer_v.dtype() || element_count(kv) != element_count(outer_v))
        return (k < nin ? "in[" + std::to_string(k) : "out[" + std::to_string(k - nin)) +
               "] (" + describe(outer, v) + ") does not match the kernel's cpu_values[" +
               std::to_string(k) + "] (" + describe(s, uint32_t(k)) + ")";
    }
    if (!first)
      return "";
    std::vector<char> written(s.num_values(), 0);
    for (size_t k = 0; k < nin; ++k)
      written[k] = 1;
    if (std::string e = check_instructions(s, kern.cpu_instructions(), written); !e.empty())
      return e;
    for (size_t k = nin; k < nin + nout; ++k)
      if (!written[k])
        return s.name + ": cpu_values[" + std::to_string(k) +
               "] is bound to an output but no cpu_instruction writes it";
    return "";
  }

  // The shape relations the executor relies on to stay within every buffer.
  std::string check_shapes(const Scope &s, const pl::Instruction &ins) {
    auto in = [&](size_t k) -> const pl::Value & { return *s.value(ins.in()->Get(k)); };
    auto out = [&](size_t k) -> const pl::Value & { return *s.value(ins.out()->Get(k)); };
    auto par = [&](size_t k) -> const pl::Param & {
      return *rank_->params()->Get(ins.params()->Get(k));
    };
    auto rank = [](const flatbuffers::Vector<int64_t> *sh) { return int64_t(vsize(sh)); };
    auto dim = [](const flatbuffers::Vector<int64_t> *sh, int64_t i) -> int64_t {
      int64_t r = int64_t(vsize(sh));
      if (i < 0)
        i += r;
      return i >= 0 && i < r ? sh->Get(uint32_t(i)) : -1;
    };
    auto n = [](const pl::Value &v) { return element_count(v); };
    auto last = [&](const pl::Value &v) { return dim(v.shape(), -1); };
    auto all = [&]() {
      std::string t;
      for (size_t k = 0; k < vsize(ins.in()); ++k)
        t += (t.empty() ? "" : ", ") + describe(s, ins.in()->Get(k));
      if (vsize(ins.out()))
        t += " -> ";
      for (size_t k = 0; k < vsize(ins.out()); ++k)
        t += (k ? ", " : "") + describe(s, ins.out()->Get(k));
      for (size_t k = 0; k < vsize(ins.params()); ++k)
        t += std::string(k ? ", " : "; params ") + shape_text(par(k).shape());
      return t;
    };
    auto bad = [&](const char *rule) { return std::string("needs ") + rule + ", got " + all(); };

    switch (ins.op()) {
    case pl::Opcode::POSITION_IDS:
      if (rank(out(0).shape()) < 1)
        return bad("ids[b, s]");
      break;
    case pl::Opcode::EMBEDDING: {
      int64_t h = dim(in(0).shape(), 1);
      if (rank(in(0).shape()) != 2 || last(out(0)) != h || n(out(0)) != n(in(1)) * h)
        return bad("table[v, h], ids[...] -> y[..., h]");
      break;
    }
    case pl::Opcode::LAYER_NORM:
    case pl::Opcode::RMS_NORM: {
      int64_t h = last(in(0));
      bool ok = h > 0 && n(in(1)) == h && n(out(0)) == n(in(0));
      if (ins.op() == pl::Opcode::LAYER_NORM)
        ok = ok && n(in(2)) == h;
      if (!ok)
        return bad("x[..., h], weights of h elements -> y shaped as x");
      break;
    }
    case pl::Opcode::MATMUL: {
      const auto *w = in(1).shape();
      int64_t o = dim(w, 0), i = dim(w, 1);
      if (rank(w) != 2 || last(in(0)) != i || last(out(0)) != o ||
          n(in(0)) / i != n(out(0)) / o)
        return bad("x[..., in], w[out, in] -> y[..., out]");
      break;
    }
    case pl::Opcode::BIAS_ADD:
      if (last(in(0)) < 1 || n(in(1)) != last(in(0)) || n(out(0)) != n(in(0)))
        return bad("x[..., h], b[h] -> y shaped as x");
      break;
    case pl::Opcode::ADD:
      if (n(in(0)) != n(in(1)) || n(out(0)) != n(in(0)))
        return bad("a, b and y of one element count");
      break;
    case pl::Opcode::GELU:
    case pl::Opcode::DROPOUT:
      if (n(out(0)) != n(in(0)))
        return bad("x and y of one element count");
      break;
    case pl::Opcode::RESHAPE:
      if (n(out(0)) != n(in(0)) || out(0).dtype() != in(0).dtype())
        return bad("x and y of one element count and dtype");
      break;
    case pl::Opcode::SWIGLU:
      if (last(in(0)) % 2 != 0 || last(out(0)) * 2 != last(in(0)) || n(out(0)) * 2 != n(in(0)))
        return bad("x[..., 2f] -> y[..., f]");
      break;
    case pl::Opcode::ALL_REDUCE:
      if (n(out(0)) != n(in(0)) || out(0).dtype() != in(0).dtype())
        return bad("x and y of one element count and dtype");
      break;
    case pl::Opcode::SEQ_ALL_GATHER:
    case pl::Opcode::SEQ_REDUCE_SCATTER:
    case pl::Opcode::SEQ_SPLIT: {
      // The sequence dimension (1) changes by the group size; nothing else.
      const int64_t t = plan_.tensor_parallel();
      const pl::Value &small = ins.op() == pl::Opcode::SEQ_ALL_GATHER ? in(0) : out(0);
      const pl::Value &big = ins.op() == pl::Opcode::SEQ_ALL_GATHER ? out(0) : in(0);
      bool ok = rank(small.shape()) >= 2 && rank(big.shape()) == rank(small.shape()) &&
                small.dtype() == big.dtype();
      for (int64_t d = 0; ok && d < rank(big.shape()); ++d)
        ok = dim(big.shape(), d) == dim(small.shape(), d) * (d == 1 ? t : 1);
      if (!ok)
        return bad("[b, s, ...] and [b, s / tensor_parallel, ...] of one dtype");
      break;
    }
    case pl::Opcode::SPLIT_QKV:
      if (!qkv_ok(in(0), out(0), out(1), out(2)))
        return bad("qkv[n, groups * (heads/groups + 2) * d] -> q[..., heads, d], "
                   "k[..., groups, d], v[..., groups, d] with groups dividing heads");
      break;
    case pl::Opcode::SPLIT_QKV_GRAD:
      if (!qkv_ok(out(0), in(0), in(1), in(2)))
        return bad("dq[..., heads, d], dk[..., groups, d], dv[..., groups, d] -> "
                   "dqkv[n, groups * (heads/groups + 2) * d] with groups dividing heads");
      break;
    case pl::Opcode::SPLIT_QKV_ROPE:
      if (!qkv_ok(in(0), out(0), out(1), out(2)) || !rope_qk_ok(out(0), out(1)))
        return bad("qkv[b, s, groups * (heads/groups + 2) * d] -> q[b, s, heads, d], "
                   "k[b, s, groups, d], v[b, s, groups, d] with groups dividing heads and "
                   "even d");
      break;
    case pl::Opcode::SPLIT_QKV_ROPE_GRAD:
      if (!qkv_ok(out(0), in(0), in(1), in(2)) || !rope_qk_ok(in(0), in(1)))
        return bad("dq[b, s, heads, d], dk[b, s, groups, d], dv[b, s, groups, d] -> "
                   "dqkv[b, s, groups * (heads/groups + 2) * d] with groups dividing heads "
                   "and even d");
      break;
    case pl::Opcode::ROPE:
    case pl::Opcode::ROPE_GRAD:
      if (rank(in(0).shape()) != 4 || last(in(0)) % 2 != 0 || n(out(0)) != n(in(0)))
        return bad("x[b, s, h, d] with even d -> y shaped as x");
      break;
    case pl::Opcode::ATTENTION:
      if (!attention_ok(in(0), in(1), in(2)) || !same_shape(out(0), in(0)) ||
          !lse_ok(in(0), out(1)))
        return bad("q[b, s, heads, d], k and v [b, s, groups, d] with groups dividing heads "
                   "-> o shaped as q, lse[b, heads, s]");
      break;
    case pl::Opcode::ATTENTION_GRAD:
      if (!attention_ok(in(1), in(2), in(3)) || !same_shape(in(0), in(1)) ||
          !same_shape(in(4), in(1)) || !lse_ok(in(1), in(5)) || n(out(0)) != n(in(1)) ||
          n(out(1)) != n(in(2)) || n(out(2)) != n(in(3)))
        return bad("dout, q and o [b, s, heads, d], k and v [b, s, groups, d], lse[b, heads, s] "
                   "-> dq, dk, dv shaped as q, k, v");
      break;
    case pl::Opcode::CROSS_ENTROPY:
      if (last(in(0)) < 1 || n(in(0)) != n(in(1)) * last(in(0)))
        return bad("logits[..., vocab], labels[...]");
      break;
    case pl::Opcode::CROSS_ENTROPY_GRAD:
      if (last(in(0)) < 1 || n(in(0)) != n(in(1)) * last(in(0)) || n(out(0)) != n(in(0)))
        return bad("logits[..., vocab], labels[...], dloss -> dlogits shaped as logits");
      break;
    case pl::Opcode::EMBEDDING_GRAD: {
      const auto *t = par(0).shape();
      if (rank(t) != 2 || last(in(0)) != dim(t, 1) || n(in(0)) != n(in(1)) * dim(t, 1))
        return bad("dy[..., h], ids[...] into table[v, h]");
      break;
    }
    case pl::Opcode::MATMUL_INPUT_GRAD: {
      const auto *w = in(1).shape();
      int64_t o = dim(w, 0), i = dim(w, 1);
      if (rank(w) != 2 || last(in(0)) != o || last(out(0)) != i ||
          n(in(0)) / o != n(out(0)) / i)
        return bad("dy[..., out], w[out, in] -> dx[..., in]");
      break;
    }
    case pl::Opcode::MATMUL_WEIGHT_GRAD: {
      const auto *w = par(0).shape();
      int64_t o = dim(w, 0), i = dim(w, 1);
      if (rank(w) != 2 || last(in(0)) != o || last(in(1)) != i ||
          n(in(0)) / o != n(in(1)) / i)
        return bad("dy[..., out], x[..., in] into w[out, in]");
      break;
    }
    case pl::Opcode::BIAS_GRAD:
      if (last(in(0)) < 1 || int64_t(param_numel(par(0))) != last(in(0)))
        return bad("dy[..., h] into b[h]");
      break;
    case pl::Opcode::LAYER_NORM_GRAD:
    case pl::Opcode::RMS_NORM_GRAD: {
      int64_t h = last(in(1));
      bool ok = h > 0 && n(in(0)) == n(in(1)) && n(out(0)) == n(in(1)) && n(in(2)) == h;
      for (size_t k = 0; k < vsize(ins.params()); ++k)
        ok = ok && int64_t(param_numel(par(k))) == h;
      if (!ok)
        return bad("dy and x [..., h], w[h] -> dx shaped as x, into parameters of h elements");
      break;
    }
    case pl::Opcode::GELU_GRAD:
      if (n(in(0)) != n(in(1)) || n(out(0)) != n(in(1)))
        return bad("dy, x and dx of one element count");
      break;
    case pl::Opcode::SWIGLU_GRAD:
      if (last(in(1)) != 2 * last(in(0)) || n(in(1)) != 2 * n(in(0)) || n(out(0)) != n(in(1)))
        return bad("dy[..., f], x[..., 2f] -> dx shaped as x");
      break;
    case pl::Opcode::MOE_ROUTER:
    case pl::Opcode::MOE_ROUTER_GRAD: {
      // The logits [T, E] and every [T, E] operand alike; T whole sequences.
      const bool fwd = ins.op() == pl::Opcode::MOE_ROUTER;
      const pl::Value &logits = fwd ? in(0) : in(1);
      const int64_t t = dim(logits.shape(), 0), e = dim(logits.shape(), 1);
      bool ok = rank(logits.shape()) == 2;
      auto te = [&](const pl::Value &v) { return same_shape(v, logits); };
      if (fwd)
        ok = ok && te(out(0)) && te(out(1));
      else
        ok = ok && te(in(0)) && te(in(2)) && te(in(3)) && te(out(0));
      if (!ok)
        return bad(fwd ? "logits[T, E] -> probs[T, E], routing_map[T, E], aux_loss, z_loss"
                       : "dprobs, logits, probs and routing_map [T, E], scale -> dlogits[T, E]");
      // fp64 (router_dtype 2) routes f64 logits, and only it does.
      if ((logits.dtype() == pl::DType::F64) != (ins.ints()->Get(8) == 2))
        return "ints[8] (router_dtype) is " + std::to_string(ins.ints()->Get(8)) +
               " with " + dtype_label(logits.dtype()) +
               " logits; fp64 (2) and f64 logits go together";
      if (!fwd && out(0).dtype() != logits.dtype())
        return bad("dlogits of the logits' type");
      const int64_t topk = ins.ints()->Get(0), capacity = ins.ints()->Get(4),
                    seq = ins.ints()->Get(7);
      if (topk > e)
        return "ints[0] (topk) is " + std::to_string(topk) + ", more than the " +
               std::to_string(e) + " experts of " + all();
      if (t % seq != 0)
        return "ints[7] (seq_length) " + std::to_string(seq) + " does not divide the " +
               std::to_string(t) + " tokens of " + all();
      // Megatron pads with capacity-many tokens per expert; more than T
      // would send every token to every expert and past its buffers.
      if (ins.ints()->Get(6) == 1 && capacity > t)
        return "ints[4] (capacity) " + std::to_string(capacity) +
               " with pad_to_capacity exceeds the " + std::to_string(t) + " tokens of " + all();
      break;
    }
    case pl::Opcode::MOE_PERMUTE: {
      const int64_t t = dim(in(0).shape(), 0), h = dim(in(0).shape(), 1);
      const int64_t e = dim(in(1).shape(), 1), rows = dim(out(0).shape(), 0);
      if (rank(in(0).shape()) != 2 || rank(in(1).shape()) != 2 || dim(in(1).shape(), 0) != t ||
          rank(out(0).shape()) != 2 || dim(out(0).shape(), 1) != h ||
          out(0).dtype() != in(0).dtype() || rank(out(1).shape()) != 1 ||
          dim(out(1).shape(), 0) != rows || rank(out(2).shape()) != 1 ||
          dim(out(2).shape(), 0) != e)
        return bad("x[T, H], routing_map[T, E] -> y[N, H] of x's dtype, row_ids[N], "
                   "tokens_per_expert[E]");
      const int64_t capacity = ins.ints()->Get(0);
      if (ins.ints()->Get(1) == 1) {
        if (capacity > t || rows != e * capacity)
          return "with pad_to_capacity, needs capacity (ints[0] " + std::to_string(capacity) +
                 ") at most T and N = E x capacity, got " + all();
      } else if (capacity > 0) {
        if (rows > std::min(t * e, e * capacity))
          return "with capacity " + std::to_string(capacity) +
                 " (ints[0]), needs N at most min(T x E, E x capacity), got " + all();
      } else if (rows % t != 0 || rows / t > e) {
        return "without a capacity, needs N = T x topk (topk at most E), got " + all();
      }
      break;
    }
    case pl::Opcode::MOE_PERMUTE_GRAD:
      if (rank(in(0).shape()) != 2 || rank(in(1).shape()) != 1 ||
          dim(in(1).shape(), 0) != dim(in(0).shape(), 0) || rank(out(0).shape()) != 2 ||
          dim(out(0).shape(), 1) != dim(in(0).shape(), 1))
        return bad("dy[N, H], row_ids[N] -> dx[T, H]");
      break;
    case pl::Opcode::GROUPED_MATMUL:
    case pl::Opcode::GROUPED_MATMUL_INPUT_GRAD:
    case pl::Opcode::GROUPED_MATMUL_WEIGHT_GRAD: {
      // x[N, K] and y[N, M] about w[E, M, K]; forward: in x, out y; input
      // grad: in dy, out dx; weight grad: in dy, x, into w.
      const auto *w = ins.op() == pl::Opcode::GROUPED_MATMUL_WEIGHT_GRAD ? par(0).shape()
                                                                         : in(1).shape();
      const pl::Value *x = nullptr, *y = nullptr;
      const char *rule = nullptr;
      switch (ins.op()) {
      case pl::Opcode::GROUPED_MATMUL:
        x = &in(0), y = &out(0), rule = "x[N, K], w[E, M, K], tokens_per_expert[E] -> y[N, M]";
        break;
      case pl::Opcode::GROUPED_MATMUL_INPUT_GRAD:
        y = &in(0), x = &out(0), rule = "dy[N, M], w[E, M, K], tokens_per_expert[E] -> dx[N, K]";
        break;
      default:
        y = &in(0), x = &in(1), rule = "dy[N, M], x[N, K], tokens_per_expert[E] into w[E, M, K]";
        break;
      }
      const pl::Value &tpe = in(2);
      if (rank(w) != 3 || rank(x->shape()) != 2 || rank(y->shape()) != 2 ||
          dim(x->shape(), 0) != dim(y->shape(), 0) || dim(x->shape(), 1) != dim(w, 2) ||
          dim(y->shape(), 1) != dim(w, 1) || rank(tpe.shape()) != 1 ||
          dim(tpe.shape(), 0) != dim(w, 0))
        return bad(rule);
      break;
    }
    case pl::Opcode::MOE_DISPATCH:
    case pl::Opcode::MOE_COMBINE: {
      // y[N, H], tokens_per_expert[E = ep L], rows[R, H], local_counts[L],
      // layout[S, L] with S = etp x ep sources.
      const bool fwd = ins.op() == pl::Opcode::MOE_DISPATCH;
      const pl::Value &y = fwd ? in(0) : out(0), &rows = fwd ? out(0) : in(0);
      const pl::Value &tpe = fwd ? in(1) : in(2), &layout = fwd ? out(2) : in(1);
      const int64_t ep = plan_.expert_model_parallel(), l = ins.ints()->Get(1);
      const int64_t sources = ep * plan_.expert_tensor_parallel();
      bool ok = rank(y.shape()) == 2 && rank(rows.shape()) == 2 &&
                dim(rows.shape(), 1) == dim(y.shape(), 1) && rows.dtype() == y.dtype() &&
                rank(tpe.shape()) == 1 && dim(tpe.shape(), 0) == ep * l &&
                rank(layout.shape()) == 2 && dim(layout.shape(), 0) == sources &&
                dim(layout.shape(), 1) == l;
      if (fwd)
        ok = ok && rank(out(1).shape()) == 1 && dim(out(1).shape(), 0) == l;
      if (!ok)
        return bad(fwd ? "y[N, H], tokens_per_expert[ep x num_local_experts] -> rows[R, H] of y's "
                         "dtype, local_counts[num_local_experts], layout[etp x ep, "
                         "num_local_experts]"
                       : "rows[R, H], layout[etp x ep, num_local_experts], tokens_per_expert[ep "
                         "x num_local_experts] -> y[N, H] of rows' dtype");
      break;
    }
    case pl::Opcode::MOE_UNPERMUTE:
    case pl::Opcode::MOE_UNPERMUTE_GRAD: {
      // y[N, H], probs[T, E], row_ids[N], tokens_per_expert[E], and out or
      // dout [T, H].
      const bool fwd = ins.op() == pl::Opcode::MOE_UNPERMUTE;
      const size_t o = fwd ? 0 : 1; // y's position among the inputs
      const pl::Value &y = in(o), &probs = in(o + 1), &rows = in(o + 2), &tpe = in(o + 3);
      const pl::Value &tokens = fwd ? out(0) : in(0);
      const int64_t n_rows = dim(y.shape(), 0), h = dim(y.shape(), 1);
      const int64_t t = dim(probs.shape(), 0), e = dim(probs.shape(), 1);
      bool ok = rank(y.shape()) == 2 && rank(probs.shape()) == 2 && rank(rows.shape()) == 1 &&
                dim(rows.shape(), 0) == n_rows && rank(tpe.shape()) == 1 &&
                dim(tpe.shape(), 0) == e && rank(tokens.shape()) == 2 &&
                dim(tokens.shape(), 0) == t && dim(tokens.shape(), 1) == h;
      if (fwd)
        ok = ok && out(0).dtype() == y.dtype();
      else
        ok = ok && same_shape(out(0), y) && out(0).dtype() == y.dtype() &&
             same_shape(out(1), probs);
      if (!ok)
        return bad(fwd ? "y[N, H], probs[T, E], row_ids[N], tokens_per_expert[E] -> out[T, H] "
                         "of y's dtype"
                       : "dout[T, H], y[N, H], probs[T, E], row_ids[N], tokens_per_expert[E] "
                         "-> dy[N, H] of y's dtype, dprobs[T, E]");
      break;
    }
    default:
      break; // scalars only (checked by kind) or no operands
    }
    return "";
  }

  static bool qkv_ok(const pl::Value &qkv, const pl::Value &q, const pl::Value &k,
                     const pl::Value &v) {
    auto d2 = [](const pl::Value &x, int from_end) {
      size_t r = vsize(x.shape());
      return r >= 2 ? x.shape()->Get(uint32_t(r - from_end)) : -1;
    };
    int64_t heads = d2(q, 2), d = d2(q, 1), groups = d2(k, 2);
    if (heads < 1 || groups < 1 || heads % groups != 0 || d2(k, 1) != d || d2(v, 1) != d ||
        d2(v, 2) != groups)
      return false;
    int64_t n = element_count(q) / (heads * d);
    return element_count(k) == n * groups * d && element_count(v) == n * groups * d &&
           element_count(qkv) == n * groups * (heads / groups + 2) * d;
  }

  // Rotation after the split reads positions from q's and k's [b, s, ...]
  // and rotates pairs of each head: both rank 4, one batch and sequence, d
  // even (qkv_ok has checked the rest).
  // Dimension i of a value whose rank the caller checked.
  static int64_t extent(const pl::Value &x, uint32_t i) { return x.shape()->Get(i); }

  static bool same_shape(const pl::Value &a, const pl::Value &b) {
    return shape_text(a.shape()) == shape_text(b.shape());
  }

  static bool rope_qk_ok(const pl::Value &q, const pl::Value &k) {
    if (vsize(q.shape()) != 4 || vsize(k.shape()) != 4)
      return false;
    return extent(q, 0) == extent(k, 0) && extent(q, 1) == extent(k, 1) && extent(q, 3) % 2 == 0;
  }

  static bool attention_ok(const pl::Value &q, const pl::Value &k, const pl::Value &v) {
    if (vsize(q.shape()) != 4 || vsize(k.shape()) != 4 || !same_shape(k, v))
      return false;
    return extent(k, 0) == extent(q, 0) && extent(k, 1) == extent(q, 1) &&
           extent(k, 3) == extent(q, 3) && extent(q, 2) % extent(k, 2) == 0;
  }

  // The forward's log-sum-exp: [batch, heads, seq] of q [batch, seq, heads, d].
  static bool lse_ok(const pl::Value &q, const pl::Value &lse) {
    return vsize(lse.shape()) == 3 && extent(lse, 0) == extent(q, 0) &&
           extent(lse, 1) == extent(q, 2) && extent(lse, 2) == extent(q, 1);
  }

  const pl::Plan &plan_;
  const pl::Rank *rank_ = nullptr;
  std::string rank_name_;
  std::vector<std::pair<int64_t, int64_t>> shards_; // buckets' shard state ranges
  std::set<std::tuple<const pl::Rank *, uint32_t, size_t, size_t>> checked_kernels_;
};

} // namespace

namespace detail {

std::string grouped(uint64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return out;
}

std::string verify_plan(const pl::Plan &plan) { return Checker(plan).check(); }

} // namespace detail

} // namespace mt::rt
