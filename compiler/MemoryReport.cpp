// The memory and feasibility plan: per-rank rows, verdict, and checked fixes.
#include "compiler/MemoryReport.h"

#include "llvm/Support/FormatVariadic.h"

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

} // namespace

MemoryPlan memoryPlanOf(ModuleOp module, const spec::Spec &spec) {
  auto mem = module->getAttrOfType<DictionaryAttr>("mt.memory");
  RankMemory r;
  r.weights = attr(mem, "weights");
  r.grads = attr(mem, "grads");
  r.master = attr(mem, "master_weights");
  r.moments = attr(mem, "optimizer_moments");
  r.activations = attr(mem, "activations");
  r.workspace = kCublasWorkspaceBytes;
  r.reserve = kCudaContextReserveBytes;
  MemoryPlan plan;
  plan.ranks.push_back(r);
  plan.deviceBytes = spec.cluster.device_memory_bytes;
  plan.device = spec.cluster.device;
  if (spec.worldSize() > 1)
    plan.note = "the parallel layout (tp, pp, dp) is not planned yet: these figures "
                "are for the whole model on one GPU";
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
    plan.suggestions.push_back(
        "weights, gradients and optimizer state alone need " + gib(fixed) +
        " per GPU: split the model with tensor_model_parallel_size or "
        "pipeline_model_parallel_size, or shard the optimizer with "
        "use_distributed_optimizer = true and data_parallel_size > 1");
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
  if (plan.suggestions.empty())
    plan.suggestions.push_back(
        "even micro_batch_size = 1 does not fit: use tensor or pipeline "
        "parallelism, or a shorter seq_length");
}

void printMemoryPlanText(llvm::raw_ostream &os, const MemoryPlan &plan) {
  os << "memory per GPU (" << plan.device << ", " << gib(plan.deviceBytes) << ")\n";
  os << llvm::formatv("  {0,-8}{1,11}{2,11}{3,11}{4,11}{5,13}{6,11}{7,11}{8,12}\n", "rank",
                      "weights", "grads", "master", "adam m+v", "activations",
                      "workspace", "reserve", "total");
  auto g = [](int64_t b) { return llvm::formatv("{0:F2}", double(b) / double(1ll << 30)).str(); };
  for (auto [i, r] : llvm::enumerate(plan.ranks))
    os << llvm::formatv("  {0,-8}{1,11}{2,11}{3,11}{4,11}{5,13}{6,11}{7,11}{8,12}{9}\n",
                        r.rank, g(r.weights), g(r.grads), g(r.master), g(r.moments),
                        g(r.activations), g(r.workspace), g(r.reserve), g(r.total()),
                        plan.ranks.size() > 1 && int(i) == plan.heaviest ? "  <- heaviest" : "");
  os << "  (GiB; activations = the planned arena at its peak, one micro-batch in flight; "
        "reserve = CUDA context and libraries, stated)\n";
  if (!plan.note.empty())
    os << "  note: " << plan.note << "\n";
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
        {"total", r.total()}});
  llvm::json::Array suggestions;
  for (const std::string &s : plan.suggestions)
    suggestions.push_back(s);
  return llvm::json::Object{{"device", plan.device},
                            {"device_memory", plan.deviceBytes},
                            {"ranks", std::move(ranks)},
                            {"heaviest_rank", plan.heaviest},
                            {"fits", plan.fits()},
                            {"note", plan.note},
                            {"suggestions", std::move(suggestions)}};
}

} // namespace mt
