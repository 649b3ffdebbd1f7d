// Whole-model gradients through the real pipeline: a spec compiled by mtc's
// passes (autodiff, optimizer, recompute, fuse, memory plan) into a plan, run
// by the CPU executor, against central finite differences of the loss.
#include "compiler/import/ImportSpec.h"
#include "compiler/plan/PlanWriter.h"
#include "dialects/mt/MtOps.h"
#include "passes/Passes.h"
#include "runtime/exec/cpu_executor.h"
#include "runtime/plan/plan_reader.h"
#include "spec/Spec.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

namespace pl = mt::plan;

// Small enough for finite differences, big enough to have every op: 2 layers,
// GQA-free MHA, tied embeddings, learned positions, biases, GeLU. Dropout is
// off so that train_step and eval_step compute the same function.
constexpr const char *kGpt = R"toml(
[model]
num_layers = 2
hidden_size = 16
num_attention_heads = 2
seq_length = 8
vocab_size = 50
make_vocab_size_divisible_by = 64
hidden_dropout = 0.0
attention_dropout = 0.0

[training]
micro_batch_size = 2
global_batch_size = 4
train_iters = 1
lr = 1e-3

[data]
mock_data = true
)toml";

// Llama-style: RMSNorm, SwiGLU, RoPE, GQA, untied output layer, no biases.
constexpr const char *kLlama = R"toml(
[model]
num_layers = 2
hidden_size = 16
num_attention_heads = 4
num_query_groups = 2
seq_length = 8
vocab_size = 50
make_vocab_size_divisible_by = 64
normalization = "RMSNorm"
swiglu = true
ffn_hidden_size = 32
position_embedding_type = "rope"
untie_embeddings_and_output_weights = true
add_bias_linear = false
hidden_dropout = 0.0
attention_dropout = 0.0

[training]
micro_batch_size = 2
global_batch_size = 4
train_iters = 1
lr = 1e-3

[data]
mock_data = true
)toml";

// Mixture of experts: every layer's MLP is 4 experts with top-2 routing, the
// load-balancing loss and the z-loss on (both reach the gradient through the
// router), a shared expert; SwiGLU experts as in Mixtral.
constexpr const char *kMoe = R"toml(
[model]
num_layers = 2
hidden_size = 16
num_attention_heads = 4
seq_length = 8
vocab_size = 50
make_vocab_size_divisible_by = 64
normalization = "RMSNorm"
swiglu = true
ffn_hidden_size = 32
position_embedding_type = "rope"
untie_embeddings_and_output_weights = true
add_bias_linear = false
hidden_dropout = 0.0
attention_dropout = 0.0
num_experts = 4
moe_router_topk = 2
moe_ffn_hidden_size = 8
moe_aux_loss_coeff = 0.1
moe_z_loss_coeff = 0.01
moe_shared_expert_intermediate_size = 8

[training]
micro_batch_size = 2
global_batch_size = 4
train_iters = 1
lr = 1e-3

[data]
mock_data = true
)toml";

std::unique_ptr<mt::rt::PlanFile> compile(const char *toml,
                                          const std::vector<mt::spec::Override> &overrides) {
  absl::StatusOr<mt::spec::Spec> spec = mt::spec::parseSpecString(toml, "grad.toml", overrides);
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
      "grad.plan", &error);
  EXPECT_TRUE(file) << error;
  return file;
}

uint32_t named(const flatbuffers::Vector<uint32_t> *ids,
               const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>> *names,
               const char *name) {
  for (uint32_t i = 0; i < ids->size(); ++i)
    if (names->Get(i)->str() == name)
      return ids->Get(i);
  ADD_FAILURE() << "no value named " << name;
  return 0;
}

class Model {
public:
  explicit Model(const mt::rt::PlanFile &file) : plan(*file.plan()), exec(plan, 0) {
    exec.set_seed(7);
    exec.set_check_memory_plan(true);
    exec.init_params(7);
    train = exec.program("train_step");
    eval = exec.program("eval_step");
    std::mt19937 rng(3);
    // Larger weights than the 0.02 init, so every path carries gradient.
    for (uint32_t i = 0; i < params(); ++i) {
      float *w = exec.weight(int(i));
      std::normal_distribution<float> d(0.0f, 0.3f);
      for (int64_t j = 0; j < exec.param_elements(int(i)); ++j)
        w[j] += d(rng);
    }
  }
  // Programs share the arena, so inputs are written right before each run:
  // the same random tokens and labels, below the unpadded vocabulary.
  void fill(const pl::Program *p) {
    auto *tok = static_cast<int32_t *>(
        exec.value_data(*p, named(p->inputs(), p->input_names(), "tokens")));
    auto *lab = static_cast<int32_t *>(
        exec.value_data(*p, named(p->inputs(), p->input_names(), "labels")));
    std::mt19937 local(3);
    for (int i = 0; i < 16; ++i) {
      tok[i] = int32_t(local() % 50);
      lab[i] = int32_t(local() % 50);
    }
  }
  uint32_t params() const { return plan.ranks()->Get(0)->params()->size(); }
  std::string name(uint32_t i) const {
    return plan.ranks()->Get(0)->params()->Get(i)->name()->str();
  }
  // The objective train_step differentiates: the loss plus, for an MoE
  // model, each router loss eval_step outputs (summed over layers, without
  // its coefficient) times its coefficient.
  double loss() {
    fill(eval);
    EXPECT_EQ(exec.run(*eval, 0), "");
    double total = 0;
    for (uint32_t i = 0; i < eval->outputs()->size(); ++i) {
      const std::string name = eval->output_names()->Get(i)->str();
      const double coeff = name == "loss"                  ? 1.0
                           : name == "load_balancing_loss" ||
                                   name == "seq_load_balancing_loss"
                               ? auxCoeff
                           : name == "z_loss"              ? zCoeff
                                                           : 0.0;
      EXPECT_NE(coeff, 0.0) << "eval_step output " << name;
      total += coeff * double(*static_cast<float *>(exec.value_data(*eval, eval->outputs()->Get(i))));
    }
    return total;
  }
  double auxCoeff = 0, zCoeff = 0;
  void gradients() {
    exec.zero_grads();
    fill(train);
    EXPECT_EQ(exec.run(*train, 0), "");
  }
  const pl::Plan &plan;
  mt::rt::CpuExecutor exec;
  const pl::Program *train = nullptr, *eval = nullptr;
};

// The gradient train_step accumulates (seed 1/2 for two micro-batches, so
// times 2) against central differences of eval_step's loss: per parameter
// along a random direction, which is robust in f32, and on the largest
// single coordinates.
// `h` is the step per element: small enough for the model's curvature (the
// RMSNorm/SwiGLU model needs 1e-3), large enough for f32 round-off.
void checkGradients(const char *toml, float h,
                    const std::vector<mt::spec::Override> &overrides = {},
                    double auxCoeff = 0, double zCoeff = 0) {
  auto file = compile(toml, overrides);
  ASSERT_TRUE(file);
  Model m(*file);
  m.auxCoeff = auxCoeff;
  m.zCoeff = zCoeff;
  m.gradients();
  std::mt19937 rng(11);

  for (uint32_t p = 0; p < m.params(); ++p) {
    float *w = m.exec.weight(int(p));
    const float *g = m.exec.grad(int(p));
    int64_t n = m.exec.param_elements(int(p));
    std::vector<float> dir(static_cast<size_t>(n));
    std::normal_distribution<float> d;
    double analytic = 0, norm = 0;
    for (int64_t j = 0; j < n; ++j) {
      dir[size_t(j)] = d(rng);
      analytic += 2.0 * double(g[j]) * dir[size_t(j)];
      norm += double(dir[size_t(j)]) * dir[size_t(j)];
    }
    std::vector<float> saved(w, w + n);
    double step = h / std::sqrt(norm / double(n));
    for (int64_t j = 0; j < n; ++j)
      w[j] = saved[size_t(j)] + float(step) * dir[size_t(j)];
    double up = m.loss();
    for (int64_t j = 0; j < n; ++j)
      w[j] = saved[size_t(j)] - float(step) * dir[size_t(j)];
    double down = m.loss();
    std::memcpy(w, saved.data(), size_t(n) * sizeof(float));
    double numeric = (up - down) / (2.0 * step);
    EXPECT_NEAR(analytic, numeric, 2e-2 * std::max(1e-1, std::fabs(numeric)))
        << m.name(p) << ": directional derivative";
  }
}

TEST(ModelGradients, GptMatchesFiniteDifferences) { checkGradients(kGpt, 1e-2f); }

TEST(ModelGradients, LlamaMatchesFiniteDifferences) { checkGradients(kLlama, 1e-3f); }

// The router's choice is piecewise constant in the weights: a step of 1e-3
// already moves a token to another expert on one side (the word embeddings'
// direction, which moves every token), so these take 3e-4, which keeps every
// choice on both sides.
TEST(ModelGradients, MoeMatchesFiniteDifferences) { checkGradients(kMoe, 3e-4f, {}, 0.1, 0.01); }

// Sigmoid scores with the sequence-level loss, pre-softmax-free scaling, and a
// capacity that drops tokens (capacity factor 0.5: 4 of each expert's
// tokens kept), by position.
TEST(ModelGradients, MoeSigmoidCapacityMatchesFiniteDifferences) {
  checkGradients(kMoe, 3e-4f,
                 {{"model.moe_router_score_function=\"sigmoid\""},
                  {"model.moe_router_load_balancing_type=\"seq_aux_loss\""},
                  {"model.moe_router_topk_scaling_factor=2.5"},
                  {"model.moe_expert_capacity_factor=0.5"},
                  {"model.moe_token_drop_policy=\"position\""}},
                 0.1, 0.01);
}

TEST(ModelGradients, FullRecomputeMatchesFiniteDifferences) {
  checkGradients(kGpt, 1e-2f, {{"parallel.recompute_granularity=\"full\""},
                        {"parallel.recompute_method=\"uniform\""},
                        {"parallel.recompute_num_layers=1"}});
}

// Recompute and fusion change where values are computed, never what: the
// gradients are bit-identical to the plain plan's.
TEST(ModelGradients, RecomputeGivesIdenticalGradients) {
  auto plain = compile(kGpt, {});
  auto full = compile(kGpt, {{"parallel.recompute_granularity=\"full\""},
                             {"parallel.recompute_method=\"block\""},
                             {"parallel.recompute_num_layers=2"}});
  ASSERT_TRUE(plain && full);
  Model a(*plain), b(*full);
  a.gradients();
  b.gradients();
  ASSERT_EQ(a.params(), b.params());
  for (uint32_t p = 0; p < a.params(); ++p)
    EXPECT_EQ(0, std::memcmp(a.exec.grad(int(p)), b.exec.grad(int(p)),
                             size_t(a.exec.param_elements(int(p))) * sizeof(float)))
        << a.name(p);
}

} // namespace
