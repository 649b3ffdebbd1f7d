// mt-shard-tp: Megatron-LM's tensor parallelism, and with it sequence
// parallelism, as a rewrite of @forward into the program of one
// tensor-parallel rank.
#include "passes/Passes.h"

#include "dialects/mt/MtOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cmath>
#include <cstring>

namespace mt {
#define GEN_PASS_DEF_MTSHARDTPPASS
#include "passes/Passes.h.inc"
} // namespace mt

using namespace mlir;

namespace mt {
namespace {

// How a parameter is split, by its Megatron-LM name: column-parallel layers
// (QKV, FC1) and the vocabulary (embedding, output layer) by output rows,
// row-parallel layers (attention projection, FC2) by input columns.
// Everything else (norms, row-parallel biases, position embeddings, MoE
// routers) is replicated. Routed experts are never split here: mt-shard-ep
// splits them over the expert-tensor-parallel ranks, a group of its own.
// The shared expert is a dense MLP and splits as one.
bool isRoutedExpert(StringRef name) { return name.contains(".mlp.experts."); }

std::optional<int64_t> splitDim(StringRef name) {
  if (isRoutedExpert(name))
    return std::nullopt;
  for (StringRef s : {".linear_qkv.weight", ".linear_qkv.bias", ".linear_fc1.weight",
                      ".linear_fc1.bias"})
    if (name.ends_with(s))
      return 0;
  if (name == "embedding.word_embeddings.weight" || name == "output_layer.weight")
    return 0;
  if (name.ends_with(".linear_proj.weight") || name.ends_with(".linear_fc2.weight"))
    return 1;
  return std::nullopt;
}

RankedTensorType withShape(Type t, ArrayRef<int64_t> shape) {
  auto r = cast<RankedTensorType>(t);
  return RankedTensorType::get(shape, r.getElementType());
}

class Sharder {
public:
  Sharder(ModuleOp module, func::FuncOp f, int64_t tp, bool sp)
      : module(module), symbols(module), f(f), tp(tp), sp(sp), b(module.getContext()) {}

  LogicalResult run() {
    if (failed(shardParams()))
      return failure();
    SmallVector<Operation *> ops;
    for (Operation &op : f.getBody().front().without_terminator())
      ops.push_back(&op);
    for (Operation *op : ops)
      if (failed(visit(op)))
        return failure();
    // Parameters read on sequence shards get a partial gradient per rank;
    // mt-optimizer sums them over the tensor-parallel group.
    for (StringRef name : partialGrad)
      if (auto p = symbols.lookup<ParamOp>(name))
        p->setAttr("mt.tp_partial_grad", UnitAttr::get(module.getContext()));
    return success();
  }

private:
  LogicalResult shardParams() {
    const llvm::StringSet<> swiglu = swigluLayers();
    for (ParamOp p : module.getOps<ParamOp>()) {
      std::optional<int64_t> dim = splitDim(p.getSymName());
      if (!dim)
        continue;
      if (p.getTpDim())
        return p.emitError("mt-shard-tp: the parameter is sharded already; run the pass once");
      SmallVector<int64_t> shape(p.getTensorType().getShape());
      if (*dim >= int64_t(shape.size()) || shape[*dim] % tp != 0)
        return p.emitError() << "mt-shard-tp: dimension " << *dim << " of "
                             << p.getSymName() << " is not divisible by tensor_model_parallel_size "
                             << tp << "; choose sizes it divides";
      // SwiGLU's FC1 holds gate and up halves; each is split, so every rank
      // keeps matching halves of both.
      int64_t blocks = 1;
      if (swiglu.contains(p.getSymName()))
        blocks = 2;
      if (shape[*dim] % (blocks * tp) != 0)
        return p.emitError() << "mt-shard-tp: " << p.getSymName() << " has " << shape[*dim]
                             << " rows in " << blocks << " halves, not divisible by "
                             << "tensor_model_parallel_size " << tp;
      shape[*dim] /= tp;
      p.setTypeAttr(TypeAttr::get(withShape(p.getType(), shape)));
      p.setTpDimAttr(b.getI64IntegerAttr(*dim));
      p.setTpSizeAttr(b.getI64IntegerAttr(tp));
      p.setTpBlocksAttr(b.getI64IntegerAttr(blocks));
      shardedParams.insert(p.getSymName());
    }
    // Reads take the parameter's new type.
    WalkResult r = f.walk([&](ParamRefOp ref) {
      auto p = symbols.lookup<ParamOp>(ref.getNameAttr().getAttr());
      if (!p) {
        ref.emitError("mt-shard-tp: reads an undeclared parameter");
        return WalkResult::interrupt();
      }
      ref.getResult().setType(p.getTensorType());
      return WalkResult::advance();
    });
    return failure(r.wasInterrupted());
  }

  // The FC1 layers (weight and bias names) whose output, through its bias,
  // feeds mt.swiglu: their rows are gate and up halves. One walk of the
  // graph for all of them.
  llvm::StringSet<> swigluLayers() {
    llvm::StringSet<> names;
    f.walk([&](MatmulOp m) {
      auto ref = m.getWeight().getDefiningOp<ParamRefOp>();
      if (!ref || !ref.getName().contains(".linear_fc1."))
        return;
      Value v = m.getResult();
      if (v.hasOneUse())
        if (auto bias = dyn_cast<BiasAddOp>(*v.getUsers().begin()))
          v = bias.getResult();
      if (llvm::any_of(v.getUsers(), [](Operation *u) { return isa<SwiGLUOp>(u); })) {
        StringRef w = ref.getName();
        names.insert(w);
        names.insert((w.drop_back(strlen("weight")) + "bias").str());
      }
    });
    return names;
  }

  bool isShardedParam(Value v) {
    auto ref = v.getDefiningOp<ParamRefOp>();
    return ref && shardedParams.contains(ref.getName());
  }
  int64_t paramSplitDim(Value v) {
    auto ref = v.getDefiningOp<ParamRefOp>();
    auto p = symbols.lookup<ParamOp>(ref.getNameAttr().getAttr());
    return *p.getTpDim();
  }

  // Replaces every use of `v` after `op` (the new op that reads v) with op's
  // result.
  void replaceUsesAfter(Value v, Operation *op) {
    v.replaceAllUsesExcept(op->getResult(0), op);
  }

  template <class OpT> Operation *insertAfter(Operation *after, Value v, Type type) {
    b.setInsertionPointAfter(after);
    auto op = b.create<OpT>(after->getLoc(), type, v, b.getI64IntegerAttr(tp));
    copyLayer(after, op);
    return op;
  }

  static void copyLayer(Operation *from, Operation *to) {
    if (Attribute layer = from->getAttr("mt.layer"))
      to->setAttr("mt.layer", layer);
  }

  RankedTensorType seqSharded(Type t) {
    SmallVector<int64_t> shape(cast<RankedTensorType>(t).getShape());
    shape[1] /= tp;
    return withShape(t, shape);
  }

  LogicalResult checkSeq(Operation *op, Value v) {
    auto t = cast<RankedTensorType>(v.getType());
    if (t.getRank() < 2 || t.getDimSize(1) % tp != 0)
      return op->emitError() << "mt-shard-tp: sequence parallelism splits dimension 1 over "
                             << tp << " ranks, but this value is " << t;
    return success();
  }

  LogicalResult visit(Operation *op) {
    if (failed(rewrite(op)))
      return failure();
    // Any parameter an op reads beside a sequence shard (once the op reads
    // what it finally reads: column-parallel layers gather first) gets a
    // partial gradient on each rank. Routed experts are the exception: their
    // gradients are summed over the expert data-parallel group, which holds
    // the tensor-parallel ranks (mt-data-parallel).
    bool onShard = llvm::any_of(
        op->getOperands(), [&](Value v) { return seq.contains(v) || tok.contains(v); });
    if (onShard)
      for (Value v : op->getOperands())
        if (auto ref = v.getDefiningOp<ParamRefOp>(); ref && !isRoutedExpert(ref.getName()))
          partialGrad.insert(ref.getName());
    return success();
  }

  LogicalResult rewrite(Operation *op) {
    return llvm::TypeSwitch<Operation *, LogicalResult>(op)
        .Case([&](ParamRefOp) -> LogicalResult { return success(); })
        .Case([&](PositionIdsOp) -> LogicalResult { return success(); })
        .Case([&](EmbeddingOp e) -> LogicalResult { return embedding(e); })
        .Case([&](MatmulOp m) -> LogicalResult { return matmul(m); })
        .Case([&](SplitQKVOp s) -> LogicalResult {
          if (!feat.contains(s.getInput()))
            return success();
          for (Value r : s.getResults()) {
            SmallVector<int64_t> shape(cast<RankedTensorType>(r.getType()).getShape());
            shape[2] /= tp;
            r.setType(withShape(r.getType(), shape));
            feat.insert(r);
          }
          return success();
        })
        .Case([&](SwiGLUOp s) -> LogicalResult {
          SmallVector<int64_t> shape(cast<RankedTensorType>(s.getInput().getType()).getShape());
          shape.back() /= 2;
          s.getResult().setType(withShape(s.getType(), shape));
          propagate(s, s.getInput());
          return success();
        })
        .Case([&](ReshapeOp r) -> LogicalResult {
          if (seq.contains(r.getInput()) || tok.contains(r.getInput()))
            return tokenReshape(r);
          if (!feat.contains(r.getInput()))
            return success();
          SmallVector<int64_t> shape(r.getType().getShape());
          if (shape.back() % tp != 0)
            return r.emitError() << "mt-shard-tp: cannot split the last dimension of "
                                 << r.getType() << " over " << tp << " ranks";
          shape.back() /= tp;
          r.getResult().setType(withShape(r.getType(), shape));
          feat.insert(r.getResult());
          return success();
        })
        .Case([&](AttentionOp a) -> LogicalResult {
          a.getResult().setType(a.getQuery().getType());
          a.getLse().setType(cast<RankedTensorType>(attentionLseType(a.getQuery().getType())));
          if (feat.contains(a.getQuery()))
            a.setTpShardDimAttr(b.getI64IntegerAttr(2));
          propagate(a, a.getQuery());
          return success();
        })
        .Case([&](DropoutOp d) -> LogicalResult {
          d.getResult().setType(d.getInput().getType());
          if (seq.contains(d.getInput()))
            d.setTpShardDimAttr(b.getI64IntegerAttr(1));
          else if (feat.contains(d.getInput()))
            return d.emitError("mt-shard-tp: dropout inside a tensor-parallel region is not "
                               "supported; the model graph puts it after the row-parallel "
                               "layer");
          propagate(d, d.getInput());
          return success();
        })
        .Case([&](AddOp a) -> LogicalResult {
          if (seq.contains(a.getLhs()) != seq.contains(a.getRhs()) ||
              feat.contains(a.getLhs()) != feat.contains(a.getRhs()) ||
              tok.contains(a.getLhs()) != tok.contains(a.getRhs()))
            return a.emitError("mt-shard-tp: adds a sharded value to a differently sharded one");
          a.getResult().setType(a.getLhs().getType());
          propagate(a, a.getLhs());
          return success();
        })
        .Case<BiasAddOp, LayerNormOp, RMSNormOp, GeluOp, RopeOp>([&](Operation *o) -> LogicalResult {
          o->getResult(0).setType(o->getOperand(0).getType());
          propagate(o, o->getOperand(0));
          return success();
        })
        .Case([&](CrossEntropyOp c) -> LogicalResult {
          if (seq.contains(c.getLogits()))
            return c.emitError("mt-shard-tp: the loss reads sequence shards; the output layer "
                               "should have gathered them");
          if (feat.contains(c.getLogits()))
            c.setVocabParallelAttr(b.getUnitAttr());
          return success();
        })
        .Case([&](MoeRouterOp r) -> LogicalResult { return router(r); })
        .Case([&](MoePermuteOp p) -> LogicalResult { return permute(p); })
        .Case([&](MoeGroupedMatmulOp g) -> LogicalResult {
          if (!tok.contains(g.getInput()))
            return notOnShards(g);
          SmallVector<int64_t> shape(g.getType().getShape());
          shape[0] = cast<RankedTensorType>(g.getInput().getType()).getDimSize(0);
          g.getResult().setType(withShape(g.getType(), shape));
          tok.insert(g.getResult());
          return success();
        })
        .Case([&](MoeUnpermuteOp u) -> LogicalResult {
          if (!tok.contains(u.getInput()) || !tok.contains(u.getProbs()))
            return notOnShards(u);
          SmallVector<int64_t> shape(u.getType().getShape());
          shape[0] = cast<RankedTensorType>(u.getProbs().getType()).getDimSize(0);
          u.getResult().setType(withShape(u.getType(), shape));
          tok.insert(u.getResult());
          return success();
        })
        .Default([&](Operation *o) -> LogicalResult {
          return o->emitError() << "mt-shard-tp: does not know how to shard '" << o->getName()
                                << "'";
        });
  }

  void propagate(Operation *op, Value from) {
    if (seq.contains(from))
      seq.insert(op->getResult(0));
    if (feat.contains(from))
      feat.insert(op->getResult(0));
    if (tok.contains(from))
      tok.insert(op->getResult(0));
  }

  // Mixture-of-experts layers under sequence parallelism: Megatron's
  // MoELayer routes each rank's own sequence shard ([s / tp, b, H] there,
  // [b, s / tp, H] here), flattened to tokens. The router, the permutation
  // and the experts are local to the rank; only the router's load-balancing
  // counts are summed over the tensor-parallel group.
  LogicalResult notOnShards(Operation *op) {
    return op->emitError() << "mt-shard-tp: mixture-of-experts layers run tensor-parallel only "
                              "on sequence shards; set sequence_parallel with "
                              "tensor_model_parallel_size > 1 (Megatron refuses it too)";
  }

  // [b, s / tp, H] <-> [b * s / tp, H]: the rank's tokens, in its shard's
  // order.
  LogicalResult tokenReshape(ReshapeOp r) {
    auto in = cast<RankedTensorType>(r.getInput().getType());
    SmallVector<int64_t> shape(r.getType().getShape());
    if (seq.contains(r.getInput()) && shape.size() == 2 && in.getRank() == 3 &&
        shape[0] == in.getDimSize(0) * in.getDimSize(1) * tp) {
      shape[0] /= tp;
      r.getResult().setType(withShape(r.getType(), shape));
      tok.insert(r.getResult());
      return success();
    }
    if (tok.contains(r.getInput()) && shape.size() == 3 && in.getRank() == 2 &&
        shape[0] * shape[1] == in.getDimSize(0) * tp && shape[1] % tp == 0) {
      shape[1] /= tp;
      r.getResult().setType(withShape(r.getType(), shape));
      seq.insert(r.getResult());
      return success();
    }
    return r.emitError() << "mt-shard-tp: cannot reshape a sequence shard " << in << " to "
                         << r.getType();
  }

  LogicalResult router(MoeRouterOp r) {
    if (!tok.contains(r.getLogits()))
      return notOnShards(r);
    const int64_t tokens = cast<RankedTensorType>(r.getLogits().getType()).getDimSize(0),
                  experts = cast<RankedTensorType>(r.getLogits().getType()).getDimSize(1),
                  seqLength = r.getSeqLengthAttr().getInt();
    if (seqLength % tp != 0)
      return r.emitError() << "mt-shard-tp: seq_length " << seqLength
                           << " is not divisible by tensor_model_parallel_size " << tp;
    for (Value v : {r.getProbs(), r.getRoutingMap()}) {
      v.setType(withShape(v.getType(), {tokens, experts}));
      tok.insert(v);
    }
    r.setSeqLengthAttr(b.getI64IntegerAttr(seqLength / tp));
    // Megatron's get_capacity over the rank's own tokens.
    int64_t capacity = r.getCapacityAttr().getInt();
    if (capacity > 0) {
      auto factor = r->getAttrOfType<FloatAttr>("mt.capacity_factor");
      if (!factor)
        return r.emitError("mt-shard-tp: a router with a capacity needs mt.capacity_factor "
                           "(mtc's importer writes it) to size the capacity of a sequence "
                           "shard");
      capacity = int64_t(std::ceil(double(tokens * r.getTopkAttr().getInt()) /
                                   double(experts) * factor.getValueAsDouble()));
      if (r.getPadToCapacity() && capacity > tokens)
        return r.emitError() << "mt-shard-tp: the capacity " << capacity << " of a sequence "
                             << "shard of " << tokens << " tokens exceeds its tokens, which "
                             << "pad_to_capacity cannot pad to; use a smaller "
                             << "moe_expert_capacity_factor or tensor_model_parallel_size";
      r.setCapacityAttr(b.getI64IntegerAttr(capacity));
    }
    capacities[r.getRoutingMap()] = capacity;
    // Megatron's apply_z_loss divides the coefficient by the tp_cp size.
    r.setZLossCoeffAttr(b.getF64FloatAttr(r.getZLossCoeff().convertToDouble() / double(tp)));
    r.setCountGroupAttr(b.getStringAttr("tp"));
    return success();
  }

  LogicalResult permute(MoePermuteOp p) {
    auto router = p.getRoutingMap().getDefiningOp<MoeRouterOp>();
    if (!tok.contains(p.getInput()) || !router || !capacities.count(p.getRoutingMap()))
      return notOnShards(p);
    const int64_t tokens = cast<RankedTensorType>(p.getInput().getType()).getDimSize(0),
                  experts = cast<RankedTensorType>(p.getTokensPerExpert().getType()).getDimSize(0),
                  topk = router.getTopkAttr().getInt(),
                  capacity = capacities[p.getRoutingMap()];
    const int64_t rows = p.getPadToCapacity() ? experts * capacity
                         : capacity > 0      ? std::min(tokens * topk, experts * capacity)
                                             : tokens * topk;
    p.setCapacityAttr(b.getI64IntegerAttr(capacity));
    p.getResult().setType(withShape(p.getResult().getType(),
                                    {rows, cast<RankedTensorType>(p.getType(0)).getDimSize(1)}));
    p.getRowIds().setType(withShape(p.getRowIds().getType(), {rows}));
    tok.insert(p.getResult());
    return success();
  }

  // Vocab-parallel embedding: zero rows for ids of other ranks, then the sum
  // over ranks. With sequence parallelism the residual stream starts as
  // sequence shards: after the learned position embedding is added (it is
  // replicated), or straight from a reduce-scatter when there is none.
  LogicalResult embedding(EmbeddingOp e) {
    if (!isShardedParam(e.getTable()))
      return success();
    e.setVocabParallelAttr(b.getUnitAttr());
    Value out = e.getResult();
    AddOp posAdd;
    if (out.hasOneUse())
      if (auto add = dyn_cast<AddOp>(*out.getUsers().begin())) {
        Value other = add.getLhs() == out ? add.getRhs() : add.getLhs();
        if (auto pe = other.getDefiningOp<EmbeddingOp>(); pe && !isShardedParam(pe.getTable()))
          posAdd = add;
      }
    if (!sp || posAdd) {
      Operation *reduce = insertAfter<TpAllReduceOp>(e, out, out.getType());
      replaceUsesAfter(out, reduce);
      if (sp) {
        if (failed(checkSeq(posAdd, posAdd.getResult())))
          return failure();
        Value sum = posAdd.getResult();
        Operation *split = insertAfter<SpSplitOp>(posAdd, sum, seqSharded(sum.getType()));
        replaceUsesAfter(sum, split);
        seq.insert(split->getResult(0));
      }
      return success();
    }
    if (failed(checkSeq(e, out)))
      return failure();
    Operation *rs = insertAfter<SpReduceScatterOp>(e, out, seqSharded(out.getType()));
    replaceUsesAfter(out, rs);
    seq.insert(rs->getResult(0));
    return success();
  }

  LogicalResult matmul(MatmulOp m) {
    Value w = m.getWeight();
    auto wt = cast<RankedTensorType>(w.getType());
    SmallVector<int64_t> shape(cast<RankedTensorType>(m.getInput().getType()).getShape());
    shape.back() = wt.getDimSize(0);
    if (!isShardedParam(w)) {
      // A router: each rank's own tokens, by the replicated weight.
      if (tok.contains(m.getInput())) {
        shape[0] = cast<RankedTensorType>(m.getInput().getType()).getDimSize(0);
        m.getResult().setType(withShape(m.getType(), shape));
        tok.insert(m.getResult());
        return success();
      }
      if (feat.contains(m.getInput()) || seq.contains(m.getInput()))
        return m.emitError("mt-shard-tp: a replicated weight reads a sharded activation");
      m.getResult().setType(withShape(m.getType(), shape));
      return success();
    }
    if (paramSplitDim(w) == 0) {
      // Column parallel: every rank reads the whole input (gathered from
      // sequence shards, or entering the region) and writes its columns.
      Value x = m.getInput();
      if (feat.contains(x))
        return m.emitError("mt-shard-tp: a column-parallel layer reads an activation that is "
                           "split already");
      b.setInsertionPoint(m);
      Operation *enter;
      if (seq.contains(x)) {
        SmallVector<int64_t> full(cast<RankedTensorType>(x.getType()).getShape());
        full[1] *= tp;
        enter = b.create<SpGatherOp>(m.getLoc(), withShape(x.getType(), full), x,
                                     b.getI64IntegerAttr(tp));
        shape[1] = full[1];
      } else {
        enter = b.create<TpCopyOp>(m.getLoc(), x.getType(), x, b.getI64IntegerAttr(tp));
      }
      copyLayer(m, enter);
      m.getInputMutable().assign(enter->getResult(0));
      m.getResult().setType(withShape(m.getType(), shape));
      feat.insert(m.getResult());
      return success();
    }
    // Row parallel: the input is split by features; each rank's product is
    // a partial sum, reduced (or reduce-scattered into sequence shards).
    if (!feat.contains(m.getInput()))
      return m.emitError("mt-shard-tp: a row-parallel layer reads an activation that is not "
                         "split by features");
    m.getResult().setType(withShape(m.getType(), shape));
    Value out = m.getResult();
    Operation *leave;
    if (sp) {
      if (failed(checkSeq(m, out)))
        return failure();
      leave = insertAfter<SpReduceScatterOp>(m, out, seqSharded(out.getType()));
      seq.insert(leave->getResult(0));
    } else {
      leave = insertAfter<TpAllReduceOp>(m, out, out.getType());
    }
    replaceUsesAfter(out, leave);
    return success();
  }

  ModuleOp module;
  // The parameters by name, hashed once: a lookup on the module scans its
  // ops, which made the pass quadratic in layers.
  SymbolTable symbols;
  func::FuncOp f;
  int64_t tp;
  bool sp;
  OpBuilder b;
  llvm::StringSet<> shardedParams;
  llvm::SetVector<StringRef> partialGrad;
  // Values split by features over the tensor-parallel ranks (column-parallel
  // outputs until the row-parallel layer), and sequence shards.
  DenseSet<Value> feat, seq;
  // A mixture-of-experts layer's values over the rank's own tokens (its
  // sequence shard flattened, and the rows permuted from them).
  DenseSet<Value> tok;
  // Each router's capacity for its shard, by its routing map.
  DenseMap<Value, int64_t> capacities;
};

struct MtShardTpPass : impl::MtShardTpPassBase<MtShardTpPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto par = module->getAttrOfType<DictionaryAttr>("mt.parallel");
    int64_t tp = 1;
    bool sp = false;
    if (par) {
      if (auto a = par.getAs<IntegerAttr>("tensor_model_parallel_size"))
        tp = a.getInt();
      if (auto a = par.getAs<BoolAttr>("sequence_parallel"))
        sp = a.getValue();
    }
    if (tp < 1) {
      module.emitError("mt-shard-tp: mt.parallel.tensor_model_parallel_size must be >= 1");
      return signalPassFailure();
    }
    if (tp == 1) {
      if (sp) {
        module.emitError("mt-shard-tp: sequence_parallel needs tensor_model_parallel_size >= 2");
        return signalPassFailure();
      }
      return;
    }
    auto forward = module.lookupSymbol<func::FuncOp>("forward");
    if (!forward) {
      module.emitError("mt-shard-tp: the module has no func.func @forward; run it before "
                       "mt-autodiff");
      return signalPassFailure();
    }
    if (failed(Sharder(module, forward, tp, sp).run()))
      return signalPassFailure();
    module->setAttr("mt.tensor_parallel", IntegerAttr::get(IntegerType::get(&getContext(), 64), tp));
    if (sp)
      module->setAttr("mt.sequence_parallel", UnitAttr::get(&getContext()));
  }
};

} // namespace
} // namespace mt
