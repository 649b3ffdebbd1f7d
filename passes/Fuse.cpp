// mt-fuse: chains of elementwise ops -> mt.fused kernels; GEMMs with their
// epilogues -> `gemm` kernels.
#include "passes/Passes.h"

#include "dialects/mt/MtOps.h"
#include "passes/StageModules.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"

#include <string>

namespace mt {
#define GEN_PASS_DEF_MTFUSEPASS
#include "passes/Passes.h.inc"
} // namespace mt

using namespace mlir;

namespace mt {
namespace {

bool isCandidate(Operation *op) {
  return FusedOp::isFusible(op, FusionKind::Elementwise) || FusedOp::isRowReduction(op);
}

// The one op that holds every use of `v`, or null.
Operation *soleUser(Value v) {
  Operation *user = nullptr;
  for (Operation *u : v.getUsers()) {
    if (user && u != user)
      return nullptr;
    user = u;
  }
  return user;
}

// Whether only parameter reads (no arena bytes, no work) lie between `a`
// and the later op `b` of the same block.
bool adjacent(Operation *a, Operation *b) {
  for (Operation *op = a->getNextNode(); op && op != b; op = op->getNextNode())
    if (!isa<ParamRefOp>(op))
      return false;
  return true;
}

// Each mt.matmul whose only user is the mt.bias_add of its result becomes
// a `gemm` kernel: one cuBLASLt call whose epilogue adds the bias, and also
// applies the GeLU when that bias add feeds one tanh mt.gelu (cuBLASLt's
// GELU epilogue is the tanh form) and every other user of the bias add comes
// after the GeLU (its aux output keeps the pre-activation the backward
// reads). Only adjacent ops are grouped (parameter reads may lie between),
// so outlining at the last op's position lengthens no value's life. The
// groups go into `taken` and stay out of elementwise kernels.
SmallVector<SmallVector<Operation *>> gemmGroups(Block &body, DenseSet<Operation *> &taken) {
  SmallVector<SmallVector<Operation *>> groups;
  for (MatmulOp mm : body.getOps<MatmulOp>()) {
    Value y = mm.getResult();
    if (!y.hasOneUse())
      continue;
    auto bias = dyn_cast<BiasAddOp>(*y.getUsers().begin());
    if (!bias || bias.getInput() != y || bias->getBlock() != mm->getBlock() ||
        !adjacent(mm, bias))
      continue;
    SmallVector<Operation *> group{mm, bias};
    GeluOp gelu;
    int gelus = 0;
    for (Operation *user : bias.getResult().getUsers())
      if (auto g = dyn_cast<GeluOp>(user)) {
        gelu = g;
        ++gelus;
      }
    if (gelus == 1 && gelu.getApproximation() == GeluApproximation::Tanh &&
        gelu->getBlock() == bias->getBlock() && adjacent(bias, gelu) &&
        llvm::all_of(bias.getResult().getUsers(), [&](Operation *u) {
          return u == gelu.getOperation() || gelu->isBeforeInBlock(u);
        }))
      group.push_back(gelu);
    taken.insert(group.begin(), group.end());
    groups.push_back(std::move(group));
  }
  return groups;
}

// The longest chain from `first`: each op's result has every use in the
// next op, which is adjacent and fusible. At most one row-wise op, and then
// no reshape; a trailing reshape is dropped (alone it is a free alias, as a
// kernel output it would be a copy).
SmallVector<Operation *> growChain(Operation *first, const DenseSet<Operation *> &taken) {
  SmallVector<Operation *> chain{first};
  bool row = FusedOp::isRowReduction(first), reshape = isa<ReshapeOp>(first);
  for (Operation *cur = first;;) {
    Operation *next = soleUser(cur->getResult(0));
    if (!next || next->getBlock() != first->getBlock() || taken.contains(next) ||
        !isCandidate(next) || !adjacent(cur, next))
      break;
    bool nextRow = FusedOp::isRowReduction(next), nextReshape = isa<ReshapeOp>(next);
    if ((row && nextRow) || ((row || nextRow) && (reshape || nextReshape)))
      break;
    row |= nextRow;
    reshape |= nextReshape;
    chain.push_back(next);
    cur = next;
  }
  while (chain.size() > 1 && isa<ReshapeOp>(chain.back()))
    chain.pop_back();
  return chain;
}

// "decoder.layers.0 dropout+add": the layer (when every op carries the
// same one) and the ops in order.
std::string kernelName(ArrayRef<Operation *> chain) {
  std::string name;
  Attribute layer = chain.front()->getAttr("mt.layer");
  if (llvm::all_of(chain, [&](Operation *op) { return op->getAttr("mt.layer") == layer; }))
    if (auto l = dyn_cast_or_null<IntegerAttr>(layer))
      name = "decoder.layers." + std::to_string(l.getInt()) + " ";
  for (auto [i, op] : llvm::enumerate(chain))
    name += (i ? "+" : "") + op->getName().stripDialect().str();
  return name;
}

// Replaces `chain` by one mt.fused op at the position of its last op. Only
// the last op's result is used outside the chain, so every operand is
// defined before that position and every outside user comes after it.
void outline(ArrayRef<Operation *> chain) {
  DenseSet<Operation *> members(chain.begin(), chain.end());
  SmallVector<Value> inputs, outputs;
  DenseSet<Value> seen;
  bool row = false;
  for (Operation *op : chain) {
    row |= FusedOp::isRowReduction(op);
    for (Value v : op->getOperands())
      if (!members.contains(v.getDefiningOp()) && seen.insert(v).second)
        inputs.push_back(v);
    for (Value r : op->getResults())
      if (llvm::any_of(r.getUsers(), [&](Operation *u) { return !members.contains(u); }))
        outputs.push_back(r);
  }

  Operation *last = chain.back();
  OpBuilder b(last);
  SmallVector<Location> locs;
  for (Operation *op : chain)
    locs.push_back(op->getLoc());
  Location loc = b.getFusedLoc(locs);
  const FusionKind kind = isa<MatmulOp>(chain.front()) ? FusionKind::Gemm
                          : row                        ? FusionKind::RowReduction
                                                       : FusionKind::Elementwise;
  auto fused = b.create<FusedOp>(loc, ValueRange(outputs).getTypes(), inputs,
                                 kernelName(chain), kind);
  // Discardable attributes every op of the chain agrees on (mt.layer,
  // mt.recomputed) describe the kernel as well.
  for (NamedAttribute a : chain.front()->getDiscardableAttrs())
    if (llvm::all_of(chain, [&](Operation *op) { return op->getAttr(a.getName()) == a.getValue(); }))
      fused->setAttr(a.getName(), a.getValue());

  Block *block = b.createBlock(&fused.getBody());
  IRMapping map;
  for (Value v : inputs)
    map.map(v, block->addArgument(v.getType(), v.getLoc()));
  for (Operation *op : chain)
    b.clone(*op, map);
  SmallVector<Value> yielded;
  for (Value v : outputs)
    yielded.push_back(map.lookup(v));
  b.create<YieldOp>(loc, yielded);

  for (auto [v, r] : llvm::zip(outputs, fused.getResults()))
    v.replaceAllUsesWith(r);
  for (Operation *op : llvm::reverse(chain))
    op->erase();
}

struct MtFusePass : impl::MtFusePassBase<MtFusePass> {
  void runOnOperation() override {
    for (ModuleOp stage : stageModules(getOperation()))
      runOnStage(stage);
  }

  void runOnStage(ModuleOp module) {
    for (auto f : module.getOps<func::FuncOp>()) {
      if (f.isExternal())
        continue;
      Block &body = f.getBody().front();
      DenseSet<Operation *> taken;
      SmallVector<SmallVector<Operation *>> chains = gemmGroups(body, taken);
      // Chains are found first and outlined after, so the walk sees the
      // block as it was.
      for (Operation &op : body) {
        if (taken.contains(&op) || !isCandidate(&op))
          continue;
        SmallVector<Operation *> chain = growChain(&op, taken);
        if (chain.size() < 2)
          continue;
        taken.insert(chain.begin(), chain.end());
        chains.push_back(std::move(chain));
      }
      for (ArrayRef<Operation *> chain : chains)
        outline(chain);
    }
  }
};

} // namespace
} // namespace mt
