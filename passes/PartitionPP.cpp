// mt-partition-pp: @forward -> one nested module per pipeline rank, with
// mt.send / mt.recv where values cross stages.
#include "passes/Passes.h"

#include "dialects/mt/MtOps.h"
#include "passes/StageModules.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/MapVector.h"

#include <map>
#include <optional>

namespace mt {
#define GEN_PASS_DEF_MTPARTITIONPPPASS
#include "passes/Passes.h.inc"
} // namespace mt

using namespace mlir;

namespace mt {
namespace {


// Megatron-LM's assignment of layers to virtual stages. Virtual stage
// v = chunk * pp + rank; without interleaving v is the rank. Interleaved,
// chunk c of rank r holds layer block c * pp + r. Uneven (vp = 1 only):
// the first and/or last rank take the layers asked for and the other
// ranks share the rest evenly.
FailureOr<SmallVector<int64_t>> assignLayers(ModuleOp module, int64_t layers, int64_t pp,
                                             int64_t vp, int64_t first, int64_t last) {
  SmallVector<int64_t> stageOf(layers);
  if (vp > 1) {
    if (first || last)
      return module.emitError("mt-partition-pp: decoder_first_pipeline_num_layers and "
                              "decoder_last_pipeline_num_layers need "
                              "virtual_pipeline_model_parallel_size = 1");
    if (layers % (pp * vp) != 0)
      return module.emitError() << "mt-partition-pp: " << layers
                                << " layers do not divide over pipeline_model_parallel_size * "
                                   "virtual_pipeline_model_parallel_size = "
                                << pp * vp << " model chunks";
    int64_t per = layers / (pp * vp);
    for (int64_t l = 0; l < layers; ++l)
      stageOf[l] = l / per; // block index = chunk * pp + rank = virtual stage
    return stageOf;
  }
  SmallVector<int64_t> counts(pp, 0);
  int64_t rest = layers - first - last, evenRanks = pp - (first ? 1 : 0) - (last ? 1 : 0);
  if (rest < 0 || (evenRanks == 0 && rest != 0) || (evenRanks > 0 && rest % evenRanks != 0))
    return module.emitError()
           << "mt-partition-pp: " << layers << " layers do not divide over "
           << pp << " pipeline stages with " << first << " on the first and " << last
           << " on the last (0 = an even share); change num_layers, "
              "decoder_first_pipeline_num_layers or decoder_last_pipeline_num_layers";
  for (int64_t r = 0; r < pp; ++r)
    counts[r] = evenRanks ? rest / evenRanks : 0;
  if (first)
    counts[0] = first;
  if (last)
    counts[pp - 1] = last;
  int64_t l = 0;
  for (int64_t r = 0; r < pp; ++r)
    for (int64_t i = 0; i < counts[r]; ++i)
      stageOf[l++] = r;
  return stageOf;
}

struct MtPartitionPPPass : impl::MtPartitionPPPassBase<MtPartitionPPPass> {
  void runOnOperation() override {
    if (failed(run(getOperation())))
      signalPassFailure();
  }

  LogicalResult run(ModuleOp top) {
    auto par = top->getAttrOfType<DictionaryAttr>("mt.parallel");
    auto i64 = [&](StringRef name, int64_t dflt) -> int64_t {
      auto a = par ? par.getAs<IntegerAttr>(name) : IntegerAttr();
      return a ? a.getInt() : dflt;
    };
    const int64_t pp = i64("pipeline_model_parallel_size", 1);
    const int64_t vp = i64("virtual_pipeline_model_parallel_size", 1);
    const int64_t first = i64("decoder_first_pipeline_num_layers", 0);
    const int64_t last = i64("decoder_last_pipeline_num_layers", 0);
    if (pp < 1 || vp < 1)
      return top.emitError("mt-partition-pp: mt.parallel.pipeline_model_parallel_size and "
                           "virtual_pipeline_model_parallel_size must be >= 1");
    if (pp == 1)
      return success(); // one stage: the module stays flat
    auto forward = top.lookupSymbol<func::FuncOp>("forward");
    if (!forward)
      return top.emitError("mt-partition-pp: the module has no func.func @forward");
    Block &body = forward.getBody().front();

    // @forward's named results (an MoE model's load_balancing_loss and
    // z_loss) are sums over layers of several stages: each stage returns
    // the sum of its own terms, and mtrun adds them over the pipeline group.
    // The ops of those sums are left out here and rebuilt per stage below.
    func::ReturnOp fret = ret(body);
    Value loss;
    SmallVector<std::pair<StringAttr, SmallVector<Value>>> named;
    DenseSet<Operation *> sumOps;
    for (auto [i, v] : llvm::enumerate(fret.getOperands())) {
      auto name = forward.getResultAttrOfType<StringAttr>(i, "mt.name");
      if (!name) {
        if (loss)
          return forward.emitError("mt-partition-pp: @forward must return one loss; its other "
                                   "results are named with mt.name");
        loss = v;
        continue;
      }
      SmallVector<Value> terms, stack{v};
      while (!stack.empty()) {
        Value t = stack.pop_back_val();
        auto add = t.getDefiningOp<AddOp>();
        if (add && !layerOf(add) && llvm::all_of(add->getUsers(), [&](Operation *u) {
              return u == fret || sumOps.count(u);
            })) {
          sumOps.insert(add);
          stack.append({add.getRhs(), add.getLhs()});
          continue;
        }
        if (!t.getDefiningOp())
          return forward.emitError() << "mt-partition-pp: @forward's result \"" << name.getValue()
                                     << "\" must be a sum of values computed in it";
        terms.push_back(t);
      }
      named.push_back({name, terms});
    }

    int64_t layers = 0;
    for (Operation &op : body)
      if (std::optional<int64_t> l = layerOf(&op))
        layers = std::max(layers, *l + 1);
    if (layers == 0)
      return forward.emitError("mt-partition-pp: @forward has no ops with mt.layer to "
                               "split over pipeline stages");
    FailureOr<SmallVector<int64_t>> layerStage = assignLayers(top, layers, pp, vp, first, last);
    if (failed(layerStage))
      return failure();
    const int64_t stages = pp * vp;

    // Every op's virtual stage: its layer's, or before the first layer (the
    // embedding) the first, after the last (final norm, output layer, loss)
    // the last.
    DenseMap<Operation *, int64_t> stageOf;
    bool seenLayer = false;
    for (Operation &op : body.without_terminator()) {
      if (isa<ParamRefOp>(op) || sumOps.count(&op))
        continue;
      int64_t s;
      if (std::optional<int64_t> l = layerOf(&op)) {
        s = (*layerStage)[*l];
        seenLayer = true;
      } else {
        s = seenLayer ? stages - 1 : 0;
      }
      for (Value v : op.getOperands())
        if (Operation *def = v.getDefiningOp(); def && stageOf.count(def) && stageOf[def] > s)
          return op.emitError("mt-partition-pp: this op reads a value of a later pipeline "
                              "stage; ops must be in layer order");
      stageOf[&op] = s;
    }
    if (!loss || !loss.getDefiningOp())
      return forward.emitError("mt-partition-pp: @forward must return the loss computed in it");

    // One module per pipeline rank, holding its chunks: a rank runs one
    // instruction stream and owns one state buffer, whatever its chunks.
    OpBuilder b(top.getContext());
    b.setInsertionPoint(forward);
    SmallVector<ModuleOp> mods;
    SmallVector<func::FuncOp> funcs;
    SmallVector<IRMapping> maps(pp);
    SmallVector<llvm::MapVector<StringRef, Value>> refs(pp);
    for (int64_t r = 0; r < pp; ++r) {
      auto m = b.create<ModuleOp>(forward.getLoc(), ("stage" + Twine(r)).str());
      m->setAttr("mt.stage", b.getI64IntegerAttr(r));
      mods.push_back(m);
    }

    // Each rank's inputs: the arguments its ops read, in their order.
    SmallVector<SmallVector<BlockArgument>> argsOf(pp);
    for (BlockArgument a : body.getArguments())
      for (int64_t r = 0; r < pp; ++r)
        if (llvm::any_of(a.getUsers(), [&](Operation *u) {
              return stageOf.count(u) && stageOf.lookup(u) % pp == r;
            }))
          argsOf[r].push_back(a);
    for (int64_t r = 0; r < pp; ++r) {
      OpBuilder mb(mods[r].getBodyRegion());
      SmallVector<Type> ins;
      for (BlockArgument a : argsOf[r])
        ins.push_back(a.getType());
      SmallVector<Type> outs;
      SmallVector<StringAttr> outNames;
      if (stageOf.lookup(loss.getDefiningOp()) % pp == r) {
        outs.push_back(loss.getType());
        outNames.push_back({});
      }
      for (auto &[name, terms] : named)
        if (llvm::any_of(terms, [&](Value t) {
              return stageOf.lookup(t.getDefiningOp()) % pp == r;
            })) {
          outs.push_back(terms.front().getType());
          outNames.push_back(name);
        }
      auto f = mb.create<func::FuncOp>(forward.getLoc(), "forward",
                                       mb.getFunctionType(ins, outs));
      for (auto [i, name] : llvm::enumerate(outNames))
        if (name)
          f.setResultAttr(i, "mt.name", name);
      Block *entry = f.addEntryBlock();
      for (auto [i, a] : llvm::enumerate(argsOf[r])) {
        maps[r].map(a, entry->getArgument(i));
        if (DictionaryAttr attrs = forward.getArgAttrDict(a.getArgNumber()))
          f.setArgAttrs(i, attrs);
      }
      funcs.push_back(f);
    }

    // Clone every op into its rank's @forward; a value read on another
    // stage goes through one send/recv pair per (value, reading stage).
    std::map<std::pair<void *, int64_t>, Value> received;
    int64_t boundaries = 0;
    auto builderAtEnd = [&](int64_t r) {
      OpBuilder ob(funcs[r].getContext());
      ob.setInsertionPointToEnd(&funcs[r].getBody().front());
      return ob;
    };
    for (Operation &op : body.without_terminator()) {
      if (isa<ParamRefOp>(op) || sumOps.count(&op))
        continue;
      const int64_t s = stageOf.lookup(&op), r = s % pp, chunk = s / pp;
      OpBuilder ob = builderAtEnd(r);
      for (Value v : op.getOperands()) {
        if (auto ref = v.getDefiningOp<ParamRefOp>()) {
          Value &mine = refs[r][ref.getName()];
          if (!mine)
            mine = ob.clone(*ref)->getResult(0);
          maps[r].map(v, mine);
          continue;
        }
        Operation *def = v.getDefiningOp();
        if (!def)
          continue; // an argument, mapped above
        const int64_t u = stageOf.lookup(def);
        if (u == s)
          continue;
        if (u % pp == r)
          return op.emitError("mt-partition-pp: this op reads a value of another model chunk "
                              "of the same pipeline rank; only neighbouring stages exchange "
                              "values");
        Value &got = received[{v.getAsOpaquePointer(), s}];
        if (!got) {
          const int64_t tag = 2 * boundaries++;
          OpBuilder sb = builderAtEnd(u % pp);
          auto send = sb.create<SendOp>(op.getLoc(), maps[u % pp].lookup(v),
                                        sb.getI64IntegerAttr(r), sb.getI64IntegerAttr(tag));
          send->setAttr("mt.chunk", sb.getI64IntegerAttr(u / pp));
          auto recv = ob.create<RecvOp>(op.getLoc(), v.getType(),
                                        ob.getI64IntegerAttr(u % pp), ob.getI64IntegerAttr(tag));
          recv->setAttr("mt.chunk", ob.getI64IntegerAttr(chunk));
          got = recv.getResult();
        }
        maps[r].map(v, got);
      }
      Operation *copy = ob.clone(op, maps[r]);
      copy->setAttr("mt.chunk", ob.getI64IntegerAttr(chunk));
    }
    for (int64_t r = 0; r < pp; ++r) {
      OpBuilder ob = builderAtEnd(r);
      SmallVector<Value> results;
      if (stageOf.lookup(loss.getDefiningOp()) % pp == r)
        results.push_back(maps[r].lookup(loss));
      // Each named sum over this stage's terms, in the model chunk of its
      // last term.
      for (auto &[name, terms] : named) {
        Value sum;
        int64_t chunk = 0;
        for (Value t : terms) {
          const int64_t s = stageOf.lookup(t.getDefiningOp());
          if (s % pp != r)
            continue;
          chunk = std::max(chunk, s / pp);
          Value mine = maps[r].lookup(t);
          sum = sum ? ob.create<AddOp>(forward.getLoc(), sum, mine).getResult() : mine;
          if (auto add = sum.getDefiningOp<AddOp>())
            add->setAttr("mt.chunk", ob.getI64IntegerAttr(chunk));
        }
        if (sum)
          results.push_back(sum);
      }
      ob.create<func::ReturnOp>(forward.getLoc(), results);
    }

    // Each stage declares the parameters it reads. A parameter read on two
    // stages (tied word embeddings: the embedding on the first, the output
    // layer on the last) gets a copy on each, same name and so the same
    // initial values; their gradients are summed before the norm
    // (mt-optimizer) and the norm counts the later copy's not at all.
    for (ParamOp p : top.getOps<ParamOp>()) {
      SmallVector<int64_t> holders;
      for (int64_t r = 0; r < pp; ++r)
        if (refs[r].count(p.getSymName()))
          holders.push_back(r);
      if (holders.size() > 2)
        return p.emitError("mt-partition-pp: this parameter is read on more than two "
                           "pipeline stages; only tied embeddings may be shared");
      for (int64_t r : holders) {
        OpBuilder mb(mods[r].getBodyRegion());
        mb.setInsertionPoint(funcs[r]);
        Operation *copy = mb.clone(*p);
        if (holders.size() == 2) {
          int64_t peer = r == holders[0] ? holders[1] : holders[0];
          copy->setAttr("mt.tied_peer", mb.getI64IntegerAttr(peer));
          if (r == holders[1])
            copy->setAttr("mt.tied_copy", mb.getUnitAttr());
        }
      }
    }

    NamedAttribute pipeline[] = {
        b.getNamedAttr("stages", b.getI64IntegerAttr(pp)),
        b.getNamedAttr("chunks", b.getI64IntegerAttr(vp)),
        // Tags of one micro-batch's messages; mt-schedule-pp offsets each
        // micro-batch's by this much so every message of a step is unique.
        b.getNamedAttr("tags_per_micro_batch", b.getI64IntegerAttr(2 * boundaries)),
    };
    top->setAttr("mt.pipeline", b.getDictionaryAttr(pipeline));
    forward.erase();
    // The top module keeps the model's parameter table (the model summary
    // and the checkpoint fingerprint describe the whole model); the stages
    // use their own copies.
    return success();
  }

  static func::ReturnOp ret(Block &body) { return cast<func::ReturnOp>(body.getTerminator()); }
};

} // namespace
} // namespace mt
