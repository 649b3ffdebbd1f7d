// compiler/CudaOpKernels: every opcode's kernels compile with NVRTC for sm_80
// and sm_90 (f32, bf16, f16) when NVRTC is present, carry the features they
// are built for, and compute what runtime/cpu_kernels computes when run on
// the host emulation of CUDA (CudaHostKernel), on random inputs.
#include "CudaHostKernel.h"

#include "compiler/CudaOpKernels.h"
#include "runtime/cpu_kernels.h"
#include "runtime/cuda_api.h"
#include "runtime/kernel_cache.h"

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
// Running an instruction's steps on the emulation, one or more ranks in
// lockstep (collectives combine the ranks' workspaces).

struct Rank {
  std::vector<Buffer *> in, out;
  std::vector<float *> grads;
  void *state = nullptr;
  float lossScale = 1.0f;
  uint64_t seed = 0, rngOffset = 0, tpRank = 0;
  std::vector<uint64_t> ws;
  void *wsData() { return ws.data(); }
};

const mt::emu::HostKernel *hostKernel(const mt::CudaKernel &k, std::string *error) {
  static std::map<std::string, std::unique_ptr<mt::emu::HostKernel>> cache;
  auto it = cache.find(k.entry);
  if (it == cache.end())
    it = cache.emplace(k.entry, mt::emu::HostKernel::compile(k.source, k.entry, error)).first;
  return it->second.get();
}

std::string launch(const mt::OpLaunch &l, Rank &r) {
  std::string error;
  const mt::emu::HostKernel *k = hostKernel(l.kernel, &error);
  if (!k)
    return "compile " + l.kernel.entry + ": " + error;
  std::vector<void *> ptrs;
  for (const OpArg &a : l.args) {
    switch (a.kind) {
    case OpArg::In: ptrs.push_back(r.in.at(a.index)->data()); break;
    case OpArg::Out: ptrs.push_back(r.out.at(a.index)->data()); break;
    case OpArg::ParamGrad: ptrs.push_back(r.grads.at(a.index)); break;
    case OpArg::State: ptrs.push_back(r.state); break;
    case OpArg::Workspace: ptrs.push_back(reinterpret_cast<uint8_t *>(r.wsData()) + a.index); break;
    case OpArg::LossScale: ptrs.push_back(&r.lossScale); break;
    }
  }
  std::vector<unsigned long long> scalars;
  size_t stream = 0;
  for (const std::string &s : l.kernel.scalarArgs)
    scalars.push_back(s == "seed" ? r.seed : s == "rng_offset" ? r.rngOffset
                      : s == "tp_rank" ? r.tpRank : l.kernel.streams.at(stream++));
  std::vector<void *> params;
  for (void *&p : ptrs)
    params.push_back(&p);
  for (unsigned long long &s : scalars)
    params.push_back(&s);
  return k->launch(l.kernel.grid, l.kernel.block, l.kernel.sharedBytes, params.data());
}

std::string runSteps(const OpKernels &k, std::vector<Rank *> ranks) {
  for (Rank *r : ranks) {
    r->ws.assign(size_t(k.workspaceBytes / 8 + 2), ~0ull); // NaN bytes: unwritten reads show
  }
  for (const OpStep &s : k.steps) {
    if (s.kind == OpStep::Launch) {
      for (Rank *r : ranks)
        if (std::string e = launch(k.launches[s.launch], *r); !e.empty())
          return e;
      continue;
    }
    EXPECT_LE(s.offset + s.count * (s.type == OpStep::F64 ? 8 : 4), k.workspaceBytes);
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
  }
  return "";
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
  add(Opcode::LAYER_NORM, {x, h, h}, {x}, {}, {1e-5});
  add(Opcode::RMS_NORM, {x, h}, {x}, {}, {1e-5});
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
  add(Opcode::ROPE, {tensor(d, {2, 8, 4, 64})}, {tensor(d, {2, 8, 4, 64})}, {}, {10000.0});
  add(Opcode::CROSS_ENTROPY, {tensor(d, {16, 512}), ids}, {scalar}, {0});
  add(Opcode::CROSS_ENTROPY, {tensor(d, {16, 512}), ids}, {scalar}, {1});
  add(Opcode::GRAD_SEED, {}, {scalar}, {}, {1.0});
  add(Opcode::EMBEDDING_GRAD, {x, ids}, {}, {0}, {}, {table});
  add(Opcode::EMBEDDING_GRAD, {x, ids}, {}, {1}, {}, {table});
  add(Opcode::BIAS_GRAD, {x}, {}, {}, {}, {w});
  add(Opcode::LAYER_NORM_GRAD, {x, x, h}, {x}, {}, {1e-5}, {w, w});
  add(Opcode::RMS_NORM_GRAD, {x, x, h}, {x}, {}, {1e-5}, {w});
  add(Opcode::GELU_GRAD, {x, x}, {x}, {1});
  add(Opcode::SWIGLU_GRAD, {tensor(d, {2, 8, 128}), x}, {x});
  add(Opcode::SPLIT_QKV_GRAD,
      {tensor(d, {2, 8, 4, 64}), tensor(d, {2, 8, 1, 64}), tensor(d, {2, 8, 1, 64})},
      {tensor(d, {2, 8, 384})});
  add(Opcode::ROPE_GRAD, {tensor(d, {2, 8, 4, 64})}, {tensor(d, {2, 8, 4, 64})}, {}, {10000.0});
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
  add(Opcode::LR_SCHEDULE, {step}, {scalar}, {2, 10, 100}, {1e-3, 1e-4});
  add(Opcode::CLIP_COEFF, {scalar, scalar}, {scalar}, {}, {1.0});
  add(Opcode::ADAMW, {scalar, scalar, step}, {}, {}, {0.9, 0.95, 1e-8, 0.1}, {p});
  OpInstruction sharded;
  sharded.op = Opcode::SHARDED_ADAMW;
  sharded.in = {scalar, scalar, step};
  sharded.params = {p};
  sharded.ints = {0};
  sharded.floats = {0.9, 0.95, 1e-8, 0.1};
  sharded.segments = {{0, 3, 0, 500}};
  sharded.shardMasterOffset = d == DType::F32 ? -1 : 20480;
  sharded.shardExpAvgOffset = 24576;
  sharded.shardExpAvgSqOffset = 28672;
  all.push_back(sharded);
  sharded.op = Opcode::SHARDED_GRAD_NORM;
  sharded.in = {};
  sharded.out = {scalar};
  sharded.floats = {};
  all.push_back(sharded);
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
  EXPECT_GT(seen.size(), 60u);
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
  // Norms: the mp group after the data-parallel one for the sharded norm.
  EXPECT_EQ(kinds(byOp["GRAD_NORM"][0]), "LLSL");
  EXPECT_EQ(byOp["GRAD_NORM"][0].steps[2].group, 3);
  EXPECT_EQ(byOp["GRAD_NORM"][0].steps[2].type, OpStep::F64);
  EXPECT_EQ(kinds(byOp["SHARDED_GRAD_NORM"][0]), "LLSSL");
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
  // Norm gradients: partials in the workspace, then column sums into both grads.
  const OpKernels &lng = byOp["LAYER_NORM_GRAD"][0];
  ASSERT_EQ(lng.launches.size(), 2u);
  EXPECT_EQ(lng.launches[1].args.size(), 3u);
  EXPECT_EQ(lng.launches[1].args[2].kind, OpArg::ParamGrad);
  EXPECT_EQ(lng.workspaceBytes, 2u * 16 * 256 * 4);
  // A RESHAPE onto its input's bytes launches nothing.
  OpInstruction view = everyOpcode(DType::F32)[12];
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

} // namespace
