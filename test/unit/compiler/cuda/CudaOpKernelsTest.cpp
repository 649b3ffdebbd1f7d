// compiler/cuda/CudaOpKernels: every opcode's kernels compile with NVRTC for sm_80
// and sm_90 (f32, bf16, f16) when NVRTC is present, carry the features they
// are built for, and compute what runtime/exec/cpu_kernels computes when run on
// the host emulation of CUDA (CudaHostKernel), on random inputs; where there
// is a GPU, the same checks run on it (CudaOpKernelsOnGpu).
#include "KernelDevice.h"

#include "compiler/cuda/CudaOpKernels.h"
#include "compiler/cuda/GpuSteps.h"
#include "runtime/exec/cpu_kernels.h"
#include "runtime/exec/cuda/cuda_api.h"
#include "runtime/exec/cuda/kernel_cache.h"
#include "runtime/exec/cuda/launch_limits.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
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

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

// ---------------------------------------------------------------------------
// Storage: values as the GPU holds them (bf16/f16 bits, f32, ints).

uint32_t bitsOf(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float floatOf(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// The value rounded to `d`, as the CPU executor rounds results.
float roundTo(DType d, float x) {
  if (d == DType::BF16)
    mt::cpu::round_to_bf16(&x, 1);
  else if (d == DType::F16)
    mt::cpu::round_to_fp16(&x, 1);
  return x;
}

uint16_t halfBits(DType d, float x) {
  x = roundTo(d, x);
  const uint32_t u = bitsOf(x);
  if (d == DType::BF16)
    return uint16_t(u >> 16);
  const uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u)
    return uint16_t(sign | 0x7E00u);
  if (mag == 0x7F800000u)
    return uint16_t(sign | 0x7C00u);
  if (mag >= 0x38800000u)
    return uint16_t(sign | (((mag >> 23) - 112u) << 10) | ((mag >> 13) & 0x3FFu));
  return uint16_t(sign | uint32_t(floatOf(mag) * 0x1p24f));
}

float fromHalf(DType d, uint16_t h) {
  if (d == DType::BF16)
    return floatOf(uint32_t(h) << 16);
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 31)
    return floatOf(sign | 0x7F800000u | (m << 13));
  if (e == 0)
    return floatOf(bitsOf(float(m) * 0x1p-24f) | sign);
  return floatOf(sign | ((e + 112u) << 23) | (m << 13));
}

int bytesOf(DType d) {
  return d == DType::BF16 || d == DType::F16 ? 2 : d == DType::I64 ? 8 : 4;
}

// A device buffer of the emulation: bytes, 16-byte aligned through the
// vector's allocator (operator new aligns to 16 on x86-64).
struct Buffer {
  OpTensor t;
  std::vector<uint64_t> storage; // 8-byte units keep the data 8-aligned at least

  Buffer() = default;
  Buffer(DType d, std::vector<int64_t> shape) {
    t.dtype = d;
    t.shape = std::move(shape);
    storage.assign(size_t((t.elements() * bytesOf(d) + 15) / 16 * 2 + 2), 0);
  }
  void *data() {
    auto p = reinterpret_cast<uintptr_t>(storage.data());
    return reinterpret_cast<void *>((p + 15) / 16 * 16);
  }
  // The bytes after data(): the elements rounded up to 16.
  size_t bytes() const { return size_t((t.elements() * bytesOf(t.dtype) + 15) / 16 * 16); }
  void set(const std::vector<float> &v) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (t.dtype == DType::F32)
        static_cast<float *>(data())[i] = v[i];
      else
        static_cast<uint16_t *>(data())[i] = halfBits(t.dtype, v[i]);
    }
  }
  void setInts(const std::vector<int64_t> &v) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (t.dtype == DType::I64)
        static_cast<int64_t *>(data())[i] = v[i];
      else
        static_cast<int32_t *>(data())[i] = int32_t(v[i]);
    }
  }
  std::vector<float> get() {
    std::vector<float> v(size_t(t.elements()));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = t.dtype == DType::F32 ? static_cast<float *>(data())[i]
                                   : fromHalf(t.dtype, static_cast<uint16_t *>(data())[i]);
    return v;
  }
};

std::vector<float> randomValues(size_t n, uint32_t seed, float scale = 1.0f, DType d = DType::F32) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float &x : v)
    x = roundTo(d, dist(rng));
  return v;
}

// ---------------------------------------------------------------------------
// Running an instruction's steps on a device, one or more ranks in lockstep
// (collectives combine the ranks' workspaces on the host).

// A state buffer with two parameters: bf16 (or f16) with an f32 master,
// and an f32 one updated in place; odd counts leave a scalar tail.
struct OptimizerState {
  std::vector<uint64_t> bytes = std::vector<uint64_t>(65536 / 8, 0);
  uint8_t *base() { return reinterpret_cast<uint8_t *>(bytes.data()); }
  float *f(int64_t offset) { return reinterpret_cast<float *>(base() + offset); }
  uint16_t *h(int64_t offset) { return reinterpret_cast<uint16_t *>(base() + offset); }
};

struct Rank {
  std::vector<Buffer *> in, out;
  std::vector<std::vector<float> *> grads;
  OptimizerState *state = nullptr;
  float lossScale = 1.0f;
  uint64_t seed = 0, rngOffset = 0, tpRank = 0, dpRank = 0;
  std::vector<uint64_t> ws;
  void *wsData() { return ws.data(); }
};

std::string launch(KernelDevice &device, const Mirror &m, const mt::OpLaunch &l, Rank &r) {
  std::vector<uint64_t> args;
  for (const OpArg &a : l.args) {
    switch (a.kind) {
    case OpArg::In: args.push_back(m.at(r.in.at(a.index)->data())); break;
    case OpArg::Out: args.push_back(m.at(r.out.at(a.index)->data())); break;
    case OpArg::ParamGrad: args.push_back(m.at(r.grads.at(a.index)->data())); break;
    case OpArg::State: args.push_back(m.at(r.state->base())); break;
    case OpArg::Workspace: args.push_back(m.at(r.wsData(), uint64_t(a.index))); break;
    case OpArg::LossScale: args.push_back(m.at(&r.lossScale)); break;
    }
  }
  size_t stream = 0;
  for (const std::string &s : l.kernel.scalarArgs)
    args.push_back(s == "seed"         ? m.at(&r.seed) // device scalars
                   : s == "rng_offset" ? m.at(&r.rngOffset)
                   : s == "tp_rank"    ? r.tpRank
                   : s == "dp_rank"    ? r.dpRank
                                       : l.kernel.streams.at(stream++));
  return device.launch(l.kernel.source, l.kernel.entry, l.kernel.grid, l.kernel.block,
                       l.kernel.sharedBytes, args);
}

// Every array the ranks' kernels may touch, copied to the device before the
// steps and back after them.
std::string mapRanks(Mirror &m, const std::vector<Rank *> &ranks) {
  for (Rank *r : ranks) {
    std::vector<std::pair<const void *, size_t>> arrays = {
        {r->wsData(), r->ws.size() * 8}, {&r->lossScale, 4}, {&r->seed, 8}, {&r->rngOffset, 8}};
    for (Buffer *b : r->in)
      arrays.push_back({b->data(), b->bytes()});
    for (Buffer *b : r->out)
      arrays.push_back({b->data(), b->bytes()});
    for (std::vector<float> *g : r->grads)
      arrays.push_back({g->data(), g->size() * 4});
    if (r->state)
      arrays.push_back({r->state->base(), r->state->bytes.size() * 8});
    for (const auto &[p, bytes] : arrays)
      if (std::string e = m.map(p, bytes); !e.empty())
        return e;
  }
  return "";
}

// `groups`: the collective groups the ranks form; a collective over any
// other group has one rank here and leaves the values as they are.
std::string runSteps(KernelDevice &device, const OpKernels &k, std::vector<Rank *> ranks,
                     std::set<int64_t> groups = {0, 1, 2, 3}) {
  for (Rank *r : ranks) {
    r->ws.assign(size_t(k.workspaceBytes / 8 + 2), ~0ull); // NaN bytes: unwritten reads show
  }
  Mirror m(device);
  if (std::string e = mapRanks(m, ranks); !e.empty())
    return e;
  if (std::string e = m.upload(); !e.empty())
    return e;
  for (const OpStep &s : k.steps) {
    if (s.kind == OpStep::Launch) {
      for (Rank *r : ranks)
        if (std::string e = launch(device, m, k.launches[s.launch], *r); !e.empty())
          return e;
      continue;
    }
    EXPECT_LE(s.offset + s.count * (s.type == OpStep::F64 ? 8 : 4), k.workspaceBytes);
    if (!groups.count(s.group))
      continue;
    for (Rank *r : ranks)
      if (std::string e = m.download(r->wsData()); !e.empty())
        return e;
    for (uint64_t i = 0; i < s.count; ++i) {
      auto at = [&](Rank *r) { return reinterpret_cast<uint8_t *>(r->wsData()) + s.offset; };
      if (s.type == OpStep::F64) {
        double v = 0;
        for (Rank *r : ranks)
          v += reinterpret_cast<double *>(at(r))[i];
        for (Rank *r : ranks)
          reinterpret_cast<double *>(at(r))[i] = v;
      } else {
        float v = s.kind == OpStep::AllReduceMax ? -INFINITY : 0.0f;
        for (Rank *r : ranks) {
          float x = reinterpret_cast<float *>(at(r))[i];
          v = s.kind == OpStep::AllReduceMax ? std::max(v, x) : v + x;
        }
        for (Rank *r : ranks)
          reinterpret_cast<float *>(at(r))[i] = v;
      }
    }
    for (Rank *r : ranks)
      if (std::string e = m.upload(r->wsData()); !e.empty())
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

// |got - want| within `rel` of |want| plus `abs`; for bf16/f16 results one
// unit in the last place of the type (both sides round once from nearly
// the same fp32 value, so they may land on neighbours).
::testing::AssertionResult close(const std::vector<float> &got, const std::vector<float> &want,
                                 DType d, double rel, double abs, double *worst = nullptr) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  const double typeRel = d == DType::BF16 ? 0x1p-7 : d == DType::F16 ? 0x1p-10 : 0.0;
  double w = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = want[i];
    if (std::isnan(r) && std::isnan(g))
      continue;
    const double err = std::fabs(g - r);
    const double tol = std::max(rel, typeRel) * std::fabs(r) + abs +
                       (d == DType::F16 ? 0x1p-24 : 0.0);
    w = std::max(w, err / (std::fabs(r) + 1e-30));
    if (!(err <= tol))
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << g << ", want " << r << " (error " << err
             << ", tolerance " << tol << ")";
  }
  if (worst)
    *worst = w;
  return ::testing::AssertionSuccess();
}

std::vector<float> rounded(std::vector<float> v, DType d) {
  for (float &x : v)
    x = roundTo(d, x);
  return v;
}

OpTensor tensor(DType d, std::vector<int64_t> shape) {
  OpTensor t;
  t.dtype = d;
  t.shape = std::move(shape);
  return t;
}

const DType kFloatTypes[] = {DType::F32, DType::BF16, DType::F16};

// ---------------------------------------------------------------------------
// One instruction of every opcode (for NVRTC and the feature checks).

std::vector<OpInstruction> everyOpcode(DType d) {
  std::vector<OpInstruction> all;
  auto add = [&](Opcode op, std::vector<OpTensor> in, std::vector<OpTensor> out,
                 std::vector<int64_t> ints = {}, std::vector<double> floats = {},
                 std::vector<OpParam> params = {}) {
    OpInstruction i;
    i.op = op;
    i.in = std::move(in);
    i.out = std::move(out);
    i.ints = std::move(ints);
    i.floats = std::move(floats);
    i.params = std::move(params);
    i.tensorParallel = 2;
    all.push_back(i);
  };
  OpParam w;
  w.shape = {256};
  w.dtype = d;
  OpParam table;
  table.shape = {512, 256};
  table.dtype = d;
  OpTensor x = tensor(d, {2, 8, 256}), h = tensor(d, {256}), ids = tensor(DType::I32, {2, 8});
  OpTensor scalar = tensor(DType::F32, {});
  add(Opcode::POSITION_IDS, {}, {ids});
  add(Opcode::EMBEDDING, {tensor(d, {512, 256}), ids}, {x}, {0});
  add(Opcode::EMBEDDING, {tensor(d, {512, 256}), ids}, {x}, {1});
  add(Opcode::LAYER_NORM, {x, h, h}, {x}, {}, {1e-5, 0.0});
  add(Opcode::RMS_NORM, {x, h}, {x}, {}, {1e-5, 0.0});
  add(Opcode::LAYER_NORM, {x, h, h}, {x}, {}, {1e-5, 1.0}); // --apply-layernorm-1p
  add(Opcode::RMS_NORM, {x, h}, {x}, {}, {1e-5, 1.0});
  add(Opcode::BIAS_ADD, {x, h}, {x});
  add(Opcode::ADD, {x, x}, {x});
  add(Opcode::GELU, {x}, {x}, {1});
  add(Opcode::GELU, {x}, {x}, {0});
  add(Opcode::SWIGLU, {x}, {tensor(d, {2, 8, 128})});
  add(Opcode::DROPOUT, {x}, {x}, {3, -1}, {0.1});
  add(Opcode::DROPOUT, {x}, {x}, {3, 2}, {0.1});
  add(Opcode::RESHAPE, {x}, {tensor(d, {16, 256})});
  add(Opcode::SPLIT_QKV, {tensor(d, {2, 8, 384})},
      {tensor(d, {2, 8, 4, 64}), tensor(d, {2, 8, 1, 64}), tensor(d, {2, 8, 1, 64})});
  add(Opcode::ROPE, {tensor(d, {2, 8, 4, 64})}, {tensor(d, {2, 8, 4, 64})}, {}, {10000.0, 0.0});
  add(Opcode::ROPE, {tensor(d, {2, 8, 4, 64})}, {tensor(d, {2, 8, 4, 64})}, {}, {10000.0, 8.0});
  add(Opcode::SPLIT_QKV_ROPE, {tensor(d, {2, 8, 384})},
      {tensor(d, {2, 8, 4, 64}), tensor(d, {2, 8, 1, 64}), tensor(d, {2, 8, 1, 64})}, {},
      {10000.0, 0.0});
  add(Opcode::SPLIT_QKV_ROPE, {tensor(d, {2, 8, 384})},
      {tensor(d, {2, 8, 4, 64}), tensor(d, {2, 8, 1, 64}), tensor(d, {2, 8, 1, 64})}, {},
      {500000.0, 8.0});
  add(Opcode::CROSS_ENTROPY, {tensor(d, {16, 512}), ids}, {scalar}, {0});
  add(Opcode::CROSS_ENTROPY, {tensor(d, {16, 512}), ids}, {scalar}, {1});
  add(Opcode::GRAD_SEED, {}, {scalar}, {}, {1.0});
  add(Opcode::EMBEDDING_GRAD, {x, ids}, {}, {0}, {}, {table});
  add(Opcode::EMBEDDING_GRAD, {x, ids}, {}, {1}, {}, {table});
  // 4000 tokens: the sort's merge passes.
  add(Opcode::EMBEDDING_GRAD, {tensor(d, {4, 1000, 256}), tensor(DType::I32, {4, 1000})}, {}, {0},
      {}, {table});
  add(Opcode::BIAS_GRAD, {x}, {}, {}, {}, {w});
  add(Opcode::LAYER_NORM_GRAD, {x, x, h}, {x}, {}, {1e-5, 0.0}, {w, w});
  add(Opcode::RMS_NORM_GRAD, {x, x, h}, {x}, {}, {1e-5, 0.0}, {w});
  add(Opcode::LAYER_NORM_GRAD, {x, x, h}, {x}, {}, {1e-5, 1.0}, {w, w});
  add(Opcode::RMS_NORM_GRAD, {x, x, h}, {x}, {}, {1e-5, 1.0}, {w});
  add(Opcode::GELU_GRAD, {x, x}, {x}, {1});
  add(Opcode::SWIGLU_GRAD, {tensor(d, {2, 8, 128}), x}, {x});
  add(Opcode::SPLIT_QKV_GRAD,
      {tensor(d, {2, 8, 4, 64}), tensor(d, {2, 8, 1, 64}), tensor(d, {2, 8, 1, 64})},
      {tensor(d, {2, 8, 384})});
  add(Opcode::ROPE_GRAD, {tensor(d, {2, 8, 4, 64})}, {tensor(d, {2, 8, 4, 64})}, {}, {10000.0, 0.0});
  add(Opcode::ROPE_GRAD, {tensor(d, {2, 8, 4, 64})}, {tensor(d, {2, 8, 4, 64})}, {}, {10000.0, 8.0});
  add(Opcode::SPLIT_QKV_ROPE_GRAD,
      {tensor(d, {2, 8, 4, 64}), tensor(d, {2, 8, 1, 64}), tensor(d, {2, 8, 1, 64})},
      {tensor(d, {2, 8, 384})}, {}, {10000.0, 0.0});
  add(Opcode::SPLIT_QKV_ROPE_GRAD,
      {tensor(d, {2, 8, 4, 64}), tensor(d, {2, 8, 1, 64}), tensor(d, {2, 8, 1, 64})},
      {tensor(d, {2, 8, 384})}, {}, {500000.0, 8.0});
  add(Opcode::CROSS_ENTROPY_GRAD, {tensor(d, {16, 512}), ids, scalar}, {tensor(d, {16, 512})}, {0});
  add(Opcode::CROSS_ENTROPY_GRAD, {tensor(d, {16, 512}), ids, scalar}, {tensor(d, {16, 512})}, {1});
  OpParam p;
  p.shape = {1000};
  p.dtype = d;
  p.weightOffset = 0;
  p.gradOffset = 4096;
  p.masterOffset = d == DType::F32 ? -1 : 8192;
  p.expAvgOffset = 12288;
  p.expAvgSqOffset = 16384;
  OpTensor step = tensor(DType::I64, {});
  add(Opcode::GRAD_NORM, {}, {scalar}, {}, {}, {p, p});
  add(Opcode::LR_SCHEDULE, {step}, {scalar}, {2, 10, 100, 1, 0, 0}, {1e-3, 1e-4});
  add(Opcode::LR_SCHEDULE, {step}, {scalar}, {3, 10, 100, 512, 0, 0}, {1e-3, 1e-4});
  for (int64_t anneal = 0; anneal < 4; ++anneal) // WSD's four anneals
    add(Opcode::LR_SCHEDULE, {step}, {scalar}, {4, 10, 100, 1, anneal, 20}, {1e-3, 1e-4});
  add(Opcode::CLIP_COEFF, {scalar, scalar}, {scalar}, {}, {1.0});
  add(Opcode::ADAMW, {scalar, scalar, step}, {}, {}, {0.9, 0.95, 1e-8, 0.1}, {p});
  OpInstruction sharded;
  sharded.op = Opcode::SHARDED_ADAMW;
  sharded.in = {scalar, scalar, step, scalar};
  sharded.params = {p};
  sharded.ints = {0};
  sharded.floats = {0.9, 0.95, 1e-8, 0.1};
  sharded.rankSegments = {{{0, 3, 0, 500}}};
  sharded.shardMasterOffset = d == DType::F32 ? -1 : 20480;
  sharded.shardExpAvgOffset = 24576;
  sharded.shardExpAvgSqOffset = 28672;
  all.push_back(sharded);
  sharded.op = Opcode::SHARDED_GRAD_NORM;
  sharded.in = {};
  sharded.out = {scalar};
  sharded.floats = {};
  all.push_back(sharded);
  // Routed experts: the norms' second part, and an expert bucket's
  // tables indexed by the expt_dp rank.
  OpParam e = p;
  e.expert = true;
  add(Opcode::GRAD_NORM, {}, {scalar}, {}, {}, {p, e});
  OpInstruction expert = sharded;
  expert.params = {p, e};
  expert.tensorParallel = 2;
  expert.expertParallel = 2;
  expert.expertRankSegments = {{{1, 0, 0, 250}}, {{1, 250, 250, 250}}};
  all.push_back(expert);
  expert.op = Opcode::SHARDED_ADAMW;
  expert.in = {scalar, scalar, step, scalar};
  expert.out = {};
  expert.floats = {0.9, 0.95, 1e-8, 0.1};
  expert.expertRanks = true;
  expert.rankSegments = expert.expertRankSegments;
  expert.expertRankSegments.clear();
  all.push_back(expert);
  add(Opcode::SGD, {scalar, scalar}, {}, {}, {0.9, 0.1}, {p});
  sharded.op = Opcode::SHARDED_SGD;
  sharded.in = {scalar, scalar, scalar};
  sharded.out = {};
  sharded.floats = {0.9, 0.1};
  sharded.shardExpAvgSqOffset = -1;
  all.push_back(sharded);
  // Mixture of experts: 24 tokens, 4 experts, top-2, hidden 256, expert
  // FFN 96 (swiglu's 192); the router with every score function, capacity
  // policies and losses, the fp64 router; the grouped GEMM in every form.
  const int64_t T = 24, E = 4, N = 48, H = 256, F = 96;
  OpTensor logits = tensor(d, {T, E}), probs = tensor(DType::F32, {T, E});
  OpTensor map = tensor(DType::I32, {T, E}), tpe = tensor(DType::I32, {E});
  OpTensor rows = tensor(DType::I32, {N});
  const std::vector<OpTensor> routerOut = {probs, map, scalar, scalar};
  //         topk sigmoid pre balance capacity position pad seq dtype count_group
  for (const std::vector<int64_t> &ints :
       {std::vector<int64_t>{2, 0, 0, 1, 0, 0, 0, 8, 0, -1}, {2, 0, 1, 2, 10, 0, 0, 8, 1, -1},
        {1, 1, 0, 1, 10, 1, 1, 8, 2, -1}, {3, 1, 0, 0, 0, 0, 0, 8, 0, -1}}) {
    // fp64 (router_dtype 2) routes f64 logits.
    const OpTensor l = ints[8] == 2 ? tensor(DType::F64, {T, E}) : logits;
    add(Opcode::MOE_ROUTER, {l}, routerOut, ints, {1.5, 0.01, 1e-3});
    add(Opcode::MOE_ROUTER_GRAD, {probs, l, probs, map, scalar}, {l}, ints, {0.0, 0.01, 1e-3});
  }
  add(Opcode::MOE_PERMUTE, {tensor(d, {T, H}), map},
      {tensor(d, {N, H}), rows, tpe}, {0, 0});
  add(Opcode::MOE_PERMUTE, {tensor(d, {T, H}), map},
      {tensor(d, {40, H}), tensor(DType::I32, {40}), tpe}, {10, 1});
  add(Opcode::MOE_PERMUTE_GRAD, {tensor(d, {N, H}), rows}, {tensor(d, {T, H})});
  add(Opcode::MOE_UNPERMUTE, {tensor(d, {N, H}), probs, rows, tpe}, {tensor(d, {T, H})});
  add(Opcode::MOE_UNPERMUTE_GRAD, {tensor(d, {T, H}), tensor(d, {N, H}), probs, rows, tpe},
      {tensor(d, {N, H}), probs});
  add(Opcode::GROUPED_MATMUL, {tensor(d, {N, H}), tensor(d, {E, 2 * F, H}), tpe},
      {tensor(d, {N, 2 * F})});
  add(Opcode::GROUPED_MATMUL_INPUT_GRAD, {tensor(d, {N, H}), tensor(d, {E, H, F}), tpe},
      {tensor(d, {N, F})});
  OpParam experts;
  experts.shape = {E, H, F};
  experts.dtype = d;
  add(Opcode::GROUPED_MATMUL_WEIGHT_GRAD, {tensor(d, {N, H}), tensor(d, {N, F}), tpe}, {}, {}, {},
      {experts});
  experts.gradDtype = DType::BF16; // --grad-reduce-in-bf16
  add(Opcode::GROUPED_MATMUL_WEIGHT_GRAD, {tensor(d, {N, H}), tensor(d, {N, F}), tpe}, {}, {}, {},
      {experts});
  return all;
}

TEST(CudaOpKernels, EveryOpcodeCompilesWithNvrtc) {
  std::string error;
  const mt::cu::Nvrtc *nvrtc = mt::cu::load_nvrtc(&error);
  if (!nvrtc)
    GTEST_SKIP() << error;
  std::set<std::string> seen;
  for (DType d : kFloatTypes)
    for (const OpInstruction &ins : everyOpcode(d)) {
      OpKernels k = generate(ins);
      for (const mt::OpLaunch &l : k.launches) {
        if (!seen.insert(l.kernel.source).second)
          continue;
        for (int arch : {80, 90}) {
          std::string cubin, e;
          mt::rt::nvrtc_compile(*nvrtc, l.kernel.entry, l.kernel.source, arch,
                                mt::rt::nvrtc_options(arch), &cubin, &e);
          EXPECT_EQ(e, "") << mt::plan::EnumNameOpcode(ins.op) << " sm_" << arch << "\n"
                           << l.kernel.source;
          EXPECT_FALSE(cubin.empty());
        }
      }
    }
  // A gradient bucket's scale over a group of one rank (generateGradScale):
  // f32 and bf16 gradients, a count with a scalar tail.
  for (DType g : {DType::F32, DType::BF16}) {
    std::optional<OpKernels> k = mt::generateGradScale({4096, 1001}, g, 0.5, &error);
    ASSERT_TRUE(k) << error;
    for (const mt::OpLaunch &l : k->launches)
      for (int arch : {80, 90}) {
        std::string cubin, e;
        mt::rt::nvrtc_compile(*nvrtc, l.kernel.entry, l.kernel.source, arch,
                              mt::rt::nvrtc_options(arch), &cubin, &e);
        EXPECT_EQ(e, "") << "GRAD_SCALE sm_" << arch << "\n" << l.kernel.source;
        EXPECT_FALSE(cubin.empty());
      }
  }
  EXPECT_GT(seen.size(), 60u);
}

// The router's GEMMs with moe_router_dtype (GpuSteps' widened GEMMs): the
// kernels that widen the operands to f32 or f64 and round the results
// back, for each model type, compile with NVRTC; fp64's GEMMs are f64.
TEST(CudaOpKernels, WidenedRouterGemmKernelsCompileWithNvrtc) {
  std::string error;
  const mt::cu::Nvrtc *nvrtc = mt::cu::load_nvrtc(&error);
  if (!nvrtc)
    GTEST_SKIP() << error;
  int compiled = 0;
  for (DType d : kFloatTypes)
    for (DType wide : {DType::F32, DType::F64}) {
      if (wide == DType::F32 && d == DType::F32)
        continue; // f32 operands need no widening
      // values: x [64, 32], w [4, 32], logits [64, 4] (wide), dx [64, 32]
      const std::vector<mt::GpuValueInfo> values = {
          {{64, 32}, d, 0}, {{4, 32}, d, 1 << 16}, {{64, 4}, wide, 2 << 16}, {{64, 32}, d, 3 << 16}};
      mt::GpuParamInfo w;
      w.shape = {4, 32};
      w.dtype = d;
      std::vector<mt::GpuInstruction> ins(3);
      ins[0].op = Opcode::MATMUL_INPUT_GRAD;
      ins[0].in = {2, 1};
      ins[0].out = {3};
      ins[1].op = Opcode::MATMUL_WEIGHT_GRAD;
      ins[1].in = {2, 0};
      ins[1].params = {0};
      ins[2].op = Opcode::MATMUL;
      ins[2].in = {0, 1};
      ins[2].out = {2};
      for (const mt::GpuInstruction &in : ins) {
        mt::GpuLowering l = mt::lowerInstruction(in, values, {w}, 1);
        ASSERT_EQ(l.missing, "") << mt::plan::EnumNameOpcode(in.op);
        bool wideGemm = false;
        for (const mt::GpuStepSpec &st : l.steps)
          if (st.kind == mt::plan::GpuStepKind::GEMM)
            wideGemm = wideGemm || st.gemm.aType == wide;
        EXPECT_EQ(wideGemm, !(in.op == Opcode::MATMUL && wide == DType::F32))
            << mt::plan::EnumNameOpcode(in.op);
        for (const mt::CudaKernel &k : l.kernels)
          for (int arch : {80, 90}) {
            std::string cubin, e;
            mt::rt::nvrtc_compile(*nvrtc, k.entry, k.source, arch, mt::rt::nvrtc_options(arch),
                                  &cubin, &e);
            EXPECT_EQ(e, "") << mt::plan::EnumNameOpcode(in.op) << " sm_" << arch << "\n"
                             << k.source;
            ++compiled;
          }
      }
    }
  EXPECT_GT(compiled, 20);
}

// The launch limits (runtime/exec/cuda/launch_limits.h) refuse a launch
// that a GPU mt runs on would refuse, naming the kernel and the limit.
TEST(CudaOpKernels, LaunchLimitsNameTheKernel) {
  const uint32_t grid[3] = {100, 1, 1}, block[3] = {256, 1, 1};
  EXPECT_EQ(mt::cu::check_launch("k", grid, block, 99 * 1024), "");
  EXPECT_EQ(mt::cu::check_launch("mt_ce_grad_1", grid, block, 99 * 1024 + 1),
            "kernel 'mt_ce_grad_1' cannot launch: 101377 bytes of dynamic shared memory, over "
            "the 101376 a block may opt in to on every GPU mt runs on (sm_86, sm_89 and sm_120 "
            "allow no more)");
  EXPECT_EQ(mt::cu::check_launch("k", grid, block, 200 * 1024, 227 * 1024), "");
  const uint32_t wide[3] = {2048, 1, 1}, square[3] = {64, 32, 1}, deep[3] = {1, 1, 65};
  EXPECT_EQ(mt::cu::check_launch("k", grid, wide, 0),
            "kernel 'k' cannot launch: block dimension x is 2048, over the limit of 1024");
  EXPECT_EQ(mt::cu::check_launch("k", grid, square, 0),
            "kernel 'k' cannot launch: 2048 threads a block, over the limit of 1024");
  EXPECT_TRUE(contains(mt::cu::check_launch("k", grid, deep, 0), "block dimension z is 65"));
  const uint32_t tall[3] = {1, 65536, 1}, none[3] = {0, 1, 1};
  EXPECT_EQ(mt::cu::check_launch("k", tall, block, 0),
            "kernel 'k' cannot launch: grid dimension y is 65536, over the limit of 65535");
  EXPECT_EQ(mt::cu::check_launch("k", none, block, 0),
            "kernel 'k' cannot launch: grid dimension x is 0");
  // The emulation refuses what a GPU would, before running anything.
  const uint32_t one[3] = {1, 1, 1};
  EXPECT_EQ(mt::test::emulatedKernelDevice().launch(
                "extern \"C\" __global__ void mt_big() {}", "mt_big", one, one, 100 * 1024, {}),
            "kernel 'mt_big' cannot launch: 102400 bytes of dynamic shared memory, over the "
            "101376 a block may opt in to on every GPU mt runs on (sm_86, sm_89 and sm_120 "
            "allow no more)");
}

// Every generated op kernel launches on every GPU mt runs on, at the test
// shapes and at real ones: the cross-entropy over every vocabulary from
// the tests' to Llama-3's 128,256 (and 8- and 64-way vocab-parallel shards
// of it) and beyond, rows up to a micro-batch of 64 sequences of 8192,
// norms and embeddings at a hidden size of 16,384. The gradient's row
// cache is the one kernel over 48 KiB of shared memory (the launchers opt
// in); it stays within the portable limit whatever the vocabulary.
TEST(CudaOpKernels, EveryLaunchIsWithinTheLimitsOfEveryGpu) {
  auto check = [](const OpInstruction &ins, const std::string &what) {
    std::string error;
    std::optional<OpKernels> k = mt::generateOpKernels(ins, &error);
    ASSERT_TRUE(k) << what << ": " << error;
    for (const mt::OpLaunch &l : k->launches)
      EXPECT_EQ(mt::cu::check_launch(l.kernel.entry, l.kernel.grid, l.kernel.block,
                                     l.kernel.sharedBytes),
                "")
          << what;
  };
  size_t count = 0;
  for (DType d : kFloatTypes)
    for (const OpInstruction &ins : everyOpcode(d)) {
      check(ins, std::string(mt::plan::EnumNameOpcode(ins.op)) + " " + mt::plan::EnumNameDType(d));
      ++count;
    }
  EXPECT_GT(count, 150u);
  uint32_t widest = 0;
  for (DType d : kFloatTypes)
    for (int64_t rows : {int64_t(3), int64_t(4096), int64_t(64) * 8192})
      for (int64_t vocab : {int64_t(1), int64_t(1000), int64_t(30001), int64_t(50257),
                            int64_t(50304), int64_t(50560), int64_t(50561), int64_t(128256),
                            int64_t(128256 / 8), int64_t(128256 / 64), int64_t(262144),
                            int64_t(1) << 24}) {
        const std::string what = std::string(mt::plan::EnumNameDType(d)) + " rows " +
                                 std::to_string(rows) + " vocab " + std::to_string(vocab);
        OpTensor logits = tensor(d, {rows, vocab}), labels = tensor(DType::I32, {rows});
        OpTensor scalar = tensor(DType::F32, {});
        for (int64_t vp : {0, 1}) {
          OpInstruction ce;
          ce.op = Opcode::CROSS_ENTROPY;
          ce.in = {logits, labels};
          ce.out = {scalar};
          ce.ints = {vp};
          ce.tensorParallel = vp ? 8 : 1;
          check(ce, "CROSS_ENTROPY " + what);
          ce.op = Opcode::CROSS_ENTROPY_GRAD;
          ce.in = {logits, labels, scalar};
          ce.out = {logits};
          check(ce, "CROSS_ENTROPY_GRAD " + what);
          const OpKernels k = generate(ce);
          for (const mt::OpLaunch &l : k.launches)
            widest = std::max(widest, l.kernel.sharedBytes);
        }
      }
  EXPECT_GT(widest, mt::cu::kDefaultMaxDynamicSharedBytes); // the opt-in is exercised
  EXPECT_LE(widest, mt::cu::kPortableMaxDynamicSharedBytes);
  // A bf16 row of GPT-2's padded vocabulary is cached whole: one read.
  {
    OpInstruction ce;
    ce.op = Opcode::CROSS_ENTROPY_GRAD;
    ce.in = {tensor(DType::BF16, {8, 50304}), tensor(DType::I32, {8}), tensor(DType::F32, {})};
    ce.out = {ce.in[0]};
    ce.ints = {0};
    const OpKernels k = generate(ce);
    ASSERT_EQ(k.launches.size(), 1u);
    EXPECT_EQ(k.launches[0].kernel.sharedBytes, 256u + 50304 * 2);
  }
  // Rows of 16,384 for the norms and their gradients, the embeddings.
  for (DType d : kFloatTypes) {
    OpTensor x = tensor(d, {4, 2048, 16384}), h = tensor(d, {16384});
    OpTensor ids = tensor(DType::I32, {4, 2048});
    OpParam w;
    w.shape = {16384};
    w.dtype = d;
    OpParam table;
    table.shape = {128256, 16384};
    table.dtype = d;
    auto op = [&](Opcode o, std::vector<OpTensor> in, std::vector<OpTensor> out,
                  std::vector<int64_t> ints, std::vector<double> floats,
                  std::vector<OpParam> params) {
      OpInstruction i;
      i.op = o;
      i.in = std::move(in);
      i.out = std::move(out);
      i.ints = std::move(ints);
      i.floats = std::move(floats);
      i.params = std::move(params);
      check(i, std::string(mt::plan::EnumNameOpcode(o)) + " hidden 16384 " +
                   mt::plan::EnumNameDType(d));
    };
    op(Opcode::LAYER_NORM, {x, h, h}, {x}, {}, {1e-5, 0.0}, {});
    op(Opcode::RMS_NORM, {x, h}, {x}, {}, {1e-5, 0.0}, {});
    op(Opcode::LAYER_NORM_GRAD, {x, x, h}, {x}, {}, {1e-5, 0.0}, {w, w});
    op(Opcode::RMS_NORM_GRAD, {x, x, h}, {x}, {}, {1e-5, 0.0}, {w});
    op(Opcode::BIAS_GRAD, {x}, {}, {}, {}, {w});
    op(Opcode::EMBEDDING, {tensor(d, {128256, 16384}), ids}, {x}, {0}, {}, {});
    op(Opcode::EMBEDDING_GRAD, {x, ids}, {}, {0}, {}, {table});
  }
}

TEST(CudaOpKernels, FeaturesAndSequences) {
  std::map<std::string, std::vector<OpKernels>> byOp;
  for (const OpInstruction &ins : everyOpcode(DType::BF16))
    byOp[mt::plan::EnumNameOpcode(ins.op)].push_back(generate(ins));
  auto kinds = [](const OpKernels &k) {
    std::string s;
    for (const OpStep &st : k.steps)
      s += st.kind == OpStep::Launch ? "L" : st.kind == OpStep::AllReduceMax ? "M" : "S";
    return s;
  };
  // Cross-entropy: two launches alone; vocab parallel: max, sum between phases.
  EXPECT_EQ(kinds(byOp["CROSS_ENTROPY"][0]), "LL");
  EXPECT_EQ(kinds(byOp["CROSS_ENTROPY"][1]), "LMLSL");
  EXPECT_EQ(kinds(byOp["CROSS_ENTROPY_GRAD"][0]), "L");
  EXPECT_EQ(kinds(byOp["CROSS_ENTROPY_GRAD"][1]), "LMLSL");
  EXPECT_EQ(byOp["CROSS_ENTROPY"][1].steps[3].count, 32u); // sum and target of 16 rows
  EXPECT_EQ(byOp["CROSS_ENTROPY_GRAD"][1].steps[3].count, 16u);
  EXPECT_EQ(byOp["CROSS_ENTROPY_GRAD"][1].launches[2].kernel.scalarArgs,
            (std::vector<std::string>{"tp_rank"}));
  // bf16 rows of 512: 128-bit accesses of 8 lanes, online softmax statistics.
  const std::string &ceGrad = byOp["CROSS_ENTROPY_GRAD"][0].launches[0].kernel.source;
  EXPECT_TRUE(contains(ceGrad, "mt_load<8>(x, j, a)")) << ceGrad;
  EXPECT_TRUE(contains(ceGrad, "mt_block_lse(m, s, mt_shared)"));
  // One read of the logits: the row is kept in shared memory for the write
  // pass (512 bf16 after the reductions' 256 bytes); vocabulary-parallel,
  // one pass gives the local max and sum (ce_stats), rescaled after the max.
  EXPECT_EQ(byOp["CROSS_ENTROPY_GRAD"][0].launches[0].kernel.sharedBytes, 256u + 512 * 2);
  EXPECT_TRUE(contains(ceGrad, "mt_load<8>(row_cache, j, a)")) << ceGrad;
  for (const OpKernels *k : {&byOp["CROSS_ENTROPY"][1], &byOp["CROSS_ENTROPY_GRAD"][1]}) {
    EXPECT_TRUE(contains(k->launches[0].kernel.entry, "mt_ce_stats_")) << k->launches[0].kernel.entry;
    EXPECT_TRUE(contains(k->launches[1].kernel.entry, "mt_ce_rescale_")) << k->launches[1].kernel.entry;
  }
  // Norms: the mp group after the data-parallel one for the sharded norm.
  EXPECT_EQ(kinds(byOp["GRAD_NORM"][0]), "LLSL");
  EXPECT_EQ(byOp["GRAD_NORM"][0].steps[2].group, 3);
  EXPECT_EQ(byOp["GRAD_NORM"][0].steps[2].type, OpStep::F64);
  EXPECT_EQ(kinds(byOp["SHARDED_GRAD_NORM"][0]), "LLSSL");
  // With routed experts: the dense part over mp, the experts' over
  // tp_ep_pp (sharded: dp, mp; expt_dp, tp_ep_pp), then one root.
  ASSERT_EQ(byOp["GRAD_NORM"].size(), 2u);
  EXPECT_EQ(kinds(byOp["GRAD_NORM"][1]), "LLSLLSL");
  EXPECT_EQ(byOp["GRAD_NORM"][1].steps[2].group, 3);
  EXPECT_EQ(byOp["GRAD_NORM"][1].steps[5].group, 8);
  ASSERT_EQ(byOp["SHARDED_GRAD_NORM"].size(), 2u);
  EXPECT_EQ(kinds(byOp["SHARDED_GRAD_NORM"][1]), "LLSSLLSSL");
  EXPECT_EQ(byOp["SHARDED_GRAD_NORM"][1].steps[6].group, 6);
  EXPECT_EQ(byOp["SHARDED_GRAD_NORM"][1].steps[7].group, 8);
  // The expert bucket's AdamW reads its rank from tp_rank and dp_rank.
  ASSERT_EQ(byOp["SHARDED_ADAMW"].size(), 2u);
  EXPECT_EQ(byOp["SHARDED_ADAMW"][1].launches[0].kernel.scalarArgs,
            (std::vector<std::string>{"tp_rank", "dp_rank"}));
  EXPECT_TRUE(contains(byOp["SHARDED_ADAMW"][1].launches[0].kernel.source,
                       "((mt_tp_r + 2ull * mt_dp_r) / 2ull)"));
  // AdamW: one launch over a table; the state buffer is its last pointer.
  const mt::OpLaunch &adam = byOp["ADAMW"][0].launches[0];
  EXPECT_EQ(adam.args.back().kind, OpArg::State);
  EXPECT_TRUE(contains(adam.kernel.source, "pow(0.90000000000000002, (double)step)")) << adam.kernel.source;
  // The sharded segment starts at element 3: not 16-byte aligned, scalar lanes.
  EXPECT_TRUE(contains(byOp["SHARDED_ADAMW"][0].launches[0].kernel.source, "500ull, 0ull, 0.10000000000000001, 1, 0}"))
      << byOp["SHARDED_ADAMW"][0].launches[0].kernel.source;
  // Dropout of a shard takes tp_rank; the plain one does not.
  EXPECT_EQ(byOp["DROPOUT"][0].launches[0].kernel.scalarArgs,
            (std::vector<std::string>{"seed", "rng_offset", "stream"}));
  EXPECT_EQ(byOp["DROPOUT"][1].launches[0].kernel.scalarArgs,
            (std::vector<std::string>{"seed", "rng_offset", "tp_rank", "stream"}));
  EXPECT_EQ(byOp["DROPOUT"][0].launches[0].kernel.streams, (std::vector<uint64_t>{3}));
  // 16-byte lanes: 4096 bf16 elements, 8 a thread, 256 threads a block.
  for (const OpKernels &k : byOp["DROPOUT"]) {
    EXPECT_EQ(k.launches[0].kernel.grid[0], 2u);
    EXPECT_TRUE(contains(k.launches[0].kernel.source, "mt_body<8>(")) << k.launches[0].kernel.source;
  }
  // Norm gradients: partials in the workspace, then column sums into both grads.
  const OpKernels &lng = byOp["LAYER_NORM_GRAD"][0];
  ASSERT_EQ(lng.launches.size(), 2u);
  EXPECT_EQ(lng.launches[1].args.size(), 3u);
  EXPECT_EQ(lng.launches[1].args[2].kind, OpArg::ParamGrad);
  EXPECT_EQ(lng.workspaceBytes, 2u * 16 * 256 * 4); // sized for a partial row per row either way
  // Rows of 256: a warp a row, eight rows a block, so 2 blocks and 2 partial rows.
  EXPECT_EQ(lng.launches[0].kernel.grid[0], 2u);
  EXPECT_EQ(lng.launches[0].kernel.block[0], 256u);
  // The second stage: 32 columns x 1 slice of the 2 partial rows a CTA,
  // both gradients in one launch (grid.y).
  EXPECT_EQ(lng.launches[1].kernel.block[0], 32u);
  EXPECT_EQ(lng.launches[1].kernel.grid[0], 8u);
  EXPECT_EQ(lng.launches[1].kernel.grid[1], 2u);
  // --apply-layernorm-1p adds 1 to the loaded weights; RoPE scaling scales
  // the frequencies by Llama 3.1's rule; neither changes the plain sources.
  EXPECT_FALSE(contains(byOp["LAYER_NORM"][0].launches[0].kernel.source, "+= 1.0f"));
  EXPECT_TRUE(contains(byOp["LAYER_NORM"][1].launches[0].kernel.source, "wv[l] += 1.0f;"))
      << byOp["LAYER_NORM"][1].launches[0].kernel.source;
  EXPECT_TRUE(contains(byOp["RMS_NORM_GRAD"][1].launches[0].kernel.source, "wv[k][l] += 1.0f;"));
  EXPECT_FALSE(contains(byOp["ROPE"][0].launches[0].kernel.source, "8192.0"));
  EXPECT_TRUE(contains(byOp["ROPE"][1].launches[0].kernel.source, "if (wl > 8192.0) inv = inv / 8.0;"))
      << byOp["ROPE"][1].launches[0].kernel.source;
  // A RESHAPE onto its input's bytes launches nothing.
  OpInstruction view = everyOpcode(DType::F32)[14];
  ASSERT_EQ(view.op, Opcode::RESHAPE);
  view.outAliasesIn0 = true;
  EXPECT_TRUE(generate(view).steps.empty());
  // Operands that do not match the signature are refused.
  OpInstruction bad = everyOpcode(DType::F32)[3];
  bad.floats.clear();
  std::string error;
  EXPECT_FALSE(mt::generateOpKernels(bad, &error));
  EXPECT_TRUE(contains(error, "signature")) << error;
}


// ---------------------------------------------------------------------------
// Numerics against runtime/exec/cpu_kernels, each test on the host emulation
// (CudaOpKernelsEmulation) and on a GPU (CudaOpKernelsOnGpu).

// Cross-entropy and its gradient (in place over the logits), rows whose
// length takes 8, 4 or 1 lanes; rows longer than the gradient's shared
// memory holds (f32 30001: the last 4721 logits are read twice; bf16 60000:
// the last 9440), whose launches opt in to more than 48 KiB of it.
MT_KERNEL_TEST(CudaOpKernels, CrossEntropy) {
  for (DType d : kFloatTypes)
    for (int64_t vocab : {int64_t(1000), int64_t(1001), int64_t(30001), int64_t(60000)}) {
      if ((vocab == 30001 && d != DType::F32) || (vocab == 60000 && d != DType::BF16))
        continue;
      SCOPED_TRACE(std::string(mt::plan::EnumNameDType(d)) + " vocab " + std::to_string(vocab));
      const int64_t n = vocab > 2000 ? 3 : 6;
      std::vector<float> logits = randomValues(size_t(n * vocab), 1, 3.0f, d);
      std::vector<int64_t> labels = n == 3 ? std::vector<int64_t>{0, vocab - 1, 29000}
                                           : std::vector<int64_t>{0, 5, 999, 17, 500, 3};
      std::vector<int32_t> labels32(labels.begin(), labels.end());
      Buffer x(d, {n, vocab}), lab(DType::I32, {n}), loss(DType::F32, {}), dloss(DType::F32, {});
      x.set(logits);
      lab.setInts(labels);
      dloss.set({1.5f});
      OpInstruction ins;
      ins.op = Opcode::CROSS_ENTROPY;
      ins.in = {x.t, lab.t};
      ins.out = {loss.t};
      ins.ints = {0};
      Rank r;
      r.in = {&x, &lab};
      r.out = {&loss};
      ASSERT_EQ(runSteps(device, generate(ins), {&r}), "");
      double want = 0;
      ASSERT_TRUE(mt::cpu::cross_entropy_fwd(logits.data(), labels32.data(), nullptr, n, vocab, &want));
      double worst = 0;
      EXPECT_TRUE(close(loss.get(), {float(want)}, DType::F32, 2e-6, 0, &worst));
      // The gradient over the logits' own bytes.
      ins.op = Opcode::CROSS_ENTROPY_GRAD;
      ins.in = {x.t, lab.t, dloss.t};
      ins.out = {x.t};
      r.in = {&x, &lab, &dloss};
      r.out = {&x};
      ASSERT_EQ(runSteps(device, generate(ins), {&r}), "");
      std::vector<float> grad(logits.size());
      mt::cpu::cross_entropy_bwd(logits.data(), labels32.data(), nullptr, n, vocab, 1.5, grad.data());
      EXPECT_TRUE(close(x.get(), rounded(grad, d), d, 1e-6, 1e-12, &worst));
    }
}

// Vocab parallel over two ranks, the collectives done between the phases
// as the steps say: the same loss and gradients as the whole vocabulary.
MT_KERNEL_TEST(CudaOpKernels, CrossEntropyVocabParallel) {
  for (DType d : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(mt::plan::EnumNameDType(d));
    const int64_t n = 5, vocab = 512, part = vocab / 2;
    std::vector<float> logits = randomValues(size_t(n * vocab), 2, 2.0f, d);
    std::vector<int64_t> labels = {0, 300, 255, 256, 511};
    std::vector<int32_t> labels32(labels.begin(), labels.end());
    Buffer x[2], lab(DType::I32, {n}), dloss(DType::F32, {}), loss[2];
    dloss.set({0.75f});
    lab.setInts(labels);
    Rank r[2];
    for (int k = 0; k < 2; ++k) {
      x[k] = Buffer(d, {n, part});
      std::vector<float> mine;
      for (int64_t i = 0; i < n; ++i)
        mine.insert(mine.end(), logits.begin() + i * vocab + k * part,
                    logits.begin() + i * vocab + (k + 1) * part);
      x[k].set(mine);
      loss[k] = Buffer(DType::F32, {});
      r[k].tpRank = uint64_t(k);
    }
    OpInstruction ins;
    ins.op = Opcode::CROSS_ENTROPY;
    ins.in = {x[0].t, lab.t};
    ins.out = {loss[0].t};
    ins.ints = {1};
    ins.tensorParallel = 2;
    for (int k = 0; k < 2; ++k) {
      r[k].in = {&x[k], &lab};
      r[k].out = {&loss[k]};
    }
    ASSERT_EQ(runSteps(device, generate(ins), {&r[0], &r[1]}), "");
    double want = 0;
    ASSERT_TRUE(mt::cpu::cross_entropy_fwd(logits.data(), labels32.data(), nullptr, n, vocab, &want));
    for (int k = 0; k < 2; ++k)
      EXPECT_TRUE(close(loss[k].get(), {float(want)}, DType::F32, 2e-6, 0));
    ins.op = Opcode::CROSS_ENTROPY_GRAD;
    ins.in = {x[0].t, lab.t, dloss.t};
    ins.out = {x[0].t};
    for (int k = 0; k < 2; ++k) {
      r[k].in = {&x[k], &lab, &dloss};
      r[k].out = {&x[k]};
    }
    ASSERT_EQ(runSteps(device, generate(ins), {&r[0], &r[1]}), "");
    std::vector<float> grad(logits.size());
    mt::cpu::cross_entropy_bwd(logits.data(), labels32.data(), nullptr, n, vocab, 0.75, grad.data());
    for (int k = 0; k < 2; ++k) {
      std::vector<float> mine;
      for (int64_t i = 0; i < n; ++i)
        mine.insert(mine.end(), grad.begin() + i * vocab + k * part,
                    grad.begin() + i * vocab + (k + 1) * part);
      EXPECT_TRUE(close(x[k].get(), rounded(mine, d), d, 1e-5, 1e-12));
    }
  }
}

OpParam stateParam(DType d, int64_t count, int64_t at) {
  OpParam p;
  p.shape = {count};
  p.dtype = d;
  p.weightOffset = at;
  p.gradOffset = at + 8192;
  p.masterOffset = d == DType::F32 ? -1 : at + 16384;
  p.expAvgOffset = at + 24576;
  p.expAvgSqOffset = at + 32768;
  return p;
}

MT_KERNEL_TEST(CudaOpKernels, AdamWGroupAndShard) {
  for (DType d : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(mt::plan::EnumNameDType(d));
    const std::vector<OpParam> params = {stateParam(d, 1001, 0), stateParam(DType::F32, 999, 4096)};
    OptimizerState s;
    std::vector<std::vector<float>> master, grad, m, v;
    for (size_t k = 0; k < params.size(); ++k) {
      const OpParam &p = params[k];
      const size_t c = size_t(p.shape[0]);
      master.push_back(randomValues(c, 10 + uint32_t(k), 0.1f, p.dtype));
      grad.push_back(randomValues(c, 20 + uint32_t(k), 0.01f));
      m.push_back(randomValues(c, 30 + uint32_t(k), 0.001f));
      v.push_back(randomValues(c, 40 + uint32_t(k), 0.001f));
      for (float &x : v.back())
        x = x * x;
      for (size_t i = 0; i < c; ++i) {
        if (p.dtype == DType::F32)
          s.f(p.weightOffset)[i] = master[k][i];
        else {
          s.h(p.weightOffset)[i] = halfBits(p.dtype, master[k][i]);
          s.f(p.masterOffset)[i] = master[k][i];
        }
        s.f(p.gradOffset)[i] = grad[k][i];
        s.f(p.expAvgOffset)[i] = m[k][i];
        s.f(p.expAvgSqOffset)[i] = v[k][i];
      }
    }
    Buffer lr(DType::F32, {}), clip(DType::F32, {}), step(DType::I64, {});
    lr.set({3e-3f});
    clip.set({0.5f});
    step.setInts({3});
    std::vector<OpInstruction> group;
    for (const OpParam &p : params) {
      OpInstruction ins;
      ins.op = Opcode::ADAMW;
      ins.in = {lr.t, clip.t, step.t};
      ins.params = {p};
      ins.floats = {0.9, 0.95, 1e-8, 0.1};
      group.push_back(ins);
    }
    std::string error;
    std::optional<OpKernels> k = mt::generateAdamWGroup(group, &error);
    ASSERT_TRUE(k) << error;
    EXPECT_EQ(k->launches.size(), 1u);
    Rank r;
    r.in = {&lr, &clip, &step};
    r.state = &s;
    ASSERT_EQ(runSteps(device, *k, {&r}), "");
    for (size_t p = 0; p < params.size(); ++p) {
      std::vector<float> g = grad[p], want = master[p], wm = m[p], wv = v[p];
      for (float &x : g)
        x *= 0.5f;
      mt::cpu::adamw_step(want.data(), g.data(), wm.data(), wv.data(), int64_t(g.size()),
                          {3e-3f, 0.9, 0.95, 1e-8, 0.1, 3});
      const OpParam &q = params[p];
      const size_t c = g.size();
      const float *target = q.masterOffset >= 0 ? s.f(q.masterOffset) : s.f(q.weightOffset);
      // Double math both sides; contraction into FMAs may move the last bit.
      EXPECT_TRUE(close(std::vector<float>(target, target + c), want, DType::F32, 2.5e-7, 0));
      EXPECT_TRUE(close(std::vector<float>(s.f(q.expAvgOffset), s.f(q.expAvgOffset) + c), wm, DType::F32, 2.5e-7, 0));
      EXPECT_TRUE(close(std::vector<float>(s.f(q.expAvgSqOffset), s.f(q.expAvgSqOffset) + c), wv, DType::F32, 2.5e-7, 0));
      if (q.masterOffset >= 0) {
        for (size_t i = 0; i < c; ++i) {
          ASSERT_EQ(s.h(q.weightOffset)[i], halfBits(q.dtype, target[i])) << i;
        }
      }
    }
    // Step 0 is refused: nothing changes.
    std::vector<uint64_t> before = s.bytes;
    step.setInts({0});
    ASSERT_EQ(runSteps(device, *k, {&r}), "");
    EXPECT_EQ(before, s.bytes);

    // The shard: elements [3, 503) of the first parameter and [0, 200) of
    // the second, state in the shard arrays from element 0. The second is
    // --decoupled-lr's: it takes the fourth input's rate.
    Buffer lr2(DType::F32, {});
    lr2.set({7e-3f});
    OpInstruction sh;
    sh.op = Opcode::SHARDED_ADAMW;
    sh.in = {lr.t, clip.t, step.t, lr2.t};
    sh.params = params;
    sh.params[1].weightDecay = false;
    sh.params[1].decoupledLr = true;
    sh.ints = {0};
    sh.floats = {0.9, 0.95, 1e-8, 0.1};
    sh.rankSegments = {{{0, 3, 0, 500}, {1, 0, 500, 200}}};
    sh.shardMasterOffset = 40960;
    sh.shardExpAvgOffset = 45056;
    sh.shardExpAvgSqOffset = 49152;
    std::vector<float> smaster(700), sm(700, 0.0f), sv(700, 0.0f);
    for (int i = 0; i < 500; ++i)
      smaster[size_t(i)] = s.f(params[0].masterOffset)[3 + i];
    for (int i = 0; i < 200; ++i)
      smaster[size_t(500 + i)] = s.f(params[1].weightOffset)[i];
    for (int i = 0; i < 700; ++i) {
      s.f(sh.shardMasterOffset)[i] = smaster[size_t(i)];
      s.f(sh.shardExpAvgOffset)[i] = 0;
      s.f(sh.shardExpAvgSqOffset)[i] = 0;
    }
    step.setInts({1});
    Rank r2 = r;
    r2.in = {&lr, &clip, &step, &lr2};
    ASSERT_EQ(runSteps(device, generate(sh), {&r2}), "");
    std::vector<float> g(700);
    for (int i = 0; i < 500; ++i)
      g[size_t(i)] = s.f(params[0].gradOffset)[3 + i] * 0.5f;
    for (int i = 0; i < 200; ++i)
      g[size_t(500 + i)] = s.f(params[1].gradOffset)[i] * 0.5f;
    std::vector<float> want = smaster;
    mt::cpu::adamw_step(want.data(), g.data(), sm.data(), sv.data(), 500, {3e-3f, 0.9, 0.95, 1e-8, 0.1, 1});
    mt::cpu::adamw_step(want.data() + 500, g.data() + 500, sm.data() + 500, sv.data() + 500, 200,
                        {7e-3f, 0.9, 0.95, 1e-8, 0.0, 1});
    EXPECT_TRUE(close(std::vector<float>(s.f(sh.shardMasterOffset), s.f(sh.shardMasterOffset) + 700), want, DType::F32, 2.5e-7, 0));
    EXPECT_TRUE(close(std::vector<float>(s.f(sh.shardExpAvgSqOffset), s.f(sh.shardExpAvgSqOffset) + 700), sv, DType::F32, 2.5e-7, 0));
    for (int i = 0; i < 500; ++i)
      ASSERT_EQ(s.h(params[0].weightOffset)[3 + i], halfBits(d, s.f(sh.shardMasterOffset)[i])) << i;
    for (int i = 0; i < 200; ++i)
      ASSERT_EQ(s.f(params[1].weightOffset)[i], s.f(sh.shardMasterOffset)[500 + i]) << i;
  }
}

// SGD with momentum (--optimizer sgd): the multi-tensor launch and the
// distributed optimizer's shard against cpu::sgd_step, two updates each so
// the momentum buffer carries over.
MT_KERNEL_TEST(CudaOpKernels, SgdGroupAndShard) {
  for (DType d : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(mt::plan::EnumNameDType(d));
    const std::vector<OpParam> params = {stateParam(d, 1001, 0), stateParam(DType::F32, 999, 4096)};
    OptimizerState s;
    std::vector<std::vector<float>> master, grad;
    for (size_t k = 0; k < params.size(); ++k) {
      const OpParam &p = params[k];
      const size_t c = size_t(p.shape[0]);
      master.push_back(randomValues(c, 60 + uint32_t(k), 0.1f, p.dtype));
      grad.push_back(randomValues(c, 70 + uint32_t(k), 0.01f));
      for (size_t i = 0; i < c; ++i) {
        if (p.masterOffset < 0)
          s.f(p.weightOffset)[i] = master[k][i];
        else {
          s.h(p.weightOffset)[i] = halfBits(p.dtype, master[k][i]);
          s.f(p.masterOffset)[i] = master[k][i];
        }
        s.f(p.gradOffset)[i] = grad[k][i];
        s.f(p.expAvgOffset)[i] = 0;
      }
    }
    Buffer lr(DType::F32, {}), clip(DType::F32, {});
    lr.set({3e-2f});
    clip.set({0.5f});
    std::vector<OpInstruction> group;
    for (size_t k = 0; k < params.size(); ++k) {
      OpInstruction ins;
      ins.op = Opcode::SGD;
      ins.in = {lr.t, clip.t};
      ins.params = {params[k]};
      ins.floats = {0.9, k == 0 ? 0.1 : 0.0};
      group.push_back(ins);
    }
    std::string error;
    std::optional<OpKernels> k = mt::generateSgdGroup(group, &error);
    ASSERT_TRUE(k) << error;
    EXPECT_EQ(k->launches.size(), 1u);
    EXPECT_EQ(k->launches[0].args.back().kind, OpArg::State);
    Rank r;
    r.in = {&lr, &clip};
    r.state = &s;
    std::vector<std::vector<float>> want = master, buf;
    for (const std::vector<float> &g : grad)
      buf.emplace_back(g.size(), 0.0f);
    for (int step = 0; step < 2; ++step) {
      ASSERT_EQ(runSteps(device, *k, {&r}), "");
      for (size_t p = 0; p < params.size(); ++p) {
        std::vector<float> g = grad[p];
        for (float &x : g)
          x *= 0.5f;
        mt::cpu::sgd_step(want[p].data(), g.data(), buf[p].data(), int64_t(g.size()),
                          {3e-2f, 0.9, p == 0 ? 0.1 : 0.0});
      }
    }
    for (size_t p = 0; p < params.size(); ++p) {
      const OpParam &q = params[p];
      const size_t c = grad[p].size();
      const float *target = q.masterOffset >= 0 ? s.f(q.masterOffset) : s.f(q.weightOffset);
      EXPECT_TRUE(close(std::vector<float>(target, target + c), want[p], DType::F32, 2.5e-7, 0));
      EXPECT_TRUE(close(std::vector<float>(s.f(q.expAvgOffset), s.f(q.expAvgOffset) + c), buf[p],
                        DType::F32, 2.5e-7, 0));
      if (q.masterOffset >= 0) {
        for (size_t i = 0; i < c; ++i) {
          ASSERT_EQ(s.h(q.weightOffset)[i], halfBits(q.dtype, target[i])) << i;
        }
      }
    }
    // Hand-derived first update of the f32 parameter (no decay): the buffer
    // is the clipped gradient and the weight moves by lr times it.
    EXPECT_FLOAT_EQ(buf[1][7] , 0.5f * grad[1][7] * 1.9f);

    // The shard: elements [3, 503) of the first parameter and [0, 200) of
    // the second (decoupled: the third input's rate, no decay); the buffer
    // in the shard's first-moment array.
    Buffer lr2(DType::F32, {});
    lr2.set({7e-2f});
    OpInstruction sh;
    sh.op = Opcode::SHARDED_SGD;
    sh.in = {lr.t, clip.t, lr2.t};
    sh.params = params;
    sh.params[1].weightDecay = false;
    sh.params[1].decoupledLr = true;
    sh.ints = {0};
    sh.floats = {0.8, 0.1};
    sh.rankSegments = {{{0, 3, 0, 500}, {1, 0, 500, 200}}};
    sh.shardMasterOffset = params[0].masterOffset >= 0 ? 40960 : -1;
    sh.shardExpAvgOffset = 45056;
    std::vector<float> swant(700), sbuf(700, 0.0f);
    for (int i = 0; i < 500; ++i)
      swant[size_t(i)] = params[0].masterOffset >= 0 ? s.f(params[0].masterOffset)[3 + i]
                                                      : s.f(params[0].weightOffset)[3 + i];
    for (int i = 0; i < 200; ++i)
      swant[size_t(500 + i)] = s.f(params[1].weightOffset)[i];
    for (int i = 0; i < 700; ++i) {
      if (sh.shardMasterOffset >= 0)
        s.f(sh.shardMasterOffset)[i] = swant[size_t(i)];
      s.f(sh.shardExpAvgOffset)[i] = 0;
    }
    Rank r2 = r;
    r2.in = {&lr, &clip, &lr2};
    ASSERT_EQ(runSteps(device, generate(sh), {&r2}), "");
    std::vector<float> g(700);
    for (int i = 0; i < 500; ++i)
      g[size_t(i)] = s.f(params[0].gradOffset)[3 + i] * 0.5f;
    for (int i = 0; i < 200; ++i)
      g[size_t(500 + i)] = s.f(params[1].gradOffset)[i] * 0.5f;
    mt::cpu::sgd_step(swant.data(), g.data(), sbuf.data(), 500, {3e-2f, 0.8, 0.1});
    mt::cpu::sgd_step(swant.data() + 500, g.data() + 500, sbuf.data() + 500, 200,
                      {7e-2f, 0.8, 0.0});
    const float *shardTarget = sh.shardMasterOffset >= 0 ? s.f(sh.shardMasterOffset) : nullptr;
    std::vector<float> got(700);
    for (int i = 0; i < 500; ++i)
      got[size_t(i)] = shardTarget ? shardTarget[i] : s.f(params[0].weightOffset)[3 + i];
    for (int i = 0; i < 200; ++i)
      got[size_t(500 + i)] = shardTarget ? shardTarget[500 + i] : s.f(params[1].weightOffset)[i];
    EXPECT_TRUE(close(got, swant, DType::F32, 2.5e-7, 0));
    EXPECT_TRUE(close(std::vector<float>(s.f(sh.shardExpAvgOffset), s.f(sh.shardExpAvgOffset) + 700),
                      sbuf, DType::F32, 2.5e-7, 0));
    if (shardTarget) {
      for (int i = 0; i < 500; ++i) {
        ASSERT_EQ(s.h(params[0].weightOffset)[3 + i], halfBits(d, shardTarget[i])) << i;
      }
    }
  }
}

// Routed experts' gradients in the norms (OpParam.expert): their squares
// summed over their own groups, apart from the dense ones'. Two ranks in
// lockstep, each collective applied only when runSteps is told its group
// spans them, so the sums show which group each part used.
MT_KERNEL_TEST(CudaOpKernels, NormsSumExpertsOverTheirGroups) {
  OptimizerState s;
  std::vector<OpParam> params = {stateParam(DType::F32, 700, 0), stateParam(DType::F32, 300, 2048),
                                 stateParam(DType::F32, 9, 4096)};
  params[1].expert = true;
  params[2].countsInNorm = false;
  for (size_t k = 0; k < params.size(); ++k) {
    std::vector<float> g = randomValues(size_t(params[k].shape[0]), 70 + uint32_t(k));
    std::copy(g.begin(), g.end(), s.f(params[k].gradOffset));
  }
  const double dense = mt::cpu::sum_squares(s.f(params[0].gradOffset), 700);
  const double experts = mt::cpu::sum_squares(s.f(params[1].gradOffset), 300);
  Buffer n0(DType::F32, {}), n1(DType::F32, {});
  Rank r0, r1;
  r0.out = {&n0};
  r1.out = {&n1};
  r0.state = r1.state = &s;
  r1.tpRank = 1;
  // GRAD_NORM: dense over mp (3), experts over tp_ep_pp (8), both counted
  // on every rank (the dense one is not replicated here).
  OpInstruction ins;
  ins.op = Opcode::GRAD_NORM;
  ins.out = {n0.t};
  ins.params = params;
  ins.tensorParallel = 2;
  const OpKernels k = generate(ins);
  ASSERT_EQ(runSteps(device, k, {&r0, &r1}, {8}), "");
  EXPECT_TRUE(close(n0.get(), {float(std::sqrt(dense + 2 * experts))}, DType::F32, 2.4e-7, 0));
  ASSERT_EQ(runSteps(device, k, {&r0, &r1}, {3}), "");
  EXPECT_TRUE(close(n1.get(), {float(std::sqrt(2 * dense + experts))}, DType::F32, 2.4e-7, 0));
  // A replicated dense parameter counts on tp rank 0 only; an expert one
  // never is (each tensor-parallel rank holds other experts).
  ins.params[0].replicated = ins.params[1].replicated = true;
  ASSERT_EQ(runSteps(device, generate(ins), {&r0, &r1}, {3, 8}), "");
  EXPECT_TRUE(close(n1.get(), {float(std::sqrt(dense + 2 * experts))}, DType::F32, 2.4e-7, 0));

  // SHARDED_GRAD_NORM at tp 2, dp 1, ep 1: dense shards by dp rank (one),
  // expert shards by expt_dp rank (tp_rank + 2 dp_rank) / 1, so the two
  // ranks own different expert segments; the experts' part is summed over
  // expt_dp (6), the dense one over dp (0) then mp (3).
  OpInstruction sh;
  sh.op = Opcode::SHARDED_GRAD_NORM;
  sh.out = {n0.t};
  sh.params = params;
  sh.params[0].expert = false;
  sh.ints = {0};
  sh.tensorParallel = 2;
  sh.expertParallel = 1;
  sh.rankSegments = {{{0, 10, 0, 200}}};
  sh.expertRankSegments = {{{1, 0, 200, 100}}, {{1, 100, 300, 150}}};
  const double a = mt::cpu::sum_squares(s.f(params[0].gradOffset) + 10, 200);
  const double c0 = mt::cpu::sum_squares(s.f(params[1].gradOffset), 100);
  const double c1 = mt::cpu::sum_squares(s.f(params[1].gradOffset) + 100, 150);
  ASSERT_EQ(runSteps(device, generate(sh), {&r0, &r1}, {6}), "");
  EXPECT_TRUE(close(n0.get(), {float(std::sqrt(a + c0 + c1))}, DType::F32, 2.4e-7, 0));
  EXPECT_EQ(n0.get(), n1.get());
}

// Gradient norms (one parameter not counted), the clipping coefficient,
// the schedule and the gradient seed.
MT_KERNEL_TEST(CudaOpKernels, NormsAndScalars) {
  OptimizerState s;
  std::vector<OpParam> params = {stateParam(DType::F32, 2000, 0), stateParam(DType::F32, 7, 4096),
                                 stateParam(DType::F32, 300, 2048)};
  params[1].countsInNorm = false;
  double want = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    std::vector<float> g = randomValues(size_t(params[k].shape[0]), 50 + uint32_t(k));
    std::copy(g.begin(), g.end(), s.f(params[k].gradOffset));
    if (params[k].countsInNorm)
      want += mt::cpu::sum_squares(g.data(), int64_t(g.size()));
  }
  params[0].shape = {1000}; // gradients lie 8192 bytes apart: 2048 floats at most
  want = 0;
  for (size_t k = 0; k < params.size(); ++k)
    if (params[k].countsInNorm)
      want += mt::cpu::sum_squares(s.f(params[k].gradOffset), params[k].shape[0]);
  Buffer norm(DType::F32, {});
  OpInstruction ins;
  ins.op = Opcode::GRAD_NORM;
  ins.out = {norm.t};
  ins.params = params;
  Rank r;
  r.out = {&norm};
  r.state = &s;
  ASSERT_EQ(runSteps(device, generate(ins), {&r}), "");
  EXPECT_TRUE(close(norm.get(), {float(std::sqrt(want))}, DType::F32, 1.2e-7, 0));

  // Sharded: parts of two parameters, summed over two data-parallel ranks.
  OpInstruction sh;
  sh.op = Opcode::SHARDED_GRAD_NORM;
  sh.out = {norm.t};
  sh.params = params;
  sh.ints = {0};
  sh.rankSegments = {{{0, 1, 0, 100}, {1, 0, 100, 7}, {2, 5, 107, 50}}};
  double part = mt::cpu::sum_squares(s.f(params[0].gradOffset) + 1, 100) +
                mt::cpu::sum_squares(s.f(params[2].gradOffset) + 5, 50);
  Rank r2 = r;
  Buffer norm2(DType::F32, {});
  r2.out = {&norm2};
  ASSERT_EQ(runSteps(device, generate(sh), {&r, &r2}, {0}), "");
  EXPECT_TRUE(close(norm.get(), {float(std::sqrt(2 * part))}, DType::F32, 1.2e-7, 0));
  EXPECT_EQ(norm.get(), norm2.get());

  // CLIP_COEFF: Megatron's factor times the gradient scale.
  Buffer scale(DType::F32, {}), coeff(DType::F32, {});
  OpInstruction clip;
  clip.op = Opcode::CLIP_COEFF;
  clip.in = {norm.t, scale.t};
  clip.out = {coeff.t};
  clip.floats = {1.0};
  Rank rc;
  rc.in = {&norm, &scale};
  rc.out = {&coeff};
  for (float n : {0.5f, 4.0f}) {
    norm.set({n});
    scale.set({0.25f});
    ASSERT_EQ(runSteps(device, generate(clip), {&rc}), "");
    const double c = std::min(1.0, 1.0 / (double(n) + 1e-6));
    EXPECT_EQ(coeff.get()[0], float(0.25 * c)) << n;
  }

  // LR_SCHEDULE: Megatron's schedule (cpu_executor.cpp's megatron_lr), in
  // samples of `g` a step; WSD anneals over its last 20 steps.
  auto megatron = [](int style, int anneal, int64_t g, int64_t warmup, int64_t decay, double max,
                     double min, int64_t steps) {
    if (warmup > 0 && steps <= warmup)
      return max * double(steps) / double(warmup);
    if (style == 0)
      return max;
    if (steps > decay)
      return min;
    if (style == 3)
      return std::max(min, max * std::sqrt(double(std::max<int64_t>(warmup * g, 1))) /
                               std::sqrt(double(std::max<int64_t>(steps * g, 1))));
    double ratio = double(steps - warmup) / double(decay - warmup);
    double c = style == 1 ? 1.0 - ratio : 0.5 * (std::cos(M_PI * ratio) + 1.0);
    if (style == 4) {
      const int64_t start = decay - 20;
      const double r = double(steps - start) / 20.0;
      c = steps <= start ? 1.0
          : anneal == 0  ? 2.0 * std::pow(0.5, r) - 1.0
          : anneal == 1  ? 1.0 - r
          : anneal == 2  ? 0.5 * (std::cos(M_PI * r) + 1.0)
                         : 1.0 - std::sqrt(r);
    }
    return min + c * (max - min);
  };
  Buffer it(DType::I64, {}), lr(DType::F32, {});
  for (int style = 0; style < 5; ++style)
    for (int anneal = 0; anneal < (style == 4 ? 4 : 1); ++anneal)
      for (int64_t warmup : {int64_t(0), int64_t(10)})
        for (int64_t steps : {0, 1, 5, 10, 11, 60, 85, 93, 100, 101, 500}) {
          const int64_t g = style == 3 ? 8 : 1;
          OpInstruction ls;
          ls.op = Opcode::LR_SCHEDULE;
          ls.in = {it.t};
          ls.out = {lr.t};
          ls.ints = {style, warmup, 100, g, style == 4 ? anneal : 0, style == 4 ? 20 : 0};
          ls.floats = {1e-3, 1e-4};
          Rank rl;
          rl.in = {&it};
          rl.out = {&lr};
          it.setInts({steps});
          ASSERT_EQ(runSteps(device, generate(ls), {&rl}), "");
          EXPECT_TRUE(close(lr.get(), {float(megatron(style, anneal, g, warmup, 100, 1e-3, 1e-4, steps))},
                            DType::F32, 6e-8, 0))
              << "style " << style << " anneal " << anneal << " warmup " << warmup << " step " << steps;
        }

  // GRAD_SEED: the scale times the runtime's loss scale.
  OpInstruction seed;
  seed.op = Opcode::GRAD_SEED;
  seed.out = {lr.t};
  seed.floats = {0.125};
  Rank rs;
  rs.out = {&lr};
  rs.lossScale = 65536.0f;
  ASSERT_EQ(runSteps(device, generate(seed), {&rs}), "");
  EXPECT_EQ(lr.get()[0], 8192.0f);
}

// Embedding forward (plain and vocab parallel), its deterministic gradient
// (bit-equal to the CPU's token-order sums; a few tokens in one tile, and
// thousands through the merge passes), position ids.
MT_KERNEL_TEST(CudaOpKernels, Embeddings) {
  for (DType d : kFloatTypes) {
    SCOPED_TRACE(mt::plan::EnumNameDType(d));
    const int64_t vocab = 40, h = 24, n = 12;
    std::vector<float> table = randomValues(size_t(vocab * h), 60, 1.0f, d);
    std::vector<int64_t> ids = {3, 7, 3, 39, 0, 7, 7, 12, 3, 25, 39, 1};
    Buffer t(d, {vocab, h}), id(DType::I32, {n}), y(d, {n, h});
    t.set(table);
    id.setInts(ids);
    OpInstruction ins;
    ins.op = Opcode::EMBEDDING;
    ins.in = {t.t, id.t};
    ins.out = {y.t};
    ins.ints = {0};
    Rank r;
    r.in = {&t, &id};
    r.out = {&y};
    ASSERT_EQ(runSteps(device, generate(ins), {&r}), "");
    std::vector<int32_t> ids32(ids.begin(), ids.end());
    std::vector<float> want(size_t(n * h));
    ASSERT_TRUE(mt::cpu::embedding_fwd(table.data(), vocab, h, ids32.data(), n, want.data()));
    EXPECT_EQ(y.get(), want);

    // Vocab parallel, rank 1 of 2 holding rows 20..39 of the whole 40.
    Buffer half(d, {vocab / 2, h});
    half.set(std::vector<float>(table.begin() + (vocab / 2) * h, table.end()));
    OpInstruction vp = ins;
    vp.in = {half.t, id.t};
    vp.ints = {1};
    vp.tensorParallel = 2;
    Rank rv = r;
    rv.in = {&half, &id};
    rv.tpRank = 1;
    ASSERT_EQ(runSteps(device, generate(vp), {&rv}), "");
    std::vector<float> got = y.get();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < h; ++j)
        ASSERT_EQ(got[size_t(i * h + j)], ids[size_t(i)] >= 20 ? want[size_t(i * h + j)] : 0.0f);
    // An id outside the whole vocabulary gives NaN.
    id.setInts({3, 7, 3, 40, 0, 7, 7, 12, 3, 25, 39, 1});
    ASSERT_EQ(runSteps(device, generate(vp), {&rv}), "");
    EXPECT_TRUE(std::isnan(y.get()[3 * h]));
    id.setInts(ids);

    // The gradient: dy rows added into an f32 gradient in token order.
    std::vector<float> dy = randomValues(size_t(n * h), 61, 1.0f, d);
    std::vector<float> g0 = randomValues(size_t(vocab * h), 62);
    Buffer dyb(d, {n, h});
    dyb.set(dy);
    OpParam p;
    p.shape = {vocab, h};
    p.dtype = d;
    OpInstruction gi;
    gi.op = Opcode::EMBEDDING_GRAD;
    gi.in = {dyb.t, id.t};
    gi.params = {p};
    gi.ints = {0};
    std::vector<float> g = g0;
    Rank rg;
    rg.in = {&dyb, &id};
    rg.grads = {&g};
    ASSERT_EQ(runSteps(device, generate(gi), {&rg}), "");
    std::vector<float> gw = g0;
    mt::cpu::embedding_bwd(dy.data(), ids32.data(), n, h, gw.data());
    EXPECT_EQ(g, gw);
    // Vocab parallel: rank 1's rows only.
    p.shape = {vocab / 2, h};
    gi.params = {p};
    gi.ints = {1};
    gi.tensorParallel = 2;
    std::vector<float> gh(g0.begin() + (vocab / 2) * h, g0.end());
    rg.grads = {&gh};
    rg.tpRank = 1;
    ASSERT_EQ(runSteps(device, generate(gi), {&rg}), "");
    EXPECT_EQ(gh, std::vector<float>(gw.begin() + (vocab / 2) * h, gw.end()));

    // 5003 tokens of 40 rows (each row repeated ~125 times): three tiles of
    // 2048 sorted keys and two merge passes, one of them with an unpaired
    // run; whole and as rank 1 of 2. Bit-equal to the token-order sums.
    const int64_t many = 5003;
    std::vector<int64_t> manyIds(static_cast<size_t>(many));
    std::mt19937 pick(64);
    for (int64_t &x : manyIds)
      x = int64_t(pick() % 40);
    manyIds[0] = 39, manyIds[many - 1] = 0;
    std::vector<int32_t> manyIds32(manyIds.begin(), manyIds.end());
    std::vector<float> dyMany = randomValues(size_t(many * h), 65, 1.0f, d);
    Buffer dyM(d, {many, h}), idM(DType::I32, {many});
    dyM.set(dyMany);
    idM.setInts(manyIds);
    OpInstruction gm = gi;
    gm.in = {dyM.t, idM.t};
    p.shape = {vocab, h};
    gm.params = {p};
    gm.ints = {0};
    gm.tensorParallel = 1;
    OpKernels km = generate(gm);
    std::string names;
    for (const mt::OpLaunch &l : km.launches)
      names += l.kernel.entry.substr(0, l.kernel.entry.rfind('_')) + " ";
    EXPECT_EQ(names, "mt_emb_sort mt_emb_merge mt_emb_merge mt_emb_accum ");
    std::vector<float> gM = g0, gMw = g0;
    Rank rm;
    rm.in = {&dyM, &idM};
    rm.grads = {&gM};
    ASSERT_EQ(runSteps(device, km, {&rm}), "");
    mt::cpu::embedding_bwd(dyMany.data(), manyIds32.data(), many, h, gMw.data());
    EXPECT_EQ(gM, gMw);
    p.shape = {vocab / 2, h};
    gm.params = {p};
    gm.ints = {1};
    gm.tensorParallel = 2;
    std::vector<float> gMh(g0.begin() + (vocab / 2) * h, g0.end());
    rm.grads = {&gMh};
    rm.tpRank = 1;
    ASSERT_EQ(runSteps(device, generate(gm), {&rm}), "");
    EXPECT_EQ(gMh, std::vector<float>(gMw.begin() + (vocab / 2) * h, gMw.end()));
  }
  Buffer pos(DType::I32, {3, 5});
  OpInstruction pi;
  pi.op = Opcode::POSITION_IDS;
  pi.out = {pos.t};
  Rank r;
  r.out = {&pos};
  ASSERT_EQ(runSteps(device, generate(pi), {&r}), "");
  for (int i = 0; i < 15; ++i)
    EXPECT_EQ(static_cast<int32_t *>(pos.data())[i], i % 5);
}

// Norms and their gradients (dw, db added into f32 gradients), bias
// gradients; rows of 96 (8 lanes) and 50 (2 lanes), 37 rows; and 600 rows
// of 40, more than the 528 partial rows of the first stage (so blocks take
// several rows and the second stage has all 32 slices). The norm gradients
// take a warp a row up to 1024 (16-bit) or 512 (f32) columns; rows of 1100
// take the block-a-row kernel.
MT_KERNEL_TEST(CudaOpKernels, NormsAndColumnSums) {
  for (DType d : kFloatTypes)
    for (auto [h, n] : {std::pair<int64_t, int64_t>{96, 37}, {50, 37}, {40, 600}, {1100, 9}}) {
      SCOPED_TRACE(std::string(mt::plan::EnumNameDType(d)) + " h " + std::to_string(h) +
                   " rows " + std::to_string(n));
      std::vector<float> x = randomValues(size_t(n * h), 70, 1.0f, d);
      for (float &v : x)
        v = roundTo(d, v + 0.5f);
      std::vector<float> dy = randomValues(size_t(n * h), 71, 1.0f, d);
      std::vector<float> w = randomValues(size_t(h), 72, 1.0f, d);
      std::vector<float> b = randomValues(size_t(h), 73, 1.0f, d);
      Buffer xb(d, {n, h}), dyb(d, {n, h}), wb(d, {h}), bb(d, {h}), yb(d, {n, h});
      xb.set(x);
      dyb.set(dy);
      wb.set(w);
      bb.set(b);
      for (bool layer : {true, false})
      for (double off : {0.0, 1.0}) { // 1: --apply-layernorm-1p's 1 + w
        SCOPED_TRACE(std::string(layer ? "layer_norm" : "rms_norm") + " w_offset " +
                     std::to_string(off));
        OpInstruction f;
        f.op = layer ? Opcode::LAYER_NORM : Opcode::RMS_NORM;
        f.in = layer ? std::vector<OpTensor>{xb.t, wb.t, bb.t} : std::vector<OpTensor>{xb.t, wb.t};
        f.out = {yb.t};
        f.floats = {1e-5, off};
        Rank r;
        r.in = layer ? std::vector<Buffer *>{&xb, &wb, &bb} : std::vector<Buffer *>{&xb, &wb};
        r.out = {&yb};
        ASSERT_EQ(runSteps(device, generate(f), {&r}), "");
        std::vector<float> want(x.size());
        if (layer)
          mt::cpu::layer_norm_fwd(x.data(), w.data(), b.data(), n, h, 1e-5, want.data(), off);
        else
          mt::cpu::rms_norm_fwd(x.data(), w.data(), n, h, 1e-5, want.data(), off);
        EXPECT_TRUE(close(yb.get(), rounded(want, d), d, 1e-5, 1e-5));

        OpParam p;
        p.shape = {h};
        p.dtype = d;
        OpInstruction g;
        g.op = layer ? Opcode::LAYER_NORM_GRAD : Opcode::RMS_NORM_GRAD;
        g.in = {dyb.t, xb.t, wb.t};
        g.out = {yb.t};
        g.params = layer ? std::vector<OpParam>{p, p} : std::vector<OpParam>{p};
        g.floats = {1e-5, off};
        std::vector<float> dw0 = randomValues(size_t(h), 74), db0 = randomValues(size_t(h), 75);
        std::vector<float> dw = dw0, db = db0, wdw = dw0, wdb = db0;
        Rank rg;
        rg.in = {&dyb, &xb, &wb};
        rg.out = {&yb};
        rg.grads = layer ? std::vector<std::vector<float> *>{&dw, &db} : std::vector<std::vector<float> *>{&dw};
        ASSERT_EQ(runSteps(device, generate(g), {&rg}), "");
        std::vector<float> wdx(x.size());
        if (layer)
          mt::cpu::layer_norm_bwd(dy.data(), x.data(), w.data(), n, h, 1e-5, wdx.data(), wdw.data(), wdb.data(), off);
        else
          mt::cpu::rms_norm_bwd(dy.data(), x.data(), w.data(), n, h, 1e-5, wdx.data(), wdw.data(), off);
        EXPECT_TRUE(close(yb.get(), rounded(wdx, d), d, 1e-4, 2e-5));
        EXPECT_TRUE(close(dw, wdw, DType::F32, 1e-5, 2e-5));
        if (layer) {
          EXPECT_TRUE(close(db, wdb, DType::F32, 1e-5, 2e-5));
        }
      }
      OpParam p;
      p.shape = {h};
      OpInstruction bg;
      bg.op = Opcode::BIAS_GRAD;
      bg.in = {dyb.t};
      bg.params = {p};
      std::vector<float> db = randomValues(size_t(h), 76), wdb = db;
      Rank rb;
      rb.in = {&dyb};
      rb.grads = {&db};
      ASSERT_EQ(runSteps(device, generate(bg), {&rb}), "");
      mt::cpu::bias_grad(dy.data(), n, h, wdb.data());
      EXPECT_TRUE(close(db, wdb, DType::F32, 1e-6, 1e-6));
    }
}


// The elementwise ops, split, rotary embedding and the split with the
// rotation, one instruction each.
MT_KERNEL_TEST(CudaOpKernels, ElementwiseSplitRope) {
  const int64_t n = 6, f = 40;
  for (DType d : kFloatTypes) {
    SCOPED_TRACE(mt::plan::EnumNameDType(d));
    std::vector<float> a = randomValues(size_t(n * 2 * f), 80, 2.0f, d);
    std::vector<float> b = randomValues(size_t(n * 2 * f), 81, 2.0f, d);
    std::vector<float> bias = randomValues(size_t(2 * f), 82, 1.0f, d);
    std::vector<float> g = randomValues(size_t(n * f), 83, 1.0f, d);
    Buffer A(d, {n, 2 * f}), Bb(d, {n, 2 * f}), bi(d, {2 * f}), G(d, {n, f}), Y(d, {n, 2 * f}),
        Yh(d, {n, f});
    A.set(a);
    Bb.set(b);
    bi.set(bias);
    G.set(g);
    auto run1 = [&](Opcode op, std::vector<Buffer *> in, Buffer *out, std::vector<int64_t> ints,
                    std::vector<double> floats, uint64_t tpRank = 0, int64_t tp = 1) {
      OpInstruction ins;
      ins.op = op;
      for (Buffer *x : in)
        ins.in.push_back(x->t);
      ins.out = {out->t};
      ins.ints = std::move(ints);
      ins.floats = std::move(floats);
      ins.tensorParallel = tp;
      Rank r;
      r.in = in;
      r.out = {out};
      r.seed = 1234;
      r.rngOffset = 77;
      r.tpRank = tpRank;
      return runSteps(device, generate(ins), {&r});
    };
    std::vector<float> want(a.size()), wanth(g.size());
    ASSERT_EQ(run1(Opcode::ADD, {&A, &Bb}, &Y, {}, {}), "");
    mt::cpu::add(a.data(), b.data(), int64_t(a.size()), want.data());
    EXPECT_TRUE(close(Y.get(), rounded(want, d), d, 0, 0));
    ASSERT_EQ(run1(Opcode::BIAS_ADD, {&A, &bi}, &Y, {}, {}), "");
    mt::cpu::bias_add_fwd(a.data(), bias.data(), n, 2 * f, want.data());
    EXPECT_TRUE(close(Y.get(), rounded(want, d), d, 0, 0));
    for (int tanh : {0, 1}) {
      ASSERT_EQ(run1(Opcode::GELU, {&A}, &Y, {tanh}, {}), "");
      mt::cpu::gelu_fwd(a.data(), int64_t(a.size()), tanh != 0, want.data());
      EXPECT_TRUE(close(Y.get(), rounded(want, d), d, 1e-6, 1e-7)) << "tanh " << tanh;
      ASSERT_EQ(run1(Opcode::GELU_GRAD, {&Bb, &A}, &Y, {tanh}, {}), "");
      mt::cpu::gelu_bwd(b.data(), a.data(), int64_t(a.size()), tanh != 0, want.data());
      EXPECT_TRUE(close(Y.get(), rounded(want, d), d, 1e-5, 1e-6)) << "tanh " << tanh;
    }
    ASSERT_EQ(run1(Opcode::SWIGLU, {&A}, &Yh, {}, {}), "");
    mt::cpu::swiglu_fwd(a.data(), n, f, wanth.data());
    EXPECT_TRUE(close(Yh.get(), rounded(wanth, d), d, 1e-6, 1e-7));
    ASSERT_EQ(run1(Opcode::SWIGLU_GRAD, {&G, &A}, &Y, {}, {}), "");
    mt::cpu::swiglu_bwd(g.data(), a.data(), n, f, want.data());
    EXPECT_TRUE(close(Y.get(), rounded(want, d), d, 1e-5, 1e-6));
    // Dropout: the CPU's mask exactly, whole and as tp rank 1 of 2 along dim
    // 1; the kept values scaled by the fp32 1 / (1 - rate), the CPU's double
    // one: one fp32 ulp apart at most.
    ASSERT_EQ(run1(Opcode::DROPOUT, {&A}, &Y, {5, -1}, {0.3}), "");
    mt::cpu::dropout_fwd(a.data(), int64_t(a.size()), 0.3, {1234, 5, 77}, want.data());
    EXPECT_TRUE(close(Y.get(), rounded(want, d), d, 1.2e-7, 0));
    ASSERT_EQ(run1(Opcode::DROPOUT, {&A}, &Y, {5, 1}, {0.3}, 1, 2), "");
    mt::cpu::dropout_segments(a.data(), n, 2 * f, uint64_t(4 * f), uint64_t(2 * f), 0.3,
                              {1234, 5, 77}, want.data());
    EXPECT_TRUE(close(Y.get(), rounded(want, d), d, 1.2e-7, 0));
    // A dropout over many blocks whose count V does not divide (the
    // backward's lone dropout): full lane groups, then a scalar tail.
    for (int64_t count : {int64_t(9 * 1024 + 3), int64_t(4096)}) {
      std::vector<float> big = randomValues(size_t(count), 87, 1.0f, d), wantBig(big.size());
      Buffer X(d, {count}), Yb(d, {count});
      X.set(big);
      ASSERT_EQ(run1(Opcode::DROPOUT, {&X}, &Yb, {9, -1}, {0.1}), "");
      mt::cpu::dropout_fwd(big.data(), count, 0.1, {1234, 9, 77}, wantBig.data());
      EXPECT_TRUE(close(Yb.get(), rounded(wantBig, d), d, 1.2e-7, 0)) << count;
    }
    Buffer R(d, {2 * n, f});
    ASSERT_EQ(run1(Opcode::RESHAPE, {&A}, &R, {}, {}), "");
    EXPECT_EQ(R.get(), a);

    // SPLIT_QKV with 4 heads in 2 groups of d = 8 (a row of 2 x 4 x 8 = 64),
    // then back.
    const int64_t heads = 4, groups = 2, hd = 8, rows = 5;
    std::vector<float> qkv = randomValues(size_t(rows * groups * 4 * hd), 84, 1.0f, d);
    Buffer QKV(d, {rows, groups * 4 * hd}), Q(d, {rows, heads, hd}), K(d, {rows, groups, hd}),
        V(d, {rows, groups, hd}), QKV2(d, {rows, groups * 4 * hd});
    QKV.set(qkv);
    OpInstruction sp;
    sp.op = Opcode::SPLIT_QKV;
    sp.in = {QKV.t};
    sp.out = {Q.t, K.t, V.t};
    Rank rs;
    rs.in = {&QKV};
    rs.out = {&Q, &K, &V};
    ASSERT_EQ(runSteps(device, generate(sp), {&rs}), "");
    std::vector<float> wq(size_t(rows * heads * hd)), wk(size_t(rows * groups * hd)), wv(wk.size());
    mt::cpu::split_qkv_fwd(qkv.data(), rows, heads, groups, hd, wq.data(), wk.data(), wv.data());
    EXPECT_EQ(Q.get(), wq);
    EXPECT_EQ(K.get(), wk);
    EXPECT_EQ(V.get(), wv);
    sp.op = Opcode::SPLIT_QKV_GRAD;
    sp.in = {Q.t, K.t, V.t};
    sp.out = {QKV2.t};
    rs.in = {&Q, &K, &V};
    rs.out = {&QKV2};
    ASSERT_EQ(runSteps(device, generate(sp), {&rs}), "");
    EXPECT_EQ(QKV2.get(), qkv);

    // ROPE and its gradient on [2, 7, 3, d], d = 16 and an odd d = 9.
    // With Llama 3.1's scaling (factor 8) too.
    for (int64_t rd : {16, 9})
    for (double sc : {0.0, 8.0}) {
      std::vector<float> x = randomValues(size_t(2 * 7 * 3 * rd), 85, 1.0f, d);
      Buffer X(d, {2, 7, 3, rd}), Yr(d, {2, 7, 3, rd});
      X.set(x);
      std::vector<float> wr(x.size());
      for (bool grad : {false, true}) {
        ASSERT_EQ(run1(grad ? Opcode::ROPE_GRAD : Opcode::ROPE, {&X}, &Yr, {}, {500000.0, sc}), "");
        if (grad)
          mt::cpu::rope_bwd(x.data(), 2, 7, 3, rd, 500000.0, wr.data(), sc);
        else
          mt::cpu::rope_fwd(x.data(), 2, 7, 3, rd, 500000.0, wr.data(), sc);
        EXPECT_TRUE(close(Yr.get(), rounded(wr, d), d, 1e-6, 1e-7))
            << "d " << rd << " grad " << grad << " scaling " << sc;
      }
    }

    // SPLIT_QKV_ROPE and its gradient against the CPU's fused split (which
    // equals split then rope bit for bit: CpuKernelsTest): [2, 5] tokens, 6
    // heads in 2 groups, head_dim 16 (V lanes per half), 6 (one lane) and
    // 128 (Llama's).
    for (int64_t rd : {16, 6, 128})
    for (double sc : {0.0, 8.0}) {
      const int64_t b2 = 2, s2 = 5, h2 = 6, g2 = 2, w2 = g2 * (h2 / g2 + 2) * rd;
      std::vector<float> x = randomValues(size_t(b2 * s2 * w2), 86, 1.0f, d);
      Buffer X(d, {b2, s2, w2}), Qr(d, {b2, s2, h2, rd}), Kr(d, {b2, s2, g2, rd}),
          Vr(d, {b2, s2, g2, rd}), X2(d, {b2, s2, w2});
      X.set(x);
      OpInstruction f;
      f.op = Opcode::SPLIT_QKV_ROPE;
      f.in = {X.t};
      f.out = {Qr.t, Kr.t, Vr.t};
      f.floats = {500000.0, sc};
      Rank rf;
      rf.in = {&X};
      rf.out = {&Qr, &Kr, &Vr};
      ASSERT_EQ(runSteps(device, generate(f), {&rf}), "");
      std::vector<float> wq(size_t(b2 * s2 * h2 * rd)), wk(size_t(b2 * s2 * g2 * rd)), wv(wk.size());
      mt::cpu::split_qkv_rope_fwd(x.data(), b2, s2, h2, g2, rd, 500000.0, wq.data(), wk.data(),
                                  wv.data(), sc);
      EXPECT_TRUE(close(Qr.get(), rounded(wq, d), d, 1e-6, 1e-7)) << "d " << rd;
      EXPECT_TRUE(close(Kr.get(), rounded(wk, d), d, 1e-6, 1e-7)) << "d " << rd;
      EXPECT_EQ(Vr.get(), wv) << "d " << rd;
      f.op = Opcode::SPLIT_QKV_ROPE_GRAD;
      f.in = {Qr.t, Kr.t, Vr.t};
      f.out = {X2.t};
      rf.in = {&Qr, &Kr, &Vr};
      rf.out = {&X2};
      ASSERT_EQ(runSteps(device, generate(f), {&rf}), "");
      const std::vector<float> gq = Qr.get(), gk = Kr.get(), gv = Vr.get();
      std::vector<float> wx(x.size());
      mt::cpu::split_qkv_rope_bwd(gq.data(), gk.data(), gv.data(), b2, s2, h2, g2, rd, 500000.0,
                                  wx.data(), sc);
      EXPECT_TRUE(close(X2.get(), rounded(wx, d), d, 1e-6, 1e-7)) << "d " << rd << " grad";
    }
  }
}

// GRAD_ACCUMULATE: the f32 values added into the gradient in double, odd
// counts (a scalar tail) and several blocks.
MT_KERNEL_TEST(CudaOpKernels, GradAccumulate) {
  for (int64_t count : {int64_t(5003), int64_t(64)}) {
    std::string error;
    std::optional<OpKernels> k = mt::generateGradAccumulate(count, mt::plan::DType::F32, &error);
    ASSERT_TRUE(k) << error;
    std::vector<float> g = randomValues(size_t(count), 90), add = randomValues(size_t(count), 91);
    std::vector<float> want(g.size());
    for (size_t i = 0; i < g.size(); ++i)
      want[i] = float(double(g[i]) + double(add[i]));
    Rank r;
    r.grads = {&g};
    Mirror m(device);
    r.ws.assign(size_t(k->workspaceBytes / 8 + 2), 0);
    std::memcpy(r.ws.data(), add.data(), add.size() * 4);
    ASSERT_EQ(m.map(r.wsData(), r.ws.size() * 8), "");
    ASSERT_EQ(m.map(g.data(), g.size() * 4), "");
    ASSERT_EQ(m.upload(), "");
    for (const OpStep &st : k->steps) {
      ASSERT_EQ(st.kind, OpStep::Launch);
      ASSERT_EQ(launch(device, m, k->launches[st.launch], r), "");
    }
    ASSERT_EQ(m.download(), "");
    EXPECT_EQ(g, want) << count;
  }
}

// GRAD_SCALE: each gradient times float(scale) (the CPU executor's
// product), one launch per gradient, counts with and without a scalar
// tail; a scale of 0 or an empty gradient is refused.
MT_KERNEL_TEST(CudaOpKernels, GradScale) {
  for (double scale : {0.5, 1.0 / 3.0}) {
    std::string error;
    std::optional<OpKernels> k =
        mt::generateGradScale({5003, 64}, mt::plan::DType::F32, scale, &error);
    ASSERT_TRUE(k) << error;
    ASSERT_EQ(k->launches.size(), 2u);
    std::vector<float> g0 = randomValues(5003, 92), g1 = randomValues(64, 93);
    std::vector<float> want0(g0), want1(g1);
    for (float &x : want0)
      x *= float(scale);
    for (float &x : want1)
      x *= float(scale);
    Rank r;
    r.grads = {&g0, &g1};
    Mirror m(device);
    ASSERT_EQ(m.map(g0.data(), g0.size() * 4), "");
    ASSERT_EQ(m.map(g1.data(), g1.size() * 4), "");
    ASSERT_EQ(m.upload(), "");
    for (const OpStep &st : k->steps) {
      ASSERT_EQ(st.kind, OpStep::Launch);
      ASSERT_EQ(launch(device, m, k->launches[st.launch], r), "");
    }
    ASSERT_EQ(m.download(), "");
    EXPECT_EQ(g0, want0) << scale;
    EXPECT_EQ(g1, want1) << scale;
  }
  std::string error;
  EXPECT_FALSE(mt::generateGradScale({16}, mt::plan::DType::F32, 0.0, &error));
  EXPECT_EQ(error, "a gradient scale of 0.0");
  EXPECT_FALSE(mt::generateGradScale({0}, mt::plan::DType::F32, 0.5, &error));
  EXPECT_EQ(error, "a gradient scale of 0 values");
}

} // namespace
