// Expert parallelism through the plan writer: what plan.bin (format 17)
// carries of a tp 2 x ep 2 MoE spec with sequence parallelism, with whole
// experts (expert_tensor_parallel_size 1) and with each expert split over
// 2 expert-tensor-parallel ranks, read back through the runtime's reader and
// verifier.
#include "compiler/import/ImportSpec.h"
#include "compiler/plan/PlanWriter.h"
#include "dialects/mt/MtOps.h"
#include "passes/Passes.h"
#include "runtime/plan/plan_reader.h"
#include "spec/Spec.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace pl = mt::plan;

// 4 SwiGLU experts of FFN 24 in both layers, top-2, the z-loss on; each
// rank's sequence shard is 2 x 8 = 16 tokens.
std::string specText(const std::string &dispatcher, int etp = 1) {
  return R"toml(
[model]
num_layers = 2
hidden_size = 32
num_attention_heads = 4
seq_length = 16
vocab_size = 100
swiglu = true
add_bias_linear = false
num_experts = 4
moe_ffn_hidden_size = 24
moe_router_topk = 2
moe_aux_loss_coeff = 1e-2
moe_z_loss_coeff = 1e-3

[training]
micro_batch_size = 2
train_iters = 1
lr = 1e-3

[parallel]
tensor_model_parallel_size = 2
sequence_parallel = true
expert_model_parallel_size = 2
data_parallel_size = )toml" +
         std::to_string(etp) + "\nexpert_tensor_parallel_size = " + std::to_string(etp) +
         "\nmoe_token_dispatcher_type = \"" + dispatcher + R"toml("

[data]
mock_data = true
)toml";
}

std::unique_ptr<mt::rt::PlanFile> compile(const std::string &dispatcher, int etp = 1) {
  absl::StatusOr<mt::spec::Spec> spec =
      mt::spec::parseSpecString(specText(dispatcher, etp), "ep.toml");
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  if (!spec.ok())
    return nullptr;
  mlir::MLIRContext context;
  context.loadDialect<mt::MtDialect, mlir::func::FuncDialect>();
  mlir::OwningOpRef<mlir::ModuleOp> module = mt::importSpec(context, *spec);
  EXPECT_TRUE(module);
  if (!module)
    return nullptr;
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
      "ep.plan", &error);
  EXPECT_TRUE(file) << error;
  return file;
}

std::vector<int64_t> ints(const pl::Instruction &i) {
  return i.ints() ? std::vector<int64_t>(i.ints()->begin(), i.ints()->end())
                  : std::vector<int64_t>{};
}

std::vector<int64_t> shapeOf(const pl::Program &p, uint32_t value) {
  const auto *s = p.values()->Get(value)->shape();
  return std::vector<int64_t>(s->begin(), s->end());
}

TEST(ExpertPlan, ParallelFieldsAndParams) {
  auto file = compile("alltoall");
  ASSERT_TRUE(file);
  const pl::Plan &plan = *file->plan();
  EXPECT_EQ(plan.expert_model_parallel(), 2);
  EXPECT_EQ(plan.expert_tensor_parallel(), 1);
  EXPECT_EQ(plan.tensor_parallel(), 2);
  std::map<std::string, const pl::Param *> params;
  for (const pl::Param *p : *plan.ranks()->Get(0)->params())
    params[p->name()->str()] = p;
  for (int layer = 0; layer < 2; ++layer) {
    const std::string l = "decoder.layers." + std::to_string(layer) + ".mlp.";
    const pl::Param *fc1 = params.at(l + "experts.linear_fc1.weight");
    const pl::Param *fc2 = params.at(l + "experts.linear_fc2.weight");
    const pl::Param *router = params.at(l + "router.weight");
    // The rank's 2 of 4 experts, whole (no tensor-parallel split).
    EXPECT_EQ(std::vector<int64_t>(fc1->shape()->begin(), fc1->shape()->end()),
              (std::vector<int64_t>{2, 48, 32}));
    EXPECT_EQ(std::vector<int64_t>(fc2->shape()->begin(), fc2->shape()->end()),
              (std::vector<int64_t>{2, 32, 24}));
    for (const pl::Param *e : {fc1, fc2}) {
      EXPECT_EQ(e->ep_dim(), 0);
      EXPECT_TRUE(e->expert());
      EXPECT_EQ(e->tp_dim(), -1);
    }
    EXPECT_EQ(router->ep_dim(), -1);
    EXPECT_FALSE(router->expert());
    EXPECT_EQ(router->tp_dim(), -1);
  }
  // Dense parameters are neither.
  const pl::Param *qkv = params.at("decoder.layers.0.self_attention.linear_qkv.weight");
  EXPECT_EQ(qkv->ep_dim(), -1);
  EXPECT_FALSE(qkv->expert());
}

// train_step: per MoE layer a forward dispatch and combine and the backward's
// pair, over group 4 with L = 2 local experts; the router counts its tokens
// over tp (count_group 1) with the z-loss coefficient divided by tp.
void checkProgram(const std::string &dispatcher, int64_t code) {
  auto file = compile(dispatcher);
  ASSERT_TRUE(file);
  const pl::Plan &plan = *file->plan();
  const pl::Program *step = nullptr;
  for (const pl::Program *p : *plan.ranks()->Get(0)->programs())
    if (p->name()->str() == "train_step")
      step = p;
  ASSERT_TRUE(step);
  int dispatches = 0, combines = 0, routers = 0;
  for (const pl::Instruction *i : *step->instructions()) {
    if (i->op() == pl::Opcode::MOE_DISPATCH) {
      ++dispatches;
      EXPECT_EQ(ints(*i), (std::vector<int64_t>{4, 2, code, 1}));
      // in: y [N = 16 tokens x top-2, 32], counts [4]; out: R = ep x 16 x
      // min(2, 2) rows, local counts [2], layout [2, 2].
      EXPECT_EQ(shapeOf(*step, i->in()->Get(0)), (std::vector<int64_t>{32, 32}));
      EXPECT_EQ(shapeOf(*step, i->in()->Get(1)), (std::vector<int64_t>{4}));
      EXPECT_EQ(shapeOf(*step, i->out()->Get(0)), (std::vector<int64_t>{64, 32}));
      EXPECT_EQ(shapeOf(*step, i->out()->Get(1)), (std::vector<int64_t>{2}));
      EXPECT_EQ(shapeOf(*step, i->out()->Get(2)), (std::vector<int64_t>{2, 2}));
    } else if (i->op() == pl::Opcode::MOE_COMBINE) {
      ++combines;
      EXPECT_EQ(ints(*i), (std::vector<int64_t>{4, 2, code, 1}));
      EXPECT_EQ(shapeOf(*step, i->in()->Get(0)), (std::vector<int64_t>{64, 32}));
      EXPECT_EQ(shapeOf(*step, i->out()->Get(0)), (std::vector<int64_t>{32, 32}));
    } else if (i->op() == pl::Opcode::MOE_ROUTER || i->op() == pl::Opcode::MOE_ROUTER_GRAD) {
      ++routers;
      std::vector<int64_t> v = ints(*i);
      ASSERT_EQ(v.size(), 10u);
      EXPECT_EQ(v[7], 8);  // seq_length of the shard
      EXPECT_EQ(v[9], 1);  // count_group: tp
      EXPECT_DOUBLE_EQ(i->floats()->Get(2), 1e-3 / 2);
    }
  }
  EXPECT_EQ(dispatches, 4);
  EXPECT_EQ(combines, 4);
  EXPECT_EQ(routers, 4);
}

TEST(ExpertPlan, AllToAllExchange) { checkProgram("alltoall", 0); }
TEST(ExpertPlan, AllGatherExchange) { checkProgram("allgather", 1); }

// Expert tensor parallelism: tp 2 x dp 2 x ep 2 with etp 2 (edp 1). Each
// rank holds its ep rank's 2 experts, FC1 split on dim 1 in SwiGLU's two
// halves (48 -> 24 rows), FC2 on dim 2 (24 -> 12 columns); the exchange runs
// over group 7 (tp_ep) among S = 4 ranks: R = 4 x 16 x min(2, 2) rows and a
// [4, 2] layout, ints[3] = etp.
void checkExpertTensorParallel(const std::string &dispatcher, int64_t code) {
  auto file = compile(dispatcher, 2);
  ASSERT_TRUE(file);
  const pl::Plan &plan = *file->plan();
  EXPECT_EQ(plan.expert_model_parallel(), 2);
  EXPECT_EQ(plan.expert_tensor_parallel(), 2);
  std::map<std::string, const pl::Param *> params;
  for (const pl::Param *p : *plan.ranks()->Get(0)->params())
    params[p->name()->str()] = p;
  const pl::Param *fc1 = params.at("decoder.layers.0.mlp.experts.linear_fc1.weight");
  const pl::Param *fc2 = params.at("decoder.layers.0.mlp.experts.linear_fc2.weight");
  EXPECT_EQ(std::vector<int64_t>(fc1->shape()->begin(), fc1->shape()->end()),
            (std::vector<int64_t>{2, 24, 32}));
  EXPECT_EQ(std::vector<int64_t>(fc2->shape()->begin(), fc2->shape()->end()),
            (std::vector<int64_t>{2, 32, 12}));
  EXPECT_EQ(fc1->tp_dim(), 1);
  EXPECT_EQ(fc1->tp_blocks(), 2);
  EXPECT_EQ(fc2->tp_dim(), 2);
  EXPECT_EQ(fc2->tp_blocks(), 1);
  for (const pl::Param *e : {fc1, fc2}) {
    EXPECT_EQ(e->ep_dim(), 0);
    EXPECT_TRUE(e->expert());
  }
  const pl::Program *step = nullptr;
  for (const pl::Program *p : *plan.ranks()->Get(0)->programs())
    if (p->name()->str() == "train_step")
      step = p;
  ASSERT_TRUE(step);
  int exchanges = 0;
  for (const pl::Instruction *i : *step->instructions()) {
    if (i->op() == pl::Opcode::MOE_DISPATCH) {
      ++exchanges;
      EXPECT_EQ(ints(*i), (std::vector<int64_t>{7, 2, code, 2}));
      EXPECT_EQ(shapeOf(*step, i->out()->Get(0)), (std::vector<int64_t>{128, 32}));
      EXPECT_EQ(shapeOf(*step, i->out()->Get(2)), (std::vector<int64_t>{4, 2}));
    } else if (i->op() == pl::Opcode::MOE_COMBINE) {
      ++exchanges;
      EXPECT_EQ(ints(*i), (std::vector<int64_t>{7, 2, code, 2}));
      EXPECT_EQ(shapeOf(*step, i->in()->Get(0)), (std::vector<int64_t>{128, 32}));
    } else if (i->op() == pl::Opcode::GROUPED_MATMUL) {
      // The first matmul's output is 1/etp of FC1's rows, the second's whole.
      const int64_t cols = shapeOf(*step, i->out()->Get(0))[1];
      EXPECT_TRUE(cols == 24 || cols == 32) << cols;
    }
  }
  EXPECT_EQ(exchanges, 8);
}

TEST(ExpertPlan, ExpertTensorParallelAllToAll) { checkExpertTensorParallel("alltoall", 0); }
TEST(ExpertPlan, ExpertTensorParallelAllGather) { checkExpertTensorParallel("allgather", 1); }

} // namespace
