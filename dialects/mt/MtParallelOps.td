// Tensor- and sequence-parallel communication inside the model graph
// (Megatron-LM's mappings.py), inserted by mt-shard-tp, and the
// expert-parallel token exchange (Megatron-Core's token dispatchers),
// inserted by mt-shard-ep. Each op is one side of a conjugate pair: its VJP
// is the other. Included by MtOps.td.
#ifndef MT_PARALLEL_OPS_TD
#define MT_PARALLEL_OPS_TD

class Mt_TpOp<string mnemonic, list<Trait> traits = []>
    : Mt_Op<mnemonic, !listconcat(traits,
          [DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>])> {
  let arguments = (ins Mt_FloatTensor:$input, I64Attr:$tp_size);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mt_TpCopyOp : Mt_TpOp<"tp_copy", [Pure]> {
  let summary = "enters a tensor-parallel region: identity forward, all-reduce backward";
  let description = [{
    Marks a replicated activation that column-parallel layers read on every
    tensor-parallel rank. The forward is the identity; the gradient is the
    sum of every rank's gradient (`mt.tp_all_reduce`). Megatron's
    `copy_to_tensor_model_parallel_region`. mt-autodiff removes it once the
    backward is built.

    ```mlir
    %x1 = mt.tp_copy %x {tp_size = 2 : i64} : (tensor<4x128x64xf32>) -> tensor<4x128x64xf32>
    ```
  }];
}

def Mt_TpAllReduceOp : Mt_TpOp<"tp_all_reduce", [Pure]> {
  let summary = "leaves a tensor-parallel region: all-reduce forward, identity backward";
  let description = [{
    Sums the partial results of a row-parallel layer (or a vocab-parallel
    embedding) over the tensor-parallel group. Its gradient is the incoming
    gradient unchanged. Megatron's `reduce_from_tensor_model_parallel_region`.

    ```mlir
    %y = mt.tp_all_reduce %p {tp_size = 2 : i64} : (tensor<4x128x64xf32>) -> tensor<4x128x64xf32>
    ```
  }];
}

def Mt_SpGatherOp : Mt_TpOp<"sp_gather", [Pure]> {
  let summary = "sequence shards to the whole sequence: all-gather forward, reduce-scatter backward";
  let description = [{
    Concatenates every tensor-parallel rank's `[batch, seq / tp, ...]` shard
    along dimension 1, in rank order, into `[batch, seq, ...]`. The gradient
    is summed over ranks and each rank keeps its own sequence shard
    (`mt.sp_reduce_scatter`). Megatron's
    `gather_from_sequence_parallel_region`.

    ```mlir
    %full = mt.sp_gather %x {tp_size = 2 : i64} : (tensor<4x64x64xf32>) -> tensor<4x128x64xf32>
    ```
  }];
}

def Mt_SpReduceScatterOp : Mt_TpOp<"sp_reduce_scatter", [Pure]> {
  let summary = "partial sums to sequence shards: reduce-scatter forward, all-gather backward";
  let description = [{
    Sums `[batch, seq, ...]` over the tensor-parallel group and keeps this
    rank's sequence shard `[batch, seq / tp, ...]` (rank `r` holds positions
    `[r * seq / tp, (r + 1) * seq / tp)`). Megatron's
    `reduce_scatter_to_sequence_parallel_region`.

    ```mlir
    %y = mt.sp_reduce_scatter %p {tp_size = 2 : i64} : (tensor<4x128x64xf32>) -> tensor<4x64x64xf32>
    ```
  }];
}

def Mt_SpSplitOp : Mt_TpOp<"sp_split", [Pure]> {
  let summary = "a replicated tensor to this rank's sequence shard: slice forward, all-gather backward";
  let description = [{
    Keeps positions `[r * seq / tp, (r + 1) * seq / tp)` of a tensor every
    tensor-parallel rank holds whole. Megatron's
    `scatter_to_sequence_parallel_region` (after the embedding).

    ```mlir
    %x = mt.sp_split %e {tp_size = 2 : i64} : (tensor<4x128x64xf32>) -> tensor<4x64x64xf32>
    ```
  }];
}

//===----------------------------------------------------------------------===//
// Expert parallelism
//===----------------------------------------------------------------------===//

def Mt_MoeDispatchOp : Mt_Op<"moe_dispatch", [Pure,
    DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>]> {
  let summary = "sends each expert's rows to the expert-parallel rank that owns the expert";
  let description = [{
    The `E = ep_size * num_local_experts` experts are split over the
    `ep_size` expert-parallel ranks: rank `q` owns experts `[q * L, (q + 1)
    * L)`, `L = num_local_experts`. With expert tensor parallelism
    (`etp_size` > 1, default 1) each expert is split over the `etp_size`
    ranks of an expert-parallel rank, and the exchange runs over the
    `S = etp_size * ep_size` ranks of the tensor-and-expert-parallel group
    (Megatron-Core's `tp_ep`), group rank `g = etp_rank + etp_size *
    ep_rank`. `input` `[N, H]` is this rank's permuted rows, expert-major
    over all `E` experts (segment `e` has `tokens_per_expert[e]` rows, as
    `mt.moe_permute` writes them; rows past the segments are ignored).
    Every rank `g` receives, from every source `s` in `[0, S)` (itself
    included), the rows of `s`'s segments for the experts of its
    expert-parallel rank `g / etp_size`; the `etp_size` ranks of one
    expert-parallel rank receive the same rows.

    - `result` `[R, H]`: the received rows, local expert `j` major, then
      source `s`, then the source's row order (Megatron-Core's
      `sort_chunks_by_idxs` order; the `allgather` dispatcher gives the same
      order). Rows past the received ones are zero. `R` is static, the
      worst case the layout allows, or a bound below it
      (`moe_dispatch_buffer_factor`; `mt-shard-ep` sizes it): a routing
      needing more rows on any rank of the group is an error on every rank,
      before any row moves.
    - `local_counts` `[L]`: rows of each local expert (its segment of
      `result`), for the grouped matmuls.
    - `layout` `[S, L]`: rows received from source `s` for local expert
      `j`; `local_counts[j]` is its column sum. `mt.moe_combine` reads it to
      send the rows back.

    `dispatcher` is Megatron's `--moe-token-dispatcher-type`: `alltoall`
    (counts, then rows, by all-to-all) or `allgather` (every rank gathers
    every rank's rows and keeps its experts'). Both give the same numbers.
    The gradient is `mt.moe_combine` of the rows' gradient.

    ```mlir
    %rows, %local, %layout = mt.moe_dispatch %y, %counts alltoall {ep_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<128x16xf32>, tensor<4xi32>) -> (tensor<256x16xf32>, tensor<2xi32>, tensor<2x2xi32>)
    %rows2, %local2, %layout2 = mt.moe_dispatch %y, %counts alltoall {ep_size = 2 : i64, etp_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<128x16xf32>, tensor<4xi32>) -> (tensor<512x16xf32>, tensor<2xi32>, tensor<4x2xi32>)
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_I32Tensor:$tokens_per_expert,
                       I64Attr:$ep_size, I64Attr:$num_local_experts,
                       Mt_MoeDispatcher:$dispatcher,
                       DefaultValuedAttr<I64Attr, "1">:$etp_size);
  let results = (outs Mt_FloatTensor:$result, Mt_I32Tensor:$local_counts,
                      Mt_I32Tensor:$layout);
  let assemblyFormat = "$input `,` $tokens_per_expert $dispatcher attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Mt_MoeCombineOp : Mt_Op<"moe_combine", [Pure,
    DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>]> {
  let summary = "returns the experts' rows to the ranks that sent them";
  let description = [{
    The inverse of `mt.moe_dispatch`: `input` `[R, H]` holds this rank's
    rows in the dispatch's order (local expert major, then source), as
    `layout` `[S, L]` (the dispatch's, `S = etp_size * ep_size`) counts
    them; every row goes back to its source and its place there. `result`
    `[N, H]` is this rank's rows, expert-major over all `E = ep_size * L`
    experts by `tokens_per_expert` `[E]` (the rank's own counts, the
    dispatch's operand); rows past the segments are zero. With
    `etp_size` > 1 a source gets each of its rows back from the `etp_size`
    ranks that received it and sums them (their partial products of the
    row-parallel second expert matmul). The gradient is the `result` of
    `mt.moe_dispatch` of the result's gradient.

    ```mlir
    %y2 = mt.moe_combine %h, %layout, %counts alltoall {ep_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<256x16xf32>, tensor<2x2xi32>, tensor<4xi32>) -> tensor<128x16xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_I32Tensor:$layout,
                       Mt_I32Tensor:$tokens_per_expert, I64Attr:$ep_size,
                       I64Attr:$num_local_experts, Mt_MoeDispatcher:$dispatcher,
                       DefaultValuedAttr<I64Attr, "1">:$etp_size);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$input `,` $layout `,` $tokens_per_expert $dispatcher attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

#endif // MT_PARALLEL_OPS_TD
