// The CPU executor's optimizer step (see cpu_executor.h): data-parallel gradient buckets
// (reduce, reduce-scatter, all-gather), gradient norms, AdamW (whole and sharded), the LR schedule.
#include "runtime/exec/cpu_executor_impl.h"

#include "runtime/exec/cpu_kernels.h"
#include "runtime/plan/grad_buckets.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace mt::rt {

using namespace cpu_exec_detail; // the CPU executor's own pieces (cpu_executor_impl.h)

namespace cpu_exec_detail {

LrSchedule lr_schedule_of(const pl::Instruction &ins) {
  auto i = [&](uint32_t k) { return ins.ints()->Get(k); };
  return {pl::LrStyle(i(0)), i(1), i(2), i(3), pl::WsdStyle(i(4)), i(5),
          ins.floats()->Get(0), ins.floats()->Get(1)};
}

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

} // namespace cpu_exec_detail

void CpuExecutor::Impl::plan_buckets() {
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
    s.ranks = int(bucket_group_size(plan, bk));
    s.expert = bk.group() == 6;
    s.all = flat_segments(flat, s.begin, s.end);
    s.shard = bucket_shard(s.begin, s.end, s.ranks, int(bucket_group_rank(plan, rank, bk)));
    s.own = flat_segments(flat, s.shard.begin, s.shard.end);
    s.state_at = bucket_shard_state_offset(plan, bk);
    buckets.push_back(std::move(s));
  }
}

// Copies segments of per-parameter buffers (`which`: weight or grad) into
// `out` (flat element `base` at out[0]; uncovered elements zero), or back.
void CpuExecutor::Impl::pack(const std::vector<FlatSegment> &segs, bool weights, int64_t base,
                             std::vector<float> &out, int64_t n) {
  out.assign(size_t(n), 0.0f);
  for (const FlatSegment &g : segs) {
    const pl::Param &p = param(g.param);
    const float *src = state_floats(weights ? p.weight_offset() : p.grad_offset()) + g.param_begin;
    std::copy(src, src + g.count, out.data() + (g.flat_begin - base));
  }
}

void CpuExecutor::Impl::unpack(const std::vector<FlatSegment> &segs, bool weights, int64_t base,
                               const float *in) {
  for (const FlatSegment &g : segs) {
    const pl::Param &p = param(g.param);
    float *dst = state_floats(weights ? p.weight_offset() : p.grad_offset()) + g.param_begin;
    const float *src = in + (g.flat_begin - base);
    std::copy(src, src + g.count, dst);
  }
}

// A bf16 gradient buffer's reduction, as Megatron's DDP runs it with
// --grad-reduce-in-bf16: each rank's values scaled first (its
// gradient_scaling_factor, 1/dp, applied to the bf16 buffer), then summed
// over the group in bf16. The sum runs in rank order, rounded to bf16 (to
// nearest even) after every addition, so every rank gets the same bits; a
// bf16 NCCL ring rounds after each of its additions too, in ring order.
// The ranks' buffers are gathered (the collectives carry floats; each
// holds a bf16 value) and summed here.
std::string CpuExecutor::Impl::sum_in_bf16(Communicator *c, float *data, int64_t n,
                                           float scale) {
  if (scale != 1.0f)
    cpu::scale(data, n, scale);
  cpu::round_to_bf16(data, n);
  if (!c || c->size() == 1)
    return "";
  const int64_t ranks = c->size();
  exchange.resize(size_t(n * ranks));
  if (std::string e = c->all_gather(data, size_t(n), exchange.data()); !e.empty())
    return e;
  for (int64_t i = 0; i < n; ++i) {
    float acc = exchange[size_t(i)];
    for (int64_t r = 1; r < ranks; ++r) {
      acc += exchange[size_t(r * n + i)];
      cpu::round_to_bf16(&acc, 1);
    }
    data[i] = acc;
  }
  return "";
}

std::string CpuExecutor::Impl::reduce_grads(const pl::Instruction &ins) {
  std::string err;
  Communicator *c = group(ins.ints()->Get(0), &err);
  if (!err.empty())
    return err;
  const BucketState &b = buckets[size_t(ins.ints()->Get(1))];
  if (!c && b.ranks > 1)
    return "reduces a bucket over " + std::to_string(b.ranks) + " ranks, but its group has one; "
           "run the plan with all its ranks";
  const bool scatter = ins.ints()->Get(2) != 0;
  const float scale = float(ins.floats()->Get(0));
  const int64_t n = b.end - b.begin, shard = n / b.ranks;
  pack(b.all, false, b.begin, packed, n);
  if (bf16_grads()) {
    // The whole bucket is summed; a reduce-scatter keeps this rank's shard.
    if (std::string e = sum_in_bf16(c, packed.data(), n, scale); !e.empty())
      return e;
    if (!scatter)
      unpack(b.all, false, b.begin, packed.data());
    else
      unpack(b.own, false, b.shard.begin, packed.data() + (b.shard.begin - b.begin));
    return "";
  }
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

std::string CpuExecutor::Impl::all_gather_params(const pl::Instruction &ins) {
  std::string err;
  Communicator *c = group(ins.ints()->Get(0), &err);
  if (!err.empty())
    return err;
  const BucketState &b = buckets[size_t(ins.ints()->Get(1))];
  if (!c && b.ranks > 1)
    return "gathers a bucket from " + std::to_string(b.ranks) + " ranks, but its group has one; "
           "run the plan with all its ranks";
  const int64_t n = b.end - b.begin, shard = n / b.ranks;
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

// Whether a dense parameter's gradient counts in the norm on this rank:
// every tensor once (a tensor-parallel replica on tp rank 0, a pipeline
// stage's tied copy not at all). An expert parameter counts on every rank
// holding it: the expert part is summed over the expert groups.
bool CpuExecutor::Impl::counts_in_norm(uint32_t p) const {
  if (param(p).expert())
    return param(p).in_grad_norm();
  return param(p).in_grad_norm() && (param(p).tp_dim() >= 0 || tp_rank() == 0);
}

// GRAD_NORM and GROUP_GRAD_NORM: the squares of the gradients this rank
// counts, the dense ones summed over the model-parallel group (tensor and
// pipeline ranks: the whole model), the experts' over tp_ep_pp (every
// expert of every stage once), then the square root of the two.
std::string CpuExecutor::Impl::grad_norm(float *out) {
  double dense = 0, expert = 0;
  for (uint32_t p = 0; p < vsize(rank.params()); ++p)
    if (const float *g = state_floats(param(p).grad_offset()); g && counts_in_norm(p))
      (param(p).expert() ? expert : dense) += cpu::sum_squares(g, element_count(param(p).shape()));
  return model_norm(dense, expert, out);
}

// The norm from this rank's sums of squares: the dense one summed over the
// model-parallel group (the other tensor and pipeline shards), the expert
// one over tp_ep_pp (Megatron's expt_tp_pp group: the other expert shards
// and stages) when the plan has experts (every rank takes part, those of a
// stage without experts with 0), then the square root of their sum.
std::string CpuExecutor::Impl::model_norm(double dense, double expert, float *out) {
  std::string err;
  std::vector<double> total{dense};
  if (Communicator *mp = group(int64_t(Group::MP), &err))
    if (std::string e = all_reduce_doubles(mp, total); !e.empty())
      return e;
  if (!err.empty())
    return err;
  std::vector<double> experts{expert};
  if (has_experts) {
    if (Communicator *g = group(int64_t(Group::TP_EP_PP), &err))
      if (std::string e = all_reduce_doubles(g, experts); !e.empty())
        return e;
    if (!err.empty())
      return err;
  }
  *out = float(std::sqrt(total[0] + experts[0]));
  return "";
}

std::string CpuExecutor::Impl::sharded_grad_norm(const pl::Instruction &ins, float *out) {
  std::string err;
  Communicator *c = group(ins.ints()->Get(0), &err);
  if (!err.empty())
    return err;
  // Parameters every tensor-parallel rank holds whole count on tp rank 0;
  // expert buckets' shards are over expert data parallelism.
  std::vector<double> dense{0}, expert{0};
  for (const BucketState &b : buckets)
    for (const FlatSegment &g : b.own)
      if (counts_in_norm(g.param))
        (b.expert ? expert : dense)[0] +=
            cpu::sum_squares(state_floats(param(g.param).grad_offset()) + g.param_begin, g.count);
  // The other data-parallel ranks' shards (expert ones: the other expert
  // data-parallel ranks'), then the rest of the model.
  if (c)
    if (std::string e = all_reduce_doubles(c, dense); !e.empty())
      return e;
  if (has_experts) {
    if (Communicator *edp = group(int64_t(Group::EXPT_DP), &err))
      if (std::string e = all_reduce_doubles(edp, expert); !e.empty())
        return e;
    if (!err.empty())
      return err;
  }
  return model_norm(dense[0], expert[0], out);
}

std::string CpuExecutor::Impl::adamw(const pl::Instruction &ins, float lr, float clip,
                                     int64_t step) {
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

std::string CpuExecutor::Impl::sharded_adamw(const pl::Instruction &ins, float lr, float clip,
                                             int64_t step, float decoupled_lr) {
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
    cpu::AdamWParams a{p.decoupled_lr() ? decoupled_lr : lr, ins.floats()->Get(0),
                       ins.floats()->Get(1), ins.floats()->Get(2),
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

// SGD (cpu::sgd_step) on a parameter, as adamw() does AdamW.
std::string CpuExecutor::Impl::sgd(const pl::Instruction &ins, float lr, float clip) {
  const pl::Param &p = param(ins.params()->Get(0));
  const int64_t count = element_count(p.shape());
  const float *g = state_floats(p.grad_offset());
  if (clip != 1.0f) {
    clipped.resize(size_t(count));
    for (int64_t i = 0; i < count; ++i)
      clipped[size_t(i)] = g[i] * clip;
    g = clipped.data();
  }
  float *w = state_floats(p.weight_offset());
  float *m = state_floats(p.master_offset());
  cpu::SgdParams s{lr, ins.floats()->Get(0), ins.floats()->Get(1)};
  cpu::sgd_step(m ? m : w, g, state_floats(p.exp_avg_offset()), count, s);
  if (m)
    std::memcpy(w, m, size_t(count) * sizeof(float));
  round_weights(p, w);
  return "";
}

// The distributed optimizer's SGD: the owned elements of a bucket, with the
// shard's momentum buffer (in the first moment's place).
std::string CpuExecutor::Impl::sharded_sgd(const pl::Instruction &ins, float lr, float clip,
                                           float decoupled_lr) {
  const BucketState &b = buckets[size_t(ins.ints()->Get(0))];
  float *masters = shard_floats(rank.shard_master_offset());
  float *buf = shard_floats(rank.shard_exp_avg_offset());
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
    cpu::SgdParams s{p.decoupled_lr() ? decoupled_lr : lr, ins.floats()->Get(0),
                     p.weight_decay() ? ins.floats()->Get(1) : 0.0};
    cpu::sgd_step(target, grad, buf + at, g.count, s);
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

void CpuExecutor::Impl::round_weights(const pl::Param &p, float *w) {
  if (p.dtype() == pl::DType::BF16)
    cpu::round_to_bf16(w, element_count(p.shape()));
  else if (p.dtype() == pl::DType::F16)
    cpu::round_to_fp16(w, element_count(p.shape()));
}

} // namespace mt::rt
