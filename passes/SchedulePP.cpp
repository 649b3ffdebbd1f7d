// mt-schedule-pp: each pipeline stage's @train_step stays one micro-batch's
// program, cut into segments (a chunk's forward or backward; for the
// interleaved schedule its receives, computation and sends) that mtrun runs
// in Megatron-LM's 1F1B or interleaved order for every micro-batch
// (runtime/base/pipeline_order.h); its @eval_step ordered chunk by chunk,
// one micro-batch's, which the runtime repeats.
#include "passes/Passes.h"

#include "dialects/mt/MtOps.h"
#include "passes/StageModules.h"
#include "runtime/base/pipeline_order.h"

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
      // What the memory report states beside the stage's planned peak (a
      // micro-batch starts and ends in chunk 0).
      stage->setAttr("mt.micro_batches_in_flight",
                     OpBuilder(stage).getI64IntegerAttr(rt::micro_batches_in_flight(
                         rt::pipeline_order(pp, vp, rank, microBatches), 0)));
      if (failed(segment(stage, "train_step", pp, vp, rank, microBatches, stride)))
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

  // Orders @name (one micro-batch's forward and backward) in segments:
  // parameter reads first, then each chunk's forward, then each chunk's
  // backward in reverse, every segment's ops in program order. With one
  // chunk a segment is a whole forward or backward (each receives first and
  // sends last); interleaved, each splits into its receives, computation and
  // sends, which the schedule runs at different points. The function keeps
  // its one-micro-batch signature and gets `mt.segments` (forward, chunk,
  // part, ops: the segments in order) and `mt.pipeline_schedule` (stages,
  // chunks, rank, micro_batches, tag_stride).
  LogicalResult segment(ModuleOp stage, StringRef name, int64_t pp, int64_t vp, int64_t rank,
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

    // Each (forward or backward, chunk)'s ops, in program order.
    SmallVector<SmallVector<Operation *>> fwd(vp), bwd(vp);
    SmallVector<Operation *> refs;
    Operation *unusedSeed = nullptr;
    bool inBackward = false;
    for (Operation &op : body.without_terminator()) {
      if (&op == seed) {
        inBackward = true;
        // A stage without the loss has the seed only to mark this point.
        if (!chunkOf(&op) && op.use_empty()) {
          unusedSeed = &op;
          continue;
        }
      }
      if (isa<ParamRefOp>(op)) {
        refs.push_back(&op);
        continue;
      }
      std::optional<int64_t> c = chunkOf(&op);
      if (!c)
        return op.emitError("mt-schedule-pp: op has no mt.chunk; run mt-partition-pp first");
      if (*c < 0 || *c >= vp)
        return op.emitError() << "mt-schedule-pp: op of model chunk " << *c << ", but the stage has "
                              << vp << " chunks";
      (inBackward ? bwd : fwd)[*c].push_back(&op);
    }
    if (unusedSeed)
      unusedSeed->erase();

    OpBuilder b(f);
    Operation *terminator = body.getTerminator();
    for (Operation *op : refs)
      op->moveBefore(terminator);
    SmallVector<Attribute> segments;
    auto place = [&](ArrayRef<Operation *> ops, bool forward, int64_t chunk, rt::SegmentPart part,
                     function_ref<bool(Operation *)> pick) {
      int64_t n = 0;
      for (Operation *op : ops)
        if (pick(op)) {
          op->moveBefore(terminator);
          ++n;
        }
      if (n == 0)
        return;
      NamedAttribute fields[] = {
          b.getNamedAttr("forward", b.getBoolAttr(forward)),
          b.getNamedAttr("chunk", b.getI64IntegerAttr(chunk)),
          b.getNamedAttr("part", b.getI64IntegerAttr(int64_t(part))),
          b.getNamedAttr("ops", b.getI64IntegerAttr(n)),
      };
      segments.push_back(b.getDictionaryAttr(fields));
    };
    auto any = [](Operation *) { return true; };
    auto isSend = [](Operation *op) { return isa<SendOp>(op); };
    auto isRecv = [](Operation *op) { return isa<RecvOp>(op); };
    auto isCompute = [](Operation *op) { return !isa<SendOp, RecvOp>(op); };
    auto placeStep = [&](ArrayRef<Operation *> ops, bool forward, int64_t chunk) {
      if (vp == 1)
        return place(ops, forward, chunk, rt::SegmentPart::All, any);
      place(ops, forward, chunk, rt::SegmentPart::Recv, isRecv);
      place(ops, forward, chunk, rt::SegmentPart::Compute, isCompute);
      place(ops, forward, chunk, rt::SegmentPart::Send, isSend);
    };
    for (int64_t c = 0; c < vp; ++c)
      placeStep(fwd[c], true, c);
    for (int64_t c = vp - 1; c >= 0; --c)
      placeStep(bwd[c], false, c);
    // The new order must still define every value before its use: a chunk
    // reads another chunk's values only through messages, and a segment's
    // sends come after what they send.
    DenseSet<Operation *> placed;
    for (Operation &op : body.without_terminator()) {
      for (Value v : op.getOperands())
        if (Operation *def = v.getDefiningOp())
          if (def->getBlock() == &body && !placed.count(def))
            return op.emitError("mt-schedule-pp: reads a value that its segment order "
                                "computes later (another model chunk's, without a message)");
      placed.insert(&op);
    }

    // The runtime expands these segments with the same code (checked here
    // so that a plan it would refuse is never written).
    std::vector<rt::SegmentKey> keys;
    for (Attribute a : segments) {
      auto d = cast<DictionaryAttr>(a);
      keys.push_back({d.getAs<BoolAttr>("forward").getValue(),
                      d.getAs<IntegerAttr>("chunk").getInt(),
                      rt::SegmentPart(d.getAs<IntegerAttr>("part").getInt())});
    }
    std::string error;
    if (rt::expand_pipeline(pp, vp, rank, microBatches, keys, &error).empty())
      return f.emitError() << "mt-schedule-pp: " << error;
    f->setAttr("mt.segments", b.getArrayAttr(segments));
    NamedAttribute schedule[] = {
        b.getNamedAttr("stages", b.getI64IntegerAttr(pp)),
        b.getNamedAttr("chunks", b.getI64IntegerAttr(vp)),
        b.getNamedAttr("rank", b.getI64IntegerAttr(rank)),
        b.getNamedAttr("micro_batches", b.getI64IntegerAttr(microBatches)),
        b.getNamedAttr("tag_stride", b.getI64IntegerAttr(stride)),
    };
    f->setAttr("mt.pipeline_schedule", b.getDictionaryAttr(schedule));
    f->setAttr("mt.schedule", b.getStringAttr(vp > 1 ? "interleaved 1F1B" : "1F1B"));
    return success();
  }
};

} // namespace
} // namespace mt
