// compiler/cuda/CudaKernelGen on hand-written mt.fused regions (ops and shapes the
// presets do not reach: SwiGLU and its gradient, GeLU gradients, a norm with
// ops after it, a count that needs a scalar tail), and each generated source
// through NVRTC for sm_80 when the library is present.
#include "compiler/cuda/CudaKernelGen.h"
#include "runtime/exec/cuda/cuda_api.h"
#include "runtime/exec/cuda/kernel_cache.h"
#include "dialects/mt/MtOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

constexpr const char *kModule = R"mlir(
func.func @k(%x: tensor<4x96xbf16>, %b: tensor<96xbf16>, %r: tensor<4x48xbf16>, %dy: tensor<4x48xf32>,
             %xf: tensor<4x96xf32>, %h: tensor<3x5x7xf16>, %w: tensor<96xbf16>, %lb: tensor<96xbf16>,
             %t: tensor<4x96xbf16>)
    -> (tensor<4x48xbf16>, tensor<4x96xf32>, tensor<3x5x7xf16>, tensor<4x96xbf16>) {
  %0 = mt.fused elementwise "bias_add+swiglu+dropout+add" (%a = %x, %bb = %b, %rr = %r)
      : (tensor<4x96xbf16>, tensor<96xbf16>, tensor<4x48xbf16>) -> tensor<4x48xbf16> {
    %1 = mt.bias_add %a, %bb : tensor<4x96xbf16>, tensor<96xbf16>
    %2 = mt.swiglu %1 : (tensor<4x96xbf16>) -> tensor<4x48xbf16>
    %3 = mt.dropout %2 {rate = 1.000000e-01 : f64, stream = 7 : i64} : tensor<4x48xbf16>
    %4 = mt.add %3, %rr : tensor<4x48xbf16>
    mt.yield %4 : tensor<4x48xbf16>
  }
  %5 = mt.fused elementwise "swiglu_grad+gelu_grad" (%g = %dy, %in = %xf)
      : (tensor<4x48xf32>, tensor<4x96xf32>) -> tensor<4x96xf32> {
    %6 = mt.swiglu_grad %g, %in : (tensor<4x48xf32>, tensor<4x96xf32>) -> tensor<4x96xf32>
    %7 = mt.gelu_grad %6, %in erf : tensor<4x96xf32>
    mt.yield %7 : tensor<4x96xf32>
  }
  %8 = mt.fused elementwise "gelu+dropout" (%hh = %h) : (tensor<3x5x7xf16>) -> tensor<3x5x7xf16> {
    %9 = mt.gelu %hh tanh : tensor<3x5x7xf16>
    %10 = mt.dropout %9 {rate = 5.000000e-01 : f64, stream = 1 : i64} : tensor<3x5x7xf16>
    mt.yield %10 : tensor<3x5x7xf16>
  }
  %11 = mt.fused row_reduction "add+layer_norm+dropout" (%p = %x, %q = %t, %ww = %w, %bl = %lb)
      : (tensor<4x96xbf16>, tensor<4x96xbf16>, tensor<96xbf16>, tensor<96xbf16>) -> tensor<4x96xbf16> {
    %12 = mt.add %p, %q : tensor<4x96xbf16>
    %13 = mt.layer_norm %12, %ww, %bl {epsilon = 1.000000e-05 : f64} : tensor<4x96xbf16>, tensor<96xbf16>
    %14 = mt.dropout %13 {rate = 1.000000e-01 : f64, stream = 4 : i64} : tensor<4x96xbf16>
    mt.yield %14 : tensor<4x96xbf16>
  }
  return %0, %5, %8, %11 : tensor<4x48xbf16>, tensor<4x96xf32>, tensor<3x5x7xf16>, tensor<4x96xbf16>
}
)mlir";

struct Generated {
  std::string name;
  mt::CudaKernel kernel;
};

std::vector<Generated> generateAll(int64_t tp = 1) {
  mlir::MLIRContext context;
  context.loadDialect<mt::MtDialect, mlir::func::FuncDialect>();
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceString<mlir::ModuleOp>(kModule, &context);
  EXPECT_TRUE(module);
  std::vector<Generated> out;
  if (!module)
    return out;
  module->walk([&](mt::FusedOp fused) {
    std::string error;
    mt::CudaKernelOptions options;
    options.tensorParallel = tp;
    std::optional<mt::CudaKernel> k = mt::generateCudaKernel(fused, options, &error);
    EXPECT_TRUE(k) << fused.getName().str() << ": " << error;
    if (k)
      out.push_back({fused.getName().str(), *k});
  });
  return out;
}

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

TEST(CudaKernelGen, ShapesLanesAndArguments) {
  std::vector<Generated> ks = generateAll();
  ASSERT_EQ(ks.size(), 4u);

  // bf16, bias of 96 and SwiGLU's f = 48: both divide by 8, so 8 lanes.
  const mt::CudaKernel &swiglu = ks[0].kernel;
  EXPECT_EQ(swiglu.vectorWidth, 8);
  EXPECT_EQ(swiglu.grid[0], 1u); // 192 outputs / 8 = 24 threads, one block of 32
  EXPECT_EQ(swiglu.block[0], 32u);
  EXPECT_EQ(swiglu.scalarArgs, (std::vector<std::string>{"seed", "rng_offset", "stream"}));
  EXPECT_EQ(swiglu.streams, (std::vector<uint64_t>{7}));
  EXPECT_TRUE(contains(swiglu.source, "(i) / 48ll * 96ll + (i) % 48ll + 48ll")) << swiglu.source;
  EXPECT_TRUE(contains(swiglu.source, "% 96ll")) << swiglu.source;

  // f32 (4 lanes); SwiGLU's gradient picks its half per group of lanes.
  const mt::CudaKernel &grad = ks[1].kernel;
  EXPECT_EQ(grad.vectorWidth, 4);
  EXPECT_TRUE(grad.scalarArgs.empty());
  EXPECT_TRUE(contains(grad.source, "((i) % 96ll >= 48ll) ?")) << grad.source;
  EXPECT_TRUE(contains(grad.source, "mt_gelu_erf_grad(")) << grad.source;

  // 105 fp16 elements: 13 groups of 8, then a scalar tail.
  const mt::CudaKernel &tail = ks[2].kernel;
  EXPECT_EQ(tail.vectorWidth, 8);
  EXPECT_TRUE(contains(tail.source, "if (i + 8 <= 105ll)")) << tail.source;
  EXPECT_TRUE(contains(tail.source, "mt_body<1>(")) << tail.source;
  EXPECT_TRUE(contains(tail.source, "mt_round_f16(mt_gelu_tanh(")) << tail.source;

  // LayerNorm then dropout: 4 rows, 96 / 8 = 12 groups, one warp.
  const mt::CudaKernel &norm = ks[3].kernel;
  EXPECT_EQ(norm.grid[0], 4u);
  EXPECT_EQ(norm.block[0], 32u);
  EXPECT_EQ(norm.sharedBytes, 4u);
  EXPECT_EQ(norm.streams, (std::vector<uint64_t>{4}));
  EXPECT_TRUE(contains(norm.source, "mt_dropout<V>(")) << norm.source;
  EXPECT_TRUE(contains(norm.source, "mt_post<8>(")) << norm.source;
}

TEST(CudaKernelGen, SameOpsAndShapesGiveTheSameSource) {
  std::vector<Generated> a = generateAll(), b = generateAll();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].kernel.source, b[i].kernel.source);
    EXPECT_TRUE(contains(a[i].kernel.source, "void __launch_bounds__(" +
                                                 std::to_string(a[i].kernel.block[0]) + ") " +
                                                 a[i].kernel.entry + "("));
  }
}

TEST(CudaKernelGen, CompilesWithNvrtc) {
  std::string error;
  const mt::cu::Nvrtc *nvrtc = mt::cu::load_nvrtc(&error);
  if (!nvrtc)
    GTEST_SKIP() << error;
  auto compile = [&](const std::string &source, const std::string &name) {
    std::string cubin, e;
    mt::rt::nvrtc_compile(*nvrtc, name, source, 80, mt::rt::nvrtc_options(80), &cubin, &e);
    return e;
  };
  for (const Generated &g : generateAll())
    EXPECT_EQ(compile(g.kernel.source, g.kernel.entry), "") << g.name << "\n" << g.kernel.source;
  // A source NVRTC rejects gives its first error line.
  std::string bad = compile("extern \"C\" __global__ void k() { undefined_name = 1; }", "bad");
  EXPECT_TRUE(contains(bad, "error")) << bad;
  EXPECT_TRUE(contains(bad, "undefined_name")) << bad;
}

} // namespace
