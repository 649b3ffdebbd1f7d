// mt-data-parallel: gradient buckets reduced over data-parallel ranks (expert
// parameters over expert data-parallel ranks), and the distributed optimizer
// (reduce-scatter, sharded AdamW or SGD, all-gather).
#include "passes/Passes.h"

#include "dialects/mt/MtOps.h"
#include "passes/StageModules.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"

#include "llvm/ADT/DenseSet.h"

#include <limits>

namespace mt {
#define GEN_PASS_DEF_MTDATAPARALLELPASS
#include "passes/Passes.h.inc"
} // namespace mt

using namespace mlir;

namespace mt {
namespace {

// The parameters whose gradient buffer `op` adds into (the gradient ops name
// them with symbol attributes; parameter reads and the optimizer never run
// in @train_step).
SmallVector<StringRef> gradTargets(Operation *op) {
  SmallVector<StringRef> names;
  if (isa<ParamRefOp>(op))
    return names;
  for (NamedAttribute a : op->getAttrs())
    if (auto s = dyn_cast<FlatSymbolRefAttr>(a.getValue()))
      names.push_back(s.getValue());
  return names;
}

struct MtDataParallelPass : impl::MtDataParallelPassBase<MtDataParallelPass> {
  void runOnOperation() override {
    for (ModuleOp stage : stageModules(getOperation()))
      if (failed(runOnStage(stage)))
        return signalPassFailure();
  }

  // Each pipeline stage (or the whole model) reduces its own gradients over
  // its data-parallel group.
  LogicalResult runOnStage(ModuleOp module) {
    auto par = moduleAttr(module, "mt.parallel");
    auto i64 = [&](StringRef name, int64_t dflt) -> int64_t {
      auto a = par ? par.getAs<IntegerAttr>(name) : IntegerAttr();
      return a ? a.getInt() : dflt;
    };
    auto flag = [&](StringRef name) {
      auto a = par ? par.getAs<BoolAttr>(name) : BoolAttr();
      return a && a.getValue();
    };
    int64_t dp = i64("data_parallel_size", 1);
    if (dp < 1) {
      module.emitError("mt-data-parallel: mt.parallel.data_parallel_size must be >= 1");
      return failure();
    }
    int64_t bucketSize = i64("ddp_bucket_size", 0);
    if (bucketSize < 0) {
      module.emitError("mt-data-parallel: mt.parallel.ddp_bucket_size must be >= 0 (0: "
                       "Megatron's default)");
      return failure();
    }
    const bool distOpt = flag("use_distributed_optimizer");
    const bool overlap = flag("overlap_grad_reduce");
    const bool gatherInForward = flag("overlap_param_gather");
    if (gatherInForward && !(distOpt && overlap)) {
      module.emitError("mt-data-parallel: overlap_param_gather needs use_distributed_optimizer "
                       "and overlap_grad_reduce");
      return failure();
    }
    // Expert parameters (mt-shard-ep marks them mt.expert at every ep) are
    // reduced over the expert data-parallel group instead, as Megatron-Core
    // reduces its expert buffers over expt_dp: its size is
    // edp = tp * dp / (etp * ep), the ranks of the stage holding the same
    // experts.
    SmallVector<ParamOp> dense, expert;
    for (ParamOp p : module.getOps<ParamOp>())
      (p->hasAttr("mt.expert") ? expert : dense).push_back(p);
    int64_t edp = 1;
    if (!expert.empty()) {
      const int64_t tp = i64("tensor_model_parallel_size", 1),
                    ep = i64("expert_model_parallel_size", 1),
                    etp = i64("expert_tensor_parallel_size", 1);
      if (tp < 1 || ep < 1 || etp < 1 || (tp * dp) % (etp * ep) != 0) {
        module.emitError() << "mt-data-parallel: expert_tensor_parallel_size (" << etp
                           << ") times expert_model_parallel_size (" << ep
                           << ") must divide tensor_model_parallel_size (" << tp
                           << ") times data_parallel_size (" << dp << ")";
        return failure();
      }
      edp = tp * dp / (etp * ep);
    }
    // Tensor-parallel ranks and pipeline stages reduce their own parameters
    // over their data-parallel group, so the buckets below are this rank's
    // parameters whatever it holds. One data-parallel rank (and one expert
    // data-parallel rank) has nothing to reduce (and a distributed optimizer
    // over one rank is the plain one).
    if (dp == 1 && edp == 1)
      return success();
    auto norm = module.lookupSymbol<func::FuncOp>("grad_norm");
    auto optStep = module.lookupSymbol<func::FuncOp>("optimizer_step");
    auto train = module.lookupSymbol<func::FuncOp>("train_step");
    if (!norm || (distOpt && !optStep)) {
      module.emitError("mt-data-parallel: the module has no @grad_norm or @optimizer_step; "
                       "run mt-optimizer first");
      return failure();
    }
    if (overlap && !train) {
      module.emitError("mt-data-parallel: overlap_grad_reduce needs @train_step; run "
                       "mt-autodiff first");
      return failure();
    }
    OpBuilder b(module.getContext());

    // Buckets, Megatron-LM's way: parameters in reverse order (the order the
    // backward completes their gradients), a bucket closed once it holds at
    // least the bucket size. Without overlap Megatron uses one bucket. The
    // expert parameters get buckets of their own after the dense ones
    // (Megatron's expert_parallel_buffers), by the same rule.
    int64_t limit = std::numeric_limits<int64_t>::max();
    if (overlap)
      limit = bucketSize > 0 ? bucketSize : std::max<int64_t>(40000000, 1000000 * dp);
    SmallVector<SmallVector<ParamOp>> buckets;
    SmallVector<bool> expertBucket;
    for (bool isExpert : {false, true}) {
      int64_t filled = 0;
      bool open = false;
      for (ParamOp p : llvm::reverse(isExpert ? expert : dense)) {
        if (!open || filled >= limit) {
          buckets.emplace_back();
          expertBucket.push_back(isExpert);
          filled = 0;
          open = true;
        }
        buckets.back().push_back(p);
        filled += p.getNumElements();
      }
    }
    auto groupOf = [&](int64_t i) { return expertBucket[size_t(i)] ? "expt_dp" : "dp"; };
    auto groupSize = [&](int64_t i) { return expertBucket[size_t(i)] ? edp : dp; };
    SmallVector<Attribute> bucketAttrs;
    DenseMap<StringRef, int64_t> bucketOf;
    for (auto [i, bucket] : llvm::enumerate(buckets)) {
      SmallVector<Attribute> names;
      for (ParamOp p : bucket) {
        names.push_back(FlatSymbolRefAttr::get(p.getSymNameAttr()));
        bucketOf[p.getSymName()] = int64_t(i);
      }
      bucketAttrs.push_back(b.getDictionaryAttr(
          {b.getNamedAttr("group", b.getStringAttr(groupOf(int64_t(i)))),
           b.getNamedAttr("params", b.getArrayAttr(names))}));
    }
    module->setAttr("mt.grad_buckets", b.getArrayAttr(bucketAttrs));
    module->setAttr("mt.data_parallel", b.getI64IntegerAttr(dp));
    if (!expert.empty())
      module->setAttr("mt.expert_data_parallel", b.getI64IntegerAttr(edp));

    // Expert gradients take the dense scale: each rank's expert gradient
    // already sums its expert-parallel peers' tokens, so the sum over
    // expt_dp covers every token-holding rank of the stage, as the dense sum
    // over dp (with sequence parallelism, over tp x dp) does (Megatron-Core
    // scales both buffers by 1 / dp before summing).
    const double scale = 1.0 / double(dp);
    auto reduce = [&](OpBuilder &ob, Location loc, int64_t bucket) -> Operation * {
      return ob.create<ReduceGradsOp>(loc, ob.getI64IntegerAttr(bucket),
                                      ob.getStringAttr(groupOf(bucket)),
                                      ob.getF64FloatAttr(scale), ob.getBoolAttr(distOpt));
    };
    // Buckets reduced in @grad_norm, right before the norm: after the
    // exchanges that make replicas' gradients whole (tensor-parallel
    // partial sums, tied embedding copies), whose layouts differ from the
    // buckets' shards.
    auto reduceBeforeNorm = [&](ArrayRef<int64_t> which) -> LogicalResult {
      auto normOps = llvm::to_vector(norm.getOps<GradNormOp>());
      if (normOps.empty())
        return norm.emitError("mt-data-parallel: @grad_norm has no mt.grad_norm");
      OpBuilder ob(normOps.front());
      for (int64_t i : which)
        reduce(ob, norm.getLoc(), i);
      return success();
    };
    auto allBuckets = llvm::to_vector(llvm::seq<int64_t>(0, int64_t(buckets.size())));
    // The buckets with something to gather: a group of one rank (dp = 1
    // beside expert buckets, or edp = 1: every rank of the stage holds other
    // experts or other shards of them) has none. Those to reduce: these,
    // and a group of one whose gradient still takes the scale (edp = 1 with
    // dp > 1: the rank's expert gradient already sums every token-holding
    // rank's contribution, and the reduction of one rank is the 1 / dp that
    // makes it the mean, as the dense buckets' sum over dp does).
    SmallVector<int64_t> shared, reduced;
    for (int64_t i : allBuckets) {
      if (groupSize(i) > 1)
        shared.push_back(i);
      if (groupSize(i) > 1 || scale != 1.0)
        reduced.push_back(i);
    }
    // Each of `which` (in index order) right after the op of `f` that
    // completes its gradients, the earliest point its reduction can start;
    // the buckets of one op in index order. `lastMicroBatch`: marked for
    // mt-schedule-pp to keep in the last micro-batch's copy of that op's
    // chunk only. Returns the buckets no op of `f` completes.
    auto reduceAfterCompleting = [&](func::FuncOp f, ArrayRef<int64_t> which,
                                     bool lastMicroBatch) {
      DenseMap<int64_t, Operation *> completes; // bucket -> its last gradient op
      for (Operation &op : f.getBody().front())
        for (StringRef name : gradTargets(&op))
          if (auto it = bucketOf.find(name); it != bucketOf.end())
            completes[it->second] = &op;
      DenseMap<Operation *, Operation *> after; // completing op -> its last reduction
      SmallVector<int64_t> unplaced;
      for (int64_t i : which) {
        Operation *op = completes.lookup(i);
        if (!op) {
          unplaced.push_back(i);
          continue;
        }
        Operation *&at = after[op];
        OpBuilder ob(op->getContext());
        ob.setInsertionPointAfter(at ? at : op);
        at = reduce(ob, op->getLoc(), i);
        if (!lastMicroBatch)
          continue;
        at->setAttr("mt.last_micro_batch", ob.getUnitAttr());
        if (Attribute chunk = op->getAttr("mt.chunk"))
          at->setAttr("mt.chunk", chunk);
      }
      return unplaced;
    };

    if (overlap && module->hasAttr("mt.stage")) {
      // A pipeline stage's @train_step is one micro-batch's forward and
      // backward, which mt-schedule-pp unrolls over the micro-batches: the
      // reductions go into it, kept in the last micro-batch's backward
      // through each chunk only. A bucket holding a tied embedding copy is
      // reduced in @grad_norm instead, after the copies' gradients are
      // exchanged: the two stages' buckets differ, and with the
      // distributed optimizer so would their shards.
      SmallVector<int64_t> early, late;
      for (int64_t i : reduced)
        (llvm::any_of(buckets[size_t(i)],
                      [](ParamOp p) { return p->hasAttr("mt.tied_peer"); })
             ? late
             : early)
            .push_back(i);
      llvm::append_range(late, reduceAfterCompleting(train, early, true));
      llvm::sort(late);
      if (failed(reduceBeforeNorm(late)))
        return failure();
    } else if (overlap) {
      // The runtime runs @train_step for every micro-batch but the last and
      // @train_step_last for the last one: a copy with the reductions.
      OpBuilder mb(module.getBodyRegion());
      mb.setInsertionPointAfter(train);
      auto last = cast<func::FuncOp>(mb.clone(*train));
      last.setName("train_step_last");
      // A bucket whose parameters get no gradient is reduced at the end.
      Operation *terminator = last.getBody().front().getTerminator();
      OpBuilder ob(terminator);
      for (int64_t i : reduceAfterCompleting(last, reduced, false))
        reduce(ob, terminator->getLoc(), i);
    } else if (failed(reduceBeforeNorm(reduced))) {
      // After the last micro-batch's backward.
      return failure();
    }
    if (!distOpt)
      return success();

    // The distributed optimizer: the norm over the owned shards, summed over
    // dp (the runtime sums the expert buckets' shards over expt_dp, then over
    // the expert model-parallel ranks, by Param.expert); AdamW on the owned
    // elements only; then the weights all-gathered, each bucket over its
    // group.
    module->setAttr("mt.distributed_optimizer", b.getUnitAttr());
    for (auto gn : llvm::make_early_inc_range(norm.getOps<GradNormOp>())) {
      OpBuilder ob(gn);
      auto s = ob.create<ShardedGradNormOp>(gn.getLoc(), gn.getType(), ob.getStringAttr("dp"));
      gn.replaceAllUsesWith(s.getResult());
      gn.erase();
    }
    // The per-parameter updates mt-optimizer wrote: all mt.adamw or all mt.sgd.
    SmallVector<Operation *> updates;
    for (Operation &op : optStep.getBody().front())
      if (isa<AdamWOp, SgdOp>(op))
        updates.push_back(&op);
    if (updates.empty()) {
      optStep.emitError("mt-data-parallel: @optimizer_step has no mt.adamw or mt.sgd to shard");
      return failure();
    }
    auto paramOf = [](Operation *u) {
      return isa<AdamWOp>(u) ? cast<AdamWOp>(u).getParamAttr() : cast<SgdOp>(u).getParamAttr();
    };
    auto lrOf = [](Operation *u) {
      return isa<AdamWOp>(u) ? cast<AdamWOp>(u).getLr() : cast<SgdOp>(u).getLr();
    };
    auto clipOf = [](Operation *u) {
      return isa<AdamWOp>(u) ? cast<AdamWOp>(u).getClip() : cast<SgdOp>(u).getClip();
    };
    auto decayOf = [](Operation *u) {
      return (isa<AdamWOp>(u) ? cast<AdamWOp>(u).getWeightDecay()
                              : cast<SgdOp>(u).getWeightDecay())
          .convertToDouble();
    };
    // What one sharded update per bucket must share besides lr, clip and decay.
    auto sameRule = [](Operation *a, Operation *b) {
      if (auto x = dyn_cast<AdamWOp>(a)) {
        auto y = dyn_cast<AdamWOp>(b);
        return y && x.getStep() == y.getStep() && x.getBeta1Attr() == y.getBeta1Attr() &&
               x.getBeta2Attr() == y.getBeta2Attr() && x.getEpsilonAttr() == y.getEpsilonAttr();
      }
      auto y = dyn_cast<SgdOp>(b);
      return y && cast<SgdOp>(a).getMomentumAttr() == y.getMomentumAttr();
    };
    // --decoupled-lr: the parameters mt-optimizer marked take the second rate.
    SymbolTable symbols(module); // hashed: a module lookup scans every op
    auto decoupled = [&](Operation *u) {
      auto p = symbols.lookup<ParamOp>(paramOf(u).getAttr());
      return p && p->hasAttr("mt.decoupled_lr");
    };
    Operation *first = updates.front();
    Value lr, decoupledLr;
    for (Operation *u : updates) { // the first of each kind sets its rate
      Value &rate = decoupled(u) ? decoupledLr : lr;
      if (!rate)
        rate = lrOf(u);
    }
    if (!lr) // every parameter decoupled: one rate after all
      std::swap(lr, decoupledLr);
    double decay = 0.0;
    for (Operation *u : updates)
      decay = std::max(decay, decayOf(u));
    for (Operation *u : updates) {
      double wd = decayOf(u);
      if (lrOf(u) != (decoupled(u) && decoupledLr ? decoupledLr : lr) ||
          clipOf(u) != clipOf(first) || !sameRule(first, u) || (wd != 0.0 && wd != decay)) {
        u->emitError() << "mt-data-parallel: the distributed optimizer needs every "
                       << (isa<AdamWOp>(first) ? "mt.adamw to share lr, clip, step, betas and "
                                                 "epsilon"
                                               : "mt.sgd to share lr, clip and momentum")
                       << ", and a weight decay of 0 or " << decay;
        return failure();
      }
      // Which elements decay: the plan records it per parameter.
      if (auto p = symbols.lookup<ParamOp>(paramOf(u).getAttr()))
        p->setAttr("mt.weight_decay", b.getBoolAttr(wd != 0.0));
    }
    OpBuilder ob(first);
    for (int64_t i = 0; i < int64_t(buckets.size()); ++i) {
      if (auto a = dyn_cast<AdamWOp>(first))
        ob.create<ShardedAdamWOp>(a.getLoc(), lr, a.getClip(), a.getStep(), decoupledLr,
                                  ob.getI64IntegerAttr(i), a.getBeta1Attr(), a.getBeta2Attr(),
                                  a.getEpsilonAttr(), ob.getF64FloatAttr(decay));
      else
        ob.create<ShardedSgdOp>(first->getLoc(), lr, clipOf(first), decoupledLr,
                                ob.getI64IntegerAttr(i), cast<SgdOp>(first).getMomentumAttr(),
                                ob.getF64FloatAttr(decay));
    }
    // Expert buckets are sharded over expt_dp: with edp = 1 a rank's shard
    // is the whole bucket, and there is nothing to gather.
    auto gather = [&](OpBuilder &at, Location loc, int64_t bucket) -> Operation * {
      return at.create<AllGatherParamsOp>(loc, at.getI64IntegerAttr(bucket),
                                          at.getStringAttr(groupOf(bucket)));
    };
    if (!gatherInForward)
      for (int64_t i : shared)
        gather(ob, first->getLoc(), i);
    for (Operation *u : updates)
      u->erase();
    if (gatherInForward)
      placeGathersInForward(module, train, bucketOf, shared, gather);
    return success();
  }

  // overlap_param_gather: the optimizer step leaves each rank's weights
  // whole only in its own shards, and the next iteration's first
  // micro-batch gathers them. Its program opens with every bucket's gather
  // in the order the forward first reads them; the GPU executor issues
  // them on its side stream and each instruction waits only for the
  // gathers of the bytes it reads, so the later buckets arrive while the
  // first layers run. @gather_params holds the same gathers for the
  // runtime to run before evaluation and checkpoint saves.
  void placeGathersInForward(
      ModuleOp module, func::FuncOp train, const DenseMap<StringRef, int64_t> &bucketOf,
      ArrayRef<int64_t> gathered,
      function_ref<Operation *(OpBuilder &, Location, int64_t)> gather) {
    SmallVector<int64_t> order;
    DenseSet<int64_t> wanted(gathered.begin(), gathered.end()), seen;
    for (Operation &op : train.getBody().front())
      for (Value v : op.getOperands())
        if (auto ref = v.getDefiningOp<ParamRefOp>())
          if (auto it = bucketOf.find(ref.getName()); it != bucketOf.end())
            if (wanted.contains(it->second) && seen.insert(it->second).second)
              order.push_back(it->second);
    for (int64_t i : gathered)
      if (seen.insert(i).second)
        order.push_back(i); // read by no op of the step
    auto atStart = [&](func::FuncOp f, bool firstMicroBatch) {
      OpBuilder ob(&f.getBody().front(), f.getBody().front().begin());
      for (int64_t i : order) {
        Operation *g = gather(ob, f.getLoc(), i);
        if (!firstMicroBatch)
          continue;
        g->setAttr("mt.first_micro_batch", ob.getUnitAttr());
        g->setAttr("mt.chunk", ob.getI64IntegerAttr(0));
      }
    };
    OpBuilder mb(module.getBodyRegion());
    mb.setInsertionPointToEnd(module.getBody());
    auto all = mb.create<func::FuncOp>(train.getLoc(), "gather_params",
                                       mb.getFunctionType({}, {}));
    auto ab = OpBuilder::atBlockEnd(all.addEntryBlock());
    for (int64_t i : gathered)
      gather(ab, all.getLoc(), i);
    ab.create<func::ReturnOp>(all.getLoc());
    if (module->hasAttr("mt.stage")) {
      // mt-schedule-pp keeps them in micro-batch 0's first forward only.
      atStart(train, true);
      return;
    }
    // Micro-batch 0 runs @train_step_first; with one micro-batch it is
    // also the last, which runs @train_step_last (overlap_grad_reduce).
    int64_t microBatches = 1;
    if (auto t = moduleAttr<DictionaryAttr>(module, "mt.training"))
      if (auto a = t.getAs<IntegerAttr>("num_micro_batches"))
        microBatches = a.getInt();
    if (microBatches == 1) {
      atStart(module.lookupSymbol<func::FuncOp>("train_step_last"), false);
      return;
    }
    OpBuilder fb(module.getBodyRegion());
    fb.setInsertionPoint(train);
    auto firstStep = cast<func::FuncOp>(fb.clone(*train));
    firstStep.setName("train_step_first");
    atStart(firstStep, false);
  }
};

} // namespace
} // namespace mt
