// What the training log's statistics count on one rank (Megatron-LM's
// calc_params_l2_norm and count_zeros_fp32): each parameter tensor once over
// the model-parallel group, so tensor-parallel replicas (norm weights,
// biases of row-parallel layers) count on tp rank 0 and a tied embedding on
// its first pipeline stage (Param.in_grad_norm); with the distributed
// optimizer each data-parallel rank counts only the shards it owns (its
// gradients are reduced there, its masters live there). The training loop
// sums the ranks' figures over the model-parallel group, or over every rank
// with the distributed optimizer (stats_over_world).
//
// A plan with experts (Param.expert) counts each tensor once over the whole
// world instead, since its expert part lives on other groups (Megatron sums
// the dense part over the model-parallel group and the expert part over
// expt_tp_pp, then adds them): dense parameters on data-parallel rank 0 and
// expert parameters on expert data-parallel rank 0, or with the
// distributed optimizer the shards each rank owns (an expert bucket's over
// expert data parallelism).
#ifndef MT_RUNTIME_LOG_STATS_H
#define MT_RUNTIME_LOG_STATS_H

#include "plan_generated.h"
#include "runtime/exec/executor.h"

#include <cstdint>
#include <vector>

namespace mt::rt {

// `count` elements of parameter `param` from its element `begin`; with the
// distributed optimizer, `shard_at` is where they are in the rank's shard
// state (masters), else -1.
struct CountedRun {
  uint32_t param;
  int64_t begin, count, shard_at;
};

std::vector<CountedRun> counted_runs(const mt::plan::Plan &plan, const mt::plan::Rank &rank);

// Whether the ranks' figures add up over the world (distributed optimizer)
// rather than the model-parallel group.
bool stats_over_world(const mt::plan::Plan &plan, const mt::plan::Rank &rank);

// Whether the params norm reads the f32 masters (Megatron: with bf16, the
// main params; with fp16 and fp32, the model's own weights).
bool norm_reads_masters(const mt::plan::Plan &plan);

// Squares of x, summed in double.
double sum_of_squares(const float *x, int64_t n);
// Adds to *s the elements of g that are zero once multiplied by `unscale`
// and then by `clip`, each product rounded to f32 (Megatron unscales, then
// clips the f32 main gradients in place, before counting), and those that
// are NaN or infinite.
void add_grad_stats(const float *g, int64_t n, float unscale, float clip,
                    Executor::GradStats *s);

} // namespace mt::rt

#endif // MT_RUNTIME_LOG_STATS_H
