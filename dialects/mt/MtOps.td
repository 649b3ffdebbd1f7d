// Operations of the mt dialect's model-graph level (DESIGN.md, IR level 1).
#ifndef MT_OPS_TD
#define MT_OPS_TD

include "dialects/mt/MtDialect.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "dialects/mt/MtInterfaces.td"

//===----------------------------------------------------------------------===//
// Parameters
//===----------------------------------------------------------------------===//

def Mt_ParamOp : Mt_Op<"param", [Symbol, HasParent<"::mlir::ModuleOp">]> {
  let summary = "a trainable parameter";
  let description = [{
    Declares one trainable tensor of the model: its name (a symbol, spelled as
    Megatron-LM names the parameter), its full logical shape and element type,
    and how it is initialised. `normal` draws from N(0, std^2); `zeros` and
    `ones` are constant and take no std.

    After `mt-shard-tp` the type is this rank's shard. `tp_dim` names the
    dimension split over the `tp_size` tensor-parallel ranks: the logical
    dimension (the type's times `tp_size`) is viewed as
    `[tp_blocks, tp_size, n]` and rank `r` holds `[:, r, :]`. One block is a
    contiguous slice; SwiGLU's FC1 has two (gate and up, each split). Without
    `tp_dim` every tensor-parallel rank holds the whole parameter.

    After `mt-shard-ep` a routed expert's stacked weight `[E, ...]` is this
    expert-parallel rank's experts: `ep_dim` (0) is split over `ep_size`
    ranks, rank `q` holding experts `[q * E / ep_size, (q + 1) * E / ep_size)`.
    The discardable unit attribute `mt.expert` marks every routed-expert
    parameter (at every `ep_size`, also 1): its gradient is reduced over the
    expert data-parallel group. On an `mt.expert` parameter `tp_dim`,
    `tp_size` and `tp_blocks` mean expert tensor parallelism: the split is
    over the `tp_size` expert-tensor-parallel ranks (Megatron-Core's
    `expt_tp` group, `expert_tensor_parallel_size`), not the dense
    tensor-parallel ranks; the first expert matmul `[E, F1, H]` is split on
    dimension 1 (SwiGLU's in 2 blocks), the second `[E, H, F]` on dimension 2.

    ```mlir
    mt.param @"decoder.layers.0.mlp.linear_fc1.weight" : tensor<3072x768xf32>, normal(2.000000e-02)
    mt.param @"decoder.final_layernorm.weight" : tensor<768xf32>, ones
    mt.param @"decoder.layers.0.mlp.linear_fc1.weight" : tensor<1536x768xf32>, normal(2.000000e-02) {tp_blocks = 1 : i64, tp_dim = 0 : i64, tp_size = 2 : i64}
    mt.param @"decoder.layers.0.mlp.experts.linear_fc1.weight" : tensor<4x3072x768xf32>, normal(2.000000e-02) {ep_dim = 0 : i64, ep_size = 2 : i64, mt.expert}
    mt.param @"decoder.layers.0.mlp.experts.linear_fc2.weight" : tensor<4x768x768xf32>, normal(2.000000e-02) {ep_dim = 0 : i64, ep_size = 2 : i64, mt.expert, tp_blocks = 1 : i64, tp_dim = 2 : i64, tp_size = 2 : i64}
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<Mt_FloatTensor>:$type,
                       Mt_InitKind:$init,
                       OptionalAttr<F64Attr>:$std,
                       OptionalAttr<I64Attr>:$tp_dim,
                       OptionalAttr<I64Attr>:$tp_size,
                       OptionalAttr<I64Attr>:$tp_blocks,
                       OptionalAttr<I64Attr>:$ep_dim,
                       OptionalAttr<I64Attr>:$ep_size);
  let assemblyFormat = "$sym_name `:` $type `,` $init (`(` $std^ `)`)? attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::RankedTensorType getTensorType() {
      return ::llvm::cast<::mlir::RankedTensorType>(getType());
    }
    int64_t getNumElements() { return getTensorType().getNumElements(); }
    // The shape of the whole parameter, before tensor- and expert-parallel
    // sharding.
    ::llvm::SmallVector<int64_t> getLogicalShape() {
      ::llvm::SmallVector<int64_t> s(getTensorType().getShape());
      if (getTpDim())
        s[*getTpDim()] *= getTpSize().value_or(1);
      if (getEpDim())
        s[*getEpDim()] *= getEpSize().value_or(1);
      return s;
    }
    // A routed expert's weight (mt-shard-ep marks them at every layout).
    bool isExpert() { return (*this)->hasAttr("mt.expert"); }
  }];
}

def Mt_ParamRefOp : Mt_Op<"param_ref", [Pure,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "reads a parameter into the graph";
  let description = [{
    Produces the value of the `mt.param` named by `name`. The result type must
    equal the parameter's declared type.

    ```mlir
    %w = mt.param_ref @"output_layer.weight" : tensor<50304x768xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$name);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
}

//===----------------------------------------------------------------------===//
// Embeddings and positions
//===----------------------------------------------------------------------===//

def Mt_PositionIdsOp : Mt_Op<"position_ids", [Pure]> {
  let summary = "position of each token in its sequence";
  let description = [{
    A `[batch, seq]` tensor whose row `b` is `0, 1, ..., seq - 1`: the
    indices into a learned position embedding.

    ```mlir
    %pos = mt.position_ids : tensor<4x1024xi32>
    ```
  }];
  let results = (outs Mt_IndexTensor:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Mt_EmbeddingOp : Mt_Op<"embedding", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure]> {
  let summary = "table lookup: one row per index";
  let description = [{
    Gathers row `ids[i...]` of `table` (`[num_rows, dim]`) for each index. The
    result shape is the ids' shape followed by `dim`, in the table's element
    type. Out-of-range ids are undefined behaviour at run time; the data
    loader guarantees `id < vocab_size`.

    With `vocab_parallel` the table is this tensor-parallel rank's slice of
    the vocabulary (rows `[r * num_rows, (r + 1) * num_rows)` on rank `r`):
    ids outside it give zero rows, and a `mt.tp_all_reduce` of the results
    makes the whole embedding (Megatron's VocabParallelEmbedding).

    ```mlir
    %h = mt.embedding %table, %ids : (tensor<50304x768xf32>, tensor<4x1024xi32>) -> tensor<4x1024x768xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$table, Mt_IndexTensor:$ids,
                       UnitAttr:$vocab_parallel);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$table `,` $ids attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Normalisation
//===----------------------------------------------------------------------===//

def Mt_LayerNormOp : Mt_Op<"layer_norm", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure,
    AllTypesMatch<["input", "result"]>, AllTypesMatch<["weight", "bias"]>]> {
  let summary = "layer normalisation over the last dimension";
  let description = [{
    `y = (x - mean(x)) / sqrt(var(x) + epsilon) * weight + bias`, with mean and
    (biased) variance over the last dimension; `weight` and `bias` have that
    dimension's size. With `zero_centered_gamma` (Megatron's
    `--apply-layernorm-1p`) the weight is applied as `1 + weight`, computed in
    fp32 as TransformerEngine does.

    ```mlir
    %y = mt.layer_norm %x, %w, %b {epsilon = 1.000000e-05 : f64} : tensor<4x1024x768xf32>, tensor<768xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$weight,
                       Mt_FloatTensor:$bias, F64Attr:$epsilon,
                       UnitAttr:$zero_centered_gamma);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$input `,` $weight `,` $bias attr-dict `:` type($input) `,` type($weight)";
  let hasVerifier = 1;
}

def Mt_RMSNormOp : Mt_Op<"rms_norm", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "root-mean-square normalisation over the last dimension";
  let description = [{
    `y = x / sqrt(mean(x^2) + epsilon) * weight`, over the last dimension;
    `1 + weight` with `zero_centered_gamma`.

    ```mlir
    %y = mt.rms_norm %x, %w {epsilon = 1.000000e-05 : f64} : tensor<2x2048x4096xbf16>, tensor<4096xbf16>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$weight, F64Attr:$epsilon,
                       UnitAttr:$zero_centered_gamma);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$input `,` $weight attr-dict `:` type($input) `,` type($weight)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Linear algebra and elementwise
//===----------------------------------------------------------------------===//

def Mt_MatmulOp : Mt_Op<"matmul", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure]> {
  let summary = "a linear layer's product: x times the transposed weight";
  let description = [{
    `result[..., n] = sum_k input[..., k] * weight[n, k]`. The weight is
    stored `[out_features, in_features]`, as Megatron-LM and PyTorch store
    linear weights, so the same op serves every linear layer and the output
    layer (whose weight may be the word-embedding table). With 16-bit input
    and weight the result may be f32, and with any the result may be f64:
    the product is then computed in that type and not rounded (the MoE
    router's logits with `moe_router_dtype` fp32 or fp64, whose backward
    reads the wide gradient: `mt.matmul_input_grad` and
    `mt.matmul_weight_grad` take it as it is, and round their results
    once).

    ```mlir
    %y = mt.matmul %x, %w : (tensor<4x1024x768xf32>, tensor<2304x768xf32>) -> tensor<4x1024x2304xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$weight);
  let results = (outs Mt_WideFloatTensor:$result);
  let assemblyFormat = "$input `,` $weight attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mt_BiasAddOp : Mt_Op<"bias_add", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "adds a bias along the last dimension";
  let description = [{
    `result[..., n] = input[..., n] + bias[n]`.

    ```mlir
    %y = mt.bias_add %x, %b : tensor<4x1024x2304xf32>, tensor<2304xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$bias);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$input `,` $bias attr-dict `:` type($input) `,` type($bias)";
  let hasVerifier = 1;
}

def Mt_AddOp : Mt_Op<"add", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure, Commutative, SameOperandsAndResultType]> {
  let summary = "elementwise sum (residual connections)";
  let description = [{
    ```mlir
    %r = mt.add %a, %b : tensor<4x1024x768xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$lhs, Mt_FloatTensor:$rhs);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def Mt_GeluOp : Mt_Op<"gelu", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure, SameOperandsAndResultType]> {
  let summary = "Gaussian error linear unit";
  let description = [{
    `tanh`: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, the form
    Megatron-LM's fused bias-GeLU computes; `erf`: `0.5 x (1 + erf(x / sqrt 2))`.

    ```mlir
    %y = mt.gelu %x tanh : tensor<4x1024x3072xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_GeluApproximation:$approximation);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$input $approximation attr-dict `:` type($result)";
}

def Mt_SwiGLUOp : Mt_Op<"swiglu", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure]> {
  let summary = "SiLU-gated linear unit over two halves of the last dimension";
  let description = [{
    Splits the last dimension (size `2f`) into `a = input[..., :f]` and
    `b = input[..., f:]` and returns `silu(a) * b`, as Megatron-LM's `--swiglu`
    does with the fused FC1 output.

    ```mlir
    %y = mt.swiglu %x : (tensor<2x2048x28672xbf16>) -> tensor<2x2048x14336xbf16>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mt_DropoutOp : Mt_Op<"dropout", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, SameOperandsAndResultType]> {
  let summary = "zeroes elements with probability `rate`, scales the rest";
  let description = [{
    Keeps each element with probability `1 - rate` and scales kept elements by
    `1 / (1 - rate)`. The mask comes from a counter-based generator keyed by
    the run's seed, the iteration, the micro-batch and `stream`, a number
    unique to this op, so recomputation reproduces the same mask.

    With `tp_shard_dim` the input is this tensor-parallel rank's slice along
    that dimension (sequence parallelism) of a tensor split evenly over the
    ranks, and the mask is the same slice of the whole tensor's mask, so
    sharded runs drop exactly what a single device drops.

    ```mlir
    %y = mt.dropout %x {rate = 1.000000e-01 : f64, stream = 3 : i64} : tensor<4x1024x768xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, F64Attr:$rate, I64Attr:$stream,
                       OptionalAttr<I64Attr>:$tp_shard_dim);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Mt_ReshapeOp : Mt_Op<"reshape", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure]> {
  let summary = "the same elements in another shape";
  let description = [{
    Row-major reinterpretation; element count and type are unchanged.

    ```mlir
    %y = mt.reshape %x : (tensor<4x1024x12x64xf32>) -> tensor<4x1024x768xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

def Mt_SplitQKVOp : Mt_Op<"split_qkv", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure]> {
  let summary = "splits the fused QKV projection into heads";
  let description = [{
    The fused QKV linear produces, per token, `num_query_groups` groups laid
    out as Megatron-LM lays them out: each group holds its
    `num_heads / num_query_groups` query heads, then one key head, then one
    value head, each `head_dim` wide. This op returns queries
    `[batch, seq, num_heads, head_dim]` and keys and values
    `[batch, seq, num_query_groups, head_dim]`. Keeping groups contiguous is
    what lets tensor parallelism split QKV by query group.

    With `rope_base`, queries and keys come out rotated: the result is what
    `mt.rope` with that base computes on each of them, so the unrotated
    queries and keys never exist (`mt-fuse` sets it when each of them has
    one user, an `mt.rope`; `rope_scaling_factor` is then that rope's
    `scaling_factor`). Values are not rotated. The head_dim must then
    be even.

    ```mlir
    %q, %k, %v = mt.split_qkv %qkv : (tensor<4x1024x2304xf32>) -> (tensor<4x1024x12x64xf32>, tensor<4x1024x12x64xf32>, tensor<4x1024x12x64xf32>)
    %qr, %kr, %v2 = mt.split_qkv %qkv2 {rope_base = 5.000000e+05 : f64} : (tensor<2x2048x6144xbf16>) -> (tensor<2x2048x32x128xbf16>, tensor<2x2048x8x128xbf16>, tensor<2x2048x8x128xbf16>)
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, OptionalAttr<F64Attr>:$rope_base,
                       OptionalAttr<F64Attr>:$rope_scaling_factor);
  let results = (outs Mt_FloatTensor:$query, Mt_FloatTensor:$key, Mt_FloatTensor:$value);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mt_RopeOp : Mt_Op<"rope", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure, SameOperandsAndResultType]> {
  let summary = "rotary position embedding";
  let description = [{
    Rotates pairs `(x[i], x[i + d/2])` of each head (`[batch, seq, heads, d]`)
    at position `p` by angle `p * base^(-2i/d)`, the non-interleaved form
    Megatron-LM uses. With `scaling_factor` the frequencies `base^(-2i/d)` are
    first scaled as Llama 3.1 scales them (Megatron's `--use-rope-scaling`,
    low/high frequency factors 1 and 4, 8192 original positions): divided by
    the factor where the wavelength exceeds 8192, kept below 2048, and
    interpolated between.

    ```mlir
    %q2 = mt.rope %q {base = 5.000000e+05 : f64} : tensor<2x2048x32x128xbf16>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, F64Attr:$base,
                       OptionalAttr<F64Attr>:$scaling_factor);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Mt_AttentionOp : Mt_Op<"attention", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure,
    AllTypesMatch<["query", "result"]>, AllTypesMatch<["key", "value"]>,
    TypesMatchWith<"lse is f32 [batch, heads, seq] of the query", "query", "lse",
                   "::mt::attentionLseType($_self)">]> {
  let summary = "scaled dot-product attention with grouped keys and values";
  let description = [{
    For each head `h` of `query` (`[batch, seq, heads, d]`), attends over the
    keys and values of group `h / (heads / groups)` (`[batch, seq, groups, d]`):
    `softmax(scale * q k^T + causal mask) v`, then dropout of rate
    `dropout_rate` on the attention probabilities (RNG stream `stream`). The
    result has the query's shape. With `tp_shard_dim` (2: heads) the heads
    are this tensor-parallel rank's share of the model's heads, and the
    dropout mask is that share of the whole model's mask.

    The second result, `lse` (f32 `[batch, heads, seq]`), is each query
    row's log-sum-exp of its scaled, masked scores (natural log, before
    dropout). `mt.attention_grad` takes it and the output back, so the
    backward rebuilds the probabilities as `exp(scale * q k^T - lse)` without
    running the forward again. It costs `2 / head_dim` of the output's bytes
    in 16-bit training.

    ```mlir
    %o, %lse = mt.attention %q, %k, %v {causal, scale = 1.250000e-01 : f64, dropout_rate = 1.000000e-01 : f64, stream = 1 : i64} : tensor<4x1024x12x64xf32>, tensor<4x1024x12x64xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$query, Mt_FloatTensor:$key,
                       Mt_FloatTensor:$value, UnitAttr:$causal, F64Attr:$scale,
                       F64Attr:$dropout_rate, I64Attr:$stream,
                       OptionalAttr<I64Attr>:$tp_shard_dim);
  let results = (outs Mt_FloatTensor:$result, StaticShapeTensorOf<[F32]>:$lse);
  let assemblyFormat = "$query `,` $key `,` $value attr-dict `:` type($query) `,` type($key)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Mixture of experts
//===----------------------------------------------------------------------===//

// The router's attributes, shared by mt.moe_router and mt.moe_router_grad
// (whose backward recomputes the forward's choices from them).
defvar Mt_MoeRouterAttrs = (ins I64Attr:$topk, Mt_MoeScoreFunction:$score_function,
    UnitAttr:$pre_softmax, F64Attr:$scaling_factor,
    Mt_MoeLoadBalancing:$load_balancing, F64Attr:$aux_loss_coeff,
    F64Attr:$z_loss_coeff, I64Attr:$capacity, Mt_MoeDropPolicy:$drop_policy,
    UnitAttr:$pad_to_capacity, I64Attr:$seq_length, Mt_MoeRouterDtype:$router_dtype,
    OptionalAttr<StrAttr>:$count_group);

def Mt_MoeRouterOp : Mt_Op<"moe_router", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure]> {
  let summary = "top-k expert choice of each token, with the load-balancing and z losses";
  let description = [{
    Megatron-Core's `TopKRouter.routing` on the router logits `[T, E]` of one
    micro-batch's `T = batch * seq_length` tokens, token `t = b * seq_length
    + s` (mt's `[batch, seq]` order), over `E` experts:

    - **Scores and choice.** `softmax` without `pre_softmax`: the `topk`
      largest logits of each token are chosen and the routing weights are
      the softmax over those `topk` logits. With `pre_softmax`: the softmax
      over all `E` logits, then its `topk` largest. `sigmoid`: the
      sigmoid of the logits, its `topk` largest, normalised to sum 1 (plus
      `1e-20`) when `topk > 1`. A positive `scaling_factor` multiplies the
      weights. Ties go to the lower expert index.
    - **Capacity.** With `capacity` C > 0 (tokens per expert; 0: no
      capacity, nothing is dropped) and C below T, each expert keeps C of
      the tokens routed to it: `probs` policy the C of the largest routing
      weight, `position` policy the first C in Megatron's token order
      (`[seq, batch]`: by position `s`, then `b`; equal weights are also
      taken in that order); the others are dropped for that expert. With
      `pad_to_capacity` C is at most T.
    - **Results.** `probs` (f32 `[T, E]`): the routing weight of each
      chosen and kept expert, 0 elsewhere; `routing_map` (i32 `[T, E]`): 1
      where the token goes to the expert. `aux_loss` and `z_loss` (f32
      scalars) are the values Megatron's tracker records for this layer,
      without their coefficients, and 0 when off:
      - `aux_loss` (`load_balancing` `aux_loss` and `aux_loss_coeff` > 0,
        Switch Transformer's loss): `E / (topk * T^2) * sum_e (sum_t
        scores[t, e]) * (sum_t top[t, e])`, where `scores` is the softmax
        (or the normalised sigmoid) over all `E` logits and `top` marks
        each token's `topk` largest scores, before any capacity drop;
        `seq_aux_loss`: the same per sequence (T replaced by
        `seq_length`), averaged over the batch.
      - `z_loss` (`z_loss_coeff` > 0, ST-MoE): the mean over tokens of
        `logsumexp(logits[t, :])^2`.

    Both losses reach the gradient through `mt.moe_router_grad`, scaled as
    Megatron's `MoEAuxLossAutoScaler` scales them, not through the result
    values, which are for logging. `router_dtype` is Megatron's
    `--moe-router-dtype`: `none` rounds scores and weights to the logits'
    element type as Megatron's `type_as` does, `fp32` computes and keeps
    them in f32, `fp64` computes them in f64 from f64 logits, and only
    it takes them (the weights are stored in f32). `seq_length` divides T.

    `count_group` `"tp"` (set by `mt-shard-tp` under sequence parallelism,
    where T is this rank's sequence shard): the token counts of the
    load-balancing loss (per expert, and the token total) are summed over
    the tensor-parallel group before the loss formula, each rank using its
    own scores, as Megatron's router reduces them over its tp_cp group;
    `z_loss_coeff` is then the model's coefficient divided by the
    tensor-parallel size (Megatron's `apply_z_loss`).

    ```mlir
    %probs, %map, %aux, %z = mt.moe_router %logits softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.000000e-02 : f64, capacity = 0 : i64, scaling_factor = 0.000000e+00 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 1.000000e-03 : f64} : (tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
    ```
  }];
  let arguments = !con((ins Mt_WideFloatTensor:$logits), Mt_MoeRouterAttrs);
  let results = (outs Mt_F32Tensor:$probs, Mt_I32Tensor:$routing_map,
                      Mt_ScalarF32:$aux_loss, Mt_ScalarF32:$z_loss);
  let assemblyFormat = "$logits $score_function $load_balancing `drop` $drop_policy `dtype` $router_dtype attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mt_MoePermuteOp : Mt_Op<"moe_permute", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure]> {
  let summary = "gathers each expert's tokens into consecutive rows";
  let description = [{
    From tokens `input` `[T, H]` and `routing_map` `[T, E]`: `result`
    `[N, H]` holds, expert by expert, the rows of the tokens routed to it,
    tokens ascending within an expert (Megatron's `permute` by the routing
    map); `row_ids` `[N]` names each row's source token (-1 for an unused
    or padding row, which is zero); `tokens_per_expert` `[E]` counts each
    expert's rows. `N` is static: `T * topk` without capacity;
    `E * capacity` with `pad_to_capacity` (expert e owns rows
    `[e * capacity, (e + 1) * capacity)`, its tokens first, then padding,
    and `tokens_per_expert` is `capacity` for each); `min(T * topk, E *
    capacity)` with a capacity and no padding, the rows past the last
    expert's unused.

    ```mlir
    %y, %rows, %counts = mt.moe_permute %x, %map {capacity = 0 : i64} : (tensor<64x16xf32>, tensor<64x4xi32>) -> (tensor<128x16xf32>, tensor<128xi32>, tensor<4xi32>)
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_I32Tensor:$routing_map,
                       I64Attr:$capacity, UnitAttr:$pad_to_capacity);
  let results = (outs Mt_FloatTensor:$result, Mt_I32Tensor:$row_ids,
                      Mt_I32Tensor:$tokens_per_expert);
  let assemblyFormat = "$input `,` $routing_map attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mt_MoeGroupedMatmulOp : Mt_Op<"moe_grouped_matmul", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure]> {
  let summary = "each expert's rows times that expert's weight";
  let description = [{
    The rows of `input` `[N, K]` form consecutive segments, expert by
    expert, of `tokens_per_expert[e]` rows each; segment e is multiplied by
    the transpose of `weight[e]` (`[E, M, K]`: the experts' `[out, in]`
    weights stacked on dimension 0), giving `result` `[N, M]`. Rows past
    the last segment are zero.

    ```mlir
    %h = mt.moe_grouped_matmul %y, %w1, %counts : (tensor<128x16xf32>, tensor<4x64x16xf32>, tensor<4xi32>) -> tensor<128x64xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$weight,
                       Mt_I32Tensor:$tokens_per_expert);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$input `,` $weight `,` $tokens_per_expert attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mt_MoeUnpermuteOp : Mt_Op<"moe_unpermute", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure]> {
  let summary = "combines the experts' rows back into tokens, weighted by the router";
  let description = [{
    `result[t] = sum over rows r with row_ids[r] = t of probs[t, e(r)] *
    input[r]`, where `e(r)` is the expert whose segment (by
    `tokens_per_expert`) holds row r; accumulated in f32 and rounded once
    to the input's element type. A token whose experts all dropped it gets
    zeros.

    ```mlir
    %out = mt.moe_unpermute %h2, %probs, %rows, %counts : (tensor<128x16xf32>, tensor<64x4xf32>, tensor<128xi32>, tensor<4xi32>) -> tensor<64x16xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_F32Tensor:$probs,
                       Mt_I32Tensor:$row_ids, Mt_I32Tensor:$tokens_per_expert);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$input `,` $probs `,` $row_ids `,` $tokens_per_expert attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Loss
//===----------------------------------------------------------------------===//

def Mt_CrossEntropyOp : Mt_Op<"cross_entropy", [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>, Pure]> {
  let summary = "mean next-token cross-entropy";
  let description = [{
    `mean over tokens of (logsumexp(logits[t, :]) - logits[t, label[t]])`,
    computed in f32 whatever the logits' type. Logits are over the padded
    vocabulary; labels are below the unpadded vocabulary size. With
    `vocab_parallel` the logits are this tensor-parallel rank's vocabulary
    slice (as for `mt.embedding`); maxima, sums and the label's logit are
    reduced over the tensor-parallel group, so whole logits never exist
    (Megatron's vocab-parallel cross-entropy).

    ```mlir
    %loss = mt.cross_entropy %logits, %labels : (tensor<4x1024x50304xf32>, tensor<4x1024xi32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$logits, Mt_IndexTensor:$labels,
                       UnitAttr:$vocab_parallel);
  let results = (outs Mt_ScalarF32:$loss);
  let assemblyFormat = "$logits `,` $labels attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

include "dialects/mt/MtParallelOps.td"
include "dialects/mt/MtTrainOps.td"
include "dialects/mt/MtKernelOps.td"

#endif // MT_OPS_TD
