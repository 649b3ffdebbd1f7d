// --grad-reduce-in-bf16 on the CPU executor: the gradients of a compiled
// plan (dp 2, two micro-batches a rank) against a reference built here from
// each micro-batch's f32 contribution, accumulated and reduced in bf16 step
// by step with its own round-to-nearest-even, as Megatron's DDP does with a
// bf16 grad buffer: g = bf16(g + c) per micro-batch, each rank's buffer
// scaled by 1/dp in bf16, then the ranks' buffers summed in bf16.
#include "compiler/import/ImportSpec.h"
#include "compiler/plan/PlanWriter.h"
#include "dialects/mt/MtOps.h"
#include "passes/Passes.h"
#include "runtime/comm/collectives.h"
#include "runtime/comm/parallel_groups.h"
#include "runtime/exec/cpu_executor.h"
#include "runtime/plan/plan_reader.h"
#include "spec/Spec.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace pl = mt::plan;

// Untied embeddings: every parameter gets one gradient instruction a
// micro-batch, so a micro-batch's contribution is one addition. No dropout,
// so the f32-gradient plan computes the same contributions.
constexpr const char *kSpec = R"toml(
[model]
num_layers = 2
hidden_size = 32
num_attention_heads = 4
seq_length = 16
vocab_size = 100
make_vocab_size_divisible_by = 128
untie_embeddings_and_output_weights = true
hidden_dropout = 0.0
attention_dropout = 0.0

[parallel]
data_parallel_size = 2

[training]
micro_batch_size = 2
global_batch_size = 8
train_iters = 1
lr = 1e-3
precision = "bf16"

[data]
mock_data = true
)toml";

// The reference's rounding, written out: round half to even on the 16
// dropped bits of an IEEE single (NaN never occurs here).
float bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t lsb = (u >> 16) & 1u;
  u = (u + 0x7FFFu + lsb) & 0xFFFF0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

std::unique_ptr<mt::rt::PlanFile> compile(const std::vector<mt::spec::Override> &overrides) {
  absl::StatusOr<mt::spec::Spec> spec = mt::spec::parseSpecString(kSpec, "bf16.toml", overrides);
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  if (!spec.ok())
    return nullptr;
  mlir::MLIRContext context;
  context.loadDialect<mt::MtDialect, mlir::func::FuncDialect>();
  mlir::OwningOpRef<mlir::ModuleOp> module = mt::importSpec(context, *spec);
  mlir::PassManager pm(&context);
  mt::buildTrainPipeline(pm);
  EXPECT_TRUE(mlir::succeeded(pm.run(*module)));
  mlir::FailureOr<std::string> payload = mt::buildPlanPayload(*module, *spec);
  EXPECT_TRUE(mlir::succeeded(payload));
  if (mlir::failed(payload))
    return nullptr;
  std::string error;
  auto file = mt::rt::PlanFile::from_bytes(
      mt::rt::wrap_plan_payload(reinterpret_cast<const uint8_t *>(payload->data()),
                                payload->size()),
      "bf16.plan", &error);
  EXPECT_TRUE(file) << error;
  return file;
}

void fill(mt::rt::CpuExecutor &ex, const pl::Program &p, uint32_t seed) {
  std::mt19937 rng(seed);
  for (uint32_t i = 0; i < p.inputs()->size(); ++i) {
    const std::string name = p.input_names()->Get(i)->str();
    if (name != "tokens" && name != "labels")
      continue;
    auto *ids = static_cast<int32_t *>(ex.value_data(p, p.inputs()->Get(i)));
    for (int k = 0; k < 2 * 16; ++k)
      ids[k] = int32_t(rng() % 100);
  }
}

using Grads = std::vector<std::vector<float>>; // [param][element]

Grads grads(mt::rt::CpuExecutor &ex, uint32_t params) {
  Grads g;
  for (uint32_t p = 0; p < params; ++p)
    g.emplace_back(ex.grad(int(p)), ex.grad(int(p)) + ex.param_elements(int(p)));
  return g;
}

struct RankOut {
  std::string error;
  std::vector<Grads> contributions; // [micro-batch]: the f32 plan's, from zero
  Grads reduced;                    // the bf16 plan's after @grad_norm's reduction
};

// Rank r: each micro-batch alone on the f32-gradient plan, then the step
// on the bf16 plan (both micro-batches, then @grad_norm, which opens with
// the bucket's reduction).
std::string runRank(const pl::Plan &f32, const pl::Plan &b16, int rank, mt::rt::Communicator *world,
                    RankOut &out) {
  const mt::rt::ParallelLayout layout{1, 1, 2};
  mt::rt::ParallelGroups groups;
  if (std::string e = mt::rt::make_parallel_groups(world, layout, rank, &groups); !e.empty())
    return e;
  const uint32_t params = f32.ranks()->Get(uint32_t(rank))->params()->size();
  mt::rt::CpuExecutor a(f32, rank), b(b16, rank);
  for (mt::rt::CpuExecutor *ex : {&a, &b}) {
    ex->set_groups(&groups);
    ex->set_seed(5);
    if (std::string e = ex->init_params(5); !e.empty())
      return e;
  }
  const pl::Program &ta = *a.program("train_step"), &tb = *b.program("train_step");
  for (uint32_t m = 0; m < 2; ++m) {
    a.zero_grads();
    fill(a, ta, uint32_t(10 * rank + m));
    if (std::string e = a.run(ta, m); !e.empty())
      return e;
    out.contributions.push_back(grads(a, params));
  }
  b.zero_grads();
  for (uint32_t m = 0; m < 2; ++m) {
    fill(b, tb, uint32_t(10 * rank + m));
    if (std::string e = b.run(tb, m); !e.empty())
      return e;
  }
  if (std::string e = b.run(*b.program("grad_norm"), 0); !e.empty())
    return e;
  out.reduced = grads(b, params);
  return "";
}

void checkAgainstReference(const std::vector<mt::spec::Override> &layout) {
  std::vector<mt::spec::Override> withBf16 = layout;
  withBf16.push_back({"training.grad_reduce_in_bf16=true"});
  auto f32 = compile(layout), b16 = compile(withBf16);
  ASSERT_TRUE(f32 && b16);
  const pl::Rank &r0 = *b16->plan()->ranks()->Get(0);
  ASSERT_EQ(r0.params()->Get(0)->grad_dtype(), pl::DType::BF16);
  ASSERT_EQ(f32->plan()->ranks()->Get(0)->params()->Get(0)->grad_dtype(), pl::DType::F32);
  const bool sharded = r0.distributed_optimizer();

  mt::rt::ThreadGroup group(2, std::chrono::milliseconds(60000));
  std::vector<RankOut> out(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      std::unique_ptr<mt::rt::Communicator> c = group.rank(r);
      out[size_t(r)].error = runRank(*f32->plan(), *b16->plan(), r, c.get(), out[size_t(r)]);
    });
  for (std::thread &t : threads)
    t.join();
  ASSERT_EQ(out[0].error, "");
  ASSERT_EQ(out[1].error, "");

  // BLAS may add a GEMM's products into a nonzero gradient in another order
  // than the reference's one f32 addition, which can move a sum across a
  // bf16 rounding boundary: a one-ulp difference is allowed in a few
  // elements, every other element must match bit for bit.
  int64_t total = 0, exact = 0, offByOne = 0, f32Differs = 0, owned = 0;
  for (size_t p = 0; p < out[0].reduced.size(); ++p)
    for (size_t i = 0; i < out[0].reduced[p].size(); ++i) {
      float local[2], scaled[2];
      double f32Sum = 0;
      for (int r = 0; r < 2; ++r) {
        float g = 0.0f;
        for (int m = 0; m < 2; ++m) {
          const float c = out[size_t(r)].contributions[size_t(m)][p][i];
          g = bf16(g + c);
          f32Sum += double(c);
        }
        local[r] = g;
        scaled[r] = bf16(g * 0.5f);
      }
      const float want = bf16(scaled[0] + scaled[1]);
      for (int r = 0; r < 2; ++r) {
        const float got = out[size_t(r)].reduced[p][i];
        ASSERT_EQ(bf16(got), got) << "parameter " << p << " element " << i << " rank " << r
                                  << " is not a bf16 value: the gradient was kept in f32";
        // The distributed optimizer reduce-scatters: elements outside the
        // rank's shard keep its own accumulated gradient.
        if (sharded && got != want && got == local[r])
          continue;
        ++total;
        owned += sharded;
        const float ulp = std::ldexp(1.0f, std::ilogb(want) - 7);
        if (got == want)
          ++exact;
        else if (std::fabs(got - want) <= ulp)
          ++offByOne;
        else
          ADD_FAILURE() << "parameter " << p << " element " << i << " rank " << r << ": " << got
                        << ", the bf16 reference " << want;
        f32Differs += float(f32Sum * 0.5) != got;
      }
    }
  ASSERT_GT(total, 10000);
  EXPECT_GE(exact, total - total / 100) << offByOne << " one-ulp differences of " << total;
  // The reference tells bf16 from f32: most elements differ from the f32 sum.
  EXPECT_GT(f32Differs, total / 2);
  if (sharded) {
    EXPECT_GT(owned, 0);
  }
}

TEST(GradReduceBf16, AllReduceMatchesStepwiseBf16Reference) { checkAgainstReference({}); }

TEST(GradReduceBf16, ReduceScatterMatchesStepwiseBf16Reference) {
  checkAgainstReference({{"parallel.use_distributed_optimizer=true"}});
}

} // namespace
