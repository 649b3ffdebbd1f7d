// plan.bin's reader (header, checksum, FlatBuffers and semantic checks) and
// the CPU reference executor, on plans built here with the FlatBuffers builder.
#include "runtime/comm/collectives.h"
#include "runtime/comm/parallel_groups.h"
#include "runtime/exec/cpu_executor.h"
#include "runtime/exec/cpu_kernels.h"
#include "runtime/exec/cpu_kernels_moe.h"
#include "runtime/exec/log_stats.h"
#include "runtime/plan/grad_buckets.h"
#include "runtime/plan/plan_reader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <unistd.h>
#include <vector>

namespace {

namespace pl = mt::plan;
using mt::rt::CpuExecutor;
using mt::rt::PlanFile;
using pl::DType;
using pl::Opcode;
using pl::Region;

#define EXPECT_CONTAINS(text, part)                                                          \
  EXPECT_NE(std::string(text).find(part), std::string::npos)                                 \
      << "expected to find: " << (part) << "\n in: " << (text)

// ---------------------------------------------------------------------------
// A compact description of a one-rank plan, and its FlatBuffer.

struct V {
  std::string name;
  Region region = Region::ARENA;
  uint64_t offset = 0;
  std::vector<int64_t> shape;
  DType dtype = DType::F32;
  std::vector<uint64_t> slots; // Value.slot_offsets (a compact train_step's)
};

struct I {
  Opcode op;
  std::vector<uint32_t> in, out, params;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::string where;
  int32_t micro_batch = -1;
  pl::MicroBatches runs_in = pl::MicroBatches::ALL;
};

// Program.pipeline: a compact pipelined train_step's schedule.
struct Pipe {
  int32_t stages = 2, chunks = 1, rank = 0, micro_batches = 2;
  int64_t tag_stride = 2;
  std::vector<pl::Segment> segments;
};

struct Prog {
  std::string name;
  std::vector<V> values;
  std::vector<uint32_t> inputs, outputs;
  std::vector<std::string> input_names, output_names;
  std::vector<I> code;
  uint64_t top = 0; // bump allocator of arena offsets
  int32_t unrolled_micro_batches = 0;
  std::optional<Pipe> pipeline;
};

struct Par {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::F32;
  pl::Init init = pl::Init::NORMAL;
  double init_std = 0.02;
  int64_t weight = -1, grad = -1, master = -1, exp_avg = -1, exp_avg_sq = -1;
  DType grad_dtype = DType::F32;
  int64_t flat_offset = -1;
  int32_t ep_dim = -1;
  bool expert = false;
  int32_t tp_dim = -1, tp_blocks = 1;
};

// Rank.buckets.
struct Bk {
  std::vector<uint32_t> params;
  int64_t begin = 0, end = 0;
  int32_t group = 0;
  int64_t shard_offset = -1;
};

struct Kern {
  std::string name;
  std::vector<V> values;
  std::vector<I> code;
  uint64_t scratch = 0;
};

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

int64_t numel(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

uint64_t dtype_bytes(DType d) { return mt::rt::element_bytes(d); }

// 123456 -> "123,456", as the reader prints byte counts.
std::string grouped(uint64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return out;
}

struct PlanDesc {
  std::vector<Par> params;
  std::deque<Prog> programs; // stable references while programs are added
  std::vector<Kern> kernels;
  uint64_t state_bytes = 0, arena_bytes = 0;
  int32_t pipeline_parallel = 1, pp_rank = 0;
  // The plan's other parallel sizes (rank 0's table is the only one).
  int32_t tensor_parallel = 1, data_parallel = 1, expert_model_parallel = 1;
  int32_t expert_tensor_parallel = 1;
  std::vector<Bk> buckets;
  int64_t flat_elements = 0, shard_elements = 0, shard_exp_avg = -1, shard_exp_avg_sq = -1;
  bool distributed_optimizer = false;
  // A table per rank of the world (rank r: tp_rank r % tp, dp_rank r / tp;
  // pp 1), all alike; else rank 0's only.
  bool all_ranks = false;
  int64_t num_micro_batches = 0; // > 0: a training table with that many micro-batches
  // The training table's mixture-of-experts fields.
  int64_t moe_layers = 0;
  std::string moe_load_balancing_type;
  double moe_z_loss_coeff = 0;

  int64_t state_alloc(uint64_t bytes) {
    int64_t o = int64_t(state_bytes);
    state_bytes += round_up(bytes, 64);
    return o;
  }
  int param(const std::string &name, std::vector<int64_t> shape, pl::Init init = pl::Init::NORMAL,
            DType dtype = DType::F32, bool adam = false, bool master = false) {
    Par p;
    p.name = name;
    p.shape = shape;
    p.dtype = dtype;
    p.init = init;
    p.init_std = 0.5;
    uint64_t n = uint64_t(numel(shape));
    p.weight = state_alloc(n * dtype_bytes(dtype));
    p.grad = state_alloc(n * 4);
    if (master)
      p.master = state_alloc(n * 4);
    if (adam) {
      p.exp_avg = state_alloc(n * 4);
      p.exp_avg_sq = state_alloc(n * 4);
    }
    params.push_back(p);
    return int(params.size() - 1);
  }
  Prog &program(const std::string &name) {
    programs.emplace_back();
    programs.back().name = name;
    return programs.back();
  }
  uint32_t arena(Prog &p, const std::string &name, std::vector<int64_t> shape,
                 DType dtype = DType::F32) {
    V v{name, Region::ARENA, p.top, shape, dtype};
    p.top += round_up(uint64_t(numel(shape)) * dtype_bytes(dtype), 64);
    arena_bytes = std::max(arena_bytes, p.top);
    p.values.push_back(v);
    return uint32_t(p.values.size() - 1);
  }
  uint32_t input(Prog &p, const std::string &name, std::vector<int64_t> shape,
                 DType dtype = DType::F32) {
    uint32_t v = arena(p, name, shape, dtype);
    p.inputs.push_back(v);
    p.input_names.push_back(name);
    return v;
  }
  uint32_t weight(Prog &p, int param) {
    const Par &q = params[size_t(param)];
    p.values.push_back(V{q.name, Region::WEIGHT, uint64_t(param), q.shape, q.dtype});
    return uint32_t(p.values.size() - 1);
  }
  static void output(Prog &p, uint32_t v, const std::string &name) {
    p.outputs.push_back(v);
    p.output_names.push_back(name);
  }
  static void op(Prog &p, Opcode o, std::vector<uint32_t> in, std::vector<uint32_t> out,
                 std::vector<uint32_t> params = {}, std::vector<int64_t> ints = {},
                 std::vector<double> floats = {}, std::string where = "") {
    if (where.empty())
      where = "op" + std::to_string(p.code.size());
    p.code.push_back(I{o, in, out, params, ints, floats, where});
  }
};

std::string payload(const PlanDesc &d) {
  flatbuffers::FlatBufferBuilder b;
  auto values = [&](const std::vector<V> &vs) {
    std::vector<flatbuffers::Offset<pl::Value>> o;
    for (const V &v : vs)
      o.push_back(pl::CreateValueDirect(b, v.name.c_str(), v.region, v.offset, &v.shape, v.dtype,
                                        v.slots.empty() ? nullptr : &v.slots));
    return o;
  };
  auto code = [&](const std::vector<I> &is) {
    std::vector<flatbuffers::Offset<pl::Instruction>> o;
    for (const I &i : is)
      o.push_back(pl::CreateInstructionDirect(b, i.op, &i.in, &i.out, &i.params, &i.ints,
                                              &i.floats, i.where.c_str(), i.micro_batch, nullptr,
                                              i.runs_in));
    return o;
  };
  auto strings = [&](const std::vector<std::string> &ss) {
    std::vector<flatbuffers::Offset<flatbuffers::String>> o;
    for (const auto &s : ss)
      o.push_back(b.CreateString(s));
    return o;
  };
  std::vector<flatbuffers::Offset<pl::Program>> progs;
  for (const Prog &p : d.programs) {
    auto vs = values(p.values);
    auto is = code(p.code);
    auto in_names = strings(p.input_names), out_names = strings(p.output_names);
    flatbuffers::Offset<pl::PipelineSchedule> pipe;
    if (p.pipeline)
      pipe = pl::CreatePipelineScheduleDirect(b, p.pipeline->stages, p.pipeline->chunks,
                                              p.pipeline->rank, p.pipeline->micro_batches,
                                              p.pipeline->tag_stride, &p.pipeline->segments);
    progs.push_back(pl::CreateProgramDirect(b, p.name.c_str(), &vs, &p.inputs, &in_names,
                                            &p.outputs, &out_names, &is,
                                            p.unrolled_micro_batches, pipe));
  }
  std::vector<flatbuffers::Offset<pl::Param>> params;
  for (size_t i = 0; i < d.params.size(); ++i) {
    const Par &p = d.params[i];
    // Distinct init streams, as the compiler chooses them (one per name).
    params.push_back(pl::CreateParamDirect(b, p.name.c_str(), &p.shape, p.dtype, p.init,
                                           p.init_std, true, p.weight, p.grad, p.master,
                                           p.exp_avg, p.exp_avg_sq, 1000 + i, p.tp_dim, p.tp_blocks,
                                           p.flat_offset, -1, true, false, p.grad_dtype,
                                           p.ep_dim, p.expert));
  }
  std::vector<flatbuffers::Offset<pl::Kernel>> kernels;
  for (const Kern &k : d.kernels) {
    auto vs = values(k.values);
    auto is = code(k.code);
    kernels.push_back(pl::CreateKernelDirect(b, k.name.c_str(), "", nullptr, nullptr, 0, &vs,
                                             &is, k.scratch));
  }
  std::vector<flatbuffers::Offset<pl::Bucket>> buckets;
  for (const Bk &k : d.buckets)
    buckets.push_back(
        pl::CreateBucketDirect(b, &k.params, k.begin, k.end, k.group, k.shard_offset));
  std::vector<flatbuffers::Offset<pl::Rank>> ranks;
  const int32_t table_ranks =
      d.all_ranks ? d.tensor_parallel * d.pipeline_parallel * d.data_parallel : 1;
  for (int32_t r = 0; r < table_ranks; ++r)
    ranks.push_back(pl::CreateRankDirect(
        b, r, r % d.tensor_parallel, d.pp_rank, r / d.tensor_parallel, &params, d.state_bytes,
        d.arena_bytes, &progs, 0, d.buckets.empty() ? nullptr : &buckets, d.flat_elements,
        d.distributed_optimizer, d.shard_elements, -1, d.shard_exp_avg, d.shard_exp_avg_sq));
  flatbuffers::Offset<pl::Training> training;
  if (d.num_micro_batches > 0) {
    // Micro-batches of 2 sequences of 3 tokens, as the pipeline tests' tokens.
    const auto precision = b.CreateString("fp32");
    const auto balancing = b.CreateString(d.moe_load_balancing_type);
    pl::TrainingBuilder t(b);
    t.add_train_iters(1);
    t.add_micro_batch_size(2);
    t.add_global_batch_size(2 * d.num_micro_batches * d.data_parallel);
    t.add_num_micro_batches(d.num_micro_batches);
    t.add_seq_length(3);
    t.add_vocab_size(1);
    t.add_padded_vocab_size(1);
    t.add_log_interval(1);
    t.add_precision(precision);
    t.add_moe_layers(d.moe_layers);
    t.add_moe_load_balancing_type(balancing);
    t.add_moe_z_loss_coeff(d.moe_z_loss_coeff);
    training = t.Finish();
  }
  const int32_t world = d.tensor_parallel * d.pipeline_parallel * d.data_parallel;
  auto plan = pl::CreatePlanDirect(b, "mtc test", "", "", world, d.tensor_parallel,
                                   d.pipeline_parallel, d.data_parallel, training, &kernels,
                                   &ranks, d.expert_model_parallel,
                                   d.expert_tensor_parallel);
  pl::FinishPlanBuffer(b, plan);
  return std::string(reinterpret_cast<const char *>(b.GetBufferPointer()), b.GetSize());
}

std::string file_bytes(const PlanDesc &d) {
  std::string p = payload(d);
  return mt::rt::wrap_plan_payload(reinterpret_cast<const uint8_t *>(p.data()), p.size());
}

std::string open_error(std::string bytes) {
  std::string error;
  auto f = PlanFile::from_bytes(std::move(bytes), "tiny.plan", &error);
  EXPECT_EQ(f, nullptr);
  return error;
}

std::unique_ptr<PlanFile> open_ok(const PlanDesc &d) {
  std::string error;
  auto f = PlanFile::from_bytes(file_bytes(d), "tiny.plan", &error);
  EXPECT_NE(f, nullptr) << error;
  return f;
}

// Deterministic values in [-scale, scale).
void fill(float *x, int64_t n, uint64_t seed, double scale) {
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = float(scale * (double(s >> 11) / double(1ull << 53) * 2 - 1));
  }
}

// Independent reduced-precision rounding (round to nearest even; finite,
// normal-range values only).
float ref_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}
float ref_fp16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0xfffu + ((u >> 13) & 1u);
  u &= ~0x1fffu;
  std::memcpy(&x, &u, 4);
  return x;
}

// ---------------------------------------------------------------------------
// The tiny model: embedding -> layer_norm -> matmul -> bias_add -> gelu ->
// matmul with the embedding table (tied) -> cross_entropy, and its backward.

struct Tiny {
  static constexpr int B = 2, S = 3, Vocab = 11, H = 8;
  static constexpr double kEps = 1e-5;
  PlanDesc d;
  int table, lnw, lnb, w1, b1;
  std::vector<int32_t> tokens = {3, 7, 1, 10, 0, 7};
  std::vector<int32_t> labels = {7, 1, 10, 0, 5, 2};

  struct Fwd {
    uint32_t tokens, labels, wt, x0, x1, x2, x3, x4, logits, loss;
  };

  explicit Tiny(bool fused = false, DType w1_dtype = DType::F32) {
    table = d.param("embedding.word_embeddings.weight", {Vocab, H});
    lnw = d.param("decoder.final_layernorm.weight", {H}, pl::Init::ONES);
    lnb = d.param("decoder.final_layernorm.bias", {H}, pl::Init::ZEROS);
    w1 = d.param("decoder.mlp.linear_fc1.weight", {H, H}, pl::Init::NORMAL, w1_dtype);
    b1 = d.param("decoder.mlp.linear_fc1.bias", {H}, pl::Init::ZEROS);
    if (fused) {
      // bias_add + gelu as one kernel: x2, b -> x3, x4 through a scratch value.
      Kern k;
      k.name = "fused_bias_gelu";
      k.values = {V{"x", Region::ARENA, 0, {B, S, H}}, V{"b", Region::ARENA, 0, {H}},
                  V{"pre", Region::ARENA, 0, {B, S, H}}, V{"act", Region::ARENA, 0, {B, S, H}},
                  V{"t", Region::ARENA, 64, {B, S, H}}};
      k.code = {I{Opcode::BIAS_ADD, {0, 1}, {4}, {}, {}, {}, "bias"},
                I{Opcode::RESHAPE, {4}, {2}, {}, {}, {}, "copy"},
                I{Opcode::GELU, {4}, {3}, {}, {0}, {}, "gelu"}};
      k.scratch = 64 + B * S * H * 4;
      d.kernels.push_back(k);
    }
    Prog &eval = d.program("eval_step");
    Fwd f = forward(eval, fused);
    PlanDesc::output(eval, f.loss, "loss");

    Prog &train = d.program("train_step");
    Fwd t = forward(train, fused);
    PlanDesc::output(train, t.loss, "loss");
    backward(train, t);
  }

  Fwd forward(Prog &p, bool fused) {
    Fwd f;
    f.tokens = d.input(p, "tokens", {B, S}, DType::I32);
    f.labels = d.input(p, "labels", {B, S}, DType::I32);
    f.wt = d.weight(p, table);
    uint32_t wlnw = d.weight(p, lnw), wlnb = d.weight(p, lnb), ww1 = d.weight(p, w1),
             wb1 = d.weight(p, b1);
    f.x0 = d.arena(p, "x0", {B, S, H});
    f.x1 = d.arena(p, "x1", {B, S, H});
    f.x2 = d.arena(p, "x2", {B, S, H});
    f.x3 = d.arena(p, "x3", {B, S, H});
    f.x4 = d.arena(p, "x4", {B, S, H});
    f.logits = d.arena(p, "logits", {B, S, Vocab});
    f.loss = d.arena(p, "loss", {});
    PlanDesc::op(p, Opcode::EMBEDDING, {f.wt, f.tokens}, {f.x0}, {}, {0}, {}, "embedding");
    PlanDesc::op(p, Opcode::LAYER_NORM, {f.x0, wlnw, wlnb}, {f.x1}, {}, {}, {kEps, 0.0}, "final_layernorm");
    PlanDesc::op(p, Opcode::MATMUL, {f.x1, ww1}, {f.x2}, {}, {}, {}, "mlp.linear_fc1");
    if (fused) {
      PlanDesc::op(p, Opcode::FUSED, {f.x2, wb1}, {f.x3, f.x4}, {}, {0}, {}, "mlp fused");
    } else {
      PlanDesc::op(p, Opcode::BIAS_ADD, {f.x2, wb1}, {f.x3}, {}, {}, {}, "mlp.linear_fc1 bias");
      PlanDesc::op(p, Opcode::GELU, {f.x3}, {f.x4}, {}, {0}, {}, "mlp gelu");
    }
    PlanDesc::op(p, Opcode::MATMUL, {f.x4, f.wt}, {f.logits}, {}, {}, {}, "output_layer (tied)");
    PlanDesc::op(p, Opcode::CROSS_ENTROPY, {f.logits, f.labels}, {f.loss}, {}, {0}, {}, "loss");
    return f;
  }

  void backward(Prog &p, const Fwd &f) {
    uint32_t wlnw = d.weight(p, lnw), ww1 = d.weight(p, w1);
    uint32_t dloss = d.arena(p, "dloss", {});
    uint32_t dlogits = d.arena(p, "dlogits", {B, S, Vocab});
    uint32_t dx4 = d.arena(p, "dx4", {B, S, H}), dx3 = d.arena(p, "dx3", {B, S, H});
    uint32_t dx1 = d.arena(p, "dx1", {B, S, H}), dx0 = d.arena(p, "dx0", {B, S, H});
    auto P = [](int i) { return uint32_t(i); };
    PlanDesc::op(p, Opcode::GRAD_SEED, {}, {dloss}, {}, {}, {1.0}, "loss grad");
    PlanDesc::op(p, Opcode::CROSS_ENTROPY_GRAD, {f.logits, f.labels, dloss}, {dlogits}, {}, {0});
    PlanDesc::op(p, Opcode::MATMUL_INPUT_GRAD, {dlogits, f.wt}, {dx4});
    PlanDesc::op(p, Opcode::MATMUL_WEIGHT_GRAD, {dlogits, f.x4}, {}, {P(table)});
    PlanDesc::op(p, Opcode::GELU_GRAD, {dx4, f.x3}, {dx3}, {}, {0});
    PlanDesc::op(p, Opcode::BIAS_GRAD, {dx3}, {}, {P(b1)});
    PlanDesc::op(p, Opcode::MATMUL_INPUT_GRAD, {dx3, ww1}, {dx1});
    PlanDesc::op(p, Opcode::MATMUL_WEIGHT_GRAD, {dx3, f.x1}, {}, {P(w1)});
    PlanDesc::op(p, Opcode::LAYER_NORM_GRAD, {dx1, f.x0, wlnw}, {dx0}, {P(lnw), P(lnb)}, {}, {kEps, 0.0});
    PlanDesc::op(p, Opcode::EMBEDDING_GRAD, {dx0, f.tokens}, {}, {P(table)}, {0});
  }
};

// The tiny model in double precision with naive loops, forward and backward
// written out by hand: weights and gradients indexed like Tiny's parameters.
struct RefTiny {
  static constexpr int B = Tiny::B, S = Tiny::S, Vocab = Tiny::Vocab, H = Tiny::H, N = B * S;
  std::vector<double> w[5]; // table, lnw, lnb, w1, b1

  static double gelu(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
  static double gelu_grad(double x) {
    return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
  }

  double run(const std::vector<int32_t> &tok, const std::vector<int32_t> &lab,
             std::vector<double> *g /* [5], += */) const {
    const auto &T = w[0], &lw = w[1], &lb = w[2], &W1 = w[3], &b = w[4];
    std::vector<double> x0(N * H), xhat(N * H), x1(N * H), x3(N * H), x4(N * H), rstd(N),
        logits(N * Vocab);
    for (int r = 0; r < N; ++r) {
      double mu = 0, var = 0;
      for (int h = 0; h < H; ++h)
        mu += (x0[r * H + h] = T[tok[r] * H + h]);
      mu /= H;
      for (int h = 0; h < H; ++h)
        var += (x0[r * H + h] - mu) * (x0[r * H + h] - mu);
      rstd[r] = 1 / std::sqrt(var / H + Tiny::kEps);
      for (int h = 0; h < H; ++h) {
        xhat[r * H + h] = (x0[r * H + h] - mu) * rstd[r];
        x1[r * H + h] = xhat[r * H + h] * lw[h] + lb[h];
      }
      for (int o = 0; o < H; ++o) {
        double s = b[o];
        for (int i = 0; i < H; ++i)
          s += x1[r * H + i] * W1[o * H + i];
        x3[r * H + o] = s;
        x4[r * H + o] = gelu(s);
      }
      for (int v = 0; v < Vocab; ++v) {
        double s = 0;
        for (int h = 0; h < H; ++h)
          s += x4[r * H + h] * T[v * H + h];
        logits[r * Vocab + v] = s;
      }
    }
    double loss = 0;
    std::vector<double> p(N * Vocab);
    for (int r = 0; r < N; ++r) {
      double m = -1e300, z = 0;
      for (int v = 0; v < Vocab; ++v)
        m = std::max(m, logits[r * Vocab + v]);
      for (int v = 0; v < Vocab; ++v)
        z += std::exp(logits[r * Vocab + v] - m);
      loss += m + std::log(z) - logits[r * Vocab + lab[r]];
      for (int v = 0; v < Vocab; ++v)
        p[r * Vocab + v] = std::exp(logits[r * Vocab + v] - m) / z;
    }
    loss /= N;
    if (!g)
      return loss;
    auto &gT = g[0], &glw = g[1], &glb = g[2], &gW1 = g[3], &gb = g[4];
    for (int r = 0; r < N; ++r) {
      std::vector<double> dl(Vocab), dx4(H, 0), dx3(H), dx1(H, 0), dxhat(H);
      for (int v = 0; v < Vocab; ++v)
        dl[v] = (p[r * Vocab + v] - (v == lab[r] ? 1 : 0)) / N;
      for (int v = 0; v < Vocab; ++v)
        for (int h = 0; h < H; ++h) {
          dx4[h] += dl[v] * T[v * H + h];
          gT[v * H + h] += dl[v] * x4[r * H + h];
        }
      for (int o = 0; o < H; ++o) {
        dx3[o] = dx4[o] * gelu_grad(x3[r * H + o]);
        gb[o] += dx3[o];
        for (int i = 0; i < H; ++i) {
          dx1[i] += dx3[o] * W1[o * H + i];
          gW1[o * H + i] += dx3[o] * x1[r * H + i];
        }
      }
      double m1 = 0, m2 = 0;
      for (int h = 0; h < H; ++h) {
        glw[h] += dx1[h] * xhat[r * H + h];
        glb[h] += dx1[h];
        dxhat[h] = dx1[h] * lw[h];
        m1 += dxhat[h] / H;
        m2 += dxhat[h] * xhat[r * H + h] / H;
      }
      for (int h = 0; h < H; ++h)
        gT[tok[r] * H + h] += rstd[r] * (dxhat[h] - m1 - xhat[r * H + h] * m2);
    }
    return loss;
  }
};

// Sets a Tiny plan's weights to fixed values in the executor and the reference.
void set_weights(CpuExecutor &ex, const Tiny &t, RefTiny &ref) {
  const int params[5] = {t.table, t.lnw, t.lnb, t.w1, t.b1};
  const double scales[5] = {1.0, 0.5, 0.3, 0.6, 0.4};
  for (int k = 0; k < 5; ++k) {
    int64_t n = ex.param_elements(params[k]);
    float *w = ex.weight(params[k]);
    fill(w, n, uint64_t(k + 1), scales[k]);
    if (k == 1)
      for (int64_t i = 0; i < n; ++i)
        w[i] += 1.0f; // LayerNorm weights near 1
    ref.w[k].assign(w, w + n);
  }
}

void write_ids(CpuExecutor &ex, const pl::Program &p, uint32_t v, const std::vector<int32_t> &ids) {
  std::memcpy(ex.value_data(p, v), ids.data(), ids.size() * 4);
}

uint32_t find_value(const pl::Program &p, const std::string &name) {
  for (uint32_t i = 0; i < p.values()->size(); ++i)
    if (const auto *n = p.values()->Get(i)->name(); n && n->str() == name)
      return i;
  ADD_FAILURE() << "no value " << name;
  return 0;
}

float run_loss(CpuExecutor &ex, const pl::Program &p, const std::vector<int32_t> &tokens,
               const std::vector<int32_t> &labels, uint64_t rng_offset = 0) {
  write_ids(ex, p, find_value(p, "tokens"), tokens);
  write_ids(ex, p, find_value(p, "labels"), labels);
  std::string err = ex.run(p, rng_offset);
  EXPECT_EQ(err, "");
  return *static_cast<float *>(ex.value_data(p, p.outputs()->Get(0)));
}

// ---------------------------------------------------------------------------
// Reader

TEST(PlanReader, ValidPlanOpensFromBytesAndFromFile) {
  Tiny t;
  auto f = open_ok(t.d);
  ASSERT_NE(f, nullptr);
  const pl::Rank *r = mt::rt::find_rank(*f->plan(), 0);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->programs()->size(), 2u);
  EXPECT_EQ(r->params()->size(), 5u);
  EXPECT_EQ(mt::rt::find_rank(*f->plan(), 1), nullptr);

  char dir[] = "/tmp/mt-plan-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string path = std::string(dir) + "/tiny.plan";
  {
    std::ofstream out(path, std::ios::binary);
    std::string bytes = file_bytes(t.d);
    out.write(bytes.data(), std::streamsize(bytes.size()));
  }
  std::string error;
  auto g = PlanFile::open(path, &error);
  EXPECT_NE(g, nullptr) << error;
  EXPECT_EQ(PlanFile::open(std::string(dir) + "/missing.plan", &error), nullptr);
  EXPECT_CONTAINS(error, "missing.plan: error: cannot open");
  std::remove(path.c_str());
  rmdir(dir);
}

TEST(PlanReader, HeaderLayout) {
  const uint8_t body[3] = {1, 2, 3};
  std::string h = mt::rt::wrap_plan_payload(body, 3);
  ASSERT_EQ(h.size(), 35u);
  EXPECT_EQ(h.substr(0, 8), std::string("MTPLAN\0\0", 8));
  uint32_t version, flags;
  uint64_t size, sum;
  std::memcpy(&version, &h[8], 4);
  std::memcpy(&flags, &h[12], 4);
  std::memcpy(&size, &h[16], 8);
  std::memcpy(&sum, &h[24], 8);
  EXPECT_EQ(version, mt::rt::kPlanFormatVersion);
  EXPECT_EQ(flags, 0u);
  EXPECT_EQ(size, 3u);
  // 64-bit FNV-1a: the empty input hashes to the offset basis, "a" to a
  // published test vector.
  EXPECT_EQ(mt::rt::plan_checksum(nullptr, 0), 0xcbf29ce484222325ull);
  const uint8_t a = 'a';
  EXPECT_EQ(mt::rt::plan_checksum(&a, 1), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(sum, mt::rt::plan_checksum(body, 3));
}

TEST(PlanReader, TruncatedFiles) {
  Tiny t;
  std::string full = file_bytes(t.d);
  EXPECT_CONTAINS(open_error(""), "tiny.plan: error: is empty");
  EXPECT_CONTAINS(open_error(full.substr(0, 5)), "tiny.plan: error: is truncated");
  EXPECT_CONTAINS(open_error(full.substr(0, 20)),
                  "is truncated: the file has 20 bytes, fewer than the 32-byte header");
  size_t payload = full.size() - 32;
  for (size_t keep : {size_t(0), size_t(1), payload / 2, payload - 1}) {
    std::string e = open_error(full.substr(0, 32 + keep));
    EXPECT_CONTAINS(e, "tiny.plan: error: is truncated: header says ");
    EXPECT_CONTAINS(e, " payload bytes, file has " + grouped(keep) + ";");
    EXPECT_CONTAINS(e, "recompile it");
  }
  // Thousands are grouped as the message promises.
  std::string big = full.substr(0, 32);
  uint64_t claimed = 123456;
  std::memcpy(&big[16], &claimed, 8);
  big += std::string(1024, '\0');
  EXPECT_CONTAINS(open_error(big), "is truncated: header says 123,456 payload bytes, file has 1,024; recompile it");
  EXPECT_CONTAINS(open_error(full + "xx"), "is corrupt: header says");
}

TEST(PlanReader, CorruptPayloadFailsTheChecksum) {
  Tiny t;
  std::string bytes = file_bytes(t.d);
  for (size_t at : {size_t(32), bytes.size() / 2, bytes.size() - 1}) {
    std::string b = bytes;
    b[at] = char(b[at] ^ 0x10);
    EXPECT_EQ(open_error(b), "tiny.plan: error: is corrupt: checksum mismatch; recompile it with `mtc compile`");
  }
}

TEST(PlanReader, BadMagicVersionAndFlags) {
  Tiny t;
  std::string bytes = file_bytes(t.d);
  std::string b = bytes;
  b[0] = 'X';
  EXPECT_EQ(open_error(b), "tiny.plan: error: not an mt plan (the file does not start with MTPLAN); "
                           "pass the file written by `mtc compile -o`");
  EXPECT_CONTAINS(open_error("GPT2 weights, not a plan at all"), "not an mt plan");

  b = bytes;
  uint32_t older = 9;
  std::memcpy(&b[8], &older, 4);
  EXPECT_EQ(open_error(b), "tiny.plan: error: was written by plan format version 9; this mtrun reads "
                           "version " + std::to_string(mt::rt::kPlanFormatVersion) +
                               "; recompile it with the mtc that matches this mtrun");
  b = bytes;
  uint32_t flags = 4;
  std::memcpy(&b[12], &flags, 4);
  EXPECT_CONTAINS(open_error(b), "has header flags 0x4");
}

TEST(PlanReader, PayloadThatIsNotAPlan) {
  // A well-formed header around bytes that are not an mt plan FlatBuffer.
  std::string junk(64, '\x5a');
  std::string b = mt::rt::wrap_plan_payload(reinterpret_cast<const uint8_t *>(junk.data()), junk.size());
  EXPECT_CONTAINS(open_error(b), "the payload is not an mt plan FlatBuffer (file identifier is not MTPL)");

  // The right identifier, but a root offset pointing outside the buffer.
  Tiny t;
  std::string p = payload(t.d);
  uint32_t far = uint32_t(p.size() + 1000);
  std::memcpy(&p[0], &far, 4);
  b = mt::rt::wrap_plan_payload(reinterpret_cast<const uint8_t *>(p.data()), p.size());
  EXPECT_CONTAINS(open_error(b), "the payload fails FlatBuffers verification");
}

TEST(PlanReader, MutatedPayloadsAreRejectedOrVerifiedNeverTrusted) {
  // Random byte changes behind a valid header and checksum: the reader must
  // answer every one with a plan or an error line, reading nothing out of
  // bounds (the sanitizer builds watch this).
  Tiny t(true);
  const std::string base = payload(t.d);
  uint64_t s = 12345;
  auto next = [&]() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return s >> 33;
  };
  int rejected = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string p = base;
    for (int k = 0, n = 1 + int(next() % 4); k < n; ++k)
      p[next() % p.size()] = char(next());
    std::string error;
    auto f = PlanFile::from_bytes(
        mt::rt::wrap_plan_payload(reinterpret_cast<const uint8_t *>(p.data()), p.size()),
        "fuzz.plan", &error);
    if (!f) {
      ++rejected;
      EXPECT_EQ(error.rfind("fuzz.plan: error: ", 0), 0u) << error;
      EXPECT_EQ(error.find('\n'), std::string::npos) << error;
      continue;
    }
    // What passes verification is safe to execute (inputs zeroed: token 0
    // is in every vocabulary); errors are fine, stray accesses are not.
    const pl::Rank &r = *f->plan()->ranks()->Get(0);
    if (r.arena_bytes() > (1u << 20) || r.state_bytes() > (1u << 20))
      continue;
    CpuExecutor ex(*f->plan(), r.rank());
    EXPECT_EQ(ex.load_error(), "");
    ex.init_params(1);
    for (size_t i = 0; i < (r.programs() ? r.programs()->size() : 0); ++i) {
      // The program as the executor runs it (a pipelined step expanded).
      const pl::Program *prog = ex.program(r.programs()->Get(uint32_t(i))->name()->str());
      if (!prog)
        continue;
      for (size_t k = 0; k < (prog->inputs() ? prog->inputs()->size() : 0); ++k) {
        const uint32_t v = prog->inputs()->Get(uint32_t(k));
        const pl::Value &val = *prog->values()->Get(v);
        const size_t width = val.dtype() == DType::I64 ? 8 : 4; // floats are f32 on the CPU
        std::memset(ex.value_data(*prog, v), 0, size_t(mt::rt::element_count(val)) * width);
      }
      ex.run(*prog, 0);
    }
  }
  EXPECT_GT(rejected, 100);
}

std::string semantic_error(const PlanDesc &d) { return open_error(file_bytes(d)); }

// A compact pipelined train_step (Program.pipeline): stage 0 of two, two
// micro-batches. The forward embeds the tokens into x and sends x on; the
// backward receives x's gradient and accumulates the table's gradient, which
// reads the tokens again: the tokens and x outlive their segments and have a
// slot per micro-batch.
struct PipeStage {
  PlanDesc d;
  int table;
  uint32_t tokens, wt, x, dx;
  PipeStage() {
    d.pipeline_parallel = 2;
    d.num_micro_batches = 2;
    table = d.param("embedding.word_embeddings.weight", {11, 8});
    Prog &p = d.program("train_step");
    tokens = slotted(p, d.input(p, "tokens", {2, 3}, DType::I32));
    wt = d.weight(p, table);
    x = slotted(p, d.arena(p, "x", {2, 3, 8}));
    dx = d.arena(p, "dx", {2, 3, 8});
    PlanDesc::op(p, Opcode::EMBEDDING, {wt, tokens}, {x}, {}, {0}, {}, "embedding");
    PlanDesc::op(p, Opcode::SEND, {x}, {}, {}, {1, 0}, {}, "send x");
    PlanDesc::op(p, Opcode::RECV, {}, {dx}, {}, {1, 1}, {}, "receive dx");
    PlanDesc::op(p, Opcode::EMBEDDING_GRAD, {dx, tokens}, {}, {uint32_t(table)}, {0}, {},
                 "embedding grad");
    Pipe pipe;
    pipe.segments = {pl::Segment(0, 2, 0, true, pl::SegmentPart::ALL),
                     pl::Segment(2, 4, 0, false, pl::SegmentPart::ALL)};
    p.pipeline = pipe;
  }
  Prog &train() { return d.programs[0]; }
  // A second arena copy of value v, as its slot 1.
  uint32_t slotted(Prog &p, uint32_t v) {
    V &val = p.values[v];
    val.slots = {val.offset, p.top};
    p.top += round_up(uint64_t(numel(val.shape)) * dtype_bytes(val.dtype), 64);
    d.arena_bytes = std::max(d.arena_bytes, p.top);
    return v;
  }
};

TEST(PlanReader, CompactPipelineStepOpensAndExpands) {
  PipeStage t;
  auto f = open_ok(t.d);
  ASSERT_NE(f, nullptr);
  const pl::Rank &r = *f->plan()->ranks()->Get(0);
  EXPECT_EQ(mt::rt::gpu_micro_batch_slots(r), 2u);
  CpuExecutor ex(*f->plan(), 0);
  EXPECT_EQ(ex.load_error(), "");
  // The executor runs the expansion: F0 F1 B0 B1 on stage 0 of 2.
  const pl::Program *p = ex.program("train_step");
  ASSERT_NE(p, nullptr);
  EXPECT_NE(p, r.programs()->Get(0));
  EXPECT_EQ(p->unrolled_micro_batches(), 2);
  ASSERT_EQ(p->instructions()->size(), 8u);
  const char *order[8] = {"embedding", "send x", "embedding", "send x",
                          "receive dx", "embedding grad", "receive dx", "embedding grad"};
  const int32_t mbs[8] = {0, 0, 1, 1, 0, 0, 1, 1};
  for (uint32_t i = 0; i < 8; ++i) {
    EXPECT_EQ(p->instructions()->Get(i)->where()->str(), order[i]) << i;
    EXPECT_EQ(p->instructions()->Get(i)->micro_batch(), mbs[i]) << i;
  }
  EXPECT_EQ(p->instructions()->Get(3)->ints()->Get(1), 2); // tag 0 + 1 x stride 2
  ASSERT_EQ(p->input_names()->size(), 2u);
  EXPECT_EQ(p->input_names()->Get(1)->str(), "tokens.1");
  // Micro-batch 1's tokens: their own bytes in the arena.
  EXPECT_NE(ex.value_data(*p, p->inputs()->Get(1)), ex.value_data(*p, p->inputs()->Get(0)));
  EXPECT_NE(ex.value_data(*p, p->inputs()->Get(1)), nullptr);
}

TEST(PlanReader, CompactPipelineStepErrors) {
  const std::string prefix = "tiny.plan: error: rank 0, program train_step";
  for (auto [change, message] :
       std::vector<std::pair<std::function<void(PipeStage &)>, std::string>>{
           {[](PipeStage &t) {
              t.d.programs[0].name = "eval_step";
            },
            "tiny.plan: error: rank 0, program eval_step has a pipeline schedule; only "
            "train_step may"},
           {[](PipeStage &t) { t.train().pipeline->stages = 3; },
            prefix + ": pipeline.stages 3 is not the plan's pipeline_parallel 2"},
           {[](PipeStage &t) { t.train().pipeline->rank = 1; },
            prefix + ": pipeline.rank 1 is not rank 0's pipeline rank 0"},
           {[](PipeStage &t) { t.train().pipeline->micro_batches = 4; },
            prefix + ": pipeline.micro_batches 4 is not training.num_micro_batches 2"},
           {[](PipeStage &t) { t.d.num_micro_batches = 0; },
            prefix + " has a pipeline schedule but the plan has no training table (its "
                     "num_micro_batches)"},
           {[](PipeStage &t) { t.train().pipeline->chunks = 0; },
            prefix + ": pipeline.chunks 0 is below 1"},
           {[](PipeStage &t) { t.train().pipeline->tag_stride = -1; },
            prefix + ": pipeline.tag_stride -1 is negative"},
           {[](PipeStage &t) { t.train().unrolled_micro_batches = 2; },
            prefix + ": unrolled_micro_batches 2 beside a pipeline schedule; a compact "
                     "train_step is one micro-batch's (0)"},
           {[](PipeStage &t) {
              t.train().pipeline->segments[1] = pl::Segment(3, 4, 0, false, pl::SegmentPart::ALL);
            },
            prefix + ": pipeline.segments[1] begins at instruction 3; it must begin where "
                     "segments[0] ends (2)"},
           {[](PipeStage &t) {
              t.train().pipeline->segments[1] = pl::Segment(2, 3, 0, false, pl::SegmentPart::ALL);
            },
            prefix + ": pipeline.segments cover instructions 0 to 3, but the program has 4; "
                     "every instruction needs its segment"},
           {[](PipeStage &t) {
              t.train().pipeline->segments[1] = pl::Segment(2, 4, 0, true, pl::SegmentPart::ALL);
            },
            prefix + ": pipeline: segments 0 and 1 are the same part of the same step"},
           {[](PipeStage &t) {
              t.train().pipeline->segments[1] = pl::Segment(2, 4, 0, false, pl::SegmentPart::SEND);
            },
            prefix + ": pipeline: segment 1 splits a 1F1B step into exchanges"},
           {[](PipeStage &t) { t.train().values[t.tokens].slots.pop_back(); },
            prefix + ": input 0 (%tokens) has 1 slot_offsets; a pipelined train_step's inputs "
                     "and outputs need one per micro-batch (pipeline.micro_batches 2)"},
           {[](PipeStage &t) { t.train().values[t.wt].slots = {0, 1}; },
            prefix + ": value 1 (%embedding.word_embeddings.weight) has slot_offsets but is not "
                     "an arena value"},
           {[](PipeStage &t) { t.train().values[t.x].slots[0] = 64; },
            prefix + ": value 2 (%x) has slot_offsets[0] 64, not its offset 128"},
           {[](PipeStage &t) { t.train().values[t.x].slots[1] = 1u << 20; },
            prefix + ": value 2 (%x) slot_offsets[1] 1,048,576 with 192 bytes ends past "
                     "arena_bytes 704"},
           {[](PipeStage &t) { t.train().values[t.x].slots[1] += 2; },
            prefix + ": value 2 (%x) slot_offsets[1] 322 is not aligned to its 4-byte "
                     "elements"},
           {[](PipeStage &t) { t.train().code[1].micro_batch = 0; },
            prefix + ": #1 (send x) SEND: micro_batch 0 in a pipelined train_step, whose "
                     "instructions run for every micro-batch (-1)"},
           {[](PipeStage &t) { t.train().code[1].runs_in = pl::MicroBatches(7); },
            prefix + ": #1 (send x) SEND: unknown runs_in code 7"},
       }) {
    PipeStage t;
    change(t);
    const std::string e = semantic_error(t.d);
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    EXPECT_EQ(e.substr(0, e.find("; recompile")), message);
  }
  {
    Tiny t; // FIRST and LAST belong to a pipelined train_step
    t.d.programs[1].code[4].runs_in = pl::MicroBatches::LAST;
    EXPECT_CONTAINS(semantic_error(t.d),
                    "tiny.plan: error: rank 0, program train_step #4 (mlp gelu) GELU: "
                    "runs_in LAST outside a pipelined train_step (Program.pipeline); it runs "
                    "every time");
  }
  {
    Tiny t; // slots, likewise
    t.d.programs[0].values[7].slots = {t.d.programs[0].values[7].offset};
    EXPECT_CONTAINS(semantic_error(t.d),
                    "tiny.plan: error: rank 0, program eval_step: value 7 (%x0) has slot_offsets "
                    "outside a pipelined train_step (Program.pipeline)");
  }
  {
    Tiny t(true); // and neither in a kernel
    t.d.kernels[0].code[0].runs_in = pl::MicroBatches::FIRST;
    EXPECT_CONTAINS(semantic_error(t.d), "runs_in FIRST in a kernel's cpu_instructions");
  }
}

TEST(PlanReader, SemanticErrors) {
  {
    Tiny t; // MATMUL with one input
    t.d.programs[1].code[2].in.pop_back();
    EXPECT_EQ(semantic_error(t.d),
              "tiny.plan: error: rank 0, program train_step #2 (mlp.linear_fc1) MATMUL: has 1 "
              "inputs, its signature has 2; recompile it with `mtc compile` (if the same mtc "
              "wrote it, report an mtc bug)");
  }
  for (auto [unrolled, microBatch, message] :
       {std::tuple<int32_t, int32_t, const char *>{
            0, 1, "program train_step #2 (mlp.linear_fc1) MATMUL: micro_batch 1 in a program of "
                  "one micro-batch (unrolled_micro_batches 0)"},
        {2, 2, "program train_step #2 (mlp.linear_fc1) MATMUL: micro_batch 2 in a schedule "
               "unrolled over 2 micro-batches"},
        {-1, -1, "program train_step: unrolled_micro_batches -1 is outside 0 to 65536"}}) {
    Tiny t; // an instruction's micro-batch that the program's schedule does not have
    t.d.programs[1].unrolled_micro_batches = unrolled;
    t.d.programs[1].code[2].micro_batch = microBatch;
    EXPECT_CONTAINS(semantic_error(t.d), message);
  }
  {
    Tiny t; // bf16 gradients of an f32 parameter (--grad-reduce-in-bf16 needs bf16 ones)
    t.d.params[size_t(t.w1)].grad_dtype = DType::BF16;
    EXPECT_CONTAINS(semantic_error(t.d),
                    "rank 0: parameter 3 (decoder.mlp.linear_fc1.weight) has grad_dtype bf16; "
                    "gradients are f32, or bf16 for a bf16 parameter (--grad-reduce-in-bf16)");
  }
  {
    Tiny t(false, DType::BF16); // one bf16 gradient among f32 ones
    t.d.params[size_t(t.w1)].grad_dtype = DType::BF16;
    EXPECT_CONTAINS(semantic_error(t.d),
                    "rank 0: parameter 3 (decoder.mlp.linear_fc1.weight) has grad_dtype bf16, but "
                    "parameter 0 has f32; a rank's gradients share one type");
  }
  {
    Tiny t; // an unknown opcode
    t.d.programs[0].code[1].op = Opcode(200);
    EXPECT_CONTAINS(semantic_error(t.d), "rank 0, program eval_step #1 (final_layernorm) opcode 200: "
                                         "unknown opcode; this mtrun knows opcodes 0 to 60");
  }
  for (auto [group, scale, message] :
       {std::tuple<int64_t, double, const char *>{
            2, 0.5, "ALL_REDUCE_GRADS: ints[0] is group 2; gradients are reduced over group 0 "
                    "(dp), 1 (tp) or 6 (expt_dp)"},
        {1, 0.5, "ALL_REDUCE_GRADS: reduces over tensor-parallel ranks, but the plan has "
                 "tensor_parallel 1"},
        {0, 2.0, "ALL_REDUCE_GRADS: floats[0] (scale) is 2.000000, outside (0, 1]"},
        {0, 0.5, "ALL_REDUCE_GRADS: reduces over data-parallel ranks, but the plan has "
                 "data_parallel 1"}}) {
    Tiny t; // a gradient all-reduce that cannot run
    t.d.programs[0].code.push_back(I{Opcode::ALL_REDUCE_GRADS, {}, {}, {}, {group}, {scale}, "dp"});
    EXPECT_CONTAINS(semantic_error(t.d), message);
  }
  for (auto [ins, message] :
       {std::pair<I, const char *>{
            I{Opcode::REDUCE_GRADS, {}, {}, {}, {0, 0, 0}, {0.5}, "dp"},
            "REDUCE_GRADS: names bucket 0, but rank 0 has 0 buckets"},
        {I{Opcode::SHARDED_GRAD_NORM, {}, {}, {}, {0}, {}, "dp"}, "SHARDED_GRAD_NORM: has 0 outputs"},
        {I{Opcode::ALL_GATHER_PARAMS, {}, {}, {}, {1, 0}, {}, "dp"},
         "ALL_GATHER_PARAMS: ints[0] is group 1; this mtrun knows group 0 (dp) and 6 (expt_dp)"},
        {I{Opcode::ALL_GATHER_PARAMS, {}, {}, {}, {0, 3}, {}, "dp"},
         "ALL_GATHER_PARAMS: names bucket 3, but rank 0 has 0 buckets"}}) {
    Tiny t; // bucket and shard instructions of a plan without buckets
    t.d.programs[0].code.push_back(ins);
    EXPECT_CONTAINS(semantic_error(t.d), message);
  }
  for (auto [op, group, message] :
       {std::tuple<Opcode, int64_t, const char *>{
            Opcode::ALL_REDUCE, 1,
            "ALL_REDUCE: exchanges activations between tensor-parallel ranks, but the plan has "
            "tensor_parallel 1"},
        {Opcode::SEQ_ALL_GATHER, 0,
         "SEQ_ALL_GATHER: ints[0] is group 0; activations are exchanged within group 1 (tp)"},
        {Opcode::SEQ_REDUCE_SCATTER, 1, "SEQ_REDUCE_SCATTER: exchanges activations between"},
        {Opcode::SEQ_SPLIT, 1, "SEQ_SPLIT: exchanges activations between"}}) {
    Tiny t; // tensor-parallel exchanges in a plan of one tensor-parallel rank
    Prog &p = t.d.programs[0];
    uint32_t x0 = 0;
    while (p.values[x0].name != "x0")
      ++x0;
    uint32_t y = t.d.arena(p, "y", {Tiny::B, Tiny::S, Tiny::H});
    p.code.push_back(I{op, {x0}, {y}, {}, {group}, {}, "tp"});
    EXPECT_CONTAINS(semantic_error(t.d), message);
  }
  for (auto [flag, message] :
       {std::pair<int64_t, const char *>{
            1, "EMBEDDING: is vocab parallel, but the plan has tensor_parallel 1"},
        {2, "EMBEDDING: ints[0] (vocab_parallel) is 2; it must be 0 or 1"}}) {
    Tiny t; // a vocab-parallel embedding without tensor-parallel ranks
    t.d.programs[0].code[0].ints = {flag};
    EXPECT_CONTAINS(semantic_error(t.d), message);
  }
  for (auto [lseShape, lseType, message] :
       {std::tuple<std::vector<int64_t>, DType, const char *>{
            {Tiny::B, Tiny::S, 2}, DType::F32,
            "ATTENTION: needs q[b, s, heads, d], k and v [b, s, groups, d] with groups dividing "
            "heads -> o shaped as q, lse[b, heads, s], got"},
        {{Tiny::B, 2, Tiny::S}, DType::BF16, "ATTENTION: out[1] (%lse [2,2,3] bf16) must be an f32 tensor"}}) {
    Tiny t; // attention whose log-sum-exp is not f32 [b, heads, s]
    Prog &p = t.d.programs[0];
    uint32_t x0 = 0;
    while (p.values[x0].name != "x0")
      ++x0;
    const uint32_t q = t.d.arena(p, "q", {Tiny::B, Tiny::S, 2, Tiny::H / 2});
    const uint32_t o = t.d.arena(p, "o", {Tiny::B, Tiny::S, 2, Tiny::H / 2});
    const uint32_t lse = t.d.arena(p, "lse", lseShape, lseType);
    p.code.push_back(I{Opcode::RESHAPE, {x0}, {q}, {}, {}, {}, "heads"});
    p.code.push_back(
        I{Opcode::ATTENTION, {q, q, q}, {o, lse}, {}, {1, 1, -1}, {0.5, 0.0}, "attention"});
    EXPECT_CONTAINS(semantic_error(t.d), message);
  }
  {
    Tiny t; // a send to a pipeline stage the plan does not have
    Prog &p = t.d.programs[0];
    uint32_t x0 = 0;
    while (p.values[x0].name != "x0")
      ++x0;
    p.code.insert(p.code.begin() + 1, I{Opcode::SEND, {x0}, {}, {}, {1, 0}, {}, "send"});
    EXPECT_CONTAINS(semantic_error(t.d), "SEND: ints[0] is pipeline rank 1, but rank 0 is "
                                         "pipeline rank 0 of 1; the peer must be another of them");
  }
  {
    Tiny t; // GELU without its tanh flag
    t.d.programs[0].code[4].ints.clear();
    EXPECT_CONTAINS(semantic_error(t.d), "program eval_step #4 (mlp gelu) GELU: has 0 ints, its signature has 1");
  }
  {
    Tiny t; // a value index out of range
    t.d.programs[1].code[3].out = {99};
    EXPECT_CONTAINS(semantic_error(t.d), "rank 0, program train_step #3 (mlp.linear_fc1 bias) BIAS_ADD: "
                                         "out[0] is value 99, but the program has ");
  }
  {
    Tiny t; // a parameter index out of range
    t.d.programs[1].code.back().params = {7};
    EXPECT_CONTAINS(semantic_error(t.d), "EMBEDDING_GRAD: params[0] is parameter 7, but rank 0 has 5 parameters");
  }
  {
    Tiny t; // an arena value past arena_bytes
    t.d.programs[0].values[t.d.programs[0].values.size() - 1].offset = t.d.arena_bytes;
    EXPECT_CONTAINS(semantic_error(t.d), "rank 0, program eval_step: value ");
    EXPECT_CONTAINS(semantic_error(t.d), "(%loss) at arena offset " + grouped(t.d.arena_bytes) +
                                             " with 4 bytes ends past arena_bytes " +
                                             grouped(t.d.arena_bytes));
  }
  {
    Tiny t; // a misaligned parameter
    t.d.params[1].weight += 32;
    EXPECT_CONTAINS(semantic_error(t.d), "rank 0: parameter 1 (decoder.final_layernorm.weight): "
                                         "weight_offset " + std::to_string(t.d.params[1].weight) +
                                         " is not a multiple of 64 bytes");
  }
  {
    Tiny t; // state past state_bytes
    t.d.state_bytes -= 64;
    EXPECT_CONTAINS(semantic_error(t.d), "bytes ends past state_bytes");
  }
  {
    Tiny t; // overlapping parameter buffers
    t.d.params[2].weight = t.d.params[1].weight;
    EXPECT_CONTAINS(semantic_error(t.d), "overlap in the state buffer");
  }
  {
    Tiny t; // a weight value whose shape differs from its parameter's
    t.d.programs[0].values[2].shape = {Tiny::H, Tiny::Vocab};
    EXPECT_CONTAINS(semantic_error(t.d), "has shape [8,11], but parameter 0 has [11,8]");
  }
  {
    Tiny t; // a weight value naming a missing parameter
    t.d.programs[0].values[2].offset = 9;
    EXPECT_CONTAINS(semantic_error(t.d), "refers to parameter 9, but rank 0 has 5 parameters");
  }
  {
    Tiny t; // operand dtype: float labels
    t.d.programs[0].values[1].dtype = DType::F32;
    EXPECT_CONTAINS(semantic_error(t.d), "CROSS_ENTROPY: in[1] (%labels [2,3] f32) must be an i32 tensor");
  }
  {
    Tiny t; // shapes that do not chain
    t.d.programs[0].values[t.d.programs[0].code[2].out[0]].shape = {Tiny::B, Tiny::S, 5};
    EXPECT_CONTAINS(semantic_error(t.d), "MATMUL: needs x[..., in], w[out, in] -> y[..., out]");
  }
  {
    Tiny t; // a read before any write
    std::swap(t.d.programs[0].code[0], t.d.programs[0].code[1]);
    EXPECT_CONTAINS(semantic_error(t.d), "#0 (final_layernorm) LAYER_NORM: in[0] (%x0) is read before any instruction writes it");
  }
  {
    Tiny t; // program output out of range
    t.d.programs[0].outputs = {1000};
    EXPECT_CONTAINS(semantic_error(t.d), "program eval_step: output 0 is value 1000");
  }
  {
    Tiny t(true); // FUSED naming a kernel that does not exist
    t.d.programs[0].code[3].ints = {3};
    EXPECT_CONTAINS(semantic_error(t.d), "FUSED: ints[0] is kernel 3, but the plan has 1 kernels");
  }
  {
    Tiny t(true); // a kernel scratch value past cpu_scratch_bytes
    t.d.kernels[0].scratch = 64;
    EXPECT_CONTAINS(semantic_error(t.d), "rank 0, kernel 0 (fused_bias_gelu): value 4 (%t)");
  }
}

// ---------------------------------------------------------------------------
// Executor: the tiny model against the double-precision reference.

TEST(CpuExecutor, TinyModelLossAndGradientsMatchReference) {
  Tiny t;
  auto f = open_ok(t.d);
  ASSERT_NE(f, nullptr);
  CpuExecutor ex(*f->plan(), 0);
  EXPECT_EQ(ex.cpu_arena_bytes(), t.d.arena_bytes); // all f32: no scaling
  ex.init_params(1);
  RefTiny ref;
  set_weights(ex, t, ref);
  const pl::Program *train = ex.program("train_step");
  ASSERT_NE(train, nullptr);
  EXPECT_EQ(ex.program("no_such_program"), nullptr);

  float loss = run_loss(ex, *train, t.tokens, t.labels);
  std::vector<double> g[5];
  for (int k = 0; k < 5; ++k)
    g[k].assign(ref.w[k].size(), 0.0);
  double ref_loss = ref.run(t.tokens, t.labels, g);
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss));

  // The reference backward itself agrees with its own central differences.
  for (int k = 0; k < 5; ++k)
    for (size_t i = 0; i < ref.w[k].size(); i += 3) {
      RefTiny r = ref;
      const double h = 1e-6;
      r.w[k][i] += h;
      double up = r.run(t.tokens, t.labels, nullptr);
      r.w[k][i] -= 2 * h;
      double down = r.run(t.tokens, t.labels, nullptr);
      EXPECT_NEAR(g[k][i], (up - down) / (2 * h), 1e-7) << "reference param " << k << "[" << i << "]";
    }

  const int params[5] = {t.table, t.lnw, t.lnb, t.w1, t.b1};
  for (int k = 0; k < 5; ++k) {
    const float *gx = ex.grad(params[k]);
    for (size_t i = 0; i < g[k].size(); ++i)
      EXPECT_NEAR(gx[i], g[k][i], 2e-6 + 1e-4 * std::abs(g[k][i])) << "param " << k << "[" << i << "]";
  }

  // Gradients accumulate over runs; loss_scale multiplies the seed.
  std::vector<float> once(ex.grad(t.w1), ex.grad(t.w1) + ex.param_elements(t.w1));
  ex.loss_scale = 4.0f;
  run_loss(ex, *train, t.tokens, t.labels);
  for (size_t i = 0; i < once.size(); ++i)
    EXPECT_NEAR(ex.grad(t.w1)[i], 5.0f * once[i], 1e-5 + 1e-5 * std::abs(once[i]));
  ex.zero_grads();
  for (int64_t i = 0; i < ex.param_elements(t.table); ++i)
    ASSERT_EQ(ex.grad(t.table)[i], 0.0f);
}

TEST(CpuExecutor, Bf16ParameterLivesInTheScaledState) {
  // w1 is bf16: the state doubles, its weights are floats at twice the plan
  // offset, and its gradient (f32) too; results still match the reference.
  Tiny t(false, DType::BF16);
  auto f = open_ok(t.d);
  ASSERT_NE(f, nullptr);
  CpuExecutor ex(*f->plan(), 0);
  EXPECT_EQ(ex.cpu_state_bytes(), 2 * t.d.state_bytes);
  EXPECT_EQ(ex.cpu_arena_bytes(), t.d.arena_bytes);
  RefTiny ref;
  set_weights(ex, t, ref);
  float *w1 = ex.weight(t.w1);
  EXPECT_EQ(reinterpret_cast<char *>(w1) - reinterpret_cast<char *>(ex.weight(t.table)),
            2 * (t.d.params[size_t(t.w1)].weight - t.d.params[size_t(t.table)].weight));
  for (int64_t i = 0; i < ex.param_elements(t.w1); ++i)
    ref.w[3][size_t(i)] = w1[i] = ref_bf16(w1[i]);
  ex.zero_grads();
  float loss = run_loss(ex, *ex.program("train_step"), t.tokens, t.labels);
  std::vector<double> g[5];
  for (int k = 0; k < 5; ++k)
    g[k].assign(ref.w[k].size(), 0.0);
  EXPECT_NEAR(loss, ref.run(t.tokens, t.labels, g), 1e-5);
  for (size_t i = 0; i < g[3].size(); ++i)
    EXPECT_NEAR(ex.grad(t.w1)[i], g[3][i], 2e-6 + 1e-4 * std::abs(g[3][i]));
}

TEST(CpuExecutor, TinyModelGradientsMatchFiniteDifferencesOfTheForwardProgram) {
  Tiny t;
  auto f = open_ok(t.d);
  ASSERT_NE(f, nullptr);
  CpuExecutor ex(*f->plan(), 0);
  RefTiny ref;
  set_weights(ex, t, ref);
  const pl::Program *train = ex.program("train_step");
  const pl::Program *eval = ex.program("eval_step");
  ex.zero_grads();
  run_loss(ex, *train, t.tokens, t.labels);
  const int params[5] = {t.table, t.lnw, t.lnb, t.w1, t.b1};
  const float h = 1e-2f;
  int checked = 0;
  for (int p : params) {
    float *w = ex.weight(p);
    for (int64_t i = 0; i < ex.param_elements(p); ++i) {
      const float keep = w[i];
      w[i] = keep + h;
      double up = run_loss(ex, *eval, t.tokens, t.labels);
      w[i] = keep - h;
      double down = run_loss(ex, *eval, t.tokens, t.labels);
      w[i] = keep;
      double fd = (up - down) / (2.0 * double(h));
      EXPECT_NEAR(ex.grad(p)[i], fd, 1e-3 + 1e-2 * std::abs(fd)) << "param " << p << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 11 * 8 + 8 + 8 + 64 + 8);
}

TEST(CpuExecutor, FusedKernelMatchesTheUnfusedInstructions) {
  Tiny plain, fused(true);
  auto fp = open_ok(plain.d), ff = open_ok(fused.d);
  ASSERT_NE(fp, nullptr);
  ASSERT_NE(ff, nullptr);
  CpuExecutor a(*fp->plan(), 0), b(*ff->plan(), 0);
  RefTiny ra, rb;
  set_weights(a, plain, ra);
  set_weights(b, fused, rb);
  a.zero_grads();
  b.zero_grads();
  for (bool check : {false, true}) {
    b.set_check_memory_plan(check);
    EXPECT_EQ(run_loss(a, *a.program("train_step"), plain.tokens, plain.labels),
              run_loss(b, *b.program("train_step"), fused.tokens, fused.labels));
  }
  for (int p = 0; p < 5; ++p)
    for (int64_t i = 0; i < a.param_elements(p); ++i)
      ASSERT_EQ(a.grad(p)[i], b.grad(p)[i]) << "param " << p << "[" << i << "]";
}

TEST(CpuExecutor, TokenOutOfRangeIsAnErrorNamingTheInstruction) {
  Tiny t;
  auto f = open_ok(t.d);
  ASSERT_NE(f, nullptr);
  CpuExecutor ex(*f->plan(), 0);
  ex.init_params(3);
  const pl::Program *p = ex.program("eval_step");
  std::vector<int32_t> tokens = t.tokens;
  tokens[4] = 50;
  write_ids(ex, *p, find_value(*p, "tokens"), tokens);
  write_ids(ex, *p, find_value(*p, "labels"), t.labels);
  EXPECT_EQ(ex.run(*p, 0), "rank 0: eval_step #0 (embedding) EMBEDDING: token id 50 at position 4 "
                           "of %tokens is outside [0, 11); check that the data was tokenized for "
                           "this model's vocabulary");
  std::vector<int32_t> labels = t.labels;
  labels[1] = -1;
  write_ids(ex, *p, find_value(*p, "tokens"), t.tokens);
  write_ids(ex, *p, find_value(*p, "labels"), labels);
  EXPECT_CONTAINS(ex.run(*p, 0), "rank 0: eval_step #6 (loss) CROSS_ENTROPY: label -1 at position 1 of %labels");
}

TEST(CpuExecutor, InitParamsIsReproducibleAndFollowsInit) {
  PlanDesc d;
  int big = d.param("big", {64, 64}, pl::Init::NORMAL, DType::BF16, true, true);
  int ones = d.param("ones", {5}, pl::Init::ONES);
  int zeros = d.param("zeros", {5}, pl::Init::ZEROS);
  d.params[size_t(big)].init_std = 0.02;
  d.program("empty");
  auto f = open_ok(d);
  ASSERT_NE(f, nullptr);
  CpuExecutor a(*f->plan(), 0), b(*f->plan(), 0), c(*f->plan(), 0);
  EXPECT_EQ(a.cpu_state_bytes(), 2 * d.state_bytes); // a bf16 parameter scales the state
  a.init_params(1234);
  b.init_params(1234);
  c.init_params(1235);
  const int64_t n = a.param_elements(big);
  double sum = 0, sq = 0;
  bool differs = false;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(a.weight(big)[i], b.weight(big)[i]);
    ASSERT_EQ(a.weight(big)[i], ref_bf16(a.weight(big)[i])) << "bf16 weights are rounded";
    ASSERT_EQ(a.master(big)[i], a.weight(big)[i]);
    ASSERT_EQ(a.exp_avg(big)[i], 0.0f);
    ASSERT_EQ(a.grad(big)[i], 0.0f);
    differs |= a.weight(big)[i] != c.weight(big)[i];
    sum += a.weight(big)[i];
    sq += double(a.weight(big)[i]) * a.weight(big)[i];
  }
  EXPECT_TRUE(differs);
  EXPECT_NEAR(sum / n, 0.0, 0.002);
  EXPECT_NEAR(std::sqrt(sq / n), 0.02, 0.002);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(a.weight(ones)[i], 1.0f);
    EXPECT_EQ(a.weight(zeros)[i], 0.0f);
  }
  EXPECT_EQ(a.master(ones), nullptr);
  EXPECT_EQ(a.exp_avg(ones), nullptr);
}

// ---------------------------------------------------------------------------
// Optimizer programs.

struct ScalarProgram {
  PlanDesc d;
  Prog *p;
  ScalarProgram() { p = &d.program("step"); }
};

TEST(CpuExecutor, LrScheduleMatchesMegatron) {
  // Hand-computed values of Megatron-LM's OptimizerParamScheduler.get_lr
  // (init_lr 0) at num_steps = `steps`, with lr 0.01 and min_lr 0.001.
  struct Case {
    pl::LrStyle style;
    int64_t warmup, decay, steps;
    double lr;
    int64_t samples = 1; // Megatron's steps are samples: the global batch
    pl::WsdStyle wsd = pl::WsdStyle::EXPONENTIAL;
    int64_t wsdDecay = 0;
  };
  const Case cases[] = {
      {pl::LrStyle::CONSTANT, 10, 110, 0, 0.0},        // warm-up starts at 0
      {pl::LrStyle::CONSTANT, 10, 110, 5, 0.005},
      {pl::LrStyle::CONSTANT, 10, 110, 10, 0.01},      // steps <= warmup is still warm-up
      {pl::LrStyle::CONSTANT, 10, 110, 500, 0.01},     // constant ignores decay_iters
      {pl::LrStyle::CONSTANT, 0, 110, 0, 0.01},        // no warm-up
      {pl::LrStyle::LINEAR, 10, 110, 3, 0.003},
      {pl::LrStyle::LINEAR, 10, 110, 35, 0.00775},     // ratio 0.25
      {pl::LrStyle::LINEAR, 10, 110, 60, 0.0055},      // ratio 0.5
      {pl::LrStyle::LINEAR, 10, 110, 110, 0.001},      // ratio 1
      {pl::LrStyle::LINEAR, 10, 110, 111, 0.001},      // past decay_iters
      {pl::LrStyle::COSINE, 10, 110, 35, 0.0086819805153394640},  // 0.001 + 0.009 * (cos(pi/4) + 1) / 2
      {pl::LrStyle::COSINE, 10, 110, 60, 0.0055},
      {pl::LrStyle::COSINE, 10, 110, 85, 0.0023180194846605362},
      {pl::LrStyle::COSINE, 10, 110, 110, 0.001},
      {pl::LrStyle::COSINE, 10, 110, 1000, 0.001},
      {pl::LrStyle::COSINE, 0, 100, 0, 0.01},
      {pl::LrStyle::INVERSE_SQUARE_ROOT, 10, 2000, 4, 0.004},
      {pl::LrStyle::INVERSE_SQUARE_ROOT, 10, 2000, 40, 0.005},   // 0.01 * sqrt(10 / 40)
      {pl::LrStyle::INVERSE_SQUARE_ROOT, 10, 2000, 90, 0.01 / 3},
      {pl::LrStyle::INVERSE_SQUARE_ROOT, 10, 2000, 1690, 0.001}, // clamped at min_lr
      {pl::LrStyle::INVERSE_SQUARE_ROOT, 10, 2000, 2001, 0.001}, // past decay_iters
      {pl::LrStyle::INVERSE_SQUARE_ROOT, 0, 2000, 0, 0.01},      // warmup and steps taken as 1
      {pl::LrStyle::INVERSE_SQUARE_ROOT, 0, 2000, 4, 0.005},
      // Megatron clamps samples, not steps, to 1: with 4 a step and no
      // warm-up, step 4 is 16 samples against 1.
      {pl::LrStyle::INVERSE_SQUARE_ROOT, 0, 2000, 4, 0.0025, 4},
      {pl::LrStyle::INVERSE_SQUARE_ROOT, 0, 2000, 0, 0.01, 4},
      {pl::LrStyle::INVERSE_SQUARE_ROOT, 10, 2000, 40, 0.005, 4}, // sqrt(40 / 160)
      // WSD: lr until its 20-step anneal starts at 90, then min_lr at 110.
      {pl::LrStyle::WSD, 10, 110, 5, 0.005, 1, pl::WsdStyle::LINEAR, 20},
      {pl::LrStyle::WSD, 10, 110, 50, 0.01, 1, pl::WsdStyle::LINEAR, 20},
      {pl::LrStyle::WSD, 10, 110, 90, 0.01, 1, pl::WsdStyle::COSINE, 20},
      {pl::LrStyle::WSD, 10, 110, 95, 0.00775, 1, pl::WsdStyle::LINEAR, 20},    // r 0.25
      {pl::LrStyle::WSD, 10, 110, 95, 0.008681980515339463, 1, pl::WsdStyle::COSINE, 20},
      {pl::LrStyle::WSD, 10, 110, 95, 0.007136135474566861, 1, pl::WsdStyle::EXPONENTIAL, 20},
      {pl::LrStyle::WSD, 10, 110, 95, 0.0055, 1, pl::WsdStyle::MINUS_SQRT, 20}, // 1 - sqrt(0.25)
      {pl::LrStyle::WSD, 10, 110, 110, 0.001, 1, pl::WsdStyle::EXPONENTIAL, 20},
      {pl::LrStyle::WSD, 10, 110, 110, 0.001, 1, pl::WsdStyle::MINUS_SQRT, 20},
      {pl::LrStyle::WSD, 10, 110, 111, 0.001, 1, pl::WsdStyle::COSINE, 20},
  };
  for (const Case &c : cases) {
    ScalarProgram s;
    uint32_t it = s.d.input(*s.p, "iteration", {}, DType::I64);
    uint32_t lr = s.d.arena(*s.p, "lr", {});
    PlanDesc::op(*s.p, Opcode::LR_SCHEDULE, {it}, {lr}, {},
                 {int64_t(c.style), c.warmup, c.decay, c.samples, int64_t(c.wsd), c.wsdDecay},
                 {0.01, 0.001}, "lr");
    PlanDesc::output(*s.p, lr, "lr");
    auto f = open_ok(s.d);
    ASSERT_NE(f, nullptr);
    CpuExecutor ex(*f->plan(), 0);
    const pl::Program &p = *ex.program("step");
    *static_cast<int64_t *>(ex.value_data(p, it)) = c.steps;
    ASSERT_EQ(ex.run(p, 0), "");
    EXPECT_FLOAT_EQ(*static_cast<float *>(ex.value_data(p, lr)), float(c.lr))
        << pl::EnumNameLrStyle(c.style) << " warmup " << c.warmup << " decay " << c.decay
        << " steps " << c.steps << " samples " << c.samples << " anneal "
        << pl::EnumNameWsdStyle(c.wsd);
  }
}

TEST(CpuExecutor, LrScheduleRejectsDecayNotPastWarmup) {
  ScalarProgram s;
  uint32_t it = s.d.input(*s.p, "iteration", {}, DType::I64);
  uint32_t lr = s.d.arena(*s.p, "lr", {});
  PlanDesc::op(*s.p, Opcode::LR_SCHEDULE, {it}, {lr}, {}, {int64_t(pl::LrStyle::COSINE), 10, 10, 1, 0, 0},
               {0.01, 0.001}, "lr");
  EXPECT_CONTAINS(semantic_error(s.d), "LR_SCHEDULE: ints[2] (decay_iters 10) must exceed ints[1] (warmup 10)");
}

TEST(CpuExecutor, LrScheduleRejectsBadWsdAndSamples) {
  auto error = [](std::vector<int64_t> ints) {
    ScalarProgram s;
    uint32_t it = s.d.input(*s.p, "iteration", {}, DType::I64);
    uint32_t lr = s.d.arena(*s.p, "lr", {});
    PlanDesc::op(*s.p, Opcode::LR_SCHEDULE, {it}, {lr}, {}, ints, {0.01, 0.001}, "lr");
    return semantic_error(s.d);
  };
  const int64_t wsd = int64_t(pl::LrStyle::WSD);
  EXPECT_CONTAINS(error({wsd, 10, 110, 1, 0, 0}), "ints[5] (wsd_decay_iters 0) must be in [1, decay_iters - warmup]");
  EXPECT_CONTAINS(error({wsd, 10, 110, 1, 0, 101}), "ints[5] (wsd_decay_iters 101) must be in [1, decay_iters - warmup]");
  EXPECT_CONTAINS(error({wsd, 10, 110, 1, 4, 20}), "ints[4] (wsd_style) is 4; WsdStyle has codes 0 to 3");
  EXPECT_CONTAINS(error({wsd, 10, 110, 0, 0, 20}), "ints[3] (samples_per_step) is 0; it must be >= 1");
}

// AdamW in double for the reference: decoupled weight decay, bias correction.
void ref_adamw(std::vector<double> &p, const std::vector<double> &g, std::vector<double> &m,
               std::vector<double> &v, double lr, double b1, double b2, double eps, double wd,
               int64_t step) {
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] -= lr * wd * p[i];
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    double mh = m[i] / (1 - std::pow(b1, double(step))), vh = v[i] / (1 - std::pow(b2, double(step)));
    p[i] -= lr * mh / (std::sqrt(vh) + eps);
  }
}

TEST(CpuExecutor, GradNormClipAndAdamW) {
  // grad_norm, then optimizer_step as the compiler lays it out: lr schedule,
  // clip coefficient, one ADAMW per parameter (one f32, one bf16 with master).
  PlanDesc d;
  int a = d.param("a.weight", {4, 8}, pl::Init::NORMAL, DType::F32, true);
  int b = d.param("b.weight", {16}, pl::Init::NORMAL, DType::BF16, true, true);
  Prog &gn = d.program("grad_norm");
  uint32_t norm_out = d.arena(gn, "norm", {});
  PlanDesc::op(gn, Opcode::GRAD_NORM, {}, {norm_out}, {}, {}, {}, "grad_norm");
  PlanDesc::output(gn, norm_out, "grad_norm");
  Prog &st = d.program("optimizer_step");
  uint32_t steps = d.input(st, "steps", {}, DType::I64);
  uint32_t step = d.input(st, "step", {}, DType::I64);
  uint32_t norm = d.input(st, "grad_norm", {});
  uint32_t scale = d.input(st, "grad_scale", {});
  uint32_t lr = d.arena(st, "lr", {}), clip = d.arena(st, "clip", {});
  const double max_norm = 0.5, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  PlanDesc::op(st, Opcode::LR_SCHEDULE, {steps}, {lr}, {}, {int64_t(pl::LrStyle::CONSTANT), 0, 100, 1, 0, 0},
               {0.01, 0.0}, "lr");
  PlanDesc::op(st, Opcode::CLIP_COEFF, {norm, scale}, {clip}, {}, {}, {max_norm}, "clip");
  PlanDesc::op(st, Opcode::ADAMW, {lr, clip, step}, {}, {uint32_t(a)}, {}, {b1, b2, eps, wd}, "adamw a");
  PlanDesc::op(st, Opcode::ADAMW, {lr, clip, step}, {}, {uint32_t(b)}, {}, {b1, b2, eps, 0.0}, "adamw b");
  PlanDesc::output(st, lr, "lr");
  auto f = open_ok(d);
  ASSERT_NE(f, nullptr);
  CpuExecutor ex(*f->plan(), 0);
  ex.init_params(7);

  std::vector<double> p[2], m[2], v[2];
  const int ids[2] = {a, b};
  for (int k = 0; k < 2; ++k) {
    int64_t n = ex.param_elements(ids[k]);
    p[k].assign(ex.weight(ids[k]), ex.weight(ids[k]) + n);
    m[k].assign(size_t(n), 0.0);
    v[k].assign(size_t(n), 0.0);
  }
  const pl::Program &gprog = *ex.program("grad_norm");
  const pl::Program &sprog = *ex.program("optimizer_step");
  for (int64_t it = 1; it <= 2; ++it) {
    double sq = 0;
    std::vector<double> g[2];
    for (int k = 0; k < 2; ++k) {
      fill(ex.grad(ids[k]), ex.param_elements(ids[k]), uint64_t(10 * it + k), 0.3);
      g[k].assign(ex.grad(ids[k]), ex.grad(ids[k]) + ex.param_elements(ids[k]));
      for (double x : g[k])
        sq += x * x;
    }
    ASSERT_EQ(ex.run(gprog, 0), "");
    float norm_value = *static_cast<float *>(ex.value_data(gprog, norm_out));
    EXPECT_NEAR(norm_value, std::sqrt(sq), 1e-6 * std::sqrt(sq));
    ASSERT_GT(norm_value, max_norm); // so the update is clipped

    *static_cast<int64_t *>(ex.value_data(sprog, steps)) = it - 1;
    *static_cast<int64_t *>(ex.value_data(sprog, step)) = it;
    *static_cast<float *>(ex.value_data(sprog, norm)) = norm_value;
    *static_cast<float *>(ex.value_data(sprog, scale)) = 1.0f;
    ASSERT_EQ(ex.run(sprog, 0), "");
    EXPECT_FLOAT_EQ(*static_cast<float *>(ex.value_data(sprog, clip)),
                    float(max_norm / (double(norm_value) + 1e-6)));
    const double c = double(*static_cast<float *>(ex.value_data(sprog, clip)));
    for (int k = 0; k < 2; ++k) {
      std::vector<double> gc = g[k];
      for (double &x : gc)
        x = double(float(x) * float(c));
      ref_adamw(p[k], gc, m[k], v[k], 0.01, b1, b2, eps, k == 0 ? wd : 0.0, it);
      const float *now = k == 0 ? ex.weight(ids[k]) : ex.master(ids[k]);
      for (size_t i = 0; i < p[k].size(); ++i) {
        EXPECT_NEAR(now[i], p[k][i], 1e-6) << "param " << k << "[" << i << "] step " << it;
        EXPECT_NEAR(ex.exp_avg(ids[k])[i], m[k][i], 1e-7);
        EXPECT_EQ(ex.grad(ids[k])[i], float(g[k][i])) << "the gradient buffer is not clipped in place";
      }
    }
    for (int64_t i = 0; i < ex.param_elements(b); ++i)
      ASSERT_EQ(ex.weight(b)[i], ref_bf16(ex.master(b)[i])) << "bf16 weights are the rounded master";
    // The reference continues from the executor's master copy of b.
    p[1].assign(ex.master(b), ex.master(b) + ex.param_elements(b));
  }
}

TEST(CpuExecutor, ClipCoeffIsOneWhenOffOrBelowMaxNorm) {
  const std::tuple<double, float, float> cases[] = {{0.0, 5.0f, 1.0f},
                                                    {-1.0, 5.0f, 1.0f},
                                                    {10.0, 5.0f, 1.0f},
                                                    {1.0, 3.0f, float(1.0 / (3.0 + 1e-6))},
                                                    {1.0, NAN, 1.0f}};
  for (auto [max_norm, norm, want] : cases) {
    ScalarProgram s;
    uint32_t in = s.d.input(*s.p, "norm", {});
    uint32_t scale = s.d.input(*s.p, "grad_scale", {});
    uint32_t out = s.d.arena(*s.p, "clip", {});
    PlanDesc::op(*s.p, Opcode::CLIP_COEFF, {in, scale}, {out}, {}, {}, {max_norm}, "clip");
    PlanDesc::output(*s.p, out, "clip");
    auto f = open_ok(s.d);
    ASSERT_NE(f, nullptr);
    CpuExecutor ex(*f->plan(), 0);
    const pl::Program &p = *ex.program("step");
    *static_cast<float *>(ex.value_data(p, in)) = norm;
    // fp16 loss scaling: the factor also unscales.
    *static_cast<float *>(ex.value_data(p, scale)) = 0.25f;
    ASSERT_EQ(ex.run(p, 0), "");
    EXPECT_FLOAT_EQ(*static_cast<float *>(ex.value_data(p, out)), 0.25f * want)
        << max_norm << " " << norm;
  }
}

// ---------------------------------------------------------------------------
// Reduced precision.

TEST(CpuExecutor, ReducedPrecisionOutputsAreRounded) {
  ScalarProgram s;
  const int64_t n = 6;
  uint32_t x = s.d.input(*s.p, "x", {n});
  uint32_t y16 = s.d.arena(*s.p, "y_bf16", {n}, DType::BF16);
  uint32_t h16 = s.d.arena(*s.p, "y_f16", {n}, DType::F16);
  uint32_t z = s.d.arena(*s.p, "z", {n}); // f32 reading the bf16 value
  PlanDesc::op(*s.p, Opcode::ADD, {x, x}, {y16}, {}, {}, {}, "to bf16");
  PlanDesc::op(*s.p, Opcode::ADD, {x, x}, {h16}, {}, {}, {}, "to f16");
  PlanDesc::op(*s.p, Opcode::ADD, {y16, x}, {z}, {}, {}, {}, "back to f32");
  PlanDesc::output(*s.p, y16, "y_bf16");
  PlanDesc::output(*s.p, h16, "y_f16");
  PlanDesc::output(*s.p, z, "z");
  auto f = open_ok(s.d);
  ASSERT_NE(f, nullptr);
  CpuExecutor ex(*f->plan(), 0);
  EXPECT_EQ(ex.cpu_arena_bytes(), 2 * s.d.arena_bytes); // bf16 values scale the arena
  ex.set_check_memory_plan(true);
  const pl::Program &p = *ex.program("step");
  const float in[n] = {1.0f + 3.0f / 512, 0.1f, -3.14159f, 1000.7f, 1.0f + 1.0f / 4096, 1e-3f};
  std::memcpy(ex.value_data(p, x), in, sizeof(in));
  ASSERT_EQ(ex.run(p, 0), "");
  const float *yb = static_cast<float *>(ex.value_data(p, y16));
  const float *yh = static_cast<float *>(ex.value_data(p, h16));
  const float *zz = static_cast<float *>(ex.value_data(p, z));
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(yb[i], ref_bf16(in[i] + in[i])) << i;
    EXPECT_EQ(yh[i], ref_fp16(in[i] + in[i])) << i;
    EXPECT_EQ(zz[i], ref_bf16(in[i] + in[i]) + in[i]) << i;
  }
  EXPECT_NE(yb[0], in[0] + in[0]); // the rounding is visible
  EXPECT_EQ(yb[0], 2.015625f);
}

// ---------------------------------------------------------------------------
// --check-memory-plan.

// Re-lays out a program's arena values by liveness, first fit, as a memory
// planner would.
void relayout(PlanDesc &d, Prog &p) {
  d.arena_bytes = 0;
  for (const Prog &q : d.programs)
    if (&q != &p)
      d.arena_bytes = std::max(d.arena_bytes, q.top);
  const size_t n = p.code.size();
  std::vector<int64_t> release(p.values.size(), -1);
  for (size_t i = 0; i < n; ++i)
    for (uint32_t v : p.code[i].in)
      release[v] = std::max<int64_t>(release[v], int64_t(i));
  for (uint32_t v : p.outputs)
    release[v] = int64_t(n);
  std::map<uint64_t, uint64_t> used; // offset -> size
  auto place = [&](uint32_t v) {
    uint64_t size = round_up(uint64_t(numel(p.values[v].shape)) * dtype_bytes(p.values[v].dtype), 64);
    uint64_t at = 0;
    for (auto [o, s] : used) {
      if (at + size <= o)
        break;
      at = std::max(at, o + s);
    }
    used[at] = size;
    p.values[v].offset = at;
    d.arena_bytes = std::max(d.arena_bytes, at + size);
  };
  for (uint32_t v : p.inputs)
    place(v);
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t v : p.code[i].out)
      place(v);
    // Released after the results are placed: results never overlap operands.
    for (uint32_t v = 0; v < p.values.size(); ++v)
      if (p.values[v].region == Region::ARENA && release[v] == int64_t(i))
        used.erase(p.values[v].offset);
  }
}

TEST(CpuExecutor, CheckMemoryPlanPassesACorrectReusingLayout) {
  Tiny bump, reused;
  relayout(reused.d, reused.d.programs[1]);
  EXPECT_LT(reused.d.arena_bytes, bump.d.arena_bytes);
  auto fb = open_ok(bump.d), fr = open_ok(reused.d);
  ASSERT_NE(fr, nullptr);
  CpuExecutor a(*fb->plan(), 0), b(*fr->plan(), 0);
  RefTiny ra, rb;
  set_weights(a, bump, ra);
  set_weights(b, reused, rb);
  a.zero_grads();
  b.zero_grads();
  const pl::Program &pa = *a.program("train_step");
  const float unchecked = run_loss(a, pa, bump.tokens, bump.labels);
  a.zero_grads();
  a.set_check_memory_plan(true);
  b.set_check_memory_plan(true);
  EXPECT_EQ(run_loss(a, pa, bump.tokens, bump.labels), unchecked);
  EXPECT_EQ(run_loss(b, *b.program("train_step"), reused.tokens, reused.labels), unchecked);
  for (int p = 0; p < 5; ++p)
    for (int64_t i = 0; i < a.param_elements(p); ++i)
      ASSERT_EQ(a.grad(p)[i], b.grad(p)[i]);
  // Dead bytes are poisoned: in the bump layout nothing reuses x2's bytes
  // after its last reader, so they hold the NaN pattern after the run.
  const float *x2 = static_cast<float *>(a.value_data(pa, find_value(pa, "x2")));
  for (int i = 0; i < Tiny::B * Tiny::S * Tiny::H; ++i)
    ASSERT_TRUE(std::isnan(x2[i])) << i;
}

TEST(CpuExecutor, CheckMemoryPlanCatchesOverlappingLiveValues) {
  // a and b are both live until y = a + b, but share bytes.
  ScalarProgram s;
  uint32_t x = s.d.input(*s.p, "x", {16});
  uint32_t a = s.d.arena(*s.p, "a", {16});
  uint32_t b = s.d.arena(*s.p, "b", {16});
  uint32_t y = s.d.arena(*s.p, "y", {16});
  s.p->values[b].offset = s.p->values[a].offset;
  PlanDesc::op(*s.p, Opcode::GELU, {x}, {a}, {}, {0}, {}, "layers.0 gelu a");
  PlanDesc::op(*s.p, Opcode::GELU, {x}, {b}, {}, {1}, {}, "layers.0 gelu b");
  PlanDesc::op(*s.p, Opcode::ADD, {a, b}, {y}, {}, {}, {}, "layers.0 add");
  PlanDesc::output(*s.p, y, "y");
  auto f = open_ok(s.d); // the reader does not check lifetimes
  ASSERT_NE(f, nullptr);
  CpuExecutor ex(*f->plan(), 0);
  const pl::Program &p = *ex.program("step");
  fill(static_cast<float *>(ex.value_data(p, x)), 16, 5, 1.0);
  EXPECT_EQ(ex.run(p, 0), ""); // unchecked, the wrong answer goes unnoticed
  ex.set_check_memory_plan(true);
  EXPECT_EQ(ex.run(p, 0), "rank 0: memory plan violation: step #2 (layers.0 add) ADD reads %a "
                          "whose bytes were overwritten by %b at #1 (layers.0 gelu b) GELU");
}

TEST(CpuExecutor, CheckMemoryPlanCatchesAnEarlyRelease) {
  // x1 is read by MATMUL (#2) and again by MATMUL_WEIGHT_GRAD (#14); a
  // planner that frees it after #2 may give its bytes to dx3 (written at
  // #11). No single instruction sees both, so the reader cannot tell.
  Tiny t;
  Prog &p = t.d.programs[1];
  auto index = [&](const std::string &name) {
    for (uint32_t v = 0; v < p.values.size(); ++v)
      if (p.values[v].name == name)
        return v;
    return ~0u;
  };
  p.values[index("dx3")].offset = p.values[index("x1")].offset;
  auto f = open_ok(t.d);
  ASSERT_NE(f, nullptr);
  CpuExecutor ex(*f->plan(), 0);
  ex.init_params(1);
  const pl::Program &prog = *ex.program("train_step");
  auto run = [&]() {
    write_ids(ex, prog, find_value(prog, "tokens"), t.tokens);
    write_ids(ex, prog, find_value(prog, "labels"), t.labels);
    return ex.run(prog, 0);
  };
  EXPECT_EQ(run(), "");
  ex.set_check_memory_plan(true);
  EXPECT_EQ(run(), "rank 0: memory plan violation: train_step #14 (op14) MATMUL_WEIGHT_GRAD reads "
                   "%x1 whose bytes were overwritten by %dx3 at #11 (op11) GELU_GRAD");
}

TEST(PlanReader, ResultOverlappingItsOperandIsRejected) {
  ScalarProgram s;
  uint32_t x = s.d.input(*s.p, "x", {16});
  uint32_t y = s.d.arena(*s.p, "y", {16});
  s.p->values[y].offset = s.p->values[x].offset + 32; // half over x
  s.d.arena_bytes += 32;
  PlanDesc::op(*s.p, Opcode::GELU, {x}, {y}, {}, {0}, {}, "gelu");
  PlanDesc::output(*s.p, y, "y");
  EXPECT_CONTAINS(semantic_error(s.d), "rank 0, program step #0 (gelu) GELU: out[0] (%y) shares "
                                       "arena bytes with in[0] (%x); results must not overlap their "
                                       "operands");
  s.p->values[y].offset = s.p->values[x].offset; // not even as a full alias: only RESHAPE views
  EXPECT_CONTAINS(semantic_error(s.d), "GELU: out[0] (%y) shares arena bytes with in[0] (%x)");
}

TEST(CpuExecutor, ReshapeAliasSharesTheBytesOfItsSource) {
  ScalarProgram s;
  uint32_t x = s.d.input(*s.p, "x", {2, 8});
  uint32_t a = s.d.arena(*s.p, "a", {2, 8});
  uint32_t alias = s.d.arena(*s.p, "a_flat", {16});
  s.p->values[alias].offset = s.p->values[a].offset; // RESHAPE in place
  uint32_t copy = s.d.arena(*s.p, "a_copy", {4, 4}); // RESHAPE that copies
  uint32_t y = s.d.arena(*s.p, "y", {16});
  PlanDesc::op(*s.p, Opcode::GELU, {x}, {a}, {}, {1}, {}, "gelu");
  PlanDesc::op(*s.p, Opcode::RESHAPE, {a}, {alias}, {}, {}, {}, "view");
  PlanDesc::op(*s.p, Opcode::RESHAPE, {alias}, {copy}, {}, {}, {}, "copy");
  PlanDesc::op(*s.p, Opcode::ADD, {alias, copy}, {y}, {}, {}, {}, "sum");
  PlanDesc::output(*s.p, y, "y");
  auto f = open_ok(s.d);
  ASSERT_NE(f, nullptr);
  CpuExecutor ex(*f->plan(), 0);
  ex.set_check_memory_plan(true);
  const pl::Program &p = *ex.program("step");
  float *xin = static_cast<float *>(ex.value_data(p, x));
  fill(xin, 16, 9, 2.0);
  ASSERT_EQ(ex.run(p, 0), "");
  const float *a_bytes = static_cast<float *>(ex.value_data(p, alias));
  const float *out = static_cast<float *>(ex.value_data(p, y));
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(out[i], 2 * a_bytes[i]);
}

// ---------------------------------------------------------------------------
// A Llama-style block exercising every other opcode, checked against
// central differences of its own loss (dropout masks are fixed by the RNG
// offset, so the loss is a deterministic function of the weights). With
// `rope_in_split` the rotations run inside the split and its gradient
// (SPLIT_QKV_ROPE, SPLIT_QKV_ROPE_GRAD), as mt-fuse plans them.

struct Block {
  static constexpr int B = 2, S = 4, Vocab = 13, H = 8, Heads = 2, Groups = 1, D = 4, F = 6;
  PlanDesc d;
  int tok, pos, n1, qkv, wo, n2, w1, w2, out;
  uint32_t tokens, labels, loss;
  std::vector<int32_t> token_ids = {1, 5, 12, 0, 7, 7, 3, 9};
  std::vector<int32_t> label_ids = {5, 12, 0, 7, 7, 3, 9, 2};

  explicit Block(bool rope_in_split = false) {
    tok = d.param("embedding.word_embeddings.weight", {Vocab, H});
    pos = d.param("embedding.position_embeddings.weight", {S, H});
    n1 = d.param("layers.0.input_layernorm.weight", {H}, pl::Init::ONES);
    qkv = d.param("layers.0.self_attention.linear_qkv.weight", {Groups * (Heads / Groups + 2) * D, H});
    wo = d.param("layers.0.self_attention.linear_proj.weight", {H, Heads * D});
    n2 = d.param("layers.0.pre_mlp_layernorm.weight", {H}, pl::Init::ONES);
    w1 = d.param("layers.0.mlp.linear_fc1.weight", {2 * F, H});
    w2 = d.param("layers.0.mlp.linear_fc2.weight", {H, F});
    out = d.param("output_layer.weight", {Vocab, H});
    Prog &p = d.program("train_step");
    auto W = [&](int param) { return d.weight(p, param); };
    auto A = [&](const char *name, std::vector<int64_t> shape) { return d.arena(p, name, shape); };
    auto P = [](int i) { return uint32_t(i); };
    using O = Opcode;
    const double eps = 1e-5, base = 10000, scale = 1 / std::sqrt(double(D)), rate = 0.25;
    tokens = d.input(p, "tokens", {B, S}, DType::I32);
    labels = d.input(p, "labels", {B, S}, DType::I32);
    uint32_t ids = d.arena(p, "position_ids", {B, S}, DType::I32);
    uint32_t xt = A("xt", {B, S, H}), xp = A("xp", {B, S, H}), x0 = A("x0", {B, S, H});
    uint32_t h1 = A("h1", {B, S, H}), q3 = A("qkv", {B, S, Groups * (Heads / Groups + 2) * D});
    uint32_t qr = A("qr", {B, S, Heads, D}), kr = A("kr", {B, S, Groups, D}), v = A("v", {B, S, Groups, D});
    uint32_t o = A("o", {B, S, Heads, D}), o2 = A("o2", {B, S, Heads * D});
    uint32_t lse = A("lse", {B, Heads, S});
    p.values[o2].offset = p.values[o].offset; // a view
    uint32_t ao = A("ao", {B, S, H}), ad = A("ad", {B, S, H}), x5 = A("x5", {B, S, H});
    uint32_t h2 = A("h2", {B, S, H}), u = A("u", {B, S, 2 * F}), sw = A("sw", {B, S, F});
    uint32_t m = A("m", {B, S, H}), x6 = A("x6", {B, S, H}), logits = A("logits", {B, S, Vocab});
    loss = A("loss", {});
    PlanDesc::op(p, O::POSITION_IDS, {}, {ids});
    PlanDesc::op(p, O::EMBEDDING, {W(tok), tokens}, {xt}, {}, {0});
    PlanDesc::op(p, O::EMBEDDING, {W(pos), ids}, {xp}, {}, {0});
    PlanDesc::op(p, O::ADD, {xt, xp}, {x0});
    PlanDesc::op(p, O::RMS_NORM, {x0, W(n1)}, {h1}, {}, {}, {eps, 0.0});
    PlanDesc::op(p, O::MATMUL, {h1, W(qkv)}, {q3});
    if (rope_in_split) {
      PlanDesc::op(p, O::SPLIT_QKV_ROPE, {q3}, {qr, kr, v}, {}, {}, {base, 0.0});
    } else {
      uint32_t q = A("q", {B, S, Heads, D}), k = A("k", {B, S, Groups, D});
      PlanDesc::op(p, O::SPLIT_QKV, {q3}, {q, k, v});
      PlanDesc::op(p, O::ROPE, {q}, {qr}, {}, {}, {base, 0.0});
      PlanDesc::op(p, O::ROPE, {k}, {kr}, {}, {}, {base, 0.0});
    }
    PlanDesc::op(p, O::ATTENTION, {qr, kr, v}, {o, lse}, {}, {1, 1, -1}, {scale, rate});
    PlanDesc::op(p, O::RESHAPE, {o}, {o2});
    PlanDesc::op(p, O::MATMUL, {o2, W(wo)}, {ao});
    PlanDesc::op(p, O::DROPOUT, {ao}, {ad}, {}, {2, -1}, {rate});
    PlanDesc::op(p, O::ADD, {x0, ad}, {x5});
    PlanDesc::op(p, O::RMS_NORM, {x5, W(n2)}, {h2}, {}, {}, {eps, 0.0});
    PlanDesc::op(p, O::MATMUL, {h2, W(w1)}, {u});
    PlanDesc::op(p, O::SWIGLU, {u}, {sw});
    PlanDesc::op(p, O::MATMUL, {sw, W(w2)}, {m});
    PlanDesc::op(p, O::ADD, {x5, m}, {x6});
    PlanDesc::op(p, O::MATMUL, {x6, W(out)}, {logits});
    PlanDesc::op(p, O::CROSS_ENTROPY, {logits, labels}, {loss}, {}, {0});
    PlanDesc::output(p, loss, "loss");

    uint32_t dl = A("dloss", {}), dlogits = A("dlogits", {B, S, Vocab}), dx6 = A("dx6", {B, S, H});
    uint32_t dsw = A("dsw", {B, S, F}), du = A("du", {B, S, 2 * F}), dh2 = A("dh2", {B, S, H});
    uint32_t dx5b = A("dx5b", {B, S, H}), dx5 = A("dx5", {B, S, H}), dao = A("dao", {B, S, H});
    uint32_t do2 = A("do2", {B, S, Heads * D}), dov = A("do", {B, S, Heads, D});
    p.values[dov].offset = p.values[do2].offset;
    uint32_t dqr = A("dqr", {B, S, Heads, D}), dkr = A("dkr", {B, S, Groups, D}), dv = A("dv", {B, S, Groups, D});
    uint32_t dq3 = A("dqkv", {B, S, Groups * (Heads / Groups + 2) * D}), dh1 = A("dh1", {B, S, H});
    uint32_t dx0b = A("dx0b", {B, S, H}), dx0 = A("dx0", {B, S, H});
    PlanDesc::op(p, O::GRAD_SEED, {}, {dl}, {}, {}, {1.0});
    PlanDesc::op(p, O::CROSS_ENTROPY_GRAD, {logits, labels, dl}, {dlogits}, {}, {0});
    PlanDesc::op(p, O::MATMUL_INPUT_GRAD, {dlogits, W(out)}, {dx6});
    PlanDesc::op(p, O::MATMUL_WEIGHT_GRAD, {dlogits, x6}, {}, {P(out)});
    PlanDesc::op(p, O::MATMUL_INPUT_GRAD, {dx6, W(w2)}, {dsw});
    PlanDesc::op(p, O::MATMUL_WEIGHT_GRAD, {dx6, sw}, {}, {P(w2)});
    PlanDesc::op(p, O::SWIGLU_GRAD, {dsw, u}, {du});
    PlanDesc::op(p, O::MATMUL_INPUT_GRAD, {du, W(w1)}, {dh2});
    PlanDesc::op(p, O::MATMUL_WEIGHT_GRAD, {du, h2}, {}, {P(w1)});
    PlanDesc::op(p, O::RMS_NORM_GRAD, {dh2, x5, W(n2)}, {dx5b}, {P(n2)}, {}, {eps, 0.0});
    PlanDesc::op(p, O::ADD, {dx6, dx5b}, {dx5});
    PlanDesc::op(p, O::DROPOUT, {dx5}, {dao}, {}, {2, -1}, {rate}); // the same mask
    PlanDesc::op(p, O::MATMUL_INPUT_GRAD, {dao, W(wo)}, {do2});
    PlanDesc::op(p, O::MATMUL_WEIGHT_GRAD, {dao, o2}, {}, {P(wo)});
    PlanDesc::op(p, O::RESHAPE, {do2}, {dov});
    PlanDesc::op(p, O::ATTENTION_GRAD, {dov, qr, kr, v, o, lse}, {dqr, dkr, dv}, {}, {1, 1, -1},
                 {scale, rate});
    if (rope_in_split) {
      PlanDesc::op(p, O::SPLIT_QKV_ROPE_GRAD, {dqr, dkr, dv}, {dq3}, {}, {}, {base, 0.0});
    } else {
      uint32_t dq = A("dq", {B, S, Heads, D}), dk = A("dk", {B, S, Groups, D});
      PlanDesc::op(p, O::ROPE_GRAD, {dqr}, {dq}, {}, {}, {base, 0.0});
      PlanDesc::op(p, O::ROPE_GRAD, {dkr}, {dk}, {}, {}, {base, 0.0});
      PlanDesc::op(p, O::SPLIT_QKV_GRAD, {dq, dk, dv}, {dq3});
    }
    PlanDesc::op(p, O::MATMUL_INPUT_GRAD, {dq3, W(qkv)}, {dh1});
    PlanDesc::op(p, O::MATMUL_WEIGHT_GRAD, {dq3, h1}, {}, {P(qkv)});
    PlanDesc::op(p, O::RMS_NORM_GRAD, {dh1, x0, W(n1)}, {dx0b}, {P(n1)}, {}, {eps, 0.0});
    PlanDesc::op(p, O::ADD, {dx5, dx0b}, {dx0});
    PlanDesc::op(p, O::EMBEDDING_GRAD, {dx0, tokens}, {}, {P(tok)}, {0});
    PlanDesc::op(p, O::EMBEDDING_GRAD, {dx0, ids}, {}, {P(pos)}, {0});
  }
};

TEST(CpuExecutor, LlamaStyleBlockGradientsMatchFiniteDifferences) {
  Block blk;
  auto f = open_ok(blk.d);
  ASSERT_NE(f, nullptr);
  CpuExecutor ex(*f->plan(), 0);
  ex.set_seed(42);
  ex.set_check_memory_plan(true);
  for (int p = 0; p < 9; ++p) {
    fill(ex.weight(p), ex.param_elements(p), uint64_t(100 + p), 0.5);
    if (p == blk.n1 || p == blk.n2)
      for (int64_t i = 0; i < ex.param_elements(p); ++i)
        ex.weight(p)[i] += 1.0f;
  }
  ex.zero_grads();
  const pl::Program &prog = *ex.program("train_step");
  const uint64_t offset = 17;
  // Inputs are written before every run: the arena is shared, and under
  // --check-memory-plan they are poisoned once their last reader is done.
  auto loss = [&](uint64_t rng_offset) {
    write_ids(ex, prog, blk.tokens, blk.token_ids);
    write_ids(ex, prog, blk.labels, blk.label_ids);
    std::string e = ex.run(prog, rng_offset);
    EXPECT_EQ(e, "");
    return double(*static_cast<float *>(ex.value_data(prog, blk.loss)));
  };
  loss(offset);
  std::vector<std::vector<float>> grads;
  for (int p = 0; p < 9; ++p) {
    grads.emplace_back(ex.grad(p), ex.grad(p) + ex.param_elements(p));
    float largest = 0;
    for (float g : grads.back())
      largest = std::max(largest, std::abs(g));
    EXPECT_GT(largest, 1e-3f) << "parameter " << p << " gets a gradient";
  }
  // A different RNG offset changes the dropout masks and so the loss.
  double base_loss = loss(offset);
  EXPECT_NE(loss(offset + 1), base_loss);

  const float h = 1e-2f;
  for (int p = 0; p < 9; ++p) {
    float *w = ex.weight(p);
    for (int64_t i = 0; i < ex.param_elements(p); ++i) {
      const float keep = w[i];
      w[i] = keep + h;
      double up = loss(offset);
      w[i] = keep - h;
      double down = loss(offset);
      w[i] = keep;
      double fd = (up - down) / (2.0 * double(h));
      EXPECT_NEAR(grads[size_t(p)][size_t(i)], fd, 2e-3 + 2e-2 * std::abs(fd))
          << f->plan()->ranks()->Get(0)->params()->Get(uint32_t(p))->name()->str() << "[" << i << "]";
    }
  }
}

// The rotation inside the split and its gradient compute exactly what the
// separate instructions compute: the same loss and gradients, bit for bit.
TEST(CpuExecutor, RopeInSplitEqualsSplitThenRope) {
  std::vector<double> losses;
  std::vector<std::vector<std::vector<float>>> grads;
  for (bool fused : {false, true}) {
    Block blk(fused);
    auto f = open_ok(blk.d);
    ASSERT_NE(f, nullptr);
    CpuExecutor ex(*f->plan(), 0);
    ex.set_seed(42);
    ex.set_check_memory_plan(true);
    for (int p = 0; p < 9; ++p)
      fill(ex.weight(p), ex.param_elements(p), uint64_t(100 + p), 0.5);
    ex.zero_grads();
    const pl::Program &prog = *ex.program("train_step");
    write_ids(ex, prog, blk.tokens, blk.token_ids);
    write_ids(ex, prog, blk.labels, blk.label_ids);
    ASSERT_EQ(ex.run(prog, 17), "");
    losses.push_back(double(*static_cast<float *>(ex.value_data(prog, blk.loss))));
    grads.emplace_back();
    for (int p = 0; p < 9; ++p)
      grads.back().emplace_back(ex.grad(p), ex.grad(p) + ex.param_elements(p));
  }
  EXPECT_EQ(losses[0], losses[1]);
  for (int p = 0; p < 9; ++p)
    EXPECT_EQ(grads[0][size_t(p)], grads[1][size_t(p)]) << "parameter " << p;
}

TEST(PlanReader, RopeInSplitErrors) {
  {
    Block blk(true); // a base that rotates nothing
    for (I &ins : blk.d.programs[0].code)
      if (ins.op == Opcode::SPLIT_QKV_ROPE)
        ins.floats = {1.0, 0.0};
    EXPECT_CONTAINS(semantic_error(blk.d),
                    "SPLIT_QKV_ROPE: floats[0] (base) is 1.000000; it must exceed 1");
  }
  {
    Block blk(true); // Llama 3.1's scaling factor below 1
    for (I &ins : blk.d.programs[0].code)
      if (ins.op == Opcode::SPLIT_QKV_ROPE)
        ins.floats[1] = 0.5;
    EXPECT_CONTAINS(semantic_error(blk.d), "SPLIT_QKV_ROPE: floats[1] (RoPE scaling factor) is "
                                           "0.500000; it must be 0 (no scaling) or at least 1");
  }
  {
    Block blk(true); // a norm weight offset other than --apply-layernorm-1p's 1
    for (I &ins : blk.d.programs[0].code)
      if (ins.op == Opcode::RMS_NORM)
        ins.floats[1] = 2.0;
    EXPECT_CONTAINS(semantic_error(blk.d), "RMS_NORM: floats[1] (weight offset) is 2.000000; it "
                                           "must be 0, or 1 (weights applied as 1 + w)");
  }
  {
    Block blk(true); // dk as [b * s, 1, groups, d]: positions cannot be read from it
    for (I &ins : blk.d.programs[0].code)
      if (ins.op == Opcode::SPLIT_QKV_ROPE_GRAD)
        blk.d.programs[0].values[ins.in[1]].shape = {Block::B * Block::S, 1, Block::Groups, Block::D};
    EXPECT_CONTAINS(semantic_error(blk.d),
                    "SPLIT_QKV_ROPE_GRAD: needs dq[b, s, heads, d], dk[b, s, groups, d], "
                    "dv[b, s, groups, d] -> dqkv[b, s, groups * (heads/groups + 2) * d] with "
                    "groups dividing heads and even d");
  }
}

// ---------------------------------------------------------------------------
// Mixture of experts: one layer's router, dispatch, experts and combine, and
// their backward, as a program of T = 6 tokens (2 sequences of 3), E = 4
// experts, top-2, H = 8, expert width M = 10.

struct MoeChain {
  static constexpr int T = 6, E = 4, K = 2, H = 8, M = 10;
  PlanDesc d;
  int w;
  uint32_t logits, x, probs, map, aux, z, y, rows, tpe, h, dh, out, dy, dprobs, dx, dlogits;
  // topk, score_function, pre_softmax, load_balancing, capacity,
  // drop_policy, pad_to_capacity, seq_length, router_dtype.
  std::vector<int64_t> router_ints = {K, 0, 0, 1, 0, 0, 0, 3, 0, -1};
  std::vector<double> router_floats = {0.0, 0.01, 0.001};

  // logits_type: the logits' and their gradient's (f64 with fp64).
  explicit MoeChain(int64_t rowsN = T * K, std::vector<int64_t> permute_ints = {0, 0},
                    DType logits_type = DType::F32) {
    w = d.param("decoder.layers.0.mlp.experts.linear_fc1.weight", {E, M, H});
    Prog &p = d.program("moe");
    logits = d.input(p, "logits", {T, E}, logits_type);
    x = d.input(p, "x", {T, H});
    const uint32_t ww = d.weight(p, w);
    probs = d.arena(p, "probs", {T, E});
    map = d.arena(p, "routing_map", {T, E}, DType::I32);
    aux = d.arena(p, "aux_loss", {});
    z = d.arena(p, "z_loss", {});
    y = d.arena(p, "y", {rowsN, H});
    rows = d.arena(p, "row_ids", {rowsN}, DType::I32);
    tpe = d.arena(p, "tokens_per_expert", {E}, DType::I32);
    h = d.arena(p, "h", {rowsN, M});
    dh = d.arena(p, "dh", {rowsN, H});
    out = d.arena(p, "out", {T, H});
    dy = d.arena(p, "dy", {rowsN, H});
    dprobs = d.arena(p, "dprobs", {T, E});
    dx = d.arena(p, "dx", {T, H});
    dlogits = d.arena(p, "dlogits", {T, E}, logits_type);
    PlanDesc::op(p, Opcode::MOE_ROUTER, {logits}, {probs, map, aux, z}, {}, router_ints,
                 router_floats, "router");
    PlanDesc::op(p, Opcode::MOE_PERMUTE, {x, map}, {y, rows, tpe}, {}, permute_ints, {},
                 "permute");
    PlanDesc::op(p, Opcode::GROUPED_MATMUL, {y, ww, tpe}, {h}, {}, {}, {}, "experts");
    PlanDesc::op(p, Opcode::GROUPED_MATMUL_INPUT_GRAD, {h, ww, tpe}, {dh}, {}, {}, {},
                 "experts dgrad");
    PlanDesc::op(p, Opcode::GROUPED_MATMUL_WEIGHT_GRAD, {h, y, tpe}, {}, {uint32_t(w)}, {}, {},
                 "experts wgrad");
    PlanDesc::op(p, Opcode::MOE_UNPERMUTE, {dh, probs, rows, tpe}, {out}, {}, {}, {},
                 "unpermute");
    PlanDesc::op(p, Opcode::MOE_UNPERMUTE_GRAD, {out, dh, probs, rows, tpe}, {dy, dprobs}, {},
                 {}, {}, "unpermute grad");
    PlanDesc::op(p, Opcode::MOE_PERMUTE_GRAD, {dy, rows}, {dx}, {}, {}, {}, "permute grad");
    PlanDesc::op(p, Opcode::MOE_ROUTER_GRAD, {dprobs, logits, probs, map, aux}, {dlogits}, {},
                 router_ints, router_floats, "router grad");
  }
  Prog &prog() { return d.programs[0]; }
  I &ins(Opcode op) {
    for (I &i : prog().code)
      if (i.op == op)
        return i;
    ADD_FAILURE() << "no " << pl::EnumNameOpcode(op);
    return prog().code[0];
  }
};

TEST(PlanReader, MoeInstructionsOpen) {
  EXPECT_NE(open_ok(MoeChain().d), nullptr);
  // Capacity 2 per expert: padded (N = E x 2), or at most E x 2 rows.
  MoeChain padded(8, {2, 1});
  padded.ins(Opcode::MOE_ROUTER).ints[4] = 2;
  padded.ins(Opcode::MOE_ROUTER).ints[6] = 1;
  EXPECT_NE(open_ok(padded.d), nullptr);
  EXPECT_NE(open_ok(MoeChain(7, {2, 0}).d), nullptr);
  // A bf16 model: logits, tokens and expert rows in bf16; probs, dprobs f32.
  MoeChain bf16;
  for (uint32_t v : {bf16.logits, bf16.x, bf16.y, bf16.h, bf16.dh, bf16.out, bf16.dy, bf16.dx,
                     bf16.dlogits})
    bf16.prog().values[v].dtype = DType::BF16;
  bf16.d.params[size_t(bf16.w)].dtype = DType::BF16;
  bf16.prog().values[2].dtype = DType::BF16;
  EXPECT_NE(open_ok(bf16.d), nullptr);
}

// A bf16 chain runs: the router rounds its weights to the logits' bf16 (as
// Megatron's type_as), and every bf16 result is a bf16 value.
// fp64 (router_dtype 2): the CPU routes f64 logits, not rounded to f32, and
// writes their f64 gradient: against the double router kernels on logits
// that no float holds.
TEST(CpuExecutor, MoeChainWithF64Logits) {
  MoeChain c(MoeChain::T * MoeChain::K, {0, 0}, DType::F64);
  c.ins(Opcode::MOE_ROUTER).ints[8] = 2;
  c.ins(Opcode::MOE_ROUTER_GRAD).ints[8] = 2;
  auto f = open_ok(c.d);
  ASSERT_NE(f, nullptr);
  CpuExecutor ex(*f->plan(), 0);
  ex.set_check_memory_plan(true);
  const pl::Program &p = *ex.program("moe");
  constexpr int n = MoeChain::T * MoeChain::E;
  double *logits = static_cast<double *>(ex.value_data(p, c.logits));
  std::vector<float> seed(n);
  fill(seed.data(), n, 41, 2.0);
  for (int i = 0; i < n; ++i) // below f32's resolution: 1 + 2^-40 relative
    logits[i] = double(seed[size_t(i)]) * (1.0 + 0x1p-40 * double(i % 7));
  const std::vector<double> in(logits, logits + n);
  fill(static_cast<float *>(ex.value_data(p, c.x)), MoeChain::T * MoeChain::H, 42, 1.0);
  fill(ex.weight(c.w), ex.param_elements(c.w), 43, 0.5);
  ASSERT_EQ(ex.run(p, 0), "");
  mt::cpu::MoeRouterConfig rc;
  rc.tokens = MoeChain::T;
  rc.experts = MoeChain::E;
  rc.topk = MoeChain::K;
  rc.load_balancing = 1;
  rc.seq_length = 3;
  rc.aux_loss_coeff = 0.01;
  rc.z_loss_coeff = 0.001;
  rc.fp64 = true;
  std::vector<double> probs(n);
  std::vector<int32_t> map(n);
  double aux = 0, z = 0;
  mt::cpu::moe_router_fwd(in.data(), rc, probs.data(), map.data(), &aux, &z);
  const float *got = static_cast<float *>(ex.value_data(p, c.probs));
  for (int i = 0; i < n; ++i)
    EXPECT_EQ(got[i], float(probs[size_t(i)])) << "probs[" << i << "], f32 from double";
  // The gradient: the chain's dprobs and seed through the double kernel.
  const float *dprobs = static_cast<float *>(ex.value_data(p, c.dprobs));
  const std::vector<double> dp(dprobs, dprobs + n);
  std::vector<double> want(n);
  mt::cpu::moe_router_bwd(dp.data(), in.data(), map.data(), rc,
                          double(*static_cast<float *>(ex.value_data(p, c.aux))), want.data());
  const double *dlogits = static_cast<double *>(ex.value_data(p, c.dlogits));
  for (int i = 0; i < n; ++i)
    EXPECT_EQ(dlogits[i], want[size_t(i)]) << "dlogits[" << i << "], bit for bit in double";
}

TEST(CpuExecutor, MoeChainInBf16) {
  MoeChain c;
  for (uint32_t v : {c.logits, c.x, c.y, c.h, c.dh, c.out, c.dy, c.dx, c.dlogits})
    c.prog().values[v].dtype = DType::BF16;
  c.d.params[size_t(c.w)].dtype = DType::BF16;
  c.prog().values[2].dtype = DType::BF16;
  auto f = open_ok(c.d);
  ASSERT_NE(f, nullptr);
  CpuExecutor ex(*f->plan(), 0);
  ex.set_check_memory_plan(true);
  const pl::Program &p = *ex.program("moe");
  float *logits = static_cast<float *>(ex.value_data(p, c.logits));
  fill(logits, MoeChain::T * MoeChain::E, 41, 2.0);
  mt::cpu::round_to_bf16(logits, MoeChain::T * MoeChain::E);
  const std::vector<float> in(logits, logits + MoeChain::T * MoeChain::E);
  float *x = static_cast<float *>(ex.value_data(p, c.x));
  fill(x, MoeChain::T * MoeChain::H, 42, 1.0);
  mt::cpu::round_to_bf16(x, MoeChain::T * MoeChain::H);
  fill(ex.weight(c.w), ex.param_elements(c.w), 43, 0.5);
  mt::cpu::round_to_bf16(ex.weight(c.w), ex.param_elements(c.w));
  ASSERT_EQ(ex.run(p, 0), "");
  mt::cpu::MoeRouterConfig rc;
  rc.tokens = MoeChain::T;
  rc.experts = MoeChain::E;
  rc.topk = MoeChain::K;
  rc.load_balancing = 1;
  rc.seq_length = 3;
  rc.aux_loss_coeff = 0.01;
  rc.z_loss_coeff = 0.001;
  rc.rounding = mt::cpu::RouterRounding::BF16;
  std::vector<float> probs(in.size());
  std::vector<int32_t> map(in.size());
  double aux = 0, z = 0;
  mt::cpu::moe_router_fwd(in.data(), rc, probs.data(), map.data(), &aux, &z);
  const float *got = static_cast<float *>(ex.value_data(p, c.probs));
  int kept = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    EXPECT_EQ(got[i], probs[i]) << i;
    float r = got[i];
    mt::cpu::round_to_bf16(&r, 1);
    EXPECT_EQ(r, got[i]) << "probs[" << i << "] is a bf16 value";
    kept += got[i] > 0;
  }
  EXPECT_EQ(kept, MoeChain::T * MoeChain::K);
  const float *dlogits = static_cast<float *>(ex.value_data(p, c.dlogits));
  for (int i = 0; i < MoeChain::T * MoeChain::E; ++i) {
    float r = dlogits[i];
    mt::cpu::round_to_bf16(&r, 1);
    EXPECT_EQ(r, dlogits[i]);
  }
}

TEST(PlanReader, MoeInstructionErrors) {
  for (auto [k, v, message] :
       {std::tuple<size_t, int64_t, const char *>{
            0, 5, "(router) MOE_ROUTER: ints[0] (topk) is 5, more than the 4 experts of %logits"},
        {0, 0, "MOE_ROUTER: ints[0] (topk) is 0; it must be at least 1"},
        {1, 2, "MOE_ROUTER: ints[1] (score_function) is 2; it must be 0 (softmax) or 1 (sigmoid)"},
        {3, 3, "MOE_ROUTER: ints[3] (load_balancing) is 3; it must be 0 (none), 1 (aux_loss) or "
               "2 (seq_aux_loss)"},
        {4, -1, "MOE_ROUTER: ints[4] (capacity) is -1"},
        {5, 2, "MOE_ROUTER: ints[5] (drop_policy) is 2; it must be 0 (probs) or 1 (position)"},
        {6, 1, "MOE_ROUTER: ints[6] (pad_to_capacity) is 1 without a capacity (ints[4] is 0)"},
        {7, 4, "MOE_ROUTER: ints[7] (seq_length) 4 does not divide the 6 tokens of"},
        {8, 3, "MOE_ROUTER: ints[8] (router_dtype) is 3; it must be 0 (the logits' type), 1 "
               "(fp32) or 2 (fp64)"}}) {
    MoeChain c;
    c.ins(Opcode::MOE_ROUTER).ints[k] = v;
    EXPECT_CONTAINS(semantic_error(c.d), message);
  }
  {
    MoeChain c; // a capacity beyond the tokens, padded
    c.ins(Opcode::MOE_ROUTER).ints[4] = 7;
    c.ins(Opcode::MOE_ROUTER).ints[6] = 1;
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_ROUTER: ints[4] (capacity) 7 with pad_to_capacity "
                                         "exceeds the 6 tokens of");
  }
  {
    MoeChain c; // a negative coefficient
    c.ins(Opcode::MOE_ROUTER_GRAD).floats[1] = -0.5;
    EXPECT_CONTAINS(semantic_error(c.d), "(router grad) MOE_ROUTER_GRAD: floats[1] "
                                         "(aux_loss_coeff) is -0.500000; it must be >= 0");
  }
  {
    MoeChain c(MoeChain::T * MoeChain::K, {0, 0}, DType::F64); // f64 logits without fp64
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_ROUTER: ints[8] (router_dtype) is 0 with f64 "
                                         "logits; fp64 (2) and f64 logits go together");
  }
  {
    MoeChain c; // fp64 on f32 logits
    c.ins(Opcode::MOE_ROUTER).ints[8] = 2;
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_ROUTER: ints[8] (router_dtype) is 2 with f32 "
                                         "logits; fp64 (2) and f64 logits go together");
  }
  {
    MoeChain c(MoeChain::T * MoeChain::K, {0, 0}, DType::F64); // fp64, a valid chain
    c.ins(Opcode::MOE_ROUTER).ints[8] = 2;
    c.ins(Opcode::MOE_ROUTER_GRAD).ints[8] = 2;
    EXPECT_NE(open_ok(c.d), nullptr);
    c.prog().values[c.dlogits].dtype = DType::F32; // an f32 gradient of f64 logits
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_ROUTER_GRAD: needs dlogits of the logits' type");
  }
  {
    MoeChain c; // f64 where only the router's logits may be
    c.prog().values[c.x].dtype = DType::F64;
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_PERMUTE: in[0] (%x [6,8] f64) must be a float "
                                         "tensor (f32, bf16 or f16)");
  }
  {
    MoeChain c; // a routing map of floats
    c.prog().values[c.map].dtype = DType::F32;
    EXPECT_CONTAINS(semantic_error(c.d),
                    "MOE_ROUTER: out[1] (%routing_map [6,4] f32) must be an i32 tensor");
  }
  {
    MoeChain c; // probs of another shape
    c.prog().values[c.probs].shape = {6, 3};
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_ROUTER: needs logits[T, E] -> probs[T, E], "
                                         "routing_map[T, E], aux_loss, z_loss, got");
  }
  // Dispatched rows that do not fit the routing: N = T x topk without a
  // capacity, E x C padded, at most E x C with a capacity.
  EXPECT_CONTAINS(semantic_error(MoeChain(10).d),
                  "MOE_PERMUTE: without a capacity, needs N = T x topk (topk at most E), got "
                  "%x [6,8] f32, %routing_map [6,4] i32 -> %y [10,8] f32");
  EXPECT_CONTAINS(semantic_error(MoeChain(12, {2, 1}).d),
                  "MOE_PERMUTE: with pad_to_capacity, needs capacity (ints[0] 2) at most T and "
                  "N = E x capacity, got");
  EXPECT_CONTAINS(semantic_error(MoeChain(9, {2, 0}).d),
                  "MOE_PERMUTE: with capacity 2 (ints[0]), needs N at most min(T x E, E x "
                  "capacity), got");
  {
    MoeChain c;
    c.ins(Opcode::MOE_PERMUTE).ints = {0, 2};
    EXPECT_CONTAINS(semantic_error(c.d),
                    "MOE_PERMUTE: ints[1] (pad_to_capacity) is 2; it must be 0 or 1");
  }
  {
    MoeChain c; // expert weights of another width than the rows
    c.d.params[size_t(c.w)].shape = {MoeChain::E, MoeChain::M, 5};
    c.prog().values[2].shape = {MoeChain::E, MoeChain::M, 5};
    EXPECT_CONTAINS(semantic_error(c.d), "(experts) GROUPED_MATMUL: needs x[N, K], w[E, M, K], "
                                         "tokens_per_expert[E] -> y[N, M], got");
  }
  {
    MoeChain c; // tokens_per_expert of another expert count
    c.prog().values[c.tpe].shape = {3};
    EXPECT_CONTAINS(semantic_error(c.d), "(permute) MOE_PERMUTE: needs");
  }
  {
    MoeChain c; // the combined output in another dtype than the expert rows
    c.prog().values[c.out].dtype = DType::BF16;
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_UNPERMUTE: needs y[N, H], probs[T, E], row_ids[N], "
                                         "tokens_per_expert[E] -> out[T, H] of y's dtype");
  }
  {
    MoeChain c; // dprobs of another shape than probs
    c.prog().values[c.dprobs].shape = {6, 5};
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_UNPERMUTE_GRAD: needs dout[T, H], y[N, H], "
                                         "probs[T, E], row_ids[N], tokens_per_expert[E] -> "
                                         "dy[N, H] of y's dtype, dprobs[T, E]");
  }
  {
    MoeChain c; // row ids of another count than the rows
    c.prog().values[c.rows].shape = {11};
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_PERMUTE: needs x[T, H], routing_map[T, E] -> "
                                         "y[N, H] of x's dtype, row_ids[N], tokens_per_expert[E]");
  }
  {
    MoeChain c; // dprobs in bf16 (the probabilities and their gradient are f32)
    c.prog().values[c.dprobs].dtype = DType::BF16;
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_UNPERMUTE_GRAD: out[1] (%dprobs [6,4] bf16) must be "
                                         "an f32 tensor");
  }
  {
    MoeChain c; // the router gradient without its scale
    c.ins(Opcode::MOE_ROUTER_GRAD).in.pop_back();
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_ROUTER_GRAD: has 4 inputs, its signature has 5");
  }
}

// ---------------------------------------------------------------------------
// Expert parallelism (format 16): dispatch and combine over ep = 2 ranks of
// dp = 4 (edp = 2), an expert parameter sharded on dim 0, a dense and an
// expert bucket sharded by the distributed optimizer. T = 6 tokens, E = 4
// experts (L = 2 local), top-2, H = 8, expert width M = 10; R = ep x T x
// min(topk, L) = 24 receive rows.

struct EpChain {
  static constexpr int T = 6, E = 4, L = 2, K = 2, H = 8, M = 10, N = T * K, R = 2 * T * 2;
  PlanDesc d;
  int dense, w;
  uint32_t y, tpe, rows, counts, layout, h, back;

  EpChain() {
    d.data_parallel = 4;
    d.expert_model_parallel = 2;
    dense = d.param("decoder.layers.0.mlp.router.weight", {E, 2});
    w = d.param("decoder.layers.0.mlp.experts.linear_fc1.weight", {L, M, H});
    d.params[size_t(w)].ep_dim = 0;
    d.params[size_t(w)].expert = true;
    d.params[size_t(dense)].flat_offset = 0;
    d.params[size_t(w)].flat_offset = 8;
    d.flat_elements = 8 + L * M * H;
    d.buckets = {Bk{{uint32_t(dense)}, 0, 8, 0, -1}, Bk{{uint32_t(w)}, 8, d.flat_elements, 6, -1}};
    Prog &p = d.program("moe");
    y = d.input(p, "y", {N, H});
    tpe = d.input(p, "tokens_per_expert", {E}, DType::I32);
    const uint32_t ww = d.weight(p, w);
    rows = d.arena(p, "rows", {R, H});
    counts = d.arena(p, "local_counts", {L}, DType::I32);
    layout = d.arena(p, "layout", {2, L}, DType::I32);
    h = d.arena(p, "h", {R, M});
    back = d.arena(p, "y_back", {N, H});
    PlanDesc::op(p, Opcode::MOE_DISPATCH, {y, tpe}, {rows, counts, layout}, {}, {4, L, 0, 1}, {},
                 "dispatch");
    PlanDesc::op(p, Opcode::GROUPED_MATMUL, {rows, ww, counts}, {h}, {}, {}, {}, "experts");
    PlanDesc::op(p, Opcode::MOE_COMBINE, {rows, layout, tpe}, {back}, {}, {4, L, 1, 1}, {},
                 "combine");
  }
  // The distributed optimizer: shard state of 8 / dp + 160 / edp elements.
  void shard() {
    d.distributed_optimizer = true;
    d.shard_elements = 8 / 4 + L * M * H / 2;
    d.shard_exp_avg = d.state_alloc(uint64_t(d.shard_elements) * 4);
    d.shard_exp_avg_sq = d.state_alloc(uint64_t(d.shard_elements) * 4);
    d.buckets[0].shard_offset = 0;
    d.buckets[1].shard_offset = 2;
  }
  Prog &prog() { return d.programs[0]; }
  I &ins(Opcode op) {
    for (I &i : prog().code)
      if (i.op == op)
        return i;
    ADD_FAILURE() << "no " << pl::EnumNameOpcode(op);
    return prog().code[0];
  }
};

TEST(PlanReader, ExpertParallelOpens) {
  EXPECT_NE(open_ok(EpChain().d), nullptr);
  EpChain sharded;
  sharded.shard();
  auto f = open_ok(sharded.d);
  ASSERT_NE(f, nullptr);
  const pl::Plan &plan = *f->plan();
  EXPECT_EQ(plan.expert_model_parallel(), 2);
  EXPECT_EQ(mt::rt::expert_data_parallel(plan), 2);
  const auto *buckets = plan.ranks()->Get(0)->buckets();
  EXPECT_EQ(mt::rt::bucket_group_size(plan, *buckets->Get(0)), 4);
  EXPECT_EQ(mt::rt::bucket_group_size(plan, *buckets->Get(1)), 2);
  EXPECT_EQ(mt::rt::bucket_shard_state_offset(plan, *buckets->Get(1)), 2);
  // The group-7 spelling of the same ranks (tp_ep, expert_tensor_parallel 1).
  EpChain tp_ep;
  tp_ep.ins(Opcode::MOE_DISPATCH).ints[0] = 7;
  EXPECT_NE(open_ok(tp_ep.d), nullptr);
  // Without shard offsets (every bucket a dp bucket) a shard starts at begin / dp.
  EpChain dense;
  dense.d.params[size_t(dense.w)].ep_dim = -1;
  dense.d.params[size_t(dense.w)].expert = false;
  dense.d.expert_model_parallel = 1;
  dense.prog().code.clear();
  dense.d.buckets[1].group = 0;
  auto g = open_ok(dense.d);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(mt::rt::bucket_shard_state_offset(*g->plan(), *g->plan()->ranks()->Get(0)->buckets()->Get(1)),
            8 / 4);
}

// The reader's expert coordinates are runtime/comm's (parallel_groups.h).
TEST(PlanReader, ExpertCoordsMatchParallelGroups) {
  for (auto [tp, dp, pp, ep] : {std::tuple<int, int, int, int>{1, 4, 1, 2}, {2, 2, 2, 2},
                                {2, 2, 1, 4}, {4, 2, 1, 2}, {2, 4, 2, 8}, {2, 1, 2, 1}}) {
    mt::rt::ParallelLayout layout;
    layout.tp = tp, layout.dp = dp, layout.pp = pp, layout.ep = ep;
    ASSERT_EQ(mt::rt::check_layout(layout), "");
    for (int r = 0; r < layout.world(); ++r) {
      const mt::rt::RankCoords c = mt::rt::coords_of(layout, r);
      const mt::rt::ExpertCoords e = mt::rt::expert_coords(tp, ep, 1, c.tp, c.dp);
      EXPECT_EQ(e.ep_rank, c.ep) << "rank " << r;
      EXPECT_EQ(e.edp_rank, c.edp) << "rank " << r;
      EXPECT_EQ(e.etp_rank, c.etp) << "rank " << r;
    }
  }
  // By hand: tp 2 x dp 2 with ep 2: stage index i = tp_rank + 2 dp_rank,
  // ep_rank = i % 2, edp_rank = i / 2.
  EXPECT_EQ(mt::rt::expert_coords(2, 2, 1, 1, 1).ep_rank, 1);
  EXPECT_EQ(mt::rt::expert_coords(2, 2, 1, 1, 1).edp_rank, 1);
  EXPECT_EQ(mt::rt::expert_coords(2, 2, 1, 0, 1).edp_rank, 1);
  EXPECT_EQ(mt::rt::expert_coords(2, 2, 1, 1, 0).ep_rank, 1);
}

TEST(PlanReader, ExpertParallelErrors) {
  for (auto [k, v, message] :
       {std::tuple<size_t, int64_t, const char *>{
            0, 5, "(dispatch) MOE_DISPATCH: ints[0] is group 5; tokens travel within group 4 "
                  "(ep) or 7 (tp_ep)"},
        {1, 0, "MOE_DISPATCH: ints[1] (num_local_experts) is 0; it must be >= 1"},
        {2, 2, "MOE_DISPATCH: ints[2] (dispatcher) is 2; it must be 0 (alltoall) or 1 "
               "(allgather)"},
        {1, 1, "MOE_DISPATCH: needs y[N, H], tokens_per_expert[ep x num_local_experts] -> "
               "rows[R, H] of y's dtype, local_counts[num_local_experts], layout[etp x ep, "
               "num_local_experts], got %y [12,8] f32, %tokens_per_expert [4] i32 -> %rows "
               "[24,8] f32, %local_counts [2] i32, %layout [2,2] i32"}}) {
    EpChain c;
    c.ins(Opcode::MOE_DISPATCH).ints[k] = v;
    EXPECT_CONTAINS(semantic_error(c.d), message);
  }
  {
    EpChain c; // the layout of another expert count
    c.prog().values[c.layout].shape = {2, 3};
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_DISPATCH: needs y[N, H]");
  }
  {
    EpChain c; // combined rows in another dtype
    c.prog().values[c.back].dtype = DType::BF16;
    EXPECT_CONTAINS(semantic_error(c.d),
                    "(combine) MOE_COMBINE: needs rows[R, H], layout[etp x ep, num_local_experts], "
                    "tokens_per_expert[ep x num_local_experts] -> y[N, H] of rows' dtype");
  }
  {
    EpChain c; // one expert-parallel rank
    c.d.expert_model_parallel = 1;
    c.d.params[size_t(c.w)].ep_dim = -1;
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_DISPATCH: exchanges tokens between "
                                         "expert-parallel ranks, but the plan has "
                                         "expert_model_parallel 1 x expert_tensor_parallel 1");
  }
  {
    EpChain c; // ep not dividing tp x dp
    c.d.expert_model_parallel = 3;
    EXPECT_CONTAINS(semantic_error(c.d), "expert_model_parallel 3 x expert_tensor_parallel 1 "
                                         "does not divide tensor_parallel 1 x data_parallel 4");
  }
  {
    EpChain c; // a sharded expert weight not marked expert
    c.d.params[size_t(c.w)].expert = false;
    EXPECT_CONTAINS(semantic_error(c.d),
                    "rank 0: parameter 1 (decoder.layers.0.mlp.experts.linear_fc1.weight) is "
                    "split over expert-parallel ranks (ep_dim 0) but is not an expert parameter");
  }
  {
    EpChain c;
    c.d.params[size_t(c.w)].ep_dim = 3;
    EXPECT_CONTAINS(semantic_error(c.d), "has ep_dim 3, not -1 or a dimension of [2,10,8]");
  }
  {
    EpChain c; // the expert bucket reduced over dp
    c.d.buckets[1].group = 0;
    EXPECT_CONTAINS(semantic_error(c.d),
                    "rank 0: bucket 1, parameter 1 (decoder.layers.0.mlp.experts.linear_fc1.weight) "
                    "is an expert parameter in a dp bucket (group 0); expert gradients are "
                    "reduced over group 6 (expt_dp)");
  }
  {
    EpChain c; // the dense bucket over expt_dp
    c.d.buckets[0].group = 6;
    EXPECT_CONTAINS(semantic_error(c.d), "rank 0: bucket 0, parameter 0 "
                                         "(decoder.layers.0.mlp.router.weight) is a dense "
                                         "parameter in an expert bucket (group 6)");
  }
  {
    EpChain c;
    c.d.buckets[0].group = 2;
    EXPECT_CONTAINS(semantic_error(c.d), "rank 0: bucket 0 is reduced over group 2; buckets use "
                                         "group 0 (dp) or 6 (expt_dp)");
  }
  {
    EpChain c; // an expert bucket of an odd size (edp 2)
    c.d.flat_elements += 1;
    c.d.buckets[1].end += 1;
    EXPECT_CONTAINS(semantic_error(c.d), "rank 0: bucket 1 has 161 elements, which do not divide "
                                         "by its group's 2 (expert data parallel) ranks");
  }
  {
    EpChain c; // sharded without the expert bucket's place in the shard state
    c.shard();
    c.d.buckets[1].shard_offset = -1;
    EXPECT_CONTAINS(semantic_error(c.d), "rank 0: bucket 1 is an expert bucket (group 6) without "
                                         "a shard_offset");
  }
  {
    EpChain c; // shards overlapping in the shard state
    c.shard();
    c.d.buckets[1].shard_offset = 1;
    EXPECT_CONTAINS(semantic_error(c.d),
                    "rank 0: two buckets' shards overlap in the shard state (shard_offset)");
  }
  {
    EpChain c; // a shard past the shard state
    c.shard();
    c.d.buckets[1].shard_offset = 3;
    EXPECT_CONTAINS(semantic_error(c.d), "rank 0: bucket 1's shard of 80 elements at shard_offset "
                                         "3 is not inside the 82 shard_elements");
  }
  for (auto [ins, message] :
       {std::pair<I, const char *>{
            I{Opcode::REDUCE_GRADS, {}, {}, {}, {0, 1, 0}, {0.5}, "dp"},
            "REDUCE_GRADS: ints[0] is group 0, but bucket 1 is reduced over group 6"},
        {I{Opcode::ALL_GATHER_PARAMS, {}, {}, {}, {6, 0}, {}, "dp"},
         "ALL_GATHER_PARAMS: ints[0] is group 6, but bucket 0 is reduced over group 0"},
        {I{Opcode::ALL_REDUCE_GRADS, {}, {}, {}, {0}, {0.5}, "dp"},
         "ALL_REDUCE_GRADS: reduces every parameter over group 0, but rank 0 has expert "
         "parameters (reduced over group 6, expt_dp)"},
        {I{Opcode::ALL_REDUCE_GRADS, {}, {}, {1}, {0}, {0.5}, "dp"},
         "ALL_REDUCE_GRADS: params[0] (decoder.layers.0.mlp.experts.linear_fc1.weight) is an "
         "expert parameter; expert gradients are reduced over group 6 (expt_dp)"},
        {I{Opcode::ALL_REDUCE_GRADS, {}, {}, {0}, {6}, {0.5}, "dp"},
         "ALL_REDUCE_GRADS: params[0] (decoder.layers.0.mlp.router.weight) is a dense "
         "parameter; group 6 (expt_dp) reduces expert gradients"}}) {
    EpChain c;
    c.prog().code.push_back(ins);
    EXPECT_CONTAINS(semantic_error(c.d), message);
  }
  {
    EpChain c; // expert gradients over an expert data-parallel group of one rank
    c.d.data_parallel = 2;
    c.d.flat_elements = 0;
    c.d.buckets.clear();
    c.prog().code.push_back(I{Opcode::ALL_REDUCE_GRADS, {}, {}, {1}, {6}, {0.5}, "edp"});
    EXPECT_CONTAINS(semantic_error(c.d), "ALL_REDUCE_GRADS: reduces over expert data-parallel "
                                         "ranks, but the plan has one");
  }
  {
    MoeChain c; // the router's count group
    c.ins(Opcode::MOE_ROUTER).ints[9] = 2;
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_ROUTER: ints[9] (count_group) is 2; it must be -1 "
                                         "(none) or 1 (tp)");
  }
  {
    MoeChain c;
    c.ins(Opcode::MOE_ROUTER_GRAD).ints[9] = 1;
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_ROUTER_GRAD: sums its token counts over "
                                         "tensor-parallel ranks (ints[9] count_group 1), but the "
                                         "plan has tensor_parallel 1");
  }
}

// Expert tensor parallelism (format 17): EpChain at expert_tensor_parallel
// 2 (dp 4 = etp 2 x ep 2, edp 1): the expert weight split over etp ranks on
// dim 1 besides ep on dim 0, the exchange over group 7's four ranks, its
// layout [etp x ep, L].
struct EtpChain : EpChain {
  EtpChain() {
    d.expert_tensor_parallel = 2;
    Par &p = d.params[size_t(w)];
    p.shape = {L, M / 2, H};
    p.tp_dim = 1;
    d.flat_elements = 8 + L * (M / 2) * H;
    d.buckets[1].end = d.flat_elements;
    for (V &v : prog().values)
      if (v.region == Region::WEIGHT)
        v.shape = p.shape;
    prog().values[layout].shape = {4, L};
    for (I &i : prog().code)
      if (i.op == Opcode::MOE_DISPATCH || i.op == Opcode::MOE_COMBINE)
        i.ints = {7, L, i.ints[2], 2};
    // The expert layer's output against the shard's [L, M / 2, H].
    prog().values[h].shape = {R, M / 2};
  }
};

TEST(PlanReader, ExpertTensorParallelOpens) {
  auto f = open_ok(EtpChain().d);
  ASSERT_NE(f, nullptr);
  const pl::Plan &plan = *f->plan();
  EXPECT_EQ(plan.expert_tensor_parallel(), 2);
  EXPECT_EQ(mt::rt::expert_data_parallel(plan), 1);
  const pl::Param &w = *plan.ranks()->Get(0)->params()->Get(1);
  EXPECT_EQ(w.tp_dim(), 1);
  EXPECT_EQ(w.ep_dim(), 0);
  // SwiGLU's fc1: gate and up halves, each split over the etp ranks.
  EtpChain swiglu;
  swiglu.d.params[size_t(swiglu.w)].tp_blocks = 5;
  EXPECT_NE(open_ok(swiglu.d), nullptr);
  // etp 2 without ep: the exchange over the two etp ranks (group 7).
  EtpChain alone;
  alone.d.expert_model_parallel = 1;
  alone.d.data_parallel = 2;
  alone.d.params[size_t(alone.w)].ep_dim = -1;
  alone.d.params[size_t(alone.w)].shape = {4, EpChain::M / 2, EpChain::H};
  alone.d.flat_elements = 8 + 4 * (EpChain::M / 2) * EpChain::H;
  alone.d.buckets[1].end = alone.d.flat_elements;
  for (V &v : alone.prog().values)
    if (v.region == Region::WEIGHT)
      v.shape = alone.d.params[size_t(alone.w)].shape;
  alone.prog().values[alone.layout].shape = {2, 4};
  alone.prog().values[alone.counts].shape = {4};
  for (I &i : alone.prog().code)
    if (i.op == Opcode::MOE_DISPATCH || i.op == Opcode::MOE_COMBINE)
      i.ints = {7, 4, i.ints[2], 2};
  EXPECT_NE(open_ok(alone.d), nullptr);
}

TEST(PlanReader, ExpertTensorParallelErrors) {
  {
    EtpChain c; // a format-16 exchange: three ints
    c.ins(Opcode::MOE_DISPATCH).ints.pop_back();
    EXPECT_CONTAINS(semantic_error(c.d), "(dispatch) MOE_DISPATCH: has 3 ints, its signature has "
                                         "4; recompile it with `mtc compile`");
  }
  {
    EtpChain c;
    c.ins(Opcode::MOE_COMBINE).ints[3] = 1;
    EXPECT_CONTAINS(semantic_error(c.d), "(combine) MOE_COMBINE: ints[3] (etp) is 1, but the "
                                         "plan has expert_tensor_parallel 2");
  }
  {
    EtpChain c;
    c.ins(Opcode::MOE_DISPATCH).ints[0] = 4;
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_DISPATCH: ints[0] is group 4 (ep), but with "
                                         "expert_tensor_parallel 2 tokens travel within group 7 "
                                         "(tp_ep)");
  }
  {
    EtpChain c; // the layout of the ep ranks only
    c.prog().values[c.layout].shape = {2, EpChain::L};
    EXPECT_CONTAINS(semantic_error(c.d), "MOE_DISPATCH: needs y[N, H], tokens_per_expert[ep x "
                                         "num_local_experts] -> rows[R, H] of y's dtype, "
                                         "local_counts[num_local_experts], layout[etp x ep, "
                                         "num_local_experts], got");
  }
  {
    EtpChain c; // both splits on one dimension
    c.d.params[size_t(c.w)].tp_dim = 0;
    EXPECT_CONTAINS(semantic_error(c.d),
                    "rank 0: parameter 1 (decoder.layers.0.mlp.experts.linear_fc1.weight) is "
                    "split over expert tensor- and expert-parallel ranks on the same dimension 0 "
                    "(tp_dim and ep_dim)");
  }
  {
    EpChain c; // an expert split over etp ranks in a plan of etp 1
    c.d.params[size_t(c.w)].tp_dim = 1;
    c.d.params[size_t(c.w)].tp_blocks = 1;
    EXPECT_CONTAINS(semantic_error(c.d),
                    "rank 0: parameter 1 (decoder.layers.0.mlp.experts.linear_fc1.weight) is an "
                    "expert parameter split over expert tensor-parallel ranks (tp_dim 1), but the "
                    "plan has expert_tensor_parallel 1");
  }
  {
    EtpChain c; // etp x ep not dividing tp x dp
    c.d.data_parallel = 2;
    EXPECT_CONTAINS(semantic_error(c.d), "expert_model_parallel 2 x expert_tensor_parallel 2 "
                                         "does not divide tensor_parallel 1 x data_parallel 2");
  }
  {
    EtpChain c;
    c.d.expert_tensor_parallel = 0;
    EXPECT_CONTAINS(semantic_error(c.d), "expert_tensor_parallel is 0; it must be from 1 to");
  }
}

// ---------------------------------------------------------------------------
// Expert parallelism on the CPU executor, ranks as threads: dispatch and
// combine (both dispatchers), and the router's counts over tensor-parallel
// ranks.

// Runs body(rank, groups) on each rank of `layout`, every rank a thread with
// its communicators; returns each rank's error ("" when it passed).
std::vector<std::string> on_ranks(mt::rt::ParallelLayout layout,
                                  const std::function<std::string(int, const mt::rt::ParallelGroups &)> &body) {
  const int world = layout.world();
  mt::rt::ThreadGroup group(world, std::chrono::milliseconds(60000));
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      std::unique_ptr<mt::rt::Communicator> c = group.rank(r);
      mt::rt::ParallelGroups groups;
      std::string e = mt::rt::make_parallel_groups(world > 1 ? c.get() : nullptr, layout, r, &groups);
      errors[size_t(r)] = e.empty() ? body(r, groups) : e;
    });
  for (std::thread &t : threads)
    t.join();
  return errors;
}

// One program: rows = dispatch(y, tokens_per_expert); doubled = rows + rows
// (or rows + bias, a rank's own input); back = combine(doubled, layout,
// tokens_per_expert). S = etp x ep ranks (dp S), group 4 at etp 1 and 7
// (tp_ep) otherwise.
struct EpExchange {
  int64_t ep, l, n, h, etp, s, r;
  bool with_bias;
  PlanDesc d;
  uint32_t y, tpe, rows, counts, layout, doubled, back, bias = 0;
  EpExchange(int64_t ep_, int64_t l_, int64_t n_, int64_t h_, int64_t dispatcher,
             int64_t etp_ = 1, bool with_bias_ = false)
      : ep(ep_), l(l_), n(n_), h(h_), etp(etp_), s(ep_ * etp_), r(ep_ * etp_ * n_),
        with_bias(with_bias_) {
    d.data_parallel = int32_t(s);
    d.expert_model_parallel = int32_t(ep);
    d.expert_tensor_parallel = int32_t(etp);
    d.all_ranks = true;
    Prog &p = d.program("exchange");
    y = d.input(p, "y", {n, h});
    tpe = d.input(p, "tokens_per_expert", {ep * l}, DType::I32);
    if (with_bias)
      bias = d.input(p, "bias", {r, h});
    rows = d.arena(p, "rows", {r, h});
    counts = d.arena(p, "local_counts", {l}, DType::I32);
    layout = d.arena(p, "layout", {s, l}, DType::I32);
    doubled = d.arena(p, "doubled", {r, h});
    back = d.arena(p, "back", {n, h});
    const int64_t group = etp > 1 ? 7 : 4;
    PlanDesc::op(p, Opcode::MOE_DISPATCH, {y, tpe}, {rows, counts, layout}, {},
                 {group, l, dispatcher, etp}, {}, "dispatch");
    PlanDesc::op(p, Opcode::ADD, {rows, with_bias ? bias : rows}, {doubled}, {}, {}, {}, "double");
    PlanDesc::op(p, Opcode::MOE_COMBINE, {doubled, layout, tpe}, {back}, {},
                 {group, l, dispatcher, etp}, {}, "combine");
    // Outputs, so that --check-memory-plan keeps them readable after the run.
    PlanDesc::output(p, rows, "rows");
    PlanDesc::output(p, counts, "local_counts");
    PlanDesc::output(p, layout, "layout");
    PlanDesc::output(p, back, "back");
  }
  mt::rt::ParallelLayout parallel() const {
    mt::rt::ParallelLayout lay;
    lay.dp = int(s);
    lay.ep = int(ep);
    lay.etp = int(etp);
    lay.experts = true;
    return lay;
  }
};

struct ExchangeResult {
  std::vector<float> rows, back;
  std::vector<int32_t> counts, layout;
};

// Runs an EpExchange with each rank's y and tokens_per_expert (and bias).
std::vector<std::string> run_exchange(EpExchange &x, const std::vector<std::vector<float>> &ys,
                                      const std::vector<std::vector<int32_t>> &tpes,
                                      std::vector<ExchangeResult> &out,
                                      const std::vector<float> &bias = {}) {
  auto f = open_ok(x.d);
  out.assign(size_t(x.s), {});
  if (!f)
    return {"the plan does not open"};
  return on_ranks(x.parallel(), [&](int rank, const mt::rt::ParallelGroups &groups) {
    CpuExecutor ex(*f->plan(), rank);
    ex.set_groups(&groups);
    ex.set_check_memory_plan(true);
    const pl::Program &p = *ex.program("exchange");
    std::copy(ys[size_t(rank)].begin(), ys[size_t(rank)].end(),
              static_cast<float *>(ex.value_data(p, x.y)));
    std::copy(tpes[size_t(rank)].begin(), tpes[size_t(rank)].end(),
              static_cast<int32_t *>(ex.value_data(p, x.tpe)));
    if (x.with_bias) // every element of rank g's bias is bias[g]
      std::fill_n(static_cast<float *>(ex.value_data(p, x.bias)), x.r * x.h, bias[size_t(rank)]);
    if (std::string e = ex.run(p, 0); !e.empty())
      return e;
    ExchangeResult &o = out[size_t(rank)];
    const float *rows = static_cast<const float *>(ex.value_data(p, x.rows));
    const float *back = static_cast<const float *>(ex.value_data(p, x.back));
    const int32_t *counts = static_cast<const int32_t *>(ex.value_data(p, x.counts));
    const int32_t *layout = static_cast<const int32_t *>(ex.value_data(p, x.layout));
    o.rows.assign(rows, rows + x.r * x.h);
    o.back.assign(back, back + x.n * x.h);
    o.counts.assign(counts, counts + x.l);
    o.layout.assign(layout, layout + x.s * x.l);
    return std::string();
  });
}

// Two ranks, four experts (rank 0: experts 0 and 1; rank 1: 2 and 3), six
// rows of two values each; row i of rank s holds (10 s + i, -(10 s + i)).
// Rank 0 routes [2, 1, 0, 3] rows to the experts, rank 1 [1, 0, 2, 1]
// (its last two rows are unused: 999, ignored). Worked by hand: rank 0
// receives expert 0's rows 0, 1 (its own) and 10 (rank 1's row 0), then
// expert 1's row 2; rank 1 receives expert 2's rows 11, 12, then expert
// 3's rows 3, 4, 5 (rank 0's) and 13.
TEST(CpuExecutor, MoeDispatchCombineOnTwoRanks) {
  for (int64_t dispatcher : {0, 1}) {
    EpExchange x(2, 2, 6, 2, dispatcher);
    std::vector<std::vector<float>> ys(2);
    for (int s = 0; s < 2; ++s)
      for (int i = 0; i < 6; ++i) {
        const float v = (s == 1 && i >= 4) ? 999.0f : float(10 * s + i);
        ys[size_t(s)].push_back(v);
        ys[size_t(s)].push_back(-v);
      }
    std::vector<ExchangeResult> out;
    const auto errors = run_exchange(x, ys, {{2, 1, 0, 3}, {1, 0, 2, 1}}, out);
    ASSERT_EQ(errors, std::vector<std::string>(2, "")) << "dispatcher " << dispatcher;
    auto ids = [](const ExchangeResult &o, int k) {
      std::vector<float> v;
      for (int i = 0; i < k; ++i) {
        EXPECT_EQ(o.rows[size_t(2 * i + 1)], -o.rows[size_t(2 * i)]);
        v.push_back(o.rows[size_t(2 * i)]);
      }
      return v;
    };
    EXPECT_EQ(ids(out[0], 4), (std::vector<float>{0, 1, 10, 2}));
    EXPECT_EQ(out[0].counts, (std::vector<int32_t>{3, 1}));
    EXPECT_EQ(out[0].layout, (std::vector<int32_t>{2, 1, 1, 0}));
    EXPECT_EQ(ids(out[1], 6), (std::vector<float>{11, 12, 3, 4, 5, 13}));
    EXPECT_EQ(out[1].counts, (std::vector<int32_t>{2, 4}));
    EXPECT_EQ(out[1].layout, (std::vector<int32_t>{0, 3, 2, 1}));
    for (int s = 0; s < 2; ++s) { // rows past those received are zero
      const size_t got = s == 0 ? 4 : 6;
      for (size_t k = got * 2; k < out[size_t(s)].rows.size(); ++k)
        EXPECT_EQ(out[size_t(s)].rows[k], 0.0f) << "rank " << s << " element " << k;
    }
    // Combine returns each (doubled) row to its source's place; rank 1's
    // unused rows are zero.
    for (int s = 0; s < 2; ++s)
      for (int i = 0; i < 6; ++i) {
        const float want = (s == 1 && i >= 4) ? 0.0f : 2.0f * float(10 * s + i);
        EXPECT_EQ(out[size_t(s)].back[size_t(2 * i)], want) << "rank " << s << " row " << i;
        EXPECT_EQ(out[size_t(s)].back[size_t(2 * i + 1)], -want);
      }
  }
}

// Four ranks, three local experts an ep rank, uneven routing (some experts
// and a whole peer get none), as ep 4, etp 2 x ep 2 and etp 4 x ep 1: the
// received rows against a direct selection from every rank's y (the etp
// ranks of an ep rank alike), both dispatchers alike, and combine as
// dispatch's inverse summed over the etp ranks (each adds its doubled rows).
TEST(CpuExecutor, MoeDispatchCombineOnFourRanks) {
  const int64_t s_ranks = 4, l = 3, n = 10, h = 3;
  for (int64_t etp : {1, 2, 4}) {
    const int64_t ep = s_ranks / etp, e = ep * l;
    std::vector<std::vector<int32_t>> tpes(size_t(s_ranks), std::vector<int32_t>(size_t(e), 0));
    std::vector<std::vector<float>> ys(static_cast<size_t>(s_ranks));
    for (int64_t s = 0; s < s_ranks; ++s) {
      int64_t left = n - s; // rank s routes n - s rows
      for (int64_t x = 0; x < e && left > 0; ++x) {
        // Expert x gets (x * 7 + s) % 3 rows; rank 1's experts 3-5 none.
        int32_t k = int32_t(std::min<int64_t>(left, (x * 7 + s) % 3));
        if (s == 1 && x >= 3 && x < 6)
          k = 0;
        tpes[size_t(s)][size_t(x)] = k;
        left -= k;
      }
      for (int64_t i = 0; i < n * h; ++i)
        ys[size_t(s)].push_back(float(1000 * s + i));
    }
    std::vector<std::vector<ExchangeResult>> results;
    for (int64_t dispatcher : {0, 1}) {
      EpExchange x(ep, l, n, h, dispatcher, etp);
      std::vector<ExchangeResult> out;
      ASSERT_EQ(run_exchange(x, ys, tpes, out), std::vector<std::string>(size_t(s_ranks), ""))
          << "etp " << etp << " dispatcher " << dispatcher;
      results.push_back(out);
    }
    for (int64_t g = 0; g < s_ranks; ++g) {
      // The reference: for local expert j of ep rank q, for source s, s's
      // segment rows.
      const int64_t q = g / etp;
      std::vector<float> want;
      std::vector<int32_t> counts(size_t(l), 0), layout(size_t(s_ranks * l), 0);
      for (int64_t j = 0; j < l; ++j)
        for (int64_t s = 0; s < s_ranks; ++s) {
          int64_t first = 0;
          for (int64_t x = 0; x < q * l + j; ++x)
            first += tpes[size_t(s)][size_t(x)];
          const int32_t k = tpes[size_t(s)][size_t(q * l + j)];
          want.insert(want.end(), ys[size_t(s)].begin() + first * h,
                      ys[size_t(s)].begin() + (first + k) * h);
          counts[size_t(j)] += k;
          layout[size_t(s * l + j)] = k;
        }
      want.resize(size_t(s_ranks * n * h), 0.0f);
      for (const auto &out : results) {
        EXPECT_EQ(out[size_t(g)].rows, want) << "etp " << etp << " rank " << g;
        EXPECT_EQ(out[size_t(g)].counts, counts) << "etp " << etp << " rank " << g;
        EXPECT_EQ(out[size_t(g)].layout, layout) << "etp " << etp << " rank " << g;
        int64_t used = 0;
        for (int32_t k : tpes[size_t(g)])
          used += k;
        for (int64_t i = 0; i < n * h; ++i)
          EXPECT_EQ(out[size_t(g)].back[size_t(i)],
                    i < used * h ? float(2 * etp) * ys[size_t(g)][size_t(i)] : 0.0f)
              << "etp " << etp << " rank " << g << " element " << i;
      }
    }
  }
}

// Expert tensor parallelism by hand: four ranks as etp 2 x ep 2 (group
// ranks 0, 1 of ep rank 0 hold shards of experts 0 and 1; ranks 2, 3 of ep
// rank 1 shards of experts 2 and 3), six rows of two values a rank, row i of
// rank g holding (10 g + i, -(10 g + i)), unused rows 999. Routing:
//   rank 0 [2, 1, 0, 3]: expert 0 rows 0 1, expert 1 row 2, expert 3 rows 3 4 5
//   rank 1 [1, 0, 2, 1]: expert 0 row 10, expert 2 rows 11 12, expert 3 row 13
//   rank 2 [0, 2, 1, 1]: expert 1 rows 20 21, expert 2 row 22, expert 3 row 23
//   rank 3 [1, 1, 1, 1]: rows 30, 31, 32, 33 to experts 0 to 3
// Ranks 0 and 1 receive (expert 0, then expert 1; sources in order)
// 0 1 10 30 | 2 20 21 31, ranks 2 and 3 11 12 22 32 | 3 4 5 13 23 33. Each
// rank adds its own bias (100, 200, 300, 400) to the rows; combine sums
// the two etp ranks' rows: a row v comes back as (2 v + 300, -2 v + 300)
// from ep rank 0 (100 + 200) and (2 v + 700, -2 v + 700) from ep rank 1.
TEST(CpuExecutor, MoeDispatchCombineOverExpertTensorParallelRanks) {
  const std::vector<std::vector<int32_t>> tpes = {
      {2, 1, 0, 3}, {1, 0, 2, 1}, {0, 2, 1, 1}, {1, 1, 1, 1}};
  std::vector<std::vector<float>> ys(4);
  for (int g = 0; g < 4; ++g) {
    int used = 0;
    for (int32_t k : tpes[size_t(g)])
      used += k;
    for (int i = 0; i < 6; ++i) {
      const float v = i >= used ? 999.0f : float(10 * g + i);
      ys[size_t(g)].push_back(v);
      ys[size_t(g)].push_back(-v);
    }
  }
  const std::vector<float> ids[2] = {{0, 1, 10, 30, 2, 20, 21, 31},
                                     {11, 12, 22, 32, 3, 4, 5, 13, 23, 33}};
  const std::vector<int32_t> counts[2] = {{4, 4}, {4, 6}};
  const std::vector<int32_t> layouts[2] = {{2, 1, 1, 0, 0, 2, 1, 1}, {0, 3, 2, 1, 1, 1, 1, 1}};
  // back[g]: the row ids of rank g's y in order, and the ep rank of each one's expert.
  const std::vector<std::pair<float, int>> back[4] = {
      {{0, 0}, {1, 0}, {2, 0}, {3, 1}, {4, 1}, {5, 1}},
      {{10, 0}, {11, 1}, {12, 1}, {13, 1}},
      {{20, 0}, {21, 0}, {22, 1}, {23, 1}},
      {{30, 0}, {31, 0}, {32, 1}, {33, 1}}};
  for (int64_t dispatcher : {0, 1}) {
    EpExchange x(2, 2, 6, 2, dispatcher, 2, true);
    std::vector<ExchangeResult> out;
    ASSERT_EQ(run_exchange(x, ys, tpes, out, {100, 200, 300, 400}),
              std::vector<std::string>(4, ""))
        << "dispatcher " << dispatcher;
    for (int g = 0; g < 4; ++g) {
      const int q = g / 2;
      const ExchangeResult &o = out[size_t(g)];
      std::vector<float> got;
      for (size_t i = 0; i < ids[q].size(); ++i) {
        EXPECT_EQ(o.rows[2 * i + 1], -o.rows[2 * i]);
        got.push_back(o.rows[2 * i]);
      }
      EXPECT_EQ(got, ids[q]) << "dispatcher " << dispatcher << " rank " << g;
      for (size_t k = ids[q].size() * 2; k < o.rows.size(); ++k)
        EXPECT_EQ(o.rows[k], 0.0f) << "rank " << g << " element " << k;
      EXPECT_EQ(o.counts, counts[q]) << "rank " << g;
      EXPECT_EQ(o.layout, layouts[q]) << "rank " << g;
      for (size_t i = 0; i < 6; ++i) {
        float want0 = 0, want1 = 0;
        if (i < back[g].size()) {
          const float v = back[g][i].first, b = back[g][i].second == 0 ? 300.0f : 700.0f;
          want0 = 2 * v + b;
          want1 = -2 * v + b;
        }
        EXPECT_EQ(o.back[2 * i], want0) << "dispatcher " << dispatcher << " rank " << g << " row " << i;
        EXPECT_EQ(o.back[2 * i + 1], want1) << "dispatcher " << dispatcher << " rank " << g << " row " << i;
      }
    }
  }
}

TEST(CpuExecutor, MoeDispatchErrors) {
  EpExchange x(2, 2, 6, 2, 0);
  std::vector<std::vector<float>> ys(2, std::vector<float>(12, 1.0f));
  std::vector<ExchangeResult> out;
  // More rows than y holds (on both ranks, which stop before exchanging).
  auto errors = run_exchange(x, ys, {{2, 1, 0, 4}, {1, 0, 2, 4}}, out);
  for (const std::string &e : errors)
    EXPECT_CONTAINS(e, "(dispatch) MOE_DISPATCH: tokens_per_expert sums to 7 rows, more than "
                       "the 6 permuted rows");
  // A rank run alone.
  auto f = open_ok(x.d);
  ASSERT_NE(f, nullptr);
  CpuExecutor ex(*f->plan(), 0);
  EXPECT_CONTAINS(ex.run(*ex.program("exchange"), 0),
                  "MOE_DISPATCH: exchanges tokens over 2 expert ranks (expert tensor x expert "
                  "model parallel), but its group has 1; run the plan with all its ranks");
}

// MOE_ROUTER(_GRAD) with count_group 1 on two tensor-parallel ranks, each
// holding half of every sequence (sequence parallelism): the ranks' aux
// losses add up to the one-rank loss of all the tokens, and each rank's
// logit gradients are the one-rank gradients of its tokens (its z-loss
// coefficient halved, as the compiler emits it under tp 2).
TEST(CpuExecutor, MoeRouterCountsOverTensorParallelRanks) {
  const int B = 2, S = 4, E = 4, K = 2, T = B * S, Tl = T / 2;
  for (int balancing : {1, 2}) {
    mt::cpu::MoeRouterConfig c;
    c.tokens = T;
    c.experts = E;
    c.topk = K;
    c.load_balancing = balancing;
    c.seq_length = S;
    c.aux_loss_coeff = 0.3;
    c.z_loss_coeff = 0.02;
    std::vector<float> logits(size_t(T * E)), dprobs(size_t(T * E));
    fill(logits.data(), T * E, 61 + uint64_t(balancing), 2.0);
    fill(dprobs.data(), T * E, 71, 1.0);
    std::vector<float> probs(size_t(T * E)), dlogits(size_t(T * E));
    std::vector<int32_t> map(size_t(T * E));
    double aux = 0, z = 0;
    mt::cpu::moe_router_fwd(logits.data(), c, probs.data(), map.data(), &aux, &z);
    mt::cpu::moe_router_bwd(dprobs.data(), logits.data(), map.data(), c, 0.5, dlogits.data());
    // Rank r's tokens: positions [r S/2, r S/2 + S/2) of each sequence.
    auto global = [&](int r, int t) { return (t / (S / 2)) * S + r * (S / 2) + t % (S / 2); };

    PlanDesc d;
    d.tensor_parallel = 2;
    d.all_ranks = true;
    Prog &p = d.program("router");
    const uint32_t lg = d.input(p, "logits", {Tl, E}), dp = d.input(p, "dprobs", {Tl, E});
    const uint32_t scale = d.input(p, "scale", {});
    const uint32_t pr = d.arena(p, "probs", {Tl, E}), mp = d.arena(p, "map", {Tl, E}, DType::I32);
    const uint32_t au = d.arena(p, "aux", {}), zl = d.arena(p, "z", {});
    const uint32_t dl = d.arena(p, "dlogits", {Tl, E});
    const std::vector<int64_t> ints = {K, 0, 0, balancing, 0, 0, 0, S / 2, 0, 1};
    const std::vector<double> floats = {0.0, 0.3, 0.01};
    PlanDesc::op(p, Opcode::MOE_ROUTER, {lg}, {pr, mp, au, zl}, {}, ints, floats, "router");
    PlanDesc::op(p, Opcode::MOE_ROUTER_GRAD, {dp, lg, pr, mp, scale}, {dl}, {}, ints, floats,
                 "router grad");
    auto f = open_ok(d);
    ASSERT_NE(f, nullptr);
    std::vector<double> rank_aux(2);
    mt::rt::ParallelLayout layout;
    layout.tp = 2;
    const auto errors = on_ranks(layout, [&](int r, const mt::rt::ParallelGroups &groups) {
      CpuExecutor ex(*f->plan(), r);
      ex.set_groups(&groups);
      const pl::Program &prog = *ex.program("router");
      float *x = static_cast<float *>(ex.value_data(prog, lg));
      float *g = static_cast<float *>(ex.value_data(prog, dp));
      for (int t = 0; t < Tl; ++t)
        for (int i = 0; i < E; ++i) {
          x[t * E + i] = logits[size_t(global(r, t) * E + i)];
          g[t * E + i] = dprobs[size_t(global(r, t) * E + i)];
        }
      *static_cast<float *>(ex.value_data(prog, scale)) = 0.5f;
      if (std::string e = ex.run(prog, 0); !e.empty())
        return e;
      rank_aux[size_t(r)] = *static_cast<float *>(ex.value_data(prog, au));
      const float *got = static_cast<const float *>(ex.value_data(prog, dl));
      for (int t = 0; t < Tl; ++t)
        for (int i = 0; i < E; ++i) {
          const float want = dlogits[size_t(global(r, t) * E + i)];
          if (std::fabs(got[t * E + i] - want) > 1e-6f * (1.0f + std::fabs(want)))
            return "rank " + std::to_string(r) + " dlogits[" + std::to_string(t) + ", " +
                   std::to_string(i) + "] is " + std::to_string(got[t * E + i]) + ", not " +
                   std::to_string(want);
        }
      return std::string();
    });
    EXPECT_EQ(errors, std::vector<std::string>(2, "")) << "load_balancing " << balancing;
    EXPECT_GT(aux, 0.0);
    EXPECT_NEAR(rank_aux[0] + rank_aux[1], aux, 1e-6 * aux) << "load_balancing " << balancing;
  }
}

// Expert buckets on four data-parallel ranks with ep 2 (expert dp 2): rank
// r is ep rank r % 2 and expert dp rank r / 2. A dense parameter of 8
// elements in a dp bucket (shards of 2 over 4 ranks) and an expert one of
// 4 in an expert bucket (shards of 2 over 2 ranks), the distributed
// optimizer's shard state placed by shard_offset (0 and 2). Rank r's dense
// gradient is r + 1 everywhere, its expert gradient 10 (r + 1) + i.
// Worked by hand, with scale 1/4: dense 10/4 = 2.5 everywhere; experts of
// ep rank 0 (ranks 0 and 2) (10 + i + 30 + i) / 4 = 10 + i/2, rank 0
// owning [10, 10.5], rank 2 [11, 11.5]; of ep rank 1 (ranks 1, 3) 15 + i/2.
// The sharded norm: dense 8 x 2.5^2 = 50, experts 463.5 + 993.5 = 1457.
TEST(CpuExecutor, ExpertBucketsReduceAndNormOverTheirGroups) {
  PlanDesc d;
  d.data_parallel = 4;
  d.expert_model_parallel = 2;
  d.all_ranks = true;
  const int dense = d.param("decoder.layers.0.mlp.router.weight", {4, 2});
  const int w = d.param("decoder.layers.0.mlp.experts.linear_fc1.weight", {1, 2, 2});
  d.params[size_t(w)].ep_dim = 0;
  d.params[size_t(w)].expert = true;
  d.params[size_t(dense)].flat_offset = 0;
  d.params[size_t(w)].flat_offset = 8;
  d.flat_elements = 12;
  d.buckets = {Bk{{uint32_t(dense)}, 0, 8, 0, 0}, Bk{{uint32_t(w)}, 8, 12, 6, 2}};
  d.distributed_optimizer = true;
  d.shard_elements = 4;
  d.shard_exp_avg = d.state_alloc(16);
  d.shard_exp_avg_sq = d.state_alloc(16);
  Prog &p = d.program("step");
  const uint32_t norm = d.arena(p, "norm", {}), whole = d.arena(p, "whole_norm", {});
  PlanDesc::op(p, Opcode::GRAD_NORM, {}, {whole}, {}, {}, {}, "norm before");
  PlanDesc::op(p, Opcode::REDUCE_GRADS, {}, {}, {}, {0, 0, 1}, {0.25}, "dense bucket");
  PlanDesc::op(p, Opcode::REDUCE_GRADS, {}, {}, {}, {6, 1, 1}, {0.25}, "expert bucket");
  PlanDesc::op(p, Opcode::SHARDED_GRAD_NORM, {}, {norm}, {}, {0}, {}, "norm");
  PlanDesc::op(p, Opcode::ALL_GATHER_PARAMS, {}, {}, {}, {6, 1}, {}, "gather experts");
  auto f = open_ok(d);
  ASSERT_NE(f, nullptr);
  mt::rt::ParallelLayout layout;
  layout.dp = 4;
  layout.ep = 2;
  layout.experts = true;
  std::vector<float> norms(4), wholes(4);
  std::vector<std::vector<float>> dense_grads(4), expert_grads(4), expert_weights(4);
  std::vector<std::vector<mt::rt::CountedRun>> runs(4);
  const auto errors = on_ranks(layout, [&](int r, const mt::rt::ParallelGroups &groups) {
    CpuExecutor ex(*f->plan(), r);
    ex.set_groups(&groups);
    for (int i = 0; i < 8; ++i)
      ex.grad(dense)[i] = float(r + 1);
    for (int i = 0; i < 4; ++i) {
      ex.grad(w)[i] = float(10 * (r + 1) + i);
      ex.weight(w)[i] = float(100 * r + i);
    }
    const pl::Program &prog = *ex.program("step");
    if (std::string e = ex.run(prog, 0); !e.empty())
      return e;
    norms[size_t(r)] = *static_cast<float *>(ex.value_data(prog, norm));
    wholes[size_t(r)] = *static_cast<float *>(ex.value_data(prog, whole));
    dense_grads[size_t(r)].assign(ex.grad(dense), ex.grad(dense) + 8);
    expert_grads[size_t(r)].assign(ex.grad(w), ex.grad(w) + 4);
    expert_weights[size_t(r)].assign(ex.weight(w), ex.weight(w) + 4);
    runs[size_t(r)] = mt::rt::counted_runs(*f->plan(), *mt::rt::find_rank(*f->plan(), r));
    return std::string();
  });
  ASSERT_EQ(errors, std::vector<std::string>(4, ""));
  for (int r = 0; r < 4; ++r) {
    // The owned shards: dense [2r, 2r + 2), expert [2 (r / 2), + 2).
    EXPECT_EQ(dense_grads[size_t(r)][size_t(2 * r)], 2.5f) << "rank " << r;
    EXPECT_EQ(dense_grads[size_t(r)][size_t(2 * r + 1)], 2.5f) << "rank " << r;
    const float base = r % 2 == 0 ? 10.0f : 15.0f;
    const int at = 2 * (r / 2);
    EXPECT_EQ(expert_grads[size_t(r)][size_t(at)], base + 0.5f * float(at)) << "rank " << r;
    EXPECT_EQ(expert_grads[size_t(r)][size_t(at + 1)], base + 0.5f * float(at + 1));
    EXPECT_NEAR(norms[size_t(r)], std::sqrt(1507.0), 1e-4) << "rank " << r;
    // The expert weights gathered from the expert dp group's owners: ranks
    // 0 and 2 (ep rank 0), or 1 and 3.
    const int owner0 = r % 2, owner1 = r % 2 + 2;
    EXPECT_EQ(expert_weights[size_t(r)],
              (std::vector<float>{float(100 * owner0), float(100 * owner0 + 1),
                                  float(100 * owner1 + 2), float(100 * owner1 + 3)}))
        << "rank " << r;
    // The log statistics count the owned shards, placed at their shard
    // state: the dense shard at 0, the expert one at 2.
    ASSERT_EQ(runs[size_t(r)].size(), 2u);
    EXPECT_EQ(runs[size_t(r)][0].begin, 2 * r);
    EXPECT_EQ(runs[size_t(r)][0].shard_at, 0);
    EXPECT_EQ(runs[size_t(r)][1].begin, at);
    EXPECT_EQ(runs[size_t(r)][1].shard_at, 2);
  }
  // Before the reduction, rank 0's norm: its dense gradient (8 x 1) over
  // the model-parallel group (itself), the experts' over tp_ep_pp (ranks 0
  // and 1): 10..13 and 20..23 squared: 534 + 1854.
  EXPECT_NEAR(wholes[0], std::sqrt(8.0 + 534.0 + 1854.0), 1e-4);
}

// Expert-parallel shards start from their slice of the whole parameter's
// initial values, as tensor-parallel ones do.
TEST(CpuExecutor, ExpertShardsStartFromTheWholeWeights) {
  PlanDesc one;
  const int whole = one.param("decoder.layers.0.mlp.experts.linear_fc1.weight", {4, 3, 2});
  auto f1 = open_ok(one);
  ASSERT_NE(f1, nullptr);
  std::vector<float> all(24);
  mt::rt::initial_weights(*f1->plan()->ranks()->Get(0)->params()->Get(uint32_t(whole)), 1, 0, 1,
                          0, 77, all.data());
  PlanDesc two;
  two.data_parallel = 2;
  two.expert_model_parallel = 2;
  const int shard = two.param("decoder.layers.0.mlp.experts.linear_fc1.weight", {2, 3, 2});
  two.params[size_t(shard)].ep_dim = 0;
  two.params[size_t(shard)].expert = true;
  auto f2 = open_ok(two);
  ASSERT_NE(f2, nullptr);
  const pl::Param &p = *f2->plan()->ranks()->Get(0)->params()->Get(uint32_t(shard));
  for (int q = 0; q < 2; ++q) {
    std::vector<float> mine(12);
    mt::rt::initial_weights(p, 1, 0, 2, q, 77, mine.data());
    EXPECT_EQ(mine, std::vector<float>(all.begin() + 12 * q, all.begin() + 12 * q + 12))
        << "ep rank " << q;
  }
  EXPECT_NE(all[0], all[12]);
}

// Expert tensor-parallel shards too (etp 2 x ep 2 on four ranks, through
// the plan's overload both executors use): fc1 [E 4, 2 x 4, H 3] split
// column-parallel in SwiGLU's two blocks (tp_blocks 2: each rank keeps its
// half of the gate and of the up rows), fc2 [4, H 3, F 6] row-parallel
// (dim 2), both on dim 0 over ep; each rank's values against the whole
// parameter indexed by hand.
TEST(CpuExecutor, ExpertTensorParallelShardsStartFromTheWholeWeights) {
  const char *fc1 = "decoder.layers.0.mlp.experts.linear_fc1.weight";
  const char *fc2 = "decoder.layers.0.mlp.experts.linear_fc2.weight";
  PlanDesc one;
  const int w1 = one.param(fc1, {4, 8, 3}), w2 = one.param(fc2, {4, 3, 6});
  auto f1 = open_ok(one);
  ASSERT_NE(f1, nullptr);
  std::vector<float> all1(96), all2(72);
  const pl::Plan &plan1 = *f1->plan();
  mt::rt::initial_weights(plan1, *plan1.ranks()->Get(0), *plan1.ranks()->Get(0)->params()->Get(uint32_t(w1)), 77, all1.data());
  mt::rt::initial_weights(plan1, *plan1.ranks()->Get(0), *plan1.ranks()->Get(0)->params()->Get(uint32_t(w2)), 77, all2.data());
  PlanDesc four;
  four.data_parallel = 4;
  four.expert_model_parallel = 2;
  four.expert_tensor_parallel = 2;
  four.all_ranks = true;
  const int s1 = four.param(fc1, {2, 4, 3}), s2 = four.param(fc2, {2, 3, 3});
  for (int k : {s1, s2}) {
    four.params[size_t(k)].ep_dim = 0;
    four.params[size_t(k)].expert = true;
  }
  four.params[size_t(s1)].tp_dim = 1;
  four.params[size_t(s1)].tp_blocks = 2;
  four.params[size_t(s2)].tp_dim = 2;
  auto f4 = open_ok(four);
  ASSERT_NE(f4, nullptr);
  const pl::Plan &plan4 = *f4->plan();
  for (int g = 0; g < 4; ++g) {
    const pl::Rank &rank = *mt::rt::find_rank(plan4, g);
    const int r = g % 2, q = g / 2; // etp rank, ep rank
    ASSERT_EQ(mt::rt::expert_coords(plan4, rank).etp_rank, r);
    ASSERT_EQ(mt::rt::expert_coords(plan4, rank).ep_rank, q);
    std::vector<float> mine1(24), mine2(18);
    mt::rt::initial_weights(plan4, rank, *rank.params()->Get(uint32_t(s1)), 77, mine1.data());
    mt::rt::initial_weights(plan4, rank, *rank.params()->Get(uint32_t(s2)), 77, mine2.data());
    for (int e = 0; e < 2; ++e)
      for (int f = 0; f < 4; ++f)
        for (int h = 0; h < 3; ++h) {
          // Local row f: block f / 2 (gate, up), its piece f % 2 of etp rank r.
          const int whole_f = (f / 2 * 2 + r) * 2 + f % 2;
          EXPECT_EQ(mine1[size_t((e * 4 + f) * 3 + h)],
                    all1[size_t(((q * 2 + e) * 8 + whole_f) * 3 + h)])
              << "rank " << g << " fc1 " << e << "," << f << "," << h;
        }
    for (int e = 0; e < 2; ++e)
      for (int h = 0; h < 3; ++h)
        for (int c = 0; c < 3; ++c)
          EXPECT_EQ(mine2[size_t((e * 3 + h) * 3 + c)],
                    all2[size_t(((q * 2 + e) * 3 + h) * 6 + r * 3 + c)])
              << "rank " << g << " fc2 " << e << "," << h << "," << c;
  }
}

// An MoE block through the executor: embedding, router, top-2 dispatch to
// four SwiGLU experts, combine, residual, output layer and cross-entropy,
// with the aux and z losses; its gradients against central differences of
// the objective Megatron differentiates (loss + coefficients x router
// losses).
struct MoeBlock {
  static constexpr int B = 2, S = 3, T = B * S, Vocab = 11, H = 8, E = 4, K = 2, F = 5,
                       N = T * K;
  static constexpr double kAux = 0.5, kZ = 0.1;
  PlanDesc d;
  int tok, router, fc1, fc2, out;
  uint32_t tokens, labels, loss, aux, z;
  std::vector<int32_t> token_ids = {1, 5, 10, 0, 7, 3};
  std::vector<int32_t> label_ids = {5, 10, 0, 7, 3, 9};

  MoeBlock() {
    tok = d.param("embedding.word_embeddings.weight", {Vocab, H});
    router = d.param("decoder.layers.0.mlp.router.weight", {E, H});
    fc1 = d.param("decoder.layers.0.mlp.experts.linear_fc1.weight", {E, 2 * F, H});
    fc2 = d.param("decoder.layers.0.mlp.experts.linear_fc2.weight", {E, H, F});
    out = d.param("output_layer.weight", {Vocab, H});
    Prog &p = d.program("train_step");
    auto W = [&](int param) { return d.weight(p, param); };
    auto A = [&](const char *name, std::vector<int64_t> shape, DType t = DType::F32) {
      return d.arena(p, name, shape, t);
    };
    auto P = [](int i) { return uint32_t(i); };
    using O = Opcode;
    const std::vector<int64_t> ri = {K, 0, 0, 1, 0, 0, 0, S, 0, -1};
    const std::vector<double> rf = {0.0, kAux, kZ};
    tokens = d.input(p, "tokens", {B, S}, DType::I32);
    labels = d.input(p, "labels", {B, S}, DType::I32);
    uint32_t x0 = A("x0", {B, S, H}), xt = A("xt", {T, H}), logits = A("router_logits", {T, E});
    uint32_t probs = A("probs", {T, E}), map = A("routing_map", {T, E}, DType::I32);
    aux = A("aux_loss", {});
    z = A("z_loss", {});
    uint32_t xp = A("xp", {N, H}), rows = A("row_ids", {N}, DType::I32);
    uint32_t tpe = A("tokens_per_expert", {E}, DType::I32);
    uint32_t u = A("u", {N, 2 * F}), sw = A("sw", {N, F}), y2 = A("y2", {N, H});
    uint32_t mo = A("moe_out", {T, H}), mo3 = A("moe_out3", {B, S, H}), x1 = A("x1", {B, S, H});
    uint32_t lg = A("logits", {B, S, Vocab});
    loss = A("loss", {});
    PlanDesc::op(p, O::EMBEDDING, {W(tok), tokens}, {x0}, {}, {0});
    PlanDesc::op(p, O::RESHAPE, {x0}, {xt});
    PlanDesc::op(p, O::MATMUL, {xt, W(router)}, {logits});
    PlanDesc::op(p, O::MOE_ROUTER, {logits}, {probs, map, aux, z}, {}, ri, rf, "router");
    PlanDesc::op(p, O::MOE_PERMUTE, {xt, map}, {xp, rows, tpe}, {}, {0, 0});
    PlanDesc::op(p, O::GROUPED_MATMUL, {xp, W(fc1), tpe}, {u});
    PlanDesc::op(p, O::SWIGLU, {u}, {sw});
    PlanDesc::op(p, O::GROUPED_MATMUL, {sw, W(fc2), tpe}, {y2});
    PlanDesc::op(p, O::MOE_UNPERMUTE, {y2, probs, rows, tpe}, {mo});
    PlanDesc::op(p, O::RESHAPE, {mo}, {mo3});
    PlanDesc::op(p, O::ADD, {x0, mo3}, {x1});
    PlanDesc::op(p, O::MATMUL, {x1, W(out)}, {lg});
    PlanDesc::op(p, O::CROSS_ENTROPY, {lg, labels}, {loss}, {}, {0});
    PlanDesc::output(p, loss, "loss");
    PlanDesc::output(p, aux, "load_balancing_loss");
    PlanDesc::output(p, z, "z_loss");

    uint32_t seed = A("dloss", {}), dlg = A("dlogits", {B, S, Vocab}), dx1 = A("dx1", {B, S, H});
    uint32_t dmo = A("dmoe_out", {T, H}), dy2 = A("dy2", {N, H}), dprobs = A("dprobs", {T, E});
    uint32_t dsw = A("dsw", {N, F}), du = A("du", {N, 2 * F}), dxp = A("dxp", {N, H});
    uint32_t dxt = A("dxt", {T, H}), dlog = A("drouter_logits", {T, E}), dxr = A("dxr", {T, H});
    uint32_t dxa = A("dxa", {T, H}), dxa3 = A("dxa3", {B, S, H}), dx0 = A("dx0", {B, S, H});
    PlanDesc::op(p, O::GRAD_SEED, {}, {seed}, {}, {}, {1.0});
    PlanDesc::op(p, O::CROSS_ENTROPY_GRAD, {lg, labels, seed}, {dlg}, {}, {0});
    PlanDesc::op(p, O::MATMUL_INPUT_GRAD, {dlg, W(out)}, {dx1});
    PlanDesc::op(p, O::MATMUL_WEIGHT_GRAD, {dlg, x1}, {}, {P(out)});
    PlanDesc::op(p, O::RESHAPE, {dx1}, {dmo});
    PlanDesc::op(p, O::MOE_UNPERMUTE_GRAD, {dmo, y2, probs, rows, tpe}, {dy2, dprobs});
    PlanDesc::op(p, O::GROUPED_MATMUL_INPUT_GRAD, {dy2, W(fc2), tpe}, {dsw});
    PlanDesc::op(p, O::GROUPED_MATMUL_WEIGHT_GRAD, {dy2, sw, tpe}, {}, {P(fc2)});
    PlanDesc::op(p, O::SWIGLU_GRAD, {dsw, u}, {du});
    PlanDesc::op(p, O::GROUPED_MATMUL_INPUT_GRAD, {du, W(fc1), tpe}, {dxp});
    PlanDesc::op(p, O::GROUPED_MATMUL_WEIGHT_GRAD, {du, xp, tpe}, {}, {P(fc1)});
    PlanDesc::op(p, O::MOE_PERMUTE_GRAD, {dxp, rows}, {dxt});
    PlanDesc::op(p, O::MOE_ROUTER_GRAD, {dprobs, logits, probs, map, seed}, {dlog}, {}, ri, rf,
                 "router grad");
    PlanDesc::op(p, O::MATMUL_INPUT_GRAD, {dlog, W(router)}, {dxr});
    PlanDesc::op(p, O::MATMUL_WEIGHT_GRAD, {dlog, xt}, {}, {P(router)});
    PlanDesc::op(p, O::ADD, {dxt, dxr}, {dxa});
    PlanDesc::op(p, O::RESHAPE, {dxa}, {dxa3});
    PlanDesc::op(p, O::ADD, {dx1, dxa3}, {dx0});
    PlanDesc::op(p, O::EMBEDDING_GRAD, {dx0, tokens}, {}, {P(tok)}, {0});
  }
};

TEST(CpuExecutor, MoeBlockGradientsMatchFiniteDifferences) {
  MoeBlock blk;
  auto f = open_ok(blk.d);
  ASSERT_NE(f, nullptr);
  CpuExecutor ex(*f->plan(), 0);
  ex.set_check_memory_plan(true);
  for (int p = 0; p < 5; ++p)
    fill(ex.weight(p), ex.param_elements(p), uint64_t(300 + p), p == blk.router ? 1.0 : 0.5);
  ex.zero_grads();
  const pl::Program &prog = *ex.program("train_step");
  auto value = [&](uint32_t v) { return double(*static_cast<float *>(ex.value_data(prog, v))); };
  double aux = 0, z = 0;
  auto objective = [&]() {
    write_ids(ex, prog, blk.tokens, blk.token_ids);
    write_ids(ex, prog, blk.labels, blk.label_ids);
    EXPECT_EQ(ex.run(prog, 0), "");
    aux = value(blk.aux);
    z = value(blk.z);
    return value(blk.loss) + MoeBlock::kAux * aux + MoeBlock::kZ * z;
  };
  objective();
  EXPECT_GT(aux, 0.5); // E / k x sum f_e P_e: 1 when balanced
  EXPECT_GT(z, 0.0);
  std::vector<std::vector<float>> grads;
  for (int p = 0; p < 5; ++p) {
    grads.emplace_back(ex.grad(p), ex.grad(p) + ex.param_elements(p));
    float largest = 0;
    for (float g : grads.back())
      largest = std::max(largest, std::abs(g));
    EXPECT_GT(largest, 1e-3f) << "parameter " << p << " gets a gradient";
  }
  const float h = 1e-2f;
  int checked = 0;
  for (int p = 0; p < 5; ++p) {
    float *w = ex.weight(p);
    for (int64_t i = 0; i < ex.param_elements(p); ++i) {
      const float keep = w[i];
      w[i] = keep + h;
      const double up = objective();
      w[i] = keep - h;
      const double down = objective();
      w[i] = keep;
      const double fd = (up - down) / (2.0 * double(h));
      EXPECT_NEAR(grads[size_t(p)][size_t(i)], fd, 2e-3 + 2e-2 * std::abs(fd))
          << f->plan()->ranks()->Get(0)->params()->Get(uint32_t(p))->name()->str() << "[" << i
          << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 11 * 8 + 4 * 8 + 4 * 10 * 8 + 4 * 8 * 5 + 11 * 8);
}

} // namespace

// The training table's router-loss fields and the outputs they govern.
TEST(PlanReader, RouterLossOutputs) {
  auto with_output = [](const char *name, std::vector<int64_t> shape) {
    Tiny t;
    t.d.num_micro_batches = 1;
    Prog &train = t.d.programs[1];
    const uint32_t v = t.d.arena(train, name, shape);
    if (shape.empty()) {
      PlanDesc::op(train, Opcode::GRAD_SEED, {}, {v}, {}, {}, {1.0}, "router loss");
    } else {
      const uint32_t seed = t.d.arena(train, "seed", {});
      PlanDesc::op(train, Opcode::GRAD_SEED, {}, {seed}, {}, {}, {1.0}, "seed");
      PlanDesc::op(train, Opcode::RESHAPE, {seed}, {v}, {}, {}, {}, "router loss");
    }
    PlanDesc::output(train, v, name);
    return t;
  };
  {
    Tiny t = with_output("z_loss", {});
    t.d.moe_layers = 2;
    t.d.moe_load_balancing_type = "aux_loss";
    t.d.moe_z_loss_coeff = 0.001;
    EXPECT_NE(open_ok(t.d), nullptr);
  }
  EXPECT_CONTAINS(semantic_error(with_output("z_loss", {}).d),
                  "rank 0, program train_step outputs 'z_loss', but training.moe_layers is 0 "
                  "(a dense model)");
  {
    Tiny t = with_output("load_balancing_loss", {1, 1});
    t.d.moe_layers = 2;
    t.d.moe_load_balancing_type = "aux_loss";
    EXPECT_CONTAINS(semantic_error(t.d), "rank 0, program train_step: output "
                                         "'load_balancing_loss' is [1,1] f32, but the loop reads "
                                         "[] f32");
  }
  {
    Tiny t = with_output("seq_load_balancing_loss", {});
    t.d.moe_layers = 2;
    t.d.moe_load_balancing_type = "sinkhorn";
    EXPECT_CONTAINS(semantic_error(t.d), "training.moe_load_balancing_type is 'sinkhorn' with "
                                         "moe_layers 2; it must be aux_loss, seq_aux_loss or none");
  }
  {
    Tiny t;
    t.d.num_micro_batches = 1;
    t.d.moe_z_loss_coeff = 0.1;
    EXPECT_CONTAINS(semantic_error(t.d), "training.moe_load_balancing_type is '' with moe_layers "
                                         "0; a dense plan has no router losses");
  }
  {
    Tiny t;
    t.d.num_micro_batches = 1;
    t.d.moe_layers = -1;
    EXPECT_CONTAINS(semantic_error(t.d), "training.moe_layers is -1; it must be from 0 to");
  }
}

// The distributed optimizer's shard arithmetic (runtime/plan/grad_buckets.h).
TEST(GradBuckets, ShardsAndSegments) {
  using mt::rt::bucket_shard;
  using mt::rt::flat_segments;
  using mt::rt::FlatParam;
  // Bucket [256, 768) over 4 ranks: 128 elements each, contiguous.
  for (int r = 0; r < 4; ++r) {
    auto s = bucket_shard(256, 768, 4, r);
    EXPECT_EQ(s.begin, 256 + 128 * r);
    EXPECT_EQ(s.end, 384 + 128 * r);
  }
  EXPECT_EQ(mt::rt::shard_state_offset(256, 4), 64);
  // Parameters 0 (100 elements at 256) and 1 (300 at 384), padding after
  // each: rank 1's shard [384, 512) is the first 128 of parameter 1; rank 0's
  // [256, 384) is all of parameter 0 (the padding [356, 384) is in none).
  std::vector<FlatParam> params = {{1, 384, 300}, {0, 256, 100}};
  auto own0 = flat_segments(params, 256, 384);
  ASSERT_EQ(own0.size(), 1u);
  EXPECT_EQ(own0[0].param, 0u);
  EXPECT_EQ(own0[0].param_begin, 0);
  EXPECT_EQ(own0[0].count, 100);
  auto own1 = flat_segments(params, 384, 512);
  ASSERT_EQ(own1.size(), 1u);
  EXPECT_EQ(own1[0].param, 1u);
  EXPECT_EQ(own1[0].count, 128);
  // Rank 2's [512, 640) holds elements 128..255 of parameter 1; rank 3's
  // [640, 768) its last 44 and padding.
  auto own3 = flat_segments(params, 640, 768);
  ASSERT_EQ(own3.size(), 1u);
  EXPECT_EQ(own3[0].param_begin, 256);
  EXPECT_EQ(own3[0].count, 44);
  EXPECT_EQ(own3[0].flat_begin, 640);
  // The whole bucket, in flat order whatever the parameters' order.
  auto all = flat_segments(params, 256, 768);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].param, 0u);
  EXPECT_EQ(all[1].param, 1u);
  EXPECT_TRUE(flat_segments(params, 356, 384).empty());
}
