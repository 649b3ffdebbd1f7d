// Spec -> mt IR. Mirrors Megatron-LM's GPT: pre-norm blocks, fused QKV laid out
// by query group, parameter names and initialisation as Megatron chooses them.
#include "compiler/import/ImportSpec.h"

#include "dialects/mt/MtOps.h"
#include "runtime/base/batch_rampup.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

#include <algorithm>
#include <cmath>
#include <string>

using namespace mlir;

namespace mt {
namespace {

class GraphBuilder {
public:
  GraphBuilder(MLIRContext &ctx, const spec::Spec &spec)
      : spec(spec), m(spec.model), b(&ctx),
        loc(FileLineColLoc::get(&ctx, spec.source, 1, 1)) {
    switch (spec.training.precision) {
    case spec::Precision::FP32: dtype = b.getF32Type(); break;
    case spec::Precision::FP16: dtype = b.getF16Type(); break;
    case spec::Precision::BF16: dtype = b.getBF16Type(); break;
    }
    batch = spec.training.micro_batch_size;
    seq = m.seq_length;
    hidden = m.hidden_size;
    headDim = m.kv_channels;
  }

  // What the training passes need from the spec (mt-autodiff, mt-optimizer,
  // mt-recompute, mt-plan-memory read it), kept in the IR so each pass can be
  // run alone in mtc-opt.
  DictionaryAttr trainingAttr() {
    const spec::TrainingConfig &t = spec.training;
    const spec::ParallelConfig &p = spec.parallel;
    auto i64 = [&](int64_t v) { return b.getI64IntegerAttr(v); };
    auto f64 = [&](double v) { return b.getF64FloatAttr(v); };
    // The dialect's names (mt.lr_schedule's style and anneal).
    const char *style = t.lr_decay_style == spec::LrDecayStyle::Constant ? "constant"
                        : t.lr_decay_style == spec::LrDecayStyle::Linear ? "linear"
                        : t.lr_decay_style == spec::LrDecayStyle::Cosine ? "cosine"
                        : t.lr_decay_style == spec::LrDecayStyle::WSD    ? "wsd"
                                                                         : "inverse_square_root";
    const char *precision = t.precision == spec::Precision::FP32   ? "fp32"
                            : t.precision == spec::Precision::BF16 ? "bf16"
                                                                   : "fp16";
    const char *granularity =
        p.recompute_granularity == spec::RecomputeGranularity::None       ? "none"
        : p.recompute_granularity == spec::RecomputeGranularity::Selective ? "selective"
                                                                           : "full";
    const char *method = p.recompute_method == spec::RecomputeMethod::Uniform ? "uniform"
                         : p.recompute_method == spec::RecomputeMethod::Block ? "block"
                                                                              : "none";
    NamedAttribute attrs[] = {
        b.getNamedAttr("num_micro_batches", i64(spec.numMicroBatches())),
        b.getNamedAttr("precision", b.getStringAttr(precision)),
        b.getNamedAttr("lr", f64(t.lr)),
        b.getNamedAttr("min_lr", f64(t.min_lr)),
        // 0: no decoupled rate (mt-optimizer gives every parameter lr).
        b.getNamedAttr("decoupled_lr", f64(t.decoupled_lr)),
        b.getNamedAttr("decoupled_min_lr", f64(t.decoupled_lr > 0 ? t.decoupled_min_lr : 0.0)),
        b.getNamedAttr("lr_decay_style", b.getStringAttr(style)),
        b.getNamedAttr("lr_warmup_iters", i64(t.lr_warmup_iters)),
        b.getNamedAttr("lr_decay_iters", i64(t.lr_decay_iters)),
        b.getNamedAttr("lr_wsd_decay_style", b.getStringAttr(spec::toString(t.lr_wsd_decay_style))),
        b.getNamedAttr("lr_wsd_decay_iters", i64(t.lr_wsd_decay_iters)),
        b.getNamedAttr("global_batch_size", i64(t.global_batch_size)),
        b.getNamedAttr("optimizer", b.getStringAttr(spec::toString(t.optimizer))),
        b.getNamedAttr("sgd_momentum", f64(t.sgd_momentum)),
        b.getNamedAttr("weight_decay", f64(t.weight_decay)),
        b.getNamedAttr("adam_beta1", f64(t.adam_beta1)),
        b.getNamedAttr("adam_beta2", f64(t.adam_beta2)),
        b.getNamedAttr("adam_eps", f64(t.adam_eps)),
        b.getNamedAttr("clip_grad", f64(t.clip_grad)),
        b.getNamedAttr("recompute_granularity", b.getStringAttr(granularity)),
        b.getNamedAttr("recompute_method", b.getStringAttr(method)),
        b.getNamedAttr("recompute_num_layers", i64(p.recompute_num_layers)),
    };
    SmallVector<NamedAttribute> all(std::begin(attrs), std::end(attrs));
    // --calculate-per-token-loss: mt-autodiff seeds the backward from the
    // token counts (each rank's micro-batch, the global batch).
    if (t.calculate_per_token_loss) {
      const int64_t seq = spec.model.seq_length;
      all.push_back(b.getNamedAttr("loss_tokens_per_micro_batch", i64(t.micro_batch_size * seq)));
      all.push_back(b.getNamedAttr("loss_tokens_per_iteration", i64(t.global_batch_size * seq)));
    }
    // --grad-reduce-in-bf16: mt-plan-memory types the gradient buffers bf16.
    if (t.grad_reduce_in_bf16)
      all.push_back(b.getNamedAttr("grad_reduce_in_bf16", b.getUnitAttr()));
    // Sample-based training: mt-optimizer counts the schedule in samples.
    if (t.sampleBased()) {
      all.push_back(b.getNamedAttr("train_samples", i64(t.train_samples)));
      all.push_back(b.getNamedAttr("lr_warmup_samples", i64(t.lr_warmup_samples)));
      all.push_back(b.getNamedAttr("lr_decay_samples", i64(t.lr_decay_samples)));
      all.push_back(b.getNamedAttr("lr_wsd_decay_samples", i64(t.lr_wsd_decay_samples)));
    }
    // A batch ramp-up's smaller micro-batch counts, each once, in the order
    // the run reaches them: mt-plan-memory checks that each runs inside the
    // full batch's plan of a pipelined step.
    if (t.rampup_batch_size.size() == 3) {
      std::vector<rt::BatchChange> changes;
      rt::rampup_train_iters({t.rampup_batch_size[0], t.rampup_batch_size[1],
                              t.rampup_batch_size[2], t.global_batch_size},
                             t.train_samples, &changes);
      const int64_t step = t.micro_batch_size * p.data_parallel_size;
      SmallVector<int64_t> counts;
      for (const rt::BatchChange &c : changes)
        if (c.batch < t.global_batch_size && !llvm::is_contained(counts, c.batch / step))
          counts.push_back(c.batch / step);
      all.push_back(b.getNamedAttr("ramp_micro_batches", b.getDenseI64ArrayAttr(counts)));
    }
    return b.getDictionaryAttr(all);
  }

  OwningOpRef<ModuleOp> build() {
    OwningOpRef<ModuleOp> module = ModuleOp::create(loc, StringRef("gpt"));
    (*module)->setAttr("mt.training", trainingAttr());
    const spec::ParallelConfig &par = spec.parallel;
    SmallVector<NamedAttribute> parallel = {
        b.getNamedAttr("tensor_model_parallel_size",
                       b.getI64IntegerAttr(par.tensor_model_parallel_size)),
        b.getNamedAttr("pipeline_model_parallel_size",
                       b.getI64IntegerAttr(par.pipeline_model_parallel_size)),
        b.getNamedAttr("data_parallel_size", b.getI64IntegerAttr(par.data_parallel_size)),
        b.getNamedAttr("virtual_pipeline_model_parallel_size",
                       b.getI64IntegerAttr(par.virtual_pipeline_model_parallel_size)),
        b.getNamedAttr("decoder_first_pipeline_num_layers",
                       b.getI64IntegerAttr(par.decoder_first_pipeline_num_layers)),
        b.getNamedAttr("decoder_last_pipeline_num_layers",
                       b.getI64IntegerAttr(par.decoder_last_pipeline_num_layers)),
        b.getNamedAttr("use_distributed_optimizer",
                       b.getBoolAttr(par.use_distributed_optimizer)),
        b.getNamedAttr("sequence_parallel", b.getBoolAttr(par.sequence_parallel)),
        b.getNamedAttr("overlap_grad_reduce", b.getBoolAttr(par.overlap_grad_reduce)),
        b.getNamedAttr("overlap_param_gather", b.getBoolAttr(par.overlap_param_gather)),
        b.getNamedAttr("ddp_bucket_size", b.getI64IntegerAttr(par.ddp_bucket_size)),
        b.getNamedAttr("expert_model_parallel_size",
                       b.getI64IntegerAttr(par.expert_model_parallel_size)),
        b.getNamedAttr("expert_tensor_parallel_size",
                       b.getI64IntegerAttr(m.num_experts > 0 ? par.expert_tensor_parallel_size
                                                             : 1)),
        b.getNamedAttr("moe_token_dispatcher_type",
                       b.getStringAttr(spec::toString(par.moe_token_dispatcher_type))),
    };
    // mt's bound on the expert exchange's receive rows (mt-shard-ep), only
    // when set.
    if (par.moe_dispatch_buffer_factor > 0)
      parallel.push_back(b.getNamedAttr("moe_dispatch_buffer_factor",
                                        b.getF64FloatAttr(par.moe_dispatch_buffer_factor)));
    (*module)->setAttr("mt.parallel", b.getDictionaryAttr(parallel));
    Type idsType = RankedTensorType::get({batch, seq}, b.getI32Type());
    Type lossType = RankedTensorType::get({}, b.getF32Type());
    // An MoE model also returns its routers' auxiliary losses summed over
    // layers, named as Megatron's tracker names them (only those on).
    SmallVector<StringRef> auxNames;
    if (const char *lb = loadBalancingName())
      auxNames.push_back(lb);
    if (zLossOn())
      auxNames.push_back("z_loss");
    SmallVector<Type> results(1 + auxNames.size(), lossType);
    b.setInsertionPointToEnd(module->getBody());
    func = b.create<func::FuncOp>(
        loc, "forward", b.getFunctionType({idsType, idsType}, results));
    func.setArgAttr(0, "mt.name", b.getStringAttr("tokens"));
    func.setArgAttr(1, "mt.name", b.getStringAttr("labels"));
    for (auto [i, name] : llvm::enumerate(auxNames))
      func.setResultAttr(1 + i, "mt.name", b.getStringAttr(name));
    Block *entry = func.addEntryBlock();
    Value tokens = entry->getArgument(0), labels = entry->getArgument(1);
    b.setInsertionPointToEnd(entry);

    // Embedding (+ learned positions), then embedding dropout.
    int64_t vocab = spec.paddedVocabSize();
    Value wordTable =
        param("embedding.word_embeddings.weight", {vocab, hidden}, normal());
    Value x = b.create<EmbeddingOp>(loc, act({batch, seq, hidden}), wordTable, tokens);
    if (m.position_embedding_type == spec::PositionEmbedding::LearnedAbsolute) {
      Value posTable = param("embedding.position_embeddings.weight",
                             {m.max_position_embeddings, hidden}, normal());
      Value pos = b.create<PositionIdsOp>(loc, idsType);
      Value pe = b.create<EmbeddingOp>(loc, act({batch, seq, hidden}), posTable, pos);
      x = b.create<AddOp>(loc, x, pe);
    }
    x = dropout(x, m.hidden_dropout);

    // Each transformer layer's ops carry `mt.layer`: mt-recompute chooses
    // layers by it, and mt-autodiff copies it onto their backward ops.
    for (int64_t i = 0; i < m.num_layers; ++i) {
      Operation *last = entry->empty() ? nullptr : &entry->back();
      x = layer(i, x);
      for (Operation *op = last ? last->getNextNode() : &entry->front(); op;
           op = op->getNextNode())
        op->setAttr("mt.layer", b.getI64IntegerAttr(i));
    }

    x = norm("decoder.final_layernorm.", x);
    Value outWeight =
        m.untie_embeddings_and_output_weights
            ? param("output_layer.weight", {vocab, hidden}, normal())
            : ref("embedding.word_embeddings.weight", {vocab, hidden});
    Value logits = b.create<MatmulOp>(loc, act({batch, seq, vocab}), x, outWeight);
    Value loss = b.create<CrossEntropyOp>(loc, lossType, logits, labels);
    SmallVector<Value> returned{loss};
    for (ArrayRef<Value> terms : {ArrayRef<Value>(lbTerms), ArrayRef<Value>(zTerms)}) {
      if (terms.empty())
        continue;
      Value sum = terms.front();
      for (Value t : terms.drop_front())
        sum = b.create<AddOp>(loc, sum, t);
      returned.push_back(sum);
    }
    b.create<func::ReturnOp>(loc, returned);
    return module;
  }

private:
  struct Init {
    InitKind kind;
    double std;
  };
  Init normal() const { return {InitKind::Normal, m.init_method_std}; }
  // Megatron scales the init of each block's output projections (attention
  // projection, FC2) by 1/sqrt(2 * num_layers).
  Init scaledNormal() const {
    return {InitKind::Normal,
            m.init_method_std / std::sqrt(2.0 * static_cast<double>(m.num_layers))};
  }
  static Init zeros() { return {InitKind::Zeros, 0}; }
  static Init ones() { return {InitKind::Ones, 0}; }

  RankedTensorType act(ArrayRef<int64_t> shape) {
    return RankedTensorType::get(shape, dtype);
  }

  Value ref(const std::string &name, ArrayRef<int64_t> shape) {
    return b.create<ParamRefOp>(loc, act(shape), name);
  }

  // Declares the parameter before the function and reads it where we are.
  Value param(const std::string &name, ArrayRef<int64_t> shape, Init init) {
    OpBuilder decl(func);
    FloatAttr stdAttr =
        init.kind == InitKind::Normal ? decl.getF64FloatAttr(init.std) : FloatAttr();
    decl.create<ParamOp>(loc, name, act(shape), init.kind, stdAttr, IntegerAttr(), IntegerAttr(),
                         IntegerAttr(), IntegerAttr(), IntegerAttr());
    return ref(name, shape);
  }

  Value norm(const std::string &prefix, Value x) {
    // --apply-layernorm-1p: Megatron initialises the weight to 0 and
    // applies 1 + w (TransformerEngine's zero_centered_gamma).
    const bool oneP = m.apply_layernorm_1p;
    Value w = param(prefix + "weight", {hidden}, oneP ? zeros() : ones());
    if (oneP) // the plan's model fingerprint tells such checkpoints apart
      func->getParentOfType<ModuleOp>()
          .lookupSymbol(prefix + "weight")
          ->setAttr("mt.applied_as_one_plus", b.getUnitAttr());
    FloatAttr eps = b.getF64FloatAttr(m.norm_epsilon);
    UnitAttr zeroCentered = oneP ? b.getUnitAttr() : UnitAttr();
    if (m.normalization == spec::Normalization::RMSNorm)
      return b.create<RMSNormOp>(loc, x.getType(), x, w, eps, zeroCentered);
    Value bias = param(prefix + "bias", {hidden}, zeros());
    return b.create<LayerNormOp>(loc, x.getType(), x, w, bias, eps, zeroCentered);
  }

  Value linear(const std::string &prefix, Value x, int64_t out, Init init) {
    auto in = cast<RankedTensorType>(x.getType());
    Value w = param(prefix + "weight", {out, in.getShape().back()}, init);
    SmallVector<int64_t> shape(in.getShape().drop_back());
    shape.push_back(out);
    Value y = b.create<MatmulOp>(loc, act(shape), x, w);
    if (m.add_bias_linear)
      y = b.create<BiasAddOp>(loc, y.getType(), y, param(prefix + "bias", {out}, zeros()));
    return y;
  }

  Value dropout(Value x, double rate) {
    if (rate == 0.0)
      return x;
    return b.create<DropoutOp>(loc, x, b.getF64FloatAttr(rate),
                               b.getI64IntegerAttr(nextStream++), IntegerAttr());
  }

  // The router's load-balancing loss's log name when it is on (Megatron
  // computes and tracks it only with a positive coefficient), else null.
  const char *loadBalancingName() const {
    if (m.num_experts == 0 || !(m.moe_aux_loss_coeff > 0.0))
      return nullptr;
    switch (m.moe_router_load_balancing_type) {
    case spec::MoeLoadBalancing::AuxLoss: return "load_balancing_loss";
    case spec::MoeLoadBalancing::SeqAuxLoss: return "seq_load_balancing_loss";
    case spec::MoeLoadBalancing::None: return nullptr;
    }
    return nullptr;
  }
  bool zLossOn() const { return m.num_experts > 0 && m.moe_z_loss_coeff > 0.0; }

  // A gated (SwiGLU) or GeLU feed-forward's activation of fc1's output.
  Value activation(Value fc1, ArrayRef<int64_t> shape) {
    if (m.swiglu)
      return b.create<SwiGLUOp>(loc, act(shape), fc1);
    return b.create<GeluOp>(loc, fc1, GeluApproximation::Tanh);
  }

  // Megatron-Core's MoELayer on the normed hidden states h [b, s, H]: the
  // router (a linear layer to E logits, then top-k), the tokens permuted
  // into one segment per expert, the experts as two grouped matmuls over
  // stacked weights [E, out, in] with the activation between, the rows
  // combined back weighted by the router, plus the shared expert.
  Value moe(const std::string &p, Value h) {
    const int64_t tokens = batch * seq, experts = m.num_experts, topk = m.moe_router_topk,
                  ffn = m.moe_ffn_hidden_size, fc1Out = m.swiglu ? 2 * ffn : ffn;
    Value x = b.create<ReshapeOp>(loc, act({tokens, hidden}), h);
    // With moe_router_dtype, Megatron's router_gating_linear computes the
    // logits GEMM (and its gradients) in that type: the logits are then f32
    // (a 16-bit model's not rounded) or f64, and the routing runs on them.
    RankedTensorType logitsType = act({tokens, experts});
    if (m.moe_router_dtype == spec::MoeRouterDtype::FP32)
      logitsType = RankedTensorType::get({tokens, experts}, b.getF32Type());
    else if (m.moe_router_dtype == spec::MoeRouterDtype::FP64)
      logitsType = RankedTensorType::get({tokens, experts}, b.getF64Type());
    Value logits = b.create<MatmulOp>(loc, logitsType, x,
                                      param(p + "mlp.router.weight", {experts, hidden}, normal()));
    // Megatron's get_capacity over the micro-batch's token-expert pairs.
    int64_t capacity = 0;
    if (m.moe_expert_capacity_factor > 0.0)
      capacity = int64_t(std::ceil((double(tokens * topk) / double(experts)) *
                                   m.moe_expert_capacity_factor));
    const bool pad = capacity > 0 && m.moe_pad_expert_input_to_capacity;
    auto lb = m.moe_router_load_balancing_type == spec::MoeLoadBalancing::AuxLoss
                  ? MoeLoadBalancing::AuxLoss
              : m.moe_router_load_balancing_type == spec::MoeLoadBalancing::SeqAuxLoss
                  ? MoeLoadBalancing::SeqAuxLoss
                  : MoeLoadBalancing::None;
    auto dtypeOf = [](spec::MoeRouterDtype d) {
      return d == spec::MoeRouterDtype::FP32   ? MoeRouterDtype::FP32
             : d == spec::MoeRouterDtype::FP64 ? MoeRouterDtype::FP64
                                               : MoeRouterDtype::None;
    };
    Type f32 = b.getF32Type(), i32 = b.getI32Type();
    auto router = b.create<MoeRouterOp>(
        loc, RankedTensorType::get({tokens, experts}, f32),
        RankedTensorType::get({tokens, experts}, i32), RankedTensorType::get({}, f32),
        RankedTensorType::get({}, f32), logits, b.getI64IntegerAttr(topk),
        MoeScoreFunctionAttr::get(b.getContext(),
                                  m.moe_router_score_function == spec::MoeScoreFunction::Sigmoid
                                      ? MoeScoreFunction::Sigmoid
                                      : MoeScoreFunction::Softmax),
        m.moe_router_pre_softmax ? b.getUnitAttr() : UnitAttr(),
        b.getF64FloatAttr(m.moe_router_topk_scaling_factor),
        MoeLoadBalancingAttr::get(b.getContext(), lb), b.getF64FloatAttr(m.moe_aux_loss_coeff),
        b.getF64FloatAttr(m.moe_z_loss_coeff), b.getI64IntegerAttr(capacity),
        MoeDropPolicyAttr::get(b.getContext(),
                               m.moe_token_drop_policy == spec::MoeTokenDropPolicy::Position
                                   ? MoeDropPolicy::Position
                                   : MoeDropPolicy::Probs),
        pad ? b.getUnitAttr() : UnitAttr(), b.getI64IntegerAttr(seq),
        MoeRouterDtypeAttr::get(b.getContext(), dtypeOf(m.moe_router_dtype)),
        /*count_group=*/StringAttr());
    // mt-shard-tp recomputes the capacity from the factor for the tokens of
    // a sequence shard (Megatron computes it from the rank's own tokens).
    if (capacity > 0)
      router->setAttr("mt.capacity_factor", b.getF64FloatAttr(m.moe_expert_capacity_factor));
    if (loadBalancingName())
      lbTerms.push_back(router.getAuxLoss());
    if (zLossOn())
      zTerms.push_back(router.getZLoss());

    // The dispatched rows, sized for the worst case when nothing is
    // dropped: any split of the T * topk token-expert pairs over the
    // experts fits.
    const int64_t rows = pad ? experts * capacity
                         : capacity > 0 ? std::min(tokens * topk, experts * capacity)
                                        : tokens * topk;
    auto permute = b.create<MoePermuteOp>(
        loc, act({rows, hidden}), RankedTensorType::get({rows}, i32),
        RankedTensorType::get({experts}, i32), x, router.getRoutingMap(),
        b.getI64IntegerAttr(capacity), pad ? b.getUnitAttr() : UnitAttr());
    Value counts = permute.getTokensPerExpert();
    Value fc1 = b.create<MoeGroupedMatmulOp>(
        loc, act({rows, fc1Out}), permute.getResult(),
        param(p + "mlp.experts.linear_fc1.weight", {experts, fc1Out, hidden}, normal()), counts);
    Value a = activation(fc1, {rows, ffn});
    Value fc2 = b.create<MoeGroupedMatmulOp>(
        loc, act({rows, hidden}), a,
        param(p + "mlp.experts.linear_fc2.weight", {experts, hidden, ffn}, scaledNormal()),
        counts);
    Value out = b.create<MoeUnpermuteOp>(loc, act({tokens, hidden}), fc2, router.getProbs(),
                                         permute.getRowIds(), counts);
    out = b.create<ReshapeOp>(loc, act({batch, seq, hidden}), out);
    // The shared expert: a dense MLP on every token, added to the routed
    // output (Megatron's SharedExpertMLP without a gate). It reads h as the
    // dense MLP does, so tensor parallelism splits it as one.
    if (const int64_t shared = m.moe_shared_expert_intermediate_size; shared > 0) {
      Value s1 = linear(p + "mlp.shared_experts.linear_fc1.", h,
                        m.swiglu ? 2 * shared : shared, normal());
      Value s2 = linear(p + "mlp.shared_experts.linear_fc2.",
                        activation(s1, {batch, seq, shared}), hidden, scaledNormal());
      out = b.create<AddOp>(loc, out, s2);
    }
    return out;
  }

  Value layer(int64_t index, Value x) {
    const std::string p = "decoder.layers." + std::to_string(index) + ".";
    int64_t heads = m.num_attention_heads, groups = m.num_query_groups;
    // Attention block.
    Value h = norm(p + "input_layernorm.", x);
    Value qkv = linear(p + "self_attention.linear_qkv.", h,
                       (heads + 2 * groups) * headDim, normal());
    auto split = b.create<SplitQKVOp>(
        loc, act({batch, seq, heads, headDim}), act({batch, seq, groups, headDim}),
        act({batch, seq, groups, headDim}), qkv, /*rope_base=*/FloatAttr(),
        /*rope_scaling_factor=*/FloatAttr());
    Value q = split.getQuery(), k = split.getKey(), v = split.getValue();
    if (m.position_embedding_type == spec::PositionEmbedding::Rope) {
      FloatAttr base = b.getF64FloatAttr(static_cast<double>(m.rotary_base));
      FloatAttr scaling =
          m.use_rope_scaling ? b.getF64FloatAttr(m.rope_scaling_factor) : FloatAttr();
      q = b.create<RopeOp>(loc, q, base, scaling);
      k = b.create<RopeOp>(loc, k, base, scaling);
    }
    Value o = b.create<AttentionOp>(
        loc, q.getType(), attentionLseType(q.getType()), q, k, v, b.getUnitAttr(),
        b.getF64FloatAttr(1.0 / std::sqrt(static_cast<double>(headDim))),
        b.getF64FloatAttr(m.attention_dropout), b.getI64IntegerAttr(nextStream++),
        IntegerAttr()).getResult();
    o = b.create<ReshapeOp>(loc, act({batch, seq, heads * headDim}), o);
    Value proj = linear(p + "self_attention.linear_proj.", o, hidden, scaledNormal());
    x = b.create<AddOp>(loc, x, dropout(proj, m.hidden_dropout));

    // MLP block, or the mixture of experts that replaces it.
    h = norm(p + "pre_mlp_layernorm.", x);
    if (m.isMoeLayer(index))
      return b.create<AddOp>(loc, x, dropout(moe(p, h), m.hidden_dropout));
    int64_t ffn = m.ffn_hidden_size;
    Value fc1 = linear(p + "mlp.linear_fc1.", h, m.swiglu ? 2 * ffn : ffn, normal());
    Value a = activation(fc1, {batch, seq, ffn});
    Value fc2 = linear(p + "mlp.linear_fc2.", a, hidden, scaledNormal());
    return b.create<AddOp>(loc, x, dropout(fc2, m.hidden_dropout));
  }

  const spec::Spec &spec;
  const spec::ModelConfig &m;
  OpBuilder b;
  Location loc;
  func::FuncOp func;
  Type dtype;
  int64_t batch, seq, hidden, headDim;
  int64_t nextStream = 0;
  // Each MoE layer's router losses, in layer order (the returned sums).
  SmallVector<Value> lbTerms, zTerms;
};

} // namespace

OwningOpRef<ModuleOp> importSpec(MLIRContext &context, const spec::Spec &spec) {
  context.loadDialect<MtDialect, func::FuncDialect>();
  return GraphBuilder(context, spec).build();
}

} // namespace mt
