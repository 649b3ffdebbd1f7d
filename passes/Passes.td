// The mt passes, in the order mt-train-pipeline runs them (DESIGN.md).
#ifndef MT_PASSES_TD
#define MT_PASSES_TD

include "mlir/Pass/PassBase.td"

def MtPartitionPPPass : Pass<"mt-partition-pp", "mlir::ModuleOp"> {
  let summary = "Splits @forward into pipeline stages joined by mt.send / mt.recv";
  let description = [{
    With `pipeline_model_parallel_size` (pp) > 1 in the module's
    `mt.parallel`, assigns every op of `@forward` to a virtual stage as
    Megatron-LM does: ops carry their transformer layer in `mt.layer`;
    without interleaving the layers split evenly over the pp ranks (or, with
    `decoder_first_pipeline_num_layers` / `decoder_last_pipeline_num_layers`,
    the first and last rank take that many and the others share the rest);
    with `virtual_pipeline_model_parallel_size` (vp) > 1, layer block
    `c * pp + r` of `pp * vp` equal blocks is model chunk `c` of rank `r`.
    The embedding goes with the first stage's first chunk, the final norm,
    output layer and loss with the last stage's last chunk.

    Each pipeline rank becomes one nested `builtin.module @stage<r>`
    (attribute `mt.stage = r`) holding all its chunks: a rank runs one
    instruction stream and owns one state buffer. Its `@forward` holds its
    ops in order, each tagged `mt.chunk`, and takes only the inputs it reads
    (tokens on the first stage, labels on the last); only the last stage
    returns the loss. `@forward`'s results named with `mt.name` (an MoE
    model's auxiliary-loss sums over its layers) are returned per stage:
    each stage the sum of its own layers' terms under the same name (none
    when it has no such term), which mtrun adds over the pipeline group as
    Megatron reduces its tracker over pp. A value read on another stage leaves through
    `mt.send` and arrives through `mt.recv` (even tags, one per boundary);
    their gradient rules send the gradient back (tag + 1). Each stage
    declares the parameters it reads; tied word embeddings, read on the
    first and the last stage, are declared on both, with `mt.tied_peer`
    (and `mt.tied_copy` on the last), same name and therefore the same
    initial values. The top module keeps the model's parameter table and
    gets `mt.pipeline = {stages, chunks, tags_per_micro_batch}`.

    The passes after it run once per stage module. With pp = 1 it changes
    nothing.

    ```mlir
    // pipeline_model_parallel_size = 2, two layers
    module @stage0 attributes {mt.stage = 0 : i64} {
      mt.param @embedding.word_embeddings.weight : tensor<256x32xf32>, normal(2.000000e-02) {mt.tied_peer = 1 : i64}
      func.func @forward(%tokens: tensor<2x32xi32> {mt.name = "tokens"}) {
        ...
        %x = mt.add %h, %d {mt.chunk = 0 : i64, mt.layer = 0 : i64} : tensor<2x32x32xf32>
        mt.send %x to 1 {mt.chunk = 0 : i64, tag = 0 : i64} : tensor<2x32x32xf32>
        return
      }
    }
    module @stage1 attributes {mt.stage = 1 : i64} {
      func.func @forward(%labels: tensor<2x32xi32> {mt.name = "labels"}) -> tensor<f32> {
        %x = mt.recv from 0 {mt.chunk = 0 : i64, tag = 0 : i64} : tensor<2x32x32xf32>
        ...
      }
    }
    ```
  }];
  let dependentDialects = ["::mt::MtDialect", "::mlir::func::FuncDialect"];
}

def MtAutodiffPass : Pass<"mt-autodiff", "mlir::ModuleOp"> {
  let summary = "Builds the training step: forward, loss and backward";
  let description = [{
    Turns `func.func @forward` into two programs:

    - `@train_step`: the forward graph, then the backward graph built from
      each op's vector-Jacobian product (`DifferentiableOpInterface`), in
      reverse order. Backpropagation starts from `mt.grad_seed` with scale
      `1 / num_micro_batches` (from the module's `mt.training`), so
      gradients summed over a step's micro-batches are those of the mean
      loss, as in Megatron-LM. With per-token loss (`mt.training`'s
      `loss_tokens_per_micro_batch` and `loss_tokens_per_iteration`,
      Megatron's `--calculate-per-token-loss`) the scale is a rank's
      micro-batch tokens times dp over the iteration's tokens, the summed
      token losses over the global batch's count. Every parameter's gradient is added into its
      gradient buffer (`mt.matmul_weight_grad ... into @w`); values read
      more than once get the sum of their gradients.
    - `@eval_step`: the forward graph without dropout (Megatron evaluates
      with the model in eval mode).

    Tensor-parallel communication ops are differentiated by their
    conjugates; `mt.tp_copy`, an identity forward, is removed from both
    programs once its gradient (an all-reduce) is built.

    `@forward` returns the loss and may return f32 scalars named with the
    result attribute `mt.name` (an MoE model's `load_balancing_loss` or
    `seq_load_balancing_loss`, and `z_loss`: the sums of its routers'
    auxiliary losses). Both programs output them under those names; they
    are not seeded, because `mt.moe_router_grad` adds the auxiliary losses'
    gradients itself, scaled by its own copy of the gradient seed
    (Megatron's `MoEAuxLossAutoScaler`).

    ```mlir
    // before
    func.func @forward(%tokens: tensor<4x128xi32>, %labels: tensor<4x128xi32>) -> tensor<f32>
    // after
    func.func @train_step(%tokens: tensor<4x128xi32>, %labels: tensor<4x128xi32>) -> tensor<f32> {
      ...
      %loss = mt.cross_entropy %logits, %labels : ...
      %seed = mt.grad_seed {scale = 2.500000e-01 : f64} : tensor<f32>
      %dlogits = mt.cross_entropy_grad %logits, %labels, %seed : ...
      ...
      return %loss : tensor<f32>
    }
    func.func @eval_step(...) -> tensor<f32>
    ```
  }];
  let dependentDialects = ["::mt::MtDialect"];
}

def MtOptimizerPass : Pass<"mt-optimizer", "mlir::ModuleOp"> {
  let summary = "Adds the optimizer step: gradient norm, clipping, LR schedule, AdamW";
  let description = [{
    Adds two programs, from the module's `mt.training` settings:

    - `@grad_norm() -> f32`: the global L2 norm of all gradients. The
      runtime skips the update (and counts the iteration as skipped) when it
      is not finite, as Megatron-LM does. With sequence parallelism it first
      sums, over the tensor-parallel group, the gradients of parameters
      mt-shard-tp marked `mt.tp_partial_grad`
      (`mt.all_reduce_grads {group = "tp", params = [...]}`).
    - `@optimizer_step(%steps, %step, %grad_norm, %grad_scale) -> (lr, next_lr)`:
      Megatron's learning rate at `%steps` optimizer steps taken
      (`mt.lr_schedule`), the factor every gradient is multiplied by
      (`mt.clip_coeff`: 1 / loss scale for fp16, times clipping against the
      unscaled `%grad_norm`), and one `mt.adamw` per
      parameter with bias correction for update number `%step` (with
      `mt.training.optimizer = "sgd"`, one `mt.sgd` with
      `mt.training.sgd_momentum` instead). Biases and
      other one-dimensional parameters get no weight decay (Megatron's
      default rule). `next_lr` is the rate after this step, the one
      Megatron's iteration line shows. With sample-based training
      (`mt.training.train_samples`) the schedule counts samples, as
      Megatron's scheduler does (`lr_*_samples`, no `samples_per_step`):
      `%steps` is the samples of the updates taken and a fifth input
      `%next_steps` the count after this one, since with a batch-size
      ramp-up an update's samples vary.

    ```mlir
    func.func @optimizer_step(%steps: tensor<i64>, %step: tensor<i64>, %norm: tensor<f32>, %scale: tensor<f32>) -> (tensor<f32>, tensor<f32>) {
      %lr = mt.lr_schedule %steps cosine {...} : tensor<i64> -> tensor<f32>
      %clip = mt.clip_coeff %norm, %scale {max_norm = 1.000000e+00 : f64} : tensor<f32>
      mt.adamw @embedding.word_embeddings.weight, %lr, %clip, %step {...} : ...
      ...
      %next = mt.lr_schedule %step cosine {...} : tensor<i64> -> tensor<f32>
      return %lr, %next : tensor<f32>, tensor<f32>
    }
    ```
  }];
  let dependentDialects = ["::mt::MtDialect"];
}

def MtRecomputePass : Pass<"mt-recompute", "mlir::ModuleOp"> {
  let summary = "Activation recomputation: re-executes layers' forward ops in the backward";
  let description = [{
    Megatron-LM's `--recompute-granularity`, `--recompute-method` and
    `--recompute-num-layers`, read from the module's `mt.training`
    (`recompute_granularity`, `recompute_method`, `recompute_num_layers`) and
    applied to `@train_step`, whose ops carry their transformer layer in
    `mt.layer`. Everything before `mt.grad_seed` is the forward, everything
    after it the backward.

    - `full` splits the layers into chunks: `uniform` makes consecutive
      groups of `recompute_num_layers` layers, `block` makes each of the
      first `recompute_num_layers` layers a chunk of its own and leaves the
      others alone. For each chunk, the forward ops that compute what the
      backward reads (and what those depend on inside the chunk) are cloned
      right before the first backward op that reads one of their results,
      and the backward reads the clones. What the chunk hands on (its
      output, the next chunk's input), what enters it and parameter reads
      are used as they are. The original forward values then die inside the
      forward, and mt-plan-memory reuses their bytes.
      Clones keep their attributes, so `mt.dropout` and `mt.attention`
      reproduce their masks from the same RNG `stream`; they get
      `mt.recomputed`, which also keeps CSE from folding them back into the
      originals.
    - `selective` changes nothing: Megatron recomputes the core attention
      to avoid keeping the `seq x seq` probabilities, and `mt.attention_grad`
      already recomputes them from q and k (with the same dropout mask), so
      nothing of that size is saved in the first place.
    - With sequence parallelism, whatever the granularity, a forward
      `mt.sp_gather` that the backward reads (a column-parallel layer's
      input, for its weight gradient) is cloned right before its first
      backward reader, as Megatron all-gathers the input again in the
      backward: only the sequence shard is kept between the passes.
    - `none` changes nothing.

    `@train_step` gets `mt.recompute` (what was done, in words) and
    `mt.recomputed_layers` (the layers whose forward runs twice).

    ```mlir
    // before: %a and %d (layer 3) live from the forward to the backward
    %a = mt.matmul %x, %w1 {mt.layer = 3 : i64} : ...
    %d = mt.dropout %a {mt.layer = 3 : i64, rate = 1.000000e-01 : f64, stream = 7 : i64} : ...
    %y = mt.matmul %d, %w2 {mt.layer = 3 : i64} : ...
    %x4 = mt.add %x, %y {mt.layer = 3 : i64} : ...
    ...
    %seed = mt.grad_seed {scale = 1.000000e+00 : f64} : tensor<f32>
    ...
    mt.matmul_weight_grad %dx4, %d into @decoder.layers.3.mlp.linear_fc2.weight {mt.layer = 3 : i64} : ...

    // after (recompute_granularity = "full", recompute_method = "uniform",
    // recompute_num_layers = 1): %a and %d die after %y in the forward
    %a_1 = mt.matmul %x, %w1 {mt.layer = 3 : i64, mt.recomputed} : ...
    %d_1 = mt.dropout %a_1 {mt.layer = 3 : i64, mt.recomputed, rate = 1.000000e-01 : f64, stream = 7 : i64} : ...
    mt.matmul_weight_grad %dx4, %d_1 into @decoder.layers.3.mlp.linear_fc2.weight {mt.layer = 3 : i64} : ...
    ```
  }];
  let dependentDialects = ["::mt::MtDialect"];
}

def MtFusePass : Pass<"mt-fuse", "mlir::ModuleOp"> {
  let summary = "Rotates RoPE inside the QKV split, groups chains of elementwise ops into mt.fused kernels, and forward and backward GEMMs with their epilogues";
  let description = [{
    Runs on every function, in four steps.

    **RoPE in the QKV split.** An `mt.split_qkv` whose query and key each
    have exactly one user, an `mt.rope`, both of one base, takes that base
    as `rope_base` (its query and key come out rotated) and the two
    `mt.rope` go. Likewise an `mt.split_qkv_grad` whose query and key
    gradients each come from an `mt.rope_grad` used nowhere else, both of
    one base, rotates them back itself and the two `mt.rope_grad` go. The
    unrotated tensors never exist, and each direction loses two kernels that
    read and wrote a whole q or k. The pass runs after autodiff and
    recompute, so it sees the forward, its recomputed copy and the backward;
    tensor-parallel sharding is already done (rotation is per head, so a
    rank's share of the heads rotates alike). A query also read elsewhere
    keeps its `mt.rope`.

    ```mlir
    // before
    %q, %k, %v = mt.split_qkv %qkv : (tensor<2x8x64xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>)
    %qr = mt.rope %q {base = 1.000000e+04 : f64} : tensor<2x8x4x8xf32>
    %kr = mt.rope %k {base = 1.000000e+04 : f64} : tensor<2x8x2x8xf32>
    ...
    %dq = mt.rope_grad %dqr {base = 1.000000e+04 : f64} : tensor<2x8x4x8xf32>
    %dk = mt.rope_grad %dkr {base = 1.000000e+04 : f64} : tensor<2x8x2x8xf32>
    %dqkv = mt.split_qkv_grad %dq, %dk, %dv : (...) -> tensor<2x8x64xf32>

    // after
    %qr, %kr, %v = mt.split_qkv %qkv {rope_base = 1.000000e+04 : f64} : (tensor<2x8x64xf32>) -> (...)
    ...
    %dqkv = mt.split_qkv_grad %dqr, %dkr, %dv {rope_base = 1.000000e+04 : f64} : (...) -> tensor<2x8x64xf32>
    ```

    **GEMM epilogues.** An `mt.matmul` whose only user is the adjacent
    `mt.bias_add` of its result becomes a `gemm` kernel: the CUDA backend
    runs it as one cuBLASLt GEMM whose epilogue adds the bias. If that
    bias_add feeds exactly one adjacent `mt.gelu` of the `tanh` form (the
    form cuBLASLt's GELU epilogue computes), and its other users come after
    the gelu, the gelu joins the kernel too; the bias add's result is then
    also a result of the kernel when the backward's `mt.gelu_grad` reads it
    (the epilogue's aux output). A bias add into a GEMM costs nothing extra,
    so the epilogue wins over an elementwise kernel. A bias added after a
    collective (tensor-parallel row-parallel layers) has no GEMM as its
    input's only producer and is fused into an elementwise kernel instead.

    **Backward GEMM epilogues** (`gemm_grad` kernels, as Megatron's
    TransformerEngine uses cuBLASLt):

    - an `mt.matmul_input_grad` whose only user is a `tanh` `mt.gelu_grad`
      of its result joins it (DGELU: the pre-activation is the epilogue's
      aux input; cuBLASLt wants its leading dimension, the feature count, a
      multiple of 8). With f32 gradients, the one `mt.bias_grad` of the
      GeLU's gradient joins too (DGELU_BGRAD). cuBLASLt sums that bias
      gradient from the epilogue's values before they are rounded to D's
      type, so with bf16 or fp16 gradients it is left to the next rule,
      which sums the stored values as the CPU executor does;
    - an `mt.matmul_weight_grad` and the one `mt.bias_grad` of the same
      output gradient become one kernel (BGRADB: the column sums of dy), a
      kernel without results: both add into parameter gradients.

    The group is outlined at its last op. An op moves down to it only when
    no op in between reads its result, an op that adds into a gradient
    crosses only ops without side effects (never a gradient reduction),
    and where an op in between allocates, the moved op's operands live to
    the group's position anyway; so no value lives longer than before. In
    the GPT layer's order this moves the bias gradient past the input
    gradient's GEMM and FC2's input gradient past FC2's weight gradient.

    **Chains.** Candidates are the ops `mt.fused` allows (`mt.bias_add`,
    `mt.add`, `mt.gelu`, `mt.gelu_grad`, `mt.swiglu`, `mt.swiglu_grad`,
    `mt.dropout`, `mt.reshape`, and the row-wise `mt.layer_norm` and
    `mt.rms_norm`). In program order, each candidate not yet taken starts a
    chain, which grows while the next op reads the last op's result and is
    a candidate, not in a gemm kernel, and adjacent (only parameter reads,
    which take neither time nor arena bytes, may lie between). The last
    op's result may have other users: they come after the chain, so the
    value becomes one more result of the kernel, which writes it once and
    never reads it back. That is the residual stream: the sum of the
    residual add is read by the next layer's norm and by the next residual
    add, so dropout + add + norm is one `row_reduction` kernel with two
    results; and its gradient, read by the dropout of the branch and by the
    next gradient sum, so add + dropout is one kernel with two results. A
    kernel's results share one index space, so the chain ends before an op
    whose result count differs from an earlier result's. A chain holds at most one
    row-wise op (then it is a `row_reduction` kernel and holds no reshape);
    a trailing reshape is dropped (alone it aliases its input for free, as
    a kernel output it would be a copy). Chains of two or more ops become
    one `mt.fused` at the position of their last op: its operands are the
    values the chain reads from outside (first use first), its results the
    values read after it. Moving the earlier ops down to that position crosses only
    parameter reads, so no value lives longer than before. The kernel is
    named after its layer (`mt.layer`) and its ops; attributes that every
    op of the chain carries alike (`mt.layer`, `mt.recomputed`) are copied
    onto it.

    The algorithm is one walk in program order over each function, with no
    cost model: the result depends only on the IR.

    ```mlir
    // before
    %y = mt.matmul %x, %w : (tensor<4x128x64xf32>, tensor<64x64xf32>) -> tensor<4x128x64xf32>
    %b = mt.param_ref @decoder.layers.0.self_attention.linear_proj.bias : tensor<64xf32>
    %yb = mt.bias_add %y, %b : tensor<4x128x64xf32>, tensor<64xf32>
    %d = mt.dropout %yb {rate = 1.000000e-01 : f64, stream = 2 : i64} : tensor<4x128x64xf32>
    %h = mt.add %res, %d : tensor<4x128x64xf32>

    // after
    %b = mt.param_ref @decoder.layers.0.self_attention.linear_proj.bias : tensor<64xf32>
    %yb = mt.fused gemm "decoder.layers.0 matmul+bias_add" (%xx = %x, %ww = %w, %bb = %b)
        : (tensor<4x128x64xf32>, tensor<64x64xf32>, tensor<64xf32>) -> tensor<4x128x64xf32> {
      %m = mt.matmul %xx, %ww : (tensor<4x128x64xf32>, tensor<64x64xf32>) -> tensor<4x128x64xf32>
      %o = mt.bias_add %m, %bb : tensor<4x128x64xf32>, tensor<64xf32>
      mt.yield %o : tensor<4x128x64xf32>
    }
    %h = mt.fused elementwise "decoder.layers.0 dropout+add" (%a = %yb, %r = %res)
        : (tensor<4x128x64xf32>, tensor<4x128x64xf32>) -> tensor<4x128x64xf32> {
      %d = mt.dropout %a {rate = 1.000000e-01 : f64, stream = 2 : i64} : tensor<4x128x64xf32>
      %s = mt.add %r, %d : tensor<4x128x64xf32>
      mt.yield %s : tensor<4x128x64xf32>
    }
    ```
  }];
  let dependentDialects = ["::mt::MtDialect"];
}

def MtShardTpPass : Pass<"mt-shard-tp", "mlir::ModuleOp"> {
  let summary = "Splits @forward over tensor-parallel ranks (Megatron-LM's tensor and sequence parallelism)";
  let description = [{
    With `tensor_model_parallel_size` = t > 1 (module attribute
    `mt.parallel`), rewrites `@forward` into the program every
    tensor-parallel rank runs on its own shard of the parameters:

    - QKV and FC1 are column parallel (output rows split; QKV by whole
      query groups, since the fused layout is per group; SwiGLU's FC1 splits
      its gate and up halves alike), the attention projection and FC2 row
      parallel (input columns split); their outputs are summed by
      `mt.tp_all_reduce` where Megatron puts it, and their inputs enter
      through `mt.tp_copy` (whose gradient is the all-reduce).
    - The word embedding is vocab parallel (`vocab_parallel`: ids of other
      ranks give zeros, then an all-reduce); the output layer is column
      parallel over the vocabulary and the loss is the vocab-parallel
      cross-entropy, so whole logits never exist.
    - Norms, row-parallel biases and position embeddings stay replicated.

    With `sequence_parallel`, the residual stream (norms, dropout, residual
    adds) holds `seq / t` positions per rank: `mt.sp_gather` replaces
    `mt.tp_copy` before column-parallel layers, `mt.sp_reduce_scatter`
    replaces the all-reduce after row-parallel ones, and the embedding ends
    in `mt.sp_split` (after the replicated position embedding) or a
    reduce-scatter. Parameters read on sequence shards are marked
    `mt.tp_partial_grad`; mt-optimizer sums their gradients over the
    tensor-parallel group.

    Parameters become their shard (`tp_dim`, `tp_size`, `tp_blocks` say
    which part of the logical tensor a rank holds); dropout on sequence
    shards and attention over a share of the heads get `tp_shard_dim`, so
    their masks are those of the single-device run. The module gets
    `mt.tensor_parallel` (and `mt.sequence_parallel`).

    ```mlir
    %x1 = mt.tp_copy %x {tp_size = 2 : i64} : (tensor<2x32x64xf32>) -> tensor<2x32x64xf32>
    %qkv = mt.matmul %x1, %w : (tensor<2x32x64xf32>, tensor<96x64xf32>) -> tensor<2x32x96xf32>
    ...
    %p = mt.matmul %o, %wp : (tensor<2x32x32xf32>, tensor<64x32xf32>) -> tensor<2x32x64xf32>
    %y = mt.tp_all_reduce %p {tp_size = 2 : i64} : (tensor<2x32x64xf32>) -> tensor<2x32x64xf32>
    ```
  }];
  let dependentDialects = ["::mt::MtDialect"];
}

def MtShardEpPass : Pass<"mt-shard-ep", "mlir::ModuleOp"> {
  let summary = "Splits the routed experts over expert-parallel and expert-tensor-parallel ranks (Megatron-Core's expert parallelism)";
  let description = [{
    Marks every routed expert's stacked weight (the weight of an
    `mt.moe_grouped_matmul`) `mt.expert`, at every layout: mt-data-parallel
    reduces their gradients over the expert data-parallel group and the
    gradient norm counts them on every rank that holds them.

    With `expert_model_parallel_size` = ep > 1 (module attribute
    `mt.parallel`), the `E` experts of each MoE layer are split over the ep
    ranks: rank `q` holds experts `[q * L, (q + 1) * L)`, `L = E / ep`, so
    the stacked weights become `[L, ...]` (`ep_dim = 0`, `ep_size`). With
    `expert_tensor_parallel_size` = etp > 1 each expert is split too, as
    Megatron-Core's experts split it: the first matmul (the one on the
    permuted rows) column-parallel, its weight `[E, F1, H]` on dimension 1
    (`tp_dim = 1`, `tp_size` = etp, `tp_blocks = 2` when SwiGLU follows:
    gate and up halves each split), the second (the one
    `mt.moe_unpermute` reads) row-parallel, `[E, H, F]` on dimension 2.

    Whenever etp * ep > 1 the rows travel among the `S = etp * ep` ranks of
    the tensor-and-expert-parallel group. The router, the capacity and the
    permutation stay local to the rank (Megatron-Core computes the capacity
    from the rank's own tokens); between the permutation and the experts
    `mt.moe_dispatch` sends each expert's rows to the etp ranks of its ep
    rank, the grouped matmuls run on the received rows with the local
    counts, and `mt.moe_combine` returns the rows (summing the etp partial
    products) before `mt.moe_unpermute`. `moe_token_dispatcher_type` picks
    the exchange (same numbers). The received rows are static, the worst
    case of the layout, with `T` the rank's tokens and `k` the top-k:
    `S * T * min(k, L)` without a capacity; `S * L * C` with capacity `C`
    padded; `S * min(T * min(k, L), L * C)` with a capacity and no padding.
    Without a capacity, `mt.parallel`'s `moe_dispatch_buffer_factor` f
    (>= 1) bounds them at `ceil(f * S * T * k / ep)`, f times the balanced
    load, when that is less than the worst case; the dispatch then carries
    `mt.worst_case_rows` (the unbounded count, for the memory report).

    Runs after mt-shard-tp (on the tokens of a sequence shard) and before
    mt-partition-pp. The module gets `mt.expert_parallel` (ep > 1) and
    `mt.expert_tensor_parallel` (etp > 1).

    ```mlir
    %y, %ids, %counts = mt.moe_permute %x, %map {capacity = 0 : i64} : ...
    %rows, %local, %layout = mt.moe_dispatch %y, %counts alltoall {ep_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<128x16xf32>, tensor<4xi32>) -> (tensor<256x16xf32>, tensor<2xi32>, tensor<2x2xi32>)
    %h = mt.moe_grouped_matmul %rows, %w1, %local : (tensor<256x16xf32>, tensor<2x64x16xf32>, tensor<2xi32>) -> tensor<256x64xf32>
    ...
    %back = mt.moe_combine %h2, %layout, %counts alltoall {ep_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<256x16xf32>, tensor<2x2xi32>, tensor<4xi32>) -> tensor<128x16xf32>
    %out = mt.moe_unpermute %back, %probs, %ids, %counts : ...
    ```
  }];
  let dependentDialects = ["::mt::MtDialect"];
}

def MtDataParallelPass : Pass<"mt-data-parallel", "mlir::ModuleOp"> {
  let summary = "Reduces gradients over data-parallel ranks in buckets; the distributed optimizer";
  let description = [{
    With `data_parallel_size` > 1 (module attribute `mt.parallel`), every
    rank runs the same programs on its own share of the global batch. The
    gradients are grouped into **buckets** as Megatron-LM's DDP groups them:
    parameters in reverse order (the order the backward completes their
    gradients), a bucket closed once it holds `ddp_bucket_size` elements
    (default `max(40000000, 1000000 * dp)`); without `overlap_grad_reduce`
    one bucket holds every gradient (Megatron's rule). Expert parameters
    (`mt.expert`) get buckets of their own after the dense ones, by the same
    rule, reduced over the expert data-parallel group `"expt_dp"` of
    `edp = tp * dp / (etp * ep)` ranks (`mt.parallel`'s
    `expert_model_parallel_size` and `expert_tensor_parallel_size`, 1 when
    absent). The module gets `mt.grad_buckets = [{group = "dp" | "expt_dp",
    params = [...]}, ...]` (mt-plan-memory adds each bucket's range of the
    flat buffers), `mt.data_parallel` and, with experts,
    `mt.expert_data_parallel`. The pass runs when dp > 1 or, with experts,
    edp > 1 (tensor parallelism with ep 1).

    Each bucket whose group has more than one rank is reduced by
    `mt.reduce_grads {bucket, group, scale = 1/dp}` (the dense scale for
    expert buckets too: an expert gradient holds its expert-parallel peers'
    tokens, so the sum over expt_dp covers every token-holding rank once):

    - without `overlap_grad_reduce`, at the start of `@grad_norm`, after the
      last micro-batch's backward;
    - with it, in `@train_step_last`, a copy of `@train_step` that the
      runtime runs for the last micro-batch of a step: each bucket's
      reduction sits right after the op that completes the bucket's
      gradients, the earliest point the collective can start (the CUDA
      executor issues it on a side stream, so it overlaps the rest of the
      backward; the CPU reduces synchronously). In a pipeline stage,
      whose `@train_step` `mt-schedule-pp` unrolls, the reductions go into
      `@train_step` itself after their completing ops, marked
      `mt.last_micro_batch` (kept only in the last micro-batch's copy); a
      bucket holding a tied embedding copy (`mt.tied_peer`) is reduced in
      `@grad_norm` after the copies' gradients are exchanged.

    With `use_distributed_optimizer` (Megatron's DistributedOptimizer,
    ZeRO-1) the reductions are reduce-scatters (`scatter = true`): rank r
    of a bucket's group owns the r-th of its equal shards (with edp = 1 an
    expert bucket's shard is all of it). `mt.grad_norm`
    becomes `mt.sharded_grad_norm` (squares over the owned shards, summed
    over dp), the per-parameter `mt.adamw` ops become one
    `mt.sharded_adamw` per bucket (`mt.sgd`: one `mt.sharded_sgd`) (the decay of each parameter is recorded
    as `mt.weight_decay` on its `mt.param`), followed by one
    `mt.all_gather_params` over its group per bucket of a group of several
    ranks; the module gets
    `mt.distributed_optimizer`, and mt-plan-memory plans masters and
    moments for the owned shards only.

    With `overlap_param_gather` as well (Megatron's
    `--overlap-param-gather`, which needs the other two), the optimizer
    step gathers nothing: the next iteration's first micro-batch opens
    with every bucket's `mt.all_gather_params`, in the order the step
    first reads the buckets' weights, and the CUDA executor waits before
    each instruction only for the gathers of the weights it reads, so the
    later buckets arrive while the first layers run. That program is
    `@train_step_first`, a copy of `@train_step` (with one micro-batch,
    `@train_step_last` itself); in a pipeline stage the gathers open
    `@train_step`, marked `mt.first_micro_batch` and `mt.chunk = 0` (kept
    only in micro-batch 0's first forward). `@gather_params` holds every
    gather for the runtime to run before an evaluation or a checkpoint
    save reads the weights.

    Plans that also use tensor or pipeline parallelism are left to the
    sharding passes and stay unchanged here.

    ```mlir
    // overlap_grad_reduce = false
    func.func @grad_norm() -> tensor<f32> {
      mt.reduce_grads {bucket = 0 : i64, group = "dp", scale = 5.000000e-01 : f64, scatter = false}
      %0 = mt.grad_norm : tensor<f32>
      return %0 : tensor<f32>
    }
    // overlap_grad_reduce = true, use_distributed_optimizer = true
    func.func @train_step_last(...) -> tensor<f32> {
      ...
      mt.layer_norm_grad ... into @decoder.final_layernorm.weight, @decoder.final_layernorm.bias ...
      mt.reduce_grads {bucket = 0 : i64, group = "dp", scale = 5.000000e-01 : f64, scatter = true}
      ...
    }
    func.func @optimizer_step(...) {
      ...
      mt.sharded_adamw %lr, %clip, %step {bucket = 0 : i64, ...} : tensor<f32>, tensor<f32>, tensor<i64>
      mt.all_gather_params {bucket = 0 : i64, group = "dp"}
      ...
    }
    // ... and overlap_param_gather = true (bucket 2 holds the embeddings)
    func.func @train_step_first(...) -> tensor<f32> {
      mt.all_gather_params {bucket = 2 : i64, group = "dp"}
      mt.all_gather_params {bucket = 1 : i64, group = "dp"}
      mt.all_gather_params {bucket = 0 : i64, group = "dp"}
      ...
    }
    ```
  }];
  let dependentDialects = ["::mt::MtDialect"];
}

def MtSchedulePPPass : Pass<"mt-schedule-pp", "mlir::ModuleOp"> {
  let summary = "Cuts each stage's step into the segments its 1F1B or interleaved schedule runs";
  let description = [{
    For each pipeline stage (after `mt-partition-pp`, `mt-autodiff`,
    `mt-recompute` and `mt-fuse`), `@train_step` stays one micro-batch's
    program. Its forward part (before `mt.grad_seed`) and backward part of
    each model chunk (`mt.chunk`) become segments, laid out in the order one
    micro-batch runs them (each chunk's forward, then each chunk's backward
    in reverse), after the parameter reads. mtrun runs the segments for
    every micro-batch in Megatron-LM's order for the stage's rank `r` of
    `pp` (runtime/base/pipeline_order.h, the same code for the compiler and
    the runtime):

    - 1F1B (vp = 1): `pp - r - 1` warm-up forwards, then one forward and
      one backward in turn, then the remaining backwards;
    - interleaved (vp > 1, the number of micro-batches a multiple of pp):
      `forward_backward_pipelining_with_interleaving`'s order of virtual
      micro-batches, backwards visiting the chunks in reverse.

    With 1F1B a segment is a whole forward or backward, which receives its
    input first and sends its output last, so a step's send and the next
    step's receive are adjacent (one NCCL group on the GPU). The
    interleaved schedule exchanges as Megatron-LM's does: after each unit
    of steps (a warm-up forward, a steady forward and backward, a
    cool-down backward) one group sends the unit's outputs and receives the
    inputs of the next unit's steps; the first unit's inputs are received
    up front. Its steps are therefore cut in three segments each (receives,
    computation, sends). A stage's k-th group then meets its neighbours'
    k-th groups, which NCCL needs: it pairs messages by order and completes
    one only while both ends are posted (`mtc` replays every plan's
    communication under these rules over the expanded order,
    runtime/comm/comm_order.h).

    The function gets `mt.segments` (per segment: `forward`, `chunk`,
    `part` 0 whole / 1 receives / 2 computation / 3 sends, and `ops`, its
    op count) and `mt.pipeline_schedule` (`stages`, `chunks`, `rank`,
    `micro_batches`, `tag_stride`: micro-batch m's message tags are the
    program's plus `m * tag_stride`), and `mt.schedule` ("1F1B" or
    "interleaved 1F1B"). Ops marked `mt.last_micro_batch` (mt-data-parallel's
    overlapped bucket reductions) run only in the last micro-batch, ops
    marked `mt.first_micro_batch` (its overlapped weight gathers) only in
    micro-batch 0. The runtime gives each micro-batch the RNG offset it has
    in a run without pipelining. The IR, the planning and the plan are one
    micro-batch's, whatever the micro-batch count; `mt-plan-memory` places
    the values that outlive their segment once per micro-batch in flight.

    `@eval_step` stays one micro-batch's forward, its ops reordered chunk
    by chunk (each chunk's receive first, its send last), and the runtime
    runs it once per micro-batch with that micro-batch's RNG offset, as
    without pipelining: no value crosses micro-batches, so its arena is
    the same as unrolled, and one micro-batch's messages all complete
    before the next one's start, so repeating it is as safe under NCCL
    as the one replay `mtc` proves. It gets
    `mt.schedule = "forward, once per micro-batch"`.

    ```mlir
    // stage 0 of 2, 2 micro-batches: mtrun runs F(0) F(1) B(0) B(1)
    func.func @train_step(%tokens: ...) attributes {mt.pipeline_schedule =
        {chunks = 1, micro_batches = 2, rank = 0, stages = 2, tag_stride = 2},
        mt.schedule = "1F1B", mt.segments = [{chunk = 0, forward = true, ops = 3, part = 0},
                                            {chunk = 0, forward = false, ops = 2, part = 0} ]} {
      ...
      mt.send %x to 1 {mt.chunk = 0 : i64, tag = 0 : i64} : ...
      %g = mt.recv from 1 {mt.chunk = 0 : i64, tag = 1 : i64} : ...
      ...
    }
    ```
  }];
  let dependentDialects = ["::mt::MtDialect", "::mlir::func::FuncDialect"];
}

def MtPlanMemoryPass : Pass<"mt-plan-memory", "mlir::ModuleOp"> {
  let summary = "Assigns every value a place: persistent state and the activation arena";
  let description = [{
    Persistent state: each `mt.param` gets byte offsets for its weights, f32
    gradient, f32 master copy (reduced-precision models only) and the two
    f32 Adam moments (`mt.weight_offset`, `mt.grad_offset`,
    `mt.master_offset`, `mt.exp_avg_offset`, `mt.exp_avg_sq_offset`), each
    region 256-byte aligned; the module gets `mt.state_bytes`. With
    `grad_reduce_in_bf16` in `mt.training` (Megatron's
    `--grad-reduce-in-bf16`) the gradients take the parameters' bf16
    instead, 2 bytes an element, and each parameter says so with
    `mt.grad_dtype = bf16`: the executors accumulate and reduce them in
    bf16.

    Data-parallel plans (`mt.grad_buckets`): weights and gradients are flat
    buffers indexed alike by element (`mt.flat_offset` per parameter), each
    tensor starting at a multiple of 256 bytes of the weights' type, each
    bucket padded to a multiple of dp times that many elements, so that a
    bucket is one contiguous range of both (each bucket gets `begin` and
    `end`; the module `mt.flat_elements`). With `mt.distributed_optimizer`
    the f32 masters (reduced precision only) and the Adam moments hold one
    shard of every bucket: `mt.flat_elements / dp` elements each
    (`mt.shard_state`), and the parameters' own master and moment offsets
    are -1.

    Activations: liveness over each program's op order (the schedule the
    runtime executes), then placement in one arena shared by all programs
    (they never run at the same time). A value lives from the op that
    defines it to its last use; an op's results never overlap its operands,
    except that `mt.cross_entropy_grad` writes the logits' gradient over the
    logits when that is their last use (the largest activation of a
    language model is then held once); `mt.reshape` results alias their
    input. Every lifetime is known before any value is placed, so the
    arena is laid out offline, greedy by size: the largest buffers first
    (then the longest-lived), each at the lowest offset free over its whole
    lifetime. Online best-fit in program order is computed too and kept
    when its peak is no larger; it strands large buffers above small
    long-lived ones and wasted 0.06-3% of the arena on the presets, which
    the offline layout brings to (or within 0.75% of) the most bytes ever
    live at once. Each op gets
    `mt.offsets` (one byte offset per result), each program argument
    `mt.offset`, each function `mt.arena_bytes`, and the module
    `mt.arena_bytes`, the peak over programs. Liveness is over the
    function's top-level ops only: an `mt.fused` op's operands and results
    take arena bytes like any op's, the values inside its body take none
    (the kernel keeps them in registers; the plan writer gives the CPU
    executor a kernel-local scratch for them).

    A pipelined `@train_step` (`mt.segments`) is placed over the step as
    mtrun expands it. A value used only inside its segment has one place,
    free over every run of that segment. A value that outlives its segment
    (a saved activation, a message received ahead) gets one slot per
    micro-batch the schedule holds at once: with 1F1B micro-batch m uses
    slot m % S, the smallest S for which m's copy dies before m + S's is
    born; interleaved, each (chunk, micro-batch) takes the lowest slot free
    when its forward starts, over all chunks, so the chunks share slots and
    the arena holds the most ever in flight together, not each chunk's
    most. The step's inputs and outputs get one copy per micro-batch. Each
    slot is one buffer over all its spans, placed offline by size like any
    program's; a value used only inside its segment is searched once over
    its segment's ops, against what the slots take there in some run. The
    1F1B schedule repeats in its steady phase, so a long step
    is planned over a shorter one with the same warm-up and cool-down and
    enough steady steps: the arena is the same and planning does not grow
    with the micro-batch count. Results and arguments get
    `mt.slot_offsets` (per value, its slots' offsets, or one per
    micro-batch when coloured; empty for one place), the function
    `mt.planned_micro_batches`.

    A batch ramp-up (`mt.training.ramp_micro_batches`: the smaller
    micro-batch counts the run reaches) runs each smaller step inside this
    plan, on each value's slots of its first micro-batches. That holds
    because the shorter step is the planned one with the later
    micro-batches' segments left out, order kept, so two values live at
    once in it only if they do in the planned step; the pass checks it for
    every count (`check_restriction`) and names a count the schedule does
    not take (interleaved: a multiple of the stages).

    ```mlir
    %5 = mt.add %1, %4 {mt.offsets = array<i64: 1048576>} : tensor<4x128x64xf32>
    ```
  }];
  let dependentDialects = ["::mt::MtDialect"];
}

#endif // MT_PASSES_TD
