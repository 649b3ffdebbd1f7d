// The CPU reference executor (see cpu_executor.h): one switch over opcodes,
// shapes taken from the values, arithmetic in runtime/exec/cpu_kernels.
#include "runtime/exec/cpu_executor.h"

#include "runtime/exec/cpu_kernels.h"
#include "runtime/plan/grad_buckets.h"
#include "runtime/plan/plan_reader.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <unordered_map>
#include <vector>

namespace mt::rt {

namespace pl = mt::plan;

namespace {

using Values = flatbuffers::Vector<flatbuffers::Offset<pl::Value>>;

template <class T> size_t vsize(const flatbuffers::Vector<T> *v) { return v ? v->size() : 0; }

bool is_half(pl::DType d) { return d == pl::DType::BF16 || d == pl::DType::F16; }

// Bytes per element in the CPU layout: every float type is held as f32.
size_t cpu_element_bytes(pl::DType d) { return is_float_dtype(d) ? 4 : element_bytes(d); }

// A 64-byte-aligned, zero-filled allocation.
class Buffer {
public:
  explicit Buffer(uint64_t bytes, const char *what) : size_(bytes) {
    if (bytes == 0)
      return;
    uint64_t rounded = (bytes + 63) / 64 * 64;
    data_ = static_cast<uint8_t *>(std::aligned_alloc(64, rounded));
    if (!data_) {
      std::fprintf(stderr, "mtrun: error: cannot allocate the %s (%llu bytes) on the CPU\n", what,
                   static_cast<unsigned long long>(bytes));
      std::abort();
    }
    std::memset(data_, 0, rounded);
  }
  ~Buffer() { std::free(data_); }
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;
  uint8_t *data() const { return data_; }
  uint64_t size() const { return size_; }

private:
  uint8_t *data_ = nullptr;
  uint64_t size_ = 0;
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
  void assign(uint64_t begin, uint64_t end, Owner o) {
    o.end = end;
    auto it = map_.lower_bound(begin);
    if (it != map_.begin()) {
      auto prev = std::prev(it);
      if (prev->second.end > begin) {
        Owner tail = prev->second;
        prev->second.end = begin;
        if (tail.end > end)
          map_[end] = tail;
      }
    }
    while (it != map_.end() && it->first < end) {
      if (it->second.end > end) {
        Owner tail = it->second;
        map_.erase(it);
        map_[end] = tail;
        break;
      }
      it = map_.erase(it);
    }
    map_[begin] = o;
  }
  // The first part of [begin, end) not owned by `root`: its owner, or null
  // with *unwritten set when no value owns that byte.
  const Owner *foreign(uint64_t begin, uint64_t end, uint32_t root, bool *unwritten) const {
    *unwritten = false;
    uint64_t at = begin;
    auto it = map_.upper_bound(begin);
    if (it != map_.begin())
      --it;
    for (; at < end; ++it) {
      if (it == map_.end() || it->first > at) {
        *unwritten = true;
        return nullptr;
      }
      if (it->second.end <= at)
        continue;
      if (it->second.root != root)
        return &it->second;
      at = it->second.end;
    }
    return nullptr;
  }

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

LrSchedule lr_schedule_of(const pl::Instruction &ins) {
  auto i = [&](uint32_t k) { return ins.ints()->Get(k); };
  return {pl::LrStyle(i(0)), i(1), i(2), i(3), pl::WsdStyle(i(4)), i(5),
          ins.floats()->Get(0), ins.floats()->Get(1)};
}

// Megatron-LM's OptimizerParamScheduler.get_lr (init_lr 0) at `steps`
// optimizer steps taken; see cpu_executor.h for the convention. Megatron
// counts samples (`samples_per_step` a step): only inverse-square-root's
// clamps to 1 see them, every other style depends on ratios of steps.
double megatron_lr(const LrSchedule &s, int64_t steps) {
  const double max_lr = s.max_lr, min_lr = s.min_lr;
  if (s.warmup > 0 && steps <= s.warmup)
    return max_lr * double(steps) / double(s.warmup);
  if (s.style == pl::LrStyle::CONSTANT)
    return max_lr;
  if (steps > s.decay)
    return min_lr;
  if (s.style == pl::LrStyle::INVERSE_SQUARE_ROOT) {
    double w = double(std::max<int64_t>(s.warmup * s.samples_per_step, 1)),
           n = double(std::max<int64_t>(steps * s.samples_per_step, 1));
    return std::max(min_lr, max_lr * std::sqrt(w) / std::sqrt(n));
  }
  double ratio = double(steps - s.warmup) / double(s.decay - s.warmup);
  double coeff = 0;
  switch (s.style) {
  case pl::LrStyle::LINEAR: coeff = 1.0 - ratio; break;
  case pl::LrStyle::COSINE: coeff = 0.5 * (std::cos(M_PI * ratio) + 1.0); break;
  default: { // WSD: lr until its anneal starts
    const int64_t start = s.decay - s.wsd_decay;
    if (steps <= start) {
      coeff = 1.0;
      break;
    }
    const double r = double(steps - start) / double(s.wsd_decay);
    switch (s.wsd_style) {
    case pl::WsdStyle::LINEAR: coeff = 1.0 - r; break;
    case pl::WsdStyle::COSINE: coeff = 0.5 * (std::cos(M_PI * r) + 1.0); break;
    case pl::WsdStyle::EXPONENTIAL: coeff = 2.0 * std::pow(0.5, r) - 1.0; break;
    case pl::WsdStyle::MINUS_SQRT: coeff = 1.0 - std::sqrt(r); break;
    }
  }
  }
  return min_lr + coeff * (max_lr - min_lr);
}

// Index of the first id outside [0, limit), or -1.
int64_t first_out_of_range(const int32_t *ids, int64_t n, int64_t limit) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= limit)
      return i;
  return -1;
}

} // namespace

struct CpuExecutor::Impl {
  // Per program: CPU addresses of its values and, for --check-memory-plan,
  // the lifetime of each arena value.
  struct ProgramState {
    const pl::Program *program = nullptr;
    std::string name;
    Frame frame;
    std::vector<uint32_t> root;              // RESHAPE aliases -> the value owning the bytes
    std::vector<std::vector<uint32_t>> dead; // dead[i]: roots whose last reader is #i - 1
    std::vector<uint32_t> input_roots;
  };

  const pl::Plan &plan;
  const pl::Rank &rank;
  std::string rank_name;
  uint64_t arena_scale = 1, state_scale = 1;
  Buffer arena, state, scratch;
  std::vector<ProgramState> programs;
  std::unordered_map<const pl::Program *, size_t> program_index;
  uint64_t seed = 0;
  float loss_scale = 1.0f;
  const ParallelGroups *groups = nullptr;
  // The communicator of group number `g` (plan.fbs), or null with *error set
  // when the run has none for a group of several ranks.
  Communicator *group(int64_t g, std::string *error) const {
    Group which = Group(g);
    Communicator *c = groups ? groups->get(which) : nullptr;
    int size = groups ? groups->size(which) : 1;
    if (!c && size > 1)
      *error = std::string("needs the ") + group_name(which) + " group of " +
               std::to_string(size) + " ranks, but no communicator was given; run the plan "
               "with all its ranks (srun -n N, or mtrun --nproc N)";
    return c;
  }
  std::vector<uint64_t> micro_rng_offsets;
  std::vector<float> peer_grad; // ALL_REDUCE_TIED_GRAD's incoming copy
  bool check = false;
  OwnerMap owners;
  std::vector<float> clipped; // ADAMW's grad * clip_coeff
  std::vector<float> exchange; // sequence-parallel gathers and scatters
  std::vector<int64_t> local_row; // vocab-parallel embeddings' rows

  // This rank's place in its tensor-parallel group, from the plan's table.
  int64_t tp_size() const { return std::max(1, plan.tensor_parallel()); }
  int64_t tp_rank() const { return rank.tp_rank(); }

  // Sums doubles over a group whose collectives carry floats: each value
  // travels as a float and the float of its remainder, so the sum keeps
  // about 48 bits.
  std::string all_reduce_doubles(Communicator *c, std::vector<double> &v) {
    std::vector<float> parts(2 * v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      parts[2 * i] = float(v[i]);
      parts[2 * i + 1] = float(v[i] - double(parts[2 * i]));
    }
    if (std::string e = c->all_reduce(parts.data(), parts.size(), ReduceOp::Sum); !e.empty())
      return e;
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = double(parts[2 * i]) + double(parts[2 * i + 1]);
    return "";
  }

  // Vocab-parallel cross-entropy (Megatron's _VocabParallelCrossEntropy):
  // logits are [n, v] columns [r v, (r + 1) v) of the whole vocabulary; the
  // row maxima, the sums of exponentials and the label's logit are reduced
  // over the tensor-parallel group. Fills max[n], sum[n] and (when target is
  // not null) target[n].
  std::string vocab_parallel_stats(const float *logits, const int32_t *labels, int64_t n,
                                   int64_t v, std::vector<float> &max, std::vector<double> &sum,
                                   std::vector<double> *target) {
    std::string err;
    Communicator *tp = group(int64_t(Group::TP), &err);
    if (!tp)
      return err.empty() ? "is vocab parallel, but its tensor-parallel group has one rank" : err;
    const int64_t first = tp_rank() * v;
    max.assign(size_t(n), -INFINITY);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < v; ++j)
        max[size_t(i)] = std::max(max[size_t(i)], logits[i * v + j]);
    if (std::string e = tp->all_reduce(max.data(), max.size(), ReduceOp::Max); !e.empty())
      return e;
    sum.assign(size_t(n), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < v; ++j)
        sum[size_t(i)] += std::exp(double(logits[i * v + j]) - double(max[size_t(i)]));
    if (std::string e = all_reduce_doubles(tp, sum); !e.empty())
      return e;
    if (target) {
      target->assign(size_t(n), 0.0);
      for (int64_t i = 0; i < n; ++i)
        if (labels[i] >= first && labels[i] < first + v)
          (*target)[size_t(i)] = double(logits[i * v + (labels[i] - first)]);
      if (std::string e = all_reduce_doubles(tp, *target); !e.empty())
        return e;
    }
    return "";
  }

  // [b, s, rest] <-> per-rank blocks of [b, s / t, rest]: block r holds
  // positions [r s / t, (r + 1) s / t) of every sequence. `to_blocks` copies
  // from the sequence layout into blocks, else back.
  static void sequence_blocks(const float *src, float *dst, int64_t b, int64_t s_local,
                              int64_t rest, int64_t t, bool to_blocks) {
    const int64_t row = s_local * rest, block = b * row;
    for (int64_t r = 0; r < t; ++r)
      for (int64_t i = 0; i < b; ++i) {
        const int64_t seq_at = (i * t + r) * row, block_at = r * block + i * row;
        if (to_blocks)
          std::memcpy(dst + block_at, src + seq_at, size_t(row) * sizeof(float));
        else
          std::memcpy(dst + seq_at, src + block_at, size_t(row) * sizeof(float));
      }
  }

  // Data-parallel buckets: every segment of each bucket and those of the
  // shard this rank owns (distributed optimizer), from the plan's layout.
  struct BucketState {
    int64_t begin = 0, end = 0, state_at = 0;
    FlatRange shard{0, 0};
    std::vector<FlatSegment> all, own;
  };
  std::vector<BucketState> buckets;
  std::vector<float> packed, gathered; // contiguous staging for collectives
  int dp = 1, dp_rank = 0;

  void plan_buckets() {
    dp = std::max(1, plan.data_parallel());
    dp_rank = rank.dp_rank();
    std::vector<FlatParam> flat;
    for (uint32_t p = 0; p < vsize(rank.params()); ++p)
      if (param(p).flat_offset() >= 0)
        flat.push_back({p, param(p).flat_offset(), element_count(param(p).shape())});
    for (size_t b = 0; b < vsize(rank.buckets()); ++b) {
      const pl::Bucket &bk = *rank.buckets()->Get(uint32_t(b));
      BucketState s;
      s.begin = bk.begin();
      s.end = bk.end();
      s.all = flat_segments(flat, s.begin, s.end);
      s.shard = bucket_shard(s.begin, s.end, dp, dp_rank);
      s.own = flat_segments(flat, s.shard.begin, s.shard.end);
      s.state_at = shard_state_offset(s.begin, dp);
      buckets.push_back(std::move(s));
    }
  }
  // This rank's shard state (distributed optimizer), null when absent.
  float *shard_floats(int64_t offset) const {
    return rank.distributed_optimizer() ? state_floats(offset) : nullptr;
  }
  // The shard state element of flat element `e` of bucket `b`'s shard.
  int64_t shard_index(const BucketState &b, int64_t e) const {
    return b.state_at + (e - b.shard.begin);
  }
  // Copies segments of per-parameter buffers (`which`: weight or grad) into
  // `out` (flat element `base` at out[0]; uncovered elements zero), or back.
  void pack(const std::vector<FlatSegment> &segs, bool weights, int64_t base,
            std::vector<float> &out, int64_t n) {
    out.assign(size_t(n), 0.0f);
    for (const FlatSegment &g : segs) {
      const pl::Param &p = param(g.param);
      const float *src = state_floats(weights ? p.weight_offset() : p.grad_offset()) + g.param_begin;
      std::copy(src, src + g.count, out.data() + (g.flat_begin - base));
    }
  }
  void unpack(const std::vector<FlatSegment> &segs, bool weights, int64_t base,
              const float *in) {
    for (const FlatSegment &g : segs) {
      const pl::Param &p = param(g.param);
      float *dst = state_floats(weights ? p.weight_offset() : p.grad_offset()) + g.param_begin;
      const float *src = in + (g.flat_begin - base);
      std::copy(src, src + g.count, dst);
    }
  }

  std::string reduce_grads(const pl::Instruction &ins) {
    std::string err;
    Communicator *c = group(ins.ints()->Get(0), &err);
    if (!err.empty())
      return err;
    const BucketState &b = buckets[size_t(ins.ints()->Get(1))];
    const bool scatter = ins.ints()->Get(2) != 0;
    const float scale = float(ins.floats()->Get(0));
    const int64_t n = b.end - b.begin, shard = n / dp;
    pack(b.all, false, b.begin, packed, n);
    if (!scatter) {
      if (c)
        if (std::string e = c->all_reduce(packed.data(), size_t(n), ReduceOp::Sum); !e.empty())
          return e;
      cpu::scale(packed.data(), n, scale);
      unpack(b.all, false, b.begin, packed.data());
      return "";
    }
    gathered.assign(size_t(shard), 0.0f);
    if (c) {
      if (std::string e = c->reduce_scatter(packed.data(), size_t(shard), gathered.data());
          !e.empty())
        return e;
    } else {
      std::copy(packed.begin(), packed.end(), gathered.begin());
    }
    cpu::scale(gathered.data(), shard, scale);
    unpack(b.own, false, b.shard.begin, gathered.data());
    return "";
  }

  // Whether a parameter's gradient counts in the norm on this rank: every
  // tensor once (a tensor-parallel replica on tp rank 0, a pipeline stage's
  // tied copy not at all).
  bool counts_in_norm(uint32_t p) const {
    return param(p).in_grad_norm() && (param(p).tp_dim() >= 0 || tp_rank() == 0);
  }

  // GRAD_NORM and GROUP_GRAD_NORM: the squares of the gradients this rank
  // counts, summed over the model-parallel group (tensor and pipeline
  // ranks: the whole model), then the square root.
  std::string grad_norm(float *out) {
    double sum = 0;
    for (uint32_t p = 0; p < vsize(rank.params()); ++p)
      if (const float *g = state_floats(param(p).grad_offset()); g && counts_in_norm(p))
        sum += cpu::sum_squares(g, element_count(param(p).shape()));
    return model_norm(sum, out);
  }

  // The norm from this rank's sum of squares: summed over the
  // model-parallel group (the other tensor and pipeline shards), then the
  // square root.
  std::string model_norm(double sum, float *out) {
    std::string err;
    std::vector<double> total{sum};
    if (Communicator *mp = group(int64_t(Group::MP), &err))
      if (std::string e = all_reduce_doubles(mp, total); !e.empty())
        return e;
    if (!err.empty())
      return err;
    *out = float(std::sqrt(total[0]));
    return "";
  }

  std::string sharded_grad_norm(const pl::Instruction &ins, float *out) {
    std::string err;
    Communicator *c = group(ins.ints()->Get(0), &err);
    if (!err.empty())
      return err;
    // Parameters every tensor-parallel rank holds whole count on tp rank 0.
    double sum = 0;
    for (const BucketState &b : buckets)
      for (const FlatSegment &g : b.own)
        if (counts_in_norm(g.param))
          sum += cpu::sum_squares(state_floats(param(g.param).grad_offset()) + g.param_begin,
                                  g.count);
    // The other data-parallel ranks' shards, then the rest of the model.
    std::vector<double> total{sum};
    if (c)
      if (std::string e = all_reduce_doubles(c, total); !e.empty())
        return e;
    return model_norm(total[0], out);
  }

  std::string sharded_adamw(const pl::Instruction &ins, float lr, float clip, int64_t step) {
    if (step < 1)
      return "the step input is " + std::to_string(step) + "; AdamW counts steps from 1";
    const BucketState &b = buckets[size_t(ins.ints()->Get(0))];
    float *masters = shard_floats(rank.shard_master_offset());
    float *m = shard_floats(rank.shard_exp_avg_offset());
    float *v = shard_floats(rank.shard_exp_avg_sq_offset());
    for (const FlatSegment &g : b.own) {
      const pl::Param &p = param(g.param);
      const float *grad = state_floats(p.grad_offset()) + g.param_begin;
      if (clip != 1.0f) {
        clipped.resize(size_t(g.count));
        for (int64_t i = 0; i < g.count; ++i)
          clipped[size_t(i)] = grad[i] * clip;
        grad = clipped.data();
      }
      const int64_t at = shard_index(b, g.flat_begin);
      float *w = state_floats(p.weight_offset()) + g.param_begin;
      float *target = masters ? masters + at : w;
      cpu::AdamWParams a{lr, ins.floats()->Get(0), ins.floats()->Get(1), ins.floats()->Get(2),
                         p.weight_decay() ? ins.floats()->Get(3) : 0.0, step};
      cpu::adamw_step(target, grad, m + at, v + at, g.count, a);
      if (masters) {
        std::copy(target, target + g.count, w);
        if (p.dtype() == pl::DType::BF16)
          cpu::round_to_bf16(w, g.count);
        else if (p.dtype() == pl::DType::F16)
          cpu::round_to_fp16(w, g.count);
      }
    }
    return "";
  }

  std::string all_gather_params(const pl::Instruction &ins) {
    std::string err;
    Communicator *c = group(ins.ints()->Get(0), &err);
    if (!err.empty())
      return err;
    const BucketState &b = buckets[size_t(ins.ints()->Get(1))];
    const int64_t n = b.end - b.begin, shard = n / dp;
    pack(b.own, true, b.shard.begin, packed, shard);
    gathered.assign(size_t(n), 0.0f);
    if (c) {
      if (std::string e = c->all_gather(packed.data(), size_t(shard), gathered.data()); !e.empty())
        return e;
    } else {
      std::copy(packed.begin(), packed.end(), gathered.begin());
    }
    unpack(b.all, true, b.begin, gathered.data());
    return "";
  }

  static uint64_t scale_for_arena(const pl::Plan &plan, const pl::Rank &rank) {
    auto any_half = [](const Values *vals) {
      for (size_t i = 0; i < vsize(vals); ++i) {
        const pl::Value &v = *vals->Get(uint32_t(i));
        if (v.region() == pl::Region::ARENA && is_half(v.dtype()))
          return true;
      }
      return false;
    };
    for (size_t p = 0; p < vsize(rank.programs()); ++p)
      if (any_half(rank.programs()->Get(uint32_t(p))->values()))
        return 2;
    for (size_t k = 0; k < vsize(plan.kernels()); ++k)
      if (any_half(plan.kernels()->Get(uint32_t(k))->cpu_values()))
        return 2;
    return 1;
  }
  static uint64_t scale_for_state(const pl::Rank &rank) {
    for (size_t p = 0; p < vsize(rank.params()); ++p)
      if (is_half(rank.params()->Get(uint32_t(p))->dtype()))
        return 2;
    return 1;
  }
  static uint64_t max_scratch(const pl::Plan &plan) {
    uint64_t m = 0;
    for (size_t k = 0; k < vsize(plan.kernels()); ++k)
      m = std::max<uint64_t>(m, plan.kernels()->Get(uint32_t(k))->cpu_scratch_bytes());
    return m;
  }

  Impl(const pl::Plan &p, const pl::Rank &r)
      : plan(p), rank(r), rank_name("rank " + std::to_string(r.rank())),
        arena_scale(scale_for_arena(p, r)), state_scale(scale_for_state(r)),
        arena(r.arena_bytes() * arena_scale, "activation arena"),
        state(r.state_bytes() * state_scale, "parameter state"),
        scratch(max_scratch(p) * arena_scale, "kernel scratch") {
    programs.resize(vsize(r.programs()));
    for (size_t i = 0; i < programs.size(); ++i) {
      const pl::Program *prog = r.programs()->Get(uint32_t(i));
      ProgramState &ps = programs[i];
      ps.program = prog;
      ps.name = prog->name() ? prog->name()->str() : "";
      ps.frame.values = prog->values();
      ps.frame.ptr.resize(vsize(prog->values()));
      for (uint32_t v = 0; v < ps.frame.ptr.size(); ++v)
        ps.frame.ptr[v] = address(ps.frame.value(v), arena.data());
      plan_lifetimes(ps);
      program_index[prog] = i;
    }
    plan_buckets();
  }

  const pl::Param &param(uint32_t i) const { return *rank.params()->Get(i); }

  float *state_floats(int64_t offset) const {
    return offset < 0 ? nullptr
                      : reinterpret_cast<float *>(state.data() + uint64_t(offset) * state_scale);
  }

  // CPU address of a value whose ARENA offsets are relative to `base`.
  uint8_t *address(const pl::Value &v, uint8_t *base) const {
    switch (v.region()) {
    case pl::Region::ARENA:
      return base + v.offset() * arena_scale;
    case pl::Region::WEIGHT:
      return reinterpret_cast<uint8_t *>(state_floats(param(uint32_t(v.offset())).weight_offset()));
    case pl::Region::GRAD:
      return reinterpret_cast<uint8_t *>(state_floats(param(uint32_t(v.offset())).grad_offset()));
    }
    return nullptr;
  }

  bool in_arena(const Frame &f, uint32_t v) const {
    return f.value(v).region() == pl::Region::ARENA;
  }

  // Lifetimes per cpu_executor.h: defined at the first write, dead after the
  // last read; inputs from the start, outputs to the end.
  void plan_lifetimes(ProgramState &ps) {
    const pl::Program &prog = *ps.program;
    const Frame &f = ps.frame;
    const size_t nv = f.ptr.size(), ni = vsize(prog.instructions());
    ps.root.resize(nv);
    for (uint32_t v = 0; v < nv; ++v)
      ps.root[v] = v;
    for (size_t i = 0; i < ni; ++i) {
      const pl::Instruction &ins = *prog.instructions()->Get(uint32_t(i));
      // A result on its source's very bytes (out0_may_alias_in0) owns them
      // from then on: one lifetime for both.
      if (!out0_may_alias_in0(ins.op()))
        continue;
      uint32_t x = ins.in()->Get(0), y = ins.out()->Get(0);
      if (in_arena(f, x) && in_arena(f, y) && f.value(x).offset() == f.value(y).offset())
        ps.root[y] = ps.root[x];
    }
    std::vector<int64_t> def(nv, LLONG_MAX), last(nv, -1);
    for (size_t k = 0; k < vsize(prog.inputs()); ++k) {
      uint32_t r = ps.root[prog.inputs()->Get(uint32_t(k))];
      def[r] = -1;
      ps.input_roots.push_back(r);
    }
    for (size_t i = 0; i < ni; ++i) {
      const pl::Instruction &ins = *prog.instructions()->Get(uint32_t(i));
      for (size_t k = 0; k < vsize(ins.out()); ++k) {
        uint32_t r = ps.root[ins.out()->Get(uint32_t(k))];
        def[r] = std::min<int64_t>(def[r], int64_t(i));
      }
      for (size_t k = 0; k < vsize(ins.in()); ++k) {
        uint32_t r = ps.root[ins.in()->Get(uint32_t(k))];
        last[r] = std::max<int64_t>(last[r], int64_t(i));
      }
    }
    for (size_t k = 0; k < vsize(prog.outputs()); ++k)
      last[ps.root[prog.outputs()->Get(uint32_t(k))]] = int64_t(ni);
    ps.dead.assign(ni + 1, {});
    for (uint32_t v = 0; v < nv; ++v) {
      if (ps.root[v] != v || !in_arena(f, v) || def[v] == LLONG_MAX)
        continue;
      int64_t end = std::max(last[v], def[v]);
      if (end + 1 <= int64_t(ni) && end + 1 >= 0)
        ps.dead[size_t(end + 1)].push_back(v);
    }
  }

  // Plan-space byte range of an arena value.
  static std::pair<uint64_t, uint64_t> range(const Frame &f, uint32_t v) {
    const pl::Value &val = f.value(v);
    return {val.offset(), val.offset() + plan_bytes(val)};
  }

  void poison(uint64_t begin, uint64_t end) {
    if (end > begin)
      std::memset(arena.data() + begin * arena_scale, 0xff, (end - begin) * arena_scale);
  }

  // Fills every arena byte outside the inputs, which the caller has written.
  void poison_all_but_inputs(const ProgramState &ps) {
    std::vector<std::pair<uint64_t, uint64_t>> keep;
    for (uint32_t r : ps.input_roots)
      keep.push_back(range(ps.frame, r));
    std::sort(keep.begin(), keep.end());
    uint64_t at = 0;
    for (auto [b, e] : keep) {
      poison(at, std::max(at, b));
      at = std::max(at, e);
    }
    poison(at, rank.arena_bytes());
  }

  // Owner-map checks before instruction #i; "" or the violation.
  std::string check_before(const ProgramState &ps, const pl::Instruction &ins, size_t i) {
    const Frame &f = ps.frame;
    auto who = [&]() { return rank_name + ": memory plan violation: " + ps.name + " " +
                              instruction_label(ins, i); };
    for (size_t k = 0; k < vsize(ins.in()); ++k) {
      uint32_t v = ins.in()->Get(uint32_t(k));
      if (!in_arena(f, v))
        continue;
      auto [b, e] = range(f, v);
      bool unwritten = false;
      const OwnerMap::Owner *o = owners.foreign(b, e, ps.root[v], &unwritten);
      if (unwritten)
        return who() + " reads " + value_label(&f.value(v), v) +
               " but part of its bytes were never written";
      if (o) {
        std::string at = "before the program started"; // overlapping inputs
        if (o->instruction >= 0) {
          const size_t j = size_t(o->instruction);
          at = "at " + instruction_label(*ps.program->instructions()->Get(uint32_t(j)), j);
        }
        return who() + " reads " + value_label(&f.value(v), v) + " whose bytes were overwritten by " +
               value_label(&f.value(o->value), o->value) + " " + at;
      }
    }
    return "";
  }

  void record_after(const ProgramState &ps, const pl::Instruction &ins, size_t i) {
    for (size_t k = 0; k < vsize(ins.out()); ++k) {
      uint32_t y = ins.out()->Get(uint32_t(k));
      auto [b, e] = range(ps.frame, y);
      owners.assign(b, e, {0, y, ps.root[y], int64_t(i)});
    }
  }

  std::string run(const ProgramState &ps, uint64_t rng_offset) {
    const pl::Program &prog = *ps.program;
    const size_t ni = vsize(prog.instructions());
    if (check) {
      poison_all_but_inputs(ps);
      owners.clear();
      for (uint32_t r : ps.input_roots) {
        auto [b, e] = range(ps.frame, r);
        owners.assign(b, e, {0, r, r, -1});
      }
    }
    for (size_t i = 0; i < ni; ++i) {
      const pl::Instruction &ins = *prog.instructions()->Get(uint32_t(i));
      if (check) {
        for (uint32_t r : ps.dead[i])
          poison(range(ps.frame, r).first, range(ps.frame, r).second);
        if (std::string e = check_before(ps, ins, i); !e.empty())
          return e;
      }
      // An unrolled pipeline step's instructions use their micro-batch's offset.
      const int32_t mb = ins.micro_batch();
      const uint64_t offset =
          mb >= 0 && size_t(mb) < micro_rng_offsets.size() ? micro_rng_offsets[size_t(mb)]
                                                           : rng_offset;
      std::string e = execute(ins, ps.frame, offset);
      if (!e.empty())
        return rank_name + ": " + ps.name + " " + instruction_label(ins, i) + ": " + e;
      if (check)
        record_after(ps, ins, i);
    }
    return "";
  }

  // Runs a FUSED instruction's kernel over the outer frame's operands.
  std::string run_kernel(const pl::Instruction &ins, const Frame &outer, uint64_t rng_offset) {
    const uint32_t index = uint32_t(ins.ints()->Get(0));
    const pl::Kernel &kern = *plan.kernels()->Get(index);
    const size_t nin = vsize(ins.in()), nout = vsize(ins.out());
    Frame f;
    f.values = kern.cpu_values();
    f.ptr.resize(vsize(f.values));
    for (size_t k = 0; k < nin; ++k)
      f.ptr[k] = outer.ptr[ins.in()->Get(uint32_t(k))];
    for (size_t k = 0; k < nout; ++k)
      f.ptr[nin + k] = outer.ptr[ins.out()->Get(uint32_t(k))];
    for (size_t v = nin + nout; v < f.ptr.size(); ++v)
      f.ptr[v] = address(f.value(uint32_t(v)), scratch.data());
    if (check)
      std::memset(scratch.data(), 0xff, kern.cpu_scratch_bytes() * arena_scale);
    for (size_t i = 0; i < vsize(kern.cpu_instructions()); ++i) {
      const pl::Instruction &sub = *kern.cpu_instructions()->Get(uint32_t(i));
      if (std::string e = execute(sub, f, rng_offset); !e.empty())
        return "kernel " + std::to_string(index) + " (" +
               (kern.name() ? kern.name()->str() : std::string()) + ") " +
               instruction_label(sub, i) + ": " + e;
    }
    return "";
  }

  // Executes one verified instruction; "" or what went wrong (the caller
  // names the instruction).
  std::string execute(const pl::Instruction &ins, const Frame &f, uint64_t rng_offset) {
    auto vin = [&](size_t k) -> const pl::Value & { return f.value(ins.in()->Get(uint32_t(k))); };
    auto vout = [&](size_t k) -> const pl::Value & { return f.value(ins.out()->Get(uint32_t(k))); };
    auto fin = [&](size_t k) { return reinterpret_cast<const float *>(f.ptr[ins.in()->Get(uint32_t(k))]); };
    auto fout = [&](size_t k) { return reinterpret_cast<float *>(f.ptr[ins.out()->Get(uint32_t(k))]); };
    auto iin = [&](size_t k) { return reinterpret_cast<const int32_t *>(f.ptr[ins.in()->Get(uint32_t(k))]); };
    auto lin = [&](size_t k) { return reinterpret_cast<const int64_t *>(f.ptr[ins.in()->Get(uint32_t(k))]); };
    auto pid = [&](size_t k) { return ins.params()->Get(uint32_t(k)); };
    auto pgrad = [&](size_t k) { return state_floats(param(pid(k)).grad_offset()); };
    auto ival = [&](size_t k) { return ins.ints()->Get(uint32_t(k)); };
    auto fval = [&](size_t k) { return ins.floats()->Get(uint32_t(k)); };
    auto n = [](const pl::Value &v) { return element_count(v); };
    auto dim = [](const pl::Value &v, int64_t i) {
      int64_t r = int64_t(vsize(v.shape()));
      return v.shape()->Get(uint32_t(i < 0 ? i + r : i));
    };
    auto key = [&](int64_t stream) { return cpu::RngKey{seed, uint64_t(stream), rng_offset}; };
    auto bad_id = [&](size_t k, int64_t at, int64_t limit, const char *what) {
      return std::string(what) + " " + std::to_string(iin(k)[at]) + " at position " +
             std::to_string(at) + " of " + value_label(&vin(k), ins.in()->Get(uint32_t(k))) +
             " is outside [0, " + std::to_string(limit) +
             "); check that the data was tokenized for this model's vocabulary";
    };
    // A vocab-parallel table holds rows [tp_rank * vocab, (tp_rank + 1) *
    // vocab) of the whole vocabulary: local_row[i] is token i's row here, or
    // -1 when another rank holds it. Ids outside the whole vocabulary are an
    // error.
    auto vocab_rows = [&](int64_t vocab, int64_t rows) -> std::string {
      const int64_t first = tp_rank() * vocab, whole = vocab * tp_size();
      if (int64_t at = first_out_of_range(iin(1), rows, whole); at >= 0)
        return bad_id(1, at, whole, "token id");
      local_row.resize(size_t(rows));
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t local = iin(1)[i] - first;
        local_row[size_t(i)] = local >= 0 && local < vocab ? local : -1;
      }
      return "";
    };
    auto attention_shape = [&](const pl::Value &q, const pl::Value &k) {
      cpu::AttentionShape s{dim(q, 0), dim(q, 1), dim(q, 2), dim(k, 2), dim(q, 3),
                            ival(0) != 0, fval(0), fval(1)};
      if (ival(2) == 2) { // this rank's share of the heads
        s.head_offset = tp_rank() * s.heads;
        s.total_heads = tp_size() * s.heads;
      }
      return s;
    };

    switch (ins.op()) {
    case pl::Opcode::POSITION_IDS: {
      int64_t seq = dim(vout(0), -1);
      cpu::position_ids(n(vout(0)) / seq, seq, reinterpret_cast<int32_t *>(fout(0)));
      break;
    }
    case pl::Opcode::EMBEDDING: {
      int64_t vocab = dim(vin(0), 0), h = dim(vin(0), 1), rows = n(vin(1));
      if (ival(0)) {
        // Vocab parallel: this rank's rows; other ranks' ids give zeros.
        if (std::string e = vocab_rows(vocab, rows); !e.empty())
          return e;
        float *y = fout(0);
        for (int64_t i = 0; i < rows; ++i) {
          if (local_row[size_t(i)] >= 0)
            std::memcpy(y + i * h, fin(0) + local_row[size_t(i)] * h, size_t(h) * sizeof(float));
          else
            std::fill(y + i * h, y + (i + 1) * h, 0.0f);
        }
        break;
      }
      if (!cpu::embedding_fwd(fin(0), vocab, h, iin(1), rows, fout(0)))
        return bad_id(1, std::max<int64_t>(first_out_of_range(iin(1), rows, vocab), 0), vocab,
                      "token id");
      break;
    }
    case pl::Opcode::LAYER_NORM: {
      int64_t h = dim(vin(0), -1);
      cpu::layer_norm_fwd(fin(0), fin(1), fin(2), n(vin(0)) / h, h, fval(0), fout(0));
      break;
    }
    case pl::Opcode::RMS_NORM: {
      int64_t h = dim(vin(0), -1);
      cpu::rms_norm_fwd(fin(0), fin(1), n(vin(0)) / h, h, fval(0), fout(0));
      break;
    }
    case pl::Opcode::MATMUL: {
      int64_t out = dim(vin(1), 0), in = dim(vin(1), 1);
      cpu::matmul_fwd(fin(0), fin(1), n(vin(0)) / in, in, out, fout(0));
      break;
    }
    case pl::Opcode::BIAS_ADD: {
      int64_t h = dim(vin(0), -1);
      cpu::bias_add_fwd(fin(0), fin(1), n(vin(0)) / h, h, fout(0));
      break;
    }
    case pl::Opcode::ADD:
      cpu::add(fin(0), fin(1), n(vout(0)), fout(0));
      break;
    case pl::Opcode::GELU:
      cpu::gelu_fwd(fin(0), n(vin(0)), ival(0) != 0, fout(0));
      break;
    case pl::Opcode::SWIGLU: {
      int64_t ff = dim(vout(0), -1);
      cpu::swiglu_fwd(fin(0), n(vout(0)) / ff, ff, fout(0));
      break;
    }
    case pl::Opcode::DROPOUT: {
      const int64_t d = ival(1);
      if (d < 0) {
        cpu::dropout_fwd(fin(0), n(vin(0)), fval(0), key(ival(0)), fout(0));
        break;
      }
      // A tensor-parallel shard along d: each outer index holds one
      // contiguous run of the whole tensor's elements.
      int64_t outer = 1, len = 1;
      for (int64_t k = 0; k < int64_t(vsize(vin(0).shape())); ++k)
        (k < d ? outer : len) *= dim(vin(0), k);
      cpu::dropout_segments(fin(0), outer, len, uint64_t(len * tp_size()),
                            uint64_t(len * tp_rank()), fval(0), key(ival(0)), fout(0));
      break;
    }
    case pl::Opcode::RESHAPE: {
      const uint8_t *src = f.ptr[ins.in()->Get(0)];
      uint8_t *dst = f.ptr[ins.out()->Get(0)];
      if (src != dst)
        std::memmove(dst, src, size_t(n(vin(0))) * cpu_element_bytes(vin(0).dtype()));
      break;
    }
    case pl::Opcode::SPLIT_QKV: {
      int64_t heads = dim(vout(0), -2), d = dim(vout(0), -1), groups = dim(vout(1), -2);
      cpu::split_qkv_fwd(fin(0), n(vout(0)) / (heads * d), heads, groups, d, fout(0), fout(1),
                         fout(2));
      break;
    }
    case pl::Opcode::SPLIT_QKV_ROPE:
      cpu::split_qkv_rope_fwd(fin(0), dim(vout(0), 0), dim(vout(0), 1), dim(vout(0), 2),
                              dim(vout(1), 2), dim(vout(0), 3), fval(0), fout(0), fout(1),
                              fout(2));
      break;
    case pl::Opcode::ROPE:
      cpu::rope_fwd(fin(0), dim(vin(0), 0), dim(vin(0), 1), dim(vin(0), 2), dim(vin(0), 3),
                    fval(0), fout(0));
      break;
    case pl::Opcode::ATTENTION:
      cpu::attention_fwd(fin(0), fin(1), fin(2), attention_shape(vin(0), vin(1)), key(ival(1)),
                         fout(0), fout(1));
      break;
    case pl::Opcode::CROSS_ENTROPY: {
      int64_t vocab = dim(vin(0), -1), rows = n(vin(1));
      double loss = 0;
      if (ival(0)) {
        if (int64_t at = first_out_of_range(iin(1), rows, vocab * tp_size()); at >= 0)
          return bad_id(1, at, vocab * tp_size(), "label");
        std::vector<float> max;
        std::vector<double> sum, target;
        if (std::string e = vocab_parallel_stats(fin(0), iin(1), rows, vocab, max, sum, &target);
            !e.empty())
          return e;
        for (int64_t i = 0; i < rows; ++i)
          loss += double(max[size_t(i)]) + std::log(sum[size_t(i)]) - target[size_t(i)];
        *fout(0) = float(rows ? loss / double(rows) : 0.0);
        break;
      }
      if (!cpu::cross_entropy_fwd(fin(0), iin(1), nullptr, rows, vocab, &loss))
        return bad_id(1, std::max<int64_t>(first_out_of_range(iin(1), rows, vocab), 0), vocab,
                      "label");
      *fout(0) = float(loss);
      break;
    }
    case pl::Opcode::GRAD_SEED:
      *fout(0) = float(fval(0) * double(loss_scale));
      break;
    case pl::Opcode::EMBEDDING_GRAD: {
      const pl::Param &t = param(pid(0));
      int64_t vocab = t.shape()->Get(0), h = t.shape()->Get(1), rows = n(vin(1));
      if (ival(0)) {
        if (std::string e = vocab_rows(vocab, rows); !e.empty())
          return e;
        float *g = pgrad(0);
        for (int64_t i = 0; i < rows; ++i)
          if (const int64_t local = local_row[size_t(i)]; local >= 0)
            for (int64_t j = 0; j < h; ++j)
              g[local * h + j] += fin(0)[i * h + j];
        break;
      }
      // The backward kernel trusts its ids; a bad one would write outside the table.
      if (int64_t at = first_out_of_range(iin(1), rows, vocab); at >= 0)
        return bad_id(1, at, vocab, "token id");
      cpu::embedding_bwd(fin(0), iin(1), rows, h, pgrad(0));
      break;
    }
    case pl::Opcode::MATMUL_INPUT_GRAD: {
      int64_t out = dim(vin(1), 0), in = dim(vin(1), 1);
      cpu::matmul_bwd_input(fin(0), fin(1), n(vin(0)) / out, in, out, fout(0), false);
      break;
    }
    case pl::Opcode::MATMUL_WEIGHT_GRAD: {
      const pl::Param &w = param(pid(0));
      int64_t out = w.shape()->Get(0), in = w.shape()->Get(1);
      cpu::matmul_bwd_weight(fin(0), fin(1), n(vin(0)) / out, in, out, pgrad(0));
      break;
    }
    case pl::Opcode::BIAS_GRAD: {
      int64_t h = dim(vin(0), -1);
      cpu::bias_grad(fin(0), n(vin(0)) / h, h, pgrad(0));
      break;
    }
    case pl::Opcode::LAYER_NORM_GRAD: {
      int64_t h = dim(vin(1), -1);
      cpu::layer_norm_bwd(fin(0), fin(1), fin(2), n(vin(1)) / h, h, fval(0), fout(0), pgrad(0),
                          pgrad(1));
      break;
    }
    case pl::Opcode::RMS_NORM_GRAD: {
      int64_t h = dim(vin(1), -1);
      cpu::rms_norm_bwd(fin(0), fin(1), fin(2), n(vin(1)) / h, h, fval(0), fout(0), pgrad(0));
      break;
    }
    case pl::Opcode::GELU_GRAD:
      cpu::gelu_bwd(fin(0), fin(1), n(vin(1)), ival(0) != 0, fout(0));
      break;
    case pl::Opcode::SWIGLU_GRAD: {
      int64_t ff = dim(vin(0), -1);
      cpu::swiglu_bwd(fin(0), fin(1), n(vin(0)) / ff, ff, fout(0));
      break;
    }
    case pl::Opcode::SPLIT_QKV_GRAD: {
      int64_t heads = dim(vin(0), -2), d = dim(vin(0), -1), groups = dim(vin(1), -2);
      cpu::split_qkv_bwd(fin(0), fin(1), fin(2), n(vin(0)) / (heads * d), heads, groups, d,
                         fout(0));
      break;
    }
    case pl::Opcode::SPLIT_QKV_ROPE_GRAD:
      cpu::split_qkv_rope_bwd(fin(0), fin(1), fin(2), dim(vin(0), 0), dim(vin(0), 1),
                              dim(vin(0), 2), dim(vin(1), 2), dim(vin(0), 3), fval(0), fout(0));
      break;
    case pl::Opcode::ROPE_GRAD:
      cpu::rope_bwd(fin(0), dim(vin(0), 0), dim(vin(0), 1), dim(vin(0), 2), dim(vin(0), 3),
                    fval(0), fout(0));
      break;
    case pl::Opcode::ATTENTION_GRAD:
      cpu::attention_bwd(fin(0), fin(1), fin(2), fin(3), fin(4), fin(5),
                         attention_shape(vin(1), vin(2)), key(ival(1)), fout(0), fout(1), fout(2));
      break;
    case pl::Opcode::CROSS_ENTROPY_GRAD: {
      int64_t vocab = dim(vin(0), -1), rows = n(vin(1));
      if (ival(0)) {
        if (int64_t at = first_out_of_range(iin(1), rows, vocab * tp_size()); at >= 0)
          return bad_id(1, at, vocab * tp_size(), "label");
        std::vector<float> max;
        std::vector<double> sum;
        if (std::string e = vocab_parallel_stats(fin(0), iin(1), rows, vocab, max, sum, nullptr);
            !e.empty())
          return e;
        // dlogits = c (softmax - onehot), over this rank's columns; written
        // in place over the logits when the plan says so.
        const double c = rows ? double(*fin(2)) / double(rows) : 0.0;
        const int64_t first = tp_rank() * vocab;
        const float *x = fin(0);
        float *dx = fout(0);
        for (int64_t i = 0; i < rows; ++i) {
          const double f = c / sum[size_t(i)], m = max[size_t(i)];
          for (int64_t j = 0; j < vocab; ++j)
            dx[i * vocab + j] = float(std::exp(double(x[i * vocab + j]) - m) * f);
          const int64_t local = iin(1)[i] - first;
          if (local >= 0 && local < vocab)
            dx[i * vocab + local] = float(double(dx[i * vocab + local]) - c);
        }
        break;
      }
      if (int64_t at = first_out_of_range(iin(1), rows, vocab); at >= 0)
        return bad_id(1, at, vocab, "label");
      cpu::cross_entropy_bwd(fin(0), iin(1), nullptr, rows, vocab, double(*fin(2)), fout(0));
      break;
    }
    case pl::Opcode::GRAD_NORM:
      return grad_norm(fout(0));
    case pl::Opcode::LR_SCHEDULE: {
      int64_t steps = *lin(0);
      if (steps < 0)
        return "the iteration input is " + std::to_string(steps) +
               "; it counts optimizer steps taken and cannot be negative";
      *fout(0) = float(megatron_lr(lr_schedule_of(ins), steps));
      break;
    }
    case pl::Opcode::CLIP_COEFF: {
      // Unscaling times Megatron's clipping factor on the unscaled norm.
      double max_norm = fval(0), coeff = 1.0;
      if (max_norm > 0) {
        double c = max_norm / (double(*fin(0)) + 1e-6);
        if (c < 1.0)
          coeff = c;
      }
      *fout(0) = float(double(*fin(1)) * coeff);
      break;
    }
    case pl::Opcode::ADAMW:
      return adamw(ins, *fin(0), *fin(1), *lin(2));
    case pl::Opcode::FUSED:
      if (std::string e = run_kernel(ins, f, rng_offset); !e.empty())
        return e;
      break;
    case pl::Opcode::REDUCE_GRADS:
      return reduce_grads(ins);
    case pl::Opcode::SHARDED_GRAD_NORM:
      return sharded_grad_norm(ins, fout(0));
    case pl::Opcode::SHARDED_ADAMW:
      return sharded_adamw(ins, *fin(0), *fin(1), *lin(2));
    case pl::Opcode::ALL_GATHER_PARAMS:
      return all_gather_params(ins);
    case pl::Opcode::ALL_REDUCE_GRADS: {
      std::string err;
      Communicator *dp = group(ival(0), &err);
      if (!dp)
        return err;
      const float scale = float(fval(0));
      const uint32_t count = vsize(ins.params()) ? vsize(ins.params()) : vsize(rank.params());
      for (uint32_t k = 0; k < count; ++k) {
        const uint32_t p = vsize(ins.params()) ? pid(k) : k;
        float *g = state_floats(param(p).grad_offset());
        const int64_t count = element_count(param(p).shape());
        if (std::string e = dp->all_reduce(g, size_t(count), ReduceOp::Sum); !e.empty())
          return e;
        cpu::scale(g, count, scale);
      }
      break;
    }
    case pl::Opcode::ALL_REDUCE:
    case pl::Opcode::SEQ_ALL_GATHER:
    case pl::Opcode::SEQ_REDUCE_SCATTER:
    case pl::Opcode::SEQ_SPLIT: {
      std::string err;
      Communicator *c = group(ival(0), &err);
      if (!c)
        return err.empty() ? "exchanges activations within a group of one rank" : err;
      const int64_t t = c->size(), r = c->rank();
      if (ins.op() == pl::Opcode::ALL_REDUCE) {
        if (fout(0) != fin(0))
          std::memmove(fout(0), fin(0), size_t(n(vin(0))) * sizeof(float));
        if (std::string e = c->all_reduce(fout(0), size_t(n(vout(0))), ReduceOp::Sum); !e.empty())
          return e;
        break;
      }
      const bool gather = ins.op() == pl::Opcode::SEQ_ALL_GATHER;
      const pl::Value &shard = gather ? vin(0) : vout(0);
      const int64_t b = dim(shard, 0), s_local = dim(shard, 1), rest = n(shard) / (b * s_local);
      const size_t count = size_t(n(shard));
      if (ins.op() == pl::Opcode::SEQ_SPLIT) {
        for (int64_t i = 0; i < b; ++i)
          std::memcpy(fout(0) + i * s_local * rest, fin(0) + (i * t + r) * s_local * rest,
                      size_t(s_local * rest) * sizeof(float));
        break;
      }
      exchange.resize(count * size_t(t));
      if (gather) {
        if (std::string e = c->all_gather(fin(0), count, exchange.data()); !e.empty())
          return e;
        sequence_blocks(exchange.data(), fout(0), b, s_local, rest, t, false);
      } else {
        sequence_blocks(fin(0), exchange.data(), b, s_local, rest, t, true);
        if (std::string e = c->reduce_scatter(exchange.data(), count, fout(0)); !e.empty())
          return e;
      }
      break;
    }
    case pl::Opcode::SEND:
    case pl::Opcode::RECV: {
      std::string err;
      Communicator *pp = group(int64_t(Group::PP), &err);
      if (!pp)
        return err.empty() ? "needs a pipeline group" : err;
      const bool send = ins.op() == pl::Opcode::SEND;
      const pl::Value &v = send ? vin(0) : vout(0);
      const size_t bytes = size_t(n(v)) * sizeof(float); // the CPU holds floats
      if (send)
        return pp->send(fin(0), bytes, int(ival(0)), int(ival(1)));
      if (std::string e = pp->recv(fout(0), bytes, int(ival(0)), int(ival(1))); !e.empty())
        return e;
      break;
    }
    case pl::Opcode::ALL_REDUCE_TIED_GRAD: {
      // Both copies end up with mine + theirs; float addition commutes, so
      // the two stages hold the same bits.
      std::string err;
      Communicator *pp = group(int64_t(Group::PP), &err);
      if (!pp)
        return err.empty() ? "needs a pipeline group" : err;
      float *g = pgrad(0);
      const int64_t count = element_count(param(pid(0)).shape());
      peer_grad.resize(size_t(count));
      const int peer = int(ival(0)), tag = int(ival(1));
      if (std::string e = pp->send(g, size_t(count) * sizeof(float), peer, tag); !e.empty())
        return e;
      if (std::string e = pp->recv(peer_grad.data(), size_t(count) * sizeof(float), peer, tag);
          !e.empty())
        return e;
      for (int64_t i = 0; i < count; ++i)
        g[i] += peer_grad[size_t(i)];
      break;
    }
    case pl::Opcode::GROUP_GRAD_NORM:
      return grad_norm(fout(0));
    }
    // Reduced-precision results: computed in f32, then rounded to their type.
    for (size_t k = 0; k < vsize(ins.out()); ++k) {
      const pl::Value &v = vout(k);
      if (v.dtype() == pl::DType::BF16)
        cpu::round_to_bf16(fout(k), n(v));
      else if (v.dtype() == pl::DType::F16)
        cpu::round_to_fp16(fout(k), n(v));
    }
    return "";
  }

  std::string adamw(const pl::Instruction &ins, float lr, float clip, int64_t step) {
    if (step < 1)
      return "the step input is " + std::to_string(step) + "; AdamW counts steps from 1";
    const pl::Param &p = param(ins.params()->Get(0));
    const int64_t count = element_count(p.shape());
    const float *g = state_floats(p.grad_offset());
    if (clip != 1.0f) {
      // Clipping scales what the update sees; the gradient buffer stays as is.
      clipped.resize(size_t(count));
      for (int64_t i = 0; i < count; ++i)
        clipped[size_t(i)] = g[i] * clip;
      g = clipped.data();
    }
    float *w = state_floats(p.weight_offset());
    float *m = state_floats(p.master_offset());
    cpu::AdamWParams a{lr, ins.floats()->Get(0), ins.floats()->Get(1), ins.floats()->Get(2),
                       ins.floats()->Get(3), step};
    cpu::adamw_step(m ? m : w, g, state_floats(p.exp_avg_offset()),
                    state_floats(p.exp_avg_sq_offset()), count, a);
    if (m)
      std::memcpy(w, m, size_t(count) * sizeof(float));
    round_weights(p, w);
    return "";
  }

  static void round_weights(const pl::Param &p, float *w) {
    if (p.dtype() == pl::DType::BF16)
      cpu::round_to_bf16(w, element_count(p.shape()));
    else if (p.dtype() == pl::DType::F16)
      cpu::round_to_fp16(w, element_count(p.shape()));
  }
};

CpuExecutor::CpuExecutor(const pl::Plan &plan, int rank) {
  const pl::Rank *r = find_rank(plan, rank);
  if (!r) {
    std::fprintf(stderr, "mtrun: error: the plan has no rank %d; run with a rank below its "
                         "world size\n", rank);
    std::abort();
  }
  impl_ = std::make_unique<Impl>(plan, *r);
}

CpuExecutor::~CpuExecutor() = default;

void initial_weights(const pl::Param &p, int64_t tp_size, int64_t tp_rank, uint64_t seed,
                     float *w) {
  const int64_t count = element_count(p.shape());
  switch (p.init()) {
  case pl::Init::ZEROS: std::fill(w, w + count, 0.0f); break;
  case pl::Init::ONES: std::fill(w, w + count, 1.0f); break;
  case pl::Init::NORMAL:
    if (p.tp_dim() < 0) {
      cpu::init_normal(w, count, p.init_std(), seed, p.init_stream());
      break;
    }
    // A tensor-parallel shard holds exactly its part of the whole
    // parameter's initial values, so every layout starts from the
    // single-device weights.
    {
      const int64_t t = tp_size, d = p.tp_dim(), blocks = p.tp_blocks();
      std::vector<float> whole(size_t(count * t));
      cpu::init_normal(whole.data(), count * t, p.init_std(), seed, p.init_stream());
      int64_t outer = 1, inner = 1;
      for (int64_t k = 0; k < int64_t(vsize(p.shape())); ++k)
        if (k < d)
          outer *= p.shape()->Get(uint32_t(k));
        else if (k > d)
          inner *= p.shape()->Get(uint32_t(k));
      // Dimension d of the whole is [blocks, t, piece]; the shard takes
      // [:, tp_rank, :].
      const int64_t piece = p.shape()->Get(uint32_t(d)) / blocks;
      float *out = w;
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t bl = 0; bl < blocks; ++bl) {
          const float *src = whole.data() + ((o * blocks + bl) * t + tp_rank) * piece * inner;
          std::copy(src, src + piece * inner, out);
          out += piece * inner;
        }
    }
    break;
  }
  if (p.dtype() == pl::DType::BF16)
    cpu::round_to_bf16(w, count);
  else if (p.dtype() == pl::DType::F16)
    cpu::round_to_fp16(w, count);
}

std::string CpuExecutor::init_params(uint64_t seed) {
  Impl &s = *impl_;
  for (uint32_t i = 0; i < vsize(s.rank.params()); ++i) {
    const pl::Param &p = s.param(i);
    const int64_t count = element_count(p.shape());
    if (float *w = s.state_floats(p.weight_offset())) {
      initial_weights(p, s.tp_size(), s.tp_rank(), seed, w);
      if (float *m = s.state_floats(p.master_offset()))
        std::copy(w, w + count, m);
    }
    for (float *b : {s.state_floats(p.grad_offset()), s.state_floats(p.exp_avg_offset()),
                     s.state_floats(p.exp_avg_sq_offset())})
      if (b)
        std::fill(b, b + count, 0.0f);
  }
  // The distributed optimizer: moments zero, masters of the owned shards
  // copied from the weights (padding zero).
  const int64_t n = shard_elements();
  for (float *b : {shard_master(), shard_exp_avg(), shard_exp_avg_sq()})
    if (b)
      std::fill(b, b + n, 0.0f);
  if (float *m = shard_master())
    for (const Impl::BucketState &b : s.buckets)
      for (const FlatSegment &g : b.own) {
        const float *w = s.state_floats(s.param(g.param).weight_offset()) + g.param_begin;
        std::copy(w, w + g.count, m + s.shard_index(b, g.flat_begin));
      }
  return "";
}

float *CpuExecutor::shard_master() { return impl_->shard_floats(impl_->rank.shard_master_offset()); }
float *CpuExecutor::shard_exp_avg() { return impl_->shard_floats(impl_->rank.shard_exp_avg_offset()); }
float *CpuExecutor::shard_exp_avg_sq() {
  return impl_->shard_floats(impl_->rank.shard_exp_avg_sq_offset());
}
int64_t CpuExecutor::shard_elements() const {
  return impl_->rank.distributed_optimizer() ? impl_->rank.shard_elements() : 0;
}

float *CpuExecutor::weight(int param) { return impl_->state_floats(impl_->param(uint32_t(param)).weight_offset()); }
void CpuExecutor::set_groups(const ParallelGroups *groups) { impl_->groups = groups; }
float *CpuExecutor::grad(int param) { return impl_->state_floats(impl_->param(uint32_t(param)).grad_offset()); }
float *CpuExecutor::master(int param) { return impl_->state_floats(impl_->param(uint32_t(param)).master_offset()); }
float *CpuExecutor::exp_avg(int param) { return impl_->state_floats(impl_->param(uint32_t(param)).exp_avg_offset()); }
float *CpuExecutor::exp_avg_sq(int param) {
  return impl_->state_floats(impl_->param(uint32_t(param)).exp_avg_sq_offset());
}
int64_t CpuExecutor::param_elements(int param) const {
  return element_count(impl_->param(uint32_t(param)).shape());
}

void *CpuExecutor::value_data(const pl::Program &program, uint32_t value) {
  auto it = impl_->program_index.find(&program);
  if (it == impl_->program_index.end())
    return nullptr;
  const Frame &f = impl_->programs[it->second].frame;
  return value < f.ptr.size() ? f.ptr[value] : nullptr;
}

const pl::Program *CpuExecutor::program(const std::string &name) const {
  for (const auto &ps : impl_->programs)
    if (ps.name == name)
      return ps.program;
  return nullptr;
}

std::string CpuExecutor::run(const pl::Program &program, uint64_t rng_offset) {
  auto it = impl_->program_index.find(&program);
  if (it == impl_->program_index.end())
    return impl_->rank_name + ": internal error: run() was given a program that is not one of "
                              "this rank's";
  impl_->loss_scale = loss_scale;
  return impl_->run(impl_->programs[it->second], rng_offset);
}

void CpuExecutor::set_seed(uint64_t seed) { impl_->seed = seed; }

void CpuExecutor::set_micro_batch_rng_offsets(std::vector<uint64_t> offsets) {
  impl_->micro_rng_offsets = std::move(offsets);
}

void CpuExecutor::zero_grads() {
  for (uint32_t i = 0; i < vsize(impl_->rank.params()); ++i)
    if (float *g = grad(int(i)))
      std::fill(g, g + param_elements(int(i)), 0.0f);
}

void CpuExecutor::set_check_memory_plan(bool on) { impl_->check = on; }

uint64_t CpuExecutor::cpu_arena_bytes() const { return impl_->arena.size(); }
uint64_t CpuExecutor::cpu_state_bytes() const { return impl_->state.size(); }

} // namespace mt::rt
