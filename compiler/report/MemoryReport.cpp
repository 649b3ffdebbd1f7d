// The memory and feasibility plan: per-rank rows, verdict, and checked fixes.
#include "compiler/report/MemoryReport.h"

#include "dialects/mt/MtOps.h"
#include "passes/StageModules.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <sstream>

using namespace mlir;

namespace mt {
namespace {

std::string gib(int64_t bytes) {
  return llvm::formatv("{0:F2} GiB", double(bytes) / double(1ll << 30)).str();
}

int64_t attr(DictionaryAttr d, StringRef name) {
  if (!d)
    return 0;
  auto a = d.getAs<IntegerAttr>(name);
  return a ? a.getInt() : 0;
}

int64_t bytesOf(Value v) {
  auto t = cast<RankedTensorType>(v.getType());
  return t.getNumElements() * int64_t(t.getElementTypeBitWidth() / 8);
}

// A factor as the spec wrote it (1.5, not 1.500000).
std::string factorText(double f) {
  std::ostringstream os;
  os << f;
  return os.str();
}

// What one rank sends in one micro-batch's @train_step (its forward, any
// recomputed chunk and its backward), with S = etp * ep ranks exchanging
// (the tensor-and-expert-parallel group; S = ep at etp 1) and the runtime's
// algorithms (runtime/exec/cpu_executor_moe.cpp; the GPU executor alike):
// - alltoall dispatch: at most its own N rows, each to the etp ranks of the
//   row's expert: etp x N;
// - alltoall combine of the R received rows: at etp 1 the rows from its
//   ep - 1 peers go back, (ep - 1) / ep of R; at etp > 1 first a
//   reduce-scatter over the etp ranks that hold the same rows, each keeping
//   the sums of its own sources' rows (a ring sends (etp - 1) / etp of R),
//   then each rank returns those R / etp rows, less its own:
//   (ep - 1) / S of R;
// - allgather: its N rows to each of the S - 1 peers, and the combine, a
//   reduce-scatter of S x N rows, as many back.
int64_t exchangeBytes(ModuleOp stage) {
  auto step = stage.lookupSymbol<func::FuncOp>("train_step");
  if (!step)
    return 0;
  int64_t bytes = 0;
  step.walk([&](Operation *op) {
    if (auto d = dyn_cast<MoeDispatchOp>(op)) {
      const int64_t etp = d.getEtpSizeAttr().getInt(), S = etp * d.getEpSizeAttr().getInt();
      bytes += d.getDispatcher() == MoeDispatcher::AllGather ? (S - 1) * bytesOf(d.getInput())
                                                             : etp * bytesOf(d.getInput());
    } else if (auto c = dyn_cast<MoeCombineOp>(op)) {
      const int64_t etp = c.getEtpSizeAttr().getInt(), ep = c.getEpSizeAttr().getInt();
      const int64_t S = etp * ep, R = bytesOf(c.getInput());
      bytes += c.getDispatcher() == MoeDispatcher::AllGather
                   ? (S - 1) * bytesOf(c.getResult())
                   : R / S * (ep - 1) + R / etp * (etp - 1);
    }
  });
  return bytes;
}

} // namespace

MegatronEstimate megatronTheoreticalMemory(const spec::Spec &spec) {
  const spec::ModelConfig &m = spec.model;
  const spec::ParallelConfig &p = spec.parallel;
  double h = double(m.hidden_size), L = double(m.num_layers);
  double a = double(m.num_attention_heads), g = double(m.num_query_groups);
  double ffn = double(m.ffn_hidden_size), V = double(spec.paddedVocabSize());
  double s = double(m.seq_length), b = double(spec.training.micro_batch_size);
  double tp = double(p.tensor_model_parallel_size), pp = double(p.pipeline_model_parallel_size);
  double dp = double(p.data_parallel_size);
  double qRatio = double(m.kv_channels) * a / h;
  double gated = m.swiglu ? 1.5 : 1.0;
  double layers = 2.0 * L * h * h *
                  ((1.0 + g / a) * qRatio + (ffn / h) * gated + 2.0 / h + 1.0 / (L * h));
  // MoE layers: the routed experts and the shared expert in place of the
  // dense MLP (Megatron's formula has no term for the router).
  if (m.num_experts > 0) {
    double moe = double(m.numMoeLayers());
    double expertsFfn = double(m.moe_ffn_hidden_size) * double(m.num_experts) +
                        double(m.moe_shared_expert_intermediate_size);
    layers += 2.0 * moe * h * (expertsFfn - ffn) * gated;
  }
  double embedding = h * V;
  double mostLoaded = (layers / pp + embedding) / tp;
  if (m.untie_embeddings_and_output_weights && pp == 1)
    mostLoaded += embedding / tp;
  // Adam: 2 (weights) + 4 (grads) + 4 (master) + 8 (moments), the last 12
  // sharded by the distributed optimizer. SGD keeps one state tensor, 4 bytes
  // fewer (Megatron's function knows Adam only; the same count for SGD).
  const bool sgd = spec.training.optimizer == spec::Optimizer::SGD;
  double bytesPerParam = p.use_distributed_optimizer ? 6.0 + (sgd ? 8.0 : 12.0) / dp
                                                     : (sgd ? 14.0 : 18.0);

  // Per layer, Korthikanti et al. (Megatron's activation memory paper):
  // with sequence parallelism everything is split, 34 s b h / t at ffn = 4h
  // (Megatron's own function, which assumes it); without it the norms'
  // inputs, dropout masks and residuals (10 s b h) are held whole on every
  // tensor-parallel rank and only the rest (24 s b h at ffn = 4h) is split.
  const bool sp = p.sequence_parallel;
  double act = sp ? s * b * h * (18.0 + 4.0 * (ffn / h)) * L
                  : s * b * h * (10.0 * tp + 8.0 + 4.0 * (ffn / h)) * L;
  act += 8.0 * s * b * pp;     // input ids
  act += s * b * h * pp;       // embedding dropout mask
  if (p.virtual_pipeline_model_parallel_size > 1)
    act *= 1.0 + (pp - 1.0) / (pp * double(p.virtual_pipeline_model_parallel_size));
  else if (pp > 1)
    act *= std::min(1.0, double(spec.numMicroBatches()) / pp);
  if (pp == 1)
    act += s * b * h * 4.0 * (1.0 + V / h); // output layer input and the loss
  act /= tp;
  return {int64_t(mostLoaded * bytesPerParam), int64_t(act)};
}

MemoryPlan memoryPlanOf(ModuleOp module, const spec::Spec &spec) {
  MemoryPlan plan;
  // One row per distinct rank: each pipeline stage at the peak of its own
  // schedule. Its data-parallel replicas hold the same, and its
  // tensor-parallel ranks equal shards of it, so one row covers them all.
  const int64_t tp = spec.parallel.tensor_model_parallel_size;
  for (ModuleOp stage : stageModules(module)) {
    auto mem = stage->getAttrOfType<DictionaryAttr>("mt.memory");
    RankMemory r;
    r.weights = attr(mem, "weights");
    r.grads = attr(mem, "grads");
    r.master = attr(mem, "master_weights");
    r.moments = attr(mem, "optimizer_moments");
    r.activations = attr(mem, "activations");
    int64_t dp = 1;
    if (auto a = stage->getAttrOfType<IntegerAttr>("mt.data_parallel"))
      dp = a.getInt();
    const int64_t p = stageRank(stage);
    // Ranks of a stage: tp * dp * p to tp * dp * (p + 1) - 1 (Megatron's
    // order, runtime/comm/parallel_groups.h).
    const int64_t n = tp * dp;
    r.rank = n > 1 ? std::to_string(n * p) + "-" + std::to_string(n * (p + 1) - 1)
                   : std::to_string(p);
    if (stage->hasAttr("mt.stage"))
      r.rank = "pp " + std::to_string(p) + ": " + r.rank;
    if (auto a = stage->getAttrOfType<IntegerAttr>("mt.micro_batches_in_flight"))
      r.inFlight = a.getInt();
    r.workspace = kCublasWorkspaceBytes;
    r.reserve = kCudaContextReserveBytes;
    plan.ranks.push_back(r);
  }
  for (auto [i, r] : llvm::enumerate(plan.ranks))
    if (r.total() > plan.ranks[plan.heaviest].total())
      plan.heaviest = int(i);
  plan.deviceBytes = spec.cluster.device_memory_bytes;
  plan.device = spec.cluster.device;
  plan.sequenceParallel = spec.parallel.sequence_parallel;
  plan.tensorParallel = tp > 1;
  plan.sgd = spec.training.optimizer == spec::Optimizer::SGD;
  MegatronEstimate mega = megatronTheoreticalMemory(spec);
  plan.megatronWeightsAndOptimizer = mega.weightsAndOptimizer;
  plan.megatronActivations = mega.activations;
  if (spec.parallel.pipeline_model_parallel_size > 1)
    plan.note = "pipeline stages hold up to pipeline_model_parallel_size micro-batches' "
                "activations at their peak (1F1B), the first stage the most";
  // MoE layers' dispatched rows have static shapes (compiler/import): say
  // what they are sized for, since the routing is known only at run time.
  if (spec.model.numMoeLayers() > 0) {
    const std::string moe =
        spec.model.moe_expert_capacity_factor <= 0.0
            ? "MoE dispatch and permutation buffers are sized for the worst case, nothing "
              "dropped: micro-batch tokens x moe_router_topk rows a layer, whatever the routing"
        : spec.model.moe_pad_expert_input_to_capacity
            ? "MoE dispatch and permutation buffers are sized by capacity: num_experts x "
              "capacity rows a layer, padded"
            : "MoE dispatch and permutation buffers are sized by capacity: min(micro-batch "
              "tokens x moe_router_topk, num_experts x capacity) rows a layer";
    plan.note = plan.note.empty() ? moe : plan.note + "; " + moe;
  }
  const int64_t ep = spec.parallel.expert_model_parallel_size,
                etp = spec.parallel.expert_tensor_parallel_size;
  if (spec.model.numMoeLayers() > 0 && ep * etp > 1) {
    plan.expertParallel = ep;
    plan.expertTensorParallel = etp;
    plan.dispatcher = spec::toString(spec.parallel.moe_token_dispatcher_type);
    for (ModuleOp stage : stageModules(module)) {
      plan.allToAllBytes = std::max(plan.allToAllBytes, exchangeBytes(stage));
      stage.walk([&](MoeDispatchOp d) {
        plan.receiveRows = std::max(plan.receiveRows, cast<RankedTensorType>(d.getResult().getType()).getDimSize(0));
        if (auto w = d->getAttrOfType<IntegerAttr>("mt.worst_case_rows"))
          plan.worstCaseReceiveRows = std::max(plan.worstCaseReceiveRows, w.getInt());
      });
    }
    plan.allToAllBytes *= spec.numMicroBatches();
    // The sources: the ep ranks, or with expert tensor parallelism the
    // etp x ep ranks of the tensor-and-expert-parallel group.
    const std::string S = etp > 1 ? "expert_tensor_parallel_size x expert_model_parallel_size"
                                  : "expert_model_parallel_size";
    plan.receiveFactor =
        plan.worstCaseReceiveRows > 0 ? spec.parallel.moe_dispatch_buffer_factor : 0.0;
    const std::string worst = S + " x micro-batch tokens x min(moe_router_topk, num_experts / "
                                  "expert_model_parallel_size)";
    const std::string received =
        plan.receiveFactor > 0
            ? llvm::formatv("each rank receives up to {0} rows a layer, bounded at "
                            "moe_dispatch_buffer_factor = {1} x the balanced load (the worst "
                            "case, {2}, is {3} rows; a step whose routing needs more stops "
                            "with an error)",
                            plan.receiveRows, factorText(plan.receiveFactor), worst,
                            plan.worstCaseReceiveRows)
                  .str()
        : spec.model.moe_expert_capacity_factor <= 0.0
            ? "each rank receives up to " + worst +
                  " rows a layer (the worst case, whatever the routing)"
        : spec.model.moe_pad_expert_input_to_capacity
            ? "each rank receives " + S + " x num_experts / "
              "expert_model_parallel_size x capacity rows a layer, padded"
            : "each rank receives up to " + S + " x min(micro-batch tokens x "
              "min(moe_router_topk, num_experts / expert_model_parallel_size), num_experts / "
              "expert_model_parallel_size x capacity) rows a layer";
    plan.note += "; " + received;
    if (etp > 1)
      plan.note += std::string("; the all-to-all volume counts with expert tensor parallelism ") +
                   (spec.parallel.moe_token_dispatcher_type == spec::MoeTokenDispatcher::AllGather
                        ? "each rank's rows gathered by and reduce-scattered from the "
                          "expert_tensor_parallel_size x expert_model_parallel_size - 1 peers"
                        : "each dispatched row sent to the expert_tensor_parallel_size ranks of "
                          "its expert, and a combine's reduce-scatter of the received rows "
                          "over those ranks (a ring) before each returns its share");
  }
  return plan;
}

void suggestFixes(MemoryPlan &plan, const spec::Spec &spec,
                  const std::function<std::optional<int64_t>(const spec::Spec &)> &replan) {
  if (plan.fits())
    return;
  const RankMemory &heavy = plan.ranks[plan.heaviest];
  int64_t fixed = heavy.weights + heavy.grads + heavy.master + heavy.moments +
                  heavy.workspace + heavy.reserve;
  if (fixed > plan.deviceBytes) {
    // Sharding the optimizer helps only where it is not sharded already.
    const bool sharded = spec.parallel.use_distributed_optimizer &&
                         spec.parallel.data_parallel_size > 1;
    plan.suggestions.push_back(
        "weights, gradients and optimizer state alone need " + gib(fixed) +
        " per GPU: split the model with tensor_model_parallel_size or "
        "pipeline_model_parallel_size" +
        (sharded ? std::string(" (the optimizer state is already sharded over the " +
                               std::to_string(spec.parallel.data_parallel_size) +
                               " data-parallel ranks)")
                 : std::string(", or shard the optimizer with use_distributed_optimizer = true "
                               "and data_parallel_size > 1")));
    return;
  }
  // Smaller micro-batches (same global batch: more accumulation steps).
  for (int64_t mbs = spec.training.micro_batch_size / 2; mbs >= 1; mbs /= 2) {
    spec::Spec v = spec;
    v.training.micro_batch_size = mbs;
    if (v.training.global_batch_size % (mbs * v.parallel.data_parallel_size) != 0)
      continue;
    std::optional<int64_t> total = replan(v);
    if (total && *total <= plan.deviceBytes) {
      plan.suggestions.push_back(llvm::formatv(
          "micro_batch_size = {0} (global batch unchanged, {1} micro-batches): "
          "{2} of {3}",
          mbs, v.numMicroBatches(), gib(*total), gib(plan.deviceBytes)));
      break;
    }
  }
  // Full recomputation of every layer (only each layer's input is kept).
  if (spec.parallel.recompute_granularity != spec::RecomputeGranularity::Full) {
    spec::Spec v = spec;
    v.parallel.recompute_granularity = spec::RecomputeGranularity::Full;
    v.parallel.recompute_method = spec::RecomputeMethod::Uniform;
    v.parallel.recompute_num_layers = 1;
    std::optional<int64_t> total = replan(v);
    if (total && *total <= plan.deviceBytes)
      plan.suggestions.push_back(llvm::formatv(
          "recompute_granularity = \"full\", recompute_method = \"uniform\", "
          "recompute_num_layers = 1 (about a third more compute): {0} of {1}",
          gib(*total), gib(plan.deviceBytes)));
  }
  if (plan.suggestions.empty())
    plan.suggestions.push_back(
        "neither micro_batch_size = 1 nor full recompute fits: use tensor or "
        "pipeline parallelism, or a shorter seq_length");
}

void printMemoryPlanText(llvm::raw_ostream &os, const MemoryPlan &plan) {
  os << "memory per GPU (" << plan.device << ", " << gib(plan.deviceBytes) << ")\n";
  size_t width = 8;
  for (const RankMemory &r : plan.ranks)
    width = std::max(width, r.rank.size() + 2);
  auto pad = [&](const std::string &s) { return s + std::string(width - s.size(), ' '); };
  os << llvm::formatv("  {0}{1,11}{2,11}{3,11}{4,11}{5,13}{6,11}{7,11}{8,12}\n", pad("rank"),
                      "weights", "grads", "master", plan.sgd ? "momentum" : "adam m+v",
                      "activations",
                      "workspace", "reserve", "total");
  auto g = [](int64_t b) { return llvm::formatv("{0:F2}", double(b) / double(1ll << 30)).str(); };
  for (auto [i, r] : llvm::enumerate(plan.ranks))
    os << llvm::formatv("  {0}{1,11}{2,11}{3,11}{4,11}{5,13}{6,11}{7,11}{8,12}{9}\n",
                        pad(r.rank), g(r.weights), g(r.grads), g(r.master), g(r.moments),
                        g(r.activations), g(r.workspace), g(r.reserve), g(r.total()),
                        plan.ranks.size() > 1 && int(i) == plan.heaviest ? "  <- heaviest" : "");
  const bool stages = !plan.ranks.empty() && plan.ranks.front().inFlight > 0;
  os << "  (GiB; activations = the planned arena at its peak, "
     << (stages ? "with the micro-batches each stage holds then"
                : "one micro-batch in flight")
     << "; reserve = CUDA context and libraries, stated)\n";
  if (!plan.note.empty())
    os << "  note: " << plan.note << "\n";
  if (plan.expertParallel * plan.expertTensorParallel > 1)
    os << "  all-to-all: " << gib(plan.allToAllBytes) << " a step ("
       << (plan.receiveFactor > 0
               ? "bounded at " + factorText(plan.receiveFactor) + " x the balanced load"
               : std::string("worst case"))
       << ", ep " << plan.expertParallel
       << (plan.expertTensorParallel > 1
               ? ", etp " + std::to_string(plan.expertTensorParallel)
               : std::string())
       << ", " << plan.dispatcher
       << "; the rows one rank sends in its token exchanges, forward and backward)\n";
  if (plan.ranks.size() > 1 && plan.ranks.front().inFlight > 0) {
    os << "  micro-batches in flight at each stage's peak:";
    for (const RankMemory &r : plan.ranks)
      os << " " << r.inFlight;
    os << "\n";
  }
  const RankMemory &r0 = plan.ranks[plan.heaviest];
  os << llvm::formatv(
      "  Megatron-LM's theoretical formula: weights and optimizer {0} (planned: {1}), "
      "activations {2} (planned: {3}); it assumes 16-bit training{4}{5} and selective "
      "recompute (docs/memory.md)\n",
      gib(plan.megatronWeightsAndOptimizer),
      gib(r0.weights + r0.grads + r0.master + r0.moments), gib(plan.megatronActivations),
      gib(r0.activations),
      !plan.tensorParallel     ? ""
      : plan.sequenceParallel ? " with sequence parallelism"
                              : " with tensor parallelism but no sequence parallelism",
      plan.sgd ? ", SGD's one state tensor (Megatron's counts Adam's two)" : "");
  const RankMemory &h = plan.ranks[plan.heaviest];
  double use = plan.deviceBytes ? 100.0 * double(h.total()) / double(plan.deviceBytes) : 0.0;
  if (plan.fits()) {
    os << llvm::formatv("verdict: fits, {0} of {1} ({2:F1}% used)\n", gib(h.total()),
                        gib(plan.deviceBytes), use);
  } else {
    os << llvm::formatv("verdict: does NOT fit, needs {0} of {1} ({2:F1}%)\n",
                        gib(h.total()), gib(plan.deviceBytes), use);
    for (const std::string &s : plan.suggestions)
      os << "  to fit: " << s << "\n";
  }
}

llvm::json::Object memoryPlanJson(const MemoryPlan &plan) {
  llvm::json::Array ranks;
  for (const RankMemory &r : plan.ranks)
    ranks.push_back(llvm::json::Object{
        {"rank", r.rank},
        {"weights", r.weights},
        {"grads", r.grads},
        {"master_weights", r.master},
        {"optimizer_moments", r.moments},
        {"activations", r.activations},
        {"workspace", r.workspace},
        {"context_reserve", r.reserve},
        {"total", r.total()},
        {"micro_batches_in_flight", r.inFlight}});
  llvm::json::Array suggestions;
  for (const std::string &s : plan.suggestions)
    suggestions.push_back(s);
  return llvm::json::Object{{"device", plan.device},
                            {"device_memory", plan.deviceBytes},
                            {"ranks", std::move(ranks)},
                            {"heaviest_rank", plan.heaviest},
                            {"fits", plan.fits()},
                            {"note", plan.note},
                            {"megatron_theoretical",
                             llvm::json::Object{
                                 {"weights_and_optimizer", plan.megatronWeightsAndOptimizer},
                                 {"activations", plan.megatronActivations}}},
                            {"all_to_all",
                             plan.expertParallel * plan.expertTensorParallel > 1
                                 ? llvm::json::Value(llvm::json::Object{
                                       {"bytes_per_step", plan.allToAllBytes},
                                       {"expert_model_parallel", plan.expertParallel},
                                       {"expert_tensor_parallel", plan.expertTensorParallel},
                                       {"dispatcher", plan.dispatcher},
                                       {"worst_case", plan.receiveFactor <= 0},
                                       {"receive_rows", plan.receiveRows},
                                       {"worst_case_receive_rows",
                                        plan.receiveFactor > 0 ? plan.worstCaseReceiveRows
                                                               : plan.receiveRows},
                                       {"moe_dispatch_buffer_factor",
                                        plan.receiveFactor > 0
                                            ? llvm::json::Value(plan.receiveFactor)
                                            : llvm::json::Value(nullptr)}})
                                 : llvm::json::Value(nullptr)},
                            {"suggestions", std::move(suggestions)}};
}

} // namespace mt
