// mt-fuse through the plan writer and the CPU executor: the kernel-table entry
// one mt.fused becomes (bound values, kernel-local scratch, body
// instructions), and bit-identical results with and without fusion.
#include "compiler/plan/PlanWriter.h"
#include "dialects/mt/MtOps.h"
#include "passes/Passes.h"
#include "runtime/exec/cpu_executor.h"
#include "runtime/plan/plan_reader.h"
#include "spec/Spec.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace pl = mt::plan;

// No GEMM produces the bias add's input (as after a tensor-parallel
// reduction), so no epilogue takes it and the whole chain is one kernel with
// three values of its own.
constexpr const char *kProgram = R"mlir(
mt.param @decoder.layers.3.mlp.linear_fc2.bias : tensor<32xf32>, normal(5.000000e-01)
func.func @step(%y: tensor<2x4x32xf32> {mt.name = "y"}, %res: tensor<2x4x32xf32> {mt.name = "res"}) -> tensor<2x4x32xf32> {
  %b = mt.param_ref @decoder.layers.3.mlp.linear_fc2.bias : tensor<32xf32>
  %yb = mt.bias_add %y, %b {mt.layer = 3 : i64} : tensor<2x4x32xf32>, tensor<32xf32>
  %g = mt.gelu %yb tanh {mt.layer = 3 : i64} : tensor<2x4x32xf32>
  %d = mt.dropout %g {mt.layer = 3 : i64, rate = 2.500000e-01 : f64, stream = 3 : i64} : tensor<2x4x32xf32>
  %r = mt.add %d, %res {mt.layer = 3 : i64} : tensor<2x4x32xf32>
  return %r : tensor<2x4x32xf32>
}
)mlir";

constexpr const char *kSpec = R"toml(
[model]
num_layers = 4
hidden_size = 32
num_attention_heads = 4
seq_length = 4
vocab_size = 256

[training]
micro_batch_size = 2
train_iters = 1
lr = 1e-3

[data]
mock_data = true
)toml";

constexpr int64_t kElements = 2 * 4 * 32;

// The plan file of kProgram after mt-plan-memory, with mt-fuse before it or not.
std::unique_ptr<mt::rt::PlanFile> compile(bool fuse) {
  absl::StatusOr<mt::spec::Spec> spec = mt::spec::parseSpecString(kSpec, "fuse.toml");
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  if (!spec.ok())
    return nullptr;
  mlir::MLIRContext context;
  context.loadDialect<mt::MtDialect, mlir::func::FuncDialect>();
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceString<mlir::ModuleOp>(kProgram, &context);
  EXPECT_TRUE(module);
  if (!module)
    return nullptr;
  mlir::PassManager pm(&context);
  if (fuse)
    pm.addPass(mt::createMtFusePass());
  pm.addPass(mt::createMtPlanMemoryPass());
  EXPECT_TRUE(mlir::succeeded(pm.run(*module)));
  mlir::FailureOr<std::string> payload = mt::buildPlanPayload(*module, *spec);
  EXPECT_TRUE(mlir::succeeded(payload));
  if (mlir::failed(payload))
    return nullptr;
  std::string error;
  auto file = mt::rt::PlanFile::from_bytes(
      mt::rt::wrap_plan_payload(reinterpret_cast<const uint8_t *>(payload->data()),
                                payload->size()),
      fuse ? "fused.plan" : "unfused.plan", &error);
  EXPECT_TRUE(file) << error;
  return file;
}

std::vector<uint32_t> indices(const flatbuffers::Vector<uint32_t> *v) {
  return v ? std::vector<uint32_t>(v->begin(), v->end()) : std::vector<uint32_t>{};
}

TEST(FusePlan, KernelEntry) {
  auto file = compile(true);
  ASSERT_TRUE(file);
  const pl::Plan &plan = *file->plan();
  ASSERT_EQ(plan.kernels()->size(), 1u);
  const pl::Kernel &k = *plan.kernels()->Get(0);
  EXPECT_EQ(k.name()->str(), "decoder.layers.3 bias_add+gelu+dropout+add");
  // The CUDA form (compiler/cuda/CudaKernelGen): 256 f32 elements, 4 per thread,
  // one block of 64; dropout takes the seed, the offset and its stream.
  EXPECT_NE(k.cuda_source()->str().find(k.entry()->str()), std::string::npos);
  EXPECT_EQ(k.entry()->str().rfind("mt_bias_add_gelu_dropout_add_", 0), 0u);
  EXPECT_EQ(indices(k.grid()), (std::vector<uint32_t>{1, 1, 1}));
  EXPECT_EQ(indices(k.block()), (std::vector<uint32_t>{64, 1, 1}));
  EXPECT_EQ(k.shared_bytes(), 0u);
  ASSERT_EQ(k.scalar_args()->size(), 3u);
  EXPECT_EQ(k.scalar_args()->Get(0)->str(), "seed");
  EXPECT_EQ(k.scalar_args()->Get(1)->str(), "rng_offset");
  EXPECT_EQ(k.scalar_args()->Get(2)->str(), "stream");
  ASSERT_EQ(k.streams()->size(), 1u);
  EXPECT_EQ(k.streams()->Get(0), 3u);

  // Inputs in first-use order (y, the bias, the residual), the output, then
  // the three values the kernel keeps to itself.
  ASSERT_EQ(k.cpu_values()->size(), 7u);
  // A [2, 4, 32] f32 value takes 1024 bytes: the bias add's result and the
  // gelu's are live together, the dropout's reuses the bias add's bytes.
  EXPECT_EQ(k.cpu_values()->Get(4)->offset(), 0u);
  EXPECT_EQ(k.cpu_values()->Get(5)->offset(), 1024u);
  EXPECT_EQ(k.cpu_values()->Get(6)->offset(), 0u);
  EXPECT_EQ(k.cpu_scratch_bytes(), 2048u);

  const auto &code = *k.cpu_instructions();
  ASSERT_EQ(code.size(), 4u);
  EXPECT_EQ(code.Get(0)->op(), pl::Opcode::BIAS_ADD);
  EXPECT_EQ(indices(code.Get(0)->in()), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(indices(code.Get(0)->out()), (std::vector<uint32_t>{4}));
  EXPECT_EQ(code.Get(1)->op(), pl::Opcode::GELU);
  EXPECT_EQ(code.Get(2)->op(), pl::Opcode::DROPOUT);
  EXPECT_EQ(indices(code.Get(2)->out()), (std::vector<uint32_t>{6}));
  EXPECT_EQ(code.Get(3)->op(), pl::Opcode::ADD);
  EXPECT_EQ(indices(code.Get(3)->in()), (std::vector<uint32_t>{6, 2}));
  EXPECT_EQ(indices(code.Get(3)->out()), (std::vector<uint32_t>{3}));

  // The program runs it as one FUSED instruction.
  const pl::Program &prog = *plan.ranks()->Get(0)->programs()->Get(0);
  ASSERT_EQ(prog.instructions()->size(), 1u);
  const pl::Instruction &fused = *prog.instructions()->Get(0);
  EXPECT_EQ(fused.op(), pl::Opcode::FUSED);
  EXPECT_EQ(fused.ints()->Get(0), 0);
  EXPECT_EQ(fused.in()->size(), 3u);
  EXPECT_EQ(fused.out()->size(), 1u);
  EXPECT_EQ(fused.where()->str(),
            "mt.fused decoder.layers.3 bias_add+gelu+dropout+add");
}

// Runs @step on fixed inputs; returns its output.
std::vector<float> run(const mt::rt::PlanFile &file) {
  mt::rt::CpuExecutor ex(*file.plan(), 0);
  ex.init_params(7);
  ex.set_seed(11);
  const pl::Program *prog = ex.program("step");
  EXPECT_TRUE(prog);
  if (!prog)
    return {};
  for (uint32_t k = 0; k < 2; ++k) {
    float *in = static_cast<float *>(ex.value_data(*prog, prog->inputs()->Get(k)));
    for (int64_t i = 0; i < kElements; ++i)
      in[i] = std::sin(0.1f * float(i) + float(k));
  }
  EXPECT_EQ(ex.run(*prog, 5), "");
  const float *out = static_cast<const float *>(ex.value_data(*prog, prog->outputs()->Get(0)));
  return std::vector<float>(out, out + kElements);
}

TEST(FusePlan, SameResultsWithoutFusion) {
  auto fused = compile(true), unfused = compile(false);
  ASSERT_TRUE(fused && unfused);
  // Without mt-fuse no instruction is FUSED (the plan's kernels are then
  // only the GPU forms of single instructions, with no CPU form).
  for (const pl::Kernel *k : *unfused->plan()->kernels())
    EXPECT_EQ(k->cpu_instructions()->size(), 0u);
  std::vector<float> a = run(*fused), b = run(*unfused);
  ASSERT_EQ(a.size(), size_t(kElements));
  ASSERT_EQ(b.size(), size_t(kElements));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

} // namespace
