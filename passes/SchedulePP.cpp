// mt-schedule-pp: each pipeline stage's @train_step unrolled over the step's
// micro-batches in Megatron-LM's 1F1B or interleaved order; its @eval_step
// ordered chunk by chunk, one micro-batch's, which the runtime repeats.
#include "passes/Passes.h"

#include "dialects/mt/MtOps.h"
#include "passes/StageModules.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace mt {
#define GEN_PASS_DEF_MTSCHEDULEPPPASS
#include "passes/Passes.h.inc"
} // namespace mt

using namespace mlir;

namespace mt {
namespace {

// One forward or backward of one micro-batch through one model chunk.
// Steps of one `unit` run back to back between two exchanges with the
// neighbouring stages (interleaved schedule: a warm-up forward, a steady
// forward and backward pair, a cool-down backward).
struct PipelineStep {
  bool forward;
  int64_t microBatch, chunk;
  int64_t unit = 0;
};

// Megatron-LM's order for pipeline rank `rank` of `pp`, with `vp` model
// chunks per rank and `m` micro-batches (schedules.py:
// forward_backward_pipelining_without_interleaving and
// forward_backward_pipelining_with_interleaving).
SmallVector<PipelineStep> pipelineOrder(int64_t pp, int64_t vp, int64_t rank, int64_t m) {
  SmallVector<PipelineStep> order;
  if (vp == 1) {
    // 1F1B: warm-up forwards, then one forward and one backward in turn,
    // then the remaining backwards.
    int64_t warmup = std::min(pp - rank - 1, m), steady = m - warmup;
    for (int64_t i = 0; i < warmup; ++i)
      order.push_back({true, i, 0});
    for (int64_t i = 0; i < steady; ++i) {
      order.push_back({true, warmup + i, 0});
      order.push_back({false, i, 0});
    }
    for (int64_t i = steady; i < m; ++i)
      order.push_back({false, i, 0});
    return order;
  }
  // Interleaved: virtual micro-batch k runs micro-batch
  // (k / (pp * vp)) * pp + k % pp on chunk (k % (pp * vp)) / pp; backwards
  // visit the chunks in reverse.
  const int64_t total = m * vp;
  int64_t warmup = m == pp ? total : std::min((pp - rank - 1) * 2 + (vp - 1) * pp, total);
  auto step = [&](int64_t k, bool forward) {
    int64_t chunk = (k % (pp * vp)) / pp;
    if (!forward)
      chunk = vp - chunk - 1;
    return PipelineStep{forward, (k / (pp * vp)) * pp + k % pp, chunk};
  };
  const int64_t steady = total - warmup;
  int64_t unit = 0;
  auto add = [&](PipelineStep s) {
    s.unit = unit;
    order.push_back(s);
  };
  for (int64_t k = 0; k < warmup; ++k, ++unit)
    add(step(k, true));
  for (int64_t i = 0; i < steady; ++i, ++unit) {
    add(step(warmup + i, true));
    add(step(i, false));
  }
  for (int64_t k = steady; k < total; ++k, ++unit)
    add(step(k, false));
  return order;
}

std::optional<int64_t> chunkOf(Operation *op) {
  if (auto a = op->getAttrOfType<IntegerAttr>("mt.chunk"))
    return a.getInt();
  return std::nullopt;
}

struct MtSchedulePPPass : impl::MtSchedulePPPassBase<MtSchedulePPPass> {
  void runOnOperation() override {
    ModuleOp top = getOperation();
    auto pipe = top->getAttrOfType<DictionaryAttr>("mt.pipeline");
    if (!pipe)
      return; // no pipeline stages (pipeline_model_parallel_size = 1)
    auto get = [&](StringRef n) {
      auto a = pipe.getAs<IntegerAttr>(n);
      return a ? a.getInt() : int64_t(0);
    };
    const int64_t pp = get("stages"), vp = get("chunks"), stride = get("tags_per_micro_batch");
    int64_t microBatches = 1;
    if (auto t = top->getAttrOfType<DictionaryAttr>("mt.training"))
      if (auto a = t.getAs<IntegerAttr>("num_micro_batches"))
        microBatches = a.getInt();
    if (pp < 2 || vp < 1 || stride < 0 || microBatches < 1) {
      top.emitError("mt-schedule-pp: mt.pipeline needs stages >= 2, chunks >= 1 and "
                    "tags_per_micro_batch >= 0, and mt.training.num_micro_batches >= 1");
      return signalPassFailure();
    }
    if (vp > 1 && microBatches % pp != 0) {
      top.emitError() << "mt-schedule-pp: the interleaved schedule needs the number of "
                         "micro-batches ("
                      << microBatches << ") to be a multiple of pipeline_model_parallel_size ("
                      << pp << "), as Megatron-LM requires; change global_batch_size or "
                         "micro_batch_size";
      return signalPassFailure();
    }
    for (ModuleOp stage : stageModules(top)) {
      if (!stage->hasAttr("mt.stage"))
        continue;
      const int64_t rank = stageRank(stage);
      auto order = pipelineOrder(pp, vp, rank, microBatches);
      // What the memory report states beside the stage's planned peak.
      int64_t inFlight = 0, maxInFlight = 0;
      for (const PipelineStep &s : order)
        if (s.chunk == 0) // a micro-batch starts and ends in chunk 0
          maxInFlight = std::max(maxInFlight, inFlight += s.forward ? 1 : -1);
      stage->setAttr("mt.micro_batches_in_flight",
                     OpBuilder(stage).getI64IntegerAttr(maxInFlight));
      if (failed(unroll(stage, "train_step", order, microBatches, stride)))
        return signalPassFailure();
      // Evaluation: every micro-batch's forward, chunk by chunk. Each
      // micro-batch's messages complete before the next one's start, so the
      // program stays one micro-batch's and the runtime runs it once per
      // micro-batch (no values cross micro-batches, so the arena is the
      // same), with the RNG offset it has without pipelining.
      if (failed(orderByChunk(stage, "eval_step")))
        return signalPassFailure();
    }
  }

  // Reorders @name (one micro-batch's forward) chunk by chunk: parameter
  // reads first, then each chunk's ops in program order, each receive at
  // the start of its chunk and each send at its end as the program has them.
  LogicalResult orderByChunk(ModuleOp stage, StringRef name) {
    auto f = stage.lookupSymbol<func::FuncOp>(name);
    if (!f)
      return stage.emitError() << "mt-schedule-pp: the stage has no @" << name
                               << "; run mt-autodiff first";
    Block &body = f.getBody().front();
    SmallVector<Operation *> refs;
    SmallVector<SmallVector<Operation *>> chunks;
    for (Operation &op : body.without_terminator()) {
      if (isa<ParamRefOp>(op)) {
        refs.push_back(&op);
        continue;
      }
      std::optional<int64_t> c = chunkOf(&op);
      if (!c)
        return op.emitError("mt-schedule-pp: op has no mt.chunk; run mt-partition-pp first");
      if (int64_t(chunks.size()) <= *c)
        chunks.resize(*c + 1);
      chunks[*c].push_back(&op);
    }
    // A chunk reads another chunk's values only through messages; check it,
    // since the new order must still define every value before its use.
    DenseSet<Operation *> placed;
    Operation *terminator = body.getTerminator();
    auto place = [&](Operation *op) -> LogicalResult {
      for (Value v : op->getOperands())
        if (Operation *def = v.getDefiningOp())
          if (def->getBlock() == &body && !placed.count(def))
            return op->emitError("mt-schedule-pp: reads a value of a later model chunk "
                                 "without a message");
      placed.insert(op);
      op->moveBefore(terminator);
      return success();
    };
    for (Operation *op : refs)
      if (failed(place(op)))
        return failure();
    for (ArrayRef<Operation *> ops : chunks)
      for (Operation *op : ops)
        if (failed(place(op)))
          return failure();
    OpBuilder b(f);
    f->setAttr("mt.schedule", b.getStringAttr("forward, once per micro-batch"));
    return success();
  }

  // Replaces @name (one micro-batch) by its unrolled form: inputs and outputs
  // per micro-batch ("tokens.3", "loss.3"), ops cloned per step of `order`,
  // each clone tagged with `mt.micro_batch` (the runtime's RNG offset) and
  // its messages' tags made unique per micro-batch.
  LogicalResult unroll(ModuleOp stage, StringRef name, ArrayRef<PipelineStep> order,
                       int64_t microBatches, int64_t stride) {
    auto f = stage.lookupSymbol<func::FuncOp>(name);
    if (!f)
      return stage.emitError() << "mt-schedule-pp: the stage has no @" << name
                               << "; run mt-autodiff first";
    Block &body = f.getBody().front();
    Operation *seed = nullptr;
    for (Operation &op : body)
      if (isa<GradSeedOp>(op)) {
        seed = &op;
        break;
      }
    if (!seed)
      return f.emitError("mt-schedule-pp: @train_step has no mt.grad_seed, so its backward "
                         "cannot be told from its forward");

    // Steps' ops, in program order.
    SmallVector<SmallVector<Operation *>> fwd, bwd;
    int64_t chunks = 0;
    SmallVector<ParamRefOp> refs;
    bool inBackward = false;
    for (Operation &op : body.without_terminator()) {
      if (&op == seed) {
        inBackward = true;
        // A stage without the loss has the seed only to mark this point.
        if (!chunkOf(&op) && op.use_empty())
          continue;
      }
      if (auto ref = dyn_cast<ParamRefOp>(op)) {
        refs.push_back(ref);
        continue;
      }
      std::optional<int64_t> c = chunkOf(&op);
      if (!c)
        return op.emitError("mt-schedule-pp: op has no mt.chunk; run mt-partition-pp first");
      chunks = std::max(chunks, *c + 1);
      auto &lists = inBackward ? bwd : fwd;
      if (int64_t(lists.size()) <= *c)
        lists.resize(*c + 1);
      lists[*c].push_back(&op);
    }
    fwd.resize(std::max<size_t>(fwd.size(), chunks));
    bwd.resize(std::max<size_t>(bwd.size(), chunks));

    OpBuilder b(f);
    SmallVector<Type> ins, outs;
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    for (int64_t m = 0; m < microBatches; ++m) {
      for (BlockArgument a : body.getArguments())
        ins.push_back(a.getType());
      for (Value v : ret.getOperands())
        outs.push_back(v.getType());
    }
    auto g = b.create<func::FuncOp>(f.getLoc(), name, b.getFunctionType(ins, outs));
    Block *entry = g.addEntryBlock();
    const int64_t nargs = body.getNumArguments(), nres = ret.getNumOperands();
    SmallVector<IRMapping> maps(microBatches);
    for (int64_t m = 0; m < microBatches; ++m)
      for (BlockArgument a : body.getArguments()) {
        int64_t i = m * nargs + a.getArgNumber();
        auto n = f.getArgAttrOfType<StringAttr>(a.getArgNumber(), "mt.name");
        std::string argName = (n ? n.getValue().str() : "arg" + std::to_string(a.getArgNumber())) +
                              "." + std::to_string(m);
        g.setArgAttr(i, "mt.name", b.getStringAttr(argName));
        maps[m].map(a, entry->getArgument(i));
      }
    b.setInsertionPointToEnd(entry);
    for (ParamRefOp ref : refs) {
      Operation *copy = b.clone(*ref);
      for (IRMapping &map : maps)
        map.map(ref.getResult(), copy->getResult(0));
    }
    // A clone's discardable attributes: its op's without the micro-batch
    // marks, with `mt.micro_batch`. Many ops share one dictionary (a
    // layer's ops have the same mt.chunk and mt.layer), so each distinct
    // (dictionary, micro-batch) is built and uniqued once, not per clone.
    MLIRContext *ctx = f.getContext();
    const StringAttr lastMark = StringAttr::get(ctx, "mt.last_micro_batch"),
                     firstMark = StringAttr::get(ctx, "mt.first_micro_batch"),
                     mbName = StringAttr::get(ctx, "mt.micro_batch");
    DenseMap<std::pair<DictionaryAttr, int64_t>, DictionaryAttr> cloneAttrs;
    auto attrsFor = [&](DictionaryAttr base, int64_t mb) {
      DictionaryAttr &d = cloneAttrs[{base, mb}];
      if (!d) {
        NamedAttrList list(base);
        list.erase(lastMark);
        list.erase(firstMark);
        list.set(mbName, b.getI64IntegerAttr(mb));
        d = list.getDictionary(ctx);
      }
      return d;
    };
    // Clones step s's ops that `pick` selects.
    auto emit = [&](const PipelineStep &s, function_ref<bool(Operation *)> pick) {
      IRMapping &map = maps[s.microBatch];
      for (Operation *op : (s.forward ? fwd : bwd)[s.chunk]) {
        if (!pick(op))
          continue;
        // mt-data-parallel's overlapped bucket reductions: in the last
        // micro-batch's backward only, which completes the gradients; its
        // overlapped weight gathers: in the first micro-batch's forward.
        DictionaryAttr base = op->getDiscardableAttrDictionary();
        if (base.contains(lastMark) && s.microBatch != microBatches - 1)
          continue;
        if (base.contains(firstMark) && s.microBatch != 0)
          continue;
        Operation *copy = b.clone(*op, map);
        copy->setDiscardableAttrs(attrsFor(base, s.microBatch));
        if (auto send = dyn_cast<SendOp>(copy))
          send.setTag(send.getTag() + s.microBatch * stride);
        if (auto recv = dyn_cast<RecvOp>(copy))
          recv.setTag(recv.getTag() + s.microBatch * stride);
      }
    };
    auto any = [](Operation *) { return true; };
    auto isSend = [](Operation *op) { return isa<SendOp>(op); };
    auto isRecv = [](Operation *op) { return isa<RecvOp>(op); };
    auto isCompute = [](Operation *op) { return !isa<SendOp, RecvOp>(op); };
    if (vp(order) == 1) {
      // Each step receives its input first and sends its output last; the
      // GPU executor issues adjacent sends and receives as one NCCL group,
      // which pairs each 1F1B send with the receive Megatron-LM pairs it
      // with.
      for (const PipelineStep &s : order)
        emit(s, any);
    } else {
      // Interleaved, as Megatron-LM exchanges: after each unit of steps,
      // one group sends the unit's outputs and receives the inputs of the
      // next unit's steps (the first unit's are received up front). Each
      // stage's k-th group then meets its neighbours' k-th groups, which
      // NCCL needs (runtime/comm/comm_order.h); receiving each input only where
      // its step starts can leave two stages each sending to the other.
      for (const PipelineStep &s : order)
        if (s.unit == order.front().unit)
          emit(s, isRecv);
      for (size_t i = 0; i < order.size();) {
        size_t end = i;
        while (end < order.size() && order[end].unit == order[i].unit)
          ++end;
        for (size_t k = i; k < end; ++k)
          emit(order[k], isCompute);
        for (size_t k = i; k < end; ++k)
          emit(order[k], isSend);
        for (size_t k = end; k < order.size() && order[k].unit == order[end].unit; ++k)
          emit(order[k], isRecv);
        i = end;
      }
    }
    SmallVector<Value> results;
    for (int64_t m = 0; m < microBatches; ++m)
      for (Value v : ret.getOperands()) {
        Value mapped = maps[m].lookupOrNull(v);
        if (!mapped)
          return f.emitError("mt-schedule-pp: the schedule never computes the result of "
                             "micro-batch ")
                 << m;
        results.push_back(mapped);
      }
    b.create<func::ReturnOp>(f.getLoc(), results);
    for (int64_t m = 0; m < microBatches; ++m)
      for (int64_t i = 0; i < nres; ++i)
        g.setResultAttr(m * nres + i, "mt.name",
                        b.getStringAttr("loss." + std::to_string(m)));
    for (NamedAttribute a : f->getDiscardableAttrs())
      g->setAttr(a.getName(), a.getValue());
    g->setAttr("mt.micro_batches", b.getI64IntegerAttr(microBatches));
    g->setAttr("mt.schedule", b.getStringAttr(vp(order) > 1 ? "interleaved 1F1B" : "1F1B"));
    f.erase();
    return success();
  }

  static int64_t vp(ArrayRef<PipelineStep> order) {
    int64_t c = 0;
    for (const PipelineStep &s : order)
      c = std::max(c, s.chunk + 1);
    return c;
  }
};

} // namespace
} // namespace mt
