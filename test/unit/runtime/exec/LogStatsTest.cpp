// The training log's statistics (runtime/exec/log_stats.h and the
// executors' params_sum_squares, grad_stats and memory_stats): which
// elements each rank of a layout counts, and both executors' figures
// against sums written out here over their host views.
#include "EmulatedGpuDevice.h"

#include "runtime/exec/cpu_executor.h"
#include "runtime/exec/log_stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

namespace {

namespace pl = mt::plan;
using namespace mt::emu;

int64_t modelElements(const pl::Plan &plan) {
  int64_t n = 0;
  for (const pl::Param *p : *mt::rt::find_rank(plan, 0)->params())
    n += mt::rt::element_count(p->shape());
  return n;
}

// Over every rank of a layout, the counted runs cover the one-rank model's
// elements exactly once: tensor-parallel shards add up, replicas (norms,
// row-parallel biases) count once, the tied embedding's second copy on the
// last stage not at all, and the distributed optimizer's shards partition
// each parameter (padding excluded).
void countsEachElementOnce(const std::vector<mt::spec::Override> &layout) {
  auto one = compilePlan({{"model.untie_embeddings_and_output_weights=false"}});
  std::vector<mt::spec::Override> o = layout;
  o.push_back({"model.untie_embeddings_and_output_weights=false"});
  auto many = compilePlan(o);
  ASSERT_TRUE(one && many);
  const pl::Plan &plan = *many->plan();
  int64_t counted = 0;
  std::set<std::pair<int, int64_t>> shardAt; // (rank, shard element): no overlap
  for (const pl::Rank *rank : *plan.ranks())
    for (const mt::rt::CountedRun &r : mt::rt::counted_runs(plan, *rank)) {
      counted += r.count;
      const pl::Param &p = *rank->params()->Get(r.param);
      EXPECT_LE(r.begin + r.count, mt::rt::element_count(p.shape()));
      EXPECT_EQ(r.shard_at >= 0, rank->distributed_optimizer());
      if (r.shard_at >= 0) {
        EXPECT_LE(r.shard_at + r.count, rank->shard_elements());
        EXPECT_TRUE(shardAt.insert({rank->rank(), r.shard_at}).second);
      }
    }
  EXPECT_EQ(counted, modelElements(*one->plan()));
}

TEST(LogStats, OneRankCountsEveryElement) { countsEachElementOnce({}); }
TEST(LogStats, TensorAndPipelineRanksCountEachElementOnce) {
  countsEachElementOnce({{"parallel.tensor_model_parallel_size=2"},
                         {"parallel.pipeline_model_parallel_size=2"},
                         {"cluster.gpus_per_node=4"}});
}
TEST(LogStats, DistributedOptimizerShardsCountEachElementOnce) {
  countsEachElementOnce({{"parallel.tensor_model_parallel_size=2"},
                         {"parallel.data_parallel_size=2"},
                         {"parallel.use_distributed_optimizer=true"},
                         {"parallel.overlap_grad_reduce=true"},
                         {"parallel.ddp_bucket_size=5000"},
                         {"cluster.gpus_per_node=4"}});
}

TEST(LogStats, ZerosAfterUnscalingAndClipping) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const float g[] = {0.0f, -0.0f, 1.0f, tiny * 4, 3.0f, NAN, INFINITY, -INFINITY};
  mt::rt::Executor::GradStats s;
  mt::rt::add_grad_stats(g, 8, 1.0f, 1.0f, &s);
  EXPECT_EQ(s.zeros, 2);
  EXPECT_EQ(s.nans, 1);
  EXPECT_EQ(s.infs, 2);
  // 4 denormal units times 1/8 underflow to zero in f32, as Megatron's
  // unscaled main gradient would.
  s = {};
  mt::rt::add_grad_stats(g, 5, 0.125f, 1.0f, &s);
  EXPECT_EQ(s.zeros, 3);
  s = {};
  mt::rt::add_grad_stats(g, 5, 1.0f, 0.125f, &s);
  EXPECT_EQ(s.zeros, 3);
}

// The executors' figures against sums written out here over their host
// views: the initial weights (bf16: the masters), and gradients set through
// the host views with zeros, values that underflow once unscaled, a NaN
// and an Inf. The GPU executor (emulated device) copies the counted runs
// back itself, 16-bit weights converted.
void figuresMatchTheHostViews(const std::vector<mt::spec::Override> &extra) {
  auto file = compilePlan(extra);
  ASSERT_TRUE(file);
  const pl::Plan &plan = *file->plan();
  const pl::Rank &rank = *mt::rt::find_rank(plan, 0);
  const bool masters = plan.training()->precision()->str() == "bf16";
  mt::rt::GpuExecutor gpu(plan, 0, std::make_unique<EmulatedDevice>());
  ASSERT_EQ(gpu.open(), "");
  mt::rt::CpuExecutor cpu(plan, 0);
  const float tiny = std::numeric_limits<float>::denorm_min();
  auto fill = [&](auto &ex) {
    ASSERT_EQ(ex.init_params(7), "");
    ASSERT_EQ(ex.state_to_host(), "");
    for (uint32_t i = 0; i < rank.params()->size(); ++i)
      for (int64_t k = 0; k < ex.param_elements(int(i)); ++k)
        ex.grad(int(i))[k] = k % 7 == 0 ? 0.0f : k % 11 == 0 ? tiny : float(k % 5) - 2.0f;
    ex.grad(1)[1] = NAN;
    ex.grad(2)[1] = -INFINITY;
    ASSERT_EQ(ex.state_to_device(), "");
  };
  fill(gpu);
  fill(cpu);
  for (mt::rt::Executor *ex : {static_cast<mt::rt::Executor *>(&gpu),
                               static_cast<mt::rt::Executor *>(&cpu)}) {
    double sq = 0;
    int64_t zeros = 0, zerosUnscaled = 0;
    for (uint32_t i = 0; i < rank.params()->size(); ++i) {
      const float *w = masters ? ex->master(int(i)) : ex->weight(int(i));
      const float *g = ex == &gpu ? gpu.grad(int(i)) : cpu.grad(int(i));
      ASSERT_NE(w, nullptr);
      double part = 0;
      for (int64_t k = 0; k < ex->param_elements(int(i)); ++k) {
        part += double(w[k]) * double(w[k]);
        zeros += g[k] == 0.0f;
        zerosUnscaled += g[k] * 0.25f == 0.0f;
      }
      sq += part;
    }
    ASSERT_GT(zerosUnscaled, zeros);
    double got = 0;
    ASSERT_EQ(ex->params_sum_squares(&got), "");
    EXPECT_NEAR(got, sq, 1e-12 * sq); // sums in another order
    mt::rt::Executor::GradStats s;
    ASSERT_EQ(ex->grad_stats(1.0f, 1.0f, &s), "");
    EXPECT_EQ(s.zeros, zeros);
    EXPECT_EQ(s.nans, 1);
    EXPECT_EQ(s.infs, 1);
    ASSERT_EQ(ex->grad_stats(0.5f, 0.5f, &s), "");
    EXPECT_EQ(s.zeros, zerosUnscaled);
  }
  // Memory: the state buffer lives between iterations; the one allocation
  // adds the arena and the workspaces; the CPU's buffers are its own.
  const mt::rt::Executor::MemoryStats gm = gpu.memory_stats(), cm = cpu.memory_stats();
  EXPECT_EQ(gm.allocated, rank.state_bytes());
  EXPECT_GE(gm.max_allocated, rank.state_bytes() + rank.arena_bytes());
  EXPECT_EQ(gm.reserved, gm.max_allocated); // the emulated device allocates nothing itself
  EXPECT_EQ(cm.allocated, cpu.cpu_state_bytes());
  EXPECT_EQ(cm.max_allocated, cpu.cpu_state_bytes() + cpu.cpu_arena_bytes());
}

TEST(LogStats, FiguresMatchTheHostViewsF32) { figuresMatchTheHostViews({}); }
TEST(LogStats, FiguresMatchTheHostViewsBf16Masters) {
  figuresMatchTheHostViews({{"training.precision=\"bf16\""}});
}
TEST(LogStats, FiguresMatchTheHostViewsFp16Weights) {
  figuresMatchTheHostViews({{"training.precision=\"fp16\""}});
}

} // namespace
