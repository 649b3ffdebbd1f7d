// compiler/cuda's mixture-of-experts kernels (OpKernelsMoe.cpp) on the host
// emulation of CUDA (and a GPU where there is one: MoeKernelsOnGpu) against
// runtime/exec/cpu_kernels_moe (the CPU executor's), the router's gradient
// also against finite differences of the CPU's forward in double.
#include "KernelDevice.h"

#include "compiler/cuda/CudaOpKernels.h"
#include "runtime/exec/cpu_kernels.h"
#include "runtime/exec/cpu_kernels_moe.h"
#include "runtime/exec/cuda/cuda_api.h"
#include "runtime/exec/cuda/kernel_cache.h"
#include "runtime/exec/cuda/launch_limits.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using mt::OpArg;
using mt::OpInstruction;
using mt::OpKernels;
using mt::OpParam;
using mt::OpStep;
using mt::OpTensor;
using mt::plan::DType;
using mt::plan::Opcode;
using mt::test::KernelDevice;
using mt::test::Mirror;

// ---------------------------------------------------------------------------
// Arrays as the device holds them.

float roundTo(DType d, float x) {
  if (d == DType::BF16)
    mt::cpu::round_to_bf16(&x, 1);
  else if (d == DType::F16)
    mt::cpu::round_to_fp16(&x, 1);
  return x;
}

uint16_t halfBits(DType d, float x) {
  x = roundTo(d, x);
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (d == DType::BF16)
    return uint16_t(u >> 16);
  const uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u)
    return uint16_t(sign | 0x7E00u);
  if (mag == 0x7F800000u)
    return uint16_t(sign | 0x7C00u);
  if (mag >= 0x38800000u)
    return uint16_t(sign | (((mag >> 23) - 112u) << 10) | ((mag >> 13) & 0x3FFu));
  float a;
  std::memcpy(&a, &mag, 4);
  return uint16_t(sign | uint32_t(a * 0x1p24f));
}

float fromHalf(DType d, uint16_t h) {
  uint32_t u;
  if (d == DType::BF16) {
    u = uint32_t(h) << 16;
  } else {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 31)
      u = sign | 0x7F800000u | (m << 13);
    else if (e == 0) {
      float v = float(m) * 0x1p-24f;
      std::memcpy(&u, &v, 4);
      u |= sign;
    } else
      u = sign | ((e + 112u) << 23) | (m << 13);
  }
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

int bytesOf(DType d) {
  return d == DType::BF16 || d == DType::F16 ? 2 : d == DType::I64 || d == DType::F64 ? 8 : 4;
}

struct Arr {
  OpTensor t;
  std::vector<uint64_t> mem;
  Arr() = default;
  Arr(DType d, std::vector<int64_t> shape) {
    t.dtype = d;
    t.shape = std::move(shape);
    mem.assign(size_t((t.elements() * bytesOf(d) + 15) / 16 * 2 + 4), ~0ull); // NaN until written
  }
  void *data() {
    auto p = reinterpret_cast<uintptr_t>(mem.data());
    return reinterpret_cast<void *>((p + 15) / 16 * 16);
  }
  size_t bytes() const { return size_t((t.elements() * bytesOf(t.dtype) + 15) / 16 * 16); }
  void set(const std::vector<float> &v) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (t.dtype == DType::F32)
        static_cast<float *>(data())[i] = v[i];
      else if (t.dtype == DType::F64) // the router's logits with fp64
        static_cast<double *>(data())[i] = v[i];
      else
        static_cast<uint16_t *>(data())[i] = halfBits(t.dtype, v[i]);
    }
  }
  void setInts(const std::vector<int> &v) {
    std::memcpy(data(), v.data(), v.size() * 4);
  }
  std::vector<float> get() {
    std::vector<float> v(size_t(t.elements()));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = t.dtype == DType::F32   ? static_cast<float *>(data())[i]
             : t.dtype == DType::F64 ? float(static_cast<double *>(data())[i])
                                     : fromHalf(t.dtype, static_cast<uint16_t *>(data())[i]);
    return v;
  }
  std::vector<int> ints() {
    std::vector<int> v(size_t(t.elements()));
    std::memcpy(v.data(), data(), v.size() * 4);
    return v;
  }
};

// Runs the instruction's kernels (launches only: MoE needs no collective)
// with its values and parameter gradients; the workspace starts as NaN bytes.
std::string run(KernelDevice &device, const OpKernels &k, std::vector<Arr *> in,
                std::vector<Arr *> out, std::vector<Arr *> grads = {}) {
  std::vector<uint64_t> ws(size_t(k.workspaceBytes / 8 + 2), ~0ull);
  Mirror m(device);
  if (std::string e = m.map(ws.data(), ws.size() * 8); !e.empty())
    return e;
  for (auto *list : {&in, &out, &grads})
    for (Arr *a : *list)
      if (std::string e = m.map(a->data(), a->bytes()); !e.empty())
        return e;
  if (std::string e = m.upload(); !e.empty())
    return e;
  for (const OpStep &s : k.steps) {
    if (s.kind != OpStep::Launch)
      return "an MoE instruction with a collective step";
    const mt::OpLaunch &l = k.launches[s.launch];
    std::vector<uint64_t> args;
    for (const OpArg &a : l.args) {
      switch (a.kind) {
      case OpArg::In: args.push_back(m.at(in.at(a.index)->data())); break;
      case OpArg::Out: args.push_back(m.at(out.at(a.index)->data())); break;
      case OpArg::ParamGrad: args.push_back(m.at(grads.at(a.index)->data())); break;
      case OpArg::Workspace: args.push_back(m.at(ws.data(), a.index)); break;
      default: return "an MoE kernel asks for the state or the loss scale";
      }
    }
    if (!l.kernel.scalarArgs.empty())
      return "an MoE kernel with scalar arguments";
    if (std::string e = device.launch(l.kernel.source, l.kernel.entry, l.kernel.grid,
                                      l.kernel.block, l.kernel.sharedBytes, args);
        !e.empty())
      return e;
  }
  return m.download();
}

OpKernels generate(const OpInstruction &ins) {
  std::string error;
  std::optional<OpKernels> k = mt::generateOpKernels(ins, &error);
  EXPECT_TRUE(k) << error;
  return k ? *k : OpKernels{};
}

std::vector<float> randomValues(size_t n, uint32_t seed, float scale, DType d = DType::F32) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float &x : v)
    x = roundTo(d, dist(rng));
  return v;
}

::testing::AssertionResult close(const std::vector<float> &got, const std::vector<double> &want,
                                 double rel, double abs) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    if (!(err <= rel * std::fabs(want[i]) + abs))
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", want "
                                           << want[i] << " (error " << err << ")";
  }
  return ::testing::AssertionSuccess();
}

OpTensor tensor(DType d, std::vector<int64_t> shape) {
  OpTensor t;
  t.dtype = d;
  t.shape = std::move(shape);
  return t;
}

// ---------------------------------------------------------------------------
// The router against runtime/exec/cpu_kernels_moe (Megatron-Core 0.16's
// TopKRouter: the CPU executor's MOE_ROUTER), and its gradient against
// central differences of that reference in double.

struct RouterCfg {
  int64_t topk = 2;
  int sigmoid = 0, pre = 0;
  int balance = 0; // 0 none, 1 aux_loss, 2 seq_aux_loss
  int64_t capacity = 0;
  int position = 0, pad = 0;
  int64_t seq = 8;
  int dtype = 0; // moe_router_dtype
  double scaling = 0, auxCoeff = 0, zCoeff = 0;
  std::vector<int64_t> ints() const {
    return {topk, sigmoid, pre, balance, capacity, position, pad, seq, dtype, -1};
  }
  std::vector<double> floats() const { return {scaling, auxCoeff, zCoeff}; }
  // The CPU executor's config for logits of type `d` (its moe_router_config).
  mt::cpu::MoeRouterConfig cpu(int64_t T, int64_t E, DType d) const {
    mt::cpu::MoeRouterConfig c;
    c.tokens = T;
    c.experts = E;
    c.topk = topk;
    c.sigmoid = sigmoid == 1;
    c.pre_softmax = pre == 1;
    c.load_balancing = balance;
    c.capacity = capacity;
    c.drop_by_position = position == 1;
    c.pad_to_capacity = pad == 1;
    c.seq_length = seq;
    c.fp64 = dtype == 2;
    if (dtype == 0 && d == DType::BF16)
      c.rounding = mt::cpu::RouterRounding::BF16;
    else if (dtype == 0 && d == DType::F16)
      c.rounding = mt::cpu::RouterRounding::F16;
    c.scaling_factor = scaling;
    c.aux_loss_coeff = auxCoeff;
    c.z_loss_coeff = zCoeff;
    return c;
  }
};

OpInstruction routerIns(DType d, int64_t T, int64_t E, const RouterCfg &c) {
  OpInstruction ins;
  ins.op = Opcode::MOE_ROUTER;
  ins.in = {tensor(d, {T, E})};
  ins.out = {tensor(DType::F32, {T, E}), tensor(DType::I32, {T, E}), tensor(DType::F32, {}),
             tensor(DType::F32, {})};
  ins.ints = c.ints();
  ins.floats = c.floats();
  return ins;
}

struct RouterCase {
  const char *name;
  int64_t T, E;
  RouterCfg cfg;
  DType dtype = DType::F32;
};

std::vector<RouterCase> routerCases() {
  std::vector<RouterCase> v;
  RouterCfg c;
  c.balance = 1;
  c.auxCoeff = 0.01;
  v.push_back({"softmax top2 aux", 48, 6, c});
  c.zCoeff = 1e-3;
  c.scaling = 2.5;
  v.push_back({"softmax top2 aux z scaled", 48, 6, c});
  c = RouterCfg();
  c.pre = 1;
  c.topk = 3;
  c.balance = 2;
  c.seq = 12;
  c.auxCoeff = 0.1;
  v.push_back({"pre-softmax top3 seq_aux", 48, 40, c});
  c = RouterCfg();
  c.sigmoid = 1;
  c.topk = 1;
  c.balance = 1;
  c.auxCoeff = 0.01;
  c.zCoeff = 0.5;
  v.push_back({"sigmoid top1 aux z", 40, 8, c});
  c.topk = 4;
  c.scaling = 1.5;
  c.balance = 2;
  v.push_back({"sigmoid top4 scaled seq_aux", 40, 8, c});
  c = RouterCfg();
  c.capacity = 9; // ceil(48 * 2 / 6 * 0.5) = 8; 9 drops some
  c.balance = 1;
  c.auxCoeff = 0.02;
  v.push_back({"capacity probs", 48, 6, c});
  c.position = 1;
  v.push_back({"capacity position", 48, 6, c});
  c.pad = 1;
  c.dtype = 2;
  v.push_back({"capacity position padded fp64", 48, 6, c, DType::F64});
  c.position = 0;
  c.dtype = 1;
  c.capacity = 11;
  v.push_back({"capacity probs padded fp32", 48, 6, c});
  c.capacity = 48;
  v.push_back({"padded to every token", 48, 6, c});
  c = RouterCfg();
  c.zCoeff = 1e-3;
  c.pre = 1;
  c.balance = 1;
  c.auxCoeff = 0.01;
  c.capacity = 10;
  v.push_back({"bf16 rounding (router dtype unset)", 40, 8, c, DType::BF16});
  c.sigmoid = 1;
  c.pre = 0;
  c.scaling = 2.0;
  v.push_back({"f16 rounding sigmoid", 40, 8, c, DType::F16});
  c.dtype = 1;
  v.push_back({"bf16 logits fp32 router", 40, 8, c, DType::BF16});
  return v;
}

MT_KERNEL_TEST(MoeKernels, Router) {
  for (const RouterCase &rc : routerCases()) {
    SCOPED_TRACE(rc.name);
    const int64_t T = rc.T, E = rc.E;
    std::vector<float> logits = randomValues(size_t(T * E), 11, 1.5f, rc.dtype);
    // Tokens 5 to 20 repeat token 4: equal weights at its experts, more
    // than a capacity of 9 holds, so the capacity's last place is a tie
    // (kept in Megatron's token order).
    for (int64_t t = 5; t <= 20; ++t)
      for (int64_t e = 0; e < E; ++e)
        logits[t * E + e] = logits[4 * E + e];
    Arr x(rc.dtype, {T, E}), probs(DType::F32, {T, E}), map(DType::I32, {T, E}),
        aux(DType::F32, {}), z(DType::F32, {});
    x.set(logits);
    ASSERT_EQ(run(device, generate(routerIns(rc.dtype, T, E, rc.cfg)), {&x}, {&probs, &map, &aux, &z}),
              "");
    std::vector<float> wantProbs(size_t(T * E));
    std::vector<int> wantMap(size_t(T * E));
    double wantAux = 0, wantZ = 0;
    mt::cpu::moe_router_fwd(logits.data(), rc.cfg.cpu(T, E, rc.dtype), wantProbs.data(),
                            wantMap.data(), &wantAux, &wantZ);
    EXPECT_EQ(map.ints(), wantMap);
    EXPECT_TRUE(close(probs.get(), std::vector<double>(wantProbs.begin(), wantProbs.end()), 2e-6, 1e-7));
    EXPECT_TRUE(close(aux.get(), {wantAux}, 1e-5, 0));
    EXPECT_TRUE(close(z.get(), {wantZ}, 1e-5, 0));
    int kept = 0;
    for (int v : wantMap)
      kept += v;
    if (rc.cfg.pad) {
      EXPECT_EQ(kept, std::min(rc.cfg.capacity, T) * E);
    } else if (rc.cfg.capacity) {
      EXPECT_LT(kept, T * rc.cfg.topk); // something was dropped
    }
  }
}

// The gradient of J = sum(dprobs . probs) + aux_coeff scale aux + z_coeff
// scale z: against the CPU's moe_router_bwd, and against central
// differences of the CPU's forward in double.
MT_KERNEL_TEST(MoeKernels, RouterGradMatchesFiniteDifferences) {
  for (const RouterCase &rc : routerCases()) {
    SCOPED_TRACE(rc.name);
    const int64_t T = rc.T, E = rc.E;
    RouterCfg c = rc.cfg;
    if (!c.zCoeff)
      c.zCoeff = 0.3;
    std::vector<float> logits = randomValues(size_t(T * E), 12, 1.5f, rc.dtype);
    std::vector<float> dprobs = randomValues(size_t(T * E), 13, 1.0f);
    const float scale = 0.75f;
    const mt::cpu::MoeRouterConfig cc = c.cpu(T, E, rc.dtype);
    std::vector<float> fwdProbs(size_t(T * E));
    std::vector<int> fwdMap(size_t(T * E));
    double a0, z0;
    mt::cpu::moe_router_fwd(logits.data(), cc, fwdProbs.data(), fwdMap.data(), &a0, &z0);
    Arr dp(DType::F32, {T, E}), x(rc.dtype, {T, E}), probs(DType::F32, {T, E}),
        map(DType::I32, {T, E}), sc(DType::F32, {}), dl(rc.dtype, {T, E});
    dp.set(dprobs);
    x.set(logits);
    probs.set(fwdProbs);
    map.setInts(fwdMap);
    sc.set({scale});
    OpInstruction ins;
    ins.op = Opcode::MOE_ROUTER_GRAD;
    ins.in = {dp.t, x.t, probs.t, map.t, sc.t};
    ins.out = {dl.t};
    ins.ints = c.ints();
    ins.floats = c.floats();
    ASSERT_EQ(run(device, generate(ins), {&dp, &x, &probs, &map, &sc}, {&dl}), "");
    std::vector<float> cpu(size_t(T * E));
    mt::cpu::moe_router_bwd(dprobs.data(), logits.data(), fwdMap.data(), cc, double(scale),
                            cpu.data());
    double mag = 0;
    for (float v : cpu)
      mag = std::max(mag, double(std::fabs(v)));
    const double typeRel = rc.dtype == DType::BF16 ? 0x1p-8 : rc.dtype == DType::F16 ? 0x1p-11 : 0;
    std::vector<double> want;
    for (float v : cpu)
      want.push_back(double(roundTo(rc.dtype, v)));
    EXPECT_TRUE(close(dl.get(), want, std::max(1e-5, typeRel), 1e-6 * mag));
    if (rc.dtype != DType::F32 && rc.dtype != DType::F64)
      continue; // finite differences of the unrounded f32 or f64 router
    mt::cpu::MoeRouterConfig cd = cc;
    auto objective = [&](const std::vector<double> &l) {
      std::vector<double> p(size_t(T * E));
      std::vector<int> m(size_t(T * E));
      double aux, z;
      mt::cpu::moe_router_fwd(l.data(), cd, p.data(), m.data(), &aux, &z);
      double j = 0;
      for (size_t i = 0; i < p.size(); ++i)
        j += double(dprobs[i]) * p[i];
      return j + c.auxCoeff * scale * aux + c.zCoeff * scale * z;
    };
    std::vector<double> fd(size_t(T * E));
    std::vector<double> l(logits.begin(), logits.end());
    const double h = 1e-5;
    for (size_t i = 0; i < l.size(); ++i) {
      const double keep = l[i];
      l[i] = keep + h;
      const double up = objective(l);
      l[i] = keep - h;
      const double down = objective(l);
      l[i] = keep;
      fd[i] = (up - down) / (2 * h);
    }
    EXPECT_TRUE(close(dl.get(), fd, 1e-4, 1e-5 * mag)) << "largest gradient " << mag;
  }
}

// Two tensor-parallel ranks of one router instruction in lockstep: each
// launch on both, and the steps' f64 all-reduces (count_group) summed
// across the two ranks' workspaces, as NCCL would.
std::string runTp2(KernelDevice &device, const OpKernels &k, std::vector<Arr *> in[2],
                   std::vector<Arr *> out[2]) {
  std::vector<uint64_t> ws[2];
  std::unique_ptr<Mirror> m[2];
  for (int r = 0; r < 2; ++r) {
    ws[r].assign(size_t(k.workspaceBytes / 8 + 2), ~0ull);
    m[r] = std::make_unique<Mirror>(device);
    if (std::string e = m[r]->map(ws[r].data(), ws[r].size() * 8); !e.empty())
      return e;
    for (auto *list : {&in[r], &out[r]})
      for (Arr *a : *list)
        if (std::string e = m[r]->map(a->data(), a->bytes()); !e.empty())
          return e;
    if (std::string e = m[r]->upload(); !e.empty())
      return e;
  }
  int reduces = 0;
  for (const OpStep &s : k.steps) {
    if (s.kind == OpStep::AllReduceSum && s.type == OpStep::F64 && s.group == 1) {
      ++reduces;
      double *a[2];
      for (int r = 0; r < 2; ++r) {
        if (std::string e = m[r]->download(ws[r].data()); !e.empty())
          return e;
        a[r] = reinterpret_cast<double *>(reinterpret_cast<char *>(ws[r].data()) + s.offset);
      }
      for (uint64_t i = 0; i < s.count; ++i)
        a[0][i] = a[1][i] = a[0][i] + a[1][i];
      for (int r = 0; r < 2; ++r)
        if (std::string e = m[r]->upload(ws[r].data()); !e.empty())
          return e;
      continue;
    }
    if (s.kind != OpStep::Launch)
      return "a router step other than a launch or an f64 sum over tp";
    const mt::OpLaunch &l = k.launches[s.launch];
    for (int r = 0; r < 2; ++r) {
      std::vector<uint64_t> args;
      for (const OpArg &a : l.args) {
        switch (a.kind) {
        case OpArg::In: args.push_back(m[r]->at(in[r].at(a.index)->data())); break;
        case OpArg::Out: args.push_back(m[r]->at(out[r].at(a.index)->data())); break;
        case OpArg::Workspace: args.push_back(m[r]->at(ws[r].data(), a.index)); break;
        default: return "a router kernel asks for the state or the loss scale";
        }
      }
      if (std::string e = device.launch(l.kernel.source, l.kernel.entry, l.kernel.grid,
                                        l.kernel.block, l.kernel.sharedBytes, args);
          !e.empty())
        return e;
    }
  }
  if (reduces != 1)
    return "the router summed its counts over tp " + std::to_string(reduces) + " times";
  for (int r = 0; r < 2; ++r)
    if (std::string e = m[r]->download(); !e.empty())
      return e;
  return "";
}

// count_group 1 (sequence parallelism over tp = 2): each rank routes its T
// tokens with its own scores, the load-balancing counts summed over both
// and the token total 2T (Megatron's get_tokens_per_expert_and_token_count).
// Then the two ranks' aux losses add up to the CPU router's over all 2T
// tokens, and each rank's logits gradient is the rows of the CPU's (the
// counts are constants of the loss, so rank r's loss depends on its own
// logits only). z-loss and capacity are per rank and left out here.
MT_KERNEL_TEST(MoeKernels, RouterSumsItsCountsOverTp) {
  struct Case {
    const char *name;
    RouterCfg cfg;
  };
  std::vector<Case> cases;
  RouterCfg c;
  c.balance = 1;
  c.auxCoeff = 0.01;
  cases.push_back({"softmax top2", c});
  c.pre = 1;
  c.topk = 3;
  cases.push_back({"pre-softmax top3", c});
  c = RouterCfg();
  c.sigmoid = 1;
  c.balance = 1;
  c.auxCoeff = 0.05;
  c.scaling = 1.5;
  cases.push_back({"sigmoid top2 scaled", c});
  for (const Case &cs : cases) {
    SCOPED_TRACE(cs.name);
    const int64_t T = 24, E = 6;
    const float scale = 0.75f;
    std::vector<float> logits = randomValues(size_t(2 * T * E), 21, 1.5f);
    std::vector<float> dprobs = randomValues(size_t(2 * T * E), 22, 1.0f);
    mt::cpu::MoeRouterConfig whole = cs.cfg.cpu(2 * T, E, DType::F32);
    std::vector<float> wantProbs(size_t(2 * T * E)), wantGrad(size_t(2 * T * E));
    std::vector<int> wantMap(size_t(2 * T * E));
    double wantAux = 0, wantZ = 0;
    mt::cpu::moe_router_fwd(logits.data(), whole, wantProbs.data(), wantMap.data(), &wantAux,
                            &wantZ);
    mt::cpu::moe_router_bwd(dprobs.data(), logits.data(), wantMap.data(), whole, double(scale),
                            wantGrad.data());
    std::vector<int64_t> ints = cs.cfg.ints();
    ints.resize(9);
    ints.push_back(1); // count_group: tp
    OpInstruction fwd = routerIns(DType::F32, T, E, cs.cfg);
    fwd.ints = ints;
    fwd.tensorParallel = 2;
    std::vector<std::unique_ptr<Arr>> keep;
    auto arr = [&](DType d, std::vector<int64_t> shape) {
      keep.push_back(std::make_unique<Arr>(d, std::move(shape)));
      return keep.back().get();
    };
    std::vector<Arr *> in[2], out[2], gin[2], gout[2];
    for (int r = 0; r < 2; ++r) {
      Arr *x = arr(DType::F32, {T, E});
      x->set(std::vector<float>(logits.begin() + r * T * E, logits.begin() + (r + 1) * T * E));
      in[r] = {x};
      out[r] = {arr(DType::F32, {T, E}), arr(DType::I32, {T, E}), arr(DType::F32, {}),
                arr(DType::F32, {})};
    }
    ASSERT_EQ(runTp2(device, generate(fwd), in, out), "");
    double aux = 0;
    for (int r = 0; r < 2; ++r) {
      aux += out[r][2]->get()[0];
      EXPECT_EQ(out[r][1]->ints(), std::vector<int>(wantMap.begin() + r * T * E,
                                                     wantMap.begin() + (r + 1) * T * E));
    }
    EXPECT_TRUE(close({float(aux)}, {wantAux}, 1e-5, 0)) << "the ranks' aux losses summed";
    OpInstruction bwd;
    bwd.op = Opcode::MOE_ROUTER_GRAD;
    bwd.ints = ints;
    bwd.floats = cs.cfg.floats();
    bwd.tensorParallel = 2;
    for (int r = 0; r < 2; ++r) {
      Arr *dp = arr(DType::F32, {T, E}), *sc = arr(DType::F32, {}), *dl = arr(DType::F32, {T, E});
      dp->set(std::vector<float>(dprobs.begin() + r * T * E, dprobs.begin() + (r + 1) * T * E));
      sc->set({scale});
      gin[r] = {dp, in[r][0], out[r][0], out[r][1], sc};
      gout[r] = {dl};
    }
    bwd.in = {gin[0][0]->t, gin[0][1]->t, gin[0][2]->t, gin[0][3]->t, gin[0][4]->t};
    bwd.out = {gout[0][0]->t};
    ASSERT_EQ(runTp2(device, generate(bwd), gin, gout), "");
    double mag = 0;
    for (float v : wantGrad)
      mag = std::max(mag, double(std::fabs(v)));
    for (int r = 0; r < 2; ++r)
      EXPECT_TRUE(close(gout[r][0]->get(),
                        std::vector<double>(wantGrad.begin() + r * T * E,
                                            wantGrad.begin() + (r + 1) * T * E),
                        1e-5, 1e-6 * mag))
          << "rank " << r << "'s logits gradient";
  }
}

// ---------------------------------------------------------------------------
// Permute and unpermute, and their gradients, against the CPU's.

struct PermCase {
  const char *name;
  RouterCfg cfg;
  int64_t rows;
  DType dtype;
  int64_t h;
};

MT_KERNEL_TEST(MoeKernels, PermuteUnpermuteAndGradients) {
  const int64_t T = 40, E = 5;
  RouterCfg plain;
  RouterCfg cap = plain;
  cap.capacity = 12;
  RouterCfg padded = cap;
  padded.pad = 1;
  padded.position = 1;
  const PermCase cases[] = {{"no capacity f32", plain, T * 2, DType::F32, 24},
                            {"capacity bf16", cap, std::min<int64_t>(T * 2, E * 12), DType::BF16, 40},
                            {"padded f16 odd hidden", padded, E * 12, DType::F16, 21}};
  for (const PermCase &pc : cases) {
    SCOPED_TRACE(pc.name);
    const int64_t H = pc.h, N = pc.rows;
    const double typeRel = pc.dtype == DType::F32 ? 1e-6 : pc.dtype == DType::BF16 ? 0x1p-8 : 0x1p-11;
    auto rounded = [&](const std::vector<float> &v) {
      std::vector<double> r;
      for (float f : v)
        r.push_back(double(roundTo(pc.dtype, f)));
      return r;
    };
    const std::vector<float> logits = randomValues(size_t(T * E), 21, 1.0f);
    std::vector<float> probsF(size_t(T * E));
    std::vector<int> routing(size_t(T * E));
    double aux, z;
    mt::cpu::moe_router_fwd(logits.data(), pc.cfg.cpu(T, E, DType::F32), probsF.data(),
                            routing.data(), &aux, &z);
    std::vector<float> xs = randomValues(size_t(T * H), 22, 1.0f, pc.dtype);
    std::vector<float> wantY(size_t(N * H));
    std::vector<int> wantRows(static_cast<size_t>(N)), wantTpe(static_cast<size_t>(E));
    ASSERT_EQ(mt::cpu::moe_permute_fwd(xs.data(), routing.data(), T, E, H, N, pc.cfg.capacity,
                                       pc.cfg.pad != 0, wantY.data(), wantRows.data(),
                                       wantTpe.data()),
              "");
    Arr x(pc.dtype, {T, H}), map(DType::I32, {T, E}), y(pc.dtype, {N, H}), rowIds(DType::I32, {N}),
        tpe(DType::I32, {E});
    x.set(xs);
    map.setInts(routing);
    OpInstruction ins;
    ins.op = Opcode::MOE_PERMUTE;
    ins.in = {x.t, map.t};
    ins.out = {y.t, rowIds.t, tpe.t};
    ins.ints = {pc.cfg.capacity, pc.cfg.pad};
    ASSERT_EQ(run(device, generate(ins), {&x, &map}, {&y, &rowIds, &tpe}), "");
    EXPECT_EQ(rowIds.ints(), wantRows);
    EXPECT_EQ(tpe.ints(), wantTpe);
    EXPECT_TRUE(close(y.get(), rounded(wantY), 0, 0));
    if (pc.cfg.pad) {
      for (int r : wantRows) {
        EXPECT_GE(r, 0); // padding fills every row with a token (weight 0 if unrouted)
      }
    }

    // The permute's gradient: each token's rows summed.
    std::vector<float> dys = randomValues(size_t(N * H), 23, 1.0f, pc.dtype);
    Arr dy(pc.dtype, {N, H}), dx(pc.dtype, {T, H});
    dy.set(dys);
    ins.op = Opcode::MOE_PERMUTE_GRAD;
    ins.in = {dy.t, rowIds.t};
    ins.out = {dx.t};
    ins.ints = {};
    ASSERT_EQ(run(device, generate(ins), {&dy, &rowIds}, {&dx}), "");
    std::vector<float> wantDx(size_t(T * H));
    ASSERT_EQ(mt::cpu::moe_permute_bwd(dys.data(), wantRows.data(), N, T, H, wantDx.data()), "");
    EXPECT_TRUE(close(dx.get(), rounded(wantDx), typeRel, 1e-6));

    // Unpermute: the weighted sum of each token's rows, and its gradient.
    std::vector<float> ys = randomValues(size_t(N * H), 24, 1.0f, pc.dtype);
    Arr yy(pc.dtype, {N, H}), probs(DType::F32, {T, E}), out(pc.dtype, {T, H});
    yy.set(ys);
    probs.set(probsF);
    ins.op = Opcode::MOE_UNPERMUTE;
    ins.in = {yy.t, probs.t, rowIds.t, tpe.t};
    ins.out = {out.t};
    ASSERT_EQ(run(device, generate(ins), {&yy, &probs, &rowIds, &tpe}, {&out}), "");
    std::vector<float> wantOut(size_t(T * H));
    ASSERT_EQ(mt::cpu::moe_unpermute_fwd(ys.data(), probsF.data(), wantRows.data(), wantTpe.data(),
                                         T, E, N, H, wantOut.data()),
              "");
    EXPECT_TRUE(close(out.get(), rounded(wantOut), typeRel, 1e-6));

    std::vector<float> douts = randomValues(size_t(T * H), 25, 1.0f, pc.dtype);
    Arr dout(pc.dtype, {T, H}), dyy(pc.dtype, {N, H}), dprobs(DType::F32, {T, E});
    dout.set(douts);
    ins.op = Opcode::MOE_UNPERMUTE_GRAD;
    ins.in = {dout.t, yy.t, probs.t, rowIds.t, tpe.t};
    ins.out = {dyy.t, dprobs.t};
    ASSERT_EQ(run(device, generate(ins), {&dout, &yy, &probs, &rowIds, &tpe}, {&dyy, &dprobs}), "");
    std::vector<float> wantDy(size_t(N * H)), wantDp(size_t(T * E));
    ASSERT_EQ(mt::cpu::moe_unpermute_bwd(douts.data(), ys.data(), probsF.data(), wantRows.data(),
                                         wantTpe.data(), T, E, N, H, wantDy.data(), wantDp.data()),
              "");
    EXPECT_TRUE(close(dyy.get(), rounded(wantDy), typeRel, 1e-7));
    EXPECT_TRUE(close(dprobs.get(), std::vector<double>(wantDp.begin(), wantDp.end()), 1e-5, 1e-5));
  }
}

// ---------------------------------------------------------------------------
// The grouped GEMM: forward, input gradient and weight gradient, against
// the CPU's in double (the tolerance scales with the sum of |products|).

struct GemmCase {
  const char *name;
  DType dtype;
  int64_t K, M;
  std::vector<int> tpe; // rows past their sum are unused
  int64_t N;
  DType grad = DType::F32;
};

MT_KERNEL_TEST(MoeKernels, GroupedMatmul) {
  const GemmCase cases[] = {
      {"f32", DType::F32, 40, 136, {150, 0, 61}, 230},
      {"bf16", DType::BF16, 48, 136, {150, 0, 61}, 230},
      {"f16 odd sizes", DType::F16, 36, 20, {5, 17, 0, 9}, 40},
      {"bf16 bf16 gradient", DType::BF16, 32, 24, {30, 2}, 32, DType::BF16},
  };
  for (const GemmCase &gc : cases) {
    SCOPED_TRACE(gc.name);
    const int64_t E = int64_t(gc.tpe.size()), K = gc.K, M = gc.M, N = gc.N;
    std::vector<int> starts;
    int used = 0;
    for (int c : gc.tpe) {
      starts.push_back(used);
      used += c;
    }
    const double rel = gc.dtype == DType::F32 ? 2e-6 : gc.dtype == DType::BF16 ? 0x1p-8 : 0x1p-11;
    std::vector<float> xs = randomValues(size_t(N * K), 31, 1.0f, gc.dtype);
    std::vector<float> ws = randomValues(size_t(E * M * K), 32, 0.5f, gc.dtype);
    std::vector<float> dys = randomValues(size_t(N * M), 33, 1.0f, gc.dtype);
    Arr x(gc.dtype, {N, K}), w(gc.dtype, {E, M, K}), tpe(DType::I32, {E}), y(gc.dtype, {N, M});
    x.set(xs);
    w.set(ws);
    tpe.setInts(gc.tpe);
    auto expertOf = [&](int64_t r) {
      for (int64_t e = 0; e < E; ++e)
        if (r >= starts[e] && r < starts[e] + gc.tpe[e])
          return e;
      return E;
    };
    OpInstruction ins;
    ins.op = Opcode::GROUPED_MATMUL;
    ins.in = {x.t, w.t, tpe.t};
    ins.out = {y.t};
    ASSERT_EQ(run(device, generate(ins), {&x, &w, &tpe}, {&y}), "");
    const std::vector<double> xd(xs.begin(), xs.end()), wd(ws.begin(), ws.end()),
        dyd(dys.begin(), dys.end());
    std::vector<double> want(size_t(N * M)), abs(size_t(N * M), 0.0);
    ASSERT_EQ(mt::cpu::grouped_matmul_fwd(xd.data(), wd.data(), gc.tpe.data(), E, N, K, M,
                                          want.data()),
              "");
    for (int64_t r = 0; r < N; ++r) {
      const int64_t e = expertOf(r);
      if (e == E)
        continue;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k)
          abs[r * M + m] += std::fabs(double(xs[r * K + k]) * ws[(e * M + m) * K + k]);
    }
    auto within = [](const std::vector<float> &got, const std::vector<double> &w,
                     const std::vector<double> &a, double rel) -> ::testing::AssertionResult {
      for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::fabs(double(got[i]) - w[i]);
        if (!(err <= rel * std::fabs(w[i]) + 1e-6 * a[i] + 1e-30))
          return ::testing::AssertionFailure()
                 << "element " << i << ": got " << got[i] << ", want " << w[i];
      }
      return ::testing::AssertionSuccess();
    };
    EXPECT_TRUE(within(y.get(), want, abs, rel));

    // dx = dy w[e], zeros past the segments.
    Arr dy(gc.dtype, {N, M}), dx(gc.dtype, {N, K});
    dy.set(dys);
    ins.op = Opcode::GROUPED_MATMUL_INPUT_GRAD;
    ins.in = {dy.t, w.t, tpe.t};
    ins.out = {dx.t};
    ASSERT_EQ(run(device, generate(ins), {&dy, &w, &tpe}, {&dx}), "");
    std::vector<double> wantDx(size_t(N * K)), absDx(size_t(N * K), 0.0);
    ASSERT_EQ(mt::cpu::grouped_matmul_bwd_input(dyd.data(), wd.data(), gc.tpe.data(), E, N, K, M,
                                                wantDx.data()),
              "");
    for (int64_t r = 0; r < N; ++r) {
      const int64_t e = expertOf(r);
      if (e == E)
        continue;
      for (int64_t k = 0; k < K; ++k)
        for (int64_t m = 0; m < M; ++m)
          absDx[r * K + k] += std::fabs(double(dys[r * M + m]) * ws[(e * M + m) * K + k]);
    }
    EXPECT_TRUE(within(dx.get(), wantDx, absDx, rel));

    // grad w[e] += dy^T x over the expert's rows, in the gradient's type.
    std::vector<float> g0 = randomValues(size_t(E * M * K), 34, 0.1f, gc.grad);
    Arr grad(gc.grad, {E, M, K});
    grad.set(g0);
    OpParam p;
    p.shape = {E, M, K};
    p.dtype = gc.dtype;
    p.gradDtype = gc.grad;
    ins.op = Opcode::GROUPED_MATMUL_WEIGHT_GRAD;
    ins.in = {dy.t, x.t, tpe.t};
    ins.out = {};
    ins.params = {p};
    ASSERT_EQ(run(device, generate(ins), {&dy, &x, &tpe}, {}, {&grad}), "");
    std::vector<double> wantG(g0.begin(), g0.end()), absG(size_t(E * M * K), 0.0);
    ASSERT_EQ(mt::cpu::grouped_matmul_bwd_weight(dyd.data(), xd.data(), gc.tpe.data(), E, N, K, M,
                                                 wantG.data()),
              "");
    for (int64_t r = 0; r < N; ++r) {
      const int64_t e = expertOf(r);
      if (e == E)
        continue;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k)
          absG[(e * M + m) * K + k] += std::fabs(double(dys[r * M + m]) * xs[r * K + k]);
    }
    EXPECT_TRUE(within(grad.get(), wantG, absG, gc.grad == DType::F32 ? 2e-6 : 0x1p-8));
    // An expert without rows keeps its gradient bit for bit.
    for (int64_t e = 0; e < E; ++e) {
      if (gc.tpe[e] == 0) {
        for (int64_t i = 0; i < M * K; ++i) {
          ASSERT_EQ(grad.get()[e * M * K + i], g0[e * M * K + i]);
        }
      }
    }
  }
}

// Every MoE launch fits every GPU mt runs on at real sizes: Mixtral 8x7B
// (8 experts, top-2, hidden 4096, FFN 14336) and a DeepSeek-V3-like layer
// (256 experts, top-8, hidden 7168, FFN 2048), 8192 tokens and 64 x 8192,
// with and without a capacity; the grouped GEMM at the 1024-expert limit
// (its static shared memory is largest there) compiles with NVRTC.
TEST(MoeKernels, LaunchesFitAtRealSizes) {
  struct Layer {
    int64_t e, k, h, f;
  };
  size_t launches = 0;
  for (const Layer &l : {Layer{8, 2, 4096, 14336}, Layer{256, 8, 7168, 2048}})
    for (int64_t T : {int64_t(8192), int64_t(64) * 8192})
      for (int64_t C : {int64_t(0), T * l.k / l.e}) {
        const int64_t N = C ? std::min(T * l.k, l.e * C) : T * l.k;
        RouterCfg c;
        c.topk = l.k;
        c.capacity = C;
        c.balance = 2;
        c.auxCoeff = 0.01;
        c.zCoeff = 0.001;
        c.seq = 4096;
        const DType b = DType::BF16;
        OpTensor tl = tensor(b, {T, l.e}), tp = tensor(DType::F32, {T, l.e}),
                 tm = tensor(DType::I32, {T, l.e}), ts = tensor(DType::F32, {}),
                 tc = tensor(DType::I32, {l.e}), tr = tensor(DType::I32, {N}),
                 tx = tensor(b, {T, l.h}), txp = tensor(b, {N, l.h}), th = tensor(b, {N, 2 * l.f}),
                 ta = tensor(b, {N, l.f}), tw1 = tensor(b, {l.e, 2 * l.f, l.h}),
                 tw2 = tensor(b, {l.e, l.h, l.f});
        std::vector<OpInstruction> all;
        all.push_back(routerIns(b, T, l.e, c));
        OpInstruction i;
        auto add = [&](Opcode op, std::vector<OpTensor> in, std::vector<OpTensor> out,
                       std::vector<int64_t> ints = {}, std::vector<OpParam> params = {}) {
          i.op = op;
          i.in = std::move(in);
          i.out = std::move(out);
          i.ints = std::move(ints);
          i.floats = {};
          i.params = std::move(params);
          if (op == Opcode::MOE_ROUTER_GRAD) {
            i.ints = c.ints();
            i.floats = c.floats();
          }
          all.push_back(i);
        };
        OpParam w1;
        w1.shape = tw1.shape;
        w1.dtype = b;
        add(Opcode::MOE_ROUTER_GRAD, {tp, tl, tp, tm, ts}, {tl});
        add(Opcode::MOE_PERMUTE, {tx, tm}, {txp, tr, tc}, {C, 0});
        add(Opcode::MOE_PERMUTE_GRAD, {txp, tr}, {tx});
        add(Opcode::GROUPED_MATMUL, {txp, tw1, tc}, {th});
        add(Opcode::GROUPED_MATMUL, {ta, tw2, tc}, {txp});
        add(Opcode::GROUPED_MATMUL_INPUT_GRAD, {th, tw1, tc}, {txp});
        add(Opcode::GROUPED_MATMUL_WEIGHT_GRAD, {th, txp, tc}, {}, {}, {w1});
        add(Opcode::MOE_UNPERMUTE, {txp, tp, tr, tc}, {tx});
        add(Opcode::MOE_UNPERMUTE_GRAD, {tx, txp, tp, tr, tc}, {txp, tp});
        for (const OpInstruction &ins : all) {
          std::string error;
          std::optional<OpKernels> k = mt::generateOpKernels(ins, &error);
          ASSERT_TRUE(k) << error;
          for (const mt::OpLaunch &ln : k->launches) {
            EXPECT_EQ(mt::cu::check_launch(ln.kernel.entry, ln.kernel.grid, ln.kernel.block,
                                           ln.kernel.sharedBytes),
                      "")
                << mt::plan::EnumNameOpcode(ins.op) << " tokens " << T << " experts " << l.e;
            ++launches;
          }
        }
      }
  EXPECT_GT(launches, 100u);
  std::string error;
  const mt::cu::Nvrtc *nvrtc = mt::cu::load_nvrtc(&error);
  if (!nvrtc)
    GTEST_SKIP() << error;
  for (DType d : {DType::BF16, DType::F32}) {
    OpInstruction ins;
    ins.op = Opcode::GROUPED_MATMUL;
    ins.in = {tensor(d, {4096, 64}), tensor(d, {1024, 64, 64}), tensor(DType::I32, {1024})};
    ins.out = {tensor(d, {4096, 64})};
    const OpKernels k = generate(ins);
    ASSERT_EQ(k.launches.size(), 1u);
    std::string cubin, e;
    mt::rt::nvrtc_compile(*nvrtc, k.launches[0].kernel.entry, k.launches[0].kernel.source, 80,
                          mt::rt::nvrtc_options(80), &cubin, &e);
    EXPECT_EQ(e, "") << mt::plan::EnumNameDType(d);
  }
}

// Operands that do not fit the signature's shapes are refused, naming it.
TEST(MoeKernels, RefusesMismatchedShapes) {
  OpInstruction ins;
  ins.op = Opcode::GROUPED_MATMUL;
  ins.in = {tensor(DType::BF16, {64, 32}), tensor(DType::BF16, {4, 48, 40}),
            tensor(DType::I32, {4})};
  ins.out = {tensor(DType::BF16, {64, 48})};
  std::string error;
  EXPECT_FALSE(mt::generateOpKernels(ins, &error));
  EXPECT_NE(error.find("GROUPED_MATMUL"), std::string::npos) << error;
  EXPECT_NE(error.find("w [E, M, K]"), std::string::npos) << error;
  RouterCfg c;
  c.topk = 9;
  error.clear();
  EXPECT_FALSE(mt::generateOpKernels(routerIns(DType::F32, 8, 8, c), &error));
  EXPECT_NE(error.find("topk <= experts"), std::string::npos) << error;
  c.topk = 2;
  OpInstruction g;
  g.op = Opcode::MOE_ROUTER_GRAD;
  g.in = {tensor(DType::BF16, {8, 8}), tensor(DType::BF16, {8, 8}), tensor(DType::F32, {8, 8}),
          tensor(DType::I32, {8, 8}), tensor(DType::F32, {})};
  g.out = {tensor(DType::BF16, {8, 8})};
  g.ints = c.ints();
  g.floats = c.floats();
  error.clear();
  EXPECT_FALSE(mt::generateOpKernels(g, &error)); // dprobs must be f32
  EXPECT_NE(error.find("dprobs f32"), std::string::npos) << error;
  g.in[0].dtype = DType::F32;
  EXPECT_TRUE(mt::generateOpKernels(g, &error)) << error;
}

} // namespace
