// mt-optimizer: @grad_norm and @optimizer_step (LR schedule, clipping, AdamW or SGD).
#include "passes/Passes.h"

#include "dialects/mt/MtOps.h"
#include "passes/StageModules.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mt {
#define GEN_PASS_DEF_MTOPTIMIZERPASS
#include "passes/Passes.h.inc"
} // namespace mt

using namespace mlir;

namespace mt {
namespace {

// Megatron-LM's is_embedding_or_output_parameter (LanguageModule): the word
// embeddings and the output layer's weight.
bool isEmbeddingOrOutput(StringRef name) {
  return name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
}

struct MtOptimizerPass : impl::MtOptimizerPassBase<MtOptimizerPass> {
  void runOnOperation() override {
    for (ModuleOp stage : stageModules(getOperation()))
      if (failed(runOnStage(stage)))
        return signalPassFailure();
  }

  LogicalResult runOnStage(ModuleOp module) {
    auto t = moduleAttr(module, "mt.training");
    if (!t)
      return module.emitError("mt-optimizer: the module has no mt.training settings "
                              "(mtc's importer writes them)");
    bool ok = true;
    auto f64 = [&](StringRef name) {
      if (auto a = t.getAs<FloatAttr>(name))
        return a.getValueAsDouble();
      module.emitError() << "mt-optimizer: mt.training." << name << " is missing";
      ok = false;
      return 0.0;
    };
    auto i64 = [&](StringRef name) -> int64_t {
      if (auto a = t.getAs<IntegerAttr>(name))
        return a.getInt();
      module.emitError() << "mt-optimizer: mt.training." << name << " is missing";
      ok = false;
      return 0;
    };
    // Megatron's --optimizer: adam (the default, also when the module does
    // not say) or sgd.
    bool sgd = false;
    if (auto o = t.getAs<StringAttr>("optimizer")) {
      if (o.getValue() != "adam" && o.getValue() != "sgd") {
        module.emitError() << "mt-optimizer: mt.training.optimizer is \"" << o.getValue()
                           << "\"; expected \"adam\" or \"sgd\"";
        return failure();
      }
      sgd = o.getValue() == "sgd";
    }
    double lr = f64("lr"), minLr = f64("min_lr"), wd = f64("weight_decay"),
           clip = f64("clip_grad");
    double beta1 = sgd ? 0.0 : f64("adam_beta1"), beta2 = sgd ? 0.0 : f64("adam_beta2"),
           eps = sgd ? 0.0 : f64("adam_eps"), momentum = sgd ? f64("sgd_momentum") : 0.0;
    // Sample-based training counts the schedule in samples, as Megatron's
    // scheduler does, and takes the count after the update as an input
    // (with a batch ramp-up an update's samples vary).
    const bool bySamples = bool(t.get("train_samples"));
    int64_t warmup = i64(bySamples ? "lr_warmup_samples" : "lr_warmup_iters"),
            decay = i64(bySamples ? "lr_decay_samples" : "lr_decay_iters");
    double decoupledPeak = 0, decoupledMin = 0;
    if (auto a = t.getAs<FloatAttr>("decoupled_lr"))
      decoupledPeak = a.getValueAsDouble();
    if (auto a = t.getAs<FloatAttr>("decoupled_min_lr"))
      decoupledMin = a.getValueAsDouble();
    std::optional<LrStyle> style;
    if (auto s = t.getAs<StringAttr>("lr_decay_style"))
      style = symbolizeLrStyle(s.getValue());
    if (!style) {
      module.emitError("mt-optimizer: mt.training.lr_decay_style is missing or unknown");
      ok = false;
    }
    // Megatron counts the schedule in samples, which inverse_square_root
    // sees; WSD's anneal.
    IntegerAttr samples, wsdIters;
    WsdStyleAttr wsdStyle;
    if (style == LrStyle::InverseSquareRoot && !bySamples)
      if (auto g = t.getAs<IntegerAttr>("global_batch_size"))
        samples = g;
    if (style == LrStyle::WSD) {
      std::optional<WsdStyle> ws;
      if (auto s = t.getAs<StringAttr>("lr_wsd_decay_style"))
        ws = symbolizeWsdStyle(s.getValue());
      if (!ws) {
        module.emitError("mt-optimizer: the wsd schedule needs mt.training.lr_wsd_decay_style "
                         "(exponential, linear, cosine or minus_sqrt)");
        ok = false;
      } else {
        wsdStyle = WsdStyleAttr::get(module.getContext(), *ws);
      }
      wsdIters = IntegerAttr::get(IntegerType::get(module.getContext(), 64),
                                  i64(bySamples ? "lr_wsd_decay_samples" : "lr_wsd_decay_iters"));
    }
    if (!ok)
      return failure();

    Location loc = module.getLoc();
    OpBuilder b(module.getBodyRegion());
    b.setInsertionPointToEnd(module.getBody());
    auto f32 = RankedTensorType::get({}, b.getF32Type());
    auto i64t = RankedTensorType::get({}, b.getI64Type());

    auto normFn = b.create<func::FuncOp>(loc, "grad_norm", b.getFunctionType({}, {f32}));
    {
      OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToEnd(normFn.addEntryBlock());
      // Sequence parallelism leaves a partial gradient on each
      // tensor-parallel rank for parameters read on sequence shards
      // (mt-shard-tp marks them); their sum is the gradient. Not an expert
      // parameter's (mt.expert): the tensor-parallel ranks are expert-parallel
      // or expert-tensor-parallel ranks holding other experts or other
      // shards of them, or expert data-parallel ranks, whose sum
      // mt-data-parallel takes over expt_dp with the other token-holding
      // ranks'.
      SmallVector<Attribute> partial;
      for (auto param : module.getOps<ParamOp>())
        if (param->hasAttr("mt.tp_partial_grad") && !param->hasAttr("mt.expert"))
          partial.push_back(FlatSymbolRefAttr::get(param.getSymNameAttr()));
      if (!partial.empty())
        b.create<AllReduceGradsOp>(loc, b.getStringAttr("tp"), b.getF64FloatAttr(1.0),
                                   b.getArrayAttr(partial));
      // Pipeline stages: tied copies exchange gradients first, then the
      // squares are summed over the stages (mt.grad_norm's "mp" group).
      bool stage = module->hasAttr("mt.stage");
      int64_t tag = 0;
      for (auto param : module.getOps<ParamOp>())
        if (auto peer = param->getAttrOfType<IntegerAttr>("mt.tied_peer"))
          b.create<AllReduceTiedGradOp>(loc, FlatSymbolRefAttr::get(param.getSymNameAttr()),
                                        b.getI64IntegerAttr(peer.getInt()),
                                        b.getI64IntegerAttr(tag++));
      Value norm = b.create<GradNormOp>(loc, f32, stage ? b.getStringAttr("mp") : StringAttr());
      b.create<func::ReturnOp>(loc, norm);
    }

    SmallVector<Type> inputs = {i64t, i64t, f32, f32};
    if (bySamples)
      inputs.push_back(i64t);
    auto step = b.create<func::FuncOp>(loc, "optimizer_step",
                                       b.getFunctionType(inputs, {f32, f32}));
    step.setArgAttr(0, "mt.name", b.getStringAttr("steps"));
    step.setArgAttr(1, "mt.name", b.getStringAttr("step"));
    step.setArgAttr(2, "mt.name", b.getStringAttr("grad_norm"));
    step.setArgAttr(3, "mt.name", b.getStringAttr("grad_scale"));
    if (bySamples)
      step.setArgAttr(4, "mt.name", b.getStringAttr("next_steps"));
    Block *entry = step.addEntryBlock();
    b.setInsertionPointToEnd(entry);
    auto schedule = [&](Value steps) -> Value {
      return b.create<LrScheduleOp>(loc, f32, steps, LrStyleAttr::get(b.getContext(), *style),
                                    b.getF64FloatAttr(lr), b.getF64FloatAttr(minLr),
                                    b.getI64IntegerAttr(warmup), b.getI64IntegerAttr(decay),
                                    samples, wsdStyle, wsdIters);
    };
    Value lrValue = schedule(entry->getArgument(0));
    // Megatron's --decoupled-lr: the word embeddings and the output layer
    // (is_embedding_or_output_parameter; every stage's copy of a tied
    // embedding) follow the same schedule from their own peak and floor.
    Value decoupledLr;
    if (decoupledPeak > 0)
      decoupledLr = b.create<LrScheduleOp>(
          loc, f32, entry->getArgument(0), LrStyleAttr::get(b.getContext(), *style),
          b.getF64FloatAttr(decoupledPeak), b.getF64FloatAttr(decoupledMin),
          b.getI64IntegerAttr(warmup), b.getI64IntegerAttr(decay), samples, wsdStyle, wsdIters);
    Value coeff = b.create<ClipCoeffOp>(loc, entry->getArgument(2), entry->getArgument(3),
                                        b.getF64FloatAttr(clip));
    for (auto param : module.getOps<ParamOp>()) {
      // Megatron-LM: no weight decay for biases and 1-D parameters (norms).
      bool decays = param.getTensorType().getRank() > 1 &&
                    !param.getSymName().ends_with(".bias");
      bool decoupled = decoupledLr && isEmbeddingOrOutput(param.getSymName());
      if (decoupled)
        param->setAttr("mt.decoupled_lr", b.getUnitAttr());
      if (sgd)
        b.create<SgdOp>(loc, FlatSymbolRefAttr::get(param.getSymNameAttr()),
                        decoupled ? decoupledLr : lrValue, coeff, b.getF64FloatAttr(momentum),
                        b.getF64FloatAttr(decays ? wd : 0.0));
      else
        b.create<AdamWOp>(loc, FlatSymbolRefAttr::get(param.getSymNameAttr()),
                          decoupled ? decoupledLr : lrValue,
                          coeff, entry->getArgument(1), b.getF64FloatAttr(beta1),
                          b.getF64FloatAttr(beta2), b.getF64FloatAttr(eps),
                          b.getF64FloatAttr(decays ? wd : 0.0));
    }
    // Megatron logs the rate after its scheduler has stepped: the one the
    // next update will use.
    Value nextLr = schedule(entry->getArgument(bySamples ? 4 : 1));
    b.create<func::ReturnOp>(loc, ValueRange{lrValue, nextLr});
    return success();
  }
};

} // namespace
} // namespace mt
