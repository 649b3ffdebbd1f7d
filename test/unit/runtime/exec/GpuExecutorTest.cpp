// The GPU executor (runtime/exec/gpu_executor.h) on an emulated device against
// the CPU executor: whole training steps of a compiled model, so every GPU
// step the plan writer emits (generated kernels and their arguments, GEMM
// descriptors with epilogues, flash attention, the loss, the norm and the
// multi-tensor AdamW, the workspace layout) is checked against the
// independent CPU reference, without a GPU. The device is
// EmulatedGpuDevice.h's; the GpuExecutorOnGpu suite runs the same checks on
// GPU 0 (runtime/exec/cuda_gpu_device.h: NVRTC, cuBLASLt, CUDA graphs) where
// there is one, and skips itself elsewhere.
#include "EmulatedGpuDevice.h"

#include "runtime/comm/collectives.h"
#include "runtime/exec/cpu_executor.h"
#include "runtime/exec/cpu_executor_impl.h"
#include "runtime/exec/cuda_gpu_device.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

namespace {

namespace pl = mt::plan;
using namespace mt::emu;

// An executor's device, and the emulated device's work counters where it
// is one (a real GPU has none to read).
struct Device {
  std::unique_ptr<GpuDevice> owned;
  EmulatedDevice *emulated = nullptr;
};
using DeviceFactory = Device (*)();

Device emulatedDevice() {
  auto d = std::make_unique<EmulatedDevice>();
  Device r;
  r.emulated = d.get();
  r.owned = std::move(d);
  return r;
}

// GPU 0, kernels through the default kernel cache (a rerun compiles nothing).
Device realGpu() {
  std::string error;
  Device r;
  r.owned = mt::rt::open_cuda_gpu_device(0, "", &error);
  EXPECT_TRUE(r.owned) << error;
  return r;
}

// The real-GPU variants: skipped, saying why, without a usable GPU.
class GpuExecutorOnGpu : public ::testing::Test {
protected:
  void SetUp() override {
    std::string error;
    if (!mt::rt::open_cuda_gpu_device(0, "", &error))
      GTEST_SKIP() << "no GPU: " << error;
  }
};

// AdamW as the plan's optimizer_step runs it at a step: the ADAMW
// instructions' betas, epsilon and (the largest) weight decay, and the
// learning rate of the LR_SCHEDULE instruction for the update's number of
// steps already taken (`steps`). `adam` is false for SGD.
struct AdamStep {
  bool adam = false;
  double beta1 = 0, beta2 = 0, eps = 0, weightDecay = 0, lr = 0;
};
AdamStep adamStep(const pl::Program &p, int64_t steps) {
  AdamStep a;
  for (const pl::Instruction *ins : *p.instructions()) {
    if (ins->op() == pl::Opcode::ADAMW || ins->op() == pl::Opcode::SHARDED_ADAMW) {
      a.adam = true;
      a.beta1 = ins->floats()->Get(0);
      a.beta2 = ins->floats()->Get(1);
      a.eps = ins->floats()->Get(2);
      a.weightDecay = std::max(a.weightDecay, ins->floats()->Get(3));
    } else if (ins->op() == pl::Opcode::LR_SCHEDULE) {
      a.lr = mt::rt::cpu_exec_detail::megatron_lr(mt::rt::cpu_exec_detail::lr_schedule_of(*ins),
                                                  steps);
    }
  }
  return a;
}

// How far apart AdamW leaves one element on two executors, at most, given
// how far apart their inputs to the update are. The update is
// w -= lr (r + wd w) with r = m^ / (s^ + eps), m^ = m / (1 - b1^t) and
// s^ = sqrt(v / (1 - b2^t)): every element moves by about lr whatever the
// size of its gradient, so r's direction is what the gradients' agreement
// fixes. Two runs whose moments differ by dm and dv (measured: both
// executors' m and v after the update) have, exactly,
//   |r_a - r_b| <= (|dm^| + |r_b| |ds^|) / (min(s^_a, s^_b) + eps),
// and so the weights differ by at most that times lr, plus the difference
// they started the update with (times 1 + lr wd). For an element whose
// gradient is small beside its parameter's largest (linear_proj's bias,
// the sum of the layer's output gradients over the tokens, where the
// terms nearly cancel), a gradient difference that is 1e-6 of the
// parameter's largest is 1e-3 of its own, and so is the change of r and of
// the weight relative to lr: a tolerance relative to the largest weight
// alone (1e-5) cannot hold there in fp32, however exactly both executors
// compute. `slack` (relative to the largest weight) covers the rounding of
// the update's own arithmetic.
double adamBound(const AdamStep &a, int64_t t, double mA, double mB, double vA, double vB,
                 double startDiff) {
  const double c1 = 1.0 - std::pow(a.beta1, double(t)), c2 = 1.0 - std::pow(a.beta2, double(t));
  const double sA = std::sqrt(std::max(vA, 0.0) / c2), sB = std::sqrt(std::max(vB, 0.0) / c2);
  const double rB = (mB / c1) / (sB + a.eps);
  const double dr = (std::fabs(mA - mB) / c1 + std::fabs(rB) * std::fabs(sA - sB)) /
                    (std::min(sA, sB) + a.eps);
  return a.lr * dr + startDiff * (1.0 + a.lr * a.weightDecay);
}

// The spacing of the 16-bit type's numbers at |x| (bf16: 8 significant bits;
// f16: 11, down to its subnormals' 2^-24).
double unitInTheLastPlace(pl::DType t, double x) {
  int e = 0;
  std::frexp(x, &e); // x = m 2^e, m in [0.5, 1)
  return t == pl::DType::F16 ? std::ldexp(1.0, std::max(e - 11, -24)) : std::ldexp(1.0, e - 8);
}

// Two training steps (two micro-batches each) on both executors: losses,
// gradients, the gradient norm, and the updated weights, master weights and
// moments. Tolerances: the GPU sums in other orders (tiled GEMMs and
// attention, block reductions) and rounds intermediate values to the
// storage type at other points than the CPU. With AdamW, the f32 values it
// updates (the weights, or the master weights of 16-bit ones) are held to
// adamBound: the update's own sensitivity to the moments' measured
// difference, plus weightTol of the parameter's largest value for
// rounding; SGD's update is linear in the gradient, so its weights are held
// to weightTol relative to the largest; under AdamW a 16-bit weight is held
// to its master's bound plus one unit of its type (the two roundings).
void compareSteps(DeviceFactory make, const std::vector<mt::spec::Override> &extra,
                  double lossTol, double gradTol, double weightTol, float lossScale = 1.0f,
                  const mt::GpuKernelOptions &kernels = {}) {
  auto file = compilePlan(extra, kernels);
  ASSERT_TRUE(file);
  const pl::Plan &plan = *file->plan();
  Device device = make();
  ASSERT_TRUE(device.owned);
  EmulatedDevice *dev = device.emulated;
  mt::rt::GpuExecutor gpu(plan, 0, std::move(device.owned));
  ASSERT_EQ(gpu.open(), "");
  mt::rt::CpuExecutor cpu(plan, 0);
  const int64_t vocab = plan.training()->vocab_size();
  for (mt::rt::Executor *ex : {static_cast<mt::rt::Executor *>(&gpu),
                               static_cast<mt::rt::Executor *>(&cpu)}) {
    ex->set_seed(1234);
    ASSERT_EQ(ex->init_params(1234), "");
    ex->set_loss_scale(lossScale);
  }
  // Initial weights are the same bits on both (the GPU's went through its
  // 16-bit storage and back).
  ASSERT_EQ(gpu.state_to_host(), "");
  for (uint32_t i = 0; i < mt::rt::find_rank(plan, 0)->params()->size(); ++i)
    ASSERT_EQ(std::memcmp(gpu.weight(int(i)), cpu.weight(int(i)),
                          size_t(cpu.param_elements(int(i))) * 4),
              0)
        << "initial weights of parameter " << i;
  const pl::Rank &rank = *mt::rt::find_rank(plan, 0);
  const uint32_t params = rank.params()->size();
  for (int64_t step = 1; step <= 2; ++step) {
    cpu.zero_grads();
    gpu.zero_grads();
    for (int m = 0; m < 2; ++m) {
      float loss[2];
      int e = 0;
      for (mt::rt::Executor *ex : {static_cast<mt::rt::Executor *>(&gpu),
                                   static_cast<mt::rt::Executor *>(&cpu)}) {
        const pl::Program &p = *ex->program("train_step");
        fillInputs(*ex, p, vocab, uint64_t(100 * step + m), step, 0);
        ASSERT_EQ(ex->run(p, uint64_t(1000 * step + m)), "");
        loss[e++] = output(*ex, p);
      }
      EXPECT_NEAR(loss[0], loss[1], lossTol * std::fabs(loss[1]))
          << "step " << step << " micro-batch " << m;
    }
    ASSERT_EQ(gpu.state_to_host(), "");
    std::vector<std::vector<char>> compared(params);
    for (uint32_t i = 0; i < params; ++i)
      compared[i] = significant(cpu.grad(int(i)), cpu.param_elements(int(i)));
    double worstGrad = 0;
    for (uint32_t i = 0; i < params; ++i) {
      const double d = relDiff(gpu.grad(int(i)), cpu.grad(int(i)), cpu.param_elements(int(i)));
      worstGrad = std::max(worstGrad, d);
      EXPECT_LT(d, gradTol) << "gradient of " << rank.params()->Get(i)->name()->str();
    }
    // Where both start the update (equal at step 1; the f32 values AdamW
    // updates: the master weights where the weights are 16-bit).
    std::vector<std::vector<float>> before(params), beforeCpu(params);
    for (uint32_t i = 0; i < params; ++i) {
      const int64_t n = cpu.param_elements(int(i));
      const float *g = gpu.master(int(i)) ? gpu.master(int(i)) : gpu.weight(int(i));
      const float *c = cpu.master(int(i)) ? cpu.master(int(i)) : cpu.weight(int(i));
      before[i].assign(g, g + n);
      beforeCpu[i].assign(c, c + n);
    }
    float norm[2];
    int e = 0;
    for (mt::rt::Executor *ex : {static_cast<mt::rt::Executor *>(&gpu),
                                 static_cast<mt::rt::Executor *>(&cpu)}) {
      const pl::Program &p = *ex->program("grad_norm");
      ASSERT_EQ(ex->run(p, 0), "");
      norm[e++] = output(*ex, p);
    }
    EXPECT_NEAR(norm[0], norm[1], gradTol * norm[1]);
    for (mt::rt::Executor *ex : {static_cast<mt::rt::Executor *>(&gpu),
                                 static_cast<mt::rt::Executor *>(&cpu)}) {
      const pl::Program &p = *ex->program("optimizer_step");
      fillInputs(*ex, p, vocab, 0, step, norm[1] / lossScale, 1.0f / lossScale);
      ASSERT_EQ(ex->run(p, 0), "");
    }
    ASSERT_EQ(gpu.state_to_host(), "");
    const AdamStep adam = adamStep(*cpu.program("optimizer_step"), step - 1);
    double worstWeight = 0, worstAdam = 0;
    for (uint32_t i = 0; i < params; ++i) {
      const int64_t n = cpu.param_elements(int(i));
      const std::string name = rank.params()->Get(i)->name()->str();
      std::vector<float> a, b, ma, mb;
      for (int64_t k = 0; k < n; ++k)
        if (compared[i][size_t(k)]) {
          a.push_back(gpu.weight(int(i))[k]);
          b.push_back(cpu.weight(int(i))[k]);
          if (cpu.master(int(i))) {
            ma.push_back(gpu.master(int(i))[k]);
            mb.push_back(cpu.master(int(i))[k]);
          }
        }
      const double d = relDiff(a.data(), b.data(), int64_t(a.size()));
      worstWeight = std::max(worstWeight, d);
      EXPECT_LT(relDiff(gpu.exp_avg(int(i)), cpu.exp_avg(int(i)), n), gradTol) << name;
      EXPECT_GT(a.size(), size_t(n) / 2) << name; // most of every parameter is compared
      if (!adam.adam) {
        if (!ma.empty()) {
          EXPECT_LT(relDiff(ma.data(), mb.data(), int64_t(ma.size())), weightTol) << name;
        }
        EXPECT_LT(d, weightTol) << "weights of " << name;
        continue;
      }
      // AdamW: v is the gradients squared, so twice their relative difference.
      EXPECT_LT(relDiff(gpu.exp_avg_sq(int(i)), cpu.exp_avg_sq(int(i)), n), 2 * gradTol) << name;
      const float *wg = cpu.master(int(i)) ? gpu.master(int(i)) : gpu.weight(int(i));
      const float *wc = cpu.master(int(i)) ? cpu.master(int(i)) : cpu.weight(int(i));
      // A 16-bit weight is its master rounded to nearest, half a unit in the
      // last place at most on each side: two differ by their masters' bound
      // and one unit.
      const bool sixteen = cpu.master(int(i)) != nullptr;
      const pl::DType wtype = rank.params()->Get(i)->dtype();
      double top = 0;
      for (int64_t k = 0; k < n; ++k)
        top = std::max(top, std::fabs(double(wc[k])));
      int64_t over = 0, first = -1, over16 = 0, first16 = -1;
      double worstRatio = 0;
      for (int64_t k = 0; k < n; ++k) {
        if (!compared[i][size_t(k)])
          continue;
        const double bound =
            adamBound(adam, step, gpu.exp_avg(int(i))[k], cpu.exp_avg(int(i))[k],
                      gpu.exp_avg_sq(int(i))[k], cpu.exp_avg_sq(int(i))[k],
                      std::fabs(double(before[i][size_t(k)]) - double(beforeCpu[i][size_t(k)]))) +
            weightTol * top;
        const double diff = std::fabs(double(wg[k]) - double(wc[k]));
        worstRatio = std::max(worstRatio, diff / bound);
        if (!(diff <= bound) && over++ == 0)
          first = k;
        if (sixteen) {
          const double a16 = gpu.weight(int(i))[k], c16 = cpu.weight(int(i))[k];
          const double allowed = bound + unitInTheLastPlace(wtype, std::max(std::fabs(a16), std::fabs(c16)));
          if (!(std::fabs(a16 - c16) <= allowed) && over16++ == 0)
            first16 = k;
        }
      }
      EXPECT_EQ(over16, 0) << "16-bit weights of " << name << ": " << over16
                           << " elements differ by more than their masters' bound and one unit, the first "
                           << first16 << " (" << gpu.weight(int(i))[std::max<int64_t>(first16, 0)]
                           << " against " << cpu.weight(int(i))[std::max<int64_t>(first16, 0)] << ")";
      worstAdam = std::max(worstAdam, worstRatio);
      EXPECT_EQ(over, 0) << "weights of " << name << ": " << over
                         << " elements differ by more than AdamW's update allows for the moments' "
                            "difference, the first "
                         << first << " (" << wg[std::max<int64_t>(first, 0)] << " against "
                         << wc[std::max<int64_t>(first, 0)] << "), worst "
                         << worstRatio << " times the bound";
    }
    std::printf("[ stats    ] step %lld: worst gradient %.2e, worst weight %.2e relative",
                (long long)step, worstGrad, worstWeight);
    if (adam.adam)
      std::printf(" (%.2f of AdamW's bound at lr %.2e)", worstAdam, adam.lr);
    if (dev)
      std::printf("; %d launches, %d GEMMs so far", dev->launches, dev->gemms);
    std::printf("\n");
  }
}

// A plan larger than the GPU: open() says so in one line naming the size,
// the device and the plan fields it comes from.
TEST(GpuExecutor, AllocationFailureNamesSizeDeviceAndPlanFields) {
  auto file = compilePlan({});
  ASSERT_TRUE(file);
  const pl::Plan &plan = *file->plan();
  auto d = std::make_unique<EmulatedDevice>();
  d->memory_limit = 4096;
  mt::rt::GpuExecutor gpu(plan, 0, std::move(d));
  ASSERT_EQ(gpu.load_error(), "");
  const pl::Rank &rank = *plan.ranks()->Get(0);
  const std::string e = gpu.open();
  EXPECT_NE(e.find("rank 0: cannot allocate "), std::string::npos) << e;
  EXPECT_NE(e.find("bytes on the emulated GPU (4096 bytes): out of memory"), std::string::npos) << e;
  EXPECT_NE(e.find("(the plan's state_bytes " + std::to_string(rank.state_bytes()) +
                   " + arena_bytes " + std::to_string(rank.arena_bytes()) +
                   " + kernel_workspace_bytes " + std::to_string(rank.kernel_workspace_bytes()) +
                   " of rank 0)"),
            std::string::npos)
      << e;
}

TEST(GpuExecutor, TrainingStepsMatchTheCpuF32) { compareSteps(emulatedDevice, {}, 1e-5, 1e-4, 1e-5); }
TEST_F(GpuExecutorOnGpu, TrainingStepsMatchTheCpuF32) { compareSteps(realGpu, {}, 1e-5, 1e-4, 1e-5); }

// SGD with momentum (--optimizer sgd): the plan's multi-tensor SGD launch
// (the run's first mt.sgd carries it, the others do nothing) updates the
// weights and momentum buffers as the CPU does.
TEST(GpuExecutor, SgdTrainingStepsMatchTheCpuF32) {
  compareSteps(emulatedDevice, {{"training.optimizer=\"sgd\""}}, 1e-5, 1e-4, 1e-5);
}
TEST_F(GpuExecutorOnGpu, SgdTrainingStepsMatchTheCpuF32) {
  compareSteps(realGpu, {{"training.optimizer=\"sgd\""}}, 1e-5, 1e-4, 1e-5);
}

// A Llama-style model (RoPE, grouped-query attention, RMSNorm, SwiGLU, no
// biases): the QKV split runs with the rotation inside it
// (SPLIT_QKV_ROPE and its gradient), as mt-fuse plans it. Embeddings stay
// tied, so every row of the table gets a gradient to compare.
const std::vector<mt::spec::Override> kLlamaStyle = {
    {"model.position_embedding_type=\"rope\""}, {"model.num_attention_heads=4"},
    {"model.num_query_groups=2"}, {"model.hidden_size=256"},
    {"model.normalization=\"RMSNorm\""}, {"model.swiglu=true"},
    {"model.add_bias_linear=false"}};
TEST(GpuExecutor, LlamaStyleTrainingStepsMatchTheCpuF32) {
  compareSteps(emulatedDevice, kLlamaStyle, 1e-5, 1e-4, 1e-5);
}
TEST_F(GpuExecutorOnGpu, LlamaStyleTrainingStepsMatchTheCpuF32) {
  compareSteps(realGpu, kLlamaStyle, 1e-5, 1e-4, 1e-5);
}

// Mixture of experts (4 experts, top-2, the load-balancing and z losses on):
// the router, permute, the experts' grouped GEMMs, unpermute and every
// gradient as generated kernels (compiler/cuda/OpKernelsMoe) through the
// GPU steps the plan writer gives them, the stacked expert weights'
// gradients and AdamW, against the CPU executor. The second layer is dense
// (moe_layer_freq [1, 0]). With a capacity factor of 1 (position policy,
// SwiGLU experts) tokens are dropped.
const std::vector<mt::spec::Override> kMoe = {
    {"model.num_experts=4"}, {"model.moe_router_topk=2"}, {"model.moe_aux_loss_coeff=0.01"},
    {"model.moe_z_loss_coeff=0.001"}, {"model.moe_layer_freq=[1, 0]"},
    {"model.add_bias_linear=false"}};
TEST(GpuExecutor, MoeTrainingStepsMatchTheCpuF32) {
  compareSteps(emulatedDevice, kMoe, 1e-5, 1e-4, 1e-5);
}
TEST_F(GpuExecutorOnGpu, MoeTrainingStepsMatchTheCpuF32) {
  compareSteps(realGpu, kMoe, 1e-5, 1e-4, 1e-5);
}
std::vector<mt::spec::Override> moeWith(std::vector<mt::spec::Override> more) {
  std::vector<mt::spec::Override> o = kMoe;
  o.insert(o.end(), more.begin(), more.end());
  return o;
}
// The plan those steps run: every MoE opcode in train_step, each with GPU
// steps that launch generated kernels (the GPU form, not a dense fallback).
TEST(GpuExecutor, MoePlanLaunchesTheMoeKernels) {
  auto file = compilePlan(kMoe);
  ASSERT_TRUE(file);
  const pl::Rank &rank = *mt::rt::find_rank(*file->plan(), 0);
  std::map<pl::Opcode, int> seen;
  for (const pl::Program *p : *rank.programs()) {
    if (p->name()->str() != "train_step")
      continue;
    for (const pl::Instruction *ins : *p->instructions()) {
      if (ins->op() < pl::Opcode::MOE_ROUTER)
        continue;
      ++seen[ins->op()];
      ASSERT_TRUE(ins->gpu() && ins->gpu()->size() > 0) << pl::EnumNameOpcode(ins->op());
      for (const pl::GpuStep *st : *ins->gpu())
        EXPECT_EQ(st->kind(), pl::GpuStepKind::KERNEL) << pl::EnumNameOpcode(ins->op());
    }
  }
  EXPECT_EQ(seen.size(), 9u); // the nine MoE opcodes
  EXPECT_EQ(seen[pl::Opcode::GROUPED_MATMUL], 2);             // fc1, fc2 of the one MoE layer
  EXPECT_EQ(seen[pl::Opcode::GROUPED_MATMUL_WEIGHT_GRAD], 2);
}
// moe_router_dtype in a bf16 model (Megatron's router_gating_linear): the
// router's logits GEMM runs in f32. Its logits are the f32 product of the
// bf16 input and weight, where without the key they are rounded to bf16:
// on the CPU executor's train_step (the router's input and logits live until
// its backward reads them, and nothing after writes their bytes: checked),
// against the product in double of the very input and weight it read,
// fp32's logits are within f32 rounding and none's within bf16 rounding
// only. The backward GEMMs read the f32
// gradient of the logits.
struct RouterGemm {
  std::vector<float> x, w;
  std::vector<double> logits; // f64 with fp64, else the f32 values the CPU holds
  int64_t tokens = 0, experts = 0, hidden = 0;
  pl::DType logitsType = pl::DType::F32, dlogitsType = pl::DType::F32;
};
RouterGemm routerGemm(const char *routerDtype) {
  RouterGemm r;
  std::vector<mt::spec::Override> o = {{"training.precision=\"bf16\""}};
  o.insert(o.end(), kMoe.begin(), kMoe.end());
  if (routerDtype)
    o.push_back({std::string("model.moe_router_dtype=\"") + routerDtype + "\""});
  auto file = compilePlan(o);
  EXPECT_TRUE(file);
  if (!file)
    return r;
  const pl::Plan &plan = *file->plan();
  mt::rt::CpuExecutor cpu(plan, 0);
  cpu.set_seed(1234);
  EXPECT_EQ(cpu.init_params(1234), "");
  // The router's GEMM: the one MATMUL with a [num_experts, hidden] weight.
  auto isRouter = [](const pl::Program &p, const pl::Instruction &ins) {
    return ins.op() == pl::Opcode::MATMUL &&
           p.values()->Get(ins.in()->Get(1))->shape()->Get(0) == 4;
  };
  const pl::Program &step = *cpu.program("train_step");
  const auto *code = step.instructions();
  for (const pl::Instruction *ins : *code)
    if (ins->op() == pl::Opcode::MATMUL_INPUT_GRAD &&
        step.values()->Get(ins->in()->Get(1))->shape()->Get(0) == 4)
      r.dlogitsType = step.values()->Get(ins->in()->Get(0))->dtype();
  uint32_t at = 0;
  while (at < code->size() && !isRouter(step, *code->Get(at)))
    ++at;
  EXPECT_LT(at, code->size()) << "no router GEMM in train_step";
  if (at == code->size())
    return r;
  const pl::Instruction &mm = *code->Get(at);
  const pl::Value &xv = *step.values()->Get(mm.in()->Get(0));
  const pl::Value &wv = *step.values()->Get(mm.in()->Get(1));
  const pl::Value &lv = *step.values()->Get(mm.out()->Get(0));
  r.tokens = xv.shape()->Get(0);
  r.hidden = xv.shape()->Get(1);
  r.experts = wv.shape()->Get(0);
  r.logitsType = lv.dtype();
  // The values are read after the run: no later instruction may write the
  // arena bytes of the input or the logits.
  auto bytes = [](const pl::Value &v) {
    return uint64_t(mt::rt::element_count(v)) * mt::rt::element_bytes(v.dtype());
  };
  for (uint32_t i = at + 1; i < code->size(); ++i)
    for (uint32_t o : *code->Get(i)->out()) {
      const pl::Value &ov = *step.values()->Get(o);
      for (const pl::Value *kept : {&xv, &lv})
        if (ov.region() == pl::Region::ARENA && kept->region() == pl::Region::ARENA &&
            ov.offset() < kept->offset() + bytes(*kept) && kept->offset() < ov.offset() + bytes(ov))
          ADD_FAILURE() << "train_step's instruction " << i << " overwrites the router GEMM's "
                        << (kept == &xv ? "input" : "logits");
  }
  fillInputs(cpu, step, plan.training()->vocab_size(), 7, 1, 0);
  EXPECT_EQ(cpu.run(step, 0), "");
  auto read = [&](const pl::Value &v, uint32_t id) {
    const float *p = static_cast<const float *>(cpu.value_data(step, id));
    return std::vector<float>(p, p + mt::rt::element_count(v));
  };
  r.x = read(xv, mm.in()->Get(0));
  r.w = read(wv, mm.in()->Get(1));
  if (lv.dtype() == pl::DType::F64) {
    const double *p = static_cast<const double *>(cpu.value_data(step, mm.out()->Get(0)));
    r.logits.assign(p, p + mt::rt::element_count(lv));
  } else {
    const std::vector<float> l = read(lv, mm.out()->Get(0));
    r.logits.assign(l.begin(), l.end());
  }
  return r;
}
// The logits' largest difference from the product in double, relative to
// the largest logit.
double routerLogitsError(const RouterGemm &r) {
  double diff = 0, mag = 1e-30;
  for (int64_t t = 0; t < r.tokens; ++t)
    for (int64_t e = 0; e < r.experts; ++e) {
      double ref = 0;
      for (int64_t k = 0; k < r.hidden; ++k)
        ref += double(r.x[size_t(t * r.hidden + k)]) * double(r.w[size_t(e * r.hidden + k)]);
      diff = std::max(diff, std::fabs(ref - double(r.logits[size_t(t * r.experts + e)])));
      mag = std::max(mag, std::fabs(ref));
    }
  return diff / mag;
}
TEST(GpuExecutor, RouterGemmRunsInTheRouterDtype) {
  const RouterGemm wide = routerGemm("fp32"), none = routerGemm(nullptr);
  ASSERT_FALSE(wide.logits.empty());
  ASSERT_FALSE(none.logits.empty());
  EXPECT_EQ(wide.logitsType, pl::DType::F32);
  EXPECT_EQ(wide.dlogitsType, pl::DType::F32);
  EXPECT_EQ(none.logitsType, pl::DType::BF16);
  EXPECT_EQ(none.dlogitsType, pl::DType::BF16);
  const double errWide = routerLogitsError(wide), errNone = routerLogitsError(none);
  std::printf("[ stats    ] router logits vs the product in double: fp32 %.2e, none %.2e\n",
              errWide, errNone);
  EXPECT_LT(errWide, 1e-6);        // f32 accumulation of exact products
  EXPECT_GT(errNone, 1e-4);        // rounded to bf16 (2^-9 relative)
  EXPECT_LT(errWide * 100, errNone);
}
// fp64: the logits are the f64 product (Megatron's router_gating_linear
// in torch.float64), so they agree with the product in double to double
// rounding, and the backward GEMMs read the f64 gradient.
TEST(GpuExecutor, RouterGemmRunsInF64) {
  const RouterGemm f64 = routerGemm("fp64"), f32 = routerGemm("fp32");
  ASSERT_FALSE(f64.logits.empty());
  EXPECT_EQ(f64.logitsType, pl::DType::F64);
  EXPECT_EQ(f64.dlogitsType, pl::DType::F64);
  const double err64 = routerLogitsError(f64), err32 = routerLogitsError(f32);
  std::printf("[ stats    ] router logits vs the product in double: fp64 %.2e, fp32 %.2e\n",
              err64, err32);
  EXPECT_LT(err64, 1e-14);
  EXPECT_GT(err32, 1e-9); // f32 accumulation
}
// On GPUs against the CPU, in an f32 model and a bf16 one: the
// router's GEMMs are f64 cuBLASLt GEMMs of widened operands (the forward
// widens both, the backward the gradient's partner), the routing kernels
// read and write f64 logits.
// Emulated, the f32 model alone (the bf16 one adds only the 16-bit widening
// and rounding kernels, which fp32's router test above already runs).
void routerInF64MatchesTheCpu(DeviceFactory make, std::vector<const char *> precisions) {
  for (const char *precision : precisions) {
    SCOPED_TRACE(precision);
    const std::vector<mt::spec::Override> o = {
        {std::string("training.precision=\"") + precision + "\""}, {"model.num_experts=2"},
        {"model.moe_router_topk=2"}, {"model.moe_aux_loss_coeff=0.01"},
        {"model.moe_z_loss_coeff=0.001"}, {"model.moe_layer_freq=[1, 0]"},
        {"model.add_bias_linear=false"}, {"model.moe_router_dtype=\"fp64\""}};
    auto file = compilePlan(o);
    ASSERT_TRUE(file);
    int f64Gemms = 0;
    for (const pl::Program *p : *mt::rt::find_rank(*file->plan(), 0)->programs())
      for (const pl::Instruction *ins : *p->instructions())
        for (uint32_t s = 0; ins->gpu() && s < ins->gpu()->size(); ++s)
          if (const pl::Gemm *g = ins->gpu()->Get(s)->gemm(); g && g->a_type() == pl::DType::F64) {
            ++f64Gemms;
            EXPECT_EQ(g->d_type(), pl::DType::F64);
          }
    EXPECT_GE(f64Gemms, 3); // the logits, their input and weight gradients
    if (std::string(precision) == "fp32")
      compareSteps(make, o, 1e-5, 1e-4, 1e-5);
    else
      compareSteps(make, o, 1e-2, 0.1, 0.1);
  }
}
TEST(GpuExecutor, MoeRouterInF64MatchesTheCpu) {
  routerInF64MatchesTheCpu(emulatedDevice, {"fp32"});
}
TEST_F(GpuExecutorOnGpu, MoeRouterInF64MatchesTheCpu) {
  routerInF64MatchesTheCpu(realGpu, {"fp32", "bf16"});
}
// The same on the emulated GPU against the CPU: the router's forward GEMM
// is a bf16 x bf16 -> f32 cuBLASLt GEMM, its backward ones widen the bf16
// operand to f32 first (cuBLASLt multiplies operands of one type; the plan
// verifier refuses others) and round the input gradient to bf16 once. With
// top-2 of 2 experts the routing has no discontinuity, so bf16 steps
// compare as the dense model's do.
TEST(GpuExecutor, MoeRouterInF32MatchesTheCpuBf16) {
  const std::vector<mt::spec::Override> o = {
      {"training.precision=\"bf16\""}, {"model.num_experts=2"}, {"model.moe_router_topk=2"},
      {"model.moe_aux_loss_coeff=0.01"}, {"model.moe_z_loss_coeff=0.001"},
      {"model.moe_layer_freq=[1, 0]"},  {"model.add_bias_linear=false"},
      {"model.moe_router_dtype=\"fp32\""}};
  auto file = compilePlan(o);
  ASSERT_TRUE(file);
  int widened = 0;
  for (const pl::Program *p : *mt::rt::find_rank(*file->plan(), 0)->programs())
    for (const pl::Instruction *ins : *p->instructions())
      if ((ins->op() == pl::Opcode::MATMUL_INPUT_GRAD ||
           ins->op() == pl::Opcode::MATMUL_WEIGHT_GRAD) &&
          p->values()->Get(ins->in()->Get(0))->dtype() == pl::DType::F32) {
        ++widened;
        ASSERT_TRUE(ins->gpu() && ins->gpu()->size() >= 2);
        EXPECT_EQ(ins->gpu()->Get(0)->kind(), pl::GpuStepKind::KERNEL); // widen
        EXPECT_EQ(ins->gpu()->Get(1)->kind(), pl::GpuStepKind::GEMM);
        EXPECT_EQ(ins->gpu()->Get(1)->gemm()->a_type(), pl::DType::F32);
      }
  EXPECT_GE(widened, 2); // the router's input and weight gradients
  compareSteps(emulatedDevice, o, 1e-2, 0.1, 0.1);
}

TEST(GpuExecutor, MoeCapacityTrainingStepsMatchTheCpuF32) {
  compareSteps(emulatedDevice,
               moeWith({{"model.moe_expert_capacity_factor=1.0"},
                        {"model.moe_token_drop_policy=\"position\""}, {"model.swiglu=true"}}),
               1e-5, 1e-4, 1e-5);
}
// No bf16 counterpart: routing is discontinuous, and the GPU's and the
// CPU's bf16 activations differ by an ulp here and there (other summation
// orders), which moves a router logit by about 2^-8 of itself: enough to
// swap the chosen experts of a token whose k-th and next logits lie that
// close, whose output and gradients then differ wholesale (measured on
// this model: the gradients 10-22% apart, relative to their largest). MoeKernelsTest checks every MoE kernel
// in bf16 and f16 on equal inputs against the CPU instead.

// bf16: gradients differ by about one bf16 unit (2^-8). The weights that
// moved off zero in the one update at a non-zero lr (biases, ~lr in size)
// carry AdamW's m / sqrt(v), which turns those one-unit gradient differences
// into a few percent of the update; the loss over many steps is the test of
// bf16 training that matters (test/mtrun/cuda-train.test, on a GPU).
TEST(GpuExecutor, TrainingStepsMatchTheCpuBf16) {
  compareSteps(emulatedDevice, {{"training.precision=\"bf16\""}}, 1e-2, 0.1, 0.1);
}
TEST_F(GpuExecutorOnGpu, TrainingStepsMatchTheCpuBf16) {
  compareSteps(realGpu, {{"training.precision=\"bf16\""}}, 1e-2, 0.1, 0.1);
}

// bf16 gradients (--grad-reduce-in-bf16): the weight-gradient GEMMs
// accumulate into bf16, the norm, bias and embedding gradient kernels add
// into it with one rounding, the optimizer reads it as f32; the same bounds
// as bf16 with f32 gradients. (On the emulated GPU GpuExecutorParallelTest's
// Bf16Gradient* layouts run every one of those kernels.)
TEST_F(GpuExecutorOnGpu, TrainingStepsMatchTheCpuBf16Gradients) {
  compareSteps(realGpu,
               {{"training.precision=\"bf16\""}, {"training.grad_reduce_in_bf16=true"}}, 1e-2,
               0.1, 0.1);
}

// The same with flash attention's kv128 backward (mtc compile
// --flash-backward=kv128): the plan's attention gradient runs its 8-warp
// main kernel, whose 73,728 bytes of shared memory the executor opts in to
// at load on a GPU.
TEST(GpuExecutor, TrainingStepsMatchTheCpuBf16FlashKv128) {
  auto file = compilePlan({{"training.precision=\"bf16\""}}, {mt::FlashBackward::Kv128});
  ASSERT_TRUE(file);
  int mains = 0;
  for (const pl::Kernel *k : *file->plan()->kernels()) {
    const std::string entry = k->entry() ? k->entry()->str() : "";
    if (entry.rfind("mt_flash_bwd_", 0) == 0 && entry.find("_dot_") == std::string::npos &&
        entry.find("_dq_") == std::string::npos) {
      ++mains;
      EXPECT_EQ(k->block()->Get(0), 256u) << entry;
      EXPECT_EQ(k->shared_bytes(), 73728u) << entry;
    }
  }
  EXPECT_GT(mains, 0);
  compareSteps(emulatedDevice, {{"training.precision=\"bf16\""}}, 1e-2, 0.1, 0.1, 1.0f,
               {mt::FlashBackward::Kv128});
}
TEST_F(GpuExecutorOnGpu, TrainingStepsMatchTheCpuBf16FlashKv128) {
  compareSteps(realGpu, {{"training.precision=\"bf16\""}}, 1e-2, 0.1, 0.1, 1.0f, {mt::FlashBackward::Kv128});
}

// fp16 with a loss scale: the gradient seed reads the scale from the
// device (set_loss_scale), gradients are scaled alike on both, and the
// optimizer takes them back with grad_scale.
TEST(GpuExecutor, TrainingStepsMatchTheCpuFp16WithLossScale) {
  compareSteps(emulatedDevice, {{"training.precision=\"fp16\""}}, 1e-2, 0.1, 0.1, 4096.0f);
}
TEST_F(GpuExecutorOnGpu, TrainingStepsMatchTheCpuFp16WithLossScale) {
  compareSteps(realGpu, {{"training.precision=\"fp16\""}}, 1e-2, 0.1, 0.1, 4096.0f);
}

// Checkpoint state through the host views: what state_to_device writes,
// state_to_host reads back, 16-bit weights included.
void stateRoundTrips(DeviceFactory make) {
  auto file = compilePlan({{"training.precision=\"bf16\""}});
  ASSERT_TRUE(file);
  Device device = make();
  ASSERT_TRUE(device.owned);
  mt::rt::GpuExecutor gpu(*file->plan(), 0, std::move(device.owned));
  ASSERT_EQ(gpu.open(), "");
  ASSERT_EQ(gpu.init_params(5), "");
  const uint32_t params = mt::rt::find_rank(*file->plan(), 0)->params()->size();
  std::vector<std::vector<float>> want(params);
  for (uint32_t i = 0; i < params; ++i) {
    const int64_t n = gpu.param_elements(int(i));
    for (int64_t k = 0; k < n; ++k) {
      // Values a bf16 weight can hold exactly, and distinct f32 moments.
      gpu.weight(int(i))[k] = float(int(k % 61) - 30) * 0.25f;
      gpu.exp_avg(int(i))[k] = float(k) * 1e-3f + float(i);
    }
    want[i].assign(gpu.weight(int(i)), gpu.weight(int(i)) + n);
  }
  ASSERT_EQ(gpu.state_to_device(), "");
  for (uint32_t i = 0; i < params; ++i) {
    std::fill(gpu.weight(int(i)), gpu.weight(int(i)) + gpu.param_elements(int(i)), 0.0f);
    std::fill(gpu.exp_avg(int(i)), gpu.exp_avg(int(i)) + gpu.param_elements(int(i)), 0.0f);
  }
  ASSERT_EQ(gpu.state_to_host(), "");
  for (uint32_t i = 0; i < params; ++i) {
    const int64_t n = gpu.param_elements(int(i));
    EXPECT_EQ(std::memcmp(gpu.weight(int(i)), want[i].data(), size_t(n) * 4), 0) << i;
    for (int64_t k = 0; k < n; ++k)
      ASSERT_EQ(gpu.exp_avg(int(i))[k], float(k) * 1e-3f + float(i)) << i << " " << k;
  }
}

TEST(GpuExecutor, StateRoundTripsThroughTheHost) { stateRoundTrips(emulatedDevice); }
TEST_F(GpuExecutorOnGpu, StateRoundTripsThroughTheHost) { stateRoundTrips(realGpu); }

// A fresh optimizer for loaded weights (mtrun --no-load-optim, --finetune):
// the master copies become the weights, the moments zero, on the GPU as on
// the CPU, and the weights stay as loaded.
void freshOptimizerKeepsTheWeights(DeviceFactory make) {
  auto file = compilePlan({{"training.precision=\"bf16\""}});
  ASSERT_TRUE(file);
  Device device = make();
  ASSERT_TRUE(device.owned);
  mt::rt::GpuExecutor gpu(*file->plan(), 0, std::move(device.owned));
  ASSERT_EQ(gpu.open(), "");
  mt::rt::CpuExecutor cpu(*file->plan(), 0);
  const uint32_t params = mt::rt::find_rank(*file->plan(), 0)->params()->size();
  for (mt::rt::Executor *ex : {static_cast<mt::rt::Executor *>(&gpu),
                               static_cast<mt::rt::Executor *>(&cpu)}) {
    ASSERT_EQ(ex->init_params(5), "");
    for (uint32_t i = 0; i < params; ++i) {
      const int64_t n = ex->param_elements(int(i));
      ASSERT_NE(ex->master(int(i)), nullptr) << "bf16 weights keep f32 masters";
      for (int64_t k = 0; k < n; ++k) {
        // A loaded checkpoint's weights (bf16 values), and stale state.
        ex->weight(int(i))[k] = float(int(k % 61) - 30) * 0.25f;
        ex->master(int(i))[k] = 7.0f;
        ex->exp_avg(int(i))[k] = 1.0f + float(k);
        ex->exp_avg_sq(int(i))[k] = 2.0f;
      }
    }
    ASSERT_EQ(ex->reset_optimizer_state(), "");
    ASSERT_EQ(ex->state_to_device(), "");
    ASSERT_EQ(ex->state_to_host(), "");
    for (uint32_t i = 0; i < params; ++i)
      for (int64_t k = 0; k < ex->param_elements(int(i)); ++k) {
        const float w = float(int(k % 61) - 30) * 0.25f;
        ASSERT_EQ(ex->weight(int(i))[k], w) << i << " " << k;
        ASSERT_EQ(ex->master(int(i))[k], w) << i << " " << k;
        ASSERT_EQ(ex->exp_avg(int(i))[k], 0.0f) << i << " " << k;
        ASSERT_EQ(ex->exp_avg_sq(int(i))[k], 0.0f) << i << " " << k;
      }
  }
}

TEST(GpuExecutor, FreshOptimizerKeepsTheWeights) { freshOptimizerKeepsTheWeights(emulatedDevice); }
TEST_F(GpuExecutorOnGpu, FreshOptimizerKeepsTheWeights) {
  freshOptimizerKeepsTheWeights(realGpu);
}

// Bit for bit when `tolerance` is 0, else within `tolerance` of the
// array's largest magnitude.
::testing::AssertionResult agree(const float *a, const float *b, int64_t n, double tolerance) {
  if (tolerance == 0)
    return std::memcmp(a, b, size_t(n) * 4) == 0 ? ::testing::AssertionSuccess()
                                                  : ::testing::AssertionFailure() << "bits differ";
  const double d = relDiff(a, b, int64_t(n));
  if (d < tolerance)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative difference " << d << ", tolerance " << tolerance;
}

// CUDA graphs: the same training steps on two executors, one replaying
// captured graphs and one eager, give the same bits (`tolerance` 0). Each
// micro-batch has its own inputs and RNG offset and dropout is on, so a
// captured step that froze an input, the seed or an offset (the emulated
// device replays the argument values it recorded, as CUDA does) would
// differ.
void graphsMatchEager(DeviceFactory make, double tolerance) {
  auto file = compilePlan({});
  ASSERT_TRUE(file);
  const pl::Plan &plan = *file->plan();
  Device graphDevice = make(), eagerDevice = make();
  ASSERT_TRUE(graphDevice.owned && eagerDevice.owned);
  EmulatedDevice *graphDev = graphDevice.emulated, *eagerDev = eagerDevice.emulated;
  mt::rt::GpuExecutor graphs(plan, 0, std::move(graphDevice.owned)),
      eager(plan, 0, std::move(eagerDevice.owned));
  eager.set_cuda_graphs(false);
  const int64_t vocab = plan.training()->vocab_size();
  mt::rt::GpuExecutor *both[2] = {&graphs, &eager};
  for (mt::rt::GpuExecutor *ex : both) {
    ASSERT_EQ(ex->open(), "");
    ex->set_seed(77);
    ASSERT_EQ(ex->init_params(77), "");
  }
  const uint32_t params = mt::rt::find_rank(plan, 0)->params()->size();
  // Within a tolerance, the weights where the step's gradient is
  // significant (taken when the gradients are fresh, after the backward).
  std::vector<std::vector<char>> compared(params);
  auto sameState = [&](const char *what, int64_t step, bool afterBackward) {
    for (mt::rt::GpuExecutor *ex : both)
      ASSERT_EQ(ex->state_to_host(), "");
    for (uint32_t i = 0; i < params; ++i) {
      const int64_t n = graphs.param_elements(int(i));
      if (afterBackward)
        compared[i] = significant(eager.grad(int(i)), n);
      if (tolerance == 0) {
        EXPECT_TRUE(agree(graphs.weight(int(i)), eager.weight(int(i)), n, 0))
            << what << " step " << step << ": weights of parameter " << i;
      } else {
        std::vector<float> a, b;
        for (int64_t k = 0; k < n; ++k)
          if (compared[i][size_t(k)]) {
            a.push_back(graphs.weight(int(i))[k]);
            b.push_back(eager.weight(int(i))[k]);
          }
        EXPECT_TRUE(agree(a.data(), b.data(), int64_t(a.size()), tolerance))
            << what << " step " << step << ": weights of parameter " << i;
      }
      EXPECT_TRUE(agree(graphs.grad(int(i)), eager.grad(int(i)), n, tolerance))
          << what << " step " << step << ": gradient of parameter " << i;
      EXPECT_TRUE(agree(graphs.exp_avg(int(i)), eager.exp_avg(int(i)), n, tolerance))
          << what << " step " << step << ": moment of parameter " << i;
    }
  };
  const int64_t steps = 3;
  std::vector<float> losses;
  for (int64_t step = 1; step <= steps; ++step) {
    for (mt::rt::GpuExecutor *ex : both)
      ex->zero_grads();
    for (int m = 0; m < 2; ++m) {
      float loss[2];
      for (int e = 0; e < 2; ++e) {
        const pl::Program &p = *both[e]->program("train_step");
        fillInputs(*both[e], p, vocab, uint64_t(10 * step + m), step, 0);
        ASSERT_EQ(both[e]->run(p, uint64_t(100 * step + m)), "");
        loss[e] = output(*both[e], p);
      }
      EXPECT_TRUE(agree(&loss[0], &loss[1], 1, tolerance))
          << "step " << step << " micro-batch " << m << ": " << loss[0] << " vs " << loss[1];
      losses.push_back(loss[0]);
    }
    sameState("gradients", step, true);
    float norm[2];
    for (int e = 0; e < 2; ++e) {
      const pl::Program &p = *both[e]->program("grad_norm");
      ASSERT_EQ(both[e]->run(p, 0), "");
      norm[e] = output(*both[e], p);
    }
    EXPECT_TRUE(agree(&norm[0], &norm[1], 1, tolerance)) << "step " << step;
    for (int e = 0; e < 2; ++e) {
      const pl::Program &p = *both[e]->program("optimizer_step");
      fillInputs(*both[e], p, vocab, 0, step, norm[0]);
      ASSERT_EQ(both[e]->run(p, 0), "");
    }
    sameState("update", step, false);
  }
  // Each micro-batch saw other tokens and another dropout mask.
  for (size_t i = 1; i < losses.size(); ++i)
    EXPECT_NE(losses[i], losses[0]) << i;
  // Three programs captured once each, at their second run; every later run
  // replayed: train_step 6 runs (5 replays), grad_norm and optimizer_step 3
  // runs each (2 replays each).
  EXPECT_EQ(graphs.graph_launches(), 9);
  EXPECT_EQ(eager.graph_launches(), 0);
  if (graphDev) {
    EXPECT_EQ(graphDev->captures, 3);
    EXPECT_EQ(graphDev->graphLaunches, 9);
    EXPECT_EQ(eagerDev->captures, 0);
    EXPECT_EQ(eagerDev->graphLaunches, 0);
    // Replays did the eager run's work, no more, no less.
    EXPECT_EQ(graphDev->launches, eagerDev->launches);
    EXPECT_EQ(graphDev->gemms, eagerDev->gemms);
    std::printf("[ stats    ] %d kernel launches and %d GEMMs per executor; %d graph launches\n",
                graphDev->launches, graphDev->gemms, graphDev->graphLaunches);
    EXPECT_EQ(graphDev->liveGraphs(), 3u);
  }
  // Turning graphs off drops them.
  graphs.set_cuda_graphs(false);
  if (graphDev) {
    EXPECT_EQ(graphDev->liveGraphs(), 0u);
  }
}

TEST(GpuExecutor, CudaGraphsMatchEagerBitForBit) { graphsMatchEager(emulatedDevice, 0); }

// On a GPU, flash attention's backward adds dQ's partial sums with atomics
// in whatever order the blocks run, so two runs of the same step (graph or
// eager) round differently: they agree to 1e-4 of each array's largest
// value, not bit for bit.
TEST_F(GpuExecutorOnGpu, CudaGraphsMatchEager) { graphsMatchEager(realGpu, 1e-4); }

// The side stream (GpuDevice::begin_side) against the compute stream, over
// a group of one rank (NCCL runs a communicator of one GPU): a collective on
// the side stream sees the compute stream's work before it, and the compute
// stream's work after join_side sees its result; eagerly, and in a captured
// graph, which must end with the side stream joined. Two batches: the
// compute stream overwrites the first one's source after join_side(1)
// (the first batch only), then joins the second with the rest.
void sideStreamOrdersCollectives(DeviceFactory make) {
  Device device = make();
  GpuDevice &d = *device.owned;
  ASSERT_TRUE(d.has_side_stream());
  mt::rt::ThreadGroup group(1, std::chrono::milliseconds(60000));
  std::unique_ptr<mt::rt::Communicator> host = group.rank(0);
  std::string error;
  std::unique_ptr<mt::rt::DeviceComm> comm = d.connect(*host, &error);
  ASSERT_TRUE(comm) << error;
  const uint64_t n = 1 << 20, bytes = n * 4; // 4 MiB of f32
  uint64_t x = 0, y = 0, z = 0, w = 0;
  for (uint64_t *p : {&x, &y, &z, &w})
    ASSERT_EQ(d.allocate(bytes, p), "");
  auto reduce = [&](uint64_t in, uint64_t out) {
    ASSERT_EQ(d.begin_side(), "");
    ASSERT_EQ(comm->all_reduce(in, out, n, mt::rt::CommElement::F32, mt::rt::ReduceOp::Sum, 1.0),
              "");
    ASSERT_EQ(d.end_side(), "");
  };
  auto expect_bytes = [&](uint64_t at, uint8_t pattern, const char *what) {
    std::vector<uint8_t> out(bytes);
    ASSERT_EQ(d.to_host(out.data(), at, bytes), "");
    size_t wrong = 0;
    for (uint8_t b : out)
      wrong += b != pattern;
    EXPECT_EQ(wrong, 0u) << what;
  };
  for (bool graph : {false, true}) {
    SCOPED_TRACE(graph ? "captured" : "eager");
    const uint8_t pattern = graph ? 0x3F : 0x40; // floats 0.747 and 3.004
    const uint8_t second = graph ? 0x3E : 0x41;  // 0.186 and 12.02
    ASSERT_EQ(d.fill(y, 0, bytes), "");
    ASSERT_EQ(d.fill(w, 0, bytes), "");
    ASSERT_EQ(d.synchronize(), "");
    if (graph) {
      ASSERT_EQ(d.begin_capture(), "");
    }
    ASSERT_EQ(d.fill(x, pattern, bytes), ""); // compute stream
    ASSERT_EQ(d.fill(z, second, bytes), "");
    reduce(x, y);
    reduce(z, w);
    ASSERT_EQ(d.join_side(1), "");
    ASSERT_EQ(d.fill(x, 0, bytes), ""); // after the first batch has read x
    ASSERT_EQ(d.join_side(), "");
    uint64_t handle = 0;
    if (graph) {
      ASSERT_EQ(d.end_capture(&handle), "");
      ASSERT_NE(handle, 0u);
      ASSERT_EQ(d.launch_graph(handle), "");
    }
    ASSERT_EQ(d.synchronize(), "");
    expect_bytes(y, pattern, "bytes of the first side batch's result that are not the compute "
                             "stream's fill before it");
    expect_bytes(w, second, "bytes of the second side batch's result that are not the compute "
                            "stream's fill before it");
    if (handle)
      d.destroy_graph(handle);
  }
}

TEST(GpuExecutor, SideStreamOrdersCollectives) { sideStreamOrdersCollectives(emulatedDevice); }
TEST_F(GpuExecutorOnGpu, SideStreamOrdersCollectives) { sideStreamOrdersCollectives(realGpu); }

TEST(GpuExecutor, PlanWithoutGpuFormIsRefused) {
  // Heads 16 wide: flash attention is generated for 64 and 128.
  auto file = compilePlan({{"model.num_attention_heads=8"}});
  ASSERT_TRUE(file);
  mt::rt::GpuExecutor gpu(*file->plan(), 0, std::make_unique<EmulatedDevice>());
  const std::string e = gpu.open();
  EXPECT_NE(e.find("ATTENTION: this plan has no GPU form for it"), std::string::npos) << e;
}

} // namespace
