// Operations of the training-step level (DESIGN.md, IR level 2): gradients
// (`mt-autodiff`) and the optimizer (`mt-optimizer`). Included by MtOps.td.
#ifndef MT_TRAIN_OPS_TD
#define MT_TRAIN_OPS_TD

// Ops that add into a parameter's gradient buffer write to this resource.
def Mt_GradBuffers : Resource<"::mt::GradBuffersResource">;
// mt.adamw updates weights and optimizer state in place.
def Mt_ParamState : Resource<"::mt::ParamStateResource">;

//===----------------------------------------------------------------------===//
// Backward
//===----------------------------------------------------------------------===//

def Mt_GradSeedOp : Mt_Op<"grad_seed", [MemoryEffects<[MemRead<Mt_ParamState>]>]> {
  let summary = "the gradient of the loss with respect to itself";
  let description = [{
    Starts backpropagation: `scale` times the run's loss scale (1 unless fp16
    dynamic loss scaling is on). `scale` is `1 / num_micro_batches`, so the
    gradients accumulated over a step's micro-batches are those of the mean
    loss, as in Megatron-LM.

    ```mlir
    %seed = mt.grad_seed {scale = 2.500000e-01 : f64} : tensor<f32>
    ```
  }];
  let arguments = (ins F64Attr:$scale);
  let results = (outs Mt_ScalarF32:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
}

def Mt_EmbeddingGradOp : Mt_Op<"embedding_grad", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    MemoryEffects<[MemWrite<Mt_GradBuffers>]>]> {
  let summary = "adds the embedding's gradient into its table's gradient";
  let description = [{
    `grad(table)[ids[i], :] += grad[i, :]` for every position `i`; with
    `vocab_parallel`, only for ids in this rank's vocabulary slice.

    ```mlir
    mt.embedding_grad %dy, %tokens into @embedding.word_embeddings.weight : tensor<4x128x64xf32>, tensor<4x128xi32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$grad, Mt_IndexTensor:$ids,
                       FlatSymbolRefAttr:$param, UnitAttr:$vocab_parallel);
  let assemblyFormat = "$grad `,` $ids `into` $param attr-dict `:` type($grad) `,` type($ids)";
  let hasVerifier = 1;
}

def Mt_MatmulInputGradOp : Mt_Op<"matmul_input_grad", [Pure]> {
  let summary = "gradient of a linear layer's input: dy times the weight";
  let description = [{
    `dx[..., in] = dy[..., out] * w[out, in]`.

    ```mlir
    %dx = mt.matmul_input_grad %dy, %w : (tensor<4x128x256xf32>, tensor<256x64xf32>) -> tensor<4x128x64xf32>
    ```
  }];
  let arguments = (ins Mt_WideFloatTensor:$grad, Mt_FloatTensor:$weight);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$grad `,` $weight attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mt_MatmulWeightGradOp : Mt_Op<"matmul_weight_grad", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    MemoryEffects<[MemWrite<Mt_GradBuffers>]>]> {
  let summary = "adds a linear layer's weight gradient into the parameter's gradient";
  let description = [{
    `grad(param)[out, in] += sum over rows of dy[r, out] * x[r, in]`.

    ```mlir
    mt.matmul_weight_grad %dy, %x into @decoder.layers.0.mlp.linear_fc1.weight : tensor<4x128x256xf32>, tensor<4x128x64xf32>
    ```
  }];
  let arguments = (ins Mt_WideFloatTensor:$grad, Mt_FloatTensor:$input,
                       FlatSymbolRefAttr:$param);
  let assemblyFormat = "$grad `,` $input `into` $param attr-dict `:` type($grad) `,` type($input)";
  let hasVerifier = 1;
}

def Mt_BiasGradOp : Mt_Op<"bias_grad", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    MemoryEffects<[MemWrite<Mt_GradBuffers>]>]> {
  let summary = "adds the column sums of dy into a bias's gradient";
  let description = [{
    ```mlir
    mt.bias_grad %dy into @decoder.layers.0.mlp.linear_fc1.bias : tensor<4x128x256xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$grad, FlatSymbolRefAttr:$param);
  let assemblyFormat = "$grad `into` $param attr-dict `:` type($grad)";
  let hasVerifier = 1;
}

def Mt_LayerNormGradOp : Mt_Op<"layer_norm_grad", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    MemoryEffects<[MemWrite<Mt_GradBuffers>]>,
    AllTypesMatch<["grad", "input", "result"]>]> {
  let summary = "LayerNorm backward: input gradient, and weight and bias gradients added in place";
  let description = [{
    Recomputes the row statistics from `input` (nothing else is saved by the
    forward), returns the input's gradient and adds the weight's and bias's
    gradients into the parameters `weight_param` and `bias_param`.

    ```mlir
    %dx = mt.layer_norm_grad %dy, %x, %w into @l.weight, @l.bias {epsilon = 1.000000e-05 : f64} : tensor<4x128x64xf32>, tensor<64xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$grad, Mt_FloatTensor:$input,
                       Mt_FloatTensor:$weight, FlatSymbolRefAttr:$weight_param,
                       FlatSymbolRefAttr:$bias_param, F64Attr:$epsilon,
                       UnitAttr:$zero_centered_gamma);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$grad `,` $input `,` $weight `into` $weight_param `,` $bias_param attr-dict `:` type($grad) `,` type($weight)";
  let hasVerifier = 1;
}

def Mt_RMSNormGradOp : Mt_Op<"rms_norm_grad", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    MemoryEffects<[MemWrite<Mt_GradBuffers>]>,
    AllTypesMatch<["grad", "input", "result"]>]> {
  let summary = "RMSNorm backward: input gradient, and the weight gradient added in place";
  let description = [{
    ```mlir
    %dx = mt.rms_norm_grad %dy, %x, %w into @l.weight {epsilon = 1.000000e-05 : f64} : tensor<4x128x64xf32>, tensor<64xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$grad, Mt_FloatTensor:$input,
                       Mt_FloatTensor:$weight, FlatSymbolRefAttr:$weight_param,
                       F64Attr:$epsilon, UnitAttr:$zero_centered_gamma);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$grad `,` $input `,` $weight `into` $weight_param attr-dict `:` type($grad) `,` type($weight)";
  let hasVerifier = 1;
}

def Mt_GeluGradOp : Mt_Op<"gelu_grad", [Pure, SameOperandsAndResultType]> {
  let summary = "GeLU backward";
  let description = [{
    `dx = dy * gelu'(x)` for the same formula as the forward.

    ```mlir
    %dx = mt.gelu_grad %dy, %x tanh : tensor<4x128x256xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$grad, Mt_FloatTensor:$input,
                       Mt_GeluApproximation:$approximation);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$grad `,` $input $approximation attr-dict `:` type($result)";
}

def Mt_SwiGLUGradOp : Mt_Op<"swiglu_grad", [Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "SwiGLU backward";
  let description = [{
    `dy` has the forward result's shape (`[..., f]`); the result has the
    input's (`[..., 2f]`).

    ```mlir
    %dx = mt.swiglu_grad %dy, %x : (tensor<4x128x256xf32>, tensor<4x128x512xf32>) -> tensor<4x128x512xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$grad, Mt_FloatTensor:$input);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$grad `,` $input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mt_SplitQKVGradOp : Mt_Op<"split_qkv_grad", [Pure]> {
  let summary = "gathers query, key and value gradients back into the fused QKV layout";
  let description = [{
    The inverse of `mt.split_qkv`'s layout. With `rope_base` (the VJP of
    an `mt.split_qkv` with it), the query and key gradients are first rotated
    back, as `mt.rope_grad` with that base does, so their unrotated form
    never exists. The head_dim must then be even.

    ```mlir
    %dqkv = mt.split_qkv_grad %dq, %dk, %dv : (tensor<4x128x4x16xf32>, tensor<4x128x4x16xf32>, tensor<4x128x4x16xf32>) -> tensor<4x128x192xf32>
    %dqkv2 = mt.split_qkv_grad %dq2, %dk2, %dv2 {rope_base = 1.000000e+04 : f64} : (tensor<4x128x4x16xf32>, tensor<4x128x2x16xf32>, tensor<4x128x2x16xf32>) -> tensor<4x128x128xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$query_grad, Mt_FloatTensor:$key_grad,
                       Mt_FloatTensor:$value_grad, OptionalAttr<F64Attr>:$rope_base,
                       OptionalAttr<F64Attr>:$rope_scaling_factor);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$query_grad `,` $key_grad `,` $value_grad attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mt_RopeGradOp : Mt_Op<"rope_grad", [Pure, SameOperandsAndResultType]> {
  let summary = "rotary embedding backward: the rotation by the opposite angle";
  let description = [{
    ```mlir
    %dq = mt.rope_grad %dq2 {base = 1.000000e+04 : f64} : tensor<4x128x4x16xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$grad, F64Attr:$base,
                       OptionalAttr<F64Attr>:$scaling_factor);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$grad attr-dict `:` type($result)";
}

def Mt_AttentionGradOp : Mt_Op<"attention_grad", [Pure,
    AllTypesMatch<["grad", "query", "out", "query_grad"]>,
    AllTypesMatch<["key", "value", "key_grad", "value_grad"]>,
    TypesMatchWith<"lse is f32 [batch, heads, seq] of the query", "query", "lse",
                   "::mt::attentionLseType($_self)">]> {
  let summary = "attention backward from the forward's output and log-sum-exp";
  let description = [{
    Returns the gradients of query, key and value. `out` and `lse` are the
    forward `mt.attention`'s results. Nothing of size `seq x seq` is kept
    from the forward: the probabilities are rebuilt as
    `exp(scale * q k^T - lse)` (the dropout mask from the same RNG `stream`),
    and the softmax backward's row sums `sum_j dP_ij P_ij` are
    `dout_i . out_i`, so the forward is not run again.

    ```mlir
    %dq, %dk, %dv = mt.attention_grad %do, %q, %k, %v, %o, %lse {causal, dropout_rate = 1.000000e-01 : f64, scale = 2.500000e-01 : f64, stream = 1 : i64} : tensor<4x128x4x16xf32>, tensor<4x128x4x16xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$grad, Mt_FloatTensor:$query,
                       Mt_FloatTensor:$key, Mt_FloatTensor:$value,
                       Mt_FloatTensor:$out, StaticShapeTensorOf<[F32]>:$lse,
                       UnitAttr:$causal, F64Attr:$scale, F64Attr:$dropout_rate,
                       I64Attr:$stream, OptionalAttr<I64Attr>:$tp_shard_dim);
  let results = (outs Mt_FloatTensor:$query_grad, Mt_FloatTensor:$key_grad,
                      Mt_FloatTensor:$value_grad);
  let assemblyFormat = "$grad `,` $query `,` $key `,` $value `,` $out `,` $lse attr-dict `:` type($query) `,` type($key)";
}

def Mt_CrossEntropyGradOp : Mt_Op<"cross_entropy_grad", [Pure,
    AllTypesMatch<["logits", "result"]>]> {
  let summary = "gradient of the mean cross-entropy with respect to the logits";
  let description = [{
    `dlogits[t, :] = dloss * (softmax(logits[t, :]) - onehot(labels[t])) / tokens`.
    With `vocab_parallel`, over this rank's vocabulary slice, the softmax's
    maximum and sum reduced over the tensor-parallel group.

    ```mlir
    %dlogits = mt.cross_entropy_grad %logits, %labels, %dloss : (tensor<4x128x50304xf32>, tensor<4x128xi32>, tensor<f32>) -> tensor<4x128x50304xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$logits, Mt_IndexTensor:$labels,
                       Mt_ScalarF32:$loss_grad, UnitAttr:$vocab_parallel);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$logits `,` $labels `,` $loss_grad attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Mixture of experts (backward)
//===----------------------------------------------------------------------===//

def Mt_MoeRouterGradOp : Mt_Op<"moe_router_grad", [Pure,
    AllTypesMatch<["logits", "result"]>]> {
  let summary = "router backward: the routing weights' gradient plus the auxiliary losses'";
  let description = [{
    The gradient of the router logits, with the same attributes as the
    forward `mt.moe_router` whose `logits`, `probs` and `routing_map` it
    reads. It is the sum of:

    - the gradient `dprobs` (f32 `[T, E]`) carried back through the
      routing weights of the chosen and kept experts (the choice and the
      capacity drops are constants, as in Megatron);
    - when the load-balancing loss is on, `scale * aux_loss_coeff` times
      the gradient of `aux_loss` through the scores (the token counts are
      constants);
    - when the z-loss is on, `scale * z_loss_coeff` times the gradient of
      `z_loss`.

    `scale` is the value of the step's `mt.grad_seed`: Megatron's
    `MoEAuxLossAutoScaler` gives each auxiliary loss (with its coefficient)
    the gradient `main_loss_backward_scale`, which `forward_step` sets to
    the loss scale over the micro-batch count, and with
    `--calculate-per-token-loss` to the loss scale alone with the loss
    multiplied by the micro-batch's tokens, the whole gradient then
    divided by the global batch's tokens. Both are the gradient seed's
    value (mt-autodiff's seed is `1 / num_micro_batches`, or the
    micro-batch's tokens times dp over the global batch's, times the loss
    scale), the data-parallel mean being applied to every gradient alike.

    ```mlir
    %dlogits = mt.moe_router_grad %dprobs, %logits, %probs, %map, %seed softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.000000e-02 : f64, capacity = 0 : i64, scaling_factor = 0.000000e+00 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 1.000000e-03 : f64} : (tensor<64x4xf32>, tensor<64x4xf32>, tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>) -> tensor<64x4xf32>
    ```
  }];
  let arguments = !con((ins Mt_F32Tensor:$grad, Mt_WideFloatTensor:$logits, Mt_F32Tensor:$probs,
                            Mt_I32Tensor:$routing_map, Mt_ScalarF32:$scale),
                       Mt_MoeRouterAttrs);
  let results = (outs Mt_WideFloatTensor:$result);
  let assemblyFormat = "$grad `,` $logits `,` $probs `,` $routing_map `,` $scale $score_function $load_balancing `drop` $drop_policy `dtype` $router_dtype attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mt_MoePermuteGradOp : Mt_Op<"moe_permute_grad", [Pure]> {
  let summary = "adds each permuted row's gradient back onto its token";
  let description = [{
    `result[t] = sum over rows r with row_ids[r] = t of grad[r]` (rows
    with -1 add nothing), accumulated in f32 and rounded once to the
    gradient's element type: the backward of `mt.moe_permute`.

    ```mlir
    %dx = mt.moe_permute_grad %dy, %rows : (tensor<128x16xf32>, tensor<128xi32>) -> tensor<64x16xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$grad, Mt_I32Tensor:$row_ids);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$grad `,` $row_ids attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mt_MoeGroupedMatmulInputGradOp : Mt_Op<"moe_grouped_matmul_input_grad", [Pure]> {
  let summary = "gradient of a grouped matmul's input: each segment's dy times its expert's weight";
  let description = [{
    `result[r, k] = sum_m grad[r, m] * weight[e(r), m, k]` for the rows of
    each expert's segment (by `tokens_per_expert`); rows past the last
    segment are zero.

    ```mlir
    %dy = mt.moe_grouped_matmul_input_grad %dh, %w1, %counts : (tensor<128x64xf32>, tensor<4x64x16xf32>, tensor<4xi32>) -> tensor<128x16xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$grad, Mt_FloatTensor:$weight,
                       Mt_I32Tensor:$tokens_per_expert);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$grad `,` $weight `,` $tokens_per_expert attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mt_MoeGroupedMatmulWeightGradOp : Mt_Op<"moe_grouped_matmul_weight_grad", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    MemoryEffects<[MemWrite<Mt_GradBuffers>]>]> {
  let summary = "adds each expert's weight gradient into the stacked parameter's gradient";
  let description = [{
    `grad(param)[e, m, k] += sum over the rows r of expert e's segment of
    grad[r, m] * input[r, k]`; an expert with no rows adds nothing.

    ```mlir
    mt.moe_grouped_matmul_weight_grad %dh, %y, %counts into @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<128x64xf32>, tensor<128x16xf32>, tensor<4xi32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$grad, Mt_FloatTensor:$input,
                       Mt_I32Tensor:$tokens_per_expert, FlatSymbolRefAttr:$param);
  let assemblyFormat = "$grad `,` $input `,` $tokens_per_expert `into` $param attr-dict `:` type($grad) `,` type($input) `,` type($tokens_per_expert)";
  let hasVerifier = 1;
}

def Mt_MoeUnpermuteGradOp : Mt_Op<"moe_unpermute_grad", [Pure,
    AllTypesMatch<["input", "input_grad"]>, AllTypesMatch<["probs", "probs_grad"]>]> {
  let summary = "unpermute backward: the rows' gradient and the routing weights'";
  let description = [{
    The backward of `mt.moe_unpermute` (`input` and `probs` are its
    operands): `input_grad[r] = probs[t, e(r)] * grad[t]` for each row r
    of token `t = row_ids[r]` (0 for an unused row), in the input's type;
    `probs_grad[t, e(r)] = dot(input[r], grad[t])` in f32, 0 where no row
    goes.

    ```mlir
    %dh2, %dprobs = mt.moe_unpermute_grad %dout, %h2, %probs, %rows, %counts : (tensor<64x16xf32>, tensor<128x16xf32>, tensor<64x4xf32>, tensor<128xi32>, tensor<4xi32>) -> (tensor<128x16xf32>, tensor<64x4xf32>)
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$grad, Mt_FloatTensor:$input, Mt_F32Tensor:$probs,
                       Mt_I32Tensor:$row_ids, Mt_I32Tensor:$tokens_per_expert);
  let results = (outs Mt_FloatTensor:$input_grad, Mt_F32Tensor:$probs_grad);
  let assemblyFormat = "$grad `,` $input `,` $probs `,` $row_ids `,` $tokens_per_expert attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Optimizer
//===----------------------------------------------------------------------===//

def Mt_LrStyle : I32EnumAttr<"LrStyle", "learning-rate decay after warm-up", [
    I32EnumAttrCase<"Constant", 0, "constant">,
    I32EnumAttrCase<"Linear", 1, "linear">,
    I32EnumAttrCase<"Cosine", 2, "cosine">,
    I32EnumAttrCase<"InverseSquareRoot", 3, "inverse_square_root">,
    I32EnumAttrCase<"WSD", 4, "wsd">,
  ]> {
  let cppNamespace = "::mt";
}

def Mt_WsdStyle : I32EnumAttr<"WsdStyle", "shape of the warmup-stable-decay schedule's anneal", [
    I32EnumAttrCase<"Exponential", 0, "exponential">,
    I32EnumAttrCase<"Linear", 1, "linear">,
    I32EnumAttrCase<"Cosine", 2, "cosine">,
    I32EnumAttrCase<"MinusSqrt", 3, "minus_sqrt">,
  ]> {
  let cppNamespace = "::mt";
}

def Mt_AllReduceGradsOp : Mt_Op<"all_reduce_grads", [
    MemoryEffects<[MemRead<Mt_GradBuffers>, MemWrite<Mt_GradBuffers>]>]> {
  let summary = "sums parameters' gradients over a group of ranks, then scales them";
  let description = [{
    Data parallelism: after the step's micro-batches, each rank holds the
    gradient of its own samples; this all-reduce over `group` (`"dp"`) and
    the scale `1 / data_parallel_size` leave every rank with the gradient of
    the mean loss over the global batch, as Megatron-LM's DDP does.

    Tensor parallelism with sequence parallelism: norm weights and the
    biases added on sequence shards get a partial gradient on each
    tensor-parallel rank; `group = "tp"` with `params` listing them sums
    them (Megatron's all-reduce of sequence-parallel gradients). Without
    `params` every parameter's gradient is reduced.

    ```mlir
    mt.all_reduce_grads {group = "dp", scale = 5.000000e-01 : f64}
    mt.all_reduce_grads {group = "tp", params = [@"decoder.final_layernorm.weight"], scale = 1.000000e+00 : f64}
    ```
  }];
  let arguments = (ins StrAttr:$group, F64Attr:$scale,
                       OptionalAttr<SymbolRefArrayAttr>:$params);
  let assemblyFormat = "attr-dict";
  let hasVerifier = 1;
}

def Mt_GradNormOp : Mt_Op<"grad_norm", [MemoryEffects<[MemRead<Mt_GradBuffers>]>]> {
  let summary = "global L2 norm of every parameter's gradient";
  let description = [{
    The norm of the whole model's gradient, on every rank, as Megatron-LM's
    clip_grad_norm computes it. Each rank sums the squares of the gradients
    it holds, leaving out a parameter replicated over tensor-parallel ranks
    on all but tensor-parallel rank 0, and parameters marked `mt.tied_copy`
    (the last pipeline stage's copy of a tied embedding, whose gradient
    equals the first stage's after `mt.all_reduce_tied_grad`); with
    `group = "mp"` (pipeline stages) the sums are added over the group, and
    with tensor parallelism over the model-parallel group in any case; then
    the square root: every rank gets the norm of the whole model, each
    tensor counted once.

    ```mlir
    %norm = mt.grad_norm : tensor<f32>
    %norm = mt.grad_norm {group = "mp"} : tensor<f32>
    ```
  }];
  let arguments = (ins OptionalAttr<StrAttr>:$group);
  let results = (outs Mt_ScalarF32:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Mt_LrScheduleOp : Mt_Op<"lr_schedule", [Pure]> {
  let summary = "Megatron-LM's learning-rate schedule at an optimizer step";
  let description = [{
    Linear warm-up from 0 to `lr` over `warmup_iters` steps, then `style`
    decay to `min_lr` at `decay_iters`, then `min_lr`. `steps` is the number of
    optimizer steps taken so far (skipped iterations do not count), so the
    schedule advances once per optimizer step, never per micro-batch.
    Megatron-LM's OptimizerParamScheduler.get_lr, whose steps are samples:
    a sample-based plan counts `steps` and the `*_iters` attributes in
    samples (samples_per_step 1); otherwise `samples_per_step` (the global
    batch, default 1) matters to
    `inverse_square_root`, `lr * sqrt(max(warmup samples, 1) / max(samples,
    1))` not below `min_lr`; the other styles depend only on ratios of
    steps. `wsd` (warmup-stable-decay) holds `lr` until `wsd_decay_iters`
    steps before `decay_iters`, then anneals to `min_lr` in the shape named
    after `anneal`, r going from 0 to 1: `exponential` 2 * 0.5^r - 1,
    `linear` 1 - r, `cosine` (cos(pi r) + 1) / 2, `minus_sqrt` 1 - sqrt(r).

    ```mlir
    %lr = mt.lr_schedule %steps cosine {lr = 1.000000e-03 : f64, min_lr = 1.000000e-04 : f64, warmup_iters = 10 : i64, decay_iters = 100 : i64} : tensor<i64> -> tensor<f32>
    %lr = mt.lr_schedule %steps wsd anneal minus_sqrt {lr = 1.000000e-03 : f64, min_lr = 1.000000e-04 : f64, warmup_iters = 10 : i64, decay_iters = 100 : i64, wsd_decay_iters = 20 : i64} : tensor<i64> -> tensor<f32>
    ```
  }];
  let arguments = (ins 0DTensorOf<[I64]>:$steps, Mt_LrStyle:$style,
                       F64Attr:$lr, F64Attr:$min_lr, I64Attr:$warmup_iters,
                       I64Attr:$decay_iters, OptionalAttr<I64Attr>:$samples_per_step,
                       OptionalAttr<Mt_WsdStyle>:$wsd_style,
                       OptionalAttr<I64Attr>:$wsd_decay_iters);
  let results = (outs Mt_ScalarF32:$result);
  let assemblyFormat = "$steps $style (`anneal` $wsd_style^)? attr-dict `:` type($steps) `->` type($result)";
  let hasVerifier = 1;
}

def Mt_ClipCoeffOp : Mt_Op<"clip_coeff", [Pure,
    AllTypesMatch<["norm", "grad_scale", "result"]>]> {
  let summary = "the factor the optimizer applies to every gradient";
  let description = [{
    `grad_scale * min(1, max_norm / (norm + 1e-6))`: unscaling (fp16 loss
    scaling: `grad_scale` = 1 / loss scale, else 1) and Megatron-LM's
    `clip_grad_norm_fp32` on the unscaled gradient norm `norm`; the
    minimum is not taken when `max_norm` is 0 (clipping off) or the ratio is
    not below 1.

    ```mlir
    %c = mt.clip_coeff %norm, %inv_scale {max_norm = 1.000000e+00 : f64} : tensor<f32>
    ```
  }];
  let arguments = (ins Mt_ScalarF32:$norm, Mt_ScalarF32:$grad_scale, F64Attr:$max_norm);
  let results = (outs Mt_ScalarF32:$result);
  let assemblyFormat = "$norm `,` $grad_scale attr-dict `:` type($result)";
}

def Mt_AdamWOp : Mt_Op<"adamw", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    MemoryEffects<[MemRead<Mt_GradBuffers>, MemWrite<Mt_ParamState>]>]> {
  let summary = "one AdamW update of a parameter";
  let description = [{
    Decoupled weight decay and bias correction, on the gradient times `clip`
    (`mt.clip_coeff`: unscaling and clipping). `step` counts updates from 1. Parameters with a reduced-
    precision model copy are updated in their f32 master copy, then rounded.

    ```mlir
    mt.adamw @decoder.layers.0.mlp.linear_fc1.weight, %lr, %clip, %step {beta1 = 9.000000e-01 : f64, beta2 = 9.990000e-01 : f64, epsilon = 1.000000e-08 : f64, weight_decay = 1.000000e-02 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$param, Mt_ScalarF32:$lr,
                       Mt_ScalarF32:$clip, 0DTensorOf<[I64]>:$step,
                       F64Attr:$beta1, F64Attr:$beta2, F64Attr:$epsilon,
                       F64Attr:$weight_decay);
  let assemblyFormat = "$param `,` $lr `,` $clip `,` $step attr-dict `:` type($lr) `,` type($clip) `,` type($step)";
  let hasVerifier = 1;
}

def Mt_SgdOp : Mt_Op<"sgd", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    MemoryEffects<[MemRead<Mt_GradBuffers>, MemWrite<Mt_ParamState>]>]> {
  let summary = "one SGD-with-momentum update of a parameter";
  let description = [{
    torch.optim.SGD as Megatron-LM's `--optimizer sgd` runs it (no
    dampening, no Nesterov): with `g` the gradient times `clip`
    (`mt.clip_coeff`), `d = g + weight_decay * w`, the parameter's momentum
    buffer `buf = momentum * buf + d` (zero before the first update, so the
    first is `d`), then `w -= lr * buf`. Parameters with a reduced-precision
    model copy are updated in their f32 master copy, then rounded.

    ```mlir
    mt.sgd @decoder.layers.0.mlp.linear_fc1.weight, %lr, %clip {momentum = 9.000000e-01 : f64, weight_decay = 1.000000e-02 : f64} : tensor<f32>, tensor<f32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$param, Mt_ScalarF32:$lr, Mt_ScalarF32:$clip,
                       F64Attr:$momentum, F64Attr:$weight_decay);
  let assemblyFormat = "$param `,` $lr `,` $clip attr-dict `:` type($lr) `,` type($clip)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Data-parallel buckets and the distributed optimizer
//===----------------------------------------------------------------------===//

def Mt_ReduceGradsOp : Mt_Op<"reduce_grads", [
    MemoryEffects<[MemRead<Mt_GradBuffers>, MemWrite<Mt_GradBuffers>]>]> {
  let summary = "reduces one gradient bucket over a group of ranks, then scales it";
  let description = [{
    `bucket` indexes the module's `mt.grad_buckets` (written by
    mt-data-parallel): a contiguous range of the flat f32 gradient buffer
    holding the gradients of its `params`. `group` is the bucket's own:
    `"dp"`, or `"expt_dp"` (the expert data-parallel group, of
    `tp * dp / (etp * ep)` ranks) for a bucket of expert parameters. Without
    `scatter` the range is all-reduced, so every rank holds the bucket's mean
    gradient; with `scatter` (the distributed optimizer) it is
    reduce-scattered, so rank r of the group holds the reduced r-th of the
    group's equal shards of the range, and the rest of the range is left as
    it was. Either way the result is multiplied by `scale`
    (`1 / data_parallel_size`, for expert buckets too).

    ```mlir
    mt.reduce_grads {bucket = 0 : i64, group = "dp", scale = 5.000000e-01 : f64, scatter = true}
    ```
  }];
  let arguments = (ins I64Attr:$bucket, StrAttr:$group, F64Attr:$scale, BoolAttr:$scatter);
  let assemblyFormat = "attr-dict";
  let hasVerifier = 1;
}

def Mt_ShardedGradNormOp : Mt_Op<"sharded_grad_norm", [MemoryEffects<[MemRead<Mt_GradBuffers>]>]> {
  let summary = "global L2 norm of reduce-scattered gradients";
  let description = [{
    The sum of squares over the shard of every bucket this rank owns
    (padding holds zeros), summed over `group`, then its square root: the
    norm of the whole reduced gradient, as Megatron-LM's distributed
    optimizer computes it.

    ```mlir
    %norm = mt.sharded_grad_norm {group = "dp"} : tensor<f32>
    ```
  }];
  let arguments = (ins StrAttr:$group);
  let results = (outs Mt_ScalarF32:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Mt_ShardedAdamWOp : Mt_Op<"sharded_adamw", [
    MemoryEffects<[MemRead<Mt_GradBuffers>, MemWrite<Mt_ParamState>]>]> {
  let summary = "AdamW over the elements of one bucket this rank owns";
  let description = [{
    The distributed optimizer's update: for every element of this rank's
    shard of bucket `bucket` that belongs to a parameter (padding is
    skipped), AdamW as `mt.adamw` computes it, on the f32 master copy of the
    shard (reduced-precision models) or on the f32 weights themselves, with
    the shard's own Adam moments. An element decays with `weight_decay` when
    its parameter does (Megatron's rule: not biases nor one-dimensional
    parameters). An element of a parameter marked `mt.decoupled_lr`
    (Megatron's `--decoupled-lr`: the word embeddings and output layer) is
    updated with `decoupled_lr` instead of `lr`. The updated weights are
    those of the owned shard only; `mt.all_gather_params` then gives every
    rank the full bucket.

    ```mlir
    mt.sharded_adamw %lr, %clip, %step {beta1 = 9.000000e-01 : f64, beta2 = 9.990000e-01 : f64, bucket = 0 : i64, epsilon = 1.000000e-08 : f64, weight_decay = 1.000000e-02 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    mt.sharded_adamw %lr, %clip, %step decoupled(%lr2 : tensor<f32>) {beta1 = 9.000000e-01 : f64, beta2 = 9.990000e-01 : f64, bucket = 0 : i64, epsilon = 1.000000e-08 : f64, weight_decay = 1.000000e-02 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    ```
  }];
  let arguments = (ins Mt_ScalarF32:$lr, Mt_ScalarF32:$clip, 0DTensorOf<[I64]>:$step,
                       Optional<Mt_ScalarF32>:$decoupled_lr,
                       I64Attr:$bucket, F64Attr:$beta1, F64Attr:$beta2, F64Attr:$epsilon,
                       F64Attr:$weight_decay);
  let assemblyFormat = "$lr `,` $clip `,` $step (`decoupled` `(` $decoupled_lr^ `:` type($decoupled_lr) `)`)? attr-dict `:` type($lr) `,` type($clip) `,` type($step)";
  let hasVerifier = 1;
}

def Mt_ShardedSgdOp : Mt_Op<"sharded_sgd", [
    MemoryEffects<[MemRead<Mt_GradBuffers>, MemWrite<Mt_ParamState>]>]> {
  let summary = "SGD with momentum over the elements of one bucket this rank owns";
  let description = [{
    The distributed optimizer's form of `mt.sgd`: every element of this
    rank's shard of bucket `bucket` that belongs to a parameter (padding is
    skipped) is updated as `mt.sgd` updates it, on the f32 master copy of the
    shard (reduced-precision models) or on the f32 weights themselves, with
    the shard's own momentum buffer. Weight decay and the decoupled rate
    apply per element's parameter as in `mt.sharded_adamw`; then
    `mt.all_gather_params` gives every rank the full bucket.

    ```mlir
    mt.sharded_sgd %lr, %clip {bucket = 0 : i64, momentum = 9.000000e-01 : f64, weight_decay = 1.000000e-02 : f64} : tensor<f32>, tensor<f32>
    ```
  }];
  let arguments = (ins Mt_ScalarF32:$lr, Mt_ScalarF32:$clip,
                       Optional<Mt_ScalarF32>:$decoupled_lr,
                       I64Attr:$bucket, F64Attr:$momentum, F64Attr:$weight_decay);
  let assemblyFormat = "$lr `,` $clip (`decoupled` `(` $decoupled_lr^ `:` type($decoupled_lr) `)`)? attr-dict `:` type($lr) `,` type($clip)";
  let hasVerifier = 1;
}

def Mt_AllGatherParamsOp : Mt_Op<"all_gather_params", [
    MemoryEffects<[MemRead<Mt_ParamState>, MemWrite<Mt_ParamState>]>]> {
  let summary = "gathers one bucket's updated weights from the ranks that own them";
  let description = [{
    After `mt.sharded_adamw`, each rank of `group` (the bucket's: `"dp"`,
    or `"expt_dp"` for expert parameters) holds the updated model weights of
    its shard of bucket `bucket`; this all-gather leaves every rank with the
    whole bucket's weights.

    ```mlir
    mt.all_gather_params {bucket = 0 : i64, group = "dp"}
    ```
  }];
  let arguments = (ins I64Attr:$bucket, StrAttr:$group);
  let assemblyFormat = "attr-dict";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Pipeline parallelism
//===----------------------------------------------------------------------===//

def Mt_SendOp : Mt_Op<"send", [
    DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>,
    MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "sends a tensor to another pipeline stage";
  let description = [{
    Hands `input` to pipeline rank `peer` (a rank of this rank's pipeline
    group), which receives it with the `mt.recv` of the same `tag`. The send
    is buffered: it returns once the bytes are copied, so a schedule in
    which every receive follows its send in some rank's order cannot
    deadlock. Its gradient is the `mt.recv` of the input's gradient from
    `peer` with tag `tag + 1` (`mt-partition-pp` numbers boundaries by even
    tags).

    ```mlir
    mt.send %x to 1 {tag = 0 : i64} : tensor<2x32x64xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, I64Attr:$peer, I64Attr:$tag);
  let assemblyFormat = "$input `to` $peer attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Mt_RecvOp : Mt_Op<"recv", [
    DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>,
    MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "receives a tensor from another pipeline stage";
  let description = [{
    Waits (bounded by the run's timeout) for the `mt.send` of the same `tag`
    on pipeline rank `peer` and returns its tensor. Its gradient is an
    `mt.send` of the result's gradient back to `peer` with tag `tag + 1`.

    ```mlir
    %x = mt.recv from 0 {tag = 0 : i64} : tensor<2x32x64xf32>
    ```
  }];
  let arguments = (ins I64Attr:$peer, I64Attr:$tag);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "`from` $peer attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Mt_AllReduceTiedGradOp : Mt_Op<"all_reduce_tied_grad", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    MemoryEffects<[MemRead<Mt_GradBuffers>, MemWrite<Mt_GradBuffers>]>]> {
  let summary = "sums a tied parameter's gradient with its copy on another stage";
  let description = [{
    With tied embeddings and pipeline parallelism the first stage holds the
    word embeddings and the last stage a copy for the output layer (same
    name, so the same initial values). Before the norm, each adds the
    other's gradient into its own (Megatron-LM's embedding group), so both
    copies take the same update. The exchange is with pipeline rank `peer`,
    over messages tagged `tag`.

    ```mlir
    mt.all_reduce_tied_grad @embedding.word_embeddings.weight {peer = 1 : i64, tag = 0 : i64}
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$param, I64Attr:$peer, I64Attr:$tag);
  let assemblyFormat = "$param attr-dict";
  let hasVerifier = 1;
}

#endif // MT_TRAIN_OPS_TD
