// Plan instructions -> GPU steps (compiler/cuda/GpuSteps.h has the GEMM mapping).
#include "compiler/cuda/GpuSteps.h"

#include "compiler/cuda/FlashAttentionGen.h"
#include "compiler/cuda/OpKernelBuilder.h"
#include "runtime/comm/parallel_groups.h"
#include "runtime/exec/cuda/launch_limits.h"
#include "runtime/plan/grad_buckets.h"

#include <algorithm>

namespace mt {
namespace {

namespace pl = plan;

int64_t product(const std::vector<int64_t> &shape, size_t from, size_t to) {
  int64_t n = 1;
  for (size_t i = from; i < to && i < shape.size(); ++i)
    n *= shape[i];
  return n;
}

// Rows of a [..., c] tensor: the product of every dimension but the last.
int64_t rows(const GpuValueInfo &v) { return product(v.shape, 0, v.shape.size() - 1); }
int64_t lastDim(const GpuValueInfo &v) { return v.shape.empty() ? 1 : v.shape.back(); }

GpuArgSpec value(uint32_t v) { return {pl::GpuArgKind::VALUE, v}; }

GpuStepSpec gemmStep(const GemmSpec &g, std::vector<GpuArgSpec> args) {
  GpuStepSpec s;
  s.kind = pl::GpuStepKind::GEMM;
  s.gemm = g;
  s.args = std::move(args);
  return s;
}

// y[n, out] = x[n, in] W[out, in]^T.
GemmSpec forwardGemm(const GpuValueInfo &x, const GpuValueInfo &w, const GpuValueInfo &y) {
  GemmSpec g;
  g.m = lastDim(y);
  g.n = rows(x);
  g.k = lastDim(x);
  g.transA = true;
  g.lda = g.k;
  g.ldb = g.k;
  g.ldd = g.m;
  g.aType = w.dtype;
  g.bType = x.dtype;
  g.dType = y.dtype;
  return g;
}

// dx[n, in] = dy[n, out] W[out, in].
GemmSpec inputGradGemm(const GpuValueInfo &dy, const GpuValueInfo &w, const GpuValueInfo &dx) {
  GemmSpec g;
  g.m = lastDim(dx);
  g.n = rows(dy);
  g.k = lastDim(dy);
  g.lda = g.m;
  g.ldb = g.k;
  g.ldd = g.m;
  g.aType = w.dtype;
  g.bType = dy.dtype;
  g.dType = dx.dtype;
  return g;
}

// grad W[out, in] += dy[n, out]^T x[n, in], into the gradient's type (a bf16
// D with --grad-reduce-in-bf16: cuBLASLt adds in f32 and rounds once).
GemmSpec weightGradGemm(const GpuValueInfo &dy, const GpuValueInfo &x, pl::DType grad) {
  GemmSpec g;
  g.m = lastDim(x);
  g.n = lastDim(dy);
  g.k = rows(dy);
  g.transB = true;
  g.lda = g.m;
  g.ldb = g.n;
  g.ldd = g.m;
  g.aType = x.dtype;
  g.bType = dy.dtype;
  g.dType = grad;
  g.accumulate = true;
  return g;
}

uint64_t alignUp(uint64_t n) { return (n + 255) / 256 * 256; }

// The scalar arguments a generated kernel asks for, after its pointers.
void scalarArgs(const CudaKernel &k, std::vector<GpuArgSpec> &args) {
  size_t stream = 0;
  for (const std::string &a : k.scalarArgs) {
    if (a == "seed")
      args.push_back({pl::GpuArgKind::SEED, 0});
    else if (a == "rng_offset")
      args.push_back({pl::GpuArgKind::RNG_OFFSET, 0});
    else if (a == "tp_rank")
      args.push_back({pl::GpuArgKind::TP_RANK, 0});
    else if (a == "dp_rank")
      args.push_back({pl::GpuArgKind::DP_RANK, 0});
    else // "stream": the next of the kernel's streams
      args.push_back({pl::GpuArgKind::CONSTANT, k.streams.at(stream++)});
  }
}

OpInstruction opInstruction(const GpuInstruction &inst, const std::vector<GpuValueInfo> &values,
                            const std::vector<GpuParamInfo> &params, int64_t tensorParallel) {
  OpInstruction o;
  o.op = inst.op;
  for (uint32_t v : inst.in)
    o.in.push_back({values[v].shape, values[v].dtype});
  for (uint32_t v : inst.out)
    o.out.push_back({values[v].shape, values[v].dtype});
  // The norms read every parameter of the rank; others their own.
  const bool all = inst.op == pl::Opcode::GRAD_NORM || inst.op == pl::Opcode::GROUP_GRAD_NORM ||
                   inst.op == pl::Opcode::SHARDED_GRAD_NORM || inst.op == pl::Opcode::SHARDED_ADAMW ||
                   inst.op == pl::Opcode::SHARDED_SGD;
  if (all)
    o.params = params;
  else
    for (uint32_t p : inst.params)
      o.params.push_back(params[p]);
  o.ints = inst.ints;
  o.floats = inst.floats;
  o.tensorParallel = tensorParallel;
  if (inst.op == pl::Opcode::RESHAPE)
    o.outAliasesIn0 = values[inst.in[0]].region == values[inst.out[0]].region &&
                      values[inst.in[0]].offset == values[inst.out[0]].offset;
  return o;
}

GpuArgSpec argOf(const OpArg &a, const GpuInstruction &inst) {
  switch (a.kind) {
  case OpArg::In: return value(inst.in.at(a.index));
  case OpArg::Out: return value(inst.out.at(a.index));
  case OpArg::ParamGrad: // a position in `params` (every parameter when it is empty)
    return {pl::GpuArgKind::GRAD, inst.params.empty() ? a.index : inst.params.at(a.index)};
  case OpArg::State: return {pl::GpuArgKind::STATE, 0};
  case OpArg::Workspace: return {pl::GpuArgKind::WORKSPACE, a.index};
  case OpArg::LossScale: return {pl::GpuArgKind::LOSS_SCALE, 0};
  }
  return {pl::GpuArgKind::STATE, 0};
}

// CudaOpKernels' launches and collectives as plan steps; its kernels are
// new ones (GpuStepSpec::kernel < 0).
GpuLowering fromOpKernels(const OpKernels &k, const GpuInstruction &inst) {
  GpuLowering l;
  l.workspaceBytes = k.workspaceBytes;
  for (const OpLaunch &launch : k.launches)
    l.kernels.push_back(launch.kernel);
  for (const OpStep &step : k.steps) {
    GpuStepSpec s;
    if (step.kind == OpStep::Native) {
      s.kind = pl::GpuStepKind::NATIVE;
      for (const OpArg &a : step.args)
        s.args.push_back(argOf(a, inst));
      l.steps.push_back(s);
      continue;
    }
    if (step.kind != OpStep::Launch) {
      s.kind = pl::GpuStepKind::ALL_REDUCE;
      s.args = {{pl::GpuArgKind::WORKSPACE, step.offset}};
      s.count = step.count;
      s.element = step.type == OpStep::F64 ? pl::ReduceElement::F64 : pl::ReduceElement::F32;
      s.group = int32_t(step.group);
      s.reduce = step.kind == OpStep::AllReduceMax ? 1 : 0;
      l.steps.push_back(s);
      continue;
    }
    const OpLaunch &launch = k.launches[step.launch];
    s.kind = pl::GpuStepKind::KERNEL;
    s.kernel = -int64_t(step.launch) - 1;
    for (const OpArg &a : launch.args)
      s.args.push_back(argOf(a, inst));
    scalarArgs(launch.kernel, s.args);
    l.steps.push_back(s);
  }
  return l;
}

// No GPU form, only why.
GpuLowering refused(const GpuLowering &l) {
  GpuLowering r;
  r.missing = l.missing;
  return r;
}

// ATTENTION (in q, k, v; out o, lse) and ATTENTION_GRAD (in dout, q, k, v,
// o, lse; out dq, dk, dv) as generated flash attention
// (compiler/cuda/FlashAttentionGen.h). The backward reads the forward's output and
// log-sum-exp from the plan, so it runs only its three kernels; its
// workspace holds dQ's f32 accumulator and the rows' dout . o.

GpuLowering lowerAttention(const GpuInstruction &inst, const std::vector<GpuValueInfo> &values,
                           int64_t tensorParallel, FlashBackward backward) {
  GpuLowering l;
  const bool grad = inst.op == pl::Opcode::ATTENTION_GRAD;
  const GpuValueInfo &q = values[inst.in[grad ? 1 : 0]], &k = values[inst.in[grad ? 2 : 1]];
  FlashAttentionConfig c;
  if (q.shape.size() != 4 || k.shape.size() != 4) {
    l.missing = "attention operands are not [batch, seq, heads, head_dim]";
    return l;
  }
  c.batch = q.shape[0];
  c.seq = q.shape[1];
  c.heads = q.shape[2];
  c.groups = k.shape[2];
  c.headDim = q.shape[3];
  c.causal = inst.ints.at(0) != 0;
  c.stream = uint64_t(inst.ints.at(1));
  c.tensorParallel = inst.ints.at(2) == 2 ? tensorParallel : 1; // a shard of the heads
  c.scale = inst.floats.at(0);
  c.dropoutRate = inst.floats.at(1);
  c.backward = backward;
  c.dtype = q.dtype == pl::DType::BF16  ? FlashAttentionConfig::DType::BF16
            : q.dtype == pl::DType::F16 ? FlashAttentionConfig::DType::F16
                                        : FlashAttentionConfig::DType::F32;
  std::string error;
  auto launch = [&](const CudaKernel &kern, std::vector<GpuArgSpec> args) {
    // Every GPU mt runs on launches it (launch_limits.h), else no GPU form.
    if (std::string e = cu::check_launch(kern.entry, kern.grid, kern.block, kern.sharedBytes);
        !e.empty() && l.missing.empty())
      l.missing = "flash attention: " + e;
    l.kernels.push_back(kern);
    GpuStepSpec s;
    s.kind = pl::GpuStepKind::KERNEL;
    s.kernel = -int64_t(l.kernels.size());
    scalarArgs(kern, args);
    s.args = std::move(args);
    l.steps.push_back(std::move(s));
  };
  auto ws = [](uint64_t offset) { return GpuArgSpec{pl::GpuArgKind::WORKSPACE, offset}; };
  if (!grad) {
    std::optional<FlashAttentionForward> fwd = generateFlashAttentionForward(c, &error);
    if (!fwd) {
      l.missing = "flash attention: " + error;
      return l;
    }
    // (q, k, v, out, lse)
    launch(fwd->kernel, {value(inst.in[0]), value(inst.in[1]), value(inst.in[2]),
                         value(inst.out[0]), value(inst.out[1])});
    return l.missing.empty() ? l : refused(l);
  }
  std::optional<FlashAttentionBackward> bwd = generateFlashAttentionBackward(c, &error);
  if (!bwd) {
    l.missing = "flash attention: " + error;
    return l;
  }
  // Workspace: dq_accum, delta.
  const uint64_t accAt = 0, deltaAt = alignUp(bwd->dqAccumBytes);
  l.workspaceBytes = deltaAt + alignUp(bwd->deltaBytes);
  // (dout, q, k, v, out, lse, dq, dk, dv, dq_accum, delta)
  const std::vector<GpuArgSpec> args = {
      value(inst.in[0]),  value(inst.in[1]),  value(inst.in[2]),  value(inst.in[3]),
      value(inst.in[4]),  value(inst.in[5]),  value(inst.out[0]), value(inst.out[1]),
      value(inst.out[2]), ws(accAt),          ws(deltaAt)};
  for (const CudaKernel *kern : {&bwd->dot, &bwd->main, &bwd->dq})
    launch(*kern, args);
  return l.missing.empty() ? l : refused(l);
}

// A product of wider operands than the values hold: MATMUL_INPUT_GRAD /
// MATMUL_WEIGHT_GRAD with an f32 gradient against a 16-bit weight or input
// (the MoE router's logits with moe_router_dtype fp32), or with an f64
// gradient against any (fp64), and MATMUL with an f64 result (fp64's
// logits). cuBLASLt multiplies operands of one type, so each narrower
// operand is first widened in the workspace (exactly), the GEMM runs in
// the wide type W, and a result of another type is rounded once from W's
// product (through f32; added into the gradient): Megatron's
// router_gating_linear, which multiplies in the router's type and casts
// the results back.
GpuLowering lowerWideGemm(const GpuInstruction &inst, const std::vector<GpuValueInfo> &values,
                          const std::vector<GpuParamInfo> &params) {
  GpuLowering l;
  const bool forward = inst.op == pl::Opcode::MATMUL;
  const bool weightGrad = inst.op == pl::Opcode::MATMUL_WEIGHT_GRAD;
  const GpuValueInfo &a0 = values[inst.in[0]], &a1 = values[inst.in[1]];
  const pl::DType wideType = forward ? values[inst.out.at(0)].dtype : a0.dtype;
  auto isHalf = [](pl::DType d) { return d == pl::DType::BF16 || d == pl::DType::F16; };
  auto isFloat = [&](pl::DType d) { return d == pl::DType::F32 || isHalf(d); };
  const bool ok = forward ? wideType == pl::DType::F64 && isFloat(a0.dtype) && a0.dtype == a1.dtype
                          : (wideType == pl::DType::F32 && isHalf(a1.dtype)) ||
                                (wideType == pl::DType::F64 && isFloat(a1.dtype));
  if (!ok) {
    l.missing = "a GEMM widened to f32 from 16-bit operands or to f64 from any only (a product "
                "of " + std::string(pl::EnumNameDType(a0.dtype)) + " and " +
                pl::EnumNameDType(a1.dtype) + " into " + pl::EnumNameDType(wideType) + ")";
    return l;
  }
  const std::string wide = opk::storage(wideType);
  const int wideBytes = opk::bytesOf(wideType);
  const pl::DType target = forward      ? wideType
                           : weightGrad ? params.at(inst.params[0]).gradDtype
                                        : values[inst.out.at(0)].dtype;
  GemmSpec g = forward      ? forwardGemm(a0, a1, values[inst.out[0]])
               : weightGrad ? weightGradGemm(a0, a1, wideType)
                            : inputGradGemm(a0, a1, values[inst.out[0]]);
  g.aType = g.bType = g.dType = wideType;
  opk::Builder b(std::string(pl::EnumNameOpcode(inst.op)) + " in " +
                 (wideType == pl::DType::F64 ? "f64" : "f32"));
  // The widened operands: the forward's input and weight, else the
  // gradient's partner (in[1]).
  std::vector<uint64_t> widened;
  for (int k = forward ? 0 : 1; k < 2; ++k) {
    const GpuValueInfo &x = values[inst.in[size_t(k)]];
    const int64_t n = product(x.shape, 0, x.shape.size());
    widened.push_back(b.alloc(uint64_t(n) * uint64_t(wideBytes)));
    const int v = opk::lanesFor({x.dtype, wideType}, {});
    opk::elementwise(b, "widen", "const " + std::string(opk::storage(x.dtype)) + " *x, " + wide +
                                     " *y", "x, y",
                     "  float a[V];\n  mt_load<V>(x, i, a);\n"
                     "  for (int l = 0; l < V; ++l) y[i + l] = (" + wide + ")a[l];\n",
                     n, v, {opk::in(uint64_t(k)), opk::wsAt(widened.back())});
  }
  // The GEMM writes W: into the output or gradient when it is W, else
  // into the workspace, rounded into it by a last kernel.
  const bool round = target != wideType;
  const int64_t outCount = g.m * g.n;
  const uint64_t productAt = round ? b.alloc(uint64_t(outCount) * uint64_t(wideBytes)) : 0;
  if (round) {
    g.accumulate = false;
    const std::string t = opk::storage(target);
    const int vo = opk::lanesFor({target, wideType}, {});
    if (weightGrad)
      opk::elementwise(b, "add_rounded", "const " + wide + " *p, " + t + " *g", "p, g",
                       "  float c[V];\n  mt_load<V>(g, i, c);\n"
                       "  for (int l = 0; l < V; ++l) c[l] += (float)p[i + l];\n"
                       "  mt_store<V>(g, i, c);\n",
                       outCount, vo, {opk::wsAt(productAt), opk::grad(0)});
    else
      opk::elementwise(b, "narrow", "const " + wide + " *p, " + t + " *y", "p, y",
                       "  float a[V];\n  for (int l = 0; l < V; ++l) a[l] = (float)p[i + l];\n"
                       "  mt_store<V>(y, i, a);\n",
                       outCount, vo, {opk::wsAt(productAt), opk::outp(0)});
  }
  std::string error;
  std::optional<OpKernels> k = b.finish(&error);
  if (!k) {
    l.missing = error;
    return l;
  }
  l = fromOpKernels(*k, inst);
  const GpuArgSpec d = round        ? GpuArgSpec{pl::GpuArgKind::WORKSPACE, productAt}
                       : weightGrad ? GpuArgSpec{pl::GpuArgKind::GRAD, inst.params[0]}
                                    : value(inst.out[0]);
  // cuBLASLt's A and B (GpuSteps.h): the weight and the input (forward),
  // the weight or the input and the gradient (backward).
  const GpuArgSpec a = {pl::GpuArgKind::WORKSPACE, forward ? widened[1] : widened[0]};
  const GpuArgSpec bArg = forward ? GpuArgSpec{pl::GpuArgKind::WORKSPACE, widened[0]}
                                  : value(inst.in[0]);
  l.steps.insert(l.steps.begin() + std::ptrdiff_t(widened.size()), gemmStep(g, {a, bArg, d}));
  return l;
}

GpuLowering nativeStep() {
  GpuLowering l;
  GpuStepSpec s;
  s.kind = pl::GpuStepKind::NATIVE;
  l.steps.push_back(s);
  return l;
}

// REDUCE_GRADS (ints: group, bucket, scatter; floats: scale): the
// executor's own collective, or over a group of one rank the scale alone,
// one generated kernel per parameter of the bucket (GpuReduceLayout). With
// one rank a scattered shard is the whole bucket, in place.
GpuLowering lowerReduceGrads(const GpuInstruction &inst, const std::vector<GpuParamInfo> &params,
                             const GpuReduceLayout *reduce) {
  const int64_t group = inst.ints.at(0);
  const double scale = inst.floats.at(0);
  int64_t ranks = 0; // unknown: the executor's collective
  if (reduce)
    ranks = group == int64_t(rt::Group::DP)        ? reduce->dataParallel
            : group == int64_t(rt::Group::EXPT_DP) ? reduce->expertDataParallel
                                                   : 0;
  if (ranks != 1 || scale == 1.0)
    return nativeStep();
  GpuLowering l;
  const int64_t b = inst.ints.at(1);
  if (b < 0 || size_t(b) >= reduce->buckets.size()) {
    l.missing = "REDUCE_GRADS of bucket " + std::to_string(b) + ", but the stage has " +
                std::to_string(reduce->buckets.size());
    return l;
  }
  const GpuReduceLayout::Range &range = reduce->buckets[size_t(b)];
  GpuInstruction scaled;
  std::vector<int64_t> counts;
  std::optional<pl::DType> dtype;
  for (uint32_t p = 0; p < params.size() && p < reduce->flatOffset.size(); ++p) {
    const int64_t at = reduce->flatOffset[p];
    if (at < range.begin || at >= range.end || params[p].gradOffset < 0)
      continue;
    if (dtype && *dtype != params[p].gradDtype) {
      l.missing = "a gradient bucket of mixed gradient types";
      return l;
    }
    dtype = params[p].gradDtype;
    int64_t count = 1;
    for (int64_t d : params[p].shape)
      count *= d;
    scaled.params.push_back(p);
    counts.push_back(count);
  }
  if (counts.empty()) {
    GpuStepSpec s; // an empty bucket: nothing to scale
    l.steps.push_back(s);
    return l;
  }
  std::string error;
  std::optional<OpKernels> k = generateGradScale(counts, *dtype, scale, &error);
  if (!k) {
    l.missing = error;
    return l;
  }
  return fromOpKernels(*k, scaled);
}

// MOE_DISPATCH / MOE_COMBINE: the executor's own exchange (NATIVE) over
// the S = etp x ep ranks of the stage's experts, with two workspace
// arguments: every rank's tokens_per_expert ([S, E] i32), then the rows'
// staging (alltoall: the R receive rows, where the combine at etp > 1 also
// reduce-scatters them over expt_tp in place) or every rank's y (allgather:
// S * N rows, also the combine's reduce-scatter image). gpu_executor.cpp
// has the algorithm.
GpuLowering lowerMoeExchange(const GpuInstruction &inst, const std::vector<GpuValueInfo> &values) {
  GpuLowering l;
  const bool dispatch = inst.op == pl::Opcode::MOE_DISPATCH;
  if (inst.ints.size() != 4 || inst.in.size() != 3 - (dispatch ? 1 : 0)) {
    l.missing = "an expert exchange without its group, experts per rank, dispatcher and "
                "expert_tensor_parallel";
    return l;
  }
  const GpuValueInfo &y = values[dispatch ? inst.in[0] : inst.out.at(0)];
  const GpuValueInfo &rowsV = values[dispatch ? inst.out.at(0) : inst.in[0]];
  const GpuValueInfo &tpe = values[dispatch ? inst.in[1] : inst.in[2]];
  const int64_t L = inst.ints[1], E = tpe.shape.empty() ? 0 : tpe.shape[0], etp = inst.ints[3];
  if (L < 1 || E % L != 0 || etp < 1 || y.shape.size() != 2 || rowsV.shape.size() != 2) {
    l.missing = "an expert exchange of " + std::to_string(E) + " experts, " +
                std::to_string(L) + " a rank";
    return l;
  }
  const int64_t sources = E / L * etp;
  const bool half = y.dtype == pl::DType::BF16 || y.dtype == pl::DType::F16;
  const uint64_t rowBytes = uint64_t(y.shape[1]) * (half ? 2 : 4);
  const uint64_t counts = alignUp(uint64_t(sources * E) * 4);
  const uint64_t rows =
      inst.ints[2] == 1 ? uint64_t(sources * y.shape[0]) : uint64_t(rowsV.shape[0]);
  GpuStepSpec s;
  s.kind = pl::GpuStepKind::NATIVE;
  s.args = {{pl::GpuArgKind::WORKSPACE, 0}, {pl::GpuArgKind::WORKSPACE, counts}};
  l.steps.push_back(s);
  l.workspaceBytes = counts + alignUp(rows * rowBytes);
  return l;
}

} // namespace

// Each data-parallel rank's owned segments of the listed buckets (the CPU
// executor's flat_segments over bucket_shard): rank r owns elements
// [begin + r n, begin + (r + 1) n) of a bucket, n = (end - begin) / dp,
// whose state is at shard element begin / dp + (e - begin - r n).
// An expert bucket is sharded alike over expt_dp, its state at its
// shardOffset.
static std::vector<std::vector<OpSegment>> rankSegments(const GpuShardLayout &layout,
                                                        const std::vector<GpuParamInfo> &params,
                                                        const std::vector<size_t> &buckets,
                                                        bool expert = false) {
  const int dp = int(std::max<int64_t>(expert ? layout.expertDataParallel : layout.dataParallel, 1));
  std::vector<rt::FlatParam> flat;
  for (uint32_t p = 0; p < params.size(); ++p)
    if (layout.flatOffset.at(p) >= 0) {
      int64_t count = 1;
      for (int64_t d : params[p].shape)
        count *= d;
      flat.push_back({p, layout.flatOffset[p], count});
    }
  std::vector<std::vector<OpSegment>> out(static_cast<size_t>(dp));
  for (int r = 0; r < dp; ++r)
    for (size_t b : buckets) {
      const GpuShardLayout::Bucket &bk = layout.buckets.at(b);
      const rt::FlatRange shard = rt::bucket_shard(bk.begin, bk.end, dp, r);
      const int64_t stateAt =
          bk.shardOffset >= 0 ? bk.shardOffset : rt::shard_state_offset(bk.begin, dp);
      for (const rt::FlatSegment &g : rt::flat_segments(flat, shard.begin, shard.end))
        out[size_t(r)].push_back(
            {g.param, g.param_begin, stateAt + (g.flat_begin - shard.begin), g.count});
    }
  return out;
}

GpuLowering lowerInstruction(const GpuInstruction &inst, const std::vector<GpuValueInfo> &values,
                             const std::vector<GpuParamInfo> &params, int64_t tensorParallel,
                             const GpuShardLayout *shards, const GpuKernelOptions &options,
                             const GpuReduceLayout *reduce) {
  GpuLowering l;
  auto in = [&](size_t i) -> const GpuValueInfo & { return values[inst.in[i]]; };
  auto out = [&](size_t i) -> const GpuValueInfo & { return values[inst.out[i]]; };
  switch (inst.op) {
  case pl::Opcode::MATMUL:
    if (out(0).dtype == pl::DType::F64)
      return lowerWideGemm(inst, values, params);
    l.steps.push_back(gemmStep(forwardGemm(in(0), in(1), out(0)),
                               {value(inst.in[1]), value(inst.in[0]), value(inst.out[0])}));
    return l;
  case pl::Opcode::MATMUL_INPUT_GRAD:
    if (in(0).dtype != in(1).dtype)
      return lowerWideGemm(inst, values, params);
    l.steps.push_back(gemmStep(inputGradGemm(in(0), in(1), out(0)),
                               {value(inst.in[1]), value(inst.in[0]), value(inst.out[0])}));
    return l;
  case pl::Opcode::MATMUL_WEIGHT_GRAD:
    if (in(0).dtype != in(1).dtype)
      return lowerWideGemm(inst, values, params);
    l.steps.push_back(gemmStep(weightGradGemm(in(0), in(1), params.at(inst.params[0]).gradDtype),
                               {value(inst.in[1]), value(inst.in[0]),
                                {pl::GpuArgKind::GRAD, inst.params[0]}}));
    return l;
  case pl::Opcode::RESHAPE:
    if (in(0).region == out(0).region && in(0).offset == out(0).offset) {
      GpuStepSpec s; // the same bytes under another shape
      l.steps.push_back(s);
      return l;
    }
    break;
  // Communication the executor runs itself (NCCL on a GPU) on the
  // instruction's own buffers; SEQ_* and ALL_REDUCE_TIED_GRAD add kernels
  // around theirs (CudaOpKernels.h).
  case pl::Opcode::REDUCE_GRADS:
    return lowerReduceGrads(inst, params, reduce);
  case pl::Opcode::ALL_REDUCE:
  case pl::Opcode::ALL_REDUCE_GRADS:
  case pl::Opcode::ALL_GATHER_PARAMS:
  case pl::Opcode::SEND:
  case pl::Opcode::RECV:
    return nativeStep();
  case pl::Opcode::MOE_DISPATCH:
  case pl::Opcode::MOE_COMBINE:
    return lowerMoeExchange(inst, values);
  case pl::Opcode::ATTENTION:
  case pl::Opcode::ATTENTION_GRAD:
    return lowerAttention(inst, values, tensorParallel, options.flashBackward);
  case pl::Opcode::SHARDED_GRAD_NORM:
  case pl::Opcode::SHARDED_ADAMW:
  case pl::Opcode::SHARDED_SGD: {
    if (!shards) {
      l.missing = "the plan writer gave no distributed-optimizer layout";
      return l;
    }
    OpInstruction o = opInstruction(inst, values, params, tensorParallel);
    o.expertParallel = shards->expertParallel;
    if (inst.op == pl::Opcode::SHARDED_ADAMW || inst.op == pl::Opcode::SHARDED_SGD) {
      const size_t b = size_t(inst.ints.at(0));
      o.expertRanks = shards->buckets.at(b).expert;
      o.rankSegments = rankSegments(*shards, params, {b}, o.expertRanks);
    } else {
      std::vector<size_t> dense, experts;
      for (size_t b = 0; b < shards->buckets.size(); ++b)
        (shards->buckets[b].expert ? experts : dense).push_back(b);
      o.rankSegments = rankSegments(*shards, params, dense);
      if (!experts.empty())
        o.expertRankSegments = rankSegments(*shards, params, experts, true);
    }
    o.shardMasterOffset = shards->master;
    o.shardExpAvgOffset = shards->expAvg;
    o.shardExpAvgSqOffset = shards->expAvgSq;
    std::string error;
    std::optional<OpKernels> k = generateOpKernels(o, &error);
    if (!k) {
      l.missing = error;
      return l;
    }
    return fromOpKernels(*k, inst);
  }
  default:
    break;
  }
  std::string error;
  std::optional<OpKernels> k =
      generateOpKernels(opInstruction(inst, values, params, tensorParallel), &error);
  if (!k) {
    l.missing = error;
    return l;
  }
  return fromOpKernels(*k, inst);
}

GpuLowering lowerOptimizerGroup(const std::vector<GpuInstruction> &group,
                                const std::vector<GpuValueInfo> &values,
                                const std::vector<GpuParamInfo> &params) {
  std::vector<OpInstruction> ops;
  for (const GpuInstruction &i : group)
    ops.push_back(opInstruction(i, values, params, 1));
  std::string error;
  std::optional<OpKernels> k = !group.empty() && group.front().op == pl::Opcode::SGD
                                   ? generateSgdGroup(ops, &error)
                                   : generateAdamWGroup(ops, &error);
  if (!k) {
    GpuLowering l;
    l.missing = error;
    return l;
  }
  // The launch's arguments name the group's first instruction; the
  // kernels address parameters through the state buffer, so its `in` (lr,
  // clip and AdamW's step) is all they read, and every instruction of the
  // group shares it.
  return fromOpKernels(*k, group.front());
}

GpuLowering lowerFusedKernel(const GpuInstruction &inst, int64_t kernelIndex,
                             const CudaKernel &kernel) {
  GpuLowering l;
  GpuStepSpec s;
  s.kind = pl::GpuStepKind::KERNEL;
  s.kernel = kernelIndex;
  for (uint32_t v : inst.in)
    s.args.push_back(value(v));
  for (uint32_t v : inst.out)
    s.args.push_back(value(v));
  scalarArgs(kernel, s.args);
  l.steps.push_back(s);
  return l;
}

GpuLowering lowerGemmKernel(const GpuInstruction &inst, const GemmKernelShape &shape,
                            const std::vector<GpuValueInfo> &values) {
  // inputs x, w, b; outputs [pre-activation,] result
  const uint32_t x = inst.in[0], w = inst.in[1], b = inst.in[2];
  const uint32_t y = inst.out.back();
  GemmSpec g = forwardGemm(values[x], values[w], values[y]);
  g.biasType = values[b].dtype;
  g.epilogue = !shape.gelu    ? pl::GemmEpilogue::BIAS
               : shape.auxOut ? pl::GemmEpilogue::GELU_AUX_BIAS
                              : pl::GemmEpilogue::GELU_BIAS;
  std::vector<GpuArgSpec> args = {value(w), value(x), value(y), value(b)};
  if (shape.gelu && shape.auxOut)
    args.push_back(value(inst.out[0]));
  GpuLowering l;
  l.steps.push_back(gemmStep(g, std::move(args)));
  return l;
}

GpuLowering lowerGemmGradKernel(const GemmGradKernelShape &shape,
                                const std::vector<GpuValueInfo> &values) {
  GpuLowering l;
  const GpuArgSpec biasOut = {pl::GpuArgKind::WORKSPACE, 0};
  GemmSpec g;
  std::vector<GpuArgSpec> args;
  int64_t biasCount = 0;
  if (shape.weightGrad) {
    g = weightGradGemm(values[shape.dy], values[shape.operand], shape.gradDtype);
    g.epilogue = pl::GemmEpilogue::BGRADB;
    args = {value(shape.operand), value(shape.dy), {pl::GpuArgKind::GRAD, shape.weightParam},
            biasOut};
    biasCount = g.n;
  } else {
    g = inputGradGemm(values[shape.dy], values[shape.operand], values[shape.out]);
    g.epilogue = shape.biasGrad ? pl::GemmEpilogue::DGELU_BGRAD : pl::GemmEpilogue::DGELU;
    args = {value(shape.operand), value(shape.dy), value(shape.out)};
    if (shape.biasGrad) {
      args.push_back(biasOut);
      biasCount = g.m;
    }
    args.push_back(value(shape.pre));
  }
  // cuBLASLt's bias gradient has D's type; the accumulation reads f32.
  g.biasType = g.dType;
  if (biasCount && g.dType != pl::DType::F32) {
    l.missing = "a GEMM bias gradient of 16-bit values (mt-fuse fuses DGELU_BGRAD only "
                "for f32 gradients)";
    return l;
  }
  l.steps.push_back(gemmStep(g, std::move(args)));
  if (!biasCount)
    return l;
  std::string error;
  std::optional<OpKernels> k = generateGradAccumulate(biasCount, shape.gradDtype, &error);
  if (!k) {
    l.missing = error;
    return l;
  }
  GpuInstruction accumulate;
  accumulate.params = {shape.biasParam};
  GpuLowering add = fromOpKernels(*k, accumulate);
  l.kernels = std::move(add.kernels);
  l.steps.insert(l.steps.end(), add.steps.begin(), add.steps.end());
  l.workspaceBytes = std::max(alignUp(uint64_t(biasCount) * 4), add.workspaceBytes);
  return l;
}

} // namespace mt
