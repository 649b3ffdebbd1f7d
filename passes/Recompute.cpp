// mt-recompute: Megatron-LM's activation recomputation, applied to @train_step.
#include "passes/Passes.h"

#include "dialects/mt/MtOps.h"
#include "passes/StageModules.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/Support/FormatVariadic.h"

#include <optional>

namespace mt {
#define GEN_PASS_DEF_MTRECOMPUTEPASS
#include "passes/Passes.h.inc"
} // namespace mt

using namespace mlir;

namespace mt {
namespace {


// What `mt.training` asks for, checked.
struct Settings {
  StringRef granularity; // none | selective | full
  StringRef method;      // none | uniform | block
  int64_t numLayers = 0;
};

FailureOr<Settings> readSettings(ModuleOp module) {
  auto t = moduleAttr(module, "mt.training");
  if (!t)
    return module.emitError("mt-recompute: the module has no mt.training settings "
                            "(mtc's importer writes them)");
  Settings s;
  auto g = t.getAs<StringAttr>("recompute_granularity");
  if (!g)
    return module.emitError("mt-recompute: mt.training.recompute_granularity is missing");
  s.granularity = g.getValue();
  if (!llvm::is_contained({"none", "selective", "full"}, s.granularity))
    return module.emitError() << "mt-recompute: mt.training.recompute_granularity is \""
                              << s.granularity
                              << "\"; expected \"none\", \"selective\" or \"full\"";
  if (auto m = t.getAs<StringAttr>("recompute_method"))
    s.method = m.getValue();
  else if (s.granularity == "full")
    return module.emitError("mt-recompute: mt.training.recompute_method is missing");
  else
    s.method = "none";
  if (!llvm::is_contained({"none", "uniform", "block"}, s.method))
    return module.emitError() << "mt-recompute: mt.training.recompute_method is \"" << s.method
                              << "\"; expected \"none\", \"uniform\" or \"block\"";
  if (auto n = t.getAs<IntegerAttr>("recompute_num_layers"))
    s.numLayers = n.getInt();
  else if (s.granularity == "full")
    return module.emitError("mt-recompute: mt.training.recompute_num_layers is missing");

  if (s.granularity != "full") {
    if (s.method != "none")
      return module.emitError() << "mt-recompute: recompute_method \"" << s.method
                                << "\" needs recompute_granularity \"full\", got \""
                                << s.granularity << "\"";
    return s;
  }
  if (s.method == "none")
    return module.emitError("mt-recompute: recompute_granularity \"full\" needs "
                            "recompute_method \"uniform\" or \"block\", got \"none\"");
  if (s.numLayers < 1)
    return module.emitError() << "mt-recompute: recompute_num_layers is " << s.numLayers
                              << "; recompute_granularity \"full\" needs at least 1";
  return s;
}

// Forward ops of one chunk of layers are re-executed in the backward: the
// backward reads the copies, so the originals die when the forward is done
// with them and mt-plan-memory reuses their bytes.
class ChunkRecomputer {
public:
  ChunkRecomputer(Block &body, Operation *seed) : body(body), seed(seed) {}

  // Returns the number of ops cloned (0 when the backward reads nothing the
  // chunk computes internally).
  int64_t recompute(ArrayRef<int64_t> layers) {
    // The chunk's forward ops, in program order. Parameter reads are inputs
    // of the chunk like the residual stream entering it: shared, not cloned
    // (they cost nothing to keep).
    llvm::SetVector<Operation *> chunk;
    for (Operation &op : body) {
      if (&op == seed)
        break;
      std::optional<int64_t> l = layerOf(&op);
      if (l && llvm::is_contained(layers, *l) && !isa<ParamRefOp>(op))
        chunk.insert(&op);
    }

    // A value the chunk hands on (read by a later forward op or returned) is
    // the next chunk's input and stays alive anyway: the backward keeps
    // reading it. The rest that the backward reads is recomputed.
    DenseSet<Value> handedOn;
    SmallVector<Value> recomputed;
    for (Operation *op : chunk) {
      for (Value r : op->getResults()) {
        bool readAfter = false, readBack = false;
        for (Operation *user : r.getUsers()) {
          Operation *u = body.findAncestorOpInBlock(*user);
          if (chunk.contains(u))
            continue;
          (isBackward(u) ? readBack : readAfter) = true;
        }
        if (readAfter)
          handedOn.insert(r);
        else if (readBack)
          recomputed.push_back(r);
      }
    }
    if (recomputed.empty())
      return 0;

    // Only what those values depend on inside the chunk is re-executed.
    DenseSet<Operation *> toClone;
    SmallVector<Operation *> work;
    for (Value v : recomputed)
      work.push_back(v.getDefiningOp());
    while (!work.empty()) {
      Operation *op = work.pop_back_val();
      if (!toClone.insert(op).second)
        continue;
      for (Value operand : op->getOperands())
        if (Operation *def = operand.getDefiningOp();
            def && chunk.contains(def) && !handedOn.contains(operand))
          work.push_back(def);
    }

    // As late as possible: right before the first backward op that reads
    // one of the recomputed values.
    Operation *first = nullptr;
    for (Value v : recomputed)
      for (Operation *user : v.getUsers()) {
        Operation *u = body.findAncestorOpInBlock(*user);
        if (isBackward(u) && (!first || u->isBeforeInBlock(first)))
          first = u;
      }

    // The clones keep every attribute: `stream` reproduces dropout masks,
    // `mt.layer` keeps them in their layer. `mt.recomputed` marks them, which
    // also keeps CSE from folding a clone into its original.
    OpBuilder b(first);
    IRMapping map;
    int64_t cloned = 0;
    for (Operation *op : chunk) {
      if (!toClone.contains(op))
        continue;
      Operation *copy = b.clone(*op, map);
      copy->setAttr("mt.recomputed", b.getUnitAttr());
      ++cloned;
    }
    for (Value v : recomputed)
      v.replaceUsesWithIf(map.lookup(v), [&](OpOperand &use) {
        return isBackward(body.findAncestorOpInBlock(*use.getOwner()));
      });
    return cloned;
  }

private:
  // Backward ops follow mt.grad_seed; the return only hands out the loss.
  bool isBackward(Operation *op) const {
    return seed->isBeforeInBlock(op) && !op->hasTrait<OpTrait::IsTerminator>();
  }

  Block &body;
  Operation *seed;
};

// Sequence parallelism: the backward of a column-parallel layer needs its
// whole-sequence input (the weight gradient reads it), but Megatron-LM keeps
// only this rank's sequence shard and all-gathers it again in the backward.
// The same here: a forward mt.sp_gather read by backward ops is cloned right
// before the first of them, so the gathered tensor dies with the forward
// GEMM and only the shard (1/tp of it) stays until the backward.
void regatherSequenceShards(Block &body) {
  Operation *seed = nullptr;
  for (Operation &op : body)
    if (isa<GradSeedOp>(op)) {
      seed = &op;
      break;
    }
  if (!seed)
    return;
  DenseMap<Operation *, unsigned> order;
  unsigned n = 0;
  for (Operation &op : body)
    order[&op] = n++;
  SmallVector<SpGatherOp> gathers;
  for (Operation &op : body) {
    if (&op == seed)
      break;
    if (auto g = dyn_cast<SpGatherOp>(op))
      gathers.push_back(g);
  }
  for (SpGatherOp g : gathers) {
    Operation *first = nullptr;
    for (Operation *user : g->getUsers()) {
      Operation *top = body.findAncestorOpInBlock(*user);
      if (order.lookup(top) > order.lookup(seed) &&
          (!first || order.lookup(top) < order.lookup(first)))
        first = top;
    }
    if (!first)
      continue;
    OpBuilder b(first);
    Operation *again = b.clone(*g.getOperation());
    again->setAttr("mt.recomputed", b.getUnitAttr());
    g.getResult().replaceUsesWithIf(again->getResult(0), [&](OpOperand &use) {
      return order.lookup(body.findAncestorOpInBlock(*use.getOwner())) > order.lookup(seed);
    });
  }
}

struct MtRecomputePass : impl::MtRecomputePassBase<MtRecomputePass> {
  void runOnOperation() override {
    for (ModuleOp stage : stageModules(getOperation()))
      if (failed(runOnStage(stage)))
        return signalPassFailure();
  }

  LogicalResult runOnStage(ModuleOp module) {
    FailureOr<Settings> settings = readSettings(module);
    if (failed(settings))
      return failure();
    const Settings &s = *settings;

    auto train = module.lookupSymbol<func::FuncOp>("train_step");
    if (!train) {
      if (s.granularity == "none")
        return success();
      module.emitError("mt-recompute: the module has no func.func @train_step "
                       "(mt-autodiff builds it; run it first)");
      return failure();
    }
    regatherSequenceShards(train.getBody().front());
    OpBuilder b(module.getContext());
    auto record = [&](StringRef what, ArrayRef<int64_t> layers) {
      train->setAttr("mt.recompute", b.getStringAttr(what));
      train->setAttr("mt.recomputed_layers", b.getDenseI64ArrayAttr(layers));
    };
    if (s.granularity == "none") {
      record("none", {});
      return success();
    }
    // mt.attention_grad recomputes the attention probabilities (and their
    // dropout mask) from q, k and the forward's log-sum-exp: nothing of size
    // seq x seq is ever saved, which is what Megatron's selective
    // recomputation achieves.
    if (s.granularity == "selective") {
      record("selective (core attention: inherent, mt.attention_grad recomputes "
             "the probabilities from q, k and the log-sum-exp)",
             {});
      return success();
    }

    Block &body = train.getBody().front();
    Operation *seed = nullptr;
    for (Operation &op : body)
      if (isa<GradSeedOp>(op)) {
        seed = &op;
        break;
      }
    if (!seed) {
      train.emitError("mt-recompute: @train_step has no mt.grad_seed, so its "
                      "backward part cannot be told from its forward");
      return failure();
    }

    // The layers this program computes (a pipeline stage holds a subset).
    SmallVector<int64_t> layers;
    for (Operation &op : body) {
      if (&op == seed)
        break;
      if (std::optional<int64_t> l = layerOf(&op))
        layers.push_back(*l);
    }
    llvm::sort(layers);
    layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
    const int64_t total = layers.size();
    if (s.numLayers > total) {
      train.emitError() << "mt-recompute: recompute_num_layers is " << s.numLayers
                        << " but @train_step has " << total
                        << " layers (ops with mt.layer before mt.grad_seed)";
      return failure();
    }
    if (s.method == "uniform" && total % s.numLayers != 0) {
      train.emitError() << "mt-recompute: recompute_num_layers = " << s.numLayers
                        << " does not divide the " << total
                        << " layers of @train_step (recompute_method \"uniform\")";
      return failure();
    }

    // Megatron's chunks: uniform checkpoints consecutive groups of
    // recompute_num_layers layers; block checkpoints each of the first
    // recompute_num_layers layers alone and keeps the rest.
    SmallVector<SmallVector<int64_t>> chunks;
    if (s.method == "uniform") {
      for (int64_t i = 0; i < total; i += s.numLayers)
        chunks.emplace_back(layers.begin() + i, layers.begin() + i + s.numLayers);
    } else {
      for (int64_t i = 0; i < s.numLayers; ++i)
        chunks.push_back({layers[i]});
    }

    ChunkRecomputer recomputer(body, seed);
    SmallVector<int64_t> done;
    for (ArrayRef<int64_t> chunk : chunks)
      if (recomputer.recompute(chunk) > 0)
        done.append(chunk.begin(), chunk.end());
    llvm::sort(done);
    std::string what =
        s.method == "uniform"
            ? llvm::formatv("full (uniform, {0} layer{1} per chunk)", s.numLayers,
                            s.numLayers == 1 ? "" : "s")
                  .str()
            : llvm::formatv("full (block, the first {0} layer{1})", s.numLayers,
                            s.numLayers == 1 ? "" : "s")
                  .str();
    record(what, done);
    return success();
  }
};

} // namespace
} // namespace mt
