// Tensor- and sequence-parallel communication inside the model graph
// (Megatron-LM's mappings.py), inserted by mt-shard-tp. Each op is one side
// of a conjugate pair: its VJP is the other. Included by MtOps.td.
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

#endif // MT_PARALLEL_OPS_TD
