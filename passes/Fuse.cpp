// mt-fuse: RoPE into the QKV split (both ways); chains of elementwise ops ->
// mt.fused kernels; GEMMs with their epilogues -> `gemm` kernels, and
// backward GEMMs with theirs -> `gemm_grad`.
#include "passes/Passes.h"

#include "dialects/mt/MtOps.h"
#include "passes/StageModules.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
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

// RoPE inside the QKV split, both ways. An mt.split_qkv whose query and key
// each have one user, an mt.rope of one base, rotates them itself
// (`rope_base`) and the two mt.rope go; an mt.split_qkv_grad whose query and
// key gradients each come from an mt.rope_grad of one base used nowhere else
// rotates them back itself. The unrotated tensors never exist, and each
// direction loses two kernels that read and wrote a whole q or k. No value
// lives longer: the rotated q replaces the unrotated one from the split on,
// and the rotated dq the unrotated one up to the merge.
void ropeIntoSplit(Block &body) {
  for (SplitQKVOp split : llvm::make_early_inc_range(body.getOps<SplitQKVOp>())) {
    auto q = dyn_cast_or_null<RopeOp>(soleUser(split.getQuery()));
    auto k = dyn_cast_or_null<RopeOp>(soleUser(split.getKey()));
    if (split.getRopeBase() || !q || !k || q.getBaseAttr() != k.getBaseAttr() ||
        q.getScalingFactorAttr() != k.getScalingFactorAttr())
      continue;
    split.setRopeBaseAttr(q.getBaseAttr());
    if (FloatAttr f = q.getScalingFactorAttr())
      split.setRopeScalingFactorAttr(f);
    for (RopeOp r : {q, k}) {
      r.getResult().replaceAllUsesWith(r.getInput());
      r->erase();
    }
  }
  for (SplitQKVGradOp merge : llvm::make_early_inc_range(body.getOps<SplitQKVGradOp>())) {
    auto q = merge.getQueryGrad().getDefiningOp<RopeGradOp>();
    auto k = merge.getKeyGrad().getDefiningOp<RopeGradOp>();
    if (merge.getRopeBase() || !q || !k || q == k || q.getBaseAttr() != k.getBaseAttr() ||
        q.getScalingFactorAttr() != k.getScalingFactorAttr() ||
        !q->hasOneUse() || !k->hasOneUse())
      continue;
    merge.setRopeBaseAttr(q.getBaseAttr());
    if (FloatAttr f = q.getScalingFactorAttr())
      merge.setRopeScalingFactorAttr(f);
    merge.getQueryGradMutable().assign(q.getGrad());
    merge.getKeyGradMutable().assign(k.getGrad());
    q->erase();
    k->erase();
  }
}

// Each mt.matmul whose only user is the mt.bias_add of its result becomes
// a `gemm` kernel: one cuBLASLt call whose epilogue adds the bias, and also
// applies the GeLU when that bias add feeds one tanh mt.gelu (cuBLASLt's
// GELU epilogue is the tanh form) and every other user of the bias add comes
// after the GeLU (its aux output keeps the pre-activation the backward
// reads; cuBLASLt wants the aux leading dimension, the features, a multiple
// of 8, so otherwise the GeLU stays out). Only adjacent ops are grouped (parameter reads may lie between),
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
    auto features = cast<RankedTensorType>(y.getType()).getShape().back();
    const bool needsAux = !bias.getResult().hasOneUse();
    if (gelus == 1 && gelu.getApproximation() == GeluApproximation::Tanh &&
        gelu->getBlock() == bias->getBlock() && adjacent(bias, gelu) &&
        (!needsAux || (!ShapedType::isDynamic(features) && features % 8 == 0)) &&
        llvm::all_of(bias.getResult().getUsers(), [&](Operation *u) {
          return u == gelu.getOperation() || gelu->isBeforeInBlock(u);
        }))
      group.push_back(gelu);
    taken.insert(group.begin(), group.end());
    groups.push_back(std::move(group));
  }
  return groups;
}

// Whether `op`, a member of a group outlined at the later op `at`, can move
// there: no op between reads its results; an op with side effects (one that
// adds into a gradient) moves only past ops without any, so no gradient is
// read or reduced before it is complete; and where an op between allocates
// (has results, parameter reads aside), each operand of `op` lives to `at`
// anyway, so the move lengthens no lifetime the memory plan sees.
bool canSink(Operation *op, Operation *at, const DenseSet<Operation *> &members) {
  const bool effects = !isMemoryEffectFree(op);
  for (Operation *x = op->getNextNode(); x && x != at; x = x->getNextNode()) {
    if (members.contains(x) || isa<ParamRefOp>(x))
      continue;
    if (llvm::any_of(x->getOperands(), [&](Value v) { return v.getDefiningOp() == op; }))
      return false;
    if (effects && !isMemoryEffectFree(x))
      return false;
    if (x->getNumResults() == 0)
      continue;
    for (Value v : op->getOperands()) {
      if (v.getDefiningOp<ParamRefOp>())
        continue;
      bool reaches = llvm::any_of(v.getUsers(), [&](Operation *u) {
        Operation *a = at->getBlock()->findAncestorOpInBlock(*u);
        return a && (a == at || at->isBeforeInBlock(a));
      });
      if (!reaches)
        return false;
    }
  }
  return true;
}

// The group's last op in program order: where it is outlined.
Operation *lastOf(ArrayRef<Operation *> group) {
  Operation *last = group.front();
  for (Operation *op : group)
    if (last->isBeforeInBlock(op))
      last = op;
  return last;
}

// Whether `group` (ops of one block) can become one kernel at its last op.
bool canOutline(ArrayRef<Operation *> group) {
  Block *block = group.front()->getBlock();
  if (llvm::any_of(group, [&](Operation *op) { return op->getBlock() != block; }))
    return false;
  DenseSet<Operation *> members(group.begin(), group.end());
  Operation *at = lastOf(group);
  return llvm::all_of(group, [&](Operation *op) { return op == at || canSink(op, at, members); });
}

// The single mt.bias_grad of `v` that no other group has taken, or null.
BiasGradOp soleBiasGrad(Value v, const DenseSet<Operation *> &taken) {
  BiasGradOp found;
  for (Operation *u : v.getUsers())
    if (auto b = dyn_cast<BiasGradOp>(u)) {
      if (found)
        return BiasGradOp();
      found = b;
    }
  return found && !taken.contains(found) ? found : BiasGradOp();
}

// cuBLASLt's backward epilogues, as Megatron's TransformerEngine uses them:
//  - an mt.matmul_input_grad whose only user is a tanh mt.gelu_grad becomes
//    one GEMM with the DGELU epilogue (the pre-activation is its aux input;
//    cuBLASLt wants its leading dimension, the features, a multiple of 8).
//    With f32 gradients the mt.bias_grad of the GeLU's gradient joins it
//    (DGELU_BGRAD). cuBLASLt sums the epilogue's unrounded values, so with
//    16-bit gradients the bias gradient comes from the weight-gradient GEMM
//    instead (below), which sums the stored values the CPU sums.
//  - an mt.matmul_weight_grad and the one mt.bias_grad of its output gradient
//    become one GEMM with the BGRADB epilogue (the column sums of dy). Not
//    with bf16 gradients (grad_reduce_in_bf16): cuBLASLt's bias gradient
//    takes D's type, bf16, and would be rounded before it is added; the
//    bias_grad kernel adds its f32 sums with one rounding, as the CPU does.
// Ops move to the group's last op only where canSink allows.
SmallVector<SmallVector<Operation *>> gemmGradGroups(Block &body, DenseSet<Operation *> &taken,
                                                     bool bf16Grads) {
  SmallVector<SmallVector<Operation *>> groups;
  auto add = [&](SmallVector<Operation *> group) {
    if (!canOutline(group))
      return false;
    taken.insert(group.begin(), group.end());
    groups.push_back(std::move(group));
    return true;
  };
  for (GeluGradOp gelu : body.getOps<GeluGradOp>()) {
    auto mig = gelu.getGrad().getDefiningOp<MatmulInputGradOp>();
    auto t = cast<RankedTensorType>(gelu.getType());
    if (!mig || gelu.getApproximation() != GeluApproximation::Tanh ||
        !mig.getResult().hasOneUse() || taken.contains(mig) || t.getRank() < 1 ||
        ShapedType::isDynamic(t.getShape().back()) || t.getShape().back() % 8 != 0)
      continue;
    if (t.getElementType().isF32())
      if (BiasGradOp bias = soleBiasGrad(gelu.getResult(), taken))
        if (add({mig, gelu, bias}))
          continue;
    add({mig, gelu});
  }
  for (MatmulWeightGradOp wg : body.getOps<MatmulWeightGradOp>())
    if (BiasGradOp bias = bf16Grads ? BiasGradOp() : soleBiasGrad(wg.getGrad(), taken))
      add({wg, bias});
  return groups;
}

// The op after `cur` that continues a chain: the adjacent op that uses
// `cur`'s result, when every other user comes after it. A result with
// several users (the residual stream: the next norm and the next residual
// add; its gradient: the dropout and the next gradient add) becomes one
// more output of the kernel, which it is anyway, and is not read back.
Operation *nextInChain(Operation *cur) {
  Operation *next = cur->getNextNode();
  while (next && isa<ParamRefOp>(next))
    next = next->getNextNode();
  if (!next)
    return nullptr;
  Value v = cur->getResult(0);
  if (llvm::none_of(v.getUsers(), [&](Operation *u) { return u == next; }))
    return nullptr;
  // Users in other blocks, or before `next` (none: it is adjacent), end it.
  for (Operation *u : v.getUsers())
    if (u != next && (u->getBlock() != next->getBlock() || u->isBeforeInBlock(next)))
      return nullptr;
  return next;
}

int64_t elementsOf(Value v) { return cast<RankedTensorType>(v.getType()).getNumElements(); }

// The longest chain from `first`: each op's result is used by the next op,
// which is adjacent and fusible, and its other users come later. At most
// one row-wise op, and then no reshape; a trailing reshape is dropped
// (alone it is a free alias, as a kernel output it would be a copy). A
// result used outside the chain is an output, and a kernel's outputs have
// one element count (one index space), so the chain ends before an op
// whose result count differs from an earlier output's.
SmallVector<Operation *> growChain(Operation *first, const DenseSet<Operation *> &taken) {
  SmallVector<Operation *> chain{first};
  bool row = FusedOp::isRowReduction(first), reshape = isa<ReshapeOp>(first);
  int64_t outputElements = -1; // of the outputs before the last op
  for (Operation *cur = first;;) {
    Operation *next = nextInChain(cur);
    if (!next || next->getBlock() != first->getBlock() || taken.contains(next) ||
        !isCandidate(next) || next->getNumResults() != 1)
      break;
    bool nextRow = FusedOp::isRowReduction(next), nextReshape = isa<ReshapeOp>(next);
    if ((row && nextRow) || ((row || nextRow) && (reshape || nextReshape)))
      break;
    Value v = cur->getResult(0);
    if (!v.hasOneUse()) { // `v` stays an output
      if (outputElements >= 0 && outputElements != elementsOf(v))
        break;
      outputElements = elementsOf(v);
    }
    if (outputElements >= 0 && elementsOf(next->getResult(0)) != outputElements)
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

// Replaces `chain` by one mt.fused op at the position of its last op in
// program order, with the body in `chain`'s order. Elementwise chains and
// forward GEMMs use only the last op's result outside; GEMMs of the backward
// were checked by canOutline. So every operand is defined before that
// position and every outside user comes after it.
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

  Operation *last = lastOf(chain);
  OpBuilder b(last);
  SmallVector<Location> locs;
  for (Operation *op : chain)
    locs.push_back(op->getLoc());
  Location loc = b.getFusedLoc(locs);
  const FusionKind kind =
      isa<MatmulOp>(chain.front())                                    ? FusionKind::Gemm
      : isa<MatmulInputGradOp, MatmulWeightGradOp>(chain.front())     ? FusionKind::GemmGrad
      : row                                                           ? FusionKind::RowReduction
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
    auto training = moduleAttr(module, "mt.training");
    const bool bf16Grads = training && training.get("grad_reduce_in_bf16");
    for (auto f : module.getOps<func::FuncOp>()) {
      if (f.isExternal())
        continue;
      Block &body = f.getBody().front();
      ropeIntoSplit(body);
      DenseSet<Operation *> taken;
      SmallVector<SmallVector<Operation *>> chains = gemmGroups(body, taken);
      chains.append(gemmGradGroups(body, taken, bf16Grads));
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
