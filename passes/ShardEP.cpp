// mt-shard-ep: Megatron-Core's expert parallelism and expert tensor
// parallelism as a rewrite of @forward into the program of one rank of the
// tensor-and-expert-parallel group: its share of the experts (whole experts
// over ep, each expert's matmuls split over etp), and the token exchange
// around them.
#include "passes/Passes.h"

#include "dialects/mt/MtOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

#include <algorithm>
#include <cmath>

namespace mt {
#define GEN_PASS_DEF_MTSHARDEPPASS
#include "passes/Passes.h.inc"
} // namespace mt

using namespace mlir;

namespace mt {
namespace {

RankedTensorType withShape(Type t, ArrayRef<int64_t> shape) {
  return RankedTensorType::get(shape, cast<RankedTensorType>(t).getElementType());
}

RankedTensorType withRows(Type t, int64_t rows) {
  SmallVector<int64_t> shape(cast<RankedTensorType>(t).getShape());
  shape[0] = rows;
  return withShape(t, shape);
}

int64_t dim0(Value v) { return cast<RankedTensorType>(v.getType()).getDimSize(0); }

class ExpertSharder {
public:
  ExpertSharder(ModuleOp module, func::FuncOp f, int64_t ep, int64_t etp,
                MoeDispatcher dispatcher, double bufferFactor)
      : module(module), symbols(module), f(f), ep(ep), etp(etp), dispatcher(dispatcher),
        bufferFactor(bufferFactor), b(module.getContext()) {}

  LogicalResult run() {
    // The routed experts: the stacked weights the grouped matmuls read.
    llvm::SetVector<ParamOp> experts;
    WalkResult r = f.walk([&](MoeGroupedMatmulOp g) {
      auto ref = g.getWeight().getDefiningOp<ParamRefOp>();
      ParamOp p = ref ? symbols.lookup<ParamOp>(ref.getNameAttr().getAttr()) : ParamOp();
      if (!p) {
        g.emitError("mt-shard-ep: the experts' weight is not a parameter read (mt.param_ref)");
        return WalkResult::interrupt();
      }
      experts.insert(p);
      return WalkResult::advance();
    });
    if (r.wasInterrupted())
      return failure();
    for (ParamOp p : experts)
      p->setAttr("mt.expert", b.getUnitAttr());
    if (ep * etp == 1)
      return success();

    for (ParamOp p : experts)
      if (p.getEpDim() || p.getTpDim())
        return p.emitError("mt-shard-ep: the parameter is sharded already; run the pass once");
    if (etp > 1 && failed(splitExperts()))
      return failure();
    for (ParamOp p : ep > 1 ? experts.getArrayRef() : ArrayRef<ParamOp>()) {
      SmallVector<int64_t> shape(p.getTensorType().getShape());
      if (shape[0] % ep != 0)
        return p.emitError() << "mt-shard-ep: " << p.getSymName() << " stacks " << shape[0]
                             << " experts, not divisible by expert_model_parallel_size "
                             << ep << "; use an expert_model_parallel_size dividing num_experts";
      shape[0] /= ep;
      p.setTypeAttr(TypeAttr::get(withShape(p.getType(), shape)));
      p.setEpDimAttr(b.getI64IntegerAttr(0));
      p.setEpSizeAttr(b.getI64IntegerAttr(ep));
    }
    f.walk([&](ParamRefOp ref) {
      if (auto p = symbols.lookup<ParamOp>(ref.getNameAttr().getAttr()))
        ref.getResult().setType(p.getTensorType());
    });

    SmallVector<MoePermuteOp> permutes(f.getOps<MoePermuteOp>());
    for (MoePermuteOp p : permutes)
      if (failed(exchange(p)))
        return failure();
    return success();
  }

private:
  // Expert tensor parallelism (Megatron-Core's experts with expert tp > 1):
  // the first matmul of every expert is column-parallel (its output
  // features, dim 1 of [E, F1, H], split over etp; SwiGLU's gate and up
  // halves each split, as mt-shard-tp splits the dense FC1), the second
  // row-parallel (its input features, dim 2 of [E, H, F]). The roles come
  // from the graph: the matmul reading the permuted rows, and the one whose
  // output the unpermutation reads.
  LogicalResult splitExperts() {
    struct Split {
      int64_t dim, blocks;
    };
    llvm::MapVector<ParamOp, Split> splits;
    auto assign = [&](MoeGroupedMatmulOp g, Split s) -> LogicalResult {
      auto ref = g.getWeight().getDefiningOp<ParamRefOp>();
      ParamOp p = symbols.lookup<ParamOp>(ref.getNameAttr().getAttr());
      auto [it, inserted] = splits.insert({p, s});
      if (!inserted && (it->second.dim != s.dim || it->second.blocks != s.blocks))
        return g.emitError() << "mt-shard-ep: " << p.getSymName()
                             << " is read as both the first and the second expert matmul; "
                                "expert_tensor_parallel_size > 1 cannot split it";
      return success();
    };
    WalkResult r = f.walk([&](MoeGroupedMatmulOp g) {
      const bool first = g.getInput().getDefiningOp<MoePermuteOp>() != nullptr;
      const bool second = llvm::any_of(g.getResult().getUsers(),
                                       [](Operation *u) { return isa<MoeUnpermuteOp>(u); });
      if (first == second) {
        g.emitError() << "mt-shard-ep: expert_tensor_parallel_size " << etp
                      << " splits an expert's first matmul (on the permuted rows) and its "
                         "second (read by mt.moe_unpermute); this one is "
                      << (first ? "both" : "neither")
                      << "; set expert_tensor_parallel_size = 1";
        return WalkResult::interrupt();
      }
      Split s{first ? 1 : 2, 1};
      if (first) {
        Value out = g.getResult();
        if (!out.hasOneUse() || !isa<SwiGLUOp, GeluOp>(*out.getUsers().begin())) {
          g.emitError() << "mt-shard-ep: expert_tensor_parallel_size " << etp
                        << " needs the first expert matmul's output to feed only the "
                           "activation (mt.swiglu or mt.gelu); set "
                           "expert_tensor_parallel_size = 1";
          return WalkResult::interrupt();
        }
        if (isa<SwiGLUOp>(*out.getUsers().begin()))
          s.blocks = 2;
      }
      return failed(assign(g, s)) ? WalkResult::interrupt() : WalkResult::advance();
    });
    if (r.wasInterrupted())
      return failure();
    for (auto &[p, s] : splits) {
      SmallVector<int64_t> shape(p.getTensorType().getShape());
      if (shape[s.dim] % (s.blocks * etp) != 0)
        return p.emitError() << "mt-shard-ep: dimension " << s.dim << " of " << p.getSymName()
                             << " (" << shape[s.dim] << (s.blocks == 2 ? ", gate and up halves" : "")
                             << ") is not divisible by "
                             << (s.blocks == 2 ? "2 x " : "") << "expert_tensor_parallel_size "
                             << etp << "; use an expert_tensor_parallel_size dividing "
                             << "moe_ffn_hidden_size";
      shape[s.dim] /= etp;
      p.setTypeAttr(TypeAttr::get(withShape(p.getType(), shape)));
      p.setTpDimAttr(b.getI64IntegerAttr(s.dim));
      p.setTpSizeAttr(b.getI64IntegerAttr(etp));
      p.setTpBlocksAttr(b.getI64IntegerAttr(s.blocks));
    }
    return success();
  }

  // The static rows a rank receives: from each of the S = etp * ep sources
  // of its tensor-and-expert-parallel group (itself included) at most
  // min(k, L) rows per token, and with a capacity at most C per local
  // expert; padded, exactly C per local expert. Without a capacity,
  // moe_dispatch_buffer_factor f bounds the worst case at f times the
  // balanced load (the S sources' S T k rows spread evenly over the ep
  // ranks' experts: S T k / ep each); *worst gets the unbounded rows then.
  int64_t receiveRows(MoePermuteOp p, int64_t topk, int64_t local, int64_t *worst) {
    const int64_t sources = etp * ep;
    const int64_t tokens = dim0(p.getInput()), capacity = p.getCapacityAttr().getInt();
    const int64_t perSource = tokens * std::min(topk, local);
    *worst = 0;
    if (p.getPadToCapacity())
      return sources * local * capacity;
    if (capacity > 0)
      return sources * std::min(perSource, local * capacity);
    if (bufferFactor > 0) {
      const int64_t balanced = sources * tokens * topk / ep;
      const auto bound = int64_t(std::ceil(bufferFactor * double(balanced)));
      if (bound < sources * perSource) {
        *worst = sources * perSource;
        return bound;
      }
    }
    return sources * perSource;
  }

  // permute -> dispatch -> the experts on the received rows -> combine ->
  // unpermute.
  LogicalResult exchange(MoePermuteOp p) {
    auto router = p.getRoutingMap().getDefiningOp<MoeRouterOp>();
    if (!router)
      return p.emitError("mt-shard-ep: the routing map does not come from an mt.moe_router");
    Value counts = p.getTokensPerExpert();
    const int64_t numExperts = dim0(counts);
    if (numExperts % ep != 0)
      return p.emitError() << "mt-shard-ep: " << numExperts << " experts are not divisible by "
                           << "expert_model_parallel_size " << ep;
    const int64_t local = numExperts / ep;
    int64_t worst = 0;
    const int64_t rows = receiveRows(p, router.getTopkAttr().getInt(), local, &worst);

    b.setInsertionPointAfter(p);
    Type i32 = b.getI32Type();
    auto dispatch = b.create<MoeDispatchOp>(
        p.getLoc(),
        TypeRange{withRows(p.getResult().getType(), rows), RankedTensorType::get({local}, i32),
                  RankedTensorType::get({etp * ep, local}, i32)},
        p.getResult(), counts, b.getI64IntegerAttr(ep), b.getI64IntegerAttr(local),
        MoeDispatcherAttr::get(b.getContext(), dispatcher), b.getI64IntegerAttr(etp));
    copyLayer(p, dispatch);
    // Bounded below the worst case (moe_dispatch_buffer_factor): the memory
    // report states both.
    if (worst > 0)
      dispatch->setAttr("mt.worst_case_rows", b.getI64IntegerAttr(worst));

    // The rows' consumers up to the unpermute: the grouped matmuls (now on
    // the local counts) and the activation between them take R rows.
    DenseSet<Value> onRows;
    onRows.insert(p.getResult());
    MoeUnpermuteOp unpermute;
    SmallVector<Operation *> order;
    for (Operation *op = dispatch->getNextNode(); op && !unpermute; op = op->getNextNode()) {
      bool reads = llvm::any_of(op->getOperands(), [&](Value v) { return onRows.contains(v); });
      if (!reads)
        continue;
      if (auto u = dyn_cast<MoeUnpermuteOp>(op)) {
        if (u.getRowIds() != p.getRowIds())
          return u.emitError("mt-shard-ep: unpermutes rows of another permutation");
        unpermute = u;
        break;
      }
      if (auto g = dyn_cast<MoeGroupedMatmulOp>(op)) {
        if (g.getTokensPerExpert() != counts || !onRows.contains(g.getInput()))
          return g.emitError("mt-shard-ep: the experts' matmul does not read the permutation's "
                             "rows and counts");
      } else if (!isa<SwiGLUOp, GeluOp>(op)) {
        return op->emitError() << "mt-shard-ep: does not know how to run '" << op->getName()
                               << "' on the rows of other expert-parallel ranks";
      }
      order.push_back(op);
      onRows.insert(op->getResult(0));
    }
    if (!unpermute)
      return p.emitError("mt-shard-ep: the permuted rows never reach an mt.moe_unpermute");
    if (llvm::any_of(p.getResult().getUsers(), [&](Operation *u) {
          return u != dispatch && !llvm::is_contained(order, u);
        }))
      return p.emitError("mt-shard-ep: the permuted rows are read outside the experts");

    Value y = dispatch.getResult();
    p.getResult().replaceAllUsesExcept(y, dispatch);
    // R rows, and with expert tensor parallelism this rank's features: the
    // first matmul's output and the activation are 1/etp of the whole.
    for (Operation *op : order) {
      Value out = op->getResult(0);
      int64_t features = cast<RankedTensorType>(out.getType()).getDimSize(1);
      if (auto g = dyn_cast<MoeGroupedMatmulOp>(op)) {
        g.getTokensPerExpertMutable().assign(dispatch.getLocalCounts());
        features = cast<RankedTensorType>(g.getWeight().getType()).getDimSize(1);
      } else if (isa<SwiGLUOp>(op)) {
        features = cast<RankedTensorType>(op->getOperand(0).getType()).getDimSize(1) / 2;
      } else {
        features = cast<RankedTensorType>(op->getOperand(0).getType()).getDimSize(1);
      }
      out.setType(withShape(out.getType(), {rows, features}));
    }

    Value expertOut = unpermute.getInput();
    if (!llvm::is_contained(order, expertOut.getDefiningOp()))
      return unpermute.emitError("mt-shard-ep: unpermutes rows that are not the experts' output");
    b.setInsertionPoint(unpermute);
    auto combine = b.create<MoeCombineOp>(
        unpermute.getLoc(), withRows(expertOut.getType(), dim0(p.getResult())), expertOut,
        dispatch.getLayout(), counts, b.getI64IntegerAttr(ep), b.getI64IntegerAttr(local),
        MoeDispatcherAttr::get(b.getContext(), dispatcher), b.getI64IntegerAttr(etp));
    copyLayer(unpermute, combine);
    unpermute.getInputMutable().assign(combine.getResult());
    return success();
  }

  static void copyLayer(Operation *from, Operation *to) {
    if (Attribute layer = from->getAttr("mt.layer"))
      to->setAttr("mt.layer", layer);
  }

  ModuleOp module;
  SymbolTable symbols;
  func::FuncOp f;
  int64_t ep, etp;
  MoeDispatcher dispatcher;
  double bufferFactor; // moe_dispatch_buffer_factor; 0: not set
  OpBuilder b;
};

struct MtShardEpPass : impl::MtShardEpPassBase<MtShardEpPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto par = module->getAttrOfType<DictionaryAttr>("mt.parallel");
    int64_t ep = 1, etp = 1;
    MoeDispatcher dispatcher = MoeDispatcher::AllGather;
    double bufferFactor = 0;
    if (par) {
      if (auto a = par.getAs<FloatAttr>("moe_dispatch_buffer_factor"))
        bufferFactor = a.getValueAsDouble();
      if (auto a = par.getAs<IntegerAttr>("expert_model_parallel_size"))
        ep = a.getInt();
      if (auto a = par.getAs<IntegerAttr>("expert_tensor_parallel_size"))
        etp = a.getInt();
      if (auto a = par.getAs<StringAttr>("moe_token_dispatcher_type")) {
        std::optional<MoeDispatcher> d = symbolizeMoeDispatcher(a.getValue());
        if (!d) {
          module.emitError() << "mt-shard-ep: mt.parallel.moe_token_dispatcher_type is \""
                             << a.getValue() << "\"; expected \"alltoall\" or \"allgather\"";
          return signalPassFailure();
        }
        dispatcher = *d;
      }
    }
    if (ep < 1) {
      module.emitError("mt-shard-ep: mt.parallel.expert_model_parallel_size must be >= 1");
      return signalPassFailure();
    }
    if (etp < 1) {
      module.emitError("mt-shard-ep: mt.parallel.expert_tensor_parallel_size must be >= 1");
      return signalPassFailure();
    }
    if (bufferFactor != 0 && !(bufferFactor >= 1)) {
      module.emitError("mt-shard-ep: mt.parallel.moe_dispatch_buffer_factor must be at least 1 "
                       "(the balanced load)");
      return signalPassFailure();
    }
    auto forward = module.lookupSymbol<func::FuncOp>("forward");
    if (!forward) {
      module.emitError("mt-shard-ep: the module has no func.func @forward; run it before "
                       "mt-autodiff");
      return signalPassFailure();
    }
    if (failed(ExpertSharder(module, forward, ep, etp, dispatcher, bufferFactor).run()))
      return signalPassFailure();
    if (ep > 1)
      module->setAttr("mt.expert_parallel",
                      IntegerAttr::get(IntegerType::get(&getContext(), 64), ep));
    if (etp > 1)
      module->setAttr("mt.expert_tensor_parallel",
                      IntegerAttr::get(IntegerType::get(&getContext(), 64), etp));
  }
};

} // namespace
} // namespace mt
