// The training log's statistics: which elements a rank counts (log_stats.h).
#include "runtime/exec/log_stats.h"

#include "runtime/plan/grad_buckets.h"
#include "runtime/plan/plan_reader.h"

#include <algorithm>
#include <cmath>

namespace mt::rt {

namespace pl = mt::plan;

bool stats_over_world(const pl::Plan &plan, const pl::Rank &rank) {
  return rank.distributed_optimizer() || plan_has_experts(plan);
}

std::vector<CountedRun> counted_runs(const pl::Plan &plan, const pl::Rank &rank) {
  std::vector<CountedRun> runs;
  const auto *params = rank.params();
  if (!params)
    return runs;
  const bool experts = plan_has_experts(plan);
  auto counts = [&](uint32_t p) {
    const pl::Param &q = *params->Get(p);
    if (q.expert())
      return q.in_grad_norm();
    return q.in_grad_norm() && (q.tp_dim() >= 0 || rank.tp_rank() == 0);
  };
  if (!rank.distributed_optimizer() || !rank.buckets()) {
    // Summed over the world with experts: one data-parallel copy of each.
    const int64_t edp_rank = expert_coords(plan, rank).edp_rank;
    for (uint32_t p = 0; p < params->size(); ++p) {
      const bool expert = params->Get(p)->expert();
      if (experts && (expert ? edp_rank : rank.dp_rank()) != 0)
        continue;
      if (counts(p))
        runs.push_back({p, 0, element_count(params->Get(p)->shape()), -1});
    }
    return runs;
  }
  std::vector<FlatParam> flat;
  for (uint32_t p = 0; p < params->size(); ++p)
    if (const pl::Param &q = *params->Get(p); q.flat_offset() >= 0)
      flat.push_back({p, q.flat_offset(), element_count(q.shape())});
  for (const pl::Bucket *b : *rank.buckets()) {
    const FlatRange shard = bucket_shard(b->begin(), b->end(), int(bucket_group_size(plan, *b)),
                                         int(bucket_group_rank(plan, rank, *b)));
    const int64_t state_at = bucket_shard_state_offset(plan, *b);
    for (const FlatSegment &g : flat_segments(flat, shard.begin, shard.end))
      if (counts(g.param))
        runs.push_back({g.param, g.param_begin, g.count, state_at + g.flat_begin - shard.begin});
  }
  return runs;
}

bool norm_reads_masters(const pl::Plan &plan) {
  const pl::Training *t = plan.training();
  return t && t->precision() && t->precision()->str() == "bf16";
}

double sum_of_squares(const float *x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i)
    s += double(x[i]) * double(x[i]);
  return s;
}

void add_grad_stats(const float *g, int64_t n, float unscale, float clip,
                    Executor::GradStats *s) {
  for (int64_t i = 0; i < n; ++i) {
    const float u = g[i] * unscale; // f32 products, as on the main gradient
    s->zeros += u * clip == 0.0f;
    s->nans += std::isnan(g[i]);
    s->infs += std::isinf(g[i]);
  }
}

} // namespace mt::rt
